"""The Triton rows, segment-products and backward kernels against their CPU (numba) counterparts,
on the CPU under Triton's interpreter, and the whole dispatch (forward and backward of every
named strategy) with the Triton backend against the CPU backend."""

import os

# Before triton is imported: triton.jit reads it when the kernel modules define their kernels.
os.environ["TRITON_INTERPRET"] = "1"

import dataclasses

import pytest

pytest.importorskip("triton")  # the gpu extra

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fusekit.gms import NAMED_STRATEGIES, GMSProblem, backends, dispatch, plan
from fusekit.gms.kernels.cpu.backward import pair_dot_cpu, segment_outer_cpu
from fusekit.gms.kernels.cpu.gm_seg_s import segment_products_cpu
from fusekit.gms.kernels.cpu.rows import gather_rows_cpu, reduce_rows_cpu
from fusekit.gms.kernels.triton.backward import pair_dot_triton, segment_outer_triton
from fusekit.gms.kernels.triton.gm_seg_s import segment_products_triton
from fusekit.gms.kernels.triton.rows import gather_rows_triton, reduce_rows_triton

SMALL = {"max_pairs": 48, "max_width": 19}


def test_kernels_run_interpreted():
    from fusekit.gms.kernels.triton.gms_seg import INTERPRETED

    assert INTERPRETED


def close(got, want, dtype):
    """``got`` (``dtype``) against the CPU's float32 result, relative to its magnitude."""
    assert got.dtype == dtype
    assert got.shape == want.shape
    rel = {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    atol = rel * (float(want.abs().max()) if want.numel() else 0.0) + 1e-6
    torch.testing.assert_close(got.float(), want.float(), rtol=rel, atol=atol)


def operands(case, dtype, gen):
    """``x``, ``w``, a gradient ``dy`` and the per-position scale, in ``dtype``."""
    dy = torch.randn(case.n_out, case.w.shape[2], generator=gen)
    c = case.scale[case.plan.order].float() if case.scale is not None else None
    cast = [t.to(dtype) if t is not None else None for t in (case.x.float(), case.w.float(), dy, c)]
    return cast


def f32(*ts):
    return [t.float() if t is not None else None for t in ts]


# ---- rows ----


def test_gather_rows():
    x = torch.randn(6, 21)
    index = torch.tensor([5, 0, 0, 3])
    assert torch.equal(gather_rows_triton(x, index), gather_rows_cpu(x, index))
    assert gather_rows_triton(x, index[:0]).shape == (0, 21)
    half = gather_rows_triton(x.bfloat16(), index)
    assert half.dtype == torch.bfloat16 and torch.equal(half, x.bfloat16()[index])


@pytest.mark.parametrize("bad", [6, -1])
def test_gather_rows_guards_its_index(bad):
    with pytest.raises(ValueError, match="plan gather index"):
        gather_rows_triton(torch.randn(6, 5), torch.tensor([0, bad]))


@pytest.mark.parametrize("reduce_max", [False, True])
@pytest.mark.parametrize("accumulate", [False, True])
def test_reduce_rows_walks_the_csr(reduce_max, accumulate):
    src = torch.randn(7, 35)
    src_index = torch.tensor([6, 0, 2, 2, 5])
    scale = torch.tensor([1.0, -2.0, 0.5, 3.0, 1.5])
    ptr = torch.tensor([0, 2, 2, 5])  # row 1 gets nothing
    pos = torch.tensor([4, 1, 0, 3, 2])
    init = torch.randn(3, 35)
    outs = []
    for run in (reduce_rows_cpu, reduce_rows_triton):
        outs.append(
            run(
                src,
                ptr,
                n_pairs=5,
                src_index=src_index,
                scale=scale,
                pos=pos,
                reduce_max=reduce_max,
                out=init.clone() if accumulate else None,
            )
        )
    close(outs[1], outs[0], torch.float32)


def test_reduce_rows_identity_defaults_and_no_rows():
    src = torch.randn(4, 2)
    ptr = torch.tensor([0, 1, 4])
    torch.testing.assert_close(
        reduce_rows_triton(src, ptr, n_pairs=4), reduce_rows_cpu(src, ptr, n_pairs=4)
    )
    assert reduce_rows_triton(src, ptr[:1], n_pairs=0).shape == (0, 2)
    empty = reduce_rows_triton(src, torch.zeros(3, dtype=torch.long), n_pairs=0, reduce_max=True)
    assert torch.equal(empty, torch.zeros(2, 2))


def test_reduce_rows_accumulates_into_a_view():
    src, ptr, pos = torch.randn(5, 3), torch.tensor([0, 2, 5]), torch.tensor([4, 0, 1, 2, 3])
    out = torch.zeros(4, 3)
    reduce_rows_triton(src, ptr, n_pairs=5, pos=pos, out=out[:2])
    torch.testing.assert_close(out[:2], torch.stack([src[[4, 0]].sum(0), src[1:4].sum(0)]))
    assert torch.equal(out[2:], torch.zeros(2, 3))


@pytest.mark.parametrize(
    ("ptr", "pos", "src_index"),
    [
        ([0, 2, 9], None, None),  # pointer past the positions
        ([0, 3, 1], None, None),  # decreasing pointer
        ([-1, 2, 4], None, None),  # negative pointer
        ([0, 2, 4], [0, 1, 2, 7], None),  # position out of range
        ([0, 2, 4], None, [0, 1, 2, 40]),  # source row out of range
    ],
)
def test_reduce_rows_guards_every_index(ptr, pos, src_index):
    with pytest.raises(ValueError, match="plan CSR"):
        reduce_rows_triton(
            torch.randn(4, 2),
            torch.tensor(ptr),
            n_pairs=4,
            pos=None if pos is None else torch.tensor(pos),
            src_index=None if src_index is None else torch.tensor(src_index),
        )


@settings(max_examples=6, deadline=None)
@given(data=st.data(), dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_reduce_rows_in_the_dispatch_patterns(data, dtype, draw_case):
    # The dispatch's calls: destination CSR (pairwise S), aggregation by (s, d) group with a
    # gather index (aggregate-first), distinct rows by destination (transform-first), and the
    # input gradient's accumulation into dx by source CSR.
    case = draw_case(data, **SMALL)
    pl, e = case.plan, case.plan.num_pairs
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16), label="seed2"))
    c = case.scale[pl.order].float() if case.scale is not None else None
    products = torch.randn(e, case.w.shape[2], generator=gen)
    back = torch.randn(e, 3, generator=gen)
    calls = [
        (products, pl.dst_ptr, {"scale": c, "pos": pl.dst_pos, "reduce_max": case.reduce == "max"}),
        (back, pl.src_ptr, {"scale": c, "pos": pl.src_pos, "out": torch.randn(pl.n_in, 3)}),
    ]
    if pl.aggregate is not None:
        calls.append((case.x.float(), pl.aggregate.index, {"src_index": pl.gather, "scale": c}))
    if pl.transform is not None:
        distinct = torch.randn(pl.transform.plan.num_pairs, 5, generator=gen)
        kw = {"src_index": pl.transform.index, "scale": c, "pos": pl.dst_pos}
        calls.append((distinct, pl.dst_ptr, kw))
    for src, ptr, kw in calls:
        want = reduce_rows_cpu(src, ptr, n_pairs=e, **{**kw, "out": _clone(kw.get("out"))})
        cast = {k: _to(v, dtype) if k in ("scale", "out") else v for k, v in kw.items()}
        got = reduce_rows_triton(src.to(dtype), ptr, n_pairs=e, **cast)
        close(got, want, dtype)


def _to(t, dtype):
    return t.to(dtype) if t is not None else None


def _clone(t):
    return t.clone() if t is not None else None


# ---- segment products, outer products, pair dots ----


@settings(max_examples=8, deadline=None)
@given(data=st.data(), dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_segment_products_outer_and_dots_equal_the_cpu(data, dtype, draw_case):
    case = draw_case(data, **SMALL)
    pl = case.plan
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16), label="seed2"))
    x, w, dy, c = operands(case, dtype, gen)
    s = w.shape[0]
    # forward products, and the input gradient's: dY rows by scatter index times W^T
    close(
        segment_products_triton(x, pl.gather, w, pl),
        segment_products_cpu(*f32(x), pl.gather, *f32(w), pl),
        dtype,
    )
    w_t = w.transpose(1, 2).contiguous()
    close(
        segment_products_triton(dy, pl.scatter, w_t, pl),
        segment_products_cpu(*f32(dy), pl.scatter, *f32(w_t), pl),
        dtype,
    )
    close(
        segment_outer_triton(x, pl.gather, dy, pl.scatter, c, pl, s + 1),
        segment_outer_cpu(*f32(x), pl.gather, *f32(dy), pl.scatter, *f32(c), pl, s + 1),
        dtype,
    )
    close(
        pair_dot_triton(x, pl.gather, w, dy, pl.scatter, pl),
        pair_dot_cpu(*f32(x), pl.gather, *f32(w), *f32(dy), pl.scatter, pl),
        dtype,
    )


@pytest.mark.parametrize("kind", ["empty_segments", "zero_pairs", "one_output_row"])
def test_edge_cases(kind, draw_case):
    @settings(max_examples=1, deadline=None, database=None)
    @given(data=st.data())
    def check(data):
        case = draw_case(data, kind=kind, scale=True, **SMALL)
        pl = case.plan
        x, w, dy, c = operands(case, torch.float32, torch.Generator().manual_seed(0))
        close(
            segment_products_triton(x, pl.gather, w, pl),
            segment_products_cpu(x, pl.gather, w, pl),
            torch.float32,
        )
        close(
            segment_outer_triton(x, pl.gather, dy, pl.scatter, c, pl, w.shape[0]),
            segment_outer_cpu(x, pl.gather, dy, pl.scatter, c, pl, w.shape[0]),
            torch.float32,
        )
        close(
            pair_dot_triton(x, pl.gather, w, dy, pl.scatter, pl),
            pair_dot_cpu(x, pl.gather, w, dy, pl.scatter, pl),
            torch.float32,
        )

    check()


def test_blocks_larger_than_one_tile_and_unused_segments():
    # K and M over two blocks and not multiples of 16; segments past the plan's are zero.
    gen = torch.Generator().manual_seed(3)
    g, s, d = (torch.randint(0, n, (70,), generator=gen) for n in (30, 3, 20))
    pl = plan(GMSProblem.create(g, s, d, 20, num_segments=3), tile_rows=64, blocks=2)
    x, w = torch.randn(30, 37, generator=gen), torch.randn(3, 37, 33, generator=gen)
    dy, c = torch.randn(20, 33, generator=gen), torch.rand(70, generator=gen)
    close(
        segment_products_triton(x, pl.gather, w, pl),
        segment_products_cpu(x, pl.gather, w, pl),
        torch.float32,
    )
    dw = segment_outer_triton(x, pl.gather, dy, pl.scatter, c, pl, 5)
    close(dw, segment_outer_cpu(x, pl.gather, dy, pl.scatter, c, pl, 5), torch.float32)
    assert torch.equal(dw[3:], torch.zeros(2, 37, 33))
    close(
        pair_dot_triton(x, pl.gather, w, dy, pl.scatter, pl),
        pair_dot_cpu(x, pl.gather, w, dy, pl.scatter, pl),
        torch.float32,
    )


@pytest.mark.parametrize("field", ["gather", "scatter", "segment_ptr", "tile_end", "tile_segment"])
def test_guards(field):
    g = torch.arange(30) % 7
    pl = plan(GMSProblem.create(g, g % 3, g % 4, 4), tile_rows=8, blocks=2)
    bad = getattr(pl, field).clone()
    bad[1] = 10**6
    corrupt = dataclasses.replace(pl, **{field: bad})
    x, w, dy = torch.randn(7, 5), torch.randn(3, 5, 6), torch.randn(4, 6)
    with pytest.raises(ValueError, match="plan"):
        if field in ("tile_end", "tile_segment"):
            pair_dot_triton(x, corrupt.gather, w, dy, corrupt.scatter, corrupt)
        else:
            segment_outer_triton(x, corrupt.gather, dy, corrupt.scatter, None, corrupt, 3)
    if field == "segment_ptr":  # read by segment_outer alone
        return
    with pytest.raises(ValueError, match="plan"):
        if field in ("gather", "scatter"):
            segment_products_triton(x, getattr(corrupt, field), w, corrupt)
        else:
            pair_dot_triton(x, corrupt.gather, w, dy, corrupt.scatter, corrupt)


# ---- the whole dispatch with the Triton backend ----


def run_dispatch(strategy, x, w, pl, c, dy):
    y = dispatch.forward(strategy, x, w, pl, c)
    return (y, *dispatch.backward(strategy, dy, x, w, pl, c, (True, True, True)))


@pytest.mark.parametrize(
    ("strategy", "reduce"),
    [(s, r) for s in NAMED_STRATEGIES for r in ("sum", "mean", "max") if s.order.allows(r)],
    ids=str,
)
def test_dispatch_on_the_triton_backend_equals_the_cpu_backend(strategy, reduce, monkeypatch):
    gen = torch.Generator().manual_seed(len(strategy.name) * 3 + len(reduce))
    e = 40
    g, s, d = (torch.randint(0, n, (e,), generator=gen) for n in (9, 3, 6))
    s[s == 1] = 2  # segment 1 empty, segment 3 of w unused
    pl = plan(GMSProblem.create(g, s, d, 7, num_segments=4, reduce=reduce), tile_rows=8, blocks=2)
    x = torch.randn(10, 19, generator=gen)  # row 9 gathered by no pair; output row 6 empty
    w = torch.randn(4, 19, 17, generator=gen)
    c = torch.rand(e, generator=gen) + 0.5
    dy = torch.randn(7, 17, generator=gen)
    want = run_dispatch(strategy, x, w, pl, c, dy)
    monkeypatch.setitem(backends.BY_DEVICE_TYPE, "cpu", backends.triton_backend)
    assert backends.backend_for(x.device).gather_rows is gather_rows_triton
    got = run_dispatch(strategy, x, w, pl, c, dy)
    for name, a, b in zip(("y", "dx", "dw", "dscale"), got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        atol = 1e-5 * float(b.abs().max()) + 1e-6
        torch.testing.assert_close(a, b, rtol=1e-5, atol=atol, msg=name)
