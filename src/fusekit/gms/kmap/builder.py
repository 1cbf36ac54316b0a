"""The public builder of a kernel map: numba on the CPU, sort + search elsewhere."""

from __future__ import annotations

import torch

from fusekit.gms.kmap.general import build_general
from fusekit.gms.kmap.geometry import Geometry
from fusekit.gms.kmap.hits import find_hits
from fusekit.gms.kmap.kernel_map import KernelMap
from fusekit.gms.kmap.reference import build_reference_of


def build(
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
    """The kernel map of a sparse convolution (CPU: numba hash; other devices: sort + search).

    On the CPU, 3x3x3 kernels of dilation 1 (not transposed) run the two-pass row-merge builder
    (:func:`fusekit.gms.kmap.hits.find_hits`, with the mirrored-offset pass for SubM on sorted
    voxels); every other geometry runs :func:`fusekit.gms.kmap.general.build_general`.

    Args:
        indices: ``[N, 4]`` int32/int64 distinct voxels ``(b, z, y, x)``.
        spatial_shape: ``(Z, Y, X)``.
        batch_size: batches.
        stride: per axis, or one int (ignored for ``subm``).
        padding: per axis, or one int (ignored for ``subm``: ``(K // 2) d``).
        subm: submanifold (outputs on the inputs) or a regular convolution.
        kernel_size: ``K`` per axis in ``[1, 7]`` (odd for ``subm``).
        dilation: per axis.
        transposed: a transposed convolution (:mod:`fusekit.gms.kmap.geometry`).

    Returns:
        The :class:`KernelMap`, on the device of ``indices``.

    Raises:
        TypeError, ValueError: see :func:`fusekit.gms.kmap.grid.check_indices` and
            :meth:`~fusekit.gms.kmap.geometry.Geometry.create`; duplicate voxels.
    """
    geometry = Geometry.create(kernel_size, stride, padding, dilation, subm, transposed)
    return build_of(indices, spatial_shape, batch_size, geometry)


def build_of(
    indices: torch.Tensor, spatial_shape: tuple[int, int, int], batch_size: int, geometry: Geometry
) -> KernelMap:
    """:func:`build` of a checked :class:`~fusekit.gms.kmap.geometry.Geometry`."""
    if isinstance(indices, torch.Tensor) and indices.device.type != "cpu":
        return build_reference_of(indices, spatial_shape, batch_size, geometry)
    if geometry.classic:
        g = geometry
        return find_hits(
            indices, spatial_shape, batch_size, g.stride, g.padding, g.subm
        ).kernel_map()
    return build_general(indices, spatial_shape, batch_size, geometry)
