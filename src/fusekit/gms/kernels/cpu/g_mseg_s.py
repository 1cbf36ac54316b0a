"""``G-Mseg-S`` on the CPU: gather, segment GEMM and scatter as three kernels.

.. code-block:: text

    Xg[p, k] = X[g[p], k]                                   kernel 1 (numba)
    P[p, m]  = sum_k Xg[p, k] * W[s, k, m]    p in segment s  kernel 2 (ATen GEMM per segment)
    Y[i, m] (+= | max=) c[p] * P[p, m]        p in CSR(i)     kernel 3 (numba)

Dataflow: both intermediates, ``Xg[E, K]`` and ``P[E, M]``, go through memory; in exchange the
GEMM is the vendor's. Kernel 2 is one ``torch.mm`` per non-empty segment (MKL on the CPU) writing
into ``P``. ``Xg`` and ``P`` are the thread's scratch buffers, reused across calls (see
:func:`~fusekit.gms.memory.scratch`), so a call allocates only ``Y``; kernel 3 writes
each row of ``Y`` once, the scale fused. Kernels 1 and 3 replace ATen's ``index_select`` and
``index_add_``, whose bytes/s fall far below the streaming bandwidth
(``benchmarks/hw_roofline.py``). Where the GEMM dominates (large ``K * M``, as in
Mixture-of-Experts) this dataflow and ``(GM)seg-S`` (the numba register tile instead of MKL,
no ``Xg``) both run close to the bare GEMMs; ``benchmarks/gms_kernels.py`` (``over_floor``)
measures which is ahead on a machine.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np
import torch

from fusekit.errors import expected
from fusekit.gms.kernels.cpu.checks import check_operands, check_segment_ptr
from fusekit.gms.kernels.cpu.rows import check_out, gather_rows_cpu, reduce_rows_cpu
from fusekit.gms.kernels.cpu.skinny import SKINNY_ROWS, segment_skinny_mm, weight_layout
from fusekit.gms.memory import scratch

if TYPE_CHECKING:
    from fusekit.gms.planning.layout import GMSPlan


def grouped_mm_supported(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``torch._grouped_mm`` accepts these operands on this build (dtype, 16-byte rows)."""
    if not hasattr(torch, "_grouped_mm") or a.dtype not in (torch.float32, torch.bfloat16):
        return False
    return all((t.shape[-1] * t.element_size()) % 16 == 0 for t in (a, b))


def check_matrices(rows: torch.Tensor, w: torch.Tensor) -> None:
    """Raise unless ``rows[E, K]`` and ``w[S, K, M]`` are tensors of one dtype and device.

    Raises:
        TypeError: not tensors, or of different dtypes.
        ValueError: the wrong dimensions, ``K`` or device.
    """
    if not isinstance(rows, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise TypeError(expected("gms", "rows, w", "tensors", (type(rows), type(w))))
    if rows.dtype != w.dtype:
        raise TypeError(expected("gms", "w", f"{rows.dtype} like 'rows'", w.dtype))
    if rows.dim() != 2 or w.dim() != 3 or w.shape[1] != rows.shape[1] or w.device != rows.device:
        got = f"{tuple(rows.shape)} on {rows.device}, {tuple(w.shape)} on {w.device}"
        raise ValueError(expected("gms", "rows, w", "[E, K] and [S, K, M] on one device", got))


def segment_mm(
    rows: torch.Tensor,
    w: torch.Tensor,
    segment_ptr: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``P[p] = rows[p] @ w[s]`` for the positions ``p`` of each segment ``s`` (contiguous).

    Args:
        rows: ``[E, K]`` sorted by segment.
        w: ``[S_w, K, M]`` with ``S_w >= len(segment_ptr) - 1``; a backward pass may pass a
            forward weight as ``wt.transpose(1, 2)`` without copying it (every path reads it
            as is: ``torch.mm`` as a transposed operand, the skinny kernel by
            :func:`~fusekit.gms.kernels.cpu.skinny.rows_times_wt`).
        segment_ptr: ``[S + 1]`` where each segment's rows start.
        out: ``[E, M]`` contiguous tensor to write into, new if None. Segments of at most
            ``SKINNY_ROWS`` rows use :func:`~fusekit.gms.kernels.cpu.skinny.segment_skinny_mm`,
            which streams ``w`` faster than ATen; the others one ``torch.mm`` each, or, with no
            ``out`` and no small segment, one ``torch._grouped_mm``.

    Returns:
        ``out``, ``[E, M]``.

    Raises:
        TypeError: ``rows`` and ``w`` are not tensors of one dtype.
        ValueError: their shapes do not match, ``segment_ptr`` is not a pointer over the rows
            or names more segments than ``w`` has, or ``out`` has the wrong shape.
    """
    check_matrices(rows, w)
    check_segment_ptr(segment_ptr, rows.shape[0])
    n_segments = segment_ptr.shape[0] - 1
    if n_segments > w.shape[0]:
        raise ValueError(
            expected("gms", "segment_ptr", f"at most {w.shape[0]} segments (of 'w')", n_segments)
        )
    bounds = segment_ptr.tolist()
    skinny = (
        rows.device.type == "cpu"
        and rows.dtype in (torch.float32, torch.float64)
        and rows.is_contiguous()
        and weight_layout(w) is not None
        and (out is None or out.is_contiguous())
    )
    small = [
        s for s in range(n_segments) if skinny and 0 < bounds[s + 1] - bounds[s] <= SKINNY_ROWS
    ]
    if out is None and not small and grouped_mm_supported(rows, w):
        ends = segment_ptr[1:]
        if w.shape[0] > n_segments:  # trailing weight matrices that no pair uses
            ends = torch.cat([ends, ends[-1:].expand(w.shape[0] - n_segments)])
        return torch._grouped_mm(rows, w, offs=ends.to(torch.int32))
    if out is None:
        out = rows.new_empty(rows.shape[0], w.shape[2])
    check_out(out, (rows.shape[0], w.shape[2]), rows.dtype)
    for s in range(n_segments):
        lo, hi = bounds[s], bounds[s + 1]
        if hi - lo > SKINNY_ROWS or (hi > lo and not skinny):
            torch.mm(rows[lo:hi], w[s], out=out[lo:hi])
    return segment_skinny_mm(rows, w, segment_ptr, small, out)


def segment_outer_mm(
    a: torch.Tensor, b: torch.Tensor, segment_ptr: torch.Tensor, n_segments: int
) -> torch.Tensor:
    """``dW[s] = a[P_s]^T @ b[P_s]`` over the positions of each segment (the weight gradient).

    One ``torch._grouped_mm`` where it takes the operands and every segment has positions.
    Otherwise the result starts as zeros that cost nothing until touched (on the CPU numpy's
    ``calloc``, where ``torch.zeros`` writes every page) and one ``torch.mm`` per segment with
    positions writes its matrix: a segment without positions (an expert no token chose) leaves
    its pages unwritten. At a few tokens most experts get no token, so writing all of ``dW``
    would mostly fault in fresh pages that no product needs (4 tokens top-6 of 64 experts: at
    most 24 of the 64 matrices are products).

    Args:
        a: ``[E, K]`` sorted by segment.
        b: ``[E, M]`` sorted by segment.
        segment_ptr: ``[S + 1]``.
        n_segments: matrices in the result (``>= S``; the extra ones are zero).

    Returns:
        ``[n_segments, K, M]``.

    Raises:
        ValueError: ``a`` and ``b`` do not have one row per position and one dtype,
            ``segment_ptr`` is not a pointer over them, or ``n_segments`` is too small.
    """
    if not (a.dim() == b.dim() == 2 and a.shape[0] == b.shape[0] and a.dtype == b.dtype):
        got = f"{tuple(a.shape)} {a.dtype} and {tuple(b.shape)} {b.dtype}"
        raise ValueError(expected("gms", "a, b", "[E, K] and [E, M] of one dtype", got))
    check_segment_ptr(segment_ptr, a.shape[0])
    s_plan = segment_ptr.shape[0] - 1
    if isinstance(n_segments, bool) or not isinstance(n_segments, int) or n_segments < s_plan:
        raise ValueError(expected("gms", "n_segments", f"an int >= {s_plan}", n_segments))
    bounds = segment_ptr.tolist()
    every = n_segments == s_plan and all(hi > lo for lo, hi in itertools.pairwise(bounds))
    if every and grouped_mm_supported(a, b) and a.shape[0] % 4 == 0:
        return torch._grouped_mm(a.t(), b, offs=segment_ptr[1:].to(torch.int32))
    out = lazy_zeros((n_segments, a.shape[1], b.shape[1]), a)
    for s in range(s_plan):
        lo, hi = bounds[s], bounds[s + 1]
        if hi > lo:
            torch.mm(a[lo:hi].t(), b[lo:hi], out=out[s])
    return out


def per_segment_mm(
    rows: torch.Tensor, w: torch.Tensor, bounds: list[int], out: torch.Tensor
) -> torch.Tensor:
    """``out[lo:hi] = rows[lo:hi] @ w[s]`` by one ``torch.mm`` per non-empty segment.

    The products of ``G-Mseg-S``'s forward; the max gradient recomputes them with this same
    function (:func:`fusekit.gms.dispatch.pair_values`), so its winners match the forward's to
    the last bit (the skinny kernels of :func:`segment_mm` round differently).
    """
    for s in range(len(bounds) - 1):
        lo, hi = bounds[s], bounds[s + 1]
        if hi > lo:
            torch.mm(rows[lo:hi], w[s], out=out[lo:hi])
    return out


def lazy_zeros(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """Zeros of ``like``'s dtype and device whose untouched pages are never written (CPU).

    numpy's ``zeros`` is ``calloc``, which for blocks past the C allocator's mmap threshold
    (128 KiB, rising to at most 32 MiB) maps fresh pages that read as zeros until first written,
    where ``torch.zeros`` fills (faults in) every page (a smaller block may be cleared by
    ``calloc``, which is only as slow). Reading untouched pages later costs no more than reading
    written ones. The tensor shares the array's memory (its storage cannot be resized).
    Other devices and dtypes: ``torch.zeros``.
    """
    name = {torch.float32: "float32", torch.float64: "float64"}.get(like.dtype)
    if like.device.type != "cpu" or name is None:
        return like.new_zeros(shape)
    return torch.from_numpy(np.zeros(shape, dtype=name))


def g_mseg_s_cpu(
    x: torch.Tensor, w: torch.Tensor, plan: GMSPlan, scale: torch.Tensor | None
) -> torch.Tensor:
    """Run ``G-Mseg-S`` over a plan.

    Args:
        x: ``[N_in, K]`` float32/float64, contiguous.
        w: ``[S, K, M]`` same dtype, contiguous.
        plan: the plan (on the CPU).
        scale: ``[E]`` per plan position (mean weights folded in), or None.

    Returns:
        ``Y`` of shape ``[N_out, M]``.

    Raises:
        TypeError: an operand has the wrong type or dtype.
        ValueError: an operand's shape is wrong, or a guarded index is out of range.
    """
    check_operands(x, w, scale, plan.num_pairs, plan.num_segments)
    e, dtype = plan.num_pairs, x.dtype
    bounds = plan.derived.segment_bounds
    if bounds is None:  # checked once per plan, like everything derived from it
        check_segment_ptr(plan.segment_ptr, e)
        bounds = plan.derived.segment_bounds = plan.segment_ptr.tolist()
    gathered = gather_rows_cpu(x, plan.gather, out=scratch("rows", e, x.shape[1], dtype))
    products = per_segment_mm(gathered, w, bounds, scratch("products", e, w.shape[2], dtype))
    return reduce_rows_cpu(
        products,
        plan.dst_ptr,
        n_pairs=plan.num_pairs,
        scale=scale,
        pos=plan.dst_pos,
        reduce_max=plan.reduce == "max",
    )
