r"""Kernel maps of 3-D sparse convolution: which input voxel feeds which output voxel, per offset.

For a kernel of size ``K``, stride ``s``, padding ``p`` and dilation ``d`` (per axis), output
voxel ``o`` reads input voxel ``i`` through kernel offset ``r = (r_z, r_y, r_x)`` when

.. math::

    c_i = s \, c_o - p + d\, r \qquad (\text{index } (r_z K_y + r_y) K_x + r_x)

in the same batch, which is spconv's convention (``weight[:, rz, ry, rx, :]`` is that offset).
Submanifold maps have outputs on the inputs, ``s = 1`` and ``p = (K // 2) d``; transposed maps
swap the roles (:math:`c_o = s\, c_i - p + d\, r`); :mod:`~fusekit.gms.kmap.geometry` has them
all. A strided map's outputs are every ``o`` inside the output shape that some input reaches,
sorted by ``(b, z, y, x)``.

The map is a :class:`fusekit.gms.GMSProblem`: gather ``g = i``, segment ``s = k``, scatter
``d = o``, pairs sorted by (segment, output row), the order the gms plan wants.

Pipeline (each a module of this package):

* ``grid``: the grid's sizes and the voxels checked (int64 keys, int32 rows);
* ``keys``: voxels as sorted keys, runs of one row, a hash table of rows;
* ``hits``: pass 1 (numba), :func:`find_hits`: every pair found and counted per chunk, so the
  gms selector chooses the configuration (:meth:`Hits.features`) before any pair is written;
* ``pairs``: pass 2 (numba), :meth:`Hits.plan` / :meth:`Hits.kernel_map`: every pair written
  once, straight into the chosen packed gms plan or into a :class:`KernelMap`;
* ``general``: :func:`build_general`, numba for every other geometry (hash of keys, two passes);
* ``reference``: :func:`build_reference`, plain torch on any device and geometry (the GPU path);
* ``builder``: :func:`build`, the numba builders on the CPU, the reference elsewhere;
* ``plan``: :func:`plan_kernel_map` and :func:`features_of` of a built map, in O(E).

Importing this package imports neither torch nor numba; the names below load on first use.
"""

from __future__ import annotations

from fusekit.lazy import lazy_getattr

#: Public name -> the module of this package that defines it.
_WHERE = {
    "KERNEL_VOLUME": "primitives",
    "MAX_AXIS": "grid",
    "MAX_CELLS": "grid",
    "MAX_VOXELS": "grid",
    "Geometry": "geometry",
    "Hits": "pairs",
    "KernelMap": "kernel_map",
    "build": "builder",
    "build_general": "general",
    "build_of": "builder",
    "build_reference": "reference",
    "build_reference_of": "reference",
    "check_grid": "grid",
    "check_indices": "grid",
    "check_geometry_grid": "grid",
    "check_output_grid": "grid",
    "features_of": "plan",
    "find_hits": "hits",
    "output_shape": "grid",
    "plan_kernel_map": "plan",
    "probe_pairs": "reference",
}

__all__ = sorted(_WHERE)


__getattr__ = lazy_getattr(__name__, _WHERE)
