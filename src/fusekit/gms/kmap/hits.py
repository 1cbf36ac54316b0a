r"""Pass 1 of a CPU kernel map (numba): every (output, offset) pair found, counted per chunk.

The voxels are sorted by their key (no sort when they already are) and cut into runs of one row
(:mod:`fusekit.gms.kmap.keys`); each output row looks up its 9 neighbour input rows in a hash
table of rows. In parallel over chunks of :data:`~fusekit.gms.kmap.primitives.CHUNK` outputs,
each output row is merged with its neighbour rows along x, and every hit is recorded with each
output's offsets as bits and the hits per (chunk, offset). For SubM on sorted voxels only the 13
offsets before the centre are searched (4 neighbour rows and the voxel before): offset ``26 - k``
is offset ``k`` reversed and its pairs come in the same order, so the mirrors are counted, not
searched. The counts, kept in a :class:`~fusekit.gms.kmap.pairs.Hits`, are the selector's
features (:meth:`~fusekit.gms.kmap.pairs.Hits.features`), so the configuration is chosen before
pass 2 (:mod:`fusekit.gms.kmap.pairs`) writes any pair.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import torch

from fusekit.errors import expected
from fusekit.gms.kmap.grid import check_indices, check_output_grid, duplicate_message
from fusekit.gms.kmap.keys import (
    key_runs,
    linear_keys,
    neighbour_runs,
    row_runs,
    row_table,
    strided_outputs,
    unlinear,
)
from fusekit.gms.kmap.pairs import Hits
from fusekit.gms.kmap.primitives import (
    CHUNK,
    DEBRUIJN,
    KERNEL_VOLUME,
    lower_bound,
    lowest_bit,
    popcount,
)
from fusekit.gms.memory import scratch


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
    # out: hits [chunks * CHUNK * 27] (chunk c's from c * CHUNK * 27, in output and offset
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
        at = c * CHUNK * KERNEL_VOLUME
        cursor = np.zeros(9, np.int64)
        last_run = -1
        last_x = 0
        for o in range(c * CHUNK, min(n_out, (c + 1) * CHUNK)):
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
                    j = lower_bound(in_x, in_ptr[run], end, x0)
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


@numba.njit(parallel=True, cache=True)
def _find_lower(  # type: ignore[no-untyped-def]
    # per voxel (inputs sorted by key): its row's run [N], x [N]; run pointer [R + 1]
    run_of,
    x_of,
    in_ptr,
    # the runs' neighbour runs [R, 4]: rows (z-1, y-1..y+1) and (z, y-1)
    nbr,
    # out: lower hits [chunks * CHUNK * 13] per chunk, their bits [N], counts [chunks, 27]
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
        at = c * CHUNK * 13
        cursor = np.zeros(4, np.int64)
        last_run = -1
        for o in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
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
        for o in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            bits = mask[o]
            while bits:
                k = lowest_bit(bits, debruijn)
                bits &= bits - 1
                i = hits[h]
                h += 1
                upper[i] |= 1 << (26 - k)
                counts[i // CHUNK, 26 - k] += 1
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
            for o in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
                bits = mask[o]
                while bits:
                    k = lowest_bit(bits, debruijn)
                    bits &= bits - 1
                    i = hits[h]
                    h += 1
                    upper[part, i] |= 1 << (12 - k)
                    upper_counts[part, i // CHUNK, 12 - k] += 1
    for c in numba.prange(chunks):
        counts[c, 13] += min(n, (c + 1) * CHUNK) - c * CHUNK
        for part in range(parts):
            for u in range(13):
                counts[c, 14 + u] += upper_counts[part, c, u]
        for o in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            bits = 0
            for part in range(parts):
                bits |= upper[part, o]
            mask[o] |= (np.int64(bits) << 14) | (1 << 13)


@numba.njit(cache=True)  # serial: less than a parallel launch costs on a busy host
def _compact_hits(spread, stride, hit_ptr):  # type: ignore[no-untyped-def]
    """Chunk ``c``'s hits, ``spread[c * stride :]``, moved to ``[hit_ptr[c], hit_ptr[c + 1])``."""
    out = np.empty(hit_ptr[-1], np.int32)
    for c in range(hit_ptr.shape[0] - 1):
        for h in range(hit_ptr[c + 1] - hit_ptr[c]):
            out[hit_ptr[c] + h] = spread[c * stride + h]
    return out


@numba.njit(cache=True)  # serial: less than a parallel launch costs on a busy host
def _degrees(mask):  # type: ignore[no-untyped-def]
    """``dst_ptr``: the CSR pointer of the pairs by output row, ``popcount(mask)`` per row."""
    n = mask.shape[0]
    ptr = np.zeros(n + 1, np.int64)
    for o in range(n):
        ptr[o + 1] = ptr[o] + popcount(mask[o])
    return ptr


def find_hits(
    indices: torch.Tensor,
    spatial_shape: tuple[int, int, int],
    batch_size: int,
    stride: tuple[int, int, int] = (1, 1, 1),
    padding: tuple[int, int, int] = (1, 1, 1),
    subm: bool = True,
) -> Hits:
    """Pass 1 of the CPU kernel map (numba): sort the keys, hash the rows, find every pair.

    Args: as :func:`fusekit.gms.kmap.builder.build`, with ``indices`` on the CPU.

    Returns:
        The :class:`Hits`; pass 2 is :meth:`Hits.plan` (into a gms plan) or
        :meth:`Hits.kernel_map`.

    Raises:
        TypeError, ValueError: see :func:`~fusekit.gms.kmap.grid.check_indices`; duplicate
            voxels; indices not on the CPU.
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
    keys, rows, ascending = linear_keys(coords, *shape)
    order = np.arange(len(keys)) if ascending else np.argsort(keys, kind="stable")
    sorted_keys = keys if ascending else keys[order]
    if not ascending:
        same = np.flatnonzero(sorted_keys[1:] == sorted_keys[:-1])
        if len(same):
            row = int(max(order[same[0]], order[same[0] + 1]))
            raise ValueError(duplicate_message(coords, row))
    sorted_rows, sorted_x = (rows, coords[:, 3]) if ascending else (rows[order], coords[order, 3])
    in_rows, in_ptr, in_x, in_run = row_runs(sorted_rows, sorted_x)
    if subm:
        out_coords: Any = indices
        out_rows, out_run, out_order = in_rows, in_run, order
        x_of = in_x if ascending else coords[:, 3].astype(np.int64)  # in_x: the sorted x
    else:
        grid = (np.array(shape), np.array(out_shape), np.array(stride), np.array(padding))
        out_keys = strided_outputs(coords.astype(np.int64), *grid)
        out_coords = unlinear(out_keys, out_shape)
        out_rows, _, x_of, out_run = key_runs(out_keys, out_shape[2])
        out_order = np.arange(len(out_keys))
    n_out = len(x_of)
    if ascending or not subm:  # outputs in key order
        run_of = out_run
    else:
        run_of = np.empty(n_out, np.int64)
        run_of[out_order] = out_run
    bits = max(4, int(2 * max(len(in_rows), 1) - 1).bit_length())
    table = row_table(in_rows, bits)
    symmetric = subm and ascending
    nbr = neighbour_runs(
        out_rows,
        table,
        bits,
        np.array(shape),
        np.array(out_shape),
        np.array(stride),
        np.array(padding),
        4 if symmetric else 9,
    )
    chunks = (n_out + CHUNK - 1) // CHUNK
    mask = np.empty(n_out, np.int64)
    counts = np.zeros((chunks, KERNEL_VOLUME), np.int64)
    # pass 1 writes each chunk's hits at its start in the thread's reused gms scratch buffer
    # (fresh pages fault and are zeroed per 4 KiB on every call), then they are compacted into
    # an array of their own
    stride_h = CHUNK * (13 if symmetric else KERNEL_VOLUME)
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
        _mirror_parallel(hits, hit_ptr, mask, counts, DEBRUIJN, numba.get_num_threads())
    dst_ptr = _degrees(mask)
    n_in = len(keys)
    return Hits(hits, hit_ptr, mask, counts, dst_ptr, n_in, out_coords, out_shape, subm, symmetric)
