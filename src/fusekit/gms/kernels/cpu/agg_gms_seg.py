"""``aggregate-first/(GMS)seg`` fused on the CPU: the aggregation in the GEMM prologue (numba).

.. code-block:: text

    A[u, k]   = sum_{p in group u} c[p] * X[g[p], k]        u = distinct (segment, scatter row)
    Y[d_u, m] += sum_k A[u, k] * W[s_u, k, m]                u in tile t of the order's sub-plan

Dataflow: one kernel over the aggregate-first sub-plan's tiles. The ``MR`` rows of a register tile
are aggregated from their groups' input rows into a per-thread scratch (cache-resident), then go
through the register tile and are added into the block's own output rows. Unlike the two-step
composition (``reduce_rows`` then ``(GMS)seg`` over ``A``), ``A[U, K]`` never goes to memory and
the threads start once. ``fusekit.gms.dispatch`` uses it for ``aggregate-first/(GMS)seg`` when a
backend provides it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numba
import numpy as np

from fusekit.errors import expected
from fusekit.gms.kernels.cpu.checks import check_operands
from fusekit.gms.kernels.cpu.gms_seg import check_block_ptr
from fusekit.gms.kernels.cpu.rows import numpy_of, plan_array, raise_if_bad
from fusekit.gms.kernels.cpu.tile import (
    FASTMATH,
    MR,
    MR_NR,
    NR,
    block_ok,
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
def _agg_gms_seg_kernel(  # type: ignore[no-untyped-def]
    # pointers: x [N_in, K], w [S, K, M]; gather/scale [E] in plan order; group_ptr [U + 1];
    # groups/scatter [U] in sub-plan order; unit [1] = 1; out [N_out, M]; scratch [B, MR, K]
    x,
    w,
    gather,
    scale,
    group_ptr,
    groups,
    scatter,
    unit,
    out,
    scratch,
    # schedule of the sub-plan: tiles [T] listed by block, block_ptr [B + 1]
    tile_segment,
    tile_start,
    tile_end,
    block_ptr,
    # flags
    has_scale,
):
    n_in = x.shape[0]
    K = x.shape[1]
    n_out = out.shape[0]
    n_segments = w.shape[0]
    M = w.shape[2]
    n_pairs = gather.shape[0]
    n_groups = group_ptr.shape[0] - 1
    if has_scale:
        n_pairs = min(n_pairs, scale.shape[0])
    n_rows = min(groups.shape[0], scatter.shape[0])
    n_tiles = min(tile_segment.shape[0], tile_start.shape[0], tile_end.shape[0])
    bad = 0
    for b in numba.prange(min(block_ptr.shape[0] - 1, scratch.shape[0])):
        rows = stack_buffer(groups, MR)
        acc = numba.carray(stack_buffer(x, MR_NR), (MR, NR))
        aggregated = scratch[b]
        if not block_ok(block_ptr, b, n_tiles):
            bad += 1
            continue
        for t in range(block_ptr[b], block_ptr[b + 1]):
            if not tile_ok(t, tile_segment, tile_start, tile_end, n_segments, n_rows):
                bad += 1
                continue
            s = tile_segment[t]
            for e in range(tile_start[t], tile_end[t], MR):
                n = min(MR, tile_end[t] - e)
                if not rows_in_range(scatter, e, n, n_out) or not rows_in_range(
                    groups, e, n, n_groups
                ):
                    bad += 1
                    continue
                # ---- prologue: aggregate each tile row's group into the scratch ----
                ok = True
                for r in range(MR):
                    rows[r] = r if r < n else 0
                    if r >= n:
                        continue
                    for k in range(K):
                        aggregated[r, k] = 0
                    u = groups[e + r]
                    lo = group_ptr[u]
                    hi = group_ptr[u + 1]
                    if lo < 0 or hi > n_pairs:
                        ok = False
                        continue
                    for p in range(lo, hi):
                        g = gather[p]
                        if g < 0 or g >= n_in:
                            ok = False
                            break
                        c = scale[p] if has_scale else unit[0]
                        for k in range(K):
                            col = np.uint64(k)  # unsigned: no negative-index fix-up
                            aggregated[r, col] += c * x[g, col]
                if not ok:
                    bad += 1
                    continue
                for m0 in range(0, M, NR):
                    nc = min(NR, M - m0)
                    # ---- GEMM on the aggregated rows ----
                    tile_product(aggregated, rows, w, s, m0, nc, acc)
                    # ---- epilogue: add into the block's own rows ----
                    scatter_tile(out, scatter, unit, False, e, n, m0, nc, acc, False)
    return bad


def agg_gms_seg_cpu(
    x: torch.Tensor, w: torch.Tensor, plan: GMSPlan, scale: torch.Tensor | None
) -> torch.Tensor:
    """Run ``aggregate-first/(GMS)seg`` fused over a plan (sum or mean).

    Args:
        x: ``[N_in, K]`` float32/float64, contiguous.
        w: ``[S, K, M]`` same dtype, contiguous.
        plan: the plan, holding its aggregate-first order.
        scale: ``[E]`` per plan position (mean weights folded in), or None.

    Returns:
        ``Y`` of shape ``[N_out, M]``.

    Raises:
        TypeError: an operand has the wrong type or dtype.
        ValueError: an operand's shape is wrong, the plan has no aggregate-first order, or a
            guarded index is out of range.
    """
    import torch

    if plan.aggregate is None:
        raise ValueError(expected("gms", "plan", "one with an aggregate-first order", "none"))
    check_operands(x, w, scale, plan.num_pairs, plan.num_segments)
    sub = plan.aggregate.plan
    check_block_ptr(sub)
    out = torch.zeros(plan.n_out, w.shape[2], dtype=x.dtype)
    scratch = torch.empty(sub.num_blocks, MR, x.shape[1], dtype=x.dtype)
    unit = torch.ones(1, dtype=x.dtype)
    bad = _agg_gms_seg_kernel(
        numpy_of(x),
        numpy_of(w),
        plan_array(plan, "gather"),
        numpy_of(scale if scale is not None else unit),
        numpy_of(plan.aggregate.index),
        plan_array(sub, "gather"),
        plan_array(sub, "scatter"),
        numpy_of(unit),
        numpy_of(out),
        numpy_of(scratch),
        plan_array(sub, "tile_segment"),
        plan_array(sub, "tile_start"),
        plan_array(sub, "tile_end"),
        plan_array(sub, "block_ptr"),
        scale is not None,
    )
    raise_if_bad(bad, "aggregate-first order", "groups, positions and rows in range")
    return out
