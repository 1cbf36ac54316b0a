"""The two gradient steps that are not a forward g-mm-s: weight outer products and pair dots.

Weight gradient, one result per segment (a GEMM whose reduction runs over the segment's pairs)::

    dW[s, k, m] = sum_{p in segment s} c[p] * A[a_index[p], k] * B[b_index[p], m]

Scale gradient, one dot product per pair (the forward's GEMM with a dot as epilogue)::

    dot[p] = sum_m B[b_index[p], m] * sum_k A[a_index[p], k] * W[s, k, m]

For ``sum``/``mean``: ``A = X, a_index = g, B = dY, b_index = d``. For ``max``, ``B`` is the
per-pair gradient that only the winning pair of each output element receives. The input
gradient is a forward problem with gather and scatter swapped (``fusekit.gms.dispatch``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numba
import numpy as np
import torch
from numba.np.numpy_support import carray

from fusekit.errors import expected
from fusekit.gms.kernels.cpu.checks import (
    check_count,
    check_index,
    check_operands,
    check_rows_operand,
    check_scale,
)
from fusekit.gms.kernels.cpu.rows import numpy_of, plan_array, raise_if_bad
from fusekit.gms.kernels.cpu.schedule import lpt_schedule
from fusekit.gms.kernels.cpu.tile import (
    FASTMATH,
    MR,
    MR_NR,
    NR,
    load_rows,
    rows_in_range,
    stack_buffer,
    tile_ok,
    tile_product,
)

if TYPE_CHECKING:
    from fusekit.gms.planning.layout import GMSPlan


#: Pairs whose ``A`` and ``B`` rows the weight gradient gathers at a time (``CHUNK x (K + M)``
#: values: 64 KiB at ``K = M = 32``, an L2 resident that every register tile of ``dW`` reads).
CHUNK = 256


@numba.njit(cache=True, fastmath=FASTMATH, inline="always")
def _outer_tile(ag, bg, n, k0, m0, acc):  # type: ignore[no-untyped-def]
    """``acc[r, j] = sum_{i < n} ag[i, k0 + r] * bg[i, m0 + j]``, ``r < MR``, ``j < NR``.

    The ``MR x NR`` accumulators stay in registers across the chunk's pairs: per pair, ``MR``
    broadcasts of ``ag``, two 8-wide loads of ``bg`` and ``2 MR`` fused multiply-adds.
    """
    for r in range(MR):
        for j in range(NR):
            acc[r, j] = 0
    ka = np.uint64(k0)
    col = np.uint64(m0)
    for i in range(n):
        a0, a1 = ag[i, ka], ag[i, ka + np.uint64(1)]
        a2, a3 = ag[i, ka + np.uint64(2)], ag[i, ka + np.uint64(3)]
        for j in range(NR):
            bv = bg[i, col + np.uint64(j)]
            acc[0, j] += a0 * bv
            acc[1, j] += a1 * bv
            acc[2, j] += a2 * bv
            acc[3, j] += a3 * bv


@numba.njit(cache=True)
def _gather_chunk(a, a_index, b, b_index, scale, has_scale, lo, n, ag, bg):  # type: ignore[no-untyped-def]
    """``ag[i, :K] = c[p] A[a_index[p]]`` and ``bg[i, :M] = B[b_index[p]]`` for ``p = lo + i``."""
    K = a.shape[1]
    M = b.shape[1]
    for i in range(n):
        p = lo + i
        c = scale[p] if has_scale else scale[0]
        src_a = a[a_index[p]]
        dst_a = ag[i]
        for k in range(K):
            dst_a[np.uint64(k)] = c * src_a[np.uint64(k)]
        src_b = b[b_index[p]]
        dst_b = bg[i]
        for m in range(M):
            dst_b[np.uint64(m)] = src_b[np.uint64(m)]


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def _segment_outer_kernel(  # type: ignore[no-untyped-def]
    # pointers: a [Ra, K], a_index [E], b [Rb, M], b_index [E], scale [E], out [S, K, M] (zeros)
    a,
    a_index,
    b,
    b_index,
    scale,
    out,
    # schedule: segment_ptr [S + 1]; threads: workers that take whole segments
    segment_ptr,
    threads,
    # flags
    has_scale,
):
    K = a.shape[1]
    M = b.shape[1]
    n_pairs = min(a_index.shape[0], b_index.shape[0])
    if has_scale:
        n_pairs = min(n_pairs, scale.shape[0])
    n_segments = min(segment_ptr.shape[0] - 1, out.shape[0])
    # a thread owns whole segments (its dW[s] slices: no atomics, one summation order for any
    # thread count), dealt longest first by pair count
    costs = np.zeros(n_segments)
    for s in range(n_segments):
        costs[s] = max(0, segment_ptr[s + 1] - segment_ptr[s])
    order, tptr, _ = lpt_schedule(costs, threads)
    # chunk buffers padded to whole register tiles, the padding zero
    k_pad = (K + MR - 1) // MR * MR
    m_pad = (M + NR - 1) // NR * NR
    bad = 0
    for th in numba.prange(threads):
        ag = np.zeros((CHUNK, k_pad), dtype=a.dtype)
        bg = np.zeros((CHUNK, m_pad), dtype=b.dtype)
        acc = carray(stack_buffer(a, MR_NR), (MR, NR))
        for q in range(tptr[th], tptr[th + 1]):
            s = order[q]
            lo = segment_ptr[s]
            hi = segment_ptr[s + 1]
            if lo < 0 or hi > n_pairs:
                bad += 1
                continue
            if not rows_in_range(a_index, lo, hi - lo, a.shape[0]) or not rows_in_range(
                b_index, lo, hi - lo, b.shape[0]
            ):
                bad += 1
                continue
            # ---- chunk by chunk: gather the rows once, then every tile of dW[s] reads them ----
            for c0 in range(lo, hi, CHUNK):
                n = min(CHUNK, hi - c0)
                _gather_chunk(a, a_index, b, b_index, scale, has_scale, c0, n, ag, bg)
                for k0 in range(0, K, MR):
                    nk = min(MR, K - k0)
                    for m0 in range(0, M, NR):
                        nc = min(NR, M - m0)
                        _outer_tile(ag, bg, n, k0, m0, acc)
                        for r in range(nk):
                            row = out[s, k0 + r, m0 : m0 + nc]
                            for j in range(nc):
                                row[j] += acc[r, j]
    return bad


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def _pair_dot_kernel(  # type: ignore[no-untyped-def]
    # pointers: a [Ra, K], a_index [E], w [S, K, M], b [Rb, M], b_index [E], out [E]
    a,
    a_index,
    w,
    b,
    b_index,
    out,
    # schedule: tiles [T], item_ptr [I + 1]
    tile_segment,
    tile_start,
    tile_end,
    item_ptr,
):
    n_segments = w.shape[0]
    M = w.shape[2]
    n_pairs = min(a_index.shape[0], b_index.shape[0], out.shape[0])
    n_tiles = tile_start.shape[0]
    bad = 0
    for item in numba.prange(item_ptr.shape[0] - 1):
        rows = stack_buffer(a_index, MR)
        acc = carray(stack_buffer(a, MR_NR), (MR, NR))
        if item_ptr[item] < 0 or item_ptr[item + 1] > n_tiles:
            bad += 1
            continue
        for t in range(item_ptr[item], item_ptr[item + 1]):
            if not tile_ok(t, tile_segment, tile_start, tile_end, n_segments, n_pairs):
                bad += 1
                continue
            s = tile_segment[t]
            for e in range(tile_start[t], tile_end[t], MR):
                n = min(MR, tile_end[t] - e)
                if not load_rows(a_index, e, n, a.shape[0], rows) or not rows_in_range(
                    b_index, e, n, b.shape[0]
                ):
                    bad += 1
                    continue
                for r in range(n):
                    out[e + r] = 0
                for m0 in range(0, M, NR):
                    nc = min(NR, M - m0)
                    tile_product(a, rows, w, s, m0, nc, acc)
                    # ---- epilogue: dot the products with B's rows ----
                    for r in range(n):
                        brow = b[b_index[e + r], m0 : m0 + nc]
                        total = out[e + r]
                        for j in range(nc):
                            total += brow[j] * acc[r, j]
                        out[e + r] = total
    return bad


def segment_outer_cpu(
    a: torch.Tensor,
    a_index: torch.Tensor,
    b: torch.Tensor,
    b_index: torch.Tensor,
    scale: torch.Tensor | None,
    plan: GMSPlan,
    n_segments: int,
) -> torch.Tensor:
    """``dW[s] = sum_p c[p] * outer(A[a_index[p]], B[b_index[p]])`` over each segment's positions.

    Args:
        a: ``[Ra, K]`` (contiguous).
        a_index: ``[E]`` rows of ``a`` per plan position.
        b: ``[Rb, M]`` (contiguous).
        b_index: ``[E]`` rows of ``b`` per plan position.
        scale: ``[E]`` per plan position, or None.
        plan: the plan (its ``segment_ptr``).
        n_segments: matrices in the result (``>= plan.num_segments``; extra ones are zero).

    Returns:
        ``[n_segments, K, M]``.

    Raises:
        TypeError: an operand has the wrong type or dtype.
        ValueError: an operand's shape is wrong, or a guarded index is out of range.
    """
    check_rows_operand("a", a)
    check_rows_operand("b", b, a.dtype)
    check_index("a_index", a_index, plan.num_pairs)
    check_index("b_index", b_index, plan.num_pairs)
    check_scale(scale, plan.num_pairs, a.dtype)
    n_segments = check_count("n_segments", n_segments)
    out = torch.zeros(n_segments, a.shape[1], b.shape[1], dtype=a.dtype)
    bad = _segment_outer_kernel(
        numpy_of(a),
        numpy_of(a_index),
        numpy_of(b),
        numpy_of(b_index),
        numpy_of(scale if scale is not None else torch.ones(1, dtype=a.dtype)),
        numpy_of(out),
        plan_array(plan, "segment_ptr"),
        numba.get_num_threads(),
        scale is not None,
    )
    raise_if_bad(bad, "segment_ptr", "segments and rows in range")
    return out


def pair_dot_cpu(
    a: torch.Tensor,
    a_index: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor,
    b_index: torch.Tensor,
    plan: GMSPlan,
) -> torch.Tensor:
    """``dot[p] = B[b_index[p]] . (A[a_index[p]] @ W[segment(p)])`` for every plan position.

    Args:
        a: ``[Ra, K]`` rows.
        a_index: ``[E]`` the row of ``a`` of each plan position.
        w: ``[S, K, M]``.
        b: ``[Rb, M]`` rows.
        b_index: ``[E]`` the row of ``b`` of each plan position.
        plan: the plan whose tiles to run.

    Returns:
        ``[E]`` in plan order.

    Raises:
        TypeError: an operand has the wrong type or dtype.
        ValueError: an operand's shape is wrong, or a guarded index is out of range.
    """
    check_operands(a, w, None, plan.num_pairs, plan.num_segments, x_name="a")
    check_rows_operand("b", b, a.dtype)
    if b.shape[1] != w.shape[2]:
        raise ValueError(expected("gms", "b", f"[R, {w.shape[2]}] (M of 'w')", tuple(b.shape)))
    check_index("a_index", a_index, plan.num_pairs)
    check_index("b_index", b_index, plan.num_pairs)
    out = torch.zeros(plan.num_pairs, dtype=a.dtype)
    bad = _pair_dot_kernel(
        numpy_of(a),
        numpy_of(a_index),
        numpy_of(w),
        numpy_of(b),
        numpy_of(b_index),
        numpy_of(out),
        plan_array(plan, "tile_segment"),
        plan_array(plan, "tile_start"),
        plan_array(plan, "tile_end"),
        plan_array(plan, "item_ptr"),
    )
    raise_if_bad(bad, "tiles", "items, segments, positions and rows in range")
    return out
