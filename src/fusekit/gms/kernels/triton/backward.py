"""The gradient steps that are not a forward g-mm-s, in Triton: weight outer products, pair dots.

Weight gradient, one result per segment (a GEMM whose reduction runs over the segment's pairs)::

    dW[s, k, m] = sum_{p in segment s} c[p] * A[a_index[p], k] * B[b_index[p], m]

Scale gradient, one dot product per pair (the forward's GEMM with a dot as epilogue)::

    dot[p] = sum_m B[b_index[p], m] * sum_k A[a_index[p], k] * W[s, k, m]

Dataflow: :func:`segment_outer_triton` runs one program per (segment, ``BLOCK_K`` rows,
``BLOCK_M`` columns of ``dW``), looping over the segment's positions ``BLOCK_E`` at a time with a
``tl.dot`` of the gathered, scaled ``A`` rows (transposed) and the gathered ``B`` rows; each
program owns its block of ``dW`` (no atomics). :func:`pair_dot_triton` runs one program per plan
tile: ``BLOCK_E`` rows at a time, the products ``A W`` one ``BLOCK_M`` column block at a time,
dotted with the ``B`` rows in the epilogue. Both accumulate in float32 (IEEE float32 products for
float32 operands, tensor cores for bfloat16/float16) and return the dtype of ``a``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from fusekit.errors import expected
from fusekit.gms.kernels.triton.checks import (
    INT32_LIMIT,
    check_grid,
    check_operands,
    check_rows,
    check_segment_ptr,
    check_tiles,
)
from fusekit.gms.kernels.triton.gms_seg import INTERPRETED, tile_product

if TYPE_CHECKING:
    from fusekit.gms.planning.layout import GMSPlan

BLOCK_E = 16
BLOCK_K = 16
BLOCK_M = 16


@triton.jit  # type: ignore[untyped-decorator]
def _segment_outer_kernel(  # type: ignore[no-untyped-def]
    # pointers: a [Ra, K], a_index [E], b [Rb, M], b_index [E], scale [E], out [S, K, M]
    a_ptr,
    a_index_ptr,
    b_ptr,
    b_index_ptr,
    scale_ptr,
    out_ptr,
    # schedule: segment_ptr [S + 1]
    segment_ptr_ptr,
    # sizes
    n_a,
    n_b,
    n_pairs,
    K,
    M,
    # strides
    stride_ar,
    stride_ak,
    stride_br,
    stride_bm,
    stride_os,
    stride_ok,
    stride_om,
    # meta-parameters
    HAS_SCALE: tl.constexpr,
    DOT_F32: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    s = tl.program_id(0).to(tl.int64)
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_k = offs_k < K
    mask_m = offs_m < M
    lo = tl.maximum(tl.load(segment_ptr_ptr + s), 0)
    hi = tl.minimum(tl.load(segment_ptr_ptr + s + 1), n_pairs)
    acc = tl.zeros((BLOCK_K, BLOCK_M), dtype=tl.float32)
    for e0 in range(lo, hi, BLOCK_E):
        offs_e = e0 + tl.arange(0, BLOCK_E)
        mask_e = offs_e < hi
        # ---- prologue: gather A and B rows by their indices, bounds-checked ----
        ra = tl.load(a_index_ptr + offs_e, mask=mask_e, other=0)
        rb = tl.load(b_index_ptr + offs_e, mask=mask_e, other=0)
        ok_a = mask_e & (ra >= 0) & (ra < n_a)
        ok_b = mask_e & (rb >= 0) & (rb < n_b)
        ra = tl.where(ok_a, ra, 0)
        rb = tl.where(ok_b, rb, 0)
        a = tl.load(
            a_ptr + ra[:, None] * stride_ar + offs_k[None, :] * stride_ak,
            mask=ok_a[:, None] & mask_k[None, :],
            other=0.0,
        )
        b = tl.load(
            b_ptr + rb[:, None] * stride_br + offs_m[None, :] * stride_bm,
            mask=ok_b[:, None] & mask_m[None, :],
            other=0.0,
        )
        if HAS_SCALE:
            c = tl.load(scale_ptr + offs_e, mask=mask_e, other=0.0).to(tl.float32)
            a = (a.to(tl.float32) * c[:, None]).to(a_ptr.dtype.element_ty)
        # ---- GEMM: reduce over the segment's positions ----
        if DOT_F32:
            acc = tl.dot(tl.trans(a.to(tl.float32)), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(tl.trans(a), b, acc)
    out = out_ptr + s * stride_os + offs_k[:, None] * stride_ok + offs_m[None, :] * stride_om
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask_k[:, None] & mask_m[None, :])


@triton.jit  # type: ignore[untyped-decorator]
def _pair_dot_kernel(  # type: ignore[no-untyped-def]
    # pointers: a [Ra, K], a_index [E], w [S, K, M], b [Rb, M], b_index [E], out [E]
    a_ptr,
    a_index_ptr,
    w_ptr,
    b_ptr,
    b_index_ptr,
    out_ptr,
    # schedule: tiles [T]
    tile_segment_ptr,
    tile_start_ptr,
    tile_end_ptr,
    # sizes
    n_a,
    n_b,
    n_segments,
    n_pairs,
    K,
    M,
    # strides
    stride_ar,
    stride_ak,
    stride_ws,
    stride_wk,
    stride_wm,
    stride_br,
    stride_bm,
    # meta-parameters
    DOT_F32: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    t = tl.program_id(0)
    s = tl.load(tile_segment_ptr + t).to(tl.int64)
    lo = tl.maximum(tl.load(tile_start_ptr + t), 0)
    hi = tl.minimum(tl.load(tile_end_ptr + t), n_pairs)
    s_ok = (s >= 0) & (s < n_segments)
    s = tl.where(s_ok, s, 0)
    hi = tl.where(s_ok, hi, lo)  # a tile naming no segment of w runs no rows
    w_seg = w_ptr + s * stride_ws
    for e0 in range(lo, hi, BLOCK_E):
        offs_e = e0 + tl.arange(0, BLOCK_E)
        mask_e = offs_e < hi
        ra = tl.load(a_index_ptr + offs_e, mask=mask_e, other=0)
        rb = tl.load(b_index_ptr + offs_e, mask=mask_e, other=0)
        ok_a = mask_e & (ra >= 0) & (ra < n_a)
        ok_b = mask_e & (rb >= 0) & (rb < n_b)
        ra = tl.where(ok_a, ra, 0)
        rb = tl.where(ok_b, rb, 0)
        dots = tl.zeros((BLOCK_E,), dtype=tl.float32)
        for m0 in range(0, M, BLOCK_M):
            offs_m = m0 + tl.arange(0, BLOCK_M)
            mask_m = offs_m < M
            # ---- GEMM: the products A W of this column block ----
            acc = tile_product(
                a_ptr, ra, ok_a, stride_ar, stride_ak, w_seg, stride_wk, stride_wm,
                offs_m, mask_m, K, DOT_F32, BLOCK_E, BLOCK_K, BLOCK_M,
            )  # fmt: skip
            # ---- epilogue: dot the products with B's rows ----
            b = tl.load(
                b_ptr + rb[:, None] * stride_br + offs_m[None, :] * stride_bm,
                mask=ok_b[:, None] & mask_m[None, :],
                other=0.0,
            ).to(tl.float32)
            # padded columns hold x * 0, NaN where x is infinite: leave them out of the dot
            dots += tl.sum(tl.where(mask_m[None, :], acc * b, 0.0), axis=1)
        tl.store(out_ptr + offs_e, dots.to(out_ptr.dtype.element_ty), mask=mask_e)


def _dot_f32(dtype: torch.dtype) -> bool:
    """Whether ``tl.dot`` gets float32 operands (float32, or bfloat16 under the interpreter)."""
    return dtype == torch.float32 or (INTERPRETED and dtype == torch.bfloat16)


def segment_outer_triton(
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
        a: ``[Ra, K]`` float32, bfloat16 or float16 (contiguous).
        a_index: ``[E]`` rows of ``a`` per plan position.
        b: ``[Rb, M]`` the dtype of ``a`` (contiguous).
        b_index: ``[E]`` rows of ``b`` per plan position.
        scale: ``[E]`` per plan position, or None.
        plan: the plan (its ``segment_ptr``).
        n_segments: matrices in the result (``>= plan.num_segments``; extra ones are zero).

    Returns:
        ``[n_segments, K, M]`` in the dtype of ``a``.

    Raises:
        ValueError: unsupported operands, or a guarded index is out of range.
    """
    n = plan.num_pairs
    if b.dtype != a.dtype or a.dim() != 2 or b.dim() != 2:
        raise ValueError(_operand_error(a, b))
    check_operands(a, a.new_empty(1, a.shape[1], 0), scale, n)
    check_segment_ptr(plan, n_segments)
    check_rows(a_index, n, a.shape[0], "a_index")
    check_rows(b_index, n, b.shape[0], "b_index")
    k, m = a.shape[1], b.shape[1]
    out = torch.zeros(n_segments, k, m, dtype=a.dtype, device=a.device)
    used = plan.segment_ptr.shape[0] - 1
    if used == 0 or k == 0 or m == 0:
        return out
    if k * m >= INT32_LIMIT:
        raise ValueError(_operand_error(a, b))
    grid = (used, triton.cdiv(k, BLOCK_K), triton.cdiv(m, BLOCK_M))
    check_grid(grid)
    _segment_outer_kernel[grid](
        a,
        a_index,
        b,
        b_index,
        scale if scale is not None else a,
        out,
        plan.segment_ptr,
        a.shape[0],
        b.shape[0],
        n,
        k,
        m,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        HAS_SCALE=scale is not None,
        DOT_F32=_dot_f32(a.dtype),
        BLOCK_E=BLOCK_E,
        BLOCK_K=BLOCK_K,
        BLOCK_M=BLOCK_M,
    )
    return out


def pair_dot_triton(
    a: torch.Tensor,
    a_index: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor,
    b_index: torch.Tensor,
    plan: GMSPlan,
) -> torch.Tensor:
    """``dot[p] = B[b_index[p]] . (A[a_index[p]] @ W[segment(p)])`` for every plan position.

    Args:
        a: ``[Ra, K]`` rows, float32, bfloat16 or float16.
        a_index: ``[E]`` the row of ``a`` of each plan position.
        w: ``[S, K, M]`` the dtype of ``a``.
        b: ``[Rb, M]`` rows, the dtype of ``a``.
        b_index: ``[E]`` the row of ``b`` of each plan position.
        plan: the plan whose tiles to run.

    Returns:
        ``[E]`` in plan order, in the dtype of ``a``.

    Raises:
        ValueError: unsupported operands, or a guarded index is out of range.
    """
    n = plan.num_pairs
    check_operands(a, w, None, n)
    if b.dtype != a.dtype or b.dim() != 2 or b.shape[1] != w.shape[2]:
        raise ValueError(_operand_error(a, b))
    check_rows(a_index, n, a.shape[0], "a_index")
    check_rows(b_index, n, b.shape[0], "b_index")
    check_tiles(plan, w.shape[0])
    out = torch.zeros(n, dtype=a.dtype, device=a.device)
    n_tiles = plan.tile_segment.shape[0]
    if n_tiles == 0 or n == 0:
        return out
    _pair_dot_kernel[(n_tiles,)](
        a,
        a_index,
        w,
        b,
        b_index,
        out,
        plan.tile_segment,
        plan.tile_start,
        plan.tile_end,
        a.shape[0],
        b.shape[0],
        w.shape[0],
        n,
        w.shape[1],
        w.shape[2],
        a.stride(0),
        a.stride(1),
        w.stride(0),
        w.stride(1),
        w.stride(2),
        b.stride(0),
        b.stride(1),
        DOT_F32=_dot_f32(a.dtype),
        BLOCK_E=BLOCK_E,
        BLOCK_K=BLOCK_K,
        BLOCK_M=BLOCK_M,
    )
    return out


def _operand_error(a: torch.Tensor, b: torch.Tensor) -> str:
    got = (tuple(a.shape), a.dtype, tuple(b.shape), b.dtype)
    return expected("gms", "a, b", "2-D rows of one dtype, matching the weights", got)
