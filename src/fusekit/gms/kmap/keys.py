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

from fusekit.gms.kmap.primitives import EMPTY, add_distinct, hash_slot


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
def strided_outputs(coords, shape, out_shape, stride, padding):  # type: ignore[no-untyped-def]
    """Sorted distinct linear keys (in ``out_shape``) of the outputs the inputs reach.

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
