"""The public builder of a kernel map: the numba passes on the CPU, sort + search elsewhere."""

from __future__ import annotations

import torch

from fusekit.gms.kmap.hits import find_hits
from fusekit.gms.kmap.kernel_map import KernelMap
from fusekit.gms.kmap.reference import build_reference


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
        TypeError, ValueError: see :func:`fusekit.gms.kmap.grid.check_indices`; duplicate
            voxels.
    """
    stride, padding = ((1, 1, 1), (1, 1, 1)) if subm else (tuple(stride), tuple(padding))  # type: ignore[assignment]
    if isinstance(indices, torch.Tensor) and indices.device.type != "cpu":
        return build_reference(indices, spatial_shape, batch_size, stride, padding, subm)
    return find_hits(indices, spatial_shape, batch_size, stride, padding, subm).kernel_map()
