"""The G and S steps on their own in Triton: gather rows, and reduce rows into their destinations.

Gather (``G-(MS)seg``'s gather kernel, with its index checked)::

    out[p, k] = x[index[p], k]

Reduce by destination (the ``S`` of ``G-Mseg-S`` and ``(GM)seg-S``, the second step of
transform-first, the first of aggregate-first and the last of the input gradient)::

    out[i, m] (+= | max=) scale[p] * src[src_index[p], m]    for q in [ptr[i], ptr[i+1]), p = pos[q]

One program per (output row, ``BLOCK_M`` columns) walks the row's CSR range ``BLOCK_Q``
positions at a time in float32: each output row has one owner, so there are no atomics and the
result does not depend on the schedule. A ``max`` row with no entries is zero. The launchers check
every index the kernels read and raise ``ValueError`` (the kernels mask their loads as well).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fusekit.errors import expected
from fusekit.gms.kernels.triton.checks import check_grid
from fusekit.gms.kernels.triton.g_ms_seg import gather_rows

BLOCK_Q = 16
BLOCK_M = 32


@triton.jit
def nan_max(a, b):  # type: ignore[no-untyped-def]
    """``max(a, b)``, NaN if either is NaN, as ``torch.amax`` (``tl.max`` drops NaN on GPUs)."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit  # type: ignore[untyped-decorator]
def _reduce_rows_kernel(  # type: ignore[no-untyped-def]
    # pointers: src [R, M], src_index [P], scale [P], ptr [N_out + 1], pos [Q], out [N_out, M]
    src_ptr,
    src_index_ptr,
    scale_ptr,
    ptr_ptr,
    pos_ptr,
    out_ptr,
    # sizes: positions p lie in [0, n_pairs), CSR entries q in [0, n_pos)
    n_src,
    n_pairs,
    n_pos,
    M,
    # strides
    stride_sr,
    stride_sm,
    stride_oi,
    stride_om,
    # meta-parameters
    HAS_INDEX: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_POS: tl.constexpr,
    ACCUMULATE: tl.constexpr,
    REDUCE_MAX: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    lo = tl.maximum(tl.load(ptr_ptr + i), 0)
    hi = tl.minimum(tl.load(ptr_ptr + i + 1), n_pos)
    out = out_ptr + i * stride_oi + offs_m * stride_om
    if ACCUMULATE:
        acc = tl.load(out, mask=mask_m, other=0.0).to(tl.float32)
    elif REDUCE_MAX:
        acc = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for q0 in range(lo, hi, BLOCK_Q):
        offs_q = q0 + tl.arange(0, BLOCK_Q)
        mask_q = offs_q < hi
        # ---- CSR entry -> position -> source row, each bounds-checked ----
        if HAS_POS:
            p = tl.load(pos_ptr + offs_q, mask=mask_q, other=0)
        else:
            p = offs_q.to(tl.int64)
        mask_q = mask_q & (p >= 0) & (p < n_pairs)
        p = tl.where(mask_q, p, 0)
        if HAS_INDEX:
            r = tl.load(src_index_ptr + p, mask=mask_q, other=0)
        else:
            r = p
        mask_q = mask_q & (r >= 0) & (r < n_src)
        r = tl.where(mask_q, r, 0)
        mask = mask_q[:, None] & mask_m[None, :]
        vals = tl.load(
            src_ptr + r[:, None] * stride_sr + offs_m[None, :] * stride_sm, mask=mask, other=0.0
        ).to(tl.float32)
        if HAS_SCALE:
            c = tl.load(scale_ptr + p, mask=mask_q, other=0.0).to(tl.float32)
            vals = vals * c[:, None]
        if REDUCE_MAX:
            vals = tl.where(mask, vals, float("-inf"))
            acc = nan_max(acc, tl.reduce(vals, 0, nan_max))
        else:
            acc += tl.sum(vals, axis=0)
    if REDUCE_MAX:
        acc = tl.where(hi > lo, acc, 0.0)
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask_m)


def launch_reduce_rows(
    src: torch.Tensor,
    ptr: torch.Tensor,
    out: torch.Tensor,
    *,
    n_pairs: int,
    src_index: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    pos: torch.Tensor | None = None,
    reduce_max: bool = False,
    accumulate: bool = False,
) -> torch.Tensor:
    """Launch the reduce kernel (indices checked by the caller; the kernel masks the rest).

    Args:
        src: ``[R, M]`` rows to reduce.
        ptr: ``[N_out + 1]`` CSR pointer into ``pos`` (or into positions, if ``pos`` is None).
        out: ``[N_out, M]`` result, written (or combined with, if ``accumulate``).
        n_pairs: number of positions.
        src_index: ``[n_pairs]`` the ``src`` row of each position; identity if None.
        scale: ``[n_pairs]`` factor of each position; 1 if None.
        pos: ``[Q]`` positions listed by output row; identity if None.
        reduce_max: ``max`` instead of ``sum``.
        accumulate: start from ``out``'s values instead of zero (or ``-inf`` for max).

    Returns:
        ``out``.
    """
    m = out.shape[1]
    if out.shape[0] == 0 or m == 0:
        return out
    if ptr.shape != (out.shape[0] + 1,) or src.shape[1] != m:
        got = f"ptr {tuple(ptr.shape)}, src {tuple(src.shape)}, out {tuple(out.shape)}"
        raise ValueError(expected("gms", "ptr, src, out", "[N + 1], [R, M] and [N, M]", got))
    grid = (out.shape[0], triton.cdiv(m, BLOCK_M))
    check_grid(grid)
    _reduce_rows_kernel[grid](
        src,
        src_index if src_index is not None else ptr,
        scale if scale is not None else src,
        ptr,
        pos if pos is not None else ptr,
        out,
        src.shape[0],
        n_pairs,
        pos.shape[0] if pos is not None else n_pairs,
        m,
        src.stride(0),
        src.stride(1),
        out.stride(0),
        out.stride(1),
        HAS_INDEX=src_index is not None,
        HAS_SCALE=scale is not None,
        HAS_POS=pos is not None,
        ACCUMULATE=accumulate,
        REDUCE_MAX=reduce_max,
        BLOCK_Q=BLOCK_Q,
        BLOCK_M=BLOCK_M,
    )
    return out


def _out_of_range(index: torch.Tensor, high: int) -> torch.Tensor:
    """A 0-d bool tensor: does ``index`` hold a value outside ``[0, high)``."""
    if index.numel() == 0:
        return torch.zeros((), dtype=torch.bool, device=index.device)
    return (index.min() < 0) | (index.max() >= high)


def gather_rows_triton(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``out[p] = x[index[p]]`` with a Triton kernel.

    Args:
        x: ``[N, K]`` float tensor (contiguous).
        index: ``[E]`` int64 rows of ``x``.

    Returns:
        ``[E, K]`` in the dtype of ``x``.

    Raises:
        ValueError: an index lies outside ``[0, N)``.
    """
    if bool(_out_of_range(index, x.shape[0])):
        bad = int(((index < 0) | (index >= x.shape[0])).sum())
        raise ValueError(
            expected(
                "gms",
                "plan gather index",
                f"rows in [0, {x.shape[0]})",
                f"{bad} guarded reads out of range",
            )
        )
    return gather_rows(x, index)


def reduce_rows_triton(
    src: torch.Tensor,
    ptr: torch.Tensor,
    *,
    n_pairs: int,
    src_index: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    pos: torch.Tensor | None = None,
    reduce_max: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out[i] (+= | max=) scale[p] * src[src_index[p]]`` over the positions of row ``i``.

    Args:
        src: ``[R, M]`` rows to reduce (contiguous).
        ptr: ``[N_out + 1]`` CSR pointer into ``pos`` (or into positions, if ``pos`` is None).
        n_pairs: number of positions (the length of ``src_index`` and ``scale``).
        src_index: ``[n_pairs]`` the ``src`` row of each position; identity if None.
        scale: ``[n_pairs]`` factor of each position; 1 if None.
        pos: ``[Q]`` positions listed by output row; identity if None.
        reduce_max: ``max`` instead of ``sum``.
        out: accumulate into this ``[N_out, M]`` tensor (zeros, or -inf for max, if None).

    Returns:
        ``out`` (a new tensor in the dtype of ``src`` if None was given).

    Raises:
        ValueError: a pointer, position or row index lies out of range.
    """
    _check_csr(src, ptr, n_pairs, src_index, scale, pos)
    accumulate = out is not None
    if out is None:
        out = torch.empty(ptr.shape[0] - 1, src.shape[1], dtype=src.dtype, device=src.device)
    return launch_reduce_rows(
        src,
        ptr,
        out,
        n_pairs=n_pairs,
        src_index=src_index,
        scale=scale,
        pos=pos,
        reduce_max=reduce_max,
        accumulate=accumulate,
    )


def _check_csr(
    src: torch.Tensor,
    ptr: torch.Tensor,
    n_pairs: int,
    src_index: torch.Tensor | None,
    scale: torch.Tensor | None,
    pos: torch.Tensor | None,
) -> None:
    """Raise unless every pointer, position and source row the reduce reads is in range.

    Raises:
        ValueError: a malformed pointer, or a position or row index out of range.
    """
    n_ptr = pos.shape[0] if pos is not None else n_pairs
    ok = ptr.dim() == 1 and ptr.numel() >= 1
    ok = ok and (src_index is None or src_index.shape[0] >= n_pairs)
    ok = ok and (scale is None or scale.shape[0] >= n_pairs)
    if ok:
        bad = (ptr[0] < 0) | (ptr[-1] > n_ptr)
        if ptr.numel() > 1:
            bad = bad | (ptr.diff() < 0).any()
        if pos is not None:
            bad = bad | _out_of_range(pos, n_pairs)
        if src_index is not None:
            bad = bad | _out_of_range(src_index[:n_pairs], src.shape[0])
        elif pos is not None:
            bad = bad | _out_of_range(pos, src.shape[0])
        else:
            bad = bad | (ptr[-1] > src.shape[0])
        ok = not bool(bad)
    if not ok:
        raise ValueError(
            expected(
                "gms",
                "plan CSR",
                f"pointers and positions in range of {n_pairs} pairs",
                "guarded reads out of range",
            )
        )
