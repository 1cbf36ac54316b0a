r"""Voxel keys and the runs of one row: what pass 1 walks, and the hash table of rows.

A voxel ``(b, z, y, x)`` has the key ``((b Z + z) Y + y) X + x`` and the row
``(b Z + z) Y + y``; sorted keys fall into runs of one row, x ascending. Pass 1
(:mod:`fusekit.gms.kmap.hits`) looks up the 9 (or 4) neighbour rows of every output row in an
open-addressing table of the input rows (linear probing, Fibonacci hashing), then merges runs
along x.
"""

from __future__ import annotations

import numba
import numpy as np

from fusekit.gms.kmap.primitives import DEBRUIJN, EMPTY, add_distinct, hash_slot, lowest_bit


@numba.njit(cache=True)
def linear_keys(coords, z, y, x):  # type: ignore[no-untyped-def]
    """Keys ``((b Z + z) Y + y) X + x``, rows ``(b Z + z) Y + y``, and whether keys ascend.

    Strictly: equal keys (duplicate voxels) are not ascending.
    """
    n = coords.shape[0]
    keys = np.empty(n, np.int64)
    rows = np.empty(n, np.int64)
    ascending = True
    for i in range(n):
        c = coords[i]
        rows[i] = (np.int64(c[0]) * z + c[1]) * y + c[2]
        keys[i] = rows[i] * x + c[3]
        if i > 0 and keys[i] <= keys[i - 1]:
            ascending = False
    return keys, rows, ascending


@numba.njit(cache=True)
def key_runs(keys, row_length):  # type: ignore[no-untyped-def]
    """Sorted keys as runs of one row: row ids, run pointer, x and each key's run.

    Shapes ``[R]``, ``[R + 1]``, ``[N]``, ``[N]``; one pass counts the rows, one fills.
    """
    n = keys.shape[0]
    rows = 0
    for j in range(n):
        if j == 0 or keys[j] // row_length != keys[j - 1] // row_length:
            rows += 1
    row_ids = np.empty(rows, np.int64)
    ptr = np.empty(rows + 1, np.int64)
    x = np.empty(n, np.int64)
    run = np.empty(n, np.int64)
    r = -1
    for j in range(n):
        row = keys[j] // row_length
        if r < 0 or row != row_ids[r]:
            r += 1
            row_ids[r] = row
            ptr[r] = j
        x[j] = keys[j] - row * row_length
        run[j] = r
    ptr[rows] = n
    return row_ids, ptr, x, run


@numba.njit(cache=True)
def row_runs(rows, xs):  # type: ignore[no-untyped-def]
    """:func:`key_runs` of the keys ``rows * X + xs``, given their rows: no division.

    ``rows`` ascending (``(b Z + z) Y + y`` of sorted keys), ``xs`` their x. :func:`key_runs`
    divides every key by ``X`` twice (a 64-bit division is tens of cycles); here one pass
    compares rows, and the row ids and run pointer are cut from
    arrays of ``N`` and ``N + 1``. Reference: :func:`key_runs`.
    """
    n = rows.shape[0]
    row_ids = np.empty(n, np.int64)
    ptr = np.empty(n + 1, np.int64)
    x = np.empty(n, np.int64)
    run = np.empty(n, np.int64)
    r = -1
    for j in range(n):
        if r < 0 or rows[j] != row_ids[r]:
            r += 1
            row_ids[r] = rows[j]
            ptr[r] = j
        x[j] = xs[j]
        run[j] = r
    ptr[r + 1] = n
    return row_ids[: r + 1], ptr[: r + 2], x, run


@numba.njit(cache=True)
def row_table(rows, bits):  # type: ignore[no-untyped-def]
    """Open-addressing table ``[2^bits, 2]`` of distinct row ids -> their run index."""
    table = np.full((1 << bits, 2), EMPTY, np.int64)
    mask = (1 << bits) - 1
    for r in range(rows.shape[0]):
        h = hash_slot(rows[r], bits)
        while table[h, 0] != EMPTY:
            h = (h + 1) & mask
        table[h, 0] = rows[r]
        table[h, 1] = r
    return table


@numba.njit(cache=True)  # serial: less than a parallel launch costs on a busy host
def neighbour_runs(  # type: ignore[no-untyped-def]
    # output rows (b, z, y) as ids in the output shape [R_out]; input row table (id -> run)
    out_rows,
    table,
    bits,
    # sizes: input shape, output shape, stride, padding
    shape,
    out_shape,
    stride,
    padding,
    # the first (k_z, k_y) entries wanted: 9, or 4 for the SubM pass on sorted voxels
    lookups,
):
    """``[R_out, lookups]``: the input run of row ``(b, s z - p + k_z, s y - p + k_y)``, or -1.

    Entry ``3 k_z + k_y``; one table lookup per output row and ``(k_z, k_y)``, the only random
    accesses of the build (the table of distinct rows fits the cache). The SubM pass on sorted
    voxels (:func:`fusekit.gms.kmap.hits._find_lower`) reads the 4 rows before a voxel's only,
    so it asks for those.
    """
    nbr = np.full((out_rows.shape[0], lookups), -1, np.int64)
    mask = (1 << bits) - 1
    for r in range(out_rows.shape[0]):
        row = out_rows[r]
        y = row % out_shape[1]
        z = (row // out_shape[1]) % out_shape[0]
        b = row // (out_shape[1] * out_shape[0])
        for kzy in range(lookups):
            zi = z * stride[0] - padding[0] + kzy // 3
            yi = y * stride[1] - padding[1] + kzy % 3
            if zi < 0 or zi >= shape[0] or yi < 0 or yi >= shape[1]:
                continue
            key = (b * shape[0] + zi) * shape[1] + yi
            h = hash_slot(key, bits)
            while table[h, 0] != EMPTY:
                if table[h, 0] == key:
                    nbr[r, kzy] = table[h, 1]
                    break
                h = (h + 1) & mask
    return nbr


@numba.njit(cache=True, inline="always")
def _axis_outputs(c, padding, stride, out_size, out):  # type: ignore[no-untyped-def]
    """The output coordinates ``o`` along one axis whose 3-tap window holds input ``c``.

    ``o = (c + p - k) / s`` for the taps ``k`` in ``0..2`` that divide evenly and land in
    ``[0, out_size)``; written to ``out``, their count returned (at most ``ceil(3 / s)``).
    """
    count = 0
    for k in range(3):
        q = c + padding - k
        if q >= 0 and q % stride == 0 and q // stride < out_size:
            out[count] = q // stride
            count += 1
    return count


@numba.njit(cache=True)
def strided_outputs_hashed(coords, shape, out_shape, stride, padding):  # type: ignore[no-untyped-def]
    """Sorted distinct linear keys (in ``out_shape``) of the outputs the inputs reach, hashed.

    The reference of :func:`strided_outputs`, and its path on grids too wide for a slab bitmap.

    A 3x3x3 window reaches the outputs whose coordinate on every axis comes from
    :func:`_axis_outputs`: their product, at most ``ceil(3 / s)^3`` per input instead of 27 taps
    tested. Distinct keys are kept by :func:`~fusekit.gms.kmap.primitives.add_distinct`, in a
    table of at least four slots per input.
    """
    n = coords.shape[0]
    bits = 4
    while (1 << bits) < 4 * n:
        bits += 1
    table = np.full(1 << bits, EMPTY, np.int64)
    found = np.empty(max(n, 16), np.int64)
    count = 0
    zs = np.empty(3, np.int64)
    ys = np.empty(3, np.int64)
    xs = np.empty(3, np.int64)
    for i in range(n):
        nz = _axis_outputs(coords[i, 1], padding[0], stride[0], out_shape[0], zs)
        ny = _axis_outputs(coords[i, 2], padding[1], stride[1], out_shape[1], ys)
        nx = _axis_outputs(coords[i, 3], padding[2], stride[2], out_shape[2], xs)
        for a in range(nz):
            plane = (coords[i, 0] * out_shape[0] + zs[a]) * out_shape[1]
            for b in range(ny):
                row = (plane + ys[b]) * out_shape[2]
                for c in range(nx):
                    table, bits, found, count = add_distinct(table, bits, found, count, row + xs[c])
    return np.sort(found[:count])


@numba.njit(cache=True)
def _axis_table(size, padding, stride, out_size):  # type: ignore[no-untyped-def]
    """Per input coordinate ``c < size``: the first output of :func:`_axis_outputs` and their count.

    The outputs a coordinate reaches are consecutive (the multiples of ``s`` among three
    consecutive integers, clipped to ``[0, out_size)``), so a range stands for them; the table
    replaces two divisions per tap with one lookup per voxel and axis.
    """
    first = np.zeros(size, np.int64)
    count = np.zeros(size, np.int64)
    outs = np.empty(3, np.int64)
    for c in range(size):
        k = _axis_outputs(c, padding, stride, out_size, outs)
        count[c] = k
        if k:
            first[c] = outs[k - 1]  # taps ascending give outputs descending
    return first, count


#: A slab bitmap is used while ``batches x Z_out`` slabs of ``ceil(Y_out X_out / 32)`` words
#: number at most this many words per input voxel, plus :data:`SLAB_WORDS_FLOOR`; past it (a
#: wide grid with few voxels) the outputs are hashed (:func:`strided_outputs_hashed`).
SLAB_WORDS_PER_INPUT = 64
SLAB_WORDS_FLOOR = 1 << 20


@numba.njit(cache=True)
def strided_outputs(coords, shape, out_shape, stride, padding):  # type: ignore[no-untyped-def]
    """Sorted distinct linear keys (in ``out_shape``) of the outputs the inputs reach.

    Output slab by output slab ``(b, z_o)``: the inputs of the (at most three) input planes
    ``z = s z_o - p + k`` that reach it, found by a counting sort of the inputs by ``(b, z)``,
    set the bits of their outputs ``(y_o, x_o)`` (:func:`_axis_table` on each axis) in a
    bitmap of one slab, ``Y_out X_out`` bits (a KITTI grid's: 70 KB, in cache); the touched
    words are then read in order, cleared, and their set bits emitted: the keys come out sorted
    and distinct with no hashing and no sort. Any input order. Grids too wide for the bitmap
    (:data:`SLAB_WORDS_PER_INPUT`) take :func:`strided_outputs_hashed`, the reference.
    """
    n = coords.shape[0]
    batches = 0
    for i in range(n):
        batches = max(batches, coords[i, 0] + 1)
    plane = out_shape[1] * out_shape[2]
    words = (plane + 31) >> 5
    if batches * out_shape[0] * words > SLAB_WORDS_PER_INPUT * n + SLAB_WORDS_FLOOR:
        return strided_outputs_hashed(coords, shape, out_shape, stride, padding)
    # inputs by (b, z): a counting sort
    planes = batches * shape[0]
    start = np.zeros(planes + 1, np.int64)
    for i in range(n):
        start[coords[i, 0] * shape[0] + coords[i, 1] + 1] += 1
    for q in range(planes):
        start[q + 1] += start[q]
    fill = start[:-1].copy()
    by_plane = np.empty(n, np.int64)
    for i in range(n):
        q = coords[i, 0] * shape[0] + coords[i, 1]
        by_plane[fill[q]] = i
        fill[q] += 1
    y_first, y_count = _axis_table(shape[1], padding[1], stride[1], out_shape[1])
    x_first, x_count = _axis_table(shape[2], padding[2], stride[2], out_shape[2])
    bitmap = np.zeros(words, np.uint32)
    found = np.empty(max(n, 16), np.int64)
    count = 0
    for b in range(batches):
        for zo in range(out_shape[0]):
            lo = words
            hi = -1
            for k in range(3):
                z = zo * stride[0] - padding[0] + k
                if z < 0 or z >= shape[0]:
                    continue
                q = b * shape[0] + z
                for j in range(start[q], start[q + 1]):
                    i = by_plane[j]
                    y, x = coords[i, 2], coords[i, 3]
                    for yo in range(y_first[y], y_first[y] + y_count[y]):
                        row = yo * out_shape[2]
                        for xo in range(x_first[x], x_first[x] + x_count[x]):
                            cell = row + xo
                            w = cell >> 5
                            bitmap[w] |= np.uint32(1) << np.uint32(cell & 31)
                            lo = min(lo, w)
                            hi = max(hi, w)
            base = (b * out_shape[0] + zo) * plane
            for w in range(lo, hi + 1):
                v = np.int64(bitmap[w])
                if v == 0:
                    continue
                bitmap[w] = 0
                while v:
                    if count == found.shape[0]:
                        found = np.concatenate((found, np.empty(found.shape[0], np.int64)))
                    found[count] = base + (w << 5) + lowest_bit(v, DEBRUIJN)
                    count += 1
                    v &= v - 1
    return found[:count]


def unlinear(keys: np.ndarray, shape: tuple[int, int, int]) -> np.ndarray:
    """``[N, 4]`` voxels ``(b, z, y, x)`` of linear keys in ``shape`` (:func:`linear_keys`)."""
    z, y, x = shape
    out = np.empty((len(keys), 4), np.int64)
    out[:, 3] = keys % x
    rest = keys // x
    out[:, 2] = rest % y
    rest //= y
    out[:, 1] = rest % z
    out[:, 0] = rest // z
    return out
