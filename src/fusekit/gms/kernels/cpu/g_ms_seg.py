"""``G-(MS)seg`` on the CPU: a gather kernel, then the segment GEMM with the scatter fused (numba).

.. code-block:: text

    Xg[p, k] = X[g[p], k]                                                    kernel 1
    Y[d[p], m] (+= | max=) c[p] * sum_k Xg[p, k] * W[s, k, m]   p in tile t   kernel 2

Dataflow: kernel 1 writes the gathered rows ``Xg[E, K]`` in plan order (a streaming write);
kernel 2 reads them as consecutive rows, so its register tile loads contiguous memory, and adds
the products from registers into ``Y``. On a GPU the epilogue would need atomics; on the CPU the
threads take the plan's destination blocks, each owning its output rows, as in ``(GMS)seg``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numba

from fusekit.gms.kernels.cpu.checks import check_operands
from fusekit.gms.kernels.cpu.gms_seg import check_block_ptr, empty_rows_to_zero
from fusekit.gms.kernels.cpu.rows import gather_rows_cpu, numpy_of, plan_array, raise_if_bad
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
def _ms_seg_kernel(  # type: ignore[no-untyped-def]
    # pointers: xg [E, K] (gathered, plan order), w [S, K, M], scatter/scale [E], out [N_out, M]
    xg,
    w,
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
    n_out = out.shape[0]
    n_segments = w.shape[0]
    M = w.shape[2]
    n_pairs = min(xg.shape[0], scatter.shape[0])
    if has_scale:
        n_pairs = min(n_pairs, scale.shape[0])
    n_tiles = min(tile_segment.shape[0], tile_start.shape[0], tile_end.shape[0])
    bad = 0
    for b in numba.prange(block_ptr.shape[0] - 1):
        rows = stack_buffer(scatter, MR)
        acc = numba.carray(stack_buffer(xg, MR_NR), (MR, NR))
        if not block_ok(block_ptr, b, n_tiles):
            bad += 1
            continue
        for t in range(block_ptr[b], block_ptr[b + 1]):
            if not tile_ok(t, tile_segment, tile_start, tile_end, n_segments, n_pairs):
                bad += 1
                continue
            s = tile_segment[t]
            for e in range(tile_start[t], tile_end[t], MR):
                n = min(MR, tile_end[t] - e)
                if not rows_in_range(scatter, e, n, n_out):
                    bad += 1
                    continue
                # ---- prologue: consecutive rows of the gathered buffer ----
                for r in range(MR):
                    rows[r] = e + r if r < n else e
                for m0 in range(0, M, NR):
                    nc = min(NR, M - m0)
                    # ---- GEMM ----
                    tile_product(xg, rows, w, s, m0, nc, acc)
                    # ---- epilogue: scatter into the block's own rows ----
                    scatter_tile(out, scatter, scale, has_scale, e, n, m0, nc, acc, reduce_max)
    return bad


def g_ms_seg_cpu(
    x: torch.Tensor, w: torch.Tensor, plan: GMSPlan, scale: torch.Tensor | None
) -> torch.Tensor:
    """Run ``G-(MS)seg`` over a plan.

    Args:
        x: ``[N_in, K]`` float32/float64, contiguous.
        w: ``[S, K, M]`` same dtype, contiguous.
        plan: the plan (on the CPU).
        scale: ``[E]`` per plan position (mean weights folded in), or None.

    Returns:
        ``Y`` of shape ``[N_out, M]``.

    Raises:
        TypeError: an operand has the wrong type or dtype.
        ValueError: an operand's shape is wrong, the block pointer is malformed or a guarded
            index is out of range.
    """
    import torch

    check_operands(x, w, scale, plan.num_pairs, plan.num_segments)
    gathered = gather_rows_cpu(x, plan.gather)
    reduce_max = plan.reduce == "max"
    out = torch.full((plan.n_out, w.shape[2]), float("-inf") if reduce_max else 0.0, dtype=x.dtype)
    check_block_ptr(plan)
    bad = _ms_seg_kernel(
        numpy_of(gathered),
        numpy_of(w),
        plan_array(plan, "scatter"),
        numpy_of(scale if scale is not None else torch.ones(1, dtype=x.dtype)),
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
