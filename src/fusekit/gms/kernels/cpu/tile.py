"""The register tile every CPU dataflow is built from, its prologues and epilogues (numba).

One call of :func:`tile_product` computes an ``MR x NR`` block of a segment GEMM::

    acc[r, j] = sum_k A[rows[r], k] * W[s, k, m0 + j]        r < MR, j < nc <= NR

with the ``MR * NR`` accumulators on the stack (an LLVM ``alloca``), so that LLVM keeps them in
vector registers across the ``k`` loop: per ``k``, ``MR`` broadcasts of ``A``, two 8-wide loads
of ``W`` and ``2 MR`` fused multiply-adds. ``rows`` holds the ``A`` row of each tile row: the
gather indices themselves when the gather is fused into the GEMM prologue, or consecutive
positions of an already gathered buffer, or rows aggregated into a scratch. A partial tile
repeats its first row (a valid index) and its epilogue stores only the valid rows.

``MR = 4, NR = 16`` suits AVX2 fp32: 8 accumulators, 2 weight vectors and the broadcasts fit the
16 ymm registers (it ran fastest of 4x16, 8x8, 6x16 and 12x8 at K = M = 64).

The pieces are inlined (``inline="always"``) into the one loop that runs them,
:func:`~fusekit.gms.kernels.cpu.skeleton.dataflow_kernel`.

Nothing compiles at import: numba compiles on first call and caches the machine code
(``cache=True``). numba does not track edits to this file from the kernels that inline it; clear
``__pycache__`` after changing it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

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


def _stack_buffer(
    typingctx: object, like: types.Type, size: types.Type
) -> tuple[Any, Callable[..., Any]] | None:
    """Typing and code generation of :data:`stack_buffer` (numba calls it while compiling)."""
    if not isinstance(size, types.IntegerLiteral) or not isinstance(like, types.Array):
        return None
    dtype = like.dtype
    count = size.literal_value

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return cgutils.alloca_once(builder, context.get_value_type(dtype), size=count)  # type: ignore[no-untyped-call]

    return types.CPointer(dtype)(like, size), codegen  # type: ignore[no-untyped-call]


#: ``stack_buffer(like, size)`` in a kernel: a pointer to ``size`` elements of ``like.dtype`` on
#: the stack (``size`` a literal int); ``numba.carray(stack_buffer(a, 64), (8, 8))`` views it as
#: an array. The ``alloca`` sits in the function's entry block, so a loop may call this without
#: growing the stack. numba's stub gives the intrinsic the typing function's parameters, so the
#: checker is told the signature a kernel calls.
stack_buffer = cast("Callable[[Any, int], Any]", intrinsic(_stack_buffer))


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


@numba.njit(cache=True, fastmath=FASTMATH, inline="always")
def add_tile(out, scatter, e, n, m0, nc, acc):  # type: ignore[no-untyped-def]
    """Epilogue: ``out[scatter[e + r], m0 + j] += acc[r, j]`` for ``r < n`` (rows checked)."""
    for r in range(n):
        row = out[scatter[e + r], m0 : m0 + nc]
        products = acc[r, :nc]
        for j in range(nc):
            row[j] += products[j]


@numba.njit(cache=True, inline="always")
def store_tile(out, e, n, m0, nc, acc):  # type: ignore[no-untyped-def]
    """Epilogue: ``out[e + r, m0 + j] = acc[r, j]`` for ``r < n``: the products in plan order."""
    for r in range(n):
        row = out[e + r, m0 : m0 + nc]
        for j in range(nc):
            row[j] = acc[r, j]


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
def consecutive_rows(e, n, rows):  # type: ignore[no-untyped-def]
    """``rows[r] = e + r`` for ``r < n``, ``e`` after: rows of a buffer gathered in plan order."""
    for r in range(MR):
        rows[r] = e + r if r < n else e


@numba.njit(cache=True, fastmath=FASTMATH, inline="always")
def aggregate_rows(x, gather, scale, has_scale, group_ptr, groups, e, n, rows, aggregated):  # type: ignore[no-untyped-def]
    """``aggregated[r, k] = sum_{p in group groups[e + r]} c[p] * x[gather[p], k]`` for ``r < n``.

    ``c[p]`` is ``scale[p]``, or ``scale[0]`` (one) without a scale; ``rows`` become ``0 .. n - 1``
    (row 0 repeated after). Returns False if a group's positions or their rows are out of range.
    """
    n_in = x.shape[0]
    K = x.shape[1]
    n_pairs = gather.shape[0]
    if has_scale:
        n_pairs = min(n_pairs, scale.shape[0])
    ok = True
    for r in range(MR):
        rows[r] = r if r < n else 0
        if r >= n:
            continue
        for k in range(K):
            aggregated[r, k] = 0
        u = groups[e + r]
        lo = group_ptr[u]
        hi = group_ptr[u + 1]
        if lo < 0 or hi > n_pairs:
            ok = False
            continue
        for p in range(lo, hi):
            g = gather[p]
            if g < 0 or g >= n_in:
                ok = False
                break
            c = scale[p] if has_scale else scale[0]
            for k in range(K):
                col = np.uint64(k)  # unsigned: no negative-index fix-up
                aggregated[r, col] += c * x[g, col]
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
