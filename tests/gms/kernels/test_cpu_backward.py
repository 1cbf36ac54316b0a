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


@pytest.mark.parametrize("threads", [1, 2])
def test_segment_outer_over_many_chunks_and_partial_tiles(threads):
    # one segment of 2.5 chunks, one empty, one of a single pair; K and M not whole tiles
    import numba

    from fusekit.gms.kernels.cpu.backward import CHUNK

    torch.manual_seed(0)
    counts = [CHUNK * 5 // 2, 0, 1]
    segment = torch.repeat_interleave(torch.arange(3), torch.tensor(counts))
    e = len(segment)
    gather, scatter = torch.randint(0, 40, (e,)), torch.randint(0, 30, (e,))
    pl = plan(GMSProblem.create(gather, segment, scatter, 30, num_segments=3))
    x, dy = torch.randn(40, 7, dtype=torch.float64), torch.randn(30, 19, dtype=torch.float64)
    c = torch.rand(e, dtype=torch.float64)
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        dw = segment_outer_cpu(x, pl.gather, dy, pl.scatter, c[pl.order], pl, 3)
    finally:
        numba.set_num_threads(before)
    expected = torch.stack(
        [
            torch.einsum(
                "e,ek,em->km", c[segment == s], x[gather[segment == s]], dy[scatter[segment == s]]
            )
            for s in range(3)
        ]
    )
    torch.testing.assert_close(dw, expected)
