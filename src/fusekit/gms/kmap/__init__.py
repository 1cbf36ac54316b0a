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

Pipeline (each a module of this package):

* ``grid``: the grid's sizes and the voxels checked (int64 keys, int32 rows);
* ``keys``: voxels as sorted keys, runs of one row, a hash table of rows;
* ``hits``: pass 1 (numba), :func:`find_hits`: every pair found and counted per chunk, so the
  gms selector chooses the configuration (:meth:`Hits.features`) before any pair is written;
* ``pairs``: pass 2 (numba), :meth:`Hits.plan` / :meth:`Hits.kernel_map`: every pair written
  once, straight into the chosen packed gms plan or into a :class:`KernelMap`;
* ``reference``: :func:`build_reference`, plain torch on any device (also the GPU path);
* ``builder``: :func:`build`, pass 1 and pass 2 on the CPU, the reference elsewhere;
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
    "Hits": "pairs",
    "KernelMap": "kernel_map",
    "build": "builder",
    "build_reference": "reference",
    "check_grid": "grid",
    "check_indices": "grid",
    "check_output_grid": "grid",
    "features_of": "plan",
    "find_hits": "hits",
    "output_shape": "grid",
    "plan_kernel_map": "plan",
    "probe_pairs": "reference",
}

__all__ = sorted(_WHERE)


__getattr__ = lazy_getattr(__name__, _WHERE)
