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

from fusekit.gms.kernels.cpu.rows import numpy_of, plan_array, raise_if_bad
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
    import torch

    from fusekit.gms.problem import GMSPlan


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def _segment_outer_kernel(  # type: ignore[no-untyped-def]
    # pointers: a [Ra, K], a_index [E], b [Rb, M], b_index [E], scale [E], out [S, K, M]
    a,
    a_index,
    b,
    b_index,
    scale,
    out,
    # schedule: segment_ptr [S + 1]
    segment_ptr,
    # flags
    has_scale,
):
    K = a.shape[1]
    M = b.shape[1]
    n_pairs = min(a_index.shape[0], b_index.shape[0])
    n_k_tiles = (K + MR - 1) // MR
    n_segments = min(segment_ptr.shape[0] - 1, out.shape[0])
    bad = 0
    # ---- one work unit per (segment, MR rows of K): each owns its slice of dW ----
    for unit in numba.prange(n_segments * n_k_tiles):
        s = unit // n_k_tiles
        k0 = (unit % n_k_tiles) * MR
        nk = min(MR, K - k0)
        acc = numba.carray(stack_buffer(a, MR_NR), (MR, NR))
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
        for m0 in range(0, M, NR):
            nc = min(NR, M - m0)
            for r in range(MR):
                for j in range(NR):
                    acc[r, j] = 0
            col = np.uint64(m0)
            for p in range(lo, hi):
                c = scale[p] if has_scale else scale[0]
                ra = a_index[p]
                rb = b_index[p]
                if nk == MR and nc == NR:
                    a0 = c * a[ra, k0]
                    a1 = c * a[ra, k0 + 1]
                    a2 = c * a[ra, k0 + 2]
                    a3 = c * a[ra, k0 + 3]
                    for j in range(NR):
                        bv = b[rb, col + np.uint64(j)]
                        acc[0, j] += a0 * bv
                        acc[1, j] += a1 * bv
                        acc[2, j] += a2 * bv
                        acc[3, j] += a3 * bv
                else:
                    for r in range(nk):
                        ar = c * a[ra, k0 + r]
                        for j in range(nc):
                            acc[r, j] += ar * b[rb, col + np.uint64(j)]
            for r in range(nk):
                for j in range(nc):
                    out[s, k0 + r, m0 + j] = acc[r, j]
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
        acc = numba.carray(stack_buffer(a, MR_NR), (MR, NR))
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
        ValueError: a guarded index is out of range.
    """
    import torch

    out = torch.zeros(n_segments, a.shape[1], b.shape[1], dtype=a.dtype)
    bad = _segment_outer_kernel(
        numpy_of(a),
        numpy_of(a_index),
        numpy_of(b),
        numpy_of(b_index),
        numpy_of(scale if scale is not None else torch.ones(1, dtype=a.dtype)),
        numpy_of(out),
        plan_array(plan, "segment_ptr"),
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
        ValueError: a guarded index is out of range.
    """
    import torch

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
