"""``(GM)seg-S`` in Triton: segment GEMM with the gather fused, then a segment-reduce scatter.

.. code-block:: text

    P[p, m] = sum_k X[g[p], k] * W[s, k, m]                p in tile t, s = segment(t)   kernel 1
    Y[i, m] (+= | max=) c[p] * P[p, m]                      q in CSR(i), p = pos[q]       kernel 2

Dataflow: kernel 1 is ``(GMS)seg``'s kernel gathering ``X`` rows in its prologue and storing the
products in plan order (``P[E, M]``, float32); kernel 2 walks the destination CSR
(``dst_ptr``/``dst_pos``), one program per (output row, ``BLOCK_M`` columns), reducing
``BLOCK_Q`` positions at a time. Each output row has one owner: no atomics, and the result does not
depend on the schedule. A ``max`` row no pair reaches is zero.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from fusekit.gms.kernels.triton.checks import (
    check_dst_csr,
    check_index,
    check_operands,
    check_tiles,
)
from fusekit.gms.kernels.triton.gms_seg import STORE, segment_gemm

if TYPE_CHECKING:
    import torch

    from fusekit.gms.problem import GMSPlan

BLOCK_Q = 16
BLOCK_M = 32


@triton.jit
def _reduce_rows_kernel(
    # pointers: src [E, M], scale [E], ptr [N_out + 1], pos [Q], out [N_out, M]
    src_ptr,
    scale_ptr,
    ptr_ptr,
    pos_ptr,
    out_ptr,
    # sizes
    n_pairs,
    n_pos,
    M,
    # strides
    stride_se,
    stride_sm,
    stride_oi,
    stride_om,
    # meta-parameters
    HAS_SCALE: tl.constexpr,
    REDUCE_MAX: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    lo = tl.maximum(tl.load(ptr_ptr + i), 0)
    hi = tl.minimum(tl.load(ptr_ptr + i + 1), n_pos)
    if REDUCE_MAX:
        acc = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for q0 in range(lo, hi, BLOCK_Q):
        offs_q = q0 + tl.arange(0, BLOCK_Q)
        mask_q = offs_q < hi
        p = tl.load(pos_ptr + offs_q, mask=mask_q, other=0)
        mask_q = mask_q & (p >= 0) & (p < n_pairs)
        p = tl.where(mask_q, p, 0)
        mask = mask_q[:, None] & mask_m[None, :]
        vals = tl.load(
            src_ptr + p[:, None] * stride_se + offs_m[None, :] * stride_sm, mask=mask, other=0.0
        ).to(tl.float32)
        if HAS_SCALE:
            c = tl.load(scale_ptr + p, mask=mask_q, other=0.0).to(tl.float32)
            vals = vals * c[:, None]
        if REDUCE_MAX:
            vals = tl.where(mask, vals, float("-inf"))
            acc = tl.maximum(acc, tl.max(vals, axis=0))
        else:
            acc += tl.sum(vals, axis=0)
    if REDUCE_MAX:
        acc = tl.where(hi > lo, acc, 0.0)
    out = out_ptr + i * stride_oi + offs_m * stride_om
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask_m)


def reduce_by_destination(
    products: torch.Tensor, plan: GMSPlan, scale: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    """``Y[i] (+= | max=) c[p] * products[p]`` over the positions of row ``i`` (CSR checked).

    Args:
        products: ``[E, M]`` in plan order.
        plan: the plan whose ``dst_ptr``/``dst_pos`` and ``reduce`` to use.
        scale: ``[E]`` factor of each position, or None.
        dtype: the dtype of the result.

    Returns:
        ``Y`` of shape ``[N_out, M]``.
    """
    import torch

    m = products.shape[1]
    out = torch.empty(plan.n_out, m, dtype=dtype, device=products.device)
    if out.numel():
        grid = (plan.n_out, triton.cdiv(m, BLOCK_M))
        _reduce_rows_kernel[grid](
            products,
            scale if scale is not None else products,
            plan.dst_ptr,
            plan.dst_pos,
            out,
            products.shape[0],
            plan.dst_pos.shape[0],
            m,
            products.stride(0),
            products.stride(1),
            out.stride(0),
            out.stride(1),
            HAS_SCALE=scale is not None,
            REDUCE_MAX=plan.reduce == "max",
            BLOCK_Q=BLOCK_Q,
            BLOCK_M=BLOCK_M,
        )
    return out


def gm_seg_s_triton(
    x: torch.Tensor, w: torch.Tensor, plan: GMSPlan, scale: torch.Tensor | None
) -> torch.Tensor:
    """Run ``(GM)seg-S`` over a plan: gathering segment GEMM, then a CSR reduce (no atomics).

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
    import torch

    check_operands(x, w, scale, plan.num_pairs)
    check_index(plan, "gather", x.shape[0])
    check_tiles(plan, w.shape[0])
    check_dst_csr(plan)
    products = torch.zeros(plan.num_pairs, w.shape[2], dtype=torch.float32, device=x.device)
    tiles = (plan.tile_segment, plan.tile_start, plan.tile_end)
    segment_gemm(x, plan.gather, w, tiles, products, epilogue=STORE)
    return reduce_by_destination(products, plan, scale, x.dtype)
