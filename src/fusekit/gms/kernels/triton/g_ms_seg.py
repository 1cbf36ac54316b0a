"""``G-(MS)seg`` in Triton: a gather kernel, then the segment GEMM with the scatter fused.

.. code-block:: text

    Xg[p, k] = X[g[p], k]                                                    kernel 1
    Y[d[p], m] (+= | max=) c[p] * sum_k Xg[p, k] * W[s, k, m]   p in tile t   kernel 2

Dataflow: kernel 1 writes the gathered rows ``Xg[E, K]`` in plan order (program per
``BLOCK_E x BLOCK_K`` block, a streaming copy); kernel 2 is ``(GMS)seg``'s kernel reading
consecutive rows of ``Xg`` instead of gathering, with the atomic scatter in its epilogue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from fusekit.gms.kernels.triton.checks import check_grid
from fusekit.gms.kernels.triton.gms_seg import (
    ADD,
    MAX,
    check_atomic_scatter,
    finish_scatter,
    scatter_out,
    segment_gemm,
)

if TYPE_CHECKING:
    import torch

    from fusekit.gms.planning.layout import GMSPlan

BLOCK_E = 32
BLOCK_K = 32


@triton.jit  # type: ignore[untyped-decorator]
def _gather_rows_kernel(  # type: ignore[no-untyped-def]
    # pointers: x [N, K], index [E], out [E, K]
    x_ptr,
    index_ptr,
    out_ptr,
    # sizes
    n_rows,
    n_index,
    K,
    # strides
    stride_xn,
    stride_xk,
    stride_oe,
    stride_ok,
    # meta-parameters
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    offs_e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask_e = offs_e < n_index
    mask_k = offs_k < K
    rows = tl.load(index_ptr + offs_e, mask=mask_e, other=0)
    ok = mask_e & (rows >= 0) & (rows < n_rows)
    rows = tl.where(ok, rows, 0)
    vals = tl.load(
        x_ptr + rows[:, None] * stride_xn + offs_k[None, :] * stride_xk,
        mask=ok[:, None] & mask_k[None, :],
        other=0.0,
    )
    out = out_ptr + offs_e[:, None].to(tl.int64) * stride_oe + offs_k[None, :] * stride_ok
    tl.store(out, vals, mask=mask_e[:, None] & mask_k[None, :])


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``out[p] = x[index[p]]`` (indices checked by the caller; the kernel masks the rest).

    Args:
        x: ``[N, K]``.
        index: ``[E]`` int64 rows of ``x``.

    Returns:
        ``[E, K]`` in ``x``'s dtype (rows of an out-of-range index are zero).
    """
    out = x.new_empty(index.shape[0], x.shape[1])
    if out.numel():
        grid = (triton.cdiv(index.shape[0], BLOCK_E), triton.cdiv(x.shape[1], BLOCK_K))
        check_grid(grid)
        _gather_rows_kernel[grid](
            x,
            index,
            out,
            x.shape[0],
            index.shape[0],
            x.shape[1],
            x.stride(0),
            x.stride(1),
            out.stride(0),
            out.stride(1),
            BLOCK_E=BLOCK_E,
            BLOCK_K=BLOCK_K,
        )
    return out


def g_ms_seg_triton(
    x: torch.Tensor, w: torch.Tensor, plan: GMSPlan, scale: torch.Tensor | None
) -> torch.Tensor:
    """Run ``G-(MS)seg`` over a plan: gather kernel, then segment GEMM with atomic scatter.

    Args:
        x: ``[N_in, K]`` float32, bfloat16 or float16.
        w: ``[S, K, M]`` same dtype.
        plan: the plan, on ``x``'s device.
        scale: ``[E]`` per plan position (mean weights folded in), or None.

    Returns:
        ``Y`` of shape ``[N_out, M]`` in ``x``'s dtype.

    Raises:
        ValueError: unsupported operands, or a plan array the kernels read is out of range.
    """
    check_atomic_scatter(x, w, plan, scale)
    gathered = gather_rows(x, plan.gather)
    out = scatter_out(plan, w.shape[2], x.device)
    segment_gemm(
        gathered,
        None,
        w,
        (plan.tile_segment, plan.tile_start, plan.tile_end),
        out,
        scatter=plan.scatter,
        scale=scale,
        epilogue=MAX if plan.reduce == "max" else ADD,
    )
    return finish_scatter(out, plan, x.dtype)
