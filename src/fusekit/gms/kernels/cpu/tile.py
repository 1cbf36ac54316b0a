"""The register tile every CPU dataflow is built from, and its epilogues (numba).

One call of :func:`tile_product` computes an ``MR x NR`` block of a segment GEMM::

    acc[r, j] = sum_k A[rows[r], k] * W[s, k, m0 + j]        r < MR, j < nc <= NR

with the ``MR * NR`` accumulators on the stack (an LLVM ``alloca``), so that LLVM keeps them in
vector registers across the ``k`` loop: per ``k``, ``MR`` broadcasts of ``A``, two 8-wide loads
of ``W`` and ``2 MR`` fused multiply-adds. ``rows`` holds the ``A`` row of each tile row: the
gather indices themselves when the gather is fused into the GEMM prologue, or consecutive
positions of an already gathered buffer. A partial tile repeats its first row (a valid index) and
its epilogue stores only the valid rows.

``MR = 4, NR = 16`` was measured best (single thread, K = M = 64: 71 GFLOP/s against 44-57 for
8x8, 30 for 6x16, 48 for 12x8; K = M = 16 equal to 8x8) for AVX2 fp32: 8 accumulators, 2 weight
vectors and the broadcasts fit the 16 ymm registers.

Nothing compiles at import: numba compiles on first call and caches the machine code
(``cache=True``). numba does not track edits to this file from the kernels that inline it; clear
``__pycache__`` after changing it.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

#: Rows of the register tile (pairs computed together).
MR = 4
#: Columns of the register tile (two AVX2 fp32 vectors).
NR = 16
#: Accumulators of the register tile (a literal for :func:`stack_buffer`).
MR_NR = MR * NR
#: numba math flags: fused multiply-add only (no reassociation, NaN and inf are kept).
FASTMATH = {"contract"}


@intrinsic
def stack_buffer(typingctx, like, size):  # type: ignore[no-untyped-def]
    """A pointer to ``size`` elements of ``like.dtype`` on the stack (``size`` a literal int).

    Use ``numba.carray(stack_buffer(a, 64), (8, 8))`` for an array view. The ``alloca`` sits in
    the function's entry block, so a loop may call this without growing the stack.
    """
    if not isinstance(size, types.IntegerLiteral) or not isinstance(like, types.Array):
        return None
    dtype = like.dtype
    count = size.literal_value

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return cgutils.alloca_once(builder, context.get_value_type(dtype), size=count)

    return types.CPointer(dtype)(like, size), codegen


@numba.njit(cache=True, fastmath=FASTMATH, inline="always")
def tile_product(a, rows, w, s, m0, nc, acc):  # type: ignore[no-untyped-def]
    """``acc[r, j] = sum_k a[rows[r], k] * w[s, k, m0 + j]`` for ``r < MR``, ``j < nc``."""
    K = a.shape[1]
    r0, r1, r2, r3 = rows[0], rows[1], rows[2], rows[3]
    # An unsigned column index: numba adds no negative-index fix-up, so LLVM sees NR consecutive
    # floats and loads them as one vector (with the fix-up it builds the vector element by element).
    col = np.uint64(m0)
    for r in range(MR):
        for j in range(NR):
            acc[r, j] = 0
    if nc == NR:
        for k in range(K):
            a0, a1, a2, a3 = a[r0, k], a[r1, k], a[r2, k], a[r3, k]
            for j in range(NR):
                wv = w[s, k, col + np.uint64(j)]
                acc[0, j] += a0 * wv
                acc[1, j] += a1 * wv
                acc[2, j] += a2 * wv
                acc[3, j] += a3 * wv
    else:
        for k in range(K):
            a0, a1, a2, a3 = a[r0, k], a[r1, k], a[r2, k], a[r3, k]
            for j in range(nc):
                wv = w[s, k, col + np.uint64(j)]
                acc[0, j] += a0 * wv
                acc[1, j] += a1 * wv
                acc[2, j] += a2 * wv
                acc[3, j] += a3 * wv


@numba.njit(cache=True, fastmath=FASTMATH, inline="always")
def scatter_tile(out, scatter, scale, has_scale, e, n, m0, nc, acc, reduce_max):  # type: ignore[no-untyped-def]
    """Epilogue: ``out[scatter[e + r], m0 + j] (+= | max=) c * acc[r, j]`` for ``r < n``.

    The caller has checked the ``n`` scatter rows.
    """
    for r in range(n):
        row = out[scatter[e + r], m0 : m0 + nc]  # a view: no per-element index fix-up
        products = acc[r, :nc]
        c = scale[e + r] if has_scale else scale[0]
        if reduce_max:
            for j in range(nc):
                row[j] = nan_max(row[j], c * products[j])
        else:
            for j in range(nc):
                row[j] += c * products[j]


@numba.njit(cache=True, inline="always")
def nan_max(a, b):  # type: ignore[no-untyped-def]
    """``max(a, b)``, NaN if either is NaN (``torch.amax``'s rule; ``a if a > b`` drops NaN)."""
    return b if b > a or b != b else a


@numba.njit(cache=True, inline="always")
def load_rows(index, e, n, n_rows, rows):  # type: ignore[no-untyped-def]
    """``rows[r] = index[e + r]`` for ``r < n``, the first row repeated after.

    Returns False if any of them is outside ``[0, n_rows)``.
    """
    ok = True
    for r in range(MR):
        q = index[e + r] if r < n else index[e]
        if q < 0 or q >= n_rows:
            ok = False
        rows[r] = q
    return ok


@numba.njit(cache=True, inline="always")
def rows_in_range(index, e, n, n_rows):  # type: ignore[no-untyped-def]
    """True if ``index[e : e + n]`` all lie in ``[0, n_rows)``."""
    for r in range(n):
        q = index[e + r]
        if q < 0 or q >= n_rows:
            return False
    return True


@numba.njit(cache=True, inline="always")
def block_ok(block_ptr, b, n_tiles):  # type: ignore[no-untyped-def]
    """True if the tiles ``[block_ptr[b], block_ptr[b + 1])`` of block ``b`` lie in ``[0, T]``."""
    return 0 <= block_ptr[b] and block_ptr[b + 1] <= n_tiles


@numba.njit(cache=True, inline="always")
def tile_ok(t, tile_segment, tile_start, tile_end, n_segments, n_pairs):  # type: ignore[no-untyped-def]
    """True if tile ``t`` names a valid segment and a position range inside ``[0, n_pairs]``."""
    s = tile_segment[t]
    lo = tile_start[t]
    hi = tile_end[t]
    return 0 <= s < n_segments and 0 <= lo <= hi <= n_pairs
