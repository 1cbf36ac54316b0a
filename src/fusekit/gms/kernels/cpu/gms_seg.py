"""``(GMS)seg`` on the CPU: gather, segment GEMM and scatter in one kernel (numba).

.. code-block:: text

    Y[d[p], m]  (+= | max=)  c[p] * sum_k X[g[p], k] * W[s, k, m]      p in tile t, s = segment(t)

Dataflow: one pass over the plan's tiles. A tile's gather indices are the register tile's rows, so
``X`` rows go from cache straight into the FMAs (no gathered copy); its products go from
registers straight into ``Y`` (no product buffer). Only ``X``, ``W`` and ``Y`` touch memory:
the fewest bytes of the four dataflows.

Parallelism without atomics: the threads take the plan's destination blocks; a block owns a
contiguous range of output rows and runs its tiles segment by segment (``W[s]`` stays in cache),
so two threads never write the same row.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numba

from fusekit.gms.kernels.cpu.checks import check_operands
from fusekit.gms.kernels.cpu.rows import numpy_of, plan_array, raise_if_bad
from fusekit.gms.kernels.cpu.tile import (
    FASTMATH,
    MR,
    MR_NR,
    NR,
    block_ok,
    load_rows,
    rows_in_range,
    scatter_tile,
    stack_buffer,
    tile_ok,
    tile_product,
)

if TYPE_CHECKING:
    import torch

    from fusekit.gms.problem import GMSPlan


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def _gms_seg_kernel(  # type: ignore[no-untyped-def]
    # pointers: x [N_in, K], w [S, K, M], gather/scatter/scale [E], out [N_out, M]
    x,
    w,
    gather,
    scatter,
    scale,
    out,
    # schedule: tiles [T] listed by block, block_ptr [B + 1]
    tile_segment,
    tile_start,
    tile_end,
    block_ptr,
    # flags
    has_scale,
    reduce_max,
):
    n_in = x.shape[0]
    n_out = out.shape[0]
    n_segments = w.shape[0]
    M = w.shape[2]
    n_pairs = min(gather.shape[0], scatter.shape[0])
    if has_scale:
        n_pairs = min(n_pairs, scale.shape[0])
    n_tiles = min(tile_segment.shape[0], tile_start.shape[0], tile_end.shape[0])
    bad = 0
    for b in numba.prange(block_ptr.shape[0] - 1):
        rows = stack_buffer(gather, MR)
        acc = numba.carray(stack_buffer(x, MR_NR), (MR, NR))
        if not block_ok(block_ptr, b, n_tiles):
            bad += 1
            continue
        # ---- tiles of this block, segment by segment ----
        for t in range(block_ptr[b], block_ptr[b + 1]):
            if not tile_ok(t, tile_segment, tile_start, tile_end, n_segments, n_pairs):
                bad += 1
                continue
            s = tile_segment[t]
            for e in range(tile_start[t], tile_end[t], MR):
                n = min(MR, tile_end[t] - e)
                # ---- prologue: the gather indices are the register tile's rows ----
                if not load_rows(gather, e, n, n_in, rows) or not rows_in_range(
                    scatter, e, n, n_out
                ):
                    bad += 1
                    continue
                for m0 in range(0, M, NR):
                    nc = min(NR, M - m0)
                    # ---- GEMM: MR x NR register tile over K ----
                    tile_product(x, rows, w, s, m0, nc, acc)
                    # ---- epilogue: scatter the products into the block's own rows ----
                    scatter_tile(out, scatter, scale, has_scale, e, n, m0, nc, acc, reduce_max)
    return bad


def gms_seg_cpu(
    x: torch.Tensor, w: torch.Tensor, plan: GMSPlan, scale: torch.Tensor | None
) -> torch.Tensor:
    """Run ``(GMS)seg`` over a plan.

    Args:
        x: ``[N_in, K]`` float32/float64 (the caller upcasts bfloat16), contiguous.
        w: ``[S, K, M]`` same dtype, contiguous.
        plan: the plan (on the CPU), built for ``x``'s and ``w``'s sizes.
        scale: ``[E]`` per plan position (mean weights folded in), or None.

    Returns:
        ``Y`` of shape ``[N_out, M]``.

    Raises:
        TypeError: an operand has the wrong type or dtype.
        ValueError: an operand's shape is wrong, the plan's block pointer is malformed, or a
            guarded index is out of range.
    """
    import torch

    check_operands(x, w, scale, plan.num_pairs, plan.num_segments)
    reduce_max = plan.reduce == "max"
    fill = float("-inf") if reduce_max else 0.0
    out = torch.full((plan.n_out, w.shape[2]), fill, dtype=x.dtype)
    check_block_ptr(plan)
    one = torch.ones(1, dtype=x.dtype)
    bad = _gms_seg_kernel(
        numpy_of(x),
        numpy_of(w),
        plan_array(plan, "gather"),
        plan_array(plan, "scatter"),
        numpy_of(scale if scale is not None else one),
        numpy_of(out),
        plan_array(plan, "tile_segment"),
        plan_array(plan, "tile_start"),
        plan_array(plan, "tile_end"),
        plan_array(plan, "block_ptr"),
        scale is not None,
        reduce_max,
    )
    raise_if_bad(bad, "tiles", "segments, positions and rows in range")
    if reduce_max:
        empty_rows_to_zero(out, plan)
    return out


def check_block_ptr(plan: GMSPlan) -> None:
    """Raise unless ``block_ptr`` is non-decreasing within ``[0, T]`` (``B + 1`` values)."""
    from fusekit.errors import expected

    if plan.memo.get("block_ptr ok"):
        return
    ptr = plan.block_ptr.tolist()
    decreasing = any(a > b for a, b in itertools.pairwise(ptr))
    if not ptr or ptr[0] < 0 or ptr[-1] > plan.num_tiles or decreasing:
        raise ValueError(
            expected("gms", "plan block_ptr", f"non-decreasing in [0, {plan.num_tiles}]", ptr[:8])
        )
    plan.memo["block_ptr ok"] = True


def empty_rows_to_zero(out: torch.Tensor, plan: GMSPlan) -> None:
    """Set the rows no pair reaches (still ``-inf`` after a max) to zero."""
    degree = plan.dst_ptr[1:] - plan.dst_ptr[:-1]
    out[degree == 0] = 0
