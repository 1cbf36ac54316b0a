r"""The voxel grid of sparse 3-D convolution: its sizes, its linear keys and their limits.

Voxels ``(b, z, y, x)`` live in ``[0, B) x [0, Z) x [0, Y) x [0, X)``; the kernel-map builders
(:mod:`fusekit.gms.kmap`) key them by

.. math::

    \mathrm{key}(b, z, y, x) = ((b Z + z) Y + y) X + x \;<\; B Z Y X

in int64, and store coordinates and input rows as int32 (spconv's indices). So a grid is
accepted only when

* every size (``B``, ``Z``, ``Y``, ``X``) is an int in ``[1, 2^31]`` (a float such as 6.7 is
  refused, never truncated),
* ``B Z Y X < 2^63`` (every key and every partial product of one fits int64: a larger grid
  would wrap, giving wrong pairs, distinct voxels reported as duplicates, or a division by
  zero in the builder),

and a strided convolution's output grid ``floor((S + 2p - 3) / s) + 1`` must pass the same test
(with ``1 <= s, 0 <= p <= 2^31``). :func:`check_indices` checks the voxels against the grid.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numba
import numpy as np
import torch

from fusekit.errors import expected
from fusekit.gms.kmap.geometry import Geometry

#: Largest size of one axis of the grid, batches included (coordinates are int32).
MAX_AXIS = 2**31
#: Grids must have fewer cells ``B Z Y X`` than this (linear keys are int64).
MAX_CELLS = 2**63
#: Largest number of voxels (input rows are stored as int32).
MAX_VOXELS = 2**31 - 1


def _size(where: str, arg: str, value: Any, low: int, high: int, what: str) -> int:
    """``value`` as an int in ``[low, high]``, or a TypeError / ValueError naming ``arg``."""
    if isinstance(value, bool):
        raise TypeError(expected(where, arg, what, repr(value)))
    try:
        n = operator.index(value)
    except TypeError as e:
        raise TypeError(expected(where, arg, what, repr(value))) from e
    if not low <= n <= high:
        raise ValueError(expected(where, arg, what, n))
    return n


def check_grid(
    spatial_shape: Sequence[Any], batch_size: Any, where: str = "sparse conv"
) -> tuple[tuple[int, int, int], int]:
    """The grid's ``(Z, Y, X)`` and ``B`` as ints, after the checks of the module docstring.

    Args:
        spatial_shape: ``(Z, Y, X)``: 3 ints (Python, numpy or 0-d integer tensors).
        batch_size: ``B``, an int.
        where: the caller named in errors.

    Returns:
        ``((Z, Y, X), B)``.

    Raises:
        TypeError: a size or ``batch_size`` that is not an integer.
        ValueError: not 3 sizes, a size outside ``[1, 2^31]``, or ``B Z Y X >= 2^63``.
    """
    what = f"3 ints in [1, {MAX_AXIS}] (Z, Y, X)"
    try:
        sizes = tuple(spatial_shape)
    except TypeError as e:
        raise TypeError(expected(where, "spatial_shape", what, repr(spatial_shape))) from e
    if len(sizes) != 3:
        raise ValueError(expected(where, "spatial_shape", what, repr(spatial_shape)))
    shape = tuple(_size(where, "spatial_shape", n, 1, MAX_AXIS, what) for n in sizes)
    batch = _size(where, "batch_size", batch_size, 1, MAX_AXIS, f"an int in [1, {MAX_AXIS}]")
    cells = batch * shape[0] * shape[1] * shape[2]
    if cells >= MAX_CELLS:
        raise ValueError(
            expected(
                where,
                "spatial_shape",
                f"a grid of fewer than 2**63 cells with batch_size {batch} (int64 voxel keys)",
                f"{shape}: {batch} x {shape[0]} x {shape[1]} x {shape[2]} = {cells}",
            )
        )
    return shape, batch  # type: ignore[return-value]


def output_shape(
    shape: tuple[int, int, int], stride: tuple[int, int, int], padding: tuple[int, int, int]
) -> tuple[int, int, int]:
    """``floor((S + 2p - 3) / s) + 1`` per axis (kernel 3, dilation 1), as spconv's."""
    return tuple((n + 2 * p - 3) // s + 1 for n, s, p in zip(shape, stride, padding, strict=True))  # type: ignore[return-value]


def check_output_grid(
    shape: tuple[int, int, int],
    batch_size: int,
    stride: Sequence[Any],
    padding: Sequence[Any],
    where: str = "sparse conv",
) -> tuple[tuple[int, int, int], tuple[int, int, int], tuple[int, int, int]]:
    """A strided convolution's ``(out_shape, stride, padding)`` after the module's checks.

    Args:
        shape: the checked input ``(Z, Y, X)`` (:func:`check_grid`).
        batch_size: the checked ``B``.
        stride: 3 ints in ``[1, 2^31]``.
        padding: 3 ints in ``[0, 2^31]``.
        where: the caller named in errors.

    Returns:
        The output shape (:func:`output_shape`), stride and padding as ints.

    Raises:
        TypeError: a stride or padding that is not an integer.
        ValueError: not 3 of them, one out of range, an output axis of no voxel
            (``S + 2p < 3``), or an output grid of ``2^63`` cells or more.
    """
    steps: list[tuple[int, int, int]] = []
    for arg, values, low in (("stride", stride, 1), ("padding", padding, 0)):
        what = f"3 ints in [{low}, {MAX_AXIS}]"
        items = tuple(values)
        if len(items) != 3:
            raise ValueError(expected(where, arg, what, repr(values)))
        steps.append(tuple(_size(where, arg, v, low, MAX_AXIS, what) for v in items))  # type: ignore[arg-type]
    s, p = steps
    out = output_shape(shape, s, p)
    _check_output(shape, batch_size, out, f"stride {s}", p, where)
    return out, s, p


def check_geometry_grid(
    shape: tuple[int, int, int], batch_size: int, geometry: Geometry, where: str = "sparse conv"
) -> tuple[int, int, int]:
    """The output grid of ``geometry`` on the checked grid ``shape``, after the module's checks.

    Raises:
        ValueError: an output axis of no voxel, or an output grid of ``2^63`` cells or more
            (naming ``padding``, the argument that usually makes it).
    """
    out = geometry.output_shape(shape)
    g = geometry
    detail = f"kernel_size {g.kernel_size}, stride {g.stride}, dilation {g.dilation}"
    _check_output(shape, batch_size, out, detail, g.padding, where)
    return out


def _check_output(
    shape: tuple[int, int, int],
    batch_size: int,
    out: tuple[int, int, int],
    detail: str,
    padding: tuple[int, int, int],
    where: str,
) -> None:
    """Every output axis holds a voxel and ``B Z' Y' X' < 2^63``, else name ``padding``."""
    cells = batch_size * out[0] * out[1] * out[2]
    if min(out) < 1 or max(out) > MAX_AXIS or cells >= MAX_CELLS:
        raise ValueError(
            expected(
                where,
                "padding",
                f"an output grid of {shape} with sizes in [1, {MAX_AXIS}] and fewer than 2**63 "
                f"cells with batch_size {batch_size} ({detail})",
                f"padding {padding}: output {out}",
            )
        )


def duplicate_message(coords: np.ndarray | torch.Tensor, row: int) -> str:
    """The error of a voxel repeated at ``row`` of ``coords``."""
    voxel = tuple(int(v) for v in coords[row])
    return expected(
        "kernel map", "indices", "distinct voxels (b, z, y, x)", f"{voxel} repeated at row {row}"
    )


@numba.njit(cache=True)  # serial: one read of 16 B per voxel, less than a parallel launch
def _outside(values, bounds):  # type: ignore[no-untyped-def]
    """Whether some row of ``values [N, 4]`` leaves ``[0, bounds)`` (one pass, stops early).

    numpy's ``values.min(0)`` / ``max(0)`` reduce a 4-wide axis 0 in strides (twice per fresh
    forward: the tensor's check and the map's); this loop reads each voxel once. Reference:
    :func:`_outside_reference`.
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

    The grid itself is checked first (:func:`check_grid`: integer sizes, and linear keys that
    fit int64).

    Returns:
        ``spatial_shape`` as 3 ints.

    Raises:
        TypeError: not an integer tensor; sizes that are not integers.
        ValueError: another shape, a grid out of range, more than ``2^31 - 1`` voxels, or a
            voxel outside ``[0, batch_size) x spatial_shape``.
    """
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
