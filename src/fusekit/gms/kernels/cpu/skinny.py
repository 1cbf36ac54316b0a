"""A weight-streaming GEMM for segments of a few rows (numba): ``out[P_s] = a[P_s] @ w[s]``.

With at most ``SKINNY_ROWS`` rows per segment (MoE experts at decode-sized batches), the time is
reading ``w[s]`` once from DRAM: ``K M`` elements for ``2 R K M`` FLOPs. ATen's ``mm`` treats such
a product as a small GEMM and streams ``w`` at a fraction of the bandwidth (measured here, 8
experts ``K = 1024, M = 7168``, 2 threads: 16.6 / 5.5 / 3.2 GB/s with 2 / 16 / 64 rows in all,
against 22.4 / 15.1 / 7.9 GB/s for this kernel). One call covers every small segment: work items
are (segment, column range) pairs, each item computing::

    out[lo + r, c0:c1] = sum_k a[lo + r, k] * w[s, k, c0:c1]

with its ``R x (c1 - c0)`` accumulators in a thread-local buffer (L1/L2). The ``k`` loop is
unrolled by 4 and rows are taken two at a time, so each loaded vector of ``w`` feeds eight fused
multiply-adds. A segment is split into ``threads / gcd(segments, threads)`` column ranges, the
fewest that give every thread the same number of items: whole matrices stream best (contiguous),
and short column runs of narrow matrices defeat the prefetcher (6 experts of ``1024 x 1024`` at
one row each: 9.9 GB/s split in two column halves). Reference: ``torch.mm`` per segment.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numba
import numpy as np
from numba import prange

from fusekit.gms.kernels.cpu.rows import numpy_of
from fusekit.gms.kernels.cpu.tile import FASTMATH

if TYPE_CHECKING:
    import torch

#: Most rows a segment may have for :func:`segment_skinny_mm` (ATen's ``mm`` is as fast beyond).
SKINNY_ROWS = 16


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def _segment_skinny_kernel(a, w, bounds, segments, chunks, out):  # type: ignore[no-untyped-def]
    depth = a.shape[1]
    cols = w.shape[2]
    for item in prange(segments.shape[0] * chunks):
        s = segments[item // chunks]
        c = item % chunks
        c0 = c * cols // chunks
        c1 = (c + 1) * cols // chunks
        lo = bounds[s]
        rows = bounds[s + 1] - lo
        width = c1 - c0
        acc = np.zeros((rows, width), dtype=out.dtype)
        ws = w[s]
        k = 0
        while k + 4 <= depth:
            w0r, w1r = ws[k, c0:c1], ws[k + 1, c0:c1]
            w2r, w3r = ws[k + 2, c0:c1], ws[k + 3, c0:c1]
            r = 0
            while r + 2 <= rows:
                a0, a1, a2, a3 = a[lo + r, k], a[lo + r, k + 1], a[lo + r, k + 2], a[lo + r, k + 3]
                b0, b1 = a[lo + r + 1, k], a[lo + r + 1, k + 1]
                b2, b3 = a[lo + r + 1, k + 2], a[lo + r + 1, k + 3]
                ar = acc[r]
                br = acc[r + 1]
                for m in range(width):
                    w0, w1, w2, w3 = w0r[m], w1r[m], w2r[m], w3r[m]
                    ar[m] += a0 * w0 + a1 * w1 + a2 * w2 + a3 * w3
                    br[m] += b0 * w0 + b1 * w1 + b2 * w2 + b3 * w3
                r += 2
            if r < rows:
                a0, a1, a2, a3 = a[lo + r, k], a[lo + r, k + 1], a[lo + r, k + 2], a[lo + r, k + 3]
                ar = acc[r]
                for m in range(width):
                    ar[m] += a0 * w0r[m] + a1 * w1r[m] + a2 * w2r[m] + a3 * w3r[m]
            k += 4
        while k < depth:
            wr = ws[k, c0:c1]
            for r in range(rows):
                a0 = a[lo + r, k]
                ar = acc[r]
                for m in range(width):
                    ar[m] += a0 * wr[m]
            k += 1
        for r in range(rows):
            for m in range(width):
                out[lo + r, c0 + m] = acc[r, m]


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
        w: ``[S, K, M]`` contiguous, same dtype.
        segment_ptr: ``[S + 1]`` where each segment's rows start.
        segments: the segments to compute (each with at most ``SKINNY_ROWS`` rows).
        out: ``[E, M]`` contiguous; only the listed segments' rows are written.

    Returns:
        ``out``.
    """
    if segments:
        threads = max(1, numba.get_num_threads())
        _segment_skinny_kernel(
            numpy_of(a),
            numpy_of(w),
            numpy_of(segment_ptr),
            np.asarray(segments, dtype=np.int64),
            threads // math.gcd(len(segments), threads),
            numpy_of(out),
        )
    return out
