"""A weight-streaming GEMM for segments of a few rows (numba): ``out = a @ w``, ``a`` is ``[R, K]``.

With ``R <= SKINNY_ROWS`` rows (MoE experts at decode-sized batches), the time is reading ``w``
once from DRAM: ``K M`` elements for ``2 R K M`` FLOPs. ATen's ``mm`` treats such a product as a
small GEMM and streams ``w`` at a fraction of the bandwidth (measured here, ``K = 1024,
M = 7168``, 2 threads: 6.5 GB/s at ``R = 2``, 3.0 GB/s at ``R = 8``, against 16 and 10 GB/s for
this kernel; at ``R = 16`` the two meet). The kernel splits ``K`` into one contiguous range per
thread, so that each thread streams whole rows of ``w``::

    part[t, r, :] = sum_{k in K_t} a[r, k] * w[k, :]          out = sum_t part[t]

The ``k`` loop is unrolled by 4 and the rows taken two at a time, so that each loaded vector of
``w`` feeds eight fused multiply-adds from registers; the ``R x M`` partial sums stay in L1/L2.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numba
import numpy as np
from numba import prange

from fusekit.gms.kernels.cpu.rows import numpy_of
from fusekit.gms.kernels.cpu.tile import FASTMATH

if TYPE_CHECKING:
    import torch

#: Most rows a segment may have for :func:`skinny_mm` (ATen's ``mm`` is as fast from here on).
SKINNY_ROWS = 16


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def _skinny_kernel(a, w, part):  # type: ignore[no-untyped-def]
    rows, depth = a.shape
    cols = w.shape[1]
    threads = part.shape[0]
    for t in prange(threads):
        k0 = t * depth // threads
        k1 = (t + 1) * depth // threads
        acc = part[t]
        for r in range(rows):
            for m in range(cols):
                acc[r, m] = 0.0
        k = k0
        while k + 4 <= k1:
            r = 0
            while r + 2 <= rows:
                a0, a1, a2, a3 = a[r, k], a[r, k + 1], a[r, k + 2], a[r, k + 3]
                b0, b1, b2, b3 = a[r + 1, k], a[r + 1, k + 1], a[r + 1, k + 2], a[r + 1, k + 3]
                for m in range(cols):
                    w0, w1, w2, w3 = w[k, m], w[k + 1, m], w[k + 2, m], w[k + 3, m]
                    acc[r, m] += a0 * w0 + a1 * w1 + a2 * w2 + a3 * w3
                    acc[r + 1, m] += b0 * w0 + b1 * w1 + b2 * w2 + b3 * w3
                r += 2
            if r < rows:
                a0, a1, a2, a3 = a[r, k], a[r, k + 1], a[r, k + 2], a[r, k + 3]
                for m in range(cols):
                    acc[r, m] += (
                        a0 * w[k, m] + a1 * w[k + 1, m] + a2 * w[k + 2, m] + a3 * w[k + 3, m]
                    )
            k += 4
        while k < k1:
            for r in range(rows):
                a0 = a[r, k]
                for m in range(cols):
                    acc[r, m] += a0 * w[k, m]
            k += 1


def skinny_mm(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out = a @ w`` for a few rows (see the module docstring); reference: ``torch.mm``.

    Args:
        a: ``[R, K]`` float32/float64 on the CPU (any strides; made contiguous).
        w: ``[K, M]`` contiguous, same dtype.
        out: ``[R, M]`` to write into (may be a row range of a larger contiguous buffer).

    Returns:
        ``out``.
    """
    import torch

    threads = max(1, min(numba.get_num_threads(), a.shape[1] // 64 or 1))
    part = np.empty((threads, a.shape[0], w.shape[1]), dtype=numpy_of(w).dtype)
    _skinny_kernel(numpy_of(a.contiguous()), numpy_of(w), part)
    return torch.sum(torch.from_numpy(part), 0, out=out)
