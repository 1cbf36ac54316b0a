r"""Kernel maps of 3-D sparse convolution: which input voxel feeds which output voxel, per offset.

For a kernel of size 3, stride ``s`` and padding ``p`` (per axis), output voxel ``o`` reads input
voxel ``i`` through kernel offset ``k = (kz, ky, kx)`` when

.. math::

    c_i = s \, c_o - p + k \qquad (k \in \{0, 1, 2\}^3,\ \text{index } 9 k_z + 3 k_y + k_x)

in the same batch, which is spconv's convention (``weight[:, kz, ky, kx, :]`` is offset
``9 kz + 3 ky + kx``). Submanifold maps have outputs on the inputs, ``s = 1`` and ``p = 1``.
A strided map's outputs are every ``o`` inside the output shape
``floor((S + 2p - 3) / s) + 1`` that some input reaches, sorted by ``(b, z, y, x)``.

The map is a :class:`fusekit.gms.GMSProblem`: gather ``g = i``, segment ``s = k``, scatter
``d = o``, pairs sorted by (segment, output row), the order the gms plan wants.

Two builders, with equal results (tests compare both with spconv's own indice pairs):

* CPU, :func:`find_hits` then :class:`Hits` (numba), in two passes with the gms selector between
  them. The voxels are sorted by their linearised key ``((b Z + z) Y + y) X + x`` (no sort when
  they already are) and cut into runs of one row ``(b, z, y)``; an open-addressing table
  (linear probing, Fibonacci hashing) maps row keys to runs, looked up 9 times per output row.
  *Pass 1*, in parallel over chunks of 1024 outputs, merges each output row with its
  neighbour rows along x and records every hit, each output's offsets as bits and the hits per
  (chunk, offset). For SubM on sorted voxels it searches only the 13 offsets before the centre
  (4 neighbour rows and the voxel before): offset ``26 - k`` is offset ``k`` reversed and its
  pairs come in the same order, so the mirrors are counted, not searched. The counts are the
  selector's features (:meth:`Hits.features`), so the configuration is chosen before any pair
  is written. *Pass 2* (:meth:`Hits.plan`) writes every pair once, straight into the chosen
  configuration's packed gms plan (:func:`fusekit.gms.problem.empty_plan`, whose host buffer
  is a pooled one no tensor views any more, so the pages are already mapped), with the CSRs by
  output and input row; the :class:`KernelMap` is views of that plan. :func:`build` is pass 1
  and pass 2 into plain arrays.
* :func:`build_reference` (plain torch, any device, also the GPU path of :func:`build`): the
  probes of every output and offset, found in the sorted input keys by
  :func:`fusekit.gms.workloads.probe_pairs` (``torch.searchsorted``). There is no GPU hash
  table: the GPU path is this sort + binary search, run on the device.

:func:`plan_kernel_map` plans a built map (another layer width on a shared map): without orders
through :func:`fusekit.gms.problem.plan_sorted`, with them in O(E) numba passes (the pairs
already come in plan order, and every (offset, input) and (offset, output) pair is distinct, so
the sorts of :func:`fusekit.gms.plan`, its reference in the tests, become counting passes).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

import numba
import numpy as np
import torch

from fusekit.errors import expected
from fusekit.gms.kernels.cpu.rows import scratch
from fusekit.nn.grid import MAX_VOXELS, check_grid, check_output_grid
from fusekit.nn.grid import output_shape as output_shape

if TYPE_CHECKING:
    from fusekit.gms import GMSPlan, GMSProblem
    from fusekit.gms.features import Features

KERNEL_VOLUME = 27
_EMPTY = -1
_CHUNK = 1024  # output voxels per compaction chunk


@dataclass(frozen=True, slots=True, eq=False)
class KernelMap:
    """The pairs of a convolution, sorted by (offset, output row).

    Attributes:
        gather: ``[E]`` int64 input rows.
        segment: ``[E]`` int64 kernel offsets ``9 kz + 3 ky + kx``.
        scatter: ``[E]`` int64 output rows.
        offset_ptr: ``[28]`` int64 where each offset's pairs start.
        n_in: input voxels.
        out_coords: ``[N_out, 4]`` int32 output voxels ``(b, z, y, x)`` (the inputs for SubM).
        out_shape: output spatial shape ``(Z, Y, X)``.
        csr: ``(dst_ptr, dst_pos, src_ptr, src_pos)`` numpy arrays, the plan's CSRs by output
            and by input row, where the builder had them for free (``None`` entries else).
    """

    gather: torch.Tensor
    segment: torch.Tensor
    scatter: torch.Tensor
    offset_ptr: torch.Tensor
    n_in: int
    out_coords: torch.Tensor
    out_shape: tuple[int, int, int]
    csr: tuple[Any, Any, Any, Any] = (None, None, None, None)

    @property
    def num_pairs(self) -> int:
        """``E``."""
        return int(self.gather.shape[0])

    @property
    def n_out(self) -> int:
        """Output voxels."""
        return int(self.out_coords.shape[0])

    def problem(self) -> GMSProblem:
        """The validated g-mm-s problem of the map (27 segments, sum)."""
        from fusekit.gms import GMSProblem

        return GMSProblem.create(
            self.gather,
            self.segment,
            self.scatter,
            self.n_out,
            n_in=self.n_in,
            num_segments=KERNEL_VOLUME,
        )


# ---------------------------------------------------------------------------------------------
# CPU: numba hash table
# ---------------------------------------------------------------------------------------------


@numba.njit(cache=True, inline="always")
def _hash_slot(key, bits):  # type: ignore[no-untyped-def]
    """Fibonacci hashing: the top ``bits`` bits of ``key * 2^64 / phi`` (1 <= bits < 64)."""
    return np.int64((np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - bits))


@numba.njit(cache=True)
def _row_table(rows, bits):  # type: ignore[no-untyped-def]
    """Open-addressing table ``[2^bits, 2]`` of distinct row ids -> their run index."""
    table = np.full((1 << bits, 2), _EMPTY, np.int64)
    mask = (1 << bits) - 1
    for r in range(rows.shape[0]):
        h = _hash_slot(rows[r], bits)
        while table[h, 0] != _EMPTY:
            h = (h + 1) & mask
        table[h, 0] = rows[r]
        table[h, 1] = r
    return table


@numba.njit(cache=True)  # serial: less than a parallel launch costs on a busy host
def _neighbour_runs(  # type: ignore[no-untyped-def]
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
    accesses of the build (the table of distinct rows fits the cache). :func:`_find_lower`
    reads the 4 rows before a voxel's only, so it asks for those.
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
            h = _hash_slot(key, bits)
            while table[h, 0] != _EMPTY:
                if table[h, 0] == key:
                    nbr[r, kzy] = table[h, 1]
                    break
                h = (h + 1) & mask
    return nbr


@numba.njit(cache=True, inline="always")
def _lower_bound(values, lo, hi, v):  # type: ignore[no-untyped-def]
    """First ``j`` in ``[lo, hi)`` with ``values[j] >= v`` (``hi`` if none); values ascending."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if values[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


@numba.njit(parallel=True, cache=True)
def _find_hits(  # type: ignore[no-untyped-def]
    # per output voxel, in output order: its row's run [N_out], its x [N_out]
    run_of,
    x_of,
    # the output runs' neighbour input runs [R_out, 9]; input runs: ptr [R + 1], x [N],
    # original row of each sorted input [N]
    nbr,
    in_ptr,
    in_x,
    in_index,
    # x stride and padding
    stride_x,
    pad_x,
    # out: hits [chunks * _CHUNK * 27] (chunk c's from c * _CHUNK * 27, in output and offset
    # order), each output's offsets as bits [N_out], hits per (chunk, offset) [chunks, 27]
    hits,
    mask,
    counts,
):
    """Pass 1: the input of every (output, offset) pair, compacted per chunk of outputs.

    Output ``o`` at ``x`` reads ``x_i = s x - p + k_x`` from each of its 9 neighbour runs
    (x ascending): a cursor at the first ``x_i >= s x - p`` then three equality tests. The
    cursors carry over between consecutive outputs of one row with growing ``x`` (a merge, for
    inputs sorted by key); elsewhere they restart with a binary search.
    """
    n_out = run_of.shape[0]
    for c in numba.prange(counts.shape[0]):
        at = c * _CHUNK * KERNEL_VOLUME
        cursor = np.zeros(9, np.int64)
        last_run = -1
        last_x = 0
        for o in range(c * _CHUNK, min(n_out, (c + 1) * _CHUNK)):
            r = run_of[o]
            x0 = x_of[o] * stride_x - pad_x
            fresh = r != last_run or x0 < last_x
            bits = 0
            for kzy in range(9):
                run = nbr[r, kzy]
                if run < 0:
                    continue
                end = in_ptr[run + 1]
                if fresh:
                    j = _lower_bound(in_x, in_ptr[run], end, x0)
                else:
                    j = cursor[kzy]
                    while j < end and in_x[j] < x0:
                        j += 1
                cursor[kzy] = j
                for kx in range(3):
                    if j < end and in_x[j] == x0 + kx:
                        k = kzy * 3 + kx
                        bits |= 1 << k
                        hits[at] = in_index[j]
                        at += 1
                        counts[c, k] += 1
                        j += 1
            mask[o] = bits
            last_run = r
            last_x = x0


@numba.njit(cache=True, inline="always")
def _popcount(v):  # type: ignore[no-untyped-def]
    """Set bits of ``0 <= v < 2^62`` (SWAR: pairs, nibbles, bytes, then one multiply)."""
    v = v - ((v >> 1) & 0x5555555555555555)
    v = (v & 0x3333333333333333) + ((v >> 2) & 0x3333333333333333)
    v = (v + (v >> 4)) & 0x0F0F0F0F0F0F0F0F
    return ((v * 0x0101010101010101) >> 56) & 0xFF


#: De Bruijn table: the index of the lowest set bit ``b`` of a 32-bit word is
#: ``_DEBRUIJN[((b * 0x077CB531) mod 2^32) >> 27]``.
_DEBRUIJN = np.array(
    [
        *(0, 1, 28, 2, 29, 14, 24, 3, 30, 22, 20, 15, 25, 17, 4, 8),
        *(31, 27, 13, 23, 21, 19, 16, 7, 26, 12, 18, 6, 11, 5, 10, 9),
    ],
    np.int64,
)


@numba.njit(cache=True, inline="always")
def _lowest_bit(bits, debruijn):  # type: ignore[no-untyped-def]
    """Index of the lowest set bit of ``0 < bits < 2^32``."""
    return debruijn[(((bits & -bits) * 0x077CB531) & 0xFFFFFFFF) >> 27]


@numba.njit(parallel=True, cache=True)
def _find_lower(  # type: ignore[no-untyped-def]
    # per voxel (inputs sorted by key): its row's run [N], x [N]; run pointer [R + 1]
    run_of,
    x_of,
    in_ptr,
    # the runs' neighbour runs [R, 4]: rows (z-1, y-1..y+1) and (z, y-1)
    nbr,
    # out: lower hits [chunks * _CHUNK * 13] per chunk, their bits [N], counts [chunks, 27]
    hits,
    mask,
    counts,
):
    """Pass 1 of a SubM map on sorted voxels: the 13 offsets before the centre only.

    Offset ``k < 13`` reads a voxel with a smaller key (``dz < 0``, or ``dz = 0, dy < 0``, or
    ``dz = dy = 0, dx = -1``); its mirror ``26 - k`` is the same pair reversed, and ``13`` is
    the identity, so these 4 neighbour rows and the voxel before give the whole map. Rows
    ``(z - 1, *)`` and ``(z, y - 1)`` are merged as in :func:`_find_hits`; ``dx = -1`` in the
    voxel's own row is voxel ``o - 1`` when it sits at ``x - 1``.
    """
    n = run_of.shape[0]
    for c in numba.prange(counts.shape[0]):
        at = c * _CHUNK * 13
        cursor = np.zeros(4, np.int64)
        last_run = -1
        for o in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            r = run_of[o]
            x0 = x_of[o] - 1
            fresh = r != last_run
            bits = 0
            for kzy in range(4):
                run = nbr[r, kzy]
                if run < 0:
                    continue
                end = in_ptr[run + 1]
                j = in_ptr[run] if fresh else cursor[kzy]
                while j < end and x_of[j] < x0:
                    j += 1
                cursor[kzy] = j
                for kx in range(3):
                    if j < end and x_of[j] == x0 + kx:
                        k = kzy * 3 + kx
                        bits |= 1 << k
                        hits[at] = j
                        at += 1
                        counts[c, k] += 1
                        j += 1
            if o > 0 and run_of[o - 1] == r and x_of[o - 1] == x0:
                bits |= 1 << 12
                hits[at] = o - 1
                at += 1
                counts[c, 12] += 1
            mask[o] = bits
            last_run = r


@numba.njit(cache=True)
def _mirror(hits, hit_ptr, mask, counts, debruijn):  # type: ignore[no-untyped-def]
    """Complete the masks and counts of :func:`_find_lower` (serial: mirrors cross chunks).

    Lower hit ``(k, i)`` of voxel ``o`` is the pair ``(26 - k, o)`` of output ``i``: bit
    ``26 - k`` of ``mask[i]``, counted in ``i``'s chunk; every voxel has the centre, bit 13.
    """
    n = mask.shape[0]
    upper = np.zeros(n, np.int64)
    for c in range(counts.shape[0]):
        h = hit_ptr[c]
        for o in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            bits = mask[o]
            while bits:
                k = _lowest_bit(bits, debruijn)
                bits &= bits - 1
                i = hits[h]
                h += 1
                upper[i] |= 1 << (26 - k)
                counts[i // _CHUNK, 26 - k] += 1
            counts[c, 13] += 1
    for o in range(n):
        mask[o] |= upper[o] | (1 << 13)


@numba.njit(parallel=True, cache=True)
def _mirror_parallel(hits, hit_ptr, mask, counts, debruijn, parts):  # type: ignore[no-untyped-def]
    """:func:`_mirror` in ``parts`` ranges of chunks, in parallel (its reference).

    A mirror lands in an earlier chunk, possibly another part's, so each part ORs its upper bits
    into a row of its own and counts per (target chunk, upper offset) in a slab of its own; the
    rows and slabs are then summed (bits of distinct offsets never collide, so OR and sum
    agree with the serial pass).
    """
    n = mask.shape[0]
    chunks = counts.shape[0]
    upper = np.zeros((parts, n), np.int32)
    upper_counts = np.zeros((parts, chunks, 13), np.int64)
    for part in numba.prange(parts):
        for c in range(part * chunks // parts, (part + 1) * chunks // parts):
            h = hit_ptr[c]
            for o in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
                bits = mask[o]
                while bits:
                    k = _lowest_bit(bits, debruijn)
                    bits &= bits - 1
                    i = hits[h]
                    h += 1
                    upper[part, i] |= 1 << (12 - k)
                    upper_counts[part, i // _CHUNK, 12 - k] += 1
    for c in numba.prange(chunks):
        counts[c, 13] += min(n, (c + 1) * _CHUNK) - c * _CHUNK
        for part in range(parts):
            for u in range(13):
                counts[c, 14 + u] += upper_counts[part, c, u]
        for o in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            bits = 0
            for part in range(parts):
                bits |= upper[part, o]
            mask[o] |= (np.int64(bits) << 14) | (1 << 13)


@numba.njit(parallel=True, cache=True)
def _write_symmetric(  # type: ignore[no-untyped-def]
    # pass 1's lower hits and each chunk's first [chunks + 1], full bits [N], each chunk's
    # first position per offset [chunks, 27]
    hits,
    hit_ptr,
    mask,
    start,
    # offset pointer [28], CSR pointer by row [N + 1] (by output = by input for SubM)
    offset_ptr,
    ptr,
    debruijn,
    # out [E]: gather, scatter, dst_pos, src_pos
    gather,
    scatter,
    dst_pos,
    src_pos,
):
    """Pass 2 of a SubM map on sorted voxels: each lower hit writes itself and its mirror.

    Hit ``(k, i)`` of ``o`` goes to ``p = start[c, k] + `` (hits of ``k`` before it in chunk
    ``c``). Its mirror ``(26 - k, o -> i)`` takes the same rank in offset ``26 - k``:
    ``p' = offset_ptr[26 - k] + p - offset_ptr[k]``, since ``i`` is ``o`` shifted by one key
    difference, so sorting by ``i`` sorts by ``o``. The centre of ``o`` is
    ``offset_ptr[13] + o``. CSR slots: a pair ``(k, g -> d)`` is the
    ``popcount(mask[d] & (2^k - 1))``-th of row ``d`` and the ``popcount(mask[g] >> (27 - k))``-th
    of input ``g``.
    """
    n = mask.shape[0]
    for c in numba.prange(start.shape[0]):
        at = start[c].copy()
        h = hit_ptr[c]
        for o in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            full = mask[o]
            lower = full & 0x1FFF
            bits = lower
            t = 0
            while bits:
                k = _lowest_bit(bits, debruijn)
                bits &= bits - 1
                i = hits[h]
                h += 1
                p = at[k]
                at[k] = p + 1
                gather[p] = i
                scatter[p] = o
                dst_pos[ptr[o] + t] = p
                src_pos[ptr[i] + _popcount(mask[i] >> (KERNEL_VOLUME - k))] = p
                t += 1
                q = offset_ptr[26 - k] + p - offset_ptr[k]
                gather[q] = o
                scatter[q] = i
                dst_pos[ptr[i] + _popcount(mask[i] & ((1 << (26 - k)) - 1))] = q
                src_pos[ptr[o] + _popcount(full >> (k + 1))] = q
            p = offset_ptr[13] + o
            gather[p] = o
            scatter[p] = o
            dst_pos[ptr[o] + t] = p
            src_pos[ptr[o] + _popcount(full >> 14)] = p


@numba.njit(parallel=True, cache=True)
def _fill_order_segment(order, segment, offset_ptr):  # type: ignore[no-untyped-def]
    """``order[p] = p`` and ``segment[p] = k`` on offset ``k``'s positions."""
    for k in numba.prange(offset_ptr.shape[0] - 1):
        for p in range(offset_ptr[k], offset_ptr[k + 1]):
            order[p] = p
            segment[p] = k


@numba.njit(cache=True)  # serial: less than a parallel launch costs on a busy host
def _degrees(mask):  # type: ignore[no-untyped-def]
    """``dst_ptr``: the CSR pointer of the pairs by output row, ``popcount(mask)`` per row."""
    n = mask.shape[0]
    ptr = np.zeros(n + 1, np.int64)
    for o in range(n):
        ptr[o + 1] = ptr[o] + _popcount(mask[o])
    return ptr


@numba.njit(parallel=True, cache=True)
def _write_pairs(  # type: ignore[no-untyped-def]
    # pass 1's hits and each chunk's first [chunks + 1], bits, each chunk's first position per
    # offset [chunks, 27]
    hits,
    hit_ptr,
    mask,
    start,
    # CSR pointers by output row and (SubM) by input row
    dst_ptr,
    src_ptr,
    subm,
    debruijn,
    # out [E]: the plan's gather, scatter, dst_pos and (SubM) src_pos
    gather,
    scatter,
    dst_pos,
    src_pos,
):
    """Pass 2: every hit written at its plan position ``p``, offset-major, outputs ascending.

    The hit ``(k, i)`` of output ``o`` goes to ``p = start[c, k] + `` (hits of ``k`` before it in
    chunk ``c``); ``dst_pos`` lists a row's positions in offset order. SubM maps also fill
    ``src_pos``: input ``i`` feeds through ``k`` exactly when bit ``26 - k`` of ``mask[i]`` is
    set, so pair ``(k, i)`` is the ``popcount(mask[i] >> (27 - k))``-th of input ``i``.
    """
    n_out = mask.shape[0]
    for c in numba.prange(start.shape[0]):
        at = start[c].copy()
        h = hit_ptr[c]
        for o in range(c * _CHUNK, min(n_out, (c + 1) * _CHUNK)):
            bits = mask[o]
            j = dst_ptr[o]
            while bits:
                k = _lowest_bit(bits, debruijn)
                bits &= bits - 1
                i = hits[h]
                h += 1
                p = at[k]
                at[k] = p + 1
                gather[p] = i
                scatter[p] = o
                dst_pos[j] = p
                j += 1
                if subm:
                    src_pos[src_ptr[i] + _popcount(mask[i] >> (KERNEL_VOLUME - k))] = p


@numba.njit(cache=True)  # serial: less than a parallel launch costs on a busy host
def _compact_hits(spread, stride, hit_ptr):  # type: ignore[no-untyped-def]
    """Chunk ``c``'s hits, ``spread[c * stride :]``, moved to ``[hit_ptr[c], hit_ptr[c + 1])``."""
    out = np.empty(hit_ptr[-1], np.int32)
    for c in range(hit_ptr.shape[0] - 1):
        for h in range(hit_ptr[c + 1] - hit_ptr[c]):
            out[hit_ptr[c] + h] = spread[c * stride + h]
    return out


@numba.njit(cache=True)
def _run_ptr(first_row, before, mask, offset_ptr):  # type: ignore[no-untyped-def]
    """``[27, B + 1]``: where the pairs of offset ``k`` with output row ``>= first_row[b]`` start.

    ``before[c, k]`` counts offset ``k``'s pairs in the chunks before ``c``; the rows of the
    block's first chunk before ``first_row[b]`` are added from their bits.
    """
    out = np.empty((KERNEL_VOLUME, first_row.shape[0]), np.int64)
    for b in range(first_row.shape[0]):
        row = first_row[b]
        c = row // _CHUNK
        for k in range(KERNEL_VOLUME):
            out[k, b] = offset_ptr[k] + before[c, k]
        for o in range(c * _CHUNK, row):
            for k in range(KERNEL_VOLUME):
                out[k, b] += (mask[o] >> k) & 1
    return out


@numba.njit(cache=True)
def _key_runs(keys, row_length):  # type: ignore[no-untyped-def]
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
def _row_runs(rows, xs):  # type: ignore[no-untyped-def]
    """:func:`_key_runs` of the keys ``rows * X + xs``, given their rows: no division.

    ``rows`` ascending (``(b Z + z) Y + y`` of sorted keys), ``xs`` their x. :func:`_key_runs`
    divides every key by ``X`` twice (a 64-bit division is tens of cycles: 4.3 ms of pass 1 for
    160k voxels); here one pass compares rows, and the row ids and run pointer are cut from
    arrays of ``N`` and ``N + 1``. Reference: :func:`_key_runs`.
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
def _linear_keys(coords, z, y, x):  # type: ignore[no-untyped-def]
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
def _pad_tiles(run_ptr, tile_rows):  # type: ignore[no-untyped-def]
    """The ``"pad"`` schedule's tiles of :func:`fusekit.gms.problem.tiles_of_runs` (its reference).

    Each run ``(segment s, block b)`` of ``run_ptr [S, B + 1]`` is cut into tiles of
    ``tile_rows`` pairs, listed by (block, segment), one work item per tile: one pass over the
    tiles in place of that function's dozen numpy passes (2.2 ms for 65k tiles at 160k voxels).
    """
    segments, b1 = run_ptr.shape
    n = 0
    for b in range(b1 - 1):
        for s in range(segments):
            n += (run_ptr[s, b + 1] - run_ptr[s, b] + tile_rows - 1) // tile_rows
    tile_segment = np.empty(n, np.int64)
    tile_start = np.empty(n, np.int64)
    tile_end = np.empty(n, np.int64)
    block_ptr = np.zeros(b1, np.int64)
    t = 0
    for b in range(b1 - 1):
        for s in range(segments):
            hi = run_ptr[s, b + 1]
            for lo in range(run_ptr[s, b], hi, tile_rows):
                tile_segment[t] = s
                tile_start[t] = lo
                tile_end[t] = min(lo + tile_rows, hi)
                t += 1
        block_ptr[b + 1] = t
    return tile_segment, tile_start, tile_end, block_ptr, np.arange(n + 1)


def _tiles(run_ptr: np.ndarray, tile_rows: int, schedule: str) -> dict[str, torch.Tensor]:
    """:func:`fusekit.gms.problem.tiles_of_runs`, by :func:`_pad_tiles` for ``"pad"``."""
    from fusekit.gms.problem import tiles_of_runs

    if schedule != "pad":
        return tiles_of_runs(torch.from_numpy(run_ptr), tile_rows, schedule)
    names = ("tile_segment", "tile_start", "tile_end", "block_ptr", "item_ptr")
    return dict(zip(names, map(torch.from_numpy, _pad_tiles(run_ptr, tile_rows)), strict=True))


def _block_rows(dst_ptr: np.ndarray, blocks: int) -> np.ndarray:
    r""":func:`fusekit.gms.problem.block_rows` (its reference) by one search per block.

    Row ``r`` is in block :math:`\min(\lfloor \text{dst\_ptr}[r] B / E \rfloor, B - 1)`, so
    block ``b < B`` starts at the first row with :math:`\text{dst\_ptr}[r] \ge \lceil b E / B
    \rceil` (``E`` read as 1 when 0), and ``first[B] = N_out``: ``B`` binary searches in place
    of a division per row (0.77 -> 0.02 ms for 160k rows and 32 blocks).
    """
    e = max(int(dst_ptr[-1]), 1)
    first = np.empty(blocks + 1, np.int64)
    cut = -(-np.arange(blocks, dtype=np.int64) * e // blocks)  # ceil(b E / B)
    first[:blocks] = np.searchsorted(dst_ptr[:-1], cut)
    first[blocks] = len(dst_ptr) - 1
    return first


@dataclass(frozen=True, slots=True, eq=False)
class Hits:
    """Pass 1 of a CPU kernel map: every pair found, not yet written in plan order.

    The map's sizes and counts are known here, so the gms selector can choose the plan knobs
    (:meth:`features`) before pass 2 writes the pairs straight into the packed plan
    (:meth:`plan`), or into a :class:`KernelMap` (:meth:`kernel_map`).

    Attributes:
        hits: ``[H]`` int32 inputs in (output, offset) order (``H = E``, or when ``symmetric``
            the pairs of the 13 offsets before the centre).
        hit_ptr: ``[chunks + 1]`` where each chunk of 1024 outputs starts in ``hits``.
        mask: ``[N_out]`` int64 each output's offsets as bits (bit ``k``: offset ``k``).
        counts: ``[chunks, 27]`` hits per (chunk of 1024 outputs, offset).
        dst_ptr: ``[N_out + 1]`` pairs by output row.
        n_in: input voxels.
        out_coords: ``[N_out, 4]`` output voxels (the input tensor for SubM).
        out_shape: output spatial shape.
        subm: outputs are the inputs (then the pairs by input row follow from ``mask``).
        symmetric: ``hits`` holds the 13 offsets before the centre only, ``13`` per output
            (:func:`_find_lower`: SubM on voxels sorted by key).
    """

    hits: np.ndarray
    hit_ptr: np.ndarray
    mask: np.ndarray
    counts: np.ndarray
    dst_ptr: np.ndarray
    n_in: int
    out_coords: Any
    out_shape: tuple[int, int, int]
    subm: bool
    symmetric: bool = False

    @property
    def num_pairs(self) -> int:
        """``E``."""
        return int(self.dst_ptr[-1])

    @property
    def offset_ptr(self) -> np.ndarray:
        """``[28]`` where each offset's pairs start in plan order."""
        return np.concatenate([[0], np.cumsum(self.counts.sum(0))]).astype(np.int64)

    def features(self, k: int, m: int, dtype: torch.dtype) -> Features:
        """The gms selector's features of the map (``fusekit.gms.features`` of its plan).

        Raises:
            TypeError: a dtype gms does not run.
        """
        from fusekit.gms.features import features_of_counts

        degree = np.diff(self.dst_ptr)
        sources = None if self.subm else np.bincount(self.hits, minlength=self.n_in)
        return features_of_counts(
            segment_pairs=tuple(int(n) for n in self.counts.sum(0)),
            degree=degree,
            sources=sources,
            n_in=self.n_in,
            k=k,
            m=m,
            dtype=dtype,
        )

    def _write(self, views: dict[str, Any]) -> None:
        """Pass 2 into ``views`` (numpy arrays of ``[E]``); the SubM src CSR is ``dst_ptr``."""
        counts, offset_ptr = self.counts, self.offset_ptr
        start = offset_ptr[:-1][None, :] + np.cumsum(counts, 0) - counts
        _fill_order_segment(views["order"], views["segment"], offset_ptr)
        pairs = (views["gather"], views["scatter"], views["dst_pos"], views["src_pos"])
        if self.symmetric:
            _write_symmetric(
                self.hits,
                self.hit_ptr,
                self.mask,
                start,
                offset_ptr,
                self.dst_ptr,
                _DEBRUIJN,
                *pairs,
            )
        else:
            _write_pairs(
                self.hits,
                self.hit_ptr,
                self.mask,
                start,
                self.dst_ptr,
                self.dst_ptr,
                self.subm,
                _DEBRUIJN,
                *pairs,
            )
        if not self.subm:  # pairs by input row: a counting sort of the gather rows
            src_ptr, src_pos = _counting_order(views["gather"], self.n_in)
            views["src_ptr"][:] = src_ptr
            views["src_pos"][:] = src_pos
        else:
            views["src_ptr"][:] = self.dst_ptr
        views["dst_ptr"][:] = self.dst_ptr

    def kernel_map(self) -> KernelMap:
        """Pass 2 into plain arrays: the :class:`KernelMap` (with its CSRs)."""
        import torch

        e, n_out = self.num_pairs, self.mask.shape[0]
        views = {n: np.empty(e, np.int64) for n in ("order", "gather", "segment", "scatter")}
        views |= {"dst_pos": np.empty(e, np.int64), "src_pos": np.empty(e, np.int64)}
        views |= {
            "dst_ptr": np.empty(n_out + 1, np.int64),
            "src_ptr": np.empty(self.n_in + 1, np.int64),
        }
        self._write(views)
        return self._kernel_map(
            *(torch.from_numpy(views[n]) for n in ("gather", "segment", "scatter")),
            csr=tuple(views[n] for n in ("dst_ptr", "dst_pos", "src_ptr", "src_pos")),
        )

    def plan(self, tile_rows: int, blocks: int, schedule: str) -> tuple[KernelMap, GMSPlan]:
        """Pass 2 straight into a packed gms plan with these knobs, and the map as its views.

        Equal to ``plan_kernel_map(self.kernel_map(), tile_rows, blocks, schedule)``: the runs
        of each (offset, destination block) come from the per-chunk counts (:func:`_run_ptr`),
        the tiles from :func:`fusekit.gms.problem.tiles_of_runs`, then every pair is written
        once, at its position in the buffer.
        """
        import torch

        from fusekit.gms.problem import empty_plan_with_tiles

        e, n_out = self.num_pairs, self.mask.shape[0]
        first_row = _block_rows(self.dst_ptr, blocks)
        before = np.zeros((self.counts.shape[0] + 1, KERNEL_VOLUME), np.int64)
        np.cumsum(self.counts, 0, out=before[1:])
        run_ptr = _run_ptr(first_row, before, self.mask, self.offset_ptr)
        out = empty_plan_with_tiles(
            _tiles(run_ptr, tile_rows, schedule),
            num_pairs=e,
            n_in=self.n_in,
            n_out=n_out,
            num_segments=KERNEL_VOLUME,
            num_blocks=blocks,
            tile_rows=tile_rows,
            schedule=schedule,
        )
        self._write({n: v.numpy() for n, v in out.views.items()})
        out.views["segment_ptr"].copy_(torch.from_numpy(self.offset_ptr))
        plan = out.plan()
        kmap = self._kernel_map(plan.gather, plan.segment, plan.scatter, csr=(None,) * 4)
        return kmap, plan

    def _kernel_map(
        self, gather: Any, segment: Any, scatter: Any, csr: tuple[Any, ...]
    ) -> KernelMap:
        import torch

        coords = self.out_coords
        return KernelMap(
            gather=gather,
            segment=segment,
            scatter=scatter,
            offset_ptr=torch.from_numpy(self.offset_ptr),
            n_in=self.n_in,
            out_coords=coords
            if isinstance(coords, torch.Tensor)
            else torch.from_numpy(coords).to(torch.int32),
            out_shape=self.out_shape,
            csr=csr,  # type: ignore[arg-type]
        )


@numba.njit(cache=True)
def _strided_outputs(coords, shape, out_shape, stride, padding):  # type: ignore[no-untyped-def]
    """Sorted distinct linear keys (in ``out_shape``) of the outputs the inputs reach."""
    n = coords.shape[0]
    bits = 4
    while (1 << bits) < 16 * n:
        bits += 1
    table_keys = np.full(1 << bits, _EMPTY, np.int64)
    found = np.empty(8 * n + 1, np.int64)
    count = 0
    mask = (1 << bits) - 1
    for i in range(n):
        b = coords[i, 0]
        for k in range(KERNEL_VOLUME):
            q0 = coords[i, 1] + padding[0] - k // 9
            q1 = coords[i, 2] + padding[1] - (k // 3) % 3
            q2 = coords[i, 3] + padding[2] - k % 3
            if q0 < 0 or q1 < 0 or q2 < 0:
                continue
            if q0 % stride[0] or q1 % stride[1] or q2 % stride[2]:
                continue
            z, y, x = q0 // stride[0], q1 // stride[1], q2 // stride[2]
            if z >= out_shape[0] or y >= out_shape[1] or x >= out_shape[2]:
                continue
            row = (b * out_shape[0] + z) * out_shape[1] + y
            key = row * out_shape[2] + x
            h = _hash_slot(key, bits)
            while table_keys[h] != _EMPTY and table_keys[h] != key:
                h = (h + 1) & mask
            if table_keys[h] == _EMPTY:
                table_keys[h] = key
                if count == found.shape[0]:
                    found = np.concatenate((found, np.empty(found.shape[0], np.int64)))
                found[count] = key
                count += 1
    return np.sort(found[:count])


def find_hits(
    indices: torch.Tensor,
    spatial_shape: tuple[int, int, int],
    batch_size: int,
    stride: tuple[int, int, int] = (1, 1, 1),
    padding: tuple[int, int, int] = (1, 1, 1),
    subm: bool = True,
) -> Hits:
    """Pass 1 of the CPU kernel map (numba): sort the keys, hash the rows, find every pair.

    Args: as :func:`build`, with ``indices`` on the CPU.

    Returns:
        The :class:`Hits`; pass 2 is :meth:`Hits.plan` (into a gms plan) or
        :meth:`Hits.kernel_map`.

    Raises:
        TypeError, ValueError: see :func:`check_indices`; duplicate voxels; indices not on
            the CPU.
    """
    shape = check_indices(indices, spatial_shape, batch_size)
    if indices.device.type != "cpu":
        raise ValueError(expected("find_hits", "indices", "on the CPU", indices.device))
    if subm:
        stride, padding = (1, 1, 1), (1, 1, 1)
        out_shape = shape
    else:
        out_shape, stride, padding = check_output_grid(shape, int(batch_size), stride, padding)
    coords = indices.numpy()
    keys, rows, ascending = _linear_keys(coords, *shape)
    order = np.arange(len(keys)) if ascending else np.argsort(keys, kind="stable")
    sorted_keys = keys if ascending else keys[order]
    if not ascending:
        same = np.flatnonzero(sorted_keys[1:] == sorted_keys[:-1])
        if len(same):
            row = int(max(order[same[0]], order[same[0] + 1]))
            raise ValueError(_duplicate_message(coords, row))
    sorted_rows, sorted_x = (rows, coords[:, 3]) if ascending else (rows[order], coords[order, 3])
    in_rows, in_ptr, in_x, in_run = _row_runs(sorted_rows, sorted_x)
    if subm:
        out_coords: Any = indices
        out_rows, out_run, out_order = in_rows, in_run, order
        x_of = in_x if ascending else coords[:, 3].astype(np.int64)  # in_x: the sorted x
    else:
        sizes = (np.array(shape), np.array(out_shape), np.array(stride), np.array(padding))
        out_keys = _strided_outputs(coords.astype(np.int64), *sizes)
        out_coords = _unlinear(out_keys, out_shape)
        out_rows, _, x_of, out_run = _key_runs(out_keys, out_shape[2])
        out_order = np.arange(len(out_keys))
    n_out = len(x_of)
    if ascending or not subm:  # outputs in key order
        run_of = out_run
    else:
        run_of = np.empty(n_out, np.int64)
        run_of[out_order] = out_run
    bits = max(4, int(2 * max(len(in_rows), 1) - 1).bit_length())
    table = _row_table(in_rows, bits)
    sizes = tuple(np.array(v) for v in (shape, out_shape, stride, padding))
    symmetric = subm and ascending
    nbr = _neighbour_runs(out_rows, table, bits, *sizes, 4 if symmetric else 9)
    chunks = (n_out + _CHUNK - 1) // _CHUNK
    mask = np.empty(n_out, np.int64)
    counts = np.zeros((chunks, KERNEL_VOLUME), np.int64)
    # pass 1 writes each chunk's hits at its start in the thread's reused gms scratch buffer
    # (fresh pages, a fault and a zeroed page per 4 KiB, cost as much as the pass), then they
    # are compacted into an array of their own
    stride_h = _CHUNK * (13 if symmetric else KERNEL_VOLUME)
    spread = scratch("kernel map hits", chunks * stride_h, 1, torch.int32).numpy().reshape(-1)
    if symmetric:
        _find_lower(run_of, in_x, in_ptr, nbr, spread, mask, counts)
    else:
        _find_hits(
            run_of, x_of, nbr, in_ptr, in_x, order, stride[2], padding[2], spread, mask, counts
        )
    hit_ptr = np.zeros(chunks + 1, np.int64)
    np.cumsum(counts.sum(1), out=hit_ptr[1:])
    hits = _compact_hits(spread, stride_h, hit_ptr)
    if symmetric:
        _mirror_parallel(hits, hit_ptr, mask, counts, _DEBRUIJN, numba.get_num_threads())
    dst_ptr = _degrees(mask)
    n_in = len(keys)
    return Hits(hits, hit_ptr, mask, counts, dst_ptr, n_in, out_coords, out_shape, subm, symmetric)


def _unlinear(keys: np.ndarray, shape: tuple[int, int, int]) -> np.ndarray:
    z, y, x = shape
    out = np.empty((len(keys), 4), np.int64)
    out[:, 3] = keys % x
    rest = keys // x
    out[:, 2] = rest % y
    rest //= y
    out[:, 1] = rest % z
    out[:, 0] = rest // z
    return out


def _duplicate_message(coords: np.ndarray | torch.Tensor, row: int) -> str:
    voxel = tuple(int(v) for v in coords[row])
    return expected(
        "kernel map", "indices", "distinct voxels (b, z, y, x)", f"{voxel} repeated at row {row}"
    )


# ---------------------------------------------------------------------------------------------
# the public builders
# ---------------------------------------------------------------------------------------------


@numba.njit(cache=True)  # serial: one read of 16 B per voxel, less than a parallel launch
def _outside(values, bounds):  # type: ignore[no-untyped-def]
    """Whether some row of ``values [N, 4]`` leaves ``[0, bounds)`` (one pass, stops early).

    numpy's ``values.min(0)`` / ``max(0)`` reduce a 4-wide axis 0 in strides (2.4 ms each for
    100k voxels here, twice per fresh forward: the tensor's check and the map's); this loop
    reads each voxel once. Reference: :func:`_outside_reference`.
    """
    for i in range(values.shape[0]):
        for a in range(4):
            v = values[i, a]
            if v < 0 or v >= bounds[a]:
                return True
    return False


def _outside_reference(indices: torch.Tensor, bounds: torch.Tensor) -> bool:
    """:func:`_outside` in torch (any device): column minima and maxima against the bounds."""
    if indices.shape[0] == 0:
        return False
    low, high = torch.aminmax(indices, dim=0)
    return bool((low < 0).any() | (high >= bounds).any())


def check_indices(
    indices: torch.Tensor, spatial_shape: tuple[int, int, int], batch_size: int
) -> tuple[int, int, int]:
    """Raise unless ``indices`` are ``[N, 4]`` int32/int64 voxels inside the shape and batches.

    The grid itself is checked first (:func:`fusekit.nn.grid.check_grid`: integer sizes, and
    linear keys that fit int64).

    Returns:
        ``spatial_shape`` as 3 ints.

    Raises:
        TypeError: not an integer tensor; sizes that are not integers.
        ValueError: another shape, a grid out of range, more than ``2^31 - 1`` voxels, or a
            voxel outside ``[0, batch_size) x spatial_shape``.
    """
    import torch

    spatial_shape, batch_size = check_grid(spatial_shape, batch_size)
    if not isinstance(indices, torch.Tensor):
        raise TypeError(expected("sparse conv", "indices", "a torch.Tensor", type(indices)))
    if indices.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            expected("sparse conv", "indices", "int32 or int64", str(indices.dtype).split(".")[-1])
        )
    if indices.dim() != 2 or indices.shape[1] != 4 or indices.shape[0] > MAX_VOXELS:
        raise ValueError(
            expected(
                "sparse conv",
                "indices",
                f"[N, 4] (b, z, y, x) with N <= {MAX_VOXELS}",
                tuple(indices.shape),
            )
        )
    if indices.shape[0] == 0:
        return spatial_shape
    bounds = torch.tensor([batch_size, *spatial_shape], device=indices.device)
    if indices.device.type == "cpu" and indices.is_contiguous():
        outside = _outside(indices.numpy(), bounds.numpy())
    else:
        outside = _outside_reference(indices, bounds)
    if outside:  # the row is found only on failure
        bad = ((indices < 0) | (indices >= bounds)).any(1)
        row = int(torch.nonzero(bad)[0, 0])
        raise ValueError(
            expected(
                "sparse conv",
                "indices",
                f"voxels (b, z, y, x) in [0, {batch_size}) x {tuple(spatial_shape)} "
                "(batch_size x spatial_shape)",
                f"{tuple(int(v) for v in indices[row])} at row {row}",
            )
        )
    return spatial_shape


def build(
    indices: torch.Tensor,
    spatial_shape: tuple[int, int, int],
    batch_size: int,
    stride: tuple[int, int, int] = (1, 1, 1),
    padding: tuple[int, int, int] = (1, 1, 1),
    subm: bool = True,
) -> KernelMap:
    """The kernel map of a 3x3x3 convolution (CPU: numba hash; other devices: sort + search).

    Args:
        indices: ``[N, 4]`` int32/int64 distinct voxels ``(b, z, y, x)``.
        spatial_shape: ``(Z, Y, X)``.
        batch_size: batches.
        stride: per axis (ignored for ``subm``).
        padding: per axis (ignored for ``subm``: outputs are the inputs).
        subm: submanifold (outputs on the inputs) or a regular convolution.

    Returns:
        The :class:`KernelMap`, on the device of ``indices``.

    Raises:
        TypeError, ValueError: see :func:`check_indices`; duplicate voxels.
    """
    stride, padding = ((1, 1, 1), (1, 1, 1)) if subm else (tuple(stride), tuple(padding))  # type: ignore[assignment]
    if isinstance(indices, torch.Tensor) and indices.device.type != "cpu":
        return build_reference(indices, spatial_shape, batch_size, stride, padding, subm)
    return find_hits(indices, spatial_shape, batch_size, stride, padding, subm).kernel_map()


def build_reference(
    indices: torch.Tensor,
    spatial_shape: tuple[int, int, int],
    batch_size: int,
    stride: tuple[int, int, int] = (1, 1, 1),
    padding: tuple[int, int, int] = (1, 1, 1),
    subm: bool = True,
) -> KernelMap:
    """The same map in plain torch on any device: sorted keys, ``searchsorted`` per offset.

    The probes are written here (batch, bounds, stride, padding); the search is
    :func:`fusekit.gms.workloads.probe_pairs`, which gms's own ``kernel_map`` workload shares.
    """
    import torch

    from fusekit.gms.workloads import probe_pairs

    spatial_shape = check_indices(indices, spatial_shape, batch_size)
    if not subm:
        out_shape, stride, padding = check_output_grid(
            spatial_shape, int(batch_size), stride, padding
        )
    dev = indices.device
    shape = torch.tensor(spatial_shape, device=dev)
    stride_t, pad_t = (
        (torch.ones(3, dtype=torch.long, device=dev),) * 2
        if subm
        else (torch.tensor(stride, device=dev), torch.tensor(padding, device=dev))
    )
    c = indices.long()

    def linear(v: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
        return ((v[:, 0] * sizes[0] + v[:, 1]) * sizes[1] + v[:, 2]) * sizes[2] + v[:, 3]

    keys, order = torch.sort(linear(c, shape))
    if keys.numel() > 1 and bool((keys[1:] == keys[:-1]).any()):
        at = int(torch.nonzero(keys[1:] == keys[:-1])[0, 0])
        raise ValueError(_duplicate_message(indices, int(max(order[at], order[at + 1]))))
    offsets = torch.stack(
        torch.meshgrid(*(torch.arange(3, device=dev),) * 3, indexing="ij"), -1
    ).reshape(-1, 3)
    if subm:
        out_shape = spatial_shape
        out = c
    else:
        sizes_out = torch.tensor(out_shape, device=dev)
        q = c[:, None, 1:] + pad_t - offsets  # [N, 27, 3]
        ok = ((q % stride_t) == 0).all(-1) & (q >= 0).all(-1)
        q = torch.div(q, stride_t, rounding_mode="floor")
        ok &= (q < sizes_out).all(-1)
        b = c[:, None, :1].expand(-1, KERNEL_VOLUME, 1)
        cand = torch.cat([b, q], -1)[ok]
        out_keys = torch.unique(linear(cand, sizes_out))
        zyx = []
        rest = out_keys
        for n in reversed(out_shape):
            zyx.append(rest % n)
            rest = torch.div(rest, n, rounding_mode="floor")
        out = torch.stack([rest, *reversed(zyx)], 1)
    # the key each output reads through each offset, -1 outside the grid
    src = out[:, None, 1:] * stride_t - pad_t + offsets  # [N_out, 27, 3]
    inside = ((src >= 0) & (src < shape)).all(-1)
    b_out = out[:, None, :1].expand(-1, KERNEL_VOLUME, 1)
    probes = linear(torch.cat([b_out, src], -1).reshape(-1, 4), shape).reshape(-1, KERNEL_VOLUME)
    probes = torch.where(inside, probes, -1)
    gather, segment, scatter = probe_pairs(linear(c, shape), probes)
    counts = torch.bincount(segment, minlength=KERNEL_VOLUME)
    return KernelMap(
        gather=gather,
        segment=segment,
        scatter=scatter,
        offset_ptr=torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)]),
        n_in=int(indices.shape[0]),
        out_coords=indices if subm else out.to(torch.int32),
        out_shape=out_shape,  # type: ignore[arg-type]
    )


# ---------------------------------------------------------------------------------------------
# the gms plan of a map, in O(E)
# ---------------------------------------------------------------------------------------------


@numba.njit(cache=True)
def _ptr(counts):  # type: ignore[no-untyped-def]
    out = np.zeros(counts.shape[0] + 1, np.int64)
    for i in range(counts.shape[0]):
        out[i + 1] = out[i] + counts[i]
    return out


@numba.njit(cache=True)
def _counting_order(keys, n_keys):  # type: ignore[no-untyped-def]
    """Stable argsort of ``keys`` in ``[0, n_keys)`` and the CSR pointer of each key."""
    ptr = _ptr(np.bincount(keys, minlength=n_keys))
    at = ptr[:-1].copy()
    pos = np.empty(keys.shape[0], np.int64)
    for p in range(keys.shape[0]):
        pos[at[keys[p]]] = p
        at[keys[p]] += 1
    return ptr, pos


def plan_kernel_map(
    kmap: KernelMap,
    tile_rows: int | None = None,
    blocks: int | None = None,
    schedule: str = "pad",
    orders: bool = False,
) -> GMSPlan:
    """The :func:`fusekit.gms.plan` of a kernel map, equal field by field, without sorting.

    A map's pairs come sorted by (offset, output row), which is already the plan's order
    (destination blocks are ranges of output rows), so each plan is
    :func:`fusekit.gms.problem.plan_sorted` of its pairs; and every (offset, input) and
    (offset, output) is one pair, so the transform-first and aggregate-first orders have ``E``
    rows each and their pairs are sorted by (offset, row) as well.

    Args:
        kmap: a map from :func:`build`.
        tile_rows: pairs per tile (default ``fusekit.gms.problem.TILE_ROWS``).
        blocks: destination blocks (default ``default_blocks`` of the device).
        schedule: ``"pad"`` or ``"pack"``.
        orders: also plan the transform-first and aggregate-first orders.

    Returns:
        The packed :class:`fusekit.gms.GMSPlan` (on the CPU; ``.to(device)`` moves it).

    Raises:
        ValueError: a knob is out of range, or the pairs are not in plan order.
    """
    import torch

    from fusekit.gms.problem import (
        SCHEDULES,
        TILE_ROWS,
        OrderPlan,
        default_blocks,
        pack,
        plan_sorted,
    )

    tile_rows = TILE_ROWS if tile_rows is None else tile_rows
    blocks = default_blocks("cpu") if blocks is None else blocks
    for name, value in (("tile_rows", tile_rows), ("blocks", blocks)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(expected("plan_kernel_map", name, "a positive int", value))
    if schedule not in SCHEDULES:
        raise ValueError(expected("plan_kernel_map", "schedule", "pad or pack", repr(schedule)))
    plan_pairs = partial(
        plan_sorted,
        num_segments=KERNEL_VOLUME,
        tile_rows=tile_rows,
        blocks=blocks,
        schedule=schedule,
    )
    g, s, d = (t.cpu() for t in (kmap.gather, kmap.segment, kmap.scatter))
    csr = kmap.csr if all(a is not None for a in kmap.csr) else None
    try:
        base = plan_pairs(
            g,
            s,
            d,
            n_in=kmap.n_in,
            n_out=kmap.n_out,
            csr=tuple(torch.from_numpy(a) for a in csr) if csr is not None else None,  # type: ignore[arg-type]
        )
    except ValueError as err:
        if not orders:
            raise
        raise ValueError(expected("plan_kernel_map", "kmap", "a map in plan order", err)) from err
    if not orders:
        return base
    e = base.num_pairs
    rows = torch.arange(e)
    # aggregate-first: every (s, d) is one group, in the same order
    aggregate = OrderPlan(
        index=torch.arange(e + 1),
        plan=plan_pairs(rows, s, d, n_in=e, n_out=kmap.n_out),
    )
    # transform-first: the distinct (s, g) rows sorted by (s, g); pair p reads row row_of[p].
    # src_pos is the stable argsort by g, so a stable sort by s gives (s, g) order.
    by_sg = base.src_pos[torch.sort(s[base.src_pos], stable=True).indices]
    row_of = torch.empty(e, dtype=torch.int64)
    row_of[by_sg] = rows
    gs = g[by_sg]
    n_in = int(gs.max()) + 1 if e else 0
    transform = OrderPlan(
        index=row_of,
        plan=plan_pairs(gs, s[by_sg], rows, n_in=n_in, n_out=e),
    )
    return pack(replace(base, aggregate=aggregate, transform=transform))


def features_of(kmap: KernelMap, k: int, m: int, dtype: torch.dtype) -> Features:
    """``fusekit.gms.features(plan, k, m, dtype, has_scale=False)`` of a map, without a plan.

    Equal to the planned features (tests compare them): ``V = U = E`` (every (offset, input)
    and (offset, output) is one pair), per-offset rows are the pairs of each offset
    (:func:`fusekit.gms.features.features_of_counts`).
    """
    import torch

    from fusekit.gms.features import features_of_counts

    ptr = kmap.offset_ptr.tolist()
    dst_ptr, _, src_ptr, _ = kmap.csr
    degree = (
        torch.from_numpy(np.diff(dst_ptr))
        if dst_ptr is not None
        else torch.bincount(kmap.scatter.cpu(), minlength=kmap.n_out)
    )
    sources = (
        torch.from_numpy(np.diff(src_ptr))
        if src_ptr is not None
        else torch.bincount(kmap.gather.cpu(), minlength=kmap.n_in)
    )
    return features_of_counts(
        segment_pairs=tuple(b - a for a, b in itertools.pairwise(ptr)),
        degree=degree,
        sources=sources,
        n_in=kmap.n_in,
        k=k,
        m=m,
        dtype=dtype,
    )
