r"""COMET's network costs: link latency and energy of a transfer or a collective on a mesh.

A transfer between a level and its ``n`` spatial children, or a collective among ``n`` peers, is
placed on the smallest square sub-mesh that holds the ``n`` nodes (capped by the arch's mesh). Its
hop count ``h`` and data factor ``q`` come from a table keyed by that sub-mesh (COMET's, which
knows only 1x1, 2x2, 4x4 and 16x16: any other shape is :class:`MeshShapeError`, quirk 1):

.. math::

    t_{net} = h \cdot t_{hop} + \frac{s \, q \cdot 8p}{W} t_{queue} + t_{reduce}

with tile size ``s`` elements of ``p`` bytes, channel width ``W`` bits; an all-reduce is a
reduction then a broadcast (both terms), its ``t_reduce = s q n c_op / 16``. Energy is ORION's
router model (:mod:`.orion`) over the same hops and bits.
"""

from __future__ import annotations

import math

import numpy as np

from fusekit.accel.orion import router_energy_pj
from fusekit.accel.tree import Network
from fusekit.errors import FusekitError

f32 = np.float32

#: sub-mesh -> (hops, data factor); COMET uses the same row for every collective kind
HOPS_DATA: dict[tuple[int, int], tuple[int, int]] = {
    (1, 1): (0, 0),
    (2, 2): (2, 2),
    (4, 4): (6, 6),
    (16, 16): (30, 30),
}
REDUCE_CYCLES = {"add": 1.0, "max": 1.0, "mult": 1.0}
REDUCE_PJ = {"add": f32(0.11), "max": f32(0.0025), "mult": f32(0.64)}


class MeshShapeError(FusekitError, ValueError):
    """A collective lands on a sub-mesh COMET's hop table does not hold (it aborts there)."""


def sub_mesh(net: Network, nodes: int) -> tuple[int, int]:
    """The sub-mesh ``nodes`` nodes are placed on (square, capped by the arch's mesh)."""
    return sub_mesh_dims(net.mesh, net.dims[0], net.dims[1], nodes)


def sub_mesh_dims(mesh: bool, x: int, y: int, nodes: int) -> tuple[int, int]:
    """:func:`sub_mesh` of a network given by its mesh flag and dims.

    Scalars only: the compiled twin (:mod:`fusekit.accel.tree_model.compiled_leaf`) compiles
    this same function.
    """
    side = math.ceil(math.sqrt(nodes))
    if not mesh:
        return side, side
    if x >= side and y >= side:
        return side, side
    if x >= side > y:
        return -(-nodes // y), y
    if x < side <= y:
        return y, -(-nodes // y)
    return x, y


def _row(shape: tuple[int, int], generalise: bool) -> tuple[int, int]:
    if shape in HOPS_DATA:
        return HOPS_DATA[shape]
    if not generalise:
        raise MeshShapeError(
            f"a {shape[0]}x{shape[1]} sub-mesh is not in COMET's collective table "
            "(1x1, 2x2, 4x4, 16x16): COMET aborts with std::out_of_range"
        )
    hops = 2 * (max(shape) - 1)  # the table's rule: 2(n-1) hops and data on an n x n mesh
    return hops, hops


def link_latency(
    net: Network, kind: str, tile: int, unique: int, nodes: int, precision_b: float,
    reduce_op: str = "", generalise: bool = False,
) -> int:  # fmt: skip
    """Cycles of a transfer or collective (see the module docstring); 0 for one node."""
    if unique == 0 or nodes == 1:
        return 0
    shape = sub_mesh(net, nodes)
    bits = f32(precision_b * 8)
    w, tq = net.channel_width, net.queuing_delay
    parts = ("reduction", "broadcast") if kind == "allreduce" else (
        ("gather", "broadcast") if kind == "allgather" else (kind,))  # fmt: skip
    router = f32(0)
    queue = f32(0)
    reduce_t = f32(0)
    for i, part in enumerate(parts):
        hops, data = _row(shape, generalise)
        router += f32(hops * net.hop_latency)
        q2d = tile * data
        if part == "scatter" and unique == 1:
            q2d = int(f32(q2d) / f32(nodes))
        if reduce_op and (kind == "reduction" or (kind == "allreduce" and i == 0)):
            reduce_t = f32(q2d * nodes * REDUCE_CYCLES[reduce_op] / 16.0)
        queue += f32(f32(f32(q2d) * bits) / f32(w)) * f32(tq)
    return int(f32(f32(router + queue) + reduce_t))


def link_energy_pj(
    net: Network, kind: str, tile: int, unique: int, nodes: int, precision_b: float,
    reduce_op: str = "", generalise: bool = False,
) -> float:  # fmt: skip
    """Router energy of a transfer or collective (ORION); 0 for one node."""
    if unique == 0 or nodes == 1:
        return 0.0
    shape = sub_mesh(net, nodes)
    parts = ("reduction", "broadcast") if kind == "allreduce" else (
        ("gather", "broadcast") if kind == "allgather" else (kind,))  # fmt: skip
    hops = q2d = 0
    reduce_e = f32(0)
    for i, part in enumerate(parts):
        h, data = _row(shape, generalise)
        hops += h
        q = (tile * data) & 0xFFFFFFFF
        if part == "scatter" and unique == 1:
            q = int(f32(q) / f32(nodes))
        if reduce_op and (kind == "reduction" or (kind == "allreduce" and i == 0)):
            reduce_e = f32(f32((q * nodes) & 0xFFFFFFFF) * REDUCE_PJ[reduce_op])
        q2d += q
    bits = int(f32(q2d) * f32(f32(precision_b) * 8))
    e = router_energy_pj(net.channel_width, hops, net.queuing_delay, bits, shape[0])
    return float(f32(f32(e) + reduce_e))
