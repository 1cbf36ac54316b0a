import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fusekit.gms import GMSProblem, plan
from fusekit.gms.dispatch import position_scale
from fusekit.gms.kernels.cpu.agg_gms_seg import agg_gms_seg_cpu


@settings(max_examples=40, deadline=None)
@given(data=st.data(), reduce=st.sampled_from(["sum", "mean"]))
def test_equals_reference(data, reduce, draw_case):
    case = draw_case(data, reduce=reduce)
    c = position_scale(case.plan, case.scale, case.x.dtype)
    case.assert_matches(agg_gms_seg_cpu(case.x, case.w, case.plan, c))


@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_equals_reference_fp64(data, draw_case):
    case = draw_case(data, reduce="sum", dtype=torch.float64)
    c = position_scale(case.plan, case.scale, case.x.dtype)
    case.assert_matches(agg_gms_seg_cpu(case.x, case.w, case.plan, c))


def test_needs_the_aggregate_order():
    g = torch.arange(6)
    pl = plan(GMSProblem.create(g, g % 2, g, 6, reduce="max"))
    with pytest.raises(ValueError, match="'plan' to be one with an aggregate-first order"):
        agg_gms_seg_cpu(torch.randn(6, 3), torch.randn(2, 3, 4), pl, None)


@pytest.mark.parametrize("where", ["index", "gather", "sub_gather", "sub_scatter"])
def test_a_corrupted_plan_raises(where):
    g = torch.arange(40) % 9
    pl = plan(GMSProblem.create(g, g % 3, g % 5, 5), tile_rows=8, blocks=2)
    agg = pl.aggregate
    if where == "index":
        index = agg.index.clone()
        index[1] = 10**6
        pl = dataclasses.replace(pl, aggregate=dataclasses.replace(agg, index=index))
    elif where == "gather":
        bad = pl.gather.clone()
        bad[3] = -1
        pl = dataclasses.replace(pl, gather=bad)
    else:
        field = where.removeprefix("sub_")
        bad = getattr(agg.plan, field).clone()
        bad[0] = 10**6
        sub = dataclasses.replace(agg.plan, **{field: bad})
        pl = dataclasses.replace(pl, aggregate=dataclasses.replace(agg, plan=sub))
    with pytest.raises(ValueError, match="plan"):
        agg_gms_seg_cpu(torch.randn(9, 4), torch.randn(3, 4, 6), pl, None)
