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

* CPU, :func:`build` on CPU tensors (numba): the voxels sorted by their linearised key
  ``((b Z + z) Y + y) X + x`` (no sort when they already are), cut into runs of one row
  ``(b, z, y)``; an open-addressing hash table (linear probing, Fibonacci hashing) maps row
  keys to runs. In parallel over output rows, the 9 rows of the ``(kz, ky)`` offsets are probed
  once and merged with the output row along x, which finds the 3 ``kx`` offsets; then the hits
  are compacted per offset in two parallel passes (count per chunk of outputs, then write at
  prefix-summed positions). A first version hashed every voxel and probed the 27 offsets per
  voxel: its random probes into an 8 MB table made it 2x slower on a 160k-voxel scan.
* :func:`build_reference` (plain torch, any device, also the GPU path of :func:`build`): the
  input keys sorted once, each probe found with ``torch.searchsorted``. There is no GPU hash
  table: the GPU path is this sort + binary search, run on the device.

:func:`plan_kernel_map` turns a map into its :class:`fusekit.gms.GMSPlan` in O(E) numba passes:
the pairs already come in plan order, and every (offset, input) and (offset, output) pair is
distinct, so the sorts of :func:`fusekit.gms.plan` (its reference, compared in the tests) become
counting passes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numba
import numpy as np

from fusekit.errors import expected

if TYPE_CHECKING:
    import torch

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


def output_shape(
    shape: tuple[int, int, int], stride: tuple[int, int, int], padding: tuple[int, int, int]
) -> tuple[int, int, int]:
    """``floor((S + 2p - 3) / s) + 1`` per axis (kernel 3, dilation 1), as spconv's."""
    return tuple((n + 2 * p - 3) // s + 1 for n, s, p in zip(shape, stride, padding, strict=True))  # type: ignore[return-value]


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


@numba.njit(parallel=True, cache=True)
def _probe_rows(  # type: ignore[no-untyped-def]
    # inputs sorted by key, as runs of one row (b, z, y): row id [R], run ptr [R + 1],
    # x [N] ascending within a run, original row [N]; table: row id -> run
    in_rows,
    in_ptr,
    in_x,
    in_index,
    table,
    bits,
    # outputs sorted by key, as runs (same layout, in the output shape)
    out_rows,
    out_ptr,
    out_x,
    out_index,
    nbr,
    # sizes: input shape, output shape, stride, padding
    shape,
    out_shape,
    stride,
    padding,
):
    """``nbr[o, k]`` = input row at ``s c_o - p + k``, or -1, by merging sorted rows.

    Per output row (parallel): the 9 input rows of the ``(kz, ky)`` offsets are looked up once
    in the row table, then each is merged with the output row along x (both ascending), the
    three ``kx`` found by a short forward scan. Memory is read in order; the only random
    accesses are 9 row lookups per output row, in a table that fits the cache.
    """
    mask = (1 << bits) - 1
    for r in numba.prange(out_rows.shape[0]):
        row = out_rows[r]
        y = row % out_shape[1]
        z = (row // out_shape[1]) % out_shape[0]
        b = row // (out_shape[1] * out_shape[0])
        for kzy in range(9):
            zi = z * stride[0] - padding[0] + kzy // 3
            yi = y * stride[1] - padding[1] + kzy % 3
            if zi < 0 or zi >= shape[0] or yi < 0 or yi >= shape[1]:
                continue
            key = (b * shape[0] + zi) * shape[1] + yi
            h = _hash_slot(key, bits)
            run = -1
            while table[h, 0] != _EMPTY:
                if table[h, 0] == key:
                    run = table[h, 1]
                    break
                h = (h + 1) & mask
            if run < 0:
                continue
            j = in_ptr[run]
            end = in_ptr[run + 1]
            for q in range(out_ptr[r], out_ptr[r + 1]):
                x0 = out_x[q] * stride[2] - padding[2]
                while j < end and in_x[j] < x0:
                    j += 1
                jj = j
                for kx in range(3):
                    while jj < end and in_x[jj] < x0 + kx:
                        jj += 1
                    if jj < end and in_x[jj] == x0 + kx:
                        nbr[out_index[q], kzy * 3 + kx] = in_index[jj]


def _runs(keys: np.ndarray, row_length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted keys as runs of one row: row ids, run pointer, x."""
    rows = keys // row_length
    starts = np.flatnonzero(rows[1:] != rows[:-1]) + 1
    ptr = np.concatenate([[0], starts, [len(keys)]]).astype(np.int64)
    if len(keys) == 0:
        ptr = ptr[:1]
    return rows[ptr[:-1]], ptr, keys - rows * row_length


@numba.njit(parallel=True, cache=True)
def _count(nbr, counts, degree, mask):  # type: ignore[no-untyped-def]
    """Hits per (chunk of rows, offset), per output row, and each row's offsets as bits."""
    n_out = nbr.shape[0]
    for c in numba.prange(counts.shape[0]):
        for o in range(c * _CHUNK, min(n_out, (c + 1) * _CHUNK)):
            bits = 0
            for k in range(KERNEL_VOLUME):
                if nbr[o, k] >= 0:
                    counts[c, k] += 1
                    bits |= 1 << k
            mask[o] = bits
            degree[o] = _popcount(bits)


@numba.njit(cache=True, inline="always")
def _popcount(v):  # type: ignore[no-untyped-def]
    n = 0
    while v:
        v &= v - 1
        n += 1
    return n


@numba.njit(parallel=True, cache=True)
def _compact(  # type: ignore[no-untyped-def]
    nbr, start, gather, segment, scatter, dst_ptr, dst_pos, mask, src_ptr, src_pos, subm
):
    """Write the hits of each chunk at ``start[c, k]``: offset-major, output rows ascending.

    Also the CSRs of :func:`fusekit.gms.plan`: by output row (the row's pairs in position order,
    which is offset order) and, for submanifold maps, by input row: input ``i`` feeds through
    ``k`` exactly when ``nbr[i, 26 - k] >= 0``, so its pairs in offset order are the set bits of
    ``mask[i]`` from the top, and pair ``(k, i)`` is the ``popcount(mask[i] >> (27 - k))``-th.
    """
    n_out = nbr.shape[0]
    for c in numba.prange(start.shape[0]):
        at = start[c].copy()
        for o in range(c * _CHUNK, min(n_out, (c + 1) * _CHUNK)):
            j = dst_ptr[o]
            for k in range(KERNEL_VOLUME):
                i = nbr[o, k]
                if i >= 0:
                    p = at[k]
                    gather[p] = i
                    segment[p] = k
                    scatter[p] = o
                    dst_pos[j] = p
                    j += 1
                    if subm:
                        src_pos[src_ptr[i] + _popcount(mask[i] >> (KERNEL_VOLUME - k))] = p
                    at[k] += 1


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


def _linear(coords: np.ndarray, shape: tuple[int, int, int]) -> np.ndarray:
    z, y, x = shape
    return ((coords[:, 0] * z + coords[:, 1]) * y + coords[:, 2]) * x + coords[:, 3]


def _build_cpu(
    coords: np.ndarray,
    shape: tuple[int, int, int],
    stride: tuple[int, int, int],
    padding: tuple[int, int, int],
    subm: bool,
) -> tuple[Any, ...]:
    keys = _linear(coords, shape)
    ascending = bool(np.all(keys[1:] > keys[:-1]))
    order = np.arange(len(keys)) if ascending else np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    same = np.flatnonzero(sorted_keys[1:] == sorted_keys[:-1])
    if len(same):
        raise ValueError(_duplicate_message(coords, int(max(order[same[0]], order[same[0] + 1]))))
    out_shape = shape if subm else output_shape(shape, stride, padding)
    if subm:
        out_coords, out_keys, out_order = coords, sorted_keys, order
    else:
        sizes = (np.array(shape), np.array(out_shape), np.array(stride), np.array(padding))
        out_keys = _strided_outputs(coords, *sizes)
        out_coords, out_order = _unlinear(out_keys, out_shape), np.arange(len(out_keys))
    n_out = out_coords.shape[0]
    nbr = np.full((n_out, KERNEL_VOLUME), -1, np.int32)
    in_rows, in_ptr, in_x = _runs(sorted_keys, shape[2])
    bits = max(4, int(2 * max(len(in_rows), 1) - 1).bit_length())
    table = _row_table(in_rows, bits)
    out_rows, out_ptr, out_x = _runs(out_keys, out_shape[2])
    _probe_rows(
        in_rows,
        in_ptr,
        in_x,
        order,
        table,
        bits,
        out_rows,
        out_ptr,
        out_x,
        out_order,
        nbr,
        *(np.array(v) for v in (shape, out_shape, stride, padding)),
    )
    counts = np.zeros(((n_out + _CHUNK - 1) // _CHUNK, KERNEL_VOLUME), np.int64)
    degree = np.empty(n_out, np.int64)
    mask = np.empty(n_out, np.int64)
    _count(nbr, counts, degree, mask)
    offset_ptr = np.concatenate([[0], np.cumsum(counts.sum(0))])
    # start[c, k] = offset_ptr[k] + hits of offset k in the chunks before c
    start = offset_ptr[:-1][None, :] + np.cumsum(counts, 0) - counts
    e = int(offset_ptr[-1])
    gather, segment, scatter, dst_pos = (np.empty(e, np.int64) for _ in range(4))
    dst_ptr = np.concatenate([[0], np.cumsum(degree)])
    src_pos = np.empty(e if subm else 0, np.int64)
    _compact(nbr, start, gather, segment, scatter, dst_ptr, dst_pos, mask, dst_ptr, src_pos, subm)
    csr = (dst_ptr, dst_pos, dst_ptr, src_pos) if subm else (dst_ptr, dst_pos, None, None)
    return gather, segment, scatter, offset_ptr, out_coords, csr


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


def check_indices(
    indices: torch.Tensor, spatial_shape: tuple[int, int, int], batch_size: int
) -> None:
    """Raise unless ``indices`` are ``[N, 4]`` int32/int64 voxels inside the shape and batches.

    Raises:
        TypeError: not an integer tensor.
        ValueError: another shape, or a voxel outside ``[0, batch_size) x spatial_shape``.
    """
    import torch

    if not isinstance(indices, torch.Tensor):
        raise TypeError(expected("sparse conv", "indices", "a torch.Tensor", type(indices)))
    if indices.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            expected("sparse conv", "indices", "int32 or int64", str(indices.dtype).split(".")[-1])
        )
    if indices.dim() != 2 or indices.shape[1] != 4:
        raise ValueError(
            expected("sparse conv", "indices", "[N, 4] (b, z, y, x)", tuple(indices.shape))
        )
    if len(spatial_shape) != 3 or any(int(n) < 1 for n in spatial_shape):
        raise ValueError(
            expected("sparse conv", "spatial_shape", "3 positive sizes (Z, Y, X)", spatial_shape)
        )
    if indices.shape[0] == 0:
        return
    bounds = torch.tensor([batch_size, *spatial_shape], device=indices.device)
    bad = ((indices < 0) | (indices >= bounds)).any(1)
    if bool(bad.any()):
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
    import torch

    check_indices(indices, spatial_shape, batch_size)
    shape = tuple(int(n) for n in spatial_shape)
    stride, padding = ((1, 1, 1), (1, 1, 1)) if subm else (tuple(stride), tuple(padding))
    if indices.device.type != "cpu":
        return build_reference(indices, shape, batch_size, stride, padding, subm)  # type: ignore[arg-type]
    coords = indices.numpy().astype(np.int64, copy=False)
    g, s, d, ptr, out, csr = _build_cpu(coords, shape, stride, padding, subm)  # type: ignore[arg-type]
    out_shape = shape if subm else output_shape(shape, stride, padding)  # type: ignore[arg-type]
    return KernelMap(
        gather=torch.from_numpy(g),
        segment=torch.from_numpy(s),
        scatter=torch.from_numpy(d),
        offset_ptr=torch.from_numpy(ptr),
        n_in=int(indices.shape[0]),
        out_coords=indices if subm else torch.from_numpy(out).to(torch.int32),
        out_shape=out_shape,  # type: ignore[arg-type]
        csr=csr,
    )


def build_reference(
    indices: torch.Tensor,
    spatial_shape: tuple[int, int, int],
    batch_size: int,
    stride: tuple[int, int, int] = (1, 1, 1),
    padding: tuple[int, int, int] = (1, 1, 1),
    subm: bool = True,
) -> KernelMap:
    """The same map in plain torch on any device: sorted keys, ``searchsorted`` per offset."""
    import torch

    check_indices(indices, spatial_shape, batch_size)
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
        out_shape = tuple(int(n) for n in spatial_shape)
        out = c
    else:
        out_shape = output_shape(tuple(spatial_shape), tuple(stride), tuple(padding))  # type: ignore[arg-type]
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
    gathers, segments, scatters = [], [], []
    for k in range(KERNEL_VOLUME):
        src = out[:, 1:] * stride_t - pad_t + offsets[k]
        inside = ((src >= 0) & (src < shape)).all(1)
        probe = linear(torch.cat([out[:, :1], src], 1), shape)
        at = torch.searchsorted(keys, probe).clamp(max=max(len(keys) - 1, 0))
        hit = inside & (keys[at] == probe) if len(keys) else inside & False
        gathers.append(order[at[hit]])
        scatters.append(torch.nonzero(hit).flatten())
        segments.append(torch.full((int(hit.sum()),), k, device=dev))
    counts = torch.tensor([len(s) for s in segments], device=dev)
    return KernelMap(
        gather=torch.cat(gathers),
        segment=torch.cat(segments).long(),
        scatter=torch.cat(scatters),
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


@numba.njit(cache=True)
def _plan_sorted(  # type: ignore[no-untyped-def]
    g, s, d, n_in, n_out, n_segments, tile_rows, blocks, pack, dst_ptr, dst_pos, src_ptr, src_pos
):
    """The arrays of ``fusekit.gms.plan`` for pairs already in plan order (see ``_plan``).

    CSRs given empty are computed (counting sorts). Returns ``ok = False`` when the pairs are not
    sorted by (segment, block, scatter row).
    """
    e = g.shape[0]
    if dst_ptr.shape[0] == 0:
        dst_ptr, dst_pos = _counting_order(d, n_out)
    if src_ptr.shape[0] == 0:
        src_ptr, src_pos = _counting_order(g, n_in)
    # 1. destination blocks: block of row r = floor(pairs before r * B / E)
    row_block = np.empty(n_out, np.int64)
    for r in range(n_out):
        row_block[r] = min(dst_ptr[r] * blocks // max(e, 1), blocks - 1)
    # 2. the identity must be the (segment, block, row) order
    ok = True
    for p in range(1, e):
        if s[p - 1] != s[p]:
            ok &= s[p - 1] < s[p]
        elif row_block[d[p - 1]] != row_block[d[p]]:
            ok &= row_block[d[p - 1]] < row_block[d[p]]
        else:
            ok &= d[p - 1] <= d[p]
    segment_ptr = _ptr(np.bincount(s, minlength=n_segments))
    # 3. tiles of every (segment, block) run, in position order, then stably by block
    n_tiles = 0
    p = 0
    while p < e:
        q = p + 1
        while q < e and s[q] == s[p] and row_block[d[q]] == row_block[d[p]]:
            q += 1
        n_tiles += (q - p + tile_rows - 1) // tile_rows
        p = q
    tile_start = np.empty(n_tiles, np.int64)
    tile_end = np.empty(n_tiles, np.int64)
    tile_block = np.empty(n_tiles, np.int64)
    t = 0
    p = 0
    while p < e:
        q = p + 1
        while q < e and s[q] == s[p] and row_block[d[q]] == row_block[d[p]]:
            q += 1
        for lo in range(p, q, tile_rows):
            tile_start[t] = lo
            tile_end[t] = min(lo + tile_rows, q)
            tile_block[t] = row_block[d[p]]
            t += 1
        p = q
    block_ptr, by_block = _counting_order(tile_block, blocks)
    tile_start = tile_start[by_block]
    tile_end = tile_end[by_block]
    tile_block = tile_block[by_block]
    tile_segment = np.empty(n_tiles, np.int64)
    for t in range(n_tiles):
        tile_segment[t] = s[tile_start[t]]
    # 4. work items: pad = one tile each; pack = tiles of a block in windows of tile_rows pairs
    if not pack:
        item_ptr = np.arange(n_tiles + 1)
    else:
        starts = np.empty(n_tiles + 1, np.int64)
        n_items = 0
        before = 0
        last_window = -1
        for t in range(n_tiles):
            if t == 0 or tile_block[t] != tile_block[t - 1]:
                before = 0
            window = before // tile_rows
            if t == 0 or tile_block[t] != tile_block[t - 1] or window != last_window:
                starts[n_items] = t
                n_items += 1
            last_window = window
            before += tile_end[t] - tile_start[t]
        starts[n_items] = n_tiles
        item_ptr = starts[: n_items + 1].copy()
    return (
        ok,
        segment_ptr,
        tile_segment,
        tile_start,
        tile_end,
        block_ptr,
        item_ptr,
        dst_ptr,
        dst_pos,
        src_ptr,
        src_pos,
    )


def plan_kernel_map(
    kmap: KernelMap,
    tile_rows: int | None = None,
    blocks: int | None = None,
    schedule: str = "pad",
    orders: bool = False,
) -> GMSPlan:
    """The :func:`fusekit.gms.plan` of a kernel map, equal field by field, in O(E) passes.

    A map's pairs come sorted by (offset, output row), which is already the plan's order
    (destination blocks are ranges of output rows), so the sorts become counting passes; and
    every (offset, input) and (offset, output) is one pair, so the transform-first and
    aggregate-first orders have ``E`` rows each and keep the pairwise order.

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
        REDUCES,
        SCHEDULES,
        TILE_ROWS,
        GMSPlan,
        OrderPlan,
        _pack,
        default_blocks,
    )

    tile_rows = TILE_ROWS if tile_rows is None else tile_rows
    blocks = default_blocks("cpu") if blocks is None else blocks
    for name, value in (("tile_rows", tile_rows), ("blocks", blocks)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(expected("plan_kernel_map", name, "a positive int", value))
    if schedule not in SCHEDULES:
        raise ValueError(expected("plan_kernel_map", "schedule", "pad or pack", repr(schedule)))
    g, s, d = (t.cpu().numpy() for t in (kmap.gather, kmap.segment, kmap.scatter))
    e = len(g)
    if not orders and all(a is not None for a in kmap.csr):
        return _packed_plan(kmap, g, s, d, tile_rows, blocks, schedule)

    none = np.empty(0, np.int64)

    def one(
        gather: np.ndarray,
        segment: np.ndarray,
        scatter: np.ndarray,
        n_in: int,
        n_out: int,
        csr: tuple[Any, ...] = (None,) * 4,
    ) -> GMSPlan:
        ok, *arrays = _plan_sorted(
            gather,
            segment,
            scatter,
            n_in,
            n_out,
            KERNEL_VOLUME,
            tile_rows,
            blocks,
            schedule == "pack",
            *(none if a is None else a for a in csr),
        )
        if not ok:
            raise ValueError(
                expected("plan_kernel_map", "kmap", "pairs sorted by (offset, output)", "not")
            )
        names = ("segment_ptr", "tile_segment", "tile_start", "tile_end", "block_ptr")
        names += ("item_ptr", "dst_ptr", "dst_pos", "src_ptr", "src_pos")
        meta = [0x676D73, len(gather), n_in, n_out, KERNEL_VOLUME, REDUCES.index("sum")]
        meta += [tile_rows, SCHEDULES.index(schedule)]
        return GMSPlan(
            num_pairs=len(gather),
            n_in=n_in,
            n_out=n_out,
            num_segments=KERNEL_VOLUME,
            reduce="sum",
            tile_rows=tile_rows,
            schedule=schedule,
            meta=torch.tensor(meta, dtype=torch.int64),
            order=torch.arange(len(gather)),
            gather=torch.from_numpy(gather),
            segment=torch.from_numpy(segment),
            scatter=torch.from_numpy(scatter),
            norm=torch.empty(0, dtype=torch.float64),
            **{n: torch.from_numpy(a) for n, a in zip(names, arrays, strict=True)},
        )

    base = one(g, s, d, kmap.n_in, kmap.n_out, kmap.csr)
    if not orders:
        return _pack(base)
    # aggregate-first: every (s, d) is one group, in the same order
    rows = np.arange(e)
    aggregate = OrderPlan(index=torch.arange(e + 1), plan=one(rows, s, d, e, kmap.n_out))
    # transform-first: the distinct (s, g) rows sorted by (s, g); pair p reads row row_of[p]
    _, by_g = _counting_order(g, kmap.n_in)
    by_sg = by_g[_counting_order(s[by_g], KERNEL_VOLUME)[1]]
    row_of = np.empty(e, np.int64)
    row_of[by_sg] = rows
    gs = g[by_sg]
    n_in = int(gs.max()) + 1 if e else 0
    transform = OrderPlan(index=torch.from_numpy(row_of), plan=one(gs, s[by_sg], rows, n_in, e))
    return _pack(replace(base, aggregate=aggregate, transform=transform))


def features_of(kmap: KernelMap, k: int, m: int, dtype: torch.dtype) -> Features:
    """``fusekit.gms.features(plan, k, m, dtype, has_scale=False)`` of a map, without a plan.

    Equal to the planned features (tests compare them): ``V = U = E`` (every (offset, input)
    and (offset, output) is one pair), per-offset rows are the pairs of each offset.
    """
    from fusekit.gms.features import DTYPE_NAMES, Features

    if str(dtype) not in DTYPE_NAMES:
        raise TypeError(expected("sparse conv", "dtype", " or ".join(DTYPE_NAMES), str(dtype)))
    ptr = kmap.offset_ptr.tolist()
    per_offset = tuple(b - a for a, b in itertools.pairwise(ptr))
    dst_ptr, _, src_ptr, _ = kmap.csr
    degree = (
        np.diff(dst_ptr)
        if dst_ptr is not None
        else np.bincount(kmap.scatter.cpu().numpy(), minlength=kmap.n_out)
    )
    sources = (
        np.diff(src_ptr)
        if src_ptr is not None
        else np.bincount(kmap.gather.cpu().numpy(), minlength=kmap.n_in)
    )
    e = kmap.num_pairs
    return Features(
        pairs=e,
        segments=KERNEL_VOLUME,
        n_in=kmap.n_in,
        n_out=kmap.n_out,
        k=k,
        m=m,
        dtype=DTYPE_NAMES[str(dtype)],
        reduce="sum",
        has_scale=False,
        transform_rows=e,
        aggregate_rows=e,
        gather_rows=int((sources > 0).sum()),
        scatter_rows=int((degree > 0).sum()),
        max_row_pairs=int(degree.max()) if degree.size else 0,
        segment_pairs=per_offset,
        transform_segment_rows=per_offset,
        aggregate_segment_rows=per_offset,
    )


def _packed_plan(
    kmap: KernelMap,
    g: np.ndarray,
    s: np.ndarray,
    d: np.ndarray,
    tile_rows: int,
    blocks: int,
    schedule: str,
) -> GMSPlan:
    """:func:`plan_kernel_map` without orders, written straight into the packed buffer.

    The tiles come from the runs of (offset, block) alone, found by binary search: block ``b``
    starts at output row ``r_b`` (rows' blocks are ``floor(pairs before r * B / E)``), so run
    ``(k, b)`` of offset ``k``'s pairs (output rows ascending) starts at
    ``searchsorted(d[k's pairs], r_b)``: no pass over the pairs. The pairs and the CSRs are
    copied once, by torch (in parallel), into the one int64 buffer ``GMSPlan.packed`` holds.
    """
    import torch

    from fusekit.gms.problem import _MAGIC, _TENSOR_FIELDS, REDUCES, SCHEDULES, GMSPlan

    e, n_in, n_out = len(g), kmap.n_in, kmap.n_out
    dst_ptr, dst_pos, src_ptr, src_pos = kmap.csr
    offset_ptr = kmap.offset_ptr.numpy()
    # destination blocks and the first row of each
    row_block = np.minimum(dst_ptr[:-1] * blocks // max(e, 1), blocks - 1)
    first_row = np.searchsorted(row_block, np.arange(blocks + 1))
    # run (k, b) = positions [at[k, b], at[k, b + 1]) of offset k's pairs
    at = np.empty((KERNEL_VOLUME, blocks + 1), np.int64)
    for k in range(KERNEL_VOLUME):
        lo, hi = int(offset_ptr[k]), int(offset_ptr[k + 1])
        at[k] = lo + np.searchsorted(d[lo:hi], first_row)
        at[k, blocks] = hi
    run_start = at[:, :-1].T.reshape(-1)  # listed by (block, offset)
    run_len = at[:, 1:].T.reshape(-1) - run_start
    per_run = (run_len + tile_rows - 1) // tile_rows
    run_of_tile = np.repeat(np.arange(len(run_start)), per_run)
    j = np.arange(len(run_of_tile)) - np.repeat(np.cumsum(per_run) - per_run, per_run)
    tile_start = run_start[run_of_tile] + j * tile_rows
    run_end = run_start + run_len
    tile_end = np.minimum(tile_start + tile_rows, run_end[run_of_tile])
    tile_segment = run_of_tile % KERNEL_VOLUME
    tile_block = run_of_tile // KERNEL_VOLUME
    n_tiles = len(tile_start)
    block_ptr = np.concatenate([[0], np.cumsum(np.bincount(tile_block, minlength=blocks))])
    if schedule == "pad":
        item_ptr = np.arange(n_tiles + 1)
    else:  # windows of tile_rows pairs within a block (as gms.plan's step 4)
        rows = tile_end - tile_start
        before = np.concatenate([[0], np.cumsum(rows)])  # pairs in the tiles before each tile
        window = (before[:-1] - before[block_ptr[:-1]][tile_block]) // tile_rows
        change = np.ones(n_tiles, bool)
        change[1:] = (tile_block[1:] != tile_block[:-1]) | (window[1:] != window[:-1])
        item_ptr = np.concatenate([np.flatnonzero(change), [n_tiles]])
    sizes = (e, n_in, n_out, KERNEL_VOLUME, REDUCES.index("sum"), tile_rows)
    meta = np.array([_MAGIC, *sizes, SCHEDULES.index(schedule)])
    parts: dict[str, np.ndarray | int] = {
        "order": e,  # filled with arange below
        "gather": g,
        "segment": s,
        "scatter": d,
        "norm": np.empty(0, np.int64),
        "segment_ptr": offset_ptr,
        "tile_segment": tile_segment,
        "tile_start": tile_start,
        "tile_end": tile_end,
        "block_ptr": block_ptr,
        "item_ptr": item_ptr,
        "dst_ptr": dst_ptr,
        "dst_pos": dst_pos,
        "src_ptr": src_ptr,
        "src_pos": src_pos,
    }
    lengths = [8] + [v if isinstance(v, int) else len(v) for v in parts.values()]
    lengths += [0] * (2 * (2 + len(_TENSOR_FIELDS)))  # no aggregate or transform order
    head = [_MAGIC, len(lengths), *lengths]
    buffer = torch.empty(len(head) + sum(lengths), dtype=torch.int64)
    buffer[: len(head)] = torch.tensor(head)
    cursor = len(head)
    buffer[cursor : cursor + 8] = torch.from_numpy(meta)
    cursor += 8
    for value in parts.values():
        n = value if isinstance(value, int) else len(value)
        view = buffer[cursor : cursor + n]
        if isinstance(value, int):
            torch.arange(n, out=view)
        elif n:
            view.copy_(torch.from_numpy(np.ascontiguousarray(value, dtype=np.int64)))
        cursor += n
    return GMSPlan.from_packed(buffer)
