"""The numba pieces every kernel-map pass shares: sizes, hashing, bit counts, a search.

A map's outputs are processed in chunks of :data:`CHUNK`; each output's offsets are the bits of
one int64 (bit ``k``: offset ``k = 9 kz + 3 ky + kx``), walked lowest first.
"""

from __future__ import annotations

import numba
import numpy as np

#: Offsets of a 3x3x3 kernel.
KERNEL_VOLUME = 27
#: An empty slot of an open-addressing table.
EMPTY = -1
#: Output voxels per compaction chunk.
CHUNK = 1024


@numba.njit(cache=True, inline="always")
def hash_slot(key, bits):  # type: ignore[no-untyped-def]
    """Fibonacci hashing: the top ``bits`` bits of ``key * 2^64 / phi`` (1 <= bits < 64)."""
    return np.int64((np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - bits))


@numba.njit(cache=True, inline="always")
def lower_bound(values, lo, hi, v):  # type: ignore[no-untyped-def]
    """First ``j`` in ``[lo, hi)`` with ``values[j] >= v`` (``hi`` if none); values ascending."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if values[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


@numba.njit(cache=True, inline="always")
def popcount(v):  # type: ignore[no-untyped-def]
    """Set bits of ``0 <= v < 2^62`` (SWAR: pairs, nibbles, bytes, then one multiply)."""
    v = v - ((v >> 1) & 0x5555555555555555)
    v = (v & 0x3333333333333333) + ((v >> 2) & 0x3333333333333333)
    v = (v + (v >> 4)) & 0x0F0F0F0F0F0F0F0F
    return ((v * 0x0101010101010101) >> 56) & 0xFF


#: De Bruijn table: the index of the lowest set bit ``b`` of a 32-bit word is
#: ``DEBRUIJN[((b * 0x077CB531) mod 2^32) >> 27]``.
DEBRUIJN = np.array(
    [
        *(0, 1, 28, 2, 29, 14, 24, 3, 30, 22, 20, 15, 25, 17, 4, 8),
        *(31, 27, 13, 23, 21, 19, 16, 7, 26, 12, 18, 6, 11, 5, 10, 9),
    ],
    np.int64,
)


@numba.njit(cache=True, inline="always")
def lowest_bit(bits, debruijn):  # type: ignore[no-untyped-def]
    """Index of the lowest set bit of ``0 < bits < 2^32``."""
    return debruijn[(((bits & -bits) * 0x077CB531) & 0xFFFFFFFF) >> 27]


@numba.njit(cache=True)
def add_distinct(table, bits, found, count, key):  # type: ignore[no-untyped-def]
    """Add ``key`` to a set of distinct int64 keys; the set's new ``(table, bits, found, count)``.

    ``table`` (``2^bits`` slots, open addressing, linear probing) answers membership and is
    doubled whenever it is half full; ``found[:count]`` lists the keys in insertion order,
    doubled when full. A key already present changes nothing.
    """
    mask = (1 << bits) - 1
    h = hash_slot(key, bits)
    while table[h] != EMPTY:
        if table[h] == key:
            return table, bits, found, count
        h = (h + 1) & mask
    table[h] = key
    if count == found.shape[0]:
        found = np.concatenate((found, np.empty(found.shape[0], np.int64)))
    found[count] = key
    count += 1
    if 2 * count > table.shape[0]:  # half full: double and re-insert
        bits += 1
        mask = (1 << bits) - 1
        table = np.full(1 << bits, EMPTY, np.int64)
        for j in range(count):
            h = hash_slot(found[j], bits)
            while table[h] != EMPTY:
                h = (h + 1) & mask
            table[h] = found[j]
    return table, bits, found, count
