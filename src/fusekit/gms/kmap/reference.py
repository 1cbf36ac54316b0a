r"""The kernel map in plain torch, on any device: sorted keys and a binary search per probe.

There is no GPU hash table: the GPU path of :func:`fusekit.gms.kmap.builder.build` is this sort +
``torch.searchsorted``, run on the device. Each output ``o`` probes, per offset ``k``, the key
of the input voxel it reads (:math:`c_i = s\, c_o - p + d\, r` for offset ``r``; transposed
:math:`c_o = s\, c_i - p + d\, r`; -1 outside the grid or where no input lands); an input
whose key equals the probe is the pair ``(i, k, o)``. The tests compare it with the numba
passes and with spconv's own indice pairs.
"""

from __future__ import annotations

import torch

from fusekit.gms.kmap.geometry import Geometry
from fusekit.gms.kmap.grid import check_geometry_grid, check_indices, duplicate_message
from fusekit.gms.kmap.kernel_map import KernelMap


def probe_pairs(
    keys: torch.Tensor, probes: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pairs ``(i, s, o)`` of a kernel map with ``keys[i] == probes[o, s]``.

    Input ``i`` feeds output ``o`` through offset ``s`` when its key is the one ``o`` probes
    there. One sort of the keys and a binary search per probe (any device; the plain-torch
    kernel map that :func:`build_reference` and ``fusekit.gms.workloads.kernel_map`` share).

    Args:
        keys: ``[N_in]`` int64 distinct keys of the inputs.
        probes: ``[N_out, S]`` int64 key each output reads through each offset; negative where
            the offset leaves the grid.

    Returns:
        ``(gather, segment, scatter)``, int64, sorted by (segment, scatter).
    """
    sorted_keys, order = torch.sort(keys)
    gathers, segments, scatters = [], [], []
    by_offset = probes.T.contiguous()
    for s in range(probes.shape[1]):
        probe = by_offset[s]
        at = torch.searchsorted(sorted_keys, probe).clamp(max=max(len(keys) - 1, 0))
        if len(keys):
            hit = (probe >= 0) & (sorted_keys[at] == probe)
        else:
            hit = torch.zeros_like(probe, dtype=torch.bool)
        gathers.append(order[at[hit]])
        scatters.append(torch.nonzero(hit).flatten())
        segments.append(torch.full((len(scatters[-1]),), s, device=keys.device))
    cat = (torch.cat(gathers), torch.cat(segments), torch.cat(scatters))
    return cat[0].long(), cat[1].long(), cat[2].long()


def build_reference(
    indices: torch.Tensor,
    spatial_shape: tuple[int, int, int],
    batch_size: int,
    stride: tuple[int, int, int] | int = (1, 1, 1),
    padding: tuple[int, int, int] | int = (1, 1, 1),
    subm: bool = True,
    *,
    kernel_size: tuple[int, int, int] | int = 3,
    dilation: tuple[int, int, int] | int = 1,
    transposed: bool = False,
) -> KernelMap:
    """The same map in plain torch on any device: sorted keys, ``searchsorted`` per offset.

    The probes are written here (batch, bounds, and the geometry's stride, padding, dilation
    and kind: :mod:`fusekit.gms.kmap.geometry`); the search is :func:`probe_pairs`, which gms's
    own ``kernel_map`` workload shares.

    Args: as :func:`fusekit.gms.kmap.builder.build`.

    Returns:
        The :class:`KernelMap`, on the device of ``indices``.

    Raises:
        TypeError, ValueError: see :func:`fusekit.gms.kmap.grid.check_indices` and
            :meth:`~fusekit.gms.kmap.geometry.Geometry.create`; duplicate voxels.
    """
    geometry = Geometry.create(kernel_size, stride, padding, dilation, subm, transposed)
    return build_reference_of(indices, spatial_shape, batch_size, geometry)


def build_reference_of(
    indices: torch.Tensor, spatial_shape: tuple[int, int, int], batch_size: int, geometry: Geometry
) -> KernelMap:
    """:func:`build_reference` of a checked :class:`~fusekit.gms.kmap.geometry.Geometry`."""
    spatial_shape = check_indices(indices, spatial_shape, batch_size)
    out_shape = check_geometry_grid(spatial_shape, int(batch_size), geometry)
    dev = indices.device
    shape = torch.tensor(spatial_shape, device=dev)
    stride_t = torch.tensor(geometry.stride, device=dev)
    pad_t = torch.tensor(geometry.padding, device=dev)
    c = indices.long()

    def linear(v: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
        return ((v[:, 0] * sizes[0] + v[:, 1]) * sizes[1] + v[:, 2]) * sizes[2] + v[:, 3]

    keys, order = torch.sort(linear(c, shape))
    if keys.numel() > 1 and bool((keys[1:] == keys[:-1]).any()):
        at = int(torch.nonzero(keys[1:] == keys[:-1])[0, 0])
        raise ValueError(duplicate_message(indices, int(max(order[at], order[at + 1]))))
    v = geometry.volume
    offsets = torch.tensor(geometry.offsets(), device=dev).reshape(-1, 3)
    offsets = offsets * torch.tensor(geometry.dilation, device=dev)  # d r, [V, 3]
    sizes_out = torch.tensor(out_shape, device=dev)
    if geometry.subm:
        out = c
    else:
        if geometry.transposed:  # c_o = s c_i - p + d r
            q = c[:, None, 1:] * stride_t - pad_t + offsets  # [N, V, 3]
            ok = ((q >= 0) & (q < sizes_out)).all(-1)
        else:  # c_o = (c_i + p - d r) / s where divisible
            q = c[:, None, 1:] + pad_t - offsets
            ok = ((q % stride_t) == 0).all(-1) & (q >= 0).all(-1)
            q = torch.div(q, stride_t, rounding_mode="floor")
            ok &= (q < sizes_out).all(-1)
        b = c[:, None, :1].expand(-1, v, 1)
        cand = torch.cat([b, q], -1)[ok]
        out_keys = torch.unique(linear(cand, sizes_out))
        zyx = []
        rest = out_keys
        for n in reversed(out_shape):
            zyx.append(rest % n)
            rest = torch.div(rest, n, rounding_mode="floor")
        out = torch.stack([rest, *reversed(zyx)], 1)
    # the key each output reads through each offset, -1 outside the grid
    if geometry.transposed:  # c_i = (c_o + p - d r) / s where divisible
        t = out[:, None, 1:] + pad_t - offsets  # [N_out, V, 3]
        hit = ((t % stride_t) == 0).all(-1) & (t >= 0).all(-1)
        src = torch.div(t, stride_t, rounding_mode="floor")
    else:  # c_i = s c_o - p + d r
        src = out[:, None, 1:] * stride_t - pad_t + offsets
        hit = torch.ones(src.shape[:2], dtype=torch.bool, device=dev)
    inside = hit & ((src >= 0) & (src < shape)).all(-1)
    b_out = out[:, None, :1].expand(-1, v, 1)
    probes = linear(torch.cat([b_out, src], -1).reshape(-1, 4), shape).reshape(-1, v)
    probes = torch.where(inside, probes, -1)
    gather, segment, scatter = probe_pairs(linear(c, shape), probes)
    counts = torch.bincount(segment, minlength=v)
    return KernelMap(
        gather=gather,
        segment=segment,
        scatter=scatter,
        offset_ptr=torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)]),
        n_in=int(indices.shape[0]),
        out_coords=indices if geometry.subm else out.to(torch.int32),
        out_shape=out_shape,
    )
