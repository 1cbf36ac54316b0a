"""``(GMS)seg`` in Triton: gather, segment GEMM and scatter in one kernel.

.. code-block:: text

    Y[d[p], m]  (+= | max=)  c[p] * sum_k A[a(p), k] * W[s, k, m]      p in tile t, s = segment(t)

    a(p) = g[p] (gather in the prologue) or p (rows already gathered, in plan order)

Dataflow: one program per (plan tile, ``BLOCK_M`` columns). The prologue loads the tile's rows of
``X`` by their gather indices straight into the ``tl.dot`` operand (no gathered copy); the
epilogue scales the accumulator and adds it into ``Y`` with atomics (``tl.atomic_add`` for
sum/mean, ``tl.atomic_max`` for max), so ``Y`` is accumulated in float32 and cast at the end.
Rows no pair reaches stay zero; for max they start at ``-inf`` and are set to zero afterwards.

The same kernel, with ``EPILOGUE = STORE``, writes the products in plan order
(``P[p, m]``, the ``(GM)seg`` of ``(GM)seg-S`` and the ``Mseg`` of ``G-Mseg-S``), and, with
``HAS_INDEX = False``, reads consecutive rows of an already gathered ``Xg`` (``G-(MS)seg``).
float32 operands multiply in IEEE float32 (no TF32); bfloat16 and float16 ones on the tensor
cores with a float32 accumulator. Every load and store is masked and every loaded index
bounds-checked in the kernel; the launchers also check the plan arrays and raise ``ValueError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from fusekit.gms.kernels.triton.checks import (
    check_dst_csr,
    check_grid,
    check_index,
    check_operands,
    check_tiles,
    empty_rows_to_zero,
)
from fusekit.gms.launch import current

if TYPE_CHECKING:
    from fusekit.gms.planning.layout import GMSPlan

#: Epilogues of :func:`_segment_gemm_kernel`.
STORE, ADD, MAX = 0, 1, 2

BLOCK_E = 16
BLOCK_K = 16
BLOCK_M = 16


@triton.jit  # type: ignore[untyped-decorator]
def tile_product(  # type: ignore[no-untyped-def]
    # pointers: a [R, K] and the segment's matrix w_seg [K, M]
    a_ptr,
    rows,  # [BLOCK_E] rows of a (already bounds-checked; masked ones are 0)
    mask_rows,
    stride_ar,
    stride_ak,
    w_seg,
    stride_wk,
    stride_wm,
    offs_m,  # [BLOCK_M] columns of w, with their mask
    mask_m,
    K,
    DOT_F32: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """``acc[e, m] = sum_k a[rows[e], k] * w_seg[k, m]`` in float32, ``BLOCK_K`` at a time.

    float32 operands multiply in IEEE float32 (no TF32); others on the tensor cores.
    """
    acc = tl.zeros((BLOCK_E, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        a = tl.load(
            a_ptr + rows[:, None] * stride_ar + offs_k[None, :] * stride_ak,
            mask=mask_rows[:, None] & mask_k[None, :],
            other=0.0,
        )
        w = tl.load(
            w_seg + offs_k[:, None] * stride_wk + offs_m[None, :] * stride_wm,
            mask=mask_k[:, None] & mask_m[None, :],
            other=0.0,
        )
        if DOT_F32:
            acc = tl.dot(a.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, w, acc)
    return acc


@triton.jit  # type: ignore[untyped-decorator]
def _segment_gemm_kernel(  # type: ignore[no-untyped-def]
    # pointers: a [R, K], a_index [E], w [S, K, M], scatter/scale [E], out [N_out or E, M]
    a_ptr,
    a_index_ptr,
    w_ptr,
    scatter_ptr,
    scale_ptr,
    out_ptr,
    # schedule: tiles [T]
    tile_segment_ptr,
    tile_start_ptr,
    tile_end_ptr,
    # sizes: rows of a, of out, matrices of w, positions (of a_index, scatter, scale, P)
    n_rows,
    n_out,
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
    stride_or,
    stride_om,
    # meta-parameters
    HAS_INDEX: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    EPILOGUE: tl.constexpr,
    DOT_F32: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    t = tl.program_id(0)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    s = tl.load(tile_segment_ptr + t).to(tl.int64)
    lo = tl.maximum(tl.load(tile_start_ptr + t), 0)
    hi = tl.minimum(tl.load(tile_end_ptr + t), n_pairs)  # positions past the arrays: none
    s_ok = (s >= 0) & (s < n_segments)
    s = tl.where(s_ok, s, 0)
    hi = tl.where(s_ok, hi, lo)  # a tile naming no segment of w runs no rows
    w_seg = w_ptr + s * stride_ws
    for e0 in range(lo, hi, BLOCK_E):
        offs_e = e0 + tl.arange(0, BLOCK_E)
        mask_e = offs_e < hi
        # ---- prologue: the gather indices are the operand tile's rows ----
        if HAS_INDEX:
            rows = tl.load(a_index_ptr + offs_e, mask=mask_e, other=0)
        else:
            rows = offs_e.to(tl.int64)
        mask_e = mask_e & (rows >= 0) & (rows < n_rows)
        rows = tl.where(mask_e, rows, 0)
        # ---- GEMM: BLOCK_E x BLOCK_M over K, float32 accumulator ----
        acc = tile_product(
            a_ptr, rows, mask_e, stride_ar, stride_ak, w_seg, stride_wk, stride_wm,
            offs_m, mask_m, K, DOT_F32, BLOCK_E, BLOCK_K, BLOCK_M,
        )  # fmt: skip
        # ---- epilogue: scale, then store in plan order or scatter with atomics ----
        if HAS_SCALE:
            c = tl.load(scale_ptr + offs_e, mask=mask_e, other=0.0).to(tl.float32)
            acc = acc * c[:, None]
        if EPILOGUE == 0:
            dst = offs_e.to(tl.int64)
        else:
            dst = tl.load(scatter_ptr + offs_e, mask=mask_e, other=0)
            mask_e = mask_e & (dst >= 0) & (dst < n_out)
            dst = tl.where(mask_e, dst, 0)
        out = out_ptr + dst[:, None] * stride_or + offs_m[None, :] * stride_om
        mask = mask_e[:, None] & mask_m[None, :]
        if EPILOGUE == 0:
            tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)
        elif EPILOGUE == 1:
            tl.atomic_add(out, acc, mask=mask)
        else:
            # float atomic_max is an integer max/min on the bits chosen by the sign bit, so a
            # NaN with the sign bit set would lose; a positive quiet NaN wins against every
            # value and stays (torch.amax propagates NaN)
            acc = tl.where(acc != acc, float("nan"), acc)
            tl.atomic_max(out, acc, mask=mask)


#: Whether Triton's interpreter runs the kernels (``TRITON_INTERPRET=1`` when they were defined).
#: Its ``tl.dot`` multiplies the raw bits of bfloat16 operands, so there they are upcast first.
INTERPRETED = type(_segment_gemm_kernel).__name__ == "InterpretedFunction"


def segment_gemm(
    a: torch.Tensor,
    a_index: torch.Tensor | None,
    w: torch.Tensor,
    tiles: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    out: torch.Tensor,
    *,
    scatter: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    epilogue: int = STORE,
) -> torch.Tensor:
    """Launch :func:`_segment_gemm_kernel` over tiles ``(segment, start, end)`` (checked already).

    Args:
        a: ``[R, K]`` rows of the left operand.
        a_index: ``[E]`` the row of ``a`` of each position, or None for ``a[p]`` (``R >= E``).
        w: ``[S, K, M]``, the dtype of ``a``.
        tiles: ``[T]`` each: the segment, first and one-past-last position of each tile.
        out: ``[E, M]`` for ``STORE`` (any float dtype); ``[N_out, M]`` float32 otherwise.
        scatter: ``[E]`` output row of each position (``ADD``/``MAX``).
        scale: ``[E]`` factor of each position, or None.
        epilogue: ``STORE``, ``ADD`` or ``MAX``.

    Returns:
        ``out``.
    """
    tile_segment, tile_start, tile_end = tiles
    n_tiles, m = tile_segment.shape[0], w.shape[2]
    if n_tiles == 0 or m == 0 or out.shape[0] == 0:
        return out
    # the tuned tile (fusekit.gms.launch), else this file's defaults
    cfg = current()
    block_e, block_k = cfg.block_e or BLOCK_E, cfg.block_k or BLOCK_K
    block_m = cfg.block_m or BLOCK_M
    options = {
        name: value
        for name, value in (("num_warps", cfg.num_warps), ("num_stages", cfg.num_stages))
        if value is not None
    }
    grid = (n_tiles, triton.cdiv(m, block_m))
    check_grid(grid)
    _segment_gemm_kernel[grid](
        a,
        a_index if a_index is not None else tile_start,
        w,
        scatter if scatter is not None else tile_start,
        scale if scale is not None else out,
        out,
        tile_segment,
        tile_start,
        tile_end,
        a.shape[0],
        out.shape[0],
        w.shape[0],
        n_positions(a, a_index, out, scatter, scale, epilogue),
        a.shape[1],
        m,
        a.stride(0),
        a.stride(1),
        w.stride(0),
        w.stride(1),
        w.stride(2),
        out.stride(0),
        out.stride(1),
        HAS_INDEX=a_index is not None,
        HAS_SCALE=scale is not None,
        EPILOGUE=epilogue,
        DOT_F32=a.dtype == torch.float32 or (INTERPRETED and a.dtype == torch.bfloat16),
        BLOCK_E=block_e,
        BLOCK_K=block_k,
        BLOCK_M=block_m,
        **options,
    )
    return out


def n_positions(
    a: torch.Tensor,
    a_index: torch.Tensor | None,
    out: torch.Tensor,
    scatter: torch.Tensor | None,
    scale: torch.Tensor | None,
    epilogue: int,
) -> int:
    """Positions every array the kernel reads or writes by position holds: the tiles' bound."""
    lengths = [a_index.shape[0] if a_index is not None else a.shape[0]]
    lengths += [t.shape[0] for t in (scatter, scale) if t is not None]
    if epilogue == STORE:
        lengths.append(out.shape[0])
    return min(lengths)


def scatter_out(plan: GMSPlan, m: int, device: torch.device) -> torch.Tensor:
    """The float32 ``[N_out, M]`` the atomic epilogues accumulate into (``-inf`` for max)."""
    fill = float("-inf") if plan.reduce == "max" else 0.0
    return torch.full((plan.n_out, m), fill, dtype=torch.float32, device=device)


def check_atomic_scatter(
    x: torch.Tensor, w: torch.Tensor, plan: GMSPlan, scale: torch.Tensor | None
) -> None:
    """Check what the atomic-scatter dataflows read before launching.

    Operands, gather and scatter rows, tiles, and (for max, which zeroes unreached rows by
    degree) the destination CSR.

    Raises:
        ValueError: an operand or a plan array the kernels read is out of range.
    """
    check_operands(x, w, scale, plan.num_pairs)
    check_index(plan, "gather", x.shape[0])
    check_index(plan, "scatter", plan.n_out)
    check_tiles(plan, w.shape[0])
    if plan.reduce == "max":
        check_dst_csr(plan)


def finish_scatter(out: torch.Tensor, plan: GMSPlan, dtype: torch.dtype) -> torch.Tensor:
    """Zero the rows a max never reached, then cast to the operands' dtype."""
    if plan.reduce == "max":
        empty_rows_to_zero(out, plan)
    return out.to(dtype)


def gms_seg_triton(
    x: torch.Tensor, w: torch.Tensor, plan: GMSPlan, scale: torch.Tensor | None
) -> torch.Tensor:
    """Run ``(GMS)seg`` over a plan: one kernel, gather in the prologue, atomics in the epilogue.

    Args:
        x: ``[N_in, K]`` float32, bfloat16 or float16.
        w: ``[S, K, M]`` same dtype.
        plan: the plan, on ``x``'s device.
        scale: ``[E]`` per plan position (mean weights folded in), or None.

    Returns:
        ``Y`` of shape ``[N_out, M]`` in ``x``'s dtype.

    Raises:
        ValueError: unsupported operands, or a plan array the kernel reads is out of range.
    """
    check_atomic_scatter(x, w, plan, scale)
    out = scatter_out(plan, w.shape[2], x.device)
    segment_gemm(
        x,
        plan.gather,
        w,
        (plan.tile_segment, plan.tile_start, plan.tile_end),
        out,
        scatter=plan.scatter,
        scale=scale,
        epilogue=MAX if plan.reduce == "max" else ADD,
    )
    return finish_scatter(out, plan, x.dtype)
