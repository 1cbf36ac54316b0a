"""A weight-streaming GEMM for segments of a few rows (numba): ``out[P_s] = a[P_s] @ w[s]``.

With at most ``SKINNY_ROWS`` rows per segment (MoE experts at decode-sized batches), the time is
reading ``w[s]`` once from DRAM: ``K M`` elements for ``2 R K M`` FLOPs. ATen's ``mm`` treats such
a product as a small GEMM and streams ``w`` at a fraction of the bandwidth (``benchmarks/moe.py``
compares the two as ``floor torch.mm`` and ``floor segment_mm``). One call covers every small
segment: work items are (segment, column range) pairs, each item computing::

    out[lo + r, c0:c1] = sum_k a[lo + r, k] * w[s, k, c0:c1]

with its ``R x (c1 - c0)`` accumulators in a thread-local buffer (L1/L2). The ``k`` loop is
unrolled by 4 and rows are taken two at a time, so each loaded vector of ``w`` feeds eight fused
multiply-adds. A segment is split into ``threads / gcd(segments, threads)`` column ranges, the
fewest that give every thread the same number of items: whole matrices stream best (contiguous),
and short column runs of narrow matrices defeat the prefetcher. Reference: ``torch.mm`` per
segment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numba
import numpy as np
from numba import prange
from numba.np.numpy_support import carray

from fusekit.errors import expected
from fusekit.gms.kernels.cpu.checks import check_rows_operand, check_segment_ptr
from fusekit.gms.kernels.cpu.rows import check_out, numpy_of
from fusekit.gms.kernels.cpu.schedule import balanced_chunks, lpt_schedule
from fusekit.gms.kernels.cpu.tile import FASTMATH, MR_NR, stack_buffer

if TYPE_CHECKING:
    import torch

#: Most rows a segment may have for :func:`segment_skinny_mm` (ATen's ``mm`` is as fast beyond).
SKINNY_ROWS = 16


@numba.njit(cache=True, fastmath=FASTMATH)
def rows_times_w(a, a_rows, w, c0, c1, acc):  # type: ignore[no-untyped-def]
    """``acc[r, :] += a[a_rows[r]] @ w[:, c0:c1]`` for every ``r``: the streaming inner product.

    ``w`` (``[K, M]``) is read once, four rows of the column range at a time; rows of ``a`` are
    taken two at a time so each loaded vector of ``w`` feeds eight fused multiply-adds into the
    ``len(a_rows) x (c1 - c0)`` accumulators (L1/L2). ``a_rows`` gathers: the rows of ``a`` need
    not be contiguous or sorted.
    """
    depth = w.shape[0]
    rows = a_rows.shape[0]
    width = c1 - c0
    k = 0
    while k + 4 <= depth:
        w0r, w1r = w[k, c0:c1], w[k + 1, c0:c1]
        w2r, w3r = w[k + 2, c0:c1], w[k + 3, c0:c1]
        r = 0
        while r + 4 <= rows:
            i, j, i2, j2 = a_rows[r], a_rows[r + 1], a_rows[r + 2], a_rows[r + 3]
            a0, a1, a2, a3 = a[i, k], a[i, k + 1], a[i, k + 2], a[i, k + 3]
            b0, b1, b2, b3 = a[j, k], a[j, k + 1], a[j, k + 2], a[j, k + 3]
            c0_, c1_, c2_, c3_ = a[i2, k], a[i2, k + 1], a[i2, k + 2], a[i2, k + 3]
            d0, d1, d2, d3 = a[j2, k], a[j2, k + 1], a[j2, k + 2], a[j2, k + 3]
            ar = acc[r]
            br = acc[r + 1]
            cr = acc[r + 2]
            dr = acc[r + 3]
            for m in range(width):
                w0, w1, w2, w3 = w0r[m], w1r[m], w2r[m], w3r[m]
                ar[m] += a0 * w0 + a1 * w1 + a2 * w2 + a3 * w3
                br[m] += b0 * w0 + b1 * w1 + b2 * w2 + b3 * w3
                cr[m] += c0_ * w0 + c1_ * w1 + c2_ * w2 + c3_ * w3
                dr[m] += d0 * w0 + d1 * w1 + d2 * w2 + d3 * w3
            r += 4
        while r + 2 <= rows:
            i, j = a_rows[r], a_rows[r + 1]
            a0, a1, a2, a3 = a[i, k], a[i, k + 1], a[i, k + 2], a[i, k + 3]
            b0, b1, b2, b3 = a[j, k], a[j, k + 1], a[j, k + 2], a[j, k + 3]
            ar = acc[r]
            br = acc[r + 1]
            for m in range(width):
                w0, w1, w2, w3 = w0r[m], w1r[m], w2r[m], w3r[m]
                ar[m] += a0 * w0 + a1 * w1 + a2 * w2 + a3 * w3
                br[m] += b0 * w0 + b1 * w1 + b2 * w2 + b3 * w3
            r += 2
        if r < rows:
            i = a_rows[r]
            a0, a1, a2, a3 = a[i, k], a[i, k + 1], a[i, k + 2], a[i, k + 3]
            ar = acc[r]
            for m in range(width):
                ar[m] += a0 * w0r[m] + a1 * w1r[m] + a2 * w2r[m] + a3 * w3r[m]
        k += 4
    while k < depth:
        wr = w[k, c0:c1]
        for r in range(rows):
            a0 = a[a_rows[r], k]
            ar = acc[r]
            for m in range(width):
                ar[m] += a0 * wr[m]
        k += 1


#: Lanes of one dot-product accumulator in :func:`rows_times_wt` (an AVX2 fp32 vector).
LANES = 8


@numba.njit(cache=True, fastmath=FASTMATH, inline="always")
def _dot_block(a, i, j, wt, m0, m1, m2, m3, depth, lanes):  # type: ignore[no-untyped-def]
    """``lanes[2 q + p, l] = sum_k a[(i, j)[p], 8 k' + l] wt[m_q, 8 k' + l]``: 8 dot products.

    Two rows of ``a`` against four rows of ``wt``, each product kept as ``LANES`` partial sums
    (one vector register) over the ``k`` that are whole vectors; the caller sums the lanes.
    """
    for d in range(8):
        for lane in range(LANES):
            lanes[d, lane] = 0
    for k0 in range(0, depth - depth % LANES, LANES):
        for lane in range(LANES):
            k = np.uint64(k0 + lane)
            x0 = a[i, k]
            x1 = a[j, k]
            v0, v1, v2, v3 = wt[m0, k], wt[m1, k], wt[m2, k], wt[m3, k]
            lanes[0, lane] += x0 * v0
            lanes[1, lane] += x1 * v0
            lanes[2, lane] += x0 * v1
            lanes[3, lane] += x1 * v1
            lanes[4, lane] += x0 * v2
            lanes[5, lane] += x1 * v2
            lanes[6, lane] += x0 * v3
            lanes[7, lane] += x1 * v3


@numba.njit(cache=True, fastmath=FASTMATH)
def rows_times_wt(a, a_rows, wt, c0, c1, acc):  # type: ignore[no-untyped-def]
    """``acc[r, m - c0] += sum_k a[a_rows[r], k] * wt[m, k]`` for ``m`` in ``[c0, c1)``.

    ``w`` given transposed (``wt = w^T``, ``[M, K]``, a weight used as ``x @ w^T``, as a
    backward pass does): output column ``m`` is a dot product with row ``m`` of ``wt``, read
    contiguously. Four rows of ``wt`` (L1) meet the rows of ``a`` (L1/L2) two at a time, eight
    dot products in vector registers (:func:`_dot_block`); each ``wt`` row streams from memory
    once. The ``k`` past the last whole vector are added after the lanes.
    """
    depth = wt.shape[1]
    n = a_rows.shape[0]
    tail = depth - depth % LANES
    lanes = carray(stack_buffer(acc, MR_NR), (8, LANES))
    for m0 in range(c0, c1, 4):
        nm = min(4, c1 - m0)
        m1 = m0 + 1 if nm > 1 else m0
        m2 = m0 + 2 if nm > 2 else m0
        m3 = m0 + 3 if nm > 3 else m0
        for r in range(0, n, 2):
            i = a_rows[r]
            j = a_rows[r + 1] if r + 1 < n else i
            _dot_block(a, i, j, wt, m0, m1, m2, m3, depth, lanes)
            for q in range(nm):
                m = m0 + q
                for p in range(min(2, n - r)):
                    row = i if p == 0 else j
                    total = 0.0
                    for lane in range(LANES):
                        total += lanes[2 * q + p, lane]
                    for k in range(tail, depth):
                        total += a[row, k] * wt[m, k]
                    acc[r + p, m - c0] += total


@numba.njit(cache=True, fastmath=FASTMATH)
def segment_block(a, w, lo, hi, c0, c1, out, transposed=False):  # type: ignore[no-untyped-def]
    """``out[lo:hi, c0:c1] = a[lo:hi] @ w[:, c0:c1]`` (one item of a segment GEMM).

    ``transposed``: ``w`` is given as ``w^T`` (``[M, K]``, :func:`rows_times_wt`).
    """
    acc = np.zeros((hi - lo, c1 - c0), dtype=out.dtype)
    if transposed:
        rows_times_wt(a, np.arange(lo, hi), w, c0, c1, acc)
    else:
        rows_times_w(a, np.arange(lo, hi), w, c0, c1, acc)
    out[lo:hi, c0:c1] = acc


#: Rows at which an item's FMAs take as long as streaming its ``w``: per fp32 element of ``w``,
#: ``4 B / read_bytes_per_s = 2 rows / flops_per_s``, so ``rows = 2 flops_per_s /
#: read_bytes_per_s`` (set for a 2-core laptop CPU); the ``ROWS_AT_BALANCE`` of :func:`item_cost`.
ROWS_AT_BALANCE = 6


@numba.njit(cache=True)
def item_cost(rows, width):  # type: ignore[no-untyped-def]
    """Relative time of an item: ``width x (ROWS_AT_BALANCE + rows)`` (stream plus compute)."""
    return width * (ROWS_AT_BALANCE + rows)


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def _segment_skinny_kernel(a, w, bounds, segments, chunks, threads, out, transposed):  # type: ignore[no-untyped-def]
    cols = w.shape[1] if transposed else w.shape[2]
    n = segments.shape[0] * chunks
    costs = np.empty(n)
    for item in range(n):
        s = segments[item // chunks]
        costs[item] = item_cost(bounds[s + 1] - bounds[s], cols // chunks)
    order, ptr, _ = lpt_schedule(costs, threads)
    for th in prange(threads):
        for q in range(ptr[th], ptr[th + 1]):
            item = order[q]
            s = segments[item // chunks]
            c = item % chunks
            c0 = c * cols // chunks
            c1 = (c + 1) * cols // chunks
            segment_block(a, w[s], bounds[s], bounds[s + 1], c0, c1, out, transposed)


def weight_layout(w: torch.Tensor) -> str | None:
    """How the skinny kernels can read ``w`` (``[S, K, M]``), or None if they cannot.

    ``"rows"``: contiguous. ``"transposed"``: a view ``wt.transpose(1, 2)`` of a contiguous
    ``wt`` (``[S, M, K]``, a forward weight as a backward pass reads it).
    """
    if w.is_contiguous():
        return "rows"
    if w.dim() == 3 and w.transpose(1, 2).is_contiguous():
        return "transposed"
    return None


def segment_skinny_mm(
    a: torch.Tensor,
    w: torch.Tensor,
    segment_ptr: torch.Tensor,
    segments: list[int],
    out: torch.Tensor,
) -> torch.Tensor:
    """``out[P_s] = a[P_s] @ w[s]`` for the listed segments (see the module docstring).

    Args:
        a: ``[E, K]`` float32/float64 rows sorted by segment, contiguous, on the CPU.
        w: ``[S, K, M]`` same dtype, contiguous or a transposed view of a contiguous
            ``[S, M, K]`` (:func:`weight_layout`; then :func:`rows_times_wt` reads it as is).
        segment_ptr: ``[S + 1]`` where each segment's rows start.
        segments: the segments to compute (each with at most ``SKINNY_ROWS`` rows).
        out: ``[E, M]`` contiguous; only the listed segments' rows are written.

    Returns:
        ``out``.

    Raises:
        ValueError: ``w`` is neither contiguous nor a transposed contiguous view, the shapes
            do not match, or a listed segment is not one of ``w``'s with at most
            ``SKINNY_ROWS`` rows.
    """
    if not segments:
        return out
    check_rows_operand("a", a)
    if w.dim() != 3 or w.dtype != a.dtype or w.shape[1] != a.shape[1]:
        got = f"{tuple(w.shape)} {w.dtype}"
        raise ValueError(expected("segment_skinny_mm", "w", f"[S, {a.shape[1]}, M] {a.dtype}", got))
    check_segment_ptr(segment_ptr, a.shape[0])
    check_out(out, (a.shape[0], w.shape[2]), a.dtype)
    n_segments = min(segment_ptr.shape[0] - 1, w.shape[0])
    bounds = segment_ptr.tolist()
    for s in segments:
        if not (0 <= s < n_segments and bounds[s + 1] - bounds[s] <= SKINNY_ROWS):
            want = f"segments in [0, {n_segments}) of at most {SKINNY_ROWS} rows"
            raise ValueError(expected("segment_skinny_mm", "segments", want, s))
    layout = weight_layout(w)
    if layout is None:
        raise ValueError(
            expected(
                "segment_skinny_mm",
                "w",
                "contiguous [S, K, M] or a transpose(1, 2) view of a contiguous [S, M, K]",
                f"strides {w.stride()}",
            )
        )
    if segments:
        threads = numba.get_num_threads()
        transposed = layout == "transposed"
        _segment_skinny_kernel(
            numpy_of(a),
            numpy_of(w.transpose(1, 2) if transposed else w),
            numpy_of(segment_ptr),
            np.asarray(segments, dtype=np.int64),
            balanced_chunks(len(segments), threads),
            threads,
            numpy_of(out),
            transposed,
        )
    return out
