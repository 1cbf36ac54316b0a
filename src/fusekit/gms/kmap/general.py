r"""The CPU kernel map of any geometry (numba): a hash table of voxel keys, two passes.

For kernels other than 3x3x3 of dilation 1 (:mod:`fusekit.gms.kmap.geometry`: sizes 1-7 per
axis, any stride, padding and dilation, submanifold, regular or transposed). Keys are
``((b Z + z) Y + y) X + x`` (:mod:`fusekit.gms.kmap.grid`), held in an open-addressing table
(linear probing, Fibonacci hashing). Regular and transposed maps first list their outputs
(:func:`_outputs`: every output some input reaches, distinct, sorted by key). Then, in
parallel over chunks of :data:`~fusekit.gms.kmap.primitives.CHUNK` outputs, every output probes
the input key of each of its ``V`` offsets:

* pass 1 counts the hits per (chunk, offset), which places every chunk's pairs of every offset;
* pass 2 probes again and writes each pair ``(i, r, o)`` once, at its position in
  offset-major, output-ascending order (the order a gms plan wants).

Two passes of probes cost less than keeping ``V`` hits per output between them (``V`` is up
to 343). Reference: :func:`fusekit.gms.kmap.reference.build_reference`.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from fusekit.errors import expected
from fusekit.gms.kmap.geometry import Geometry
from fusekit.gms.kmap.grid import check_geometry_grid, check_indices, duplicate_message
from fusekit.gms.kmap.kernel_map import KernelMap
from fusekit.gms.kmap.keys import linear_keys, unlinear
from fusekit.gms.kmap.primitives import CHUNK, EMPTY, add_distinct, hash_slot


@numba.njit(cache=True)
def _key_table(keys, bits):  # type: ignore[no-untyped-def]
    """Table ``[2^bits, 2]`` of keys -> their row, and the first row repeating a key (or -1)."""
    table = np.full((1 << bits, 2), EMPTY, np.int64)
    mask = (1 << bits) - 1
    for i in range(keys.shape[0]):
        h = hash_slot(keys[i], bits)
        while table[h, 0] != EMPTY:
            if table[h, 0] == keys[i]:
                return table, i
            h = (h + 1) & mask
        table[h, 0] = keys[i]
        table[h, 1] = i
    return table, -1


@numba.njit(cache=True, inline="always")
def _find(table, bits, key):  # type: ignore[no-untyped-def]
    """The row of ``key`` in :func:`_key_table`'s table, or -1."""
    mask = (1 << bits) - 1
    h = hash_slot(key, bits)
    while table[h, 0] != EMPTY:
        if table[h, 0] == key:
            return table[h, 1]
        h = (h + 1) & mask
    return -1


@numba.njit(cache=True)
def _outputs(coords, out_shape, steps, offsets, transposed):  # type: ignore[no-untyped-def]
    """Sorted distinct keys (in ``out_shape``) of the outputs the inputs reach.

    ``steps [3, 2]``: stride and padding per axis; ``offsets [V, 3]``: ``d r`` per offset.
    Regular: ``c_o = (c_i + p - d r) / s`` where divisible; transposed: ``c_o = s c_i - p + d r``.
    """
    n, v = coords.shape[0], offsets.shape[0]
    bits = 4
    while (1 << bits) < 2 * n * min(v, 8) + 2:
        bits += 1
    seen = np.full(1 << bits, EMPTY, np.int64)
    found = np.empty(max(16, 2 * n), np.int64)
    count = 0
    q = np.empty(3, np.int64)
    for i in range(n):
        for r in range(v):
            ok = True
            for a in range(3):
                c = np.int64(coords[i, a + 1])
                if transposed:
                    q[a] = c * steps[a, 0] - steps[a, 1] + offsets[r, a]
                else:
                    t = c + steps[a, 1] - offsets[r, a]
                    if t < 0 or t % steps[a, 0]:
                        ok = False
                        break
                    q[a] = t // steps[a, 0]
                if q[a] < 0 or q[a] >= out_shape[a]:
                    ok = False
                    break
            if not ok:
                continue
            key = (
                (np.int64(coords[i, 0]) * out_shape[0] + q[0]) * out_shape[1] + q[1]
            ) * out_shape[2] + q[2]
            seen, bits, found, count = add_distinct(seen, bits, found, count, key)
    return np.sort(found[:count])


@numba.njit(cache=True, inline="always")
def _probe(out_coords, o, r, shape, steps, offsets, transposed):  # type: ignore[no-untyped-def]
    """The key of the input output ``o`` reads through offset ``r``, or -1.

    -1: outside the grid, or (transposed) no input lands there.
    """
    key = np.int64(out_coords[o, 0])
    for a in range(3):
        c = np.int64(out_coords[o, a + 1])
        if transposed:
            t = c + steps[a, 1] - offsets[r, a]
            if t < 0 or t % steps[a, 0]:
                return -1
            ci = t // steps[a, 0]
        else:
            ci = c * steps[a, 0] - steps[a, 1] + offsets[r, a]
        if ci < 0 or ci >= shape[a]:
            return -1
        key = key * shape[a] + ci
    return key


@numba.njit(parallel=True, cache=True)
def _count(out_coords, table, bits, shape, steps, offsets, transposed, counts):  # type: ignore[no-untyped-def]
    """Pass 1: hits per (chunk of outputs, offset) into ``counts [chunks, V]``."""
    n_out, v = out_coords.shape[0], offsets.shape[0]
    for c in numba.prange(counts.shape[0]):
        for o in range(c * CHUNK, min(n_out, (c + 1) * CHUNK)):
            for r in range(v):
                key = _probe(out_coords, o, r, shape, steps, offsets, transposed)
                if key >= 0 and _find(table, bits, key) >= 0:
                    counts[c, r] += 1


@numba.njit(parallel=True, cache=True)
def _write(out_coords, table, bits, shape, steps, offsets, transposed, start, gather, scatter):  # type: ignore[no-untyped-def]
    """Pass 2: pair ``(i, r, o)`` at ``start[c, r]`` + (hits of ``r`` before it in chunk ``c``)."""
    n_out, v = out_coords.shape[0], offsets.shape[0]
    for c in numba.prange(start.shape[0]):
        at = start[c].copy()
        for o in range(c * CHUNK, min(n_out, (c + 1) * CHUNK)):
            for r in range(v):
                key = _probe(out_coords, o, r, shape, steps, offsets, transposed)
                if key < 0:
                    continue
                i = _find(table, bits, key)
                if i >= 0:
                    gather[at[r]] = i
                    scatter[at[r]] = o
                    at[r] += 1


def build_general(
    indices: torch.Tensor, spatial_shape: tuple[int, int, int], batch_size: int, geometry: Geometry
) -> KernelMap:
    """The kernel map of any geometry on the CPU (numba; the module docstring's two passes).

    Args:
        indices: ``[N, 4]`` int32/int64 distinct voxels ``(b, z, y, x)`` on the CPU.
        spatial_shape: ``(Z, Y, X)``.
        batch_size: batches.
        geometry: the convolution's (:class:`~fusekit.gms.kmap.geometry.Geometry`).

    Returns:
        The :class:`KernelMap`: pairs sorted by (offset, output row); outputs the inputs (SubM)
        or sorted by key.

    Raises:
        TypeError, ValueError: see :func:`~fusekit.gms.kmap.grid.check_indices`; duplicate
            voxels; an output grid out of range; indices not on the CPU.
    """
    shape = check_indices(indices, spatial_shape, batch_size)
    if indices.device.type != "cpu":
        raise ValueError(expected("build_general", "indices", "on the CPU", indices.device))
    out_shape = check_geometry_grid(shape, int(batch_size), geometry)
    coords = indices.numpy()
    keys, _, _ = linear_keys(coords, *shape)
    bits = max(4, int(2 * max(len(keys), 1) - 1).bit_length())
    table, repeated = _key_table(keys, bits)
    if repeated >= 0:
        raise ValueError(duplicate_message(coords, int(repeated)))
    steps = np.array([geometry.stride, geometry.padding], np.int64).T.copy()
    offsets = np.array(geometry.offsets(), np.int64).reshape(-1, 3) * np.array(geometry.dilation)
    if geometry.subm:
        out_np = coords.astype(np.int64)
        out_coords = indices
    else:
        out_keys = _outputs(coords, np.array(out_shape), steps, offsets, geometry.transposed)
        out_np = unlinear(out_keys, out_shape)
        out_coords = torch.from_numpy(out_np).to(torch.int32)
    n_out, v = len(out_np), geometry.volume
    chunks = (n_out + CHUNK - 1) // CHUNK
    counts = np.zeros((chunks, v), np.int64)
    args = (out_np, table, bits, np.array(shape), steps, offsets, geometry.transposed)
    _count(*args, counts)
    offset_ptr = np.zeros(v + 1, np.int64)
    np.cumsum(counts.sum(0), out=offset_ptr[1:])
    start = offset_ptr[:-1][None, :] + np.cumsum(counts, 0) - counts
    e = int(offset_ptr[-1])
    gather, scatter = np.empty(e, np.int64), np.empty(e, np.int64)
    _write(*args, start, gather, scatter)
    ptr = torch.from_numpy(offset_ptr)
    segment = torch.repeat_interleave(torch.arange(v), ptr.diff())
    return KernelMap(
        gather=torch.from_numpy(gather),
        segment=segment,
        scatter=torch.from_numpy(scatter),
        offset_ptr=ptr,
        n_in=int(indices.shape[0]),
        out_coords=out_coords,
        out_shape=out_shape,
    )
