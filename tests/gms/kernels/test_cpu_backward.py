import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fusekit.gms import GMSProblem, plan
from fusekit.gms.kernels.cpu.backward import pair_dot_cpu, segment_outer_cpu


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_segment_outer_is_the_weight_gradient(data, draw_case):
    case = draw_case(data, dtype=torch.float64)
    pl = case.plan
    dy = torch.randn(case.n_out, case.w.shape[2], dtype=torch.float64)
    c = case.scale[pl.order] if case.scale is not None else None
    dw = segment_outer_cpu(case.x, pl.gather, dy, pl.scatter, c, pl, case.w.shape[0] + 1)
    expected = torch.zeros(case.w.shape[0] + 1, *case.w.shape[1:], dtype=torch.float64)
    weight = torch.ones(len(case.gather), dtype=torch.float64) if case.scale is None else case.scale
    for e in range(len(case.gather)):
        expected[case.segment[e]] += weight[e] * torch.outer(
            case.x[case.gather[e]], dy[case.scatter[e]]
        )
    torch.testing.assert_close(dw, expected)


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_pair_dot_is_the_scale_gradient(data, draw_case):
    case = draw_case(data, dtype=torch.float64)
    pl = case.plan
    dy = torch.randn(case.n_out, case.w.shape[2], dtype=torch.float64)
    dots = pair_dot_cpu(case.x, pl.gather, case.w, dy, pl.scatter, pl)
    products = torch.einsum("ek,ekm->em", case.x[pl.gather], case.w[pl.segment])
    torch.testing.assert_close(dots, (products * dy[pl.scatter]).sum(1))


@pytest.mark.parametrize("field", ["gather", "scatter", "segment_ptr", "tile_end"])
def test_guards(field):
    g = torch.arange(30) % 7
    pl = plan(GMSProblem.create(g, g % 3, g % 4, 4), tile_rows=8, blocks=2)
    bad = getattr(pl, field).clone()
    bad[1] = 10**6
    corrupt = dataclasses.replace(pl, **{field: bad})
    x, w, dy = torch.randn(7, 5), torch.randn(3, 5, 6), torch.randn(4, 6)
    with pytest.raises(ValueError, match="plan"):
        if field == "tile_end":
            pair_dot_cpu(x, corrupt.gather, w, dy, corrupt.scatter, corrupt)
        else:
            segment_outer_cpu(x, corrupt.gather, dy, corrupt.scatter, None, corrupt, 3)
