r"""Stage 4 of a leaf tile node, compiled: :meth:`.steady.SteadyState._leaf` over flat arrays.

The first piece of a compiled twin of the tree model (numba, ``@njit(cache=True)``): a leaf (a
tile node right above an op) is flattened in Python into integer and float arrays
(:func:`flatten_arch` once per arch and :class:`~fusekit.accel.compat.Compat`,
:func:`flatten_leaf` per leaf), and :func:`leaf_kernel` computes from them what the reference
computes: the leaf's cycles, its accesses, its per-level merged costs as far as its parents
read them, its ramp tables and its reuse counts. :func:`leaf_result` wraps it into the
reference's :data:`.steady.LeafResult`; the results are bit-identical (tested leaf by leaf,
``tests/accel/test_compiled_leaf.py``).

Array layout (levels by index, tensors by slot; the column names are this module's constants):

* levels are indexed in rank order (COMET's creation order), so "sorted by rank" is "sorted by
  index"; ``FlatArch.lv[level, LV_*]`` holds a level's numbers (kind, ports, bandwidths,
  compute attributes), ``FlatArch.simd[level, op type]`` one SIMD instruction's cycles of an
  op type (``-1``: not a SIMD op there; the op types are ``FlatArch.op_types``);
* networks are rows of ``FlatArch.net[net, NET_*]`` (ints) and ``FlatArch.net_pj[net, PJ_*]``
  (ORION's per-network coefficients, :func:`router_pj_coefficients`);
  ``FlatArch.net_of[target, child]`` is the network between two levels (the target's link
  network when they are one level), ``-1`` for none;
* a tile node's tensors are slots, rows of ``slots[slot, SL_*]``: tensor and tag, target and
  child level, precision, read-write and read-modify-write, iterations, time steps, and its
  :class:`~.records.MoveRow` (``n``, ``period``, the ``moved`` and ``kept`` moves). ``SL_KEY``
  numbers the node's distinct (tensor, tag) keys: the per-key tables (ramps, reuse) are rows
  of ``[key, TB_*]``. The whole tree will concatenate its nodes' slots, a node table giving
  each node's first slot and count;
* an op is one vector ``op``: ``OP_*`` header (type, unit level, number of primitive dims and
  of reduction factors) then the primitive's sizes (its dict order) and the reduction factors
  (``red_dims`` order).

The kernel's outputs: ``head[H_*]`` (error, cycles, iterations, period folded over), one access
per slot then the compute unit's (``acc[row, AC_*]``, ``acc_pj[row, AP_*]``: the fields
:mod:`.energy` reads), per slot its compute and transfer cycles and ramps (``slot_out[slot,
SO_*]``, ``slot_pj``), per level and port the merged cost (``lvl[level, port, LO_*]``) and per
key the tables (``tab[key, TB_*]``).

The formulas, as in the reference (:mod:`.compute`, :mod:`.transfers`, :mod:`fusekit.accel.noc`,
:mod:`.merge`). One primitive of the op takes ``c`` cycles on its unit (systolic:
``folds (2R + C + T - 2)``; SIMD: cycles per instruction times
:math:`\lceil |prim| / (width \cdot T) \rceil`; GEMM unit: start-up plus latency per 512 MACs).
A tensor's transfer of ``u`` tiles of ``s`` elements of ``p`` bits takes

.. math::

    t = \max\Big(\Big\lceil \frac{k u s p / 8}{BW_{target}} \Big\rceil,
                 \Big\lceil \frac{s p / 8}{BW_{child}} \Big\rceil\Big) + t_{net}

(float32, as COMET). With ``n`` iterations of which ``a`` move a tile, the reuse is
``f = n // a`` and every ``f``-th iteration ``i`` (every one where the tensors' iterations
differ) stalls by ``t_i - w_i``, ``w_i`` the compute window ``c`` summed over the ``f``
iterations from ``i``; the first read is the ramp-up, the write at ``n - f`` the ramp-down, and
the stalls shift by one iteration (a write one later, a read one earlier). Per target level and
port the stalls merge (:mod:`.merge`: a transfer's excess over its window adds to the level's
stall; a hidden transfer uses up the windows of the level's later tensors on that port), and

.. math:: cycles = n c + \max ramp_{up} + \max ramp_{down} + \sum_i \max_{level, port} stall_i

(32-bit wrap). A leaf whose transfers repeat every ``L`` iterations is evaluated at ``2L`` and
``3L`` iterations and every count ``x`` extended, :math:`x(n) = x(2L) + (n/L - 2)(x(3L) -
x(2L))` (:meth:`.steady.SteadyState.leaf_period`), or walked whole where the total reaches
``2**32`` or the ramp-up tables of the two runs differ in their keys.

What is not here: the per-iteration vectors of the merged costs (no parent reads a leaf's;
:func:`leaf_result` leaves them empty, as the reference's folded leaves do), the compulsory
stalls (a leaf hides every transfer) and the ports a spatial parent's children share (a leaf
has no children). The :class:`~fusekit.accel.compat.Compat` switches a leaf reads:
``simd_constants`` (SIMD cycles), ``mesh_table`` (the network's sub-mesh table) and
``port_overwrite`` (:func:`.merge.node_cycles`); the others act above the leaves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
import numpy.typing as npt

from fusekit.accel.compat import Compat
from fusekit.accel.noc import MeshShapeError, sub_mesh_dims
from fusekit.accel.orion import (
    BUFFER_DEPTH,
    bit_read_pj,
    bit_write_pj,
    crossbar_ctrl_pj,
    crossbar_pj,
    dff_pj,
    wire_clock_pj,
    wire_pj,
    word_line_pj,
)
from fusekit.accel.tree import Hierarchy, Level, Network, TreeNode
from fusekit.accel.tree_model.compute import SIMD_CYCLES, simd_op_cycles
from fusekit.accel.tree_model.records import Access, Cost, MoveRow, Nest, TreeModelError
from fusekit.accel.tree_model.steady import LeafResult, PerTensor

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]

# --- the layout (see the module docstring) -----------------------------------------------------

#: ``FlatArch.lv`` columns.
LV_RANK, LV_COMPUTE, LV_KIND, LV_PORTS = 0, 1, 2, 3
LV_CHILD_READ_BW, LV_CHILD_WRITE_BW, LV_PARENT_READ_BW, LV_PARENT_WRITE_BW = 4, 5, 6, 7
LV_ARRAY_ROWS, LV_ARRAY_COLS, LV_SA_ROWS, LV_SA_COLS = 8, 9, 10, 11
LV_COMPUTE_WIDTH, LV_STARTUP, LV_COMPUTE_LATENCY, LV_INSTANCES, LV_SHARED_PORTS = 12, 13, 14, 15, 16
LV_COLS = 17
#: ``LV_KIND`` values: COMET's compute classes by the level's spec name, or none of them.
KIND_OTHER, KIND_SYSTOLIC, KIND_SIMD, KIND_GEMM = 0, 1, 2, 3
_KINDS = {"SystolicArray": KIND_SYSTOLIC, "VSIMD": KIND_SIMD, "GEMM": KIND_GEMM}

#: ``FlatArch.net`` columns.
NET_MESH, NET_DIM_X, NET_DIM_Y, NET_PORT_BW, NET_HOP_LATENCY = 0, 1, 2, 3, 4
NET_BROADCAST, NET_REDUCTION, NET_QUEUING, NET_CHANNEL = 5, 6, 7, 8
NET_COLS = 9
#: ``FlatArch.net_pj`` columns: ORION's terms that depend on the channel width alone.
PJ_WIDTH, PJ_WIRE, PJ_CLOCK, PJ_DFF, PJ_READ, PJ_WRITE = 0, 1, 2, 3, 4, 5
PJ_XBAR, PJ_XBAR_CTRL, PJ_OUT, PJ_OUT_CLK = 6, 7, 8, 9
PJ_COLS = 10
#: The local constants of :func:`fusekit.accel.orion.router_energy_pj` (wire model).
ORION_K, ORION_M, ORION_N, ORION_LENGTH, ORION_CW = 8.1, 2.0, 1.0, 2.0, 4.0 * 2.67339e-13

#: ``slots`` columns (one row per tensor of a tile node).
SL_TID, SL_TAG, SL_KEY, SL_TARGET, SL_CHILD, SL_SCALE, SL_RMW, SL_RW = 0, 1, 2, 3, 4, 5, 6, 7
SL_DEPENDENT, SL_ITERS, SL_SP_ITERS, SL_REL_TS, SL_N, SL_PERIOD = 8, 9, 10, 11, 12, 13
SL_MOVED_TILE, SL_MOVED_UNIQUE, SL_MOVED_COUNT = 14, 15, 16
SL_KEPT_TILE, SL_KEPT_UNIQUE, SL_KEPT_COUNT = 17, 18, 19
SL_COLS = 20

#: ``op`` header; the primitive's sizes follow, then the reduction factors.
OP_TYPE, OP_UNIT, OP_N_PRIM, OP_N_RED = 0, 1, 2, 3
OP_HEAD = 4

#: ``head`` entries of the kernel's result.
H_ERROR, H_ERROR_SLOT, H_ERROR_A, H_ERROR_B, H_TOTAL, H_N_IT, H_PERIOD = 0, 1, 2, 3, 4, 5, 6
H_SIZE = 7
#: ``H_ERROR`` values (the reference's exceptions, :func:`raise_error`).
ERR_NONE, ERR_NOT_COMPUTE, ERR_NO_MODEL, ERR_NOT_SIMD, ERR_NO_REDUCTION = 0, 1, 2, 3, 4
ERR_NOT_TILE, ERR_NO_NETWORK, ERR_MESH, ERR_NOT_FINITE, ERR_EMPTY = 5, 6, 7, 8, 9

#: ``acc`` columns (a row per slot, then the compute unit's); ``acc_pj`` columns.
AC_LEVEL, AC_COUNT, AC_TILE, AC_PRECISION, AC_RW, AC_AT_TARGET = 0, 1, 2, 3, 4, 5
AC_COMPUTE, AC_TID, AC_RMW, AC_PROJ, AC_TAG = 6, 7, 8, 9, 10
AC_COLS = 11
AP_NOC, AP_MAC = 0, 1
AP_COLS = 2

#: ``slot_out`` columns: one primitive's cycles, the moved and kept transfers' cycles (memory
#: plus network), the tensor's reuse, ramps and cumulated transfer and stall cycles.
SO_CYCLES, SO_MOVED, SO_KEPT, SO_REUSE, SO_RAMP_UP, SO_RAMP_DOWN, SO_CUMM, SO_CUMM_STALL = range(8)
SO_COLS = 8
#: ``slot_pj`` columns: the router energy of the moved and the kept transfer.
SP_MOVED, SP_KEPT = 0, 1

#: ``lvl[level, port]`` columns: the merged cost (``LO_PRESENT``: the level is a target).
LO_PRESENT, LO_COMPUTE_TIME, LO_REUSE, LO_CUMM, LO_RAMP_UP, LO_RAMP_DOWN = range(6)
LO_COLS = 6

#: ``tab[key]`` columns: the ramp-up and ramp-down tables (whether the key is in, its position
#: in the dict, its value) and the counted reuse and moving iterations.
TB_UP_HAS, TB_UP_POS, TB_UP, TB_DOWN_HAS, TB_DOWN_POS, TB_DOWN, TB_REUSE, TB_ACTUAL = range(8)
TB_COLS = 8

#: COMET's energy of one MAC (:data:`.compute.MAC_PJ`).
MAC_PJ = 0.2296
#: A leaf is folded from this many periods and iterations (:mod:`.steady`'s thresholds).
FOLD_MIN_PERIODS = 6
FOLD_MIN_ITERATIONS = 32
_WRAP = 0xFFFFFFFF


# --- flattening (Python) -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FlatArch:
    """A hierarchy's levels and networks as arrays (module docstring), for one ``Compat``."""

    names: tuple[str, ...]
    index: dict[str, int]
    levels: tuple[Level, ...]
    lv: Ints
    simd: Ints
    op_types: tuple[str, ...]
    net_of: Ints
    net: Ints
    net_pj: Floats
    generalise: bool
    port_overwrite: bool


@dataclass(frozen=True, slots=True)
class FlatLeaf:
    """One leaf as arrays: its slots, its op, and the names the arrays number."""

    node: TreeNode
    slots: Ints
    op: Ints
    tags: tuple[str, ...]
    keys: tuple[tuple[int, str], ...]


def router_pj_coefficients(channel: int) -> list[float]:
    """ORION's terms of a ``channel``-bit network that do not depend on the transfer.

    :func:`fusekit.accel.orion.router_energy_pj` multiplies each by the active cycles and the
    routers or links; the kernel does the same products in the same order (bit-identical).
    """
    w = float(channel)
    k, m, n, length, cw = ORION_K, ORION_M, ORION_N, ORION_LENGTH, ORION_CW
    wl = word_line_pj(w, BUFFER_DEPTH, w, cw)
    out = [0.0] * PJ_COLS
    out[PJ_WIDTH] = w
    out[PJ_WIRE] = wire_pj(length, k, m, n, cw)
    out[PJ_CLOCK] = wire_clock_pj(m, length, cw)
    out[PJ_DFF] = dff_pj(m, length)
    out[PJ_READ] = wl + bit_read_pj(BUFFER_DEPTH, cw) * w
    out[PJ_WRITE] = wl + bit_write_pj(BUFFER_DEPTH, cw) * w
    out[PJ_XBAR] = crossbar_pj(w, 5, 5, cw)
    out[PJ_XBAR_CTRL] = crossbar_ctrl_pj(w, 5, 5, cw)
    out[PJ_OUT] = dff_pj(1, w, 1.0)
    out[PJ_OUT_CLK] = wire_clock_pj(1, w, cw)
    return out


def _level_row(lv: Level) -> list[int]:
    a = lv.attrs
    row = [0] * LV_COLS
    row[LV_RANK] = lv.rank
    row[LV_COMPUTE] = int(lv.is_compute)
    row[LV_KIND] = _KINDS.get(lv.kind, KIND_OTHER)
    row[LV_PORTS] = int(a.get("ports", 1))
    row[LV_CHILD_READ_BW] = lv.bw("child_read_bw")
    row[LV_CHILD_WRITE_BW] = lv.bw("child_write_bw")
    row[LV_PARENT_READ_BW] = lv.bw("parent_read_bw")
    row[LV_PARENT_WRITE_BW] = lv.bw("parent_write_bw")
    row[LV_ARRAY_ROWS] = int(a.get("array_rows", 32))
    row[LV_ARRAY_COLS] = int(a.get("array_cols", 32))
    row[LV_SA_ROWS] = int(a.get("num_sa_rows", 1))
    row[LV_SA_COLS] = int(a.get("num_sa_cols", 1))
    row[LV_COMPUTE_WIDTH] = int(a.get("computeWidth", 8))
    row[LV_STARTUP] = int(a.get("startupLatency", 0))
    row[LV_COMPUTE_LATENCY] = int(a.get("computeLatency", 0))
    row[LV_INSTANCES] = lv.instances
    row[LV_SHARED_PORTS] = int(bool(a.get("parent_child_ports_shared", False)))
    return row


def _net_row(net: Network) -> list[int]:
    row = [0] * NET_COLS
    row[NET_MESH] = int(net.mesh)
    row[NET_DIM_X], row[NET_DIM_Y] = net.dims
    row[NET_PORT_BW] = net.port_bw
    row[NET_HOP_LATENCY] = net.hop_latency
    row[NET_BROADCAST] = int(net.broadcast)
    row[NET_REDUCTION] = int(net.reduction)
    row[NET_QUEUING] = net.queuing_delay
    row[NET_CHANNEL] = net.channel_width
    return row


def _simd_cycles(lv: Level, op_type: str, arch_costs: bool) -> int:
    """:func:`.compute.simd_op_cycles`, or ``-1`` where it raises (not a SIMD op)."""
    try:
        return simd_op_cycles(lv, op_type, arch_costs)
    except (TreeModelError, ValueError):
        return -1


def flatten_arch(arch: Hierarchy, compat: Compat) -> FlatArch:
    """The arrays of ``arch`` (module docstring) and the switches of ``compat`` a leaf reads.

    Raises:
        ValueError: two levels share a rank (the kernel orders levels by index).
    """
    levels = tuple(sorted(arch.levels.values(), key=lambda lv: lv.rank))
    if len({lv.rank for lv in levels}) != len(levels):
        raise ValueError("compiled leaf: the levels' ranks are not distinct")
    names = tuple(lv.name for lv in levels)
    index = {name: i for i, name in enumerate(names)}
    types = set(SIMD_CYCLES) | {"rowsum", "rowmax"}
    for lv in levels:
        given = lv.attrs.get("op_cycles")
        if isinstance(given, dict):
            types |= {str(t) for t in given}
    op_types = tuple(sorted(types))
    arch_costs = not compat.simd_constants
    simd = [[_simd_cycles(lv, t, arch_costs) for t in op_types] for lv in levels]
    nets: list[Network] = []
    net_of = np.full((len(levels), len(levels)), -1, dtype=np.int64)
    for i, lv in enumerate(levels):
        pairs = [(index[c], n) for c, n in lv.child_nets.items() if c in index]
        if lv.link_net is not None:
            pairs.append((i, lv.link_net))
        for j, net in pairs:
            net_of[i, j] = len(nets)
            nets.append(net)
    return FlatArch(
        names=names,
        index=index,
        levels=levels,
        lv=np.array([_level_row(lv) for lv in levels], dtype=np.int64).reshape(-1, LV_COLS),
        simd=np.array(simd, dtype=np.int64).reshape(len(levels), len(op_types)),
        op_types=op_types,
        net_of=net_of,
        net=np.array([_net_row(n) for n in nets], dtype=np.int64).reshape(-1, NET_COLS),
        net_pj=np.array(
            [router_pj_coefficients(n.channel_width) for n in nets], dtype=np.float64
        ).reshape(-1, PJ_COLS),
        generalise=not compat.mesh_table,
        port_overwrite=compat.port_overwrite,
    )


def flatten_slots(
    node: TreeNode, nest: Nest, rows: list[MoveRow], flat: FlatArch
) -> tuple[Ints, tuple[str, ...], tuple[tuple[int, str], ...]]:
    """A tile node's tensors as slots (``[slot, SL_*]``), its tags and its (tensor, tag) keys."""
    tags: dict[str, int] = {}
    keys: dict[tuple[int, str], int] = {}
    index = flat.index
    out = []
    for t, tid in enumerate(node.tensors):
        tag = node.tags[t]
        row = rows[t]
        moved, kept = row.moved, row.kept
        out.append((
            tid, tags.setdefault(tag, len(tags)), keys.setdefault((tid, tag), len(keys)),
            index[node.targets[t]], index[node.childs[t]], node.scale[t], node.rmw[t],
            nest.rw[t], nest.dependent[t], nest.iters[t], nest.sp_iters[t], nest.rel_ts[t],
            row.n, row.period, moved.tile, moved.unique, moved.count,
            kept.tile, kept.unique, kept.count,
        ))  # fmt: skip
    slots = np.array(out, dtype=np.int64).reshape(-1, SL_COLS)
    return slots, tuple(tags), tuple(keys)


def flatten_op(op: TreeNode, unit: int, flat: FlatArch) -> Ints:
    """An op as one vector: header, the primitive's sizes, the reduction factors."""
    types = flat.op_types
    kind = types.index(op.op_type) if op.op_type in types else -1
    prim = list(op.primitive.values())
    red = [op.red_factors[d] for d in op.red_dims]
    return np.array([kind, unit, len(prim), len(red), *prim, *red], dtype=np.int64)


def flatten_leaf(node: TreeNode, nest: Nest, rows: list[MoveRow], flat: FlatArch) -> FlatLeaf:
    """A leaf tile node (``node.is_leaf_tile``) with its nest and moves, as arrays."""
    slots, tags, keys = flatten_slots(node, nest, rows, flat)
    op = flatten_op(node.children[0], flat.index[node.childs[0]], flat)
    return FlatLeaf(node, slots, op, tags, keys)


# --- the kernel: compute cycles (compute.py) -----------------------------------------------------


@numba.njit(cache=True)
def compute_cycles(lv, simd, op):  # type: ignore[no-untyped-def]
    """:func:`.compute.compute_cycles` of ``op`` on its unit: ``(error, cycles)``."""
    unit = op[OP_UNIT]
    n_prim, n_red = op[OP_N_PRIM], op[OP_N_RED]
    prim = op[OP_HEAD : OP_HEAD + n_prim]
    red = op[OP_HEAD + n_prim : OP_HEAD + n_prim + n_red]
    kind = lv[unit, LV_KIND]
    if kind == KIND_SYSTOLIC:  # systolic_cycles
        rows, cols = lv[unit, LV_ARRAY_ROWS], lv[unit, LV_ARRAY_COLS]
        if n_red == 0:
            return ERR_NO_REDUCTION, 0
        t = red[n_red - 1]
        drop = -1  # the first of the reversed sizes equal to t
        for j in range(n_prim - 1, -1, -1):
            if prim[j] == t:
                drop = j
                break
        if drop < 0:
            return ERR_NOT_TILE, t
        pes = (rows * lv[unit, LV_SA_ROWS], cols * lv[unit, LV_SA_COLS])
        folds = 1
        i = 0
        for j in range(n_prim - 1, -1, -1):
            if j == drop:
                continue
            if i == 2:
                break
            folds *= math.ceil(prim[j] / pes[i])
            i += 1
        return ERR_NONE, folds * (2 * rows + cols + t - 2)
    if kind == KIND_SIMD:  # simd_op_cycles x simd_instructions
        per = simd[unit, op[OP_TYPE]] if op[OP_TYPE] >= 0 else -1
        if per < 0:
            return ERR_NOT_SIMD, 0
        width = lv[unit, LV_COMPUTE_WIDTH]
        r = np.float32(1)
        for j in range(n_red):
            r = np.float32(r * np.float32(red[j]))
        elems = 1
        for j in range(n_prim):
            elems *= prim[j]
        lanes = np.float32(np.float32(width) * r)
        return ERR_NONE, per * math.ceil(np.float32(np.float32(elems) / lanes))
    if kind == KIND_GEMM:  # gemm_unit_cycles
        if n_prim != 3:
            return ERR_NONE, lv[unit, LV_COMPUTE_LATENCY]
        lat = lv[unit, LV_STARTUP]
        if n_red:
            lat += _gemm_extra(red[0] // 256)
        macs = prim[0] * prim[1] * prim[2]
        return ERR_NONE, lat + macs // 512 * lv[unit, LV_COMPUTE_LATENCY]
    return ERR_NO_MODEL, 0


@numba.njit(cache=True, inline="always")
def _gemm_extra(ratio):  # type: ignore[no-untyped-def]
    """The GEMM unit's start-up cycles by reduction factor / 256 (16: 16, 8: 12, 4: 8, 2: 6)."""
    if ratio == 16:
        return 16
    if ratio == 8:
        return 12
    if ratio == 4:
        return 8
    if ratio == 2:
        return 6
    return 0


# --- the kernel: one transfer (transfers.py, noc.py, orion.py) -----------------------------------


@numba.njit(cache=True, inline="always")
def _ceil_f32(x):  # type: ignore[no-untyped-def]
    """``math.ceil`` of a float32, ``(ok, value)``: not ok where Python raises (inf, nan)."""
    if not math.isfinite(x):
        return False, 0
    return True, math.ceil(x)


@numba.njit(cache=True)
def memory_cycles(lv, net, target, child, n_id, rw, rmw, scale, tile, unique, count):  # type: ignore[no-untyped-def]
    """:func:`.transfers._memory_cycles`: ``(ok, cycles)``, the slower of target and child."""
    size, num, nodes = tile, unique, count
    ports = lv[target, LV_PORTS]
    used = max(min(num, ports), 1)
    if rw:
        tbw = lv[target, LV_CHILD_WRITE_BW]
        num = max(num, 1)
    else:
        tbw = lv[target, LV_CHILD_READ_BW]
    if used < ports:
        tbw = tbw // ports * used
    port_bw = net[n_id, NET_PORT_BW]
    if lv[child, LV_COMPUTE]:
        cbw = port_bw
    else:
        cbw = lv[child, LV_PARENT_READ_BW] if rw else lv[child, LV_PARENT_WRITE_BW]
    tbw = min(tbw, used * port_bw)
    cbw = min(cbw, port_bw)
    support = net[n_id, NET_REDUCTION] if rw else net[n_id, NET_BROADCAST]
    scatter = 1 if support or num == 0 else -(-nodes // num)
    moved = np.float32(np.float32(np.float32(scatter) * np.float32(num)) * np.float32(size))
    ok, t_target = _ceil_f32(np.float32(moved * scale) / np.float32(tbw))
    t_child = 0
    if num != 0:
        per_child = np.float32(np.float32(size) * scale)
        ok_c, t_child = _ceil_f32(np.float32(per_child / np.float32(cbw)))
        ok = ok and ok_c
    if rw and rmw:
        rbw = lv[target, LV_CHILD_READ_BW]
        if used < ports:
            rbw = rbw // ports * used
        ok_r, t_read = _ceil_f32(np.float32(moved * scale) / np.float32(rbw))
        ok = ok and ok_r
        t_target += t_read
    return ok, max(t_target, t_child)


_sub_mesh_dims = numba.njit(cache=True, inline="always")(sub_mesh_dims)


@numba.njit(cache=True, inline="always")
def sub_mesh(net, n_id, nodes):  # type: ignore[no-untyped-def]
    """:func:`fusekit.accel.noc.sub_mesh` of network row ``n_id`` (its function, compiled)."""
    return _sub_mesh_dims(net[n_id, NET_MESH] != 0, net[n_id, NET_DIM_X], net[n_id, NET_DIM_Y],
                          nodes)  # fmt: skip


@numba.njit(cache=True, inline="always")
def hops_data(sx, sy, generalise):  # type: ignore[no-untyped-def]
    """:func:`fusekit.accel.noc._row`: ``(ok, hops, data)`` of a sub-mesh."""
    if sx == sy and (sx == 1 or sx == 2 or sx == 4 or sx == 16):
        hops = 0 if sx == 1 else (2 if sx == 2 else (6 if sx == 4 else 30))
        return True, hops, hops
    if not generalise:
        return False, 0, 0
    hops = 2 * (max(sx, sy) - 1)
    return True, hops, hops


@numba.njit(cache=True)
def router_pj(pj, hops, t_queue, q_bits, edge):  # type: ignore[no-untyped-def]
    """:func:`fusekit.accel.orion.router_energy_pj` from the network's coefficients ``pj``."""
    w = pj[PJ_WIDTH]
    stream = t_queue * q_bits / w
    links = edge * (edge * 2 - 2)
    routers = edge * edge
    wire = pj[PJ_WIRE] * (hops + stream) * links
    clock = pj[PJ_CLOCK] * 2 * routers
    dff = pj[PJ_DFF] * (hops + stream) * links
    read = pj[PJ_READ] * stream * routers
    write = pj[PJ_WRITE] * stream * routers
    switch = pj[PJ_XBAR] * w * hops * 3 * routers
    switch_ctrl = pj[PJ_XBAR_CTRL] * (hops * 3 + stream) * routers
    out = pj[PJ_OUT] * (hops + stream) * routers
    out_clk = pj[PJ_OUT_CLK] * hops * 2 * routers
    out_ctrl = out_clk * (hops + stream) * routers
    return wire + clock + dff + read + write + switch + switch_ctrl + out + out_clk + out_ctrl


@numba.njit(cache=True)
def link_cost(net, net_pj, n_id, scatter, tile, unique, nodes, scale, generalise):  # type: ignore[no-untyped-def]
    """:func:`fusekit.accel.noc.link_latency` and ``link_energy_pj`` of a transfer.

    ``scatter``: the transfer is a scatter (else a gather or broadcast: one part either way).
    Returns ``(ok, cycles, pJ, sub-mesh x, sub-mesh y)``; not ok: the sub-mesh is not in
    COMET's table.
    """
    if unique == 0 or nodes == 1:
        return True, 0, 0.0, 0, 0
    sx, sy = sub_mesh(net, n_id, nodes)
    ok, hops, data = hops_data(sx, sy, generalise)
    if not ok:
        return False, 0, 0.0, sx, sy
    precision_b = np.float64(scale)
    # link_latency
    bits = np.float32(precision_b * 8)
    router = np.float32(0) + np.float32(hops * net[n_id, NET_HOP_LATENCY])
    q2d = tile * data
    if scatter and unique == 1:
        q2d = int(np.float32(q2d) / np.float32(nodes))
    w, tq = net[n_id, NET_CHANNEL], net[n_id, NET_QUEUING]
    flits = np.float32(np.float32(np.float32(q2d) * bits) / np.float32(w))
    queue = np.float32(0) + np.float32(flits * np.float32(tq))
    cycles = int(np.float32(np.float32(router + queue) + np.float32(0)))
    # link_energy_pj
    q = (tile * data) & _WRAP
    if scatter and unique == 1:
        q = int(np.float32(q) / np.float32(nodes))
    q_bits = int(np.float32(q) * np.float32(np.float32(precision_b) * np.float32(8)))
    e = router_pj(net_pj[n_id], hops, tq, q_bits, sx)
    pj = np.float64(np.float32(np.float32(e) + np.float32(0)))
    return True, cycles, pj, sx, sy


@numba.njit(cache=True)
def transfer(lv, net_of, net, net_pj, sl, tile, unique, count, generalise):  # type: ignore[no-untyped-def]
    """:meth:`.transfers.Transfers._transfer` of slot row ``sl`` moving one ``Move``.

    Returns ``(error, memory cycles, network cycles, pJ, a, b)``; ``a, b``: the sub-mesh of a
    mesh error.
    """
    target, child = sl[SL_TARGET], sl[SL_CHILD]
    n_id = net_of[target, child]
    if n_id < 0:
        return ERR_NO_NETWORK, 0, 0, 0.0, 0, 0
    rw = sl[SL_RW] != 0
    scale = np.float32(np.float32(sl[SL_SCALE]) / np.float32(8.0))
    ok, memory = memory_cycles(lv, net, target, child, n_id, rw, sl[SL_RMW] != 0, scale, tile,
                               unique, count)  # fmt: skip
    if not ok:
        return ERR_NOT_FINITE, 0, 0, 0.0, 0, 0
    num = max(unique, 1) if rw else unique
    scatter = not rw and num != 1
    ok, lat, pj, sx, sy = link_cost(net, net_pj, n_id, scatter, tile, unique, count, scale,
                                    generalise)  # fmt: skip
    if not ok:
        return ERR_MESH, 0, 0, 0.0, sx, sy
    return ERR_NONE, memory, lat, pj, 0, 0


# --- the kernel: a tensor's stalls (transfers.py) ------------------------------------------------


@numba.njit(cache=True, inline="always")
def firsts_count(n, period):  # type: ignore[no-untyped-def]
    """:meth:`.records.MoveRow.firsts`: iterations that get the ``moved`` move."""
    if n == 0:
        return 0
    return 1 if period <= 0 else -(-n // period)


@numba.njit(cache=True, inline="always")
def is_first(i, period):  # type: ignore[no-untyped-def]
    """Whether iteration ``i`` gets the ``moved`` move (the first of each ``period``)."""
    return i == 0 or (period > 0 and i % period == 0)


@numba.njit(cache=True, inline="always")
def moving(sl, n):  # type: ignore[no-untyped-def]
    """:meth:`.records.MoveRow.moving` of slot ``sl``'s moves over ``n`` iterations."""
    first = firsts_count(n, sl[SL_PERIOD])
    out = first if sl[SL_MOVED_UNIQUE] else 0
    if sl[SL_KEPT_UNIQUE]:
        out += n - first
    return out


@numba.njit(cache=True)
def tensor_stalls(sl, n, n_it, iters, different, cyc, moved, kept, eff):  # type: ignore[no-untyped-def]
    """:meth:`.transfers.Transfers.port_costs` and ``stalls`` of a leaf's tensor (hidden).

    ``n``: its moves' iterations, ``iters`` its nest's, ``n_it`` the node's; ``cyc`` one
    primitive's cycles (every iteration's window), ``moved`` and ``kept`` the transfers' cycles.
    Writes the per-iteration transfers (``mem_net``) into the first ``pseudo`` entries of
    ``eff``; a hidden tensor's per-iteration stalls are not kept (the merge reads them only
    for the compulsory stalls of a tensor not hidden). Returns ``(pseudo, reuse, actual,
    ramp_up, ramp_down, cumm, cumm_stall)``.
    """
    period = sl[SL_PERIOD]
    actual = moving(sl, n)
    reuse = iters // actual if actual else 0
    reuse = reuse or 1
    pseudo = n if different else n // reuse
    step = 1 if different else reuse
    rw = sl[SL_RW] != 0
    # the picked iteration that is a ramp, not a stall
    skip = -1
    ramp_down = 0
    if rw:
        last = n - reuse
        if last >= 0:
            ramp_down = moved if is_first(last, period) else kept
            if last % step == 0:
                skip = last // step
    else:
        skip = 0
    ramp_up = 0
    shift = 1 if rw else -1
    cumm = cumm_stall = 0
    eff[:pseudo] = 0
    for j in range(-(-n // step)):
        i = j * step
        e = moved if is_first(i, period) else kept
        if not rw and j == 0:
            ramp_up = e
        # the window: each reuse-th iteration's covers the reused ones after it
        if i >= n_it:
            w = 0
        elif reuse == 1:
            w = cyc
        elif i % reuse == 0:
            w = cyc * min(reuse, n_it - i)
        else:
            w = 0
        s = e - w if e else 0
        if j == skip:
            e = s = 0
        cumm += e
        cumm_stall += s
        k = j + shift
        if 0 <= k < pseudo:
            eff[k] = e
    return pseudo, reuse, actual, ramp_up, ramp_down, cumm, cumm_stall


# --- the kernel: merge per level and port, node cycles (merge.py) ------------------------------


@numba.njit(cache=True, inline="always")
def use_up(win, n_win, used, lo, f, kf):  # type: ignore[no-untyped-def]
    """:func:`.merge._use_up`: take ``used[i - lo]`` off ``win`` at each iteration of ``i``."""
    if f == 1 and kf == 1:
        top = min(lo + used.shape[0], n_win)
        for i in range(lo, top):
            u = used[i - lo]
            win[i] = win[i] - u if win[i] > u else 0
        return
    for j in range(used.shape[0]):
        u = used[j]
        i = lo + j
        for mi in range(i * f, i * f + f):
            nn = mi // kf
            if nn < n_win:
                win[nn] = max(win[nn] - u, 0)


@numba.njit(cache=True, inline="always")
def _add_stalls(ms, eff, pseudo, wk, f, lo, hi, n_it):  # type: ignore[no-untyped-def]
    """The stalls of :func:`.merge._add_unit_reuse` and ``_add_reused`` (a hidden tensor).

    Each iteration's transfer in excess of its window, per reuse ``f``, adds to the level's
    ``f`` iterations it covers.
    """
    if f == 1:
        for i in range(lo, hi):
            x = eff[i] if i < pseudo else 0
            if x > wk[i]:
                ms[i] += x - wk[i]
        return
    for i in range(lo, hi):
        s = (eff[i] if i < pseudo else 0) // f - wk[i] // f
        if s > 0:
            for mi in range(i * f, min(i * f + f, n_it)):
                ms[mi] += s


@numba.njit(cache=True, inline="always")
def entry_order(rows, keep, c0, c1, c2):  # type: ignore[no-untyped-def]
    """:func:`.merge._entries`' order: rows ``i`` with ``keep[i] > 0``, sorted by three columns.

    The columns ``c0``, ``c1``, ``c2`` are the target level, the child level and the port; ties
    keep index order. An insertion sort (a handful of rows): a leaf's slots
    (:func:`merge_and_count`) or a spatial node's entries (:func:`.compiled_upper.merge_entries`).
    """
    n = rows.shape[0]
    order = np.empty(n, dtype=np.int64)
    m = 0
    for i in range(n):
        if keep[i] > 0:
            order[m] = i
            m += 1
    for a in range(1, m):
        i = order[a]
        b = a - 1
        while b >= 0 and _merges_after(rows, order[b], i, c0, c1, c2):
            order[b + 1] = order[b]
            b -= 1
        order[b + 1] = i
    return order[:m]


@numba.njit(cache=True, inline="always")
def _merges_after(rows, a, b, c0, c1, c2):  # type: ignore[no-untyped-def]
    """Whether row ``a`` merges after row ``b``: columns ``c0``, ``c1``, ``c2``, then index."""
    for col in (c0, c1, c2):
        if rows[a, col] != rows[b, col]:
            return rows[a, col] > rows[b, col]
    return a > b


@numba.njit(cache=True)
def merge_and_count(slots, n_it, run, pseudo, actual, eff, port_overwrite, lvl):  # type: ignore[no-untyped-def]
    """:func:`.merge.merge_levels` (no shared ports) then :func:`.merge.node_cycles`.

    Per slot: its cycles, reuse, ramps and cumulated transfer (``run[slot, SO_*]``), its
    pseudo-iterations, moving iterations and per-iteration transfers ``eff``. Fills
    ``lvl[level, port]`` and returns the node's cycles.
    """
    n_slots = slots.shape[0]
    n_lv = lvl.shape[0]
    lvl.fill(0)
    for t in range(n_slots):
        lvl[slots[t, SL_TARGET], 0, LO_PRESENT] = lvl[slots[t, SL_TARGET], 1, LO_PRESENT] = 1
    group = np.empty(n_lv, dtype=np.int64)  # the target levels' positions, in rank order
    n_groups = 0
    for g in range(n_lv):
        group[g] = n_groups if lvl[g, 0, LO_PRESENT] else -1
        n_groups += lvl[g, 0, LO_PRESENT]
    ms = np.zeros((n_groups, 2, n_it), dtype=np.int64)  # merged stalls per level and port
    order = entry_order(slots, pseudo, SL_TARGET, SL_CHILD, SL_RW)
    n_entries = order.shape[0]
    width = 0
    for e in range(n_entries):
        width = max(width, actual[order[e]])
    windows = np.empty((n_entries, width), dtype=np.int64)  # each entry's window
    for e in range(n_entries):
        t = order[e]
        windows[e, : actual[t]] = slots[t, SL_REL_TS] * run[t, SO_CYCLES] * run[t, SO_REUSE]
    used = np.empty(n_it, dtype=np.int64)
    for e in range(n_entries):  # _merge_port
        t = order[e]
        r = run[t]
        tgt, idx = slots[t, SL_TARGET], slots[t, SL_RW]
        m = lvl[tgt, idx]
        m[LO_RAMP_UP] += r[SO_RAMP_UP]
        m[LO_RAMP_DOWN] += r[SO_RAMP_DOWN]
        m[LO_COMPUTE_TIME] = max(m[LO_COMPUTE_TIME], n_it * r[SO_CYCLES])
        f = r[SO_REUSE]
        if m[LO_REUSE] == 0:
            m[LO_REUSE] = 1
        if f > 0:
            m[LO_REUSE] = min(m[LO_REUSE], f)
        m[LO_CUMM] += r[SO_CUMM]
        its = min(n_it, actual[t])
        _add_stalls(ms[group[tgt], idx], eff[t], pseudo[t], windows[e], f, idx, its, n_it)
        hidden = min(its, pseudo[t])
        if hidden <= idx:
            continue
        # a hidden transfer uses up the window of the level's later tensors on its port
        n_used = hidden - idx
        for i in range(n_used):
            used[i] = eff[t, idx + i] // f
        for kk in range(e + 1, n_entries):
            other = order[kk]
            if slots[other, SL_TARGET] == tgt and slots[other, SL_RW] == idx:
                use_up(windows[kk], actual[other], used[:n_used], idx, f, run[other, SO_REUSE])
    return node_cycles(lvl, group, ms, n_it, port_overwrite)


@numba.njit(cache=True)
def node_cycles(lvl, group, ms, n_it, port_overwrite):  # type: ignore[no-untyped-def]
    """:func:`.merge.node_cycles`: compute window, largest ramps, largest stall per iteration."""
    stall = np.zeros(n_it, dtype=np.int64)
    up = down = compute = 0
    for lv in range(lvl.shape[0]):
        a = group[lv]
        if a < 0:
            continue
        for idx in range(2):
            c = lvl[lv, idx]
            if n_it == 0 or c[LO_COMPUTE_TIME] == 0:
                continue
            up = max(up, c[LO_RAMP_UP])
            down = max(down, c[LO_RAMP_DOWN])
            compute = max(compute, c[LO_COMPUTE_TIME])
            f = c[LO_REUSE]
            first = a == 0 and (idx == 0 or port_overwrite)
            start = -(-idx // f) * f
            j = start // f
            for s in range(start, n_it, f):
                per = ms[a, idx, j]
                j += 1
                if first or per > stall[s]:
                    stall[s] = per
    return (compute + up + down + stall.sum()) & _WRAP


# --- the kernel: one evaluation and the fold (steady.py) ----------------------------------------


@numba.njit(cache=True)
def _ramp_tables(slots, run, tab):  # type: ignore[no-untyped-def]
    """The ramp-down table and :meth:`.steady.SteadyState._keep_ramp_ups`' ramp-up table.

    A table's key keeps its first position and its last value. The ramp-ups are those of the
    target levels whose reads' ramp-ups sum to the most.
    """
    n = slots.shape[0]
    for key in range(tab.shape[0]):
        tab[key, TB_UP_HAS] = tab[key, TB_DOWN_HAS] = 0
    n_down = 0
    for t in range(n):
        if slots[t, SL_RW]:
            key, down = slots[t, SL_KEY], run[t, SO_RAMP_DOWN]
            n_down = _table_put(tab, key, TB_DOWN_HAS, TB_DOWN_POS, TB_DOWN, down, n_down)
    sums = np.zeros(n, dtype=np.int64)  # per read slot opening a target level: its level's sum
    top = -1
    for t in range(n):
        if slots[t, SL_RW] or read_target_seen(slots, t, SL_RW, SL_TARGET):
            continue
        for u in range(t, n):  # the level's table: each key's last value
            if not slots[u, SL_RW] and slots[u, SL_TARGET] == slots[t, SL_TARGET]:
                if not _key_again(slots, u):
                    sums[t] += run[u, SO_RAMP_UP]
        if top < 0 or sums[t] > top:
            top = sums[t]
    n_up = 0
    for t in range(n):
        if slots[t, SL_RW] or read_target_seen(slots, t, SL_RW, SL_TARGET) or sums[t] != top:
            continue
        for u in range(t, n):
            if not slots[u, SL_RW] and slots[u, SL_TARGET] == slots[t, SL_TARGET]:
                key, up = slots[u, SL_KEY], run[u, SO_RAMP_UP]
                n_up = _table_put(tab, key, TB_UP_HAS, TB_UP_POS, TB_UP, up, n_up)


@numba.njit(cache=True, inline="always")
def _table_put(tab, key, has, pos, col, value, n):  # type: ignore[no-untyped-def]
    """``tab[key, col] = value`` in a ramp table; returns the next position.

    A key new to the table (flag column ``has``) takes position ``n`` (column ``pos``).
    """
    if not tab[key, has]:
        tab[key, has] = 1
        tab[key, pos] = n
        n += 1
    tab[key, col] = value
    return n


@numba.njit(cache=True, inline="always")
def read_target_seen(rows, i, port, target):  # type: ignore[no-untyped-def]
    """Whether a read row (column ``port`` zero) before ``i`` has ``i``'s ``target`` column.

    A leaf's slots (:func:`_ramp_tables`) or a spatial node's entries
    (:func:`.compiled_upper.spatial_node`'s ramp-ups).
    """
    for u in range(i):
        if not rows[u, port] and rows[u, target] == rows[i, target]:
            return True
    return False


@numba.njit(cache=True, inline="always")
def _key_again(slots, u):  # type: ignore[no-untyped-def]
    """Whether a later read slot has ``u``'s target level and key (it overwrites ``u``'s)."""
    for v in range(u + 1, slots.shape[0]):
        if (not slots[v, SL_RW] and slots[v, SL_TARGET] == slots[u, SL_TARGET]
                and slots[v, SL_KEY] == slots[u, SL_KEY]):  # fmt: skip
            return True
    return False


@numba.njit(cache=True)
def _iterations(slots, n_fold):  # type: ignore[no-untyped-def]
    """Per slot its nest's and its moves' iterations, their largest, and more.

    Returns ``(iters, n, n_it, width, different)``: per slot the nest's and the moves'
    iterations (all ``n_fold`` when folding), the largest of the nest's, the widest moves (at
    least 1) and whether the tensors' iterations differ.
    """
    n_slots = slots.shape[0]
    iters = np.empty(n_slots, dtype=np.int64)
    n_t = np.empty(n_slots, dtype=np.int64)
    for t in range(n_slots):
        iters[t] = n_fold if n_fold else slots[t, SL_ITERS]
        n_t[t] = min(n_fold, slots[t, SL_N]) if n_fold else slots[t, SL_N]
    n_it, width, low = iters[0], max(n_t[0], 1), iters[0]
    for t in range(1, n_slots):
        n_it = max(n_it, iters[t])
        low = min(low, iters[t])
        width = max(width, n_t[t])
    return iters, n_t, n_it, width, low != n_it


@numba.njit(cache=True)
def evaluate(slots, n_fold, port_overwrite, run, counts, lvl, tab):  # type: ignore[no-untyped-def]
    """One evaluation of a leaf (:meth:`.steady.SteadyState._leaf`).

    Over the leaf's own iterations, or (``n_fold > 0``) every tensor's first ``n_fold``.
    Reads each slot's cycles and transfers (``run[slot, SO_CYCLES .. SO_KEPT]``), writes its
    reuse, ramps and cumulated cycles (``SO_REUSE .. SO_CUMM_STALL``), each slot's access count
    then their largest (the compute unit's) into ``counts``, the merged costs into ``lvl`` and
    the ramp tables into ``tab``. Returns the leaf's cycles.
    """
    n_slots = slots.shape[0]
    iters, n_t, n_it, width, different = _iterations(slots, n_fold)
    eff = np.zeros((n_slots, width), dtype=np.int64)
    pseudo = np.empty(n_slots, dtype=np.int64)
    actual = np.empty(n_slots, dtype=np.int64)
    counts[n_slots] = 0
    for t in range(n_slots):
        r = run[t]
        p, f, a, up, down, cumm, cumm_stall = tensor_stalls(slots[t], n_t[t], n_it, iters[t],
                                                            different, r[SO_CYCLES], r[SO_MOVED],
                                                            r[SO_KEPT], eff[t])  # fmt: skip
        pseudo[t], actual[t], counts[t] = p, a, p
        counts[n_slots] = max(counts[n_slots], p)
        r[SO_REUSE], r[SO_RAMP_UP], r[SO_RAMP_DOWN] = f, up, down
        r[SO_CUMM], r[SO_CUMM_STALL] = cumm, cumm_stall
    total = merge_and_count(slots, n_it, run, pseudo, actual, eff, port_overwrite, lvl)
    _ramp_tables(slots, run, tab)
    return total


@numba.njit(cache=True)
def leaf_period(slots):  # type: ignore[no-untyped-def]
    """:meth:`.steady.SteadyState.leaf_period`: the period to fold over, or 0."""
    n = slots[0, SL_ITERS]
    period = 1
    for t in range(slots.shape[0]):
        if slots[t, SL_ITERS] != n:
            return 0
        p = slots[t, SL_PERIOD]
        if p > 0:
            a, b = period, p
            while b:
                a, b = b, a % b
            period = period // a * p
    if n < max(FOLD_MIN_PERIODS * period, FOLD_MIN_ITERATIONS) or n % period:
        return 0
    return period


@numba.njit(cache=True, inline="always")
def _affine(a, b, k):  # type: ignore[no-untyped-def]
    """``b = a + k (b - a)`` elementwise: counts at two and three periods, ``k`` periods more."""
    for i in range(a.shape[0]):
        b[i] = a[i] + k * (b[i] - a[i])


@numba.njit(cache=True, inline="always")
def _tables_alike(a, b):  # type: ignore[no-untyped-def]
    """Whether two runs' tables hold the same keys (``_extend_leaf``'s check)."""
    for key in range(a.shape[0]):
        if a[key, TB_UP_HAS] != b[key, TB_UP_HAS] or a[key, TB_DOWN_HAS] != b[key, TB_DOWN_HAS]:
            return False
    return True


@numba.njit(cache=True)
def leaf_kernel(lv, simd, net_of, net, net_pj, slots, op, generalise, port_overwrite, fold):  # type: ignore[no-untyped-def]
    """Stage 4 of a leaf from its arrays (module docstring).

    Returns ``(head, acc, acc_pj, slot_out, slot_pj, lvl, tab)``; ``head[H_ERROR]`` non-zero:
    the reference raises there (:func:`raise_error`), the rest is undefined.
    """
    n_slots = slots.shape[0]
    n_keys = 0
    for t in range(n_slots):
        n_keys = max(n_keys, slots[t, SL_KEY] + 1)
    head = np.zeros(H_SIZE, dtype=np.int64)
    acc = np.zeros((n_slots + 1, AC_COLS), dtype=np.int64)
    acc_pj = np.zeros((n_slots + 1, AP_COLS), dtype=np.float64)
    slot_out = np.zeros((n_slots, SO_COLS), dtype=np.int64)
    slot_pj = np.zeros((n_slots, 2), dtype=np.float64)
    lvl = np.zeros((lv.shape[0], 2, LO_COLS), dtype=np.int64)
    tab = np.zeros((n_keys, TB_COLS), dtype=np.int64)
    # per tensor, in the reference's order: the unit computes, its cycles, the transfers
    for t in range(n_slots):
        sl = slots[t]
        head[H_ERROR_SLOT] = t
        if not lv[sl[SL_CHILD], LV_COMPUTE]:
            head[H_ERROR] = ERR_NOT_COMPUTE
            return head, acc, acc_pj, slot_out, slot_pj, lvl, tab
        err, cyc = compute_cycles(lv, simd, _with_unit(op, sl[SL_CHILD]))
        if err:
            head[H_ERROR], head[H_ERROR_A] = err, cyc
            return head, acc, acc_pj, slot_out, slot_pj, lvl, tab
        slot_out[t, SO_CYCLES] = cyc
        if sl[SL_N] == 0:
            head[H_ERROR] = ERR_EMPTY
            return head, acc, acc_pj, slot_out, slot_pj, lvl, tab
        for m in range(2):  # the moved move, then the kept one (SL_KEPT_* follow SL_MOVED_*)
            if m == 1 and firsts_count(sl[SL_N], sl[SL_PERIOD]) >= sl[SL_N]:
                break  # every iteration gets the moved tile: the kept one is never priced
            mv = SL_MOVED_TILE + 3 * m
            err, memory, lat, pj, a, b = transfer(lv, net_of, net, net_pj, sl, sl[mv], sl[mv + 1],
                                                  sl[mv + 2], generalise)  # fmt: skip
            if err:
                head[H_ERROR], head[H_ERROR_A], head[H_ERROR_B] = err, a, b
                return head, acc, acc_pj, slot_out, slot_pj, lvl, tab
            slot_out[t, SO_MOVED + m] = memory + lat
            slot_pj[t, SP_MOVED + m] = pj
    _count_reuse(slots, tab)
    counts = np.zeros(n_slots + 1, dtype=np.int64)
    period = leaf_period(slots) if fold else 0
    total = -1
    if period:  # _visit_leaf: two runs, every count extended
        run_a, counts_a, lvl_a, tab_a = slot_out.copy(), counts.copy(), lvl.copy(), tab.copy()
        total_a = evaluate(slots, 2 * period, port_overwrite, run_a, counts_a, lvl_a, tab_a)
        total_b = evaluate(slots, 3 * period, port_overwrite, slot_out, counts, lvl, tab)
        k = slots[0, SL_ITERS] // period - 2
        total = total_a + k * (total_b - total_a)
        if 0 <= total <= _WRAP and _tables_alike(tab_a, tab):
            _affine(run_a.reshape(-1), slot_out.reshape(-1), k)
            _affine(counts_a, counts, k)
            _affine(lvl_a.reshape(-1), lvl.reshape(-1), k)
            for key in range(n_keys):  # the tables keep the first run's key order
                tab[key, TB_UP_POS] = tab_a[key, TB_UP_POS]
                tab[key, TB_DOWN_POS] = tab_a[key, TB_DOWN_POS]
            _affine(tab_a.reshape(-1), tab.reshape(-1), k)
            head[H_PERIOD] = period
        else:
            total = -1
    if total < 0:
        total = evaluate(slots, np.int64(0), port_overwrite, slot_out, counts, lvl, tab)
    head[H_ERROR] = ERR_NONE
    head[H_TOTAL] = total
    for t in range(n_slots):
        head[H_N_IT] = max(head[H_N_IT], slots[t, SL_ITERS])
    _accesses(slots, op, counts, acc, acc_pj)
    return head, acc, acc_pj, slot_out, slot_pj, lvl, tab


@numba.njit(cache=True, inline="always")
def _with_unit(op, unit):  # type: ignore[no-untyped-def]
    """``op`` on compute level ``unit`` (a tensor's child may differ from the op's unit)."""
    if op[OP_UNIT] == unit:
        return op
    out = op.copy()
    out[OP_UNIT] = unit
    return out


@numba.njit(cache=True, inline="always")
def _count_reuse(slots, tab):  # type: ignore[no-untyped-def]
    """:meth:`.steady.SteadyState._count_reuse`: per key, its reuse and moving iterations."""
    for t in range(slots.shape[0]):
        actual = moving(slots[t], slots[t, SL_N])
        f = slots[t, SL_ITERS] // actual if actual else 0
        tab[slots[t, SL_KEY], TB_REUSE] = f or 1
        tab[slots[t, SL_KEY], TB_ACTUAL] = actual


@numba.njit(cache=True)
def _accesses(slots, op, counts, acc, acc_pj):  # type: ignore[no-untyped-def]
    """A leaf's accesses: each tensor at its target level, then the compute unit's."""
    n = slots.shape[0]
    for t in range(n):
        sl = slots[t]
        acc[t, AC_LEVEL] = sl[SL_TARGET]
        acc[t, AC_COUNT] = counts[t]
        acc[t, AC_TILE] = sl[SL_MOVED_TILE]
        acc[t, AC_PRECISION] = sl[SL_SCALE]
        acc[t, AC_RW] = sl[SL_RW]
        acc[t, AC_AT_TARGET] = 1
        acc[t, AC_TID] = sl[SL_TID]
        acc[t, AC_RMW] = sl[SL_RMW]
        acc[t, AC_PROJ] = sl[SL_MOVED_UNIQUE] or 1
        acc[t, AC_TAG] = sl[SL_TAG]
    macs = 1
    for j in range(op[OP_N_PRIM]):
        macs *= op[OP_HEAD + j]
    acc[n, AC_LEVEL] = op[OP_UNIT]
    acc[n, AC_COUNT] = counts[n]
    acc[n, AC_COMPUTE] = 1
    acc[n, AC_TID] = slots[0, SL_TID]
    acc[n, AC_RMW] = slots[0, SL_RMW]
    acc[n, AC_TAG] = slots[0, SL_TAG]
    acc_pj[n, AP_MAC] = np.float64(np.float32(np.float64(macs) * MAC_PJ))


# --- the wrapper (Python) ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeafArrays:
    """The kernel's result (:func:`leaf_kernel`), see the module docstring for the columns."""

    head: Ints
    acc: Ints
    acc_pj: Floats
    slot_out: Ints
    slot_pj: Floats
    lvl: Ints
    tab: Ints


def run_leaf(leaf: FlatLeaf, flat: FlatArch, fold: bool = True) -> LeafArrays:
    """The kernel on a flattened leaf; the reference's exceptions where it raises.

    ``fold``: fold a leaf whose transfers repeat (the reference's ``fold``; the same numbers).

    Raises:
        TreeModelError: a leaf COMET cannot evaluate (as the reference words it).
        MeshShapeError: a transfer on a sub-mesh outside COMET's table.
    """
    out = LeafArrays(*leaf_kernel(flat.lv, flat.simd, flat.net_of, flat.net, flat.net_pj,
                                  leaf.slots, leaf.op, flat.generalise, flat.port_overwrite,
                                  fold))  # fmt: skip
    if out.head[H_ERROR]:
        raise_error(out.head, leaf, flat)
    return out


def raise_error(head: Ints, leaf: FlatLeaf, flat: FlatArch) -> None:
    """Raise the reference's exception for the kernel's error ``head[H_ERROR]``."""
    node = leaf.node
    op = node.children[0]
    t = int(head[H_ERROR_SLOT])
    err, a, b = int(head[H_ERROR]), int(head[H_ERROR_A]), int(head[H_ERROR_B])
    unit = flat.levels[flat.index[node.childs[t]]]
    target = node.targets[t]
    if err == ERR_MESH:
        raise MeshShapeError(
            f"{node.label}: a {a}x{b} sub-mesh is not in COMET's collective table "
            "(1x1, 2x2, 4x4, 16x16): COMET aborts with std::out_of_range"
        )
    if err == ERR_EMPTY:
        raise IndexError(0)
    if err == ERR_NOT_FINITE:
        raise OverflowError("cannot convert float infinity to integer")
    messages = {
        ERR_NOT_COMPUTE: f"{node.label}: the child of an op's tile must compute",
        ERR_NO_MODEL: f"{op.label}: no latency model for compute type {unit.kind}",
        ERR_NOT_SIMD: f"{op.label}: op type {op.op_type} is not a SIMD op",
        ERR_NO_REDUCTION: f"{op.label}: a systolic GEMM needs reduction_dimensions",
        ERR_NOT_TILE: f"{op.label}: reduction factor {a} is not a tile size",
        ERR_NO_NETWORK: f"{node.label}: no network from {target} to {node.childs[t]}",
    }
    raise TreeModelError(messages.get(err, f"{node.label}: compiled leaf error {err}"))


def _table(tab: Ints, has: int, pos: int, col: int, keys: tuple[tuple[int, str], ...]) -> PerTensor:
    """One of the kernel's per-key tables as the reference's dict (its key order)."""
    rows = [k for k in range(len(keys)) if tab[k, has]]
    rows.sort(key=lambda k: int(tab[k, pos]))
    return {keys[k]: int(tab[k, col]) for k in rows}


def leaf_tables(out: LeafArrays, leaf: FlatLeaf) -> tuple[PerTensor, PerTensor]:
    """The reuse and moving-iteration tables (``SteadyState.reuse`` and ``actual`` of a leaf)."""
    tab, keys = out.tab, leaf.keys
    reuse = {key: int(tab[k, TB_REUSE]) for k, key in enumerate(keys)}
    actual = {key: int(tab[k, TB_ACTUAL]) for k, key in enumerate(keys)}
    return reuse, actual


def merged_cost(row: Any) -> Cost:
    """A merged level cost of the kernel as a :class:`~.records.Cost` without its vectors."""
    c = Cost()
    c.compute_time = int(row[LO_COMPUTE_TIME])
    c.reuse = int(row[LO_REUSE])
    c.cumm = int(row[LO_CUMM])
    c.ramp_up = int(row[LO_RAMP_UP])
    c.ramp_down = int(row[LO_RAMP_DOWN])
    return c


def to_leaf_result(out: LeafArrays, leaf: FlatLeaf, flat: FlatArch) -> LeafResult:
    """The kernel's result as the reference's :data:`.steady.LeafResult`.

    The merged costs' per-iteration vectors are left empty (no parent reads them; the
    reference's folded leaves leave them so too).
    """
    node, slots, acc, acc_pj = leaf.node, leaf.slots, out.acc, out.acc_pj
    op = node.children[0]
    levels = flat.levels
    accesses = []
    for t in range(slots.shape[0]):
        r = acc[t]
        accesses.append(Access(
            level=levels[int(r[AC_LEVEL])], count=int(r[AC_COUNT]), tile=int(r[AC_TILE]),
            precision=int(r[AC_PRECISION]), rw=bool(r[AC_RW]), at_target=True,
            tid=int(r[AC_TID]), rmw=bool(r[AC_RMW]), proj_count=int(r[AC_PROJ]),
            tag=leaf.tags[int(r[AC_TAG])], noc_pj=float(acc_pj[t, AP_NOC]),
        ))  # fmt: skip
    r = acc[-1]
    accesses.append(Access(
        level=levels[int(r[AC_LEVEL])], count=int(r[AC_COUNT]), at_target=False, compute=True,
        tag=leaf.tags[int(r[AC_TAG])], op_type=op.op_type, rmw=bool(r[AC_RMW]),
        tid=int(r[AC_TID]), mac_pj=float(acc_pj[-1, AP_MAC]),
    ))  # fmt: skip
    merged = {flat.names[g]: [merged_cost(out.lvl[g, 0]), merged_cost(out.lvl[g, 1])]
              for g in range(len(flat.names)) if out.lvl[g, 0, LO_PRESENT]}  # fmt: skip
    down = up = None
    if slots[:, SL_RW].any():
        down = _table(out.tab, TB_DOWN_HAS, TB_DOWN_POS, TB_DOWN, leaf.keys)
    if not slots[:, SL_RW].all():
        up = _table(out.tab, TB_UP_HAS, TB_UP_POS, TB_UP, leaf.keys)
    return accesses, {op.id: merged}, int(out.head[H_TOTAL]), down, up


def leaf_result(
    node: TreeNode, nest: Nest, rows: list[MoveRow], flat: FlatArch, fold: bool = True
) -> LeafResult:
    """Stage 4 of leaf ``node`` compiled: what :meth:`.steady.SteadyState._visit_leaf` writes.

    Args:
        node: a leaf tile node (``node.is_leaf_tile``).
        nest: its loop nest (stage 2).
        rows: its tensors' moves (stage 3).
        flat: the arch and compatibility switches (:func:`flatten_arch`).
        fold: fold a leaf whose transfers repeat (the same numbers).

    Raises:
        TreeModelError: as the reference.
        MeshShapeError: as the reference.
    """
    leaf = flatten_leaf(node, nest, rows, flat)
    return to_leaf_result(run_leaf(leaf, flat, fold), leaf, flat)
