r"""Stages 5 and 6 compiled, as far as a mapper reads them: energy, COMET's tables and totals.

A piece of the compiled twin of the tree model (numba, ``@njit(cache=True)``; the first piece,
:mod:`.compiled_leaf`, gives the layout conventions this module follows). The tree after stage 4
is flattened in Python (:func:`flatten_energy_arch` once per arch and
:class:`~fusekit.accel.compat.Compat`, :func:`flatten_tree` per tree) and :func:`energy_kernel`
computes from the arrays what :meth:`.energy.Energy.walk` and :func:`.report.report` (with
``detail=False``) compute: per node and level the energy and the routers' energy, the parents'
iterations of every node, the scaled access counts, COMET's per-unit table (CS, OS, TMW), its
energy rows and the two totals a mapper reads. The results are bit-identical (tested tree by
tree, ``tests/accel/test_compiled_energy.py``).

Array layout (levels by index in rank order, tensors by slot, accesses by row, as in
:mod:`.compiled_leaf`; the column names are this module's constants and that module's):

* ``nodes[row, ND_*]``: every node of the tree in pre-order (row 0 the root, a parent before its
  children, siblings left to right): kind, parent row, spatial, leaf, its slots, accesses and
  level-cost groups (first row and count), a leaf's op type (index into
  ``FlatEnergyArch.op_types``, whose first entries are ``FlatArch.op_types``) and TMW unit, a
  collective's input tensor and target level, and the node's cycles (stage 4);
* ``slots[slot, SL_*]``: every tile node's tensors (:func:`.compiled_leaf.flatten_slots`) with
  ``SL_TAG`` numbering the tree's op tags (``FlatTree.tags``) rather than the node's;
* ``acc[row, AC_*]``, ``acc_pj[row, AP_*]``: every node's stage-4 accesses, the rows of
  :func:`.compiled_leaf.leaf_kernel` (``AC_TAG`` the tree's tag), before stage 5 scales them;
* ``col_pj[row, CP_*]``: a collective's memory and network energy (:mod:`.collectives`);
* ``groups[g, GR_*]`` and ``lvl[g, level, port, LO_*]``: the merged level costs that stage 6
  reads (a collective's, and per window a spatial node's or a leaf's: the leaf kernel's ``lvl``),
  each with the unit of COMET's table it adds to (``FlatTree.units``: a tile group's unit is its
  levels, ``"GB-OB-"``; a collective's ``"ALLREDUCE-12"``; a leaf's TMW its op);
* ``erow[row, level, ER_*]``: the energy row (``FlatTree.rows``) a node's energy at a level adds
  to (a level, ``"SE-DIV"`` for a leaf's compute level) and its routers' (``"GB<->GB"``,
  ``"GB<->GB-ALLREDUCE"``); ``row_order``: the rows sorted by name (the total's order).

Every structural column (all but the counts, cycles, energies and level costs) depends on the
tree's shape alone, so a whole-tree kernel can fill the numbers from the compiled stage 4.

The kernel's outputs (:class:`EnergyArrays`): ``head[HD_*]`` (error, its node and access, total
cycles), the total energy, per node and level the energy and the routers' energy
(``level_pj``, ``noc_pj`` with ``level_has``, ``noc_has``: the reference's dict keys), per node
its parents' iterations (``-1``: none, the reference's ``parent_iters`` has no key), per access
its scaled count (the reference mutates ``Access.count``; the kernel does not mutate ``acc``), per
energy row its float32 sum (``rows``, ``row_has``) and per unit its ``CS``, ``OS``, ``TMW``
(``units``, ``unit_has``).

The formulas, as in the reference (:mod:`.energy`, :mod:`.report`). Stage 5 walks the tree in
pre-order with two tables per op tag and tensor, the instances ``sp`` and the iterations
``iters`` of the nodes above (a child reads its parent's tables as they are after the parent).
A spatial or leaf node ``v`` with ``n_v`` the largest iteration count above it of a tensor of
``v`` or of a tile node on its left (none for a child of the root) prices each access ``a``
(``c`` counts, tiles of ``s`` elements, ``u`` distinct tiles, ``p`` bits, block of ``w`` bytes,
``e`` the level's pJ per access, float32), instances ``m`` (``sp`` of its tag and tensor, or
natively the product of the spatial ancestors' fan-outs):

.. math::

    E_{mem} = m \cdot \frac{(c \, n_v) \, s \, u \, p \cdot e}{8 w} \cdot (2 \text{ if rmw}),
    \qquad E_{unit} = m \cdot (c \, r) \cdot e_{unit}, \qquad E_{noc} = \sum e_{noc} \, n_v

(``r``: the iterations above of the leaf's tensors, :meth:`.energy.Energy._compute_repeats`;
``e_unit``: :func:`.compute.unit_energy_pj`); the node then sets ``iters`` of its memory
accesses to ``n_v``, multiplies its tensors' ``sp`` by its fan-out and (not a leaf) its
tensors' ``iters`` by their at-target counts. A collective under a temporal node costs its
energies times the count ``n`` of its input tensor at the tile on its left; under a spatial node
once, and the node's energies times the ``iters`` of its input tensor under the tag ``iters``
got last of those the tiles on its left give it (``iters``' insertion order: a stamp per tag).

Stage 6, per group ``g`` of node ``v`` with ``i_v`` its parents' iterations (mod ``2**32``):

.. math::

    CS_g = \max_l (up + down)_{l,read} + \max_l (up + down)_{l,write}, \quad
    OS_g = \max(t_v - CS_g - \max_l compute_l, 0), \quad TMW_v = \max_l compute_l

and the total cycles :math:`\sum_g (CS_g + OS_g + TMW_g) \, i_v` (a collective:
:math:`\max_l cumm_l \, i_v`; COMET's ``OS`` column adds :math:`OS_g` unscaled under
``unscaled_os``), or natively the root's cycles; the energy rows are float32 sums over the nodes
in pre-order and the total energy their float32 sum in name order.

What is not here: the loop nest, the ideal compute cycles and the utilisation (``detail=True``);
the :class:`~fusekit.accel.compat.Compat` switches read: ``tag_instances``, ``energy_by_name``
and ``simd_constants`` (:func:`flatten_energy_arch`), ``unit_sum_total`` and ``unscaled_os``.
Integer products are in int64 (the reference's are Python's): one that would reach ``2**62``
stops the kernel (``EE_RANGE``, raised as :class:`OverflowError`) rather than wrap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
import numpy.typing as npt

from fusekit.accel.compat import Compat
from fusekit.accel.tree import Hierarchy, Level, TreeMapping, TreeNode, pre_order
from fusekit.accel.tree_model import compiled_leaf as cl
from fusekit.accel.tree_model.compiled_leaf import (
    AC_AT_TARGET,
    AC_COMPUTE,
    AC_COUNT,
    AC_LEVEL,
    AC_PRECISION,
    AC_PROJ,
    AC_RMW,
    AC_RW,
    AC_TAG,
    AC_TID,
    AC_TILE,
    AP_MAC,
    AP_NOC,
    LO_COLS,
    LO_COMPUTE_TIME,
    LO_CUMM,
    LO_PRESENT,
    LO_RAMP_DOWN,
    LO_RAMP_UP,
    LO_REUSE,
    LV_COMPUTE_WIDTH,
    LV_INSTANCES,
    SL_SP_ITERS,
    SL_TAG,
    SL_TID,
    FlatArch,
    Floats,
    Ints,
)
from fusekit.accel.tree_model.compute import SIMD_PJ
from fusekit.accel.tree_model.energy import block_price
from fusekit.accel.tree_model.fit import fit_check
from fusekit.accel.tree_model.nests import build_movements, build_nests
from fusekit.accel.tree_model.records import Access, Cost, TreeModelError, f32
from fusekit.accel.tree_model.steady import SteadyState

Bools = npt.NDArray[np.bool_]

# --- the layout (see the module docstring) -----------------------------------------------------

#: ``nodes`` columns (a row per node, pre-order).
ND_KIND, ND_PARENT, ND_SPATIAL, ND_LEAF = 0, 1, 2, 3
ND_SLOT0, ND_N_SLOTS, ND_ACC0, ND_N_ACC, ND_GROUP0, ND_N_GROUPS = 4, 5, 6, 7, 8, 9
ND_OP_TYPE, ND_TMW_UNIT, ND_COL_IN, ND_COL_TARGET, ND_CYCLES = 10, 11, 12, 13, 14
ND_COLS = 15
#: ``ND_KIND`` values.
NK_TILE, NK_OP, NK_BIND, NK_COLLECTIVE = 0, 1, 2, 3
_KINDS = {"tile": NK_TILE, "op": NK_OP, "bind": NK_BIND, "collective": NK_COLLECTIVE}

#: ``groups`` columns: the node whose merged level costs the group is, the unit it adds to.
GR_NODE, GR_UNIT = 0, 1
GR_COLS = 2
#: ``col_pj`` columns: a collective's memory and network energy.
CP_MEMORY, CP_NETWORK = 0, 1
#: ``erow[row, level]`` entries: the energy row of the level's energy and of its routers'.
ER_LEVEL, ER_NOC = 0, 1

#: ``FlatEnergyArch.unit_class`` values: how a compute unit's accesses are priced.
UC_OTHER, UC_MAC, UC_SIMD = 0, 1, 2
#: ``FlatEnergyArch.price`` columns: pJ per access (float32) by (write, at target), the bits of
#: a block, the unit's ``compute_energy``.
EP_WRITE_TARGET, EP_WRITE_CHILD, EP_READ_TARGET, EP_READ_CHILD, EP_BITS, EP_COMPUTE = range(6)
EP_COLS = 6

#: ``head`` entries of the kernel's result.
HD_ERROR, HD_ERROR_NODE, HD_ERROR_ROW, HD_TOTAL_CYCLES = 0, 1, 2, 3
HD_SIZE = 4
#: ``HD_ERROR`` values (the reference's exceptions, :func:`raise_error`).
EE_NONE, EE_NO_PARENT, EE_NO_ITERS, EE_NO_INSTANCES, EE_NO_LEFT, EE_NO_SIMD_PJ = range(6)
EE_RANGE = 6
#: ``units`` columns.
UT_CS, UT_OS, UT_TMW = 0, 1, 2
UT_COLS = 3
_UT_NAMES = ("CS", "OS", "TMW")

#: Integer products stop the kernel from here on (int64 would wrap past ``2**63``).
_LIMIT = 2.0**62
_WRAP = 0xFFFFFFFF


# --- flattening (Python) -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FlatEnergyArch:
    """A hierarchy's energy numbers as arrays, for one ``Compat`` (module docstring).

    Attributes:
        flat: the levels and networks (:func:`.compiled_leaf.flatten_arch`).
        op_types: ``flat.op_types``, then op types only an ``op_energy_pj`` map names.
        unit_class: per level, ``UC_*``: how its compute accesses are priced.
        price: per level, ``EP_*``.
        simd_pj: per level and op type, pJ per SIMD lane (float32); NaN: the reference raises.
        tag_instances: instances per op tag (COMET) rather than the spatial fan-out.
        unit_sum_total: the total cycles are the table's sum (COMET) rather than the root's.
        unscaled_os: COMET's OS column is not scaled by the parents' iterations.
    """

    flat: FlatArch
    op_types: tuple[str, ...]
    unit_class: Ints
    price: Floats
    simd_pj: Floats
    tag_instances: bool
    unit_sum_total: bool
    unscaled_os: bool


@dataclass(frozen=True, slots=True)
class FlatTree:
    """A tree after stage 4 as arrays (module docstring), and the names the arrays number.

    ``tree``: the nodes by row; ``op_types``: by row, a leaf's compute access's op type.
    """

    tree: tuple[TreeNode, ...]
    op_types: tuple[str, ...]
    nodes: Ints
    slots: Ints
    acc: Ints
    acc_pj: Floats
    col_pj: Floats
    groups: Ints
    lvl: Ints
    erow: Ints
    row_order: Ints
    tags: tuple[str, ...]
    rows: tuple[str, ...]
    units: tuple[str, ...]
    n_tids: int


def _unit_class(lv: Level, compat: Compat) -> int:
    """:func:`.compute.unit_energy_pj`'s choice of formula for ``lv``."""
    cls = lv.attrs.get("class")
    if compat.energy_by_name or cls is None:
        mac, simd = lv.kind == "SystolicArray", lv.kind == "VSIMD"
    else:
        mac, simd = cls == "mac", cls == "simd"
    return UC_MAC if mac else (UC_SIMD if simd else UC_OTHER)


def _lane_pj(lv: Level, op_type: str, compat: Compat) -> float:
    """:func:`.compute.unit_energy_pj`'s pJ per lane of a SIMD unit; NaN where it raises."""
    width = int(lv.attrs.get("computeWidth", 8))
    given = None if compat.simd_constants else lv.attrs.get("op_energy_pj")
    if isinstance(given, dict) and op_type in given:
        return float(f32(float(given[op_type])))
    if op_type in ("rowsum", "rowmax"):
        base = 0.11 if op_type == "rowsum" else 0.0025
        return float(f32(base * math.ceil(math.log2(width))))
    if op_type in SIMD_PJ:
        return float(f32(SIMD_PJ[op_type]))
    return math.nan


#: The ``price`` columns of :func:`.energy.block_price`'s (write, at target) accesses.
_PRICED = {EP_WRITE_TARGET: (True, True), EP_WRITE_CHILD: (True, False),
           EP_READ_TARGET: (False, True), EP_READ_CHILD: (False, False)}  # fmt: skip


def _price_row(lv: Level) -> list[float]:
    """A level's row of ``FlatEnergyArch.price`` (``EP_*``)."""
    row = [0.0] * EP_COLS
    for col, (rw, at_target) in _PRICED.items():
        row[col] = block_price(lv, rw, at_target)[0]
    row[EP_BITS] = lv.width_bytes() * 8.0
    row[EP_COMPUTE] = float(lv.attrs.get("compute_energy", 0))
    return row


def flatten_energy_arch(
    arch: Hierarchy, compat: Compat, flat: FlatArch | None = None
) -> FlatEnergyArch:
    """The energy arrays of ``arch`` and the switches of ``compat`` stages 5 and 6 read.

    ``flat``: the arch's :func:`.compiled_leaf.flatten_arch` for ``compat``, when the caller has it.
    """
    flat = flat or cl.flatten_arch(arch, compat)
    named: set[str] = set()
    for lv in flat.levels:
        given = lv.attrs.get("op_energy_pj")
        if isinstance(given, dict):
            named |= {str(t) for t in given}
    op_types = flat.op_types + tuple(sorted(named - set(flat.op_types)))
    n = len(flat.levels)
    return FlatEnergyArch(
        flat=flat,
        op_types=op_types,
        unit_class=np.array([_unit_class(lv, compat) for lv in flat.levels], dtype=np.int64),
        price=np.array([_price_row(lv) for lv in flat.levels], dtype=np.float64).reshape(
            n, EP_COLS
        ),
        simd_pj=np.array(
            [[_lane_pj(lv, t, compat) for t in op_types] for lv in flat.levels], dtype=np.float64
        ).reshape(n, len(op_types)),
        tag_instances=compat.tag_instances,
        unit_sum_total=compat.unit_sum_total,
        unscaled_os=compat.unscaled_os,
    )


def _access_row(a: Access, index: dict[str, int], tags: dict[str, int]) -> list[int]:
    """An access as a row of ``acc`` (``AC_*``), the tree's tag ids."""
    row = [0] * cl.AC_COLS
    row[AC_LEVEL] = index[a.level.name]
    row[AC_COUNT] = a.count
    row[AC_TILE] = a.tile
    row[AC_PRECISION] = a.precision
    row[AC_RW] = int(a.rw)
    row[AC_AT_TARGET] = int(a.at_target)
    row[AC_COMPUTE] = int(a.compute)
    row[AC_TID] = a.tid
    row[AC_RMW] = int(a.rmw)
    row[AC_PROJ] = a.proj_count
    row[AC_TAG] = tags[a.tag]
    return row


def _cost_row(c: Cost) -> list[int]:
    """A merged level cost as a row of ``lvl`` (``LO_*``)."""
    row = [0] * LO_COLS
    row[LO_PRESENT] = 1
    row[LO_COMPUTE_TIME] = c.compute_time
    row[LO_REUSE] = c.reuse
    row[LO_CUMM] = c.cumm
    row[LO_RAMP_UP] = c.ramp_up
    row[LO_RAMP_DOWN] = c.ramp_down
    return row


def _energy_rows(tree: list[TreeNode], flat: FlatArch) -> tuple[Ints, dict[str, int]]:
    """``erow`` (module docstring) and the energy rows' names, numbered as met."""
    rows: dict[str, int] = {}
    levels = [lv.name for lv in flat.levels]
    tile: list[int] = []  # a tile node's [level, ER_*] rows, flat
    for name in levels:
        tile += [rows.setdefault(name, len(rows)), rows.setdefault(f"{name}<->{name}", len(rows))]
    none = [-1] * (2 * len(levels))
    out: list[int] = []
    for node in tree:
        if node.kind == "tile" and node.is_leaf_tile:
            op = node.children[0].op_name  # a compute level's row names the op
            leaf = list(tile)
            for g, lv in enumerate(flat.levels):
                if lv.is_compute:
                    leaf[2 * g + ER_LEVEL] = rows.setdefault(f"{lv.name}-{op}", len(rows))
            out += leaf
        elif node.kind == "tile":
            out += tile
        elif node.kind == "collective":
            col = list(none)
            name, g = node.target, flat.index[node.target]
            col[2 * g + ER_LEVEL] = rows.setdefault(name, len(rows))
            col[2 * g + ER_NOC] = rows.setdefault(
                f"{name}<->{name}-{node.col_type.upper()}", len(rows))  # fmt: skip
            out += col
        else:
            out += none
    return np.array(out, dtype=np.int64).reshape(len(tree), len(levels), 2), rows


def _groups(
    ss: SteadyState, node: TreeNode, r: int, flat: FlatArch, units: dict[str, int]
) -> tuple[list[list[int]], list[int]]:
    """The level-cost groups stage 6 reads of ``node``: rows of ``groups``, of ``lvl`` (flat)."""
    shown = node.kind == "collective" or (node.spatial or node.is_leaf_tile)
    if node.kind not in ("tile", "collective") or not shown:
        return [], []
    index = flat.index
    size = 2 * LO_COLS  # a level's two ports
    rows: list[list[int]] = []
    costs: list[int] = []
    for levels in ss.level_cost.get(node.id, {}).values():
        if node.kind == "collective":
            key = f"{node.col_type.upper()}-{node.id}"
        else:
            key = "".join([f"{n}-" for n in sorted(levels, key=index.__getitem__)])
        rows.append([r, units.setdefault(key, len(units))])
        block = [0] * (size * len(flat.levels))
        for name, (read, write) in levels.items():
            at = size * index[name]
            block[at : at + size] = _cost_row(read) + _cost_row(write)
        costs += block
    return rows, costs


def _node_row(node: TreeNode, parent: int, ss: SteadyState) -> list[int]:
    """A node's row of ``nodes`` without its ranges, op type and units (``ND_*``)."""
    row = [0] * ND_COLS
    row[ND_KIND] = _KINDS[node.kind]
    row[ND_PARENT] = parent
    row[ND_SPATIAL] = int(node.spatial)
    row[ND_LEAF] = int(node.is_leaf_tile)
    row[ND_OP_TYPE] = row[ND_TMW_UNIT] = -1
    row[ND_CYCLES] = ss.node_cost.get(node.id, 0)
    return row


def flatten_tree(ss: SteadyState, fe: FlatEnergyArch) -> FlatTree:
    """The tree of ``ss`` after stage 4 (``ss.visit``) as arrays (module docstring).

    Call it before :meth:`.energy.Energy.walk`, which scales the accesses in place.
    """
    flat = fe.flat
    index = flat.index
    tree = pre_order(ss.inp.mapping)
    row_of = {node.id: r for r, node in enumerate(tree)}
    tags: dict[str, int] = {}
    for node in tree:
        for tag in node.tags:
            tags.setdefault(tag, len(tags))
    erow, rows = _energy_rows(tree, flat)
    units: dict[str, int] = {}
    table: list[list[int]] = []
    slots: list[Ints] = []
    slot_tags: list[int] = []
    acc: list[list[int]] = []
    acc_pj: list[tuple[float, float]] = []
    col_pj = [(0.0, 0.0)] * len(tree)
    groups: list[list[int]] = []
    lvl: list[int] = []
    op_types = [""] * len(tree)
    n_tids = 0
    for r, node in enumerate(tree):
        row = _node_row(node, -1 if node.parent is None else row_of[node.parent.id], ss)
        table.append(row)
        if node.kind == "tile":
            sl, _tags, _keys = cl.flatten_slots(node, ss.nests.tiles[node.id],
                                                ss.moves[node.id], flat)  # fmt: skip
            row[ND_SLOT0], row[ND_N_SLOTS] = len(slot_tags), len(sl)
            slot_tags += [tags[t] for t in node.tags]
            slots.append(sl)
            n_tids = max([n_tids, *(t + 1 for t in node.tensors)])
        elif node.kind == "collective":
            row[ND_COL_IN], row[ND_COL_TARGET] = node.in_tensor, index[node.target]
            col_pj[r] = ss.col_energy.get(node.id, (0.0, 0.0))
            n_tids = max(n_tids, node.in_tensor + 1)
        accesses = ss.accesses.get(node.id, [])
        row[ND_ACC0], row[ND_N_ACC] = len(acc), len(accesses)
        for a in accesses:
            acc.append(_access_row(a, index, tags))
            acc_pj.append((a.noc_pj, a.mac_pj))
            n_tids = max(n_tids, a.tid + 1)
        rows_g, costs = _groups(ss, node, r, flat, units)
        row[ND_GROUP0], row[ND_N_GROUPS] = len(groups), len(rows_g)
        groups += rows_g
        lvl += costs
        if node.is_leaf_tile:
            op_type = op_types[r] = next((a.op_type for a in accesses if a.compute), "")
            row[ND_OP_TYPE] = fe.op_types.index(op_type) if op_type in fe.op_types else -1
            row[ND_TMW_UNIT] = units.setdefault(node.children[0].op_name, len(units))
    names = tuple(rows)
    all_slots = np.concatenate(slots) if slots else np.zeros((0, cl.SL_COLS), dtype=np.int64)
    all_slots[:, SL_TAG] = slot_tags
    return FlatTree(
        tree=tuple(tree),
        op_types=tuple(op_types),
        nodes=np.array(table, dtype=np.int64).reshape(-1, ND_COLS),
        slots=all_slots,
        acc=np.array(acc, dtype=np.int64).reshape(-1, cl.AC_COLS),
        acc_pj=np.array(acc_pj, dtype=np.float64).reshape(-1, cl.AP_COLS),
        col_pj=np.array(col_pj, dtype=np.float64).reshape(-1, 2),
        groups=np.array(groups, dtype=np.int64).reshape(-1, GR_COLS),
        lvl=np.array(lvl, dtype=np.int64).reshape(-1, len(flat.levels), 2, LO_COLS),
        erow=erow,
        row_order=np.array(sorted(range(len(names)), key=names.__getitem__), dtype=np.int64),
        tags=tuple(tags),
        rows=names,
        units=tuple(units),
        n_tids=n_tids,
    )


# --- the kernel: stage 5 (energy.py) -----------------------------------------------------------


@numba.njit(cache=True, inline="always")
def _tid_mask(nodes, slots, r, left, mask):  # type: ignore[no-untyped-def]
    """``mask``: the tensors of tile node ``r`` and (``left``) of the tile nodes on its left."""
    mask[:] = False
    p = nodes[r, ND_PARENT]
    first = p + 1 if left and p >= 0 else r
    for s in range(first, r + 1):
        if s == r or (nodes[s, ND_PARENT] == p and nodes[s, ND_KIND] == NK_TILE):
            s0 = nodes[s, ND_SLOT0]
            for k in range(s0, s0 + nodes[s, ND_N_SLOTS]):
                mask[slots[k, SL_TID]] = True


@numba.njit(cache=True, inline="always")
def max_count(tab, r, mask):  # type: ignore[no-untyped-def]
    """:func:`.energy._max_count` of ``tab[r]``: ``(found, largest masked count, >= 1)``."""
    found, best = False, 1
    for g in range(tab.shape[1]):
        for t in range(tab.shape[2]):
            v = tab[r, g, t]
            if v >= 0 and mask[t]:
                found = True
                best = max(best, v)
    return found, best


@numba.njit(cache=True, inline="always")
def _has_tag(tab, r, g):  # type: ignore[no-untyped-def]
    """Whether table ``tab[r]`` has op tag ``g`` (an entry of it: a tag is never added empty)."""
    for t in range(tab.shape[2]):
        if tab[r, g, t] >= 0:
            return True
    return False


@numba.njit(cache=True, inline="always")
def _put(tab, stamp, r, clock, g, t, n):  # type: ignore[no-untyped-def]
    """``tab[r][g][t] = n``; a new tag gets the next stamp (``iters``' insertion order)."""
    if stamp[r, g] < 0:
        stamp[r, g] = clock[0]
        clock[0] += 1
    tab[r, g, t] = n


@numba.njit(cache=True, inline="always")
def instances(sp, r, g, t, own, scope, is_root, has_parent):  # type: ignore[no-untyped-def]
    """:meth:`.energy.Energy._instances` of ``sp[r]``: ``(error, instances)``; adds the tensor.

    A tag that has the tensor gives its instances; one that has it not gets its own tensors'
    largest; no tag: the largest in scope.
    """
    if _has_tag(sp, r, g):
        if sp[r, g, t] >= 0:
            return EE_NONE, sp[r, g, t]
        nodes = 1
        for u in range(sp.shape[2]):
            if own[u] and sp[r, g, u] > nodes:
                nodes = sp[r, g, u]
        sp[r, g, t] = nodes
        return EE_NONE, nodes
    if is_root:
        return EE_NONE, 1
    if not has_parent:
        return EE_NO_PARENT, 0
    found, nodes = max_count(sp, r, scope)
    return (EE_NONE if found else EE_NO_INSTANCES), nodes


@numba.njit(cache=True, inline="always")
def compute_repeats(it, r, g, own, scope, has_parent):  # type: ignore[no-untyped-def]
    """:meth:`.energy.Energy._compute_repeats` of ``it[r]``: ``(error, iterations above)``."""
    if _has_tag(it, r, g):
        n = 1
        for u in range(it.shape[2]):
            if own[u] and it[r, g, u] > n:
                n = it[r, g, u]
        return EE_NONE, n
    found, n = max_count(it, r, own)
    if not found:
        if not has_parent:
            return EE_NO_PARENT, 0
        found, n = max_count(it, r, scope)
    return EE_NONE, n


@numba.njit(cache=True, inline="always")
def memory_pj(acc, j, count, price, level):  # type: ignore[no-untyped-def]
    """:func:`.energy.memory_pj` of access row ``acc[j]`` at ``level``, ``count`` accesses."""
    col = (EP_WRITE_TARGET if acc[j, AC_RW] else EP_READ_TARGET) + (
        0 if acc[j, AC_AT_TARGET] else 1
    )
    tile = acc[j, AC_TILE] * acc[j, AC_PROJ] * acc[j, AC_PRECISION]
    e = np.float64(count * tile) * price[level, col]
    e /= price[level, EP_BITS]
    return e * 2 if acc[j, AC_RMW] else e


@numba.njit(cache=True, inline="always")
def unit_energy_pj(lv, unit_class, price, simd_pj, level, op_type, mac_pj):  # type: ignore[no-untyped-def]
    """:func:`.compute.unit_energy_pj`: ``(error, pJ of one access of compute unit level)``."""
    kind = unit_class[level]
    if kind == UC_MAC:
        return EE_NONE, mac_pj
    if kind == UC_SIMD:
        per = simd_pj[level, op_type] if op_type >= 0 else np.nan
        if math.isnan(per):
            return EE_NO_SIMD_PJ, 0.0
        return EE_NONE, per * lv[level, LV_COMPUTE_WIDTH]
    return EE_NONE, price[level, EP_COMPUTE] * lv[level, LV_INSTANCES]


@numba.njit(cache=True, inline="always")
def _fits(a, b, c, d):  # type: ignore[no-untyped-def]
    """Whether the product ``a b c d`` stays below ``_LIMIT`` (no int64 wrap)."""
    return abs(np.float64(a) * np.float64(b) * np.float64(c) * np.float64(d)) < _LIMIT


@numba.njit(cache=True)
def tile_energy(nodes, slots, acc, acc_pj, r, sp, it, stamp, here, fan, arrays, out, scratch):  # type: ignore[no-untyped-def]
    """:meth:`.energy.Energy._tile` of spatial or leaf node ``r``: ``(error, access row)``.

    ``sp``, ``it``, ``stamp``: the nodes' tables, row ``r`` the node's (its parent's, updated
    here); ``here[r]``: its at-target counts; ``fan``: its spatial ancestors' fan-out;
    ``arrays``: ``(lv, unit_class, price, simd_pj, tag_instances)``; ``out``: ``(counts,
    level_pj, level_has, noc_pj, noc_has, parent_iters)``, written at ``r`` and its accesses'
    rows; ``scratch``: ``(clock, own, scope, flags)``, :func:`walk`'s. Tables are indexed by
    row, never sliced (:mod:`.compiled`: no views).
    """
    lv, unit_class, price, simd_pj, tag_instances = arrays
    counts, level_pj, level_has, noc_pj, noc_has, parent_iters = out
    clock, own, scope, _flags = scratch
    _tid_mask(nodes, slots, r, False, own)
    _tid_mask(nodes, slots, r, True, scope)
    has_parent = nodes[r, ND_PARENT] >= 0
    is_root = nodes[r, ND_PARENT] == 0
    repeats = 0
    stop, row = EE_NONE, -1  # an error breaks the loop
    a0 = nodes[r, ND_ACC0]
    for j in range(a0, a0 + nodes[r, ND_N_ACC]):
        memory = not acc[j, AC_COMPUTE]
        g, t, level, count = acc[j, AC_TAG], acc[j, AC_TID], acc[j, AC_LEVEL], acc[j, AC_COUNT]
        if memory and acc[j, AC_AT_TARGET]:
            here[r, g, t] = count
        if memory and not is_root:
            if repeats == 0:  # _parent_iters
                if not has_parent:
                    stop, row = EE_NO_PARENT, j
                    break
                found, repeats = max_count(it, r, scope)
                if not found:
                    stop, row = EE_NO_ITERS, j
                    break
                parent_iters[r] = max(parent_iters[r], repeats)
            if not _fits(count, repeats, 1, 1):
                stop, row = EE_RANGE, j
                break
            count *= repeats  # _repeat
            _put(it, stamp, r, clock, g, t, repeats)
            if not acc[j, AC_AT_TARGET]:
                noc_pj[r, level] += acc_pj[j, AP_NOC] * repeats
                noc_has[r, level] = True
        err, n_inst = instances(sp, r, g, t, own, scope, is_root, has_parent)
        if err:
            stop, row = err, j
            break
        if not tag_instances:
            n_inst = fan
        if memory:
            if not _fits(count, acc[j, AC_TILE], acc[j, AC_PROJ], acc[j, AC_PRECISION]):
                stop, row = EE_RANGE, j
                break
            e = n_inst * memory_pj(acc, j, count, price, level)
        else:
            err, n = compute_repeats(it, r, g, own, scope, has_parent)
            if err:
                stop, row = err, j
                break
            if not _fits(n_inst, count, n, 1):
                stop, row = EE_RANGE, j
                break
            count *= n
            err, per = unit_energy_pj(lv, unit_class, price, simd_pj, level,
                                      nodes[r, ND_OP_TYPE], acc_pj[j, AP_MAC])  # fmt: skip
            if err:
                stop, row = err, j
                break
            e = n_inst * count * per
        counts[j] = count
        level_pj[r, level] += e
        level_has[r, level] = True
    if stop:
        return stop, row
    _fan_out_here(nodes, slots, acc, r, sp)
    return EE_NONE, -1


@numba.njit(cache=True, inline="always")
def _fan_out_here(nodes, slots, acc, r, sp):  # type: ignore[no-untyped-def]
    """:meth:`.energy.Energy._fan_out_here`: instances times the tensors' fan-out.

    The ``k``-th at-target access takes the ``k``-th tensor's fan-out (COMET's indexing).
    """
    s0, n_slots, a0 = nodes[r, ND_SLOT0], nodes[r, ND_N_SLOTS], nodes[r, ND_ACC0]
    k = 0
    for j in range(a0, a0 + nodes[r, ND_N_ACC]):
        if not acc[j, AC_AT_TARGET]:
            continue
        f = slots[s0 + k, SL_SP_ITERS] if k < n_slots else 1
        g, t = acc[j, AC_TAG], acc[j, AC_TID]
        sp[r, g, t] = sp[r, g, t] * f if sp[r, g, t] >= 0 else f
        k += 1


@numba.njit(cache=True, inline="always")
def _add_here(nodes, acc, r, here, it, stamp, clock, done):  # type: ignore[no-untyped-def]
    """:meth:`.energy.Energy.walk`: node ``r``'s iterations times its at-target counts.

    By tag in the order the node met them (``iters``' insertion order); the tables' row ``r``.
    Returns whether the products stay in range. ``done``: scratch, a flag per tag.
    """
    done[:] = False
    a0 = nodes[r, ND_ACC0]
    for j in range(a0, a0 + nodes[r, ND_N_ACC]):
        g = acc[j, AC_TAG]
        if acc[j, AC_COMPUTE] or not acc[j, AC_AT_TARGET] or done[g]:
            continue
        done[g] = True
        for t in range(here.shape[2]):
            n = here[r, g, t]
            if n < 0:
                continue
            if it[r, g, t] >= 0:
                if not _fits(it[r, g, t], n, 1, 1):
                    return False
                it[r, g, t] *= n
            else:
                _put(it, stamp, r, clock, g, t, n)
    return True


@numba.njit(cache=True)
def collective_energy(nodes, slots, acc, col_pj, r, it, stamp, here, out, tagged):  # type: ignore[no-untyped-def]
    """:meth:`.energy.Energy._collective` of collective ``r``: an error or ``EE_NONE``.

    ``it``, ``stamp``, ``here``: the nodes' tables and at-target counts, of which it reads and
    writes its parent's rows; ``out`` as :func:`tile_energy`'s; ``tagged``: scratch, a flag
    per tag.
    """
    counts, level_pj, level_has, noc_pj, noc_has, parent_iters = out
    p, tin, tgt = nodes[r, ND_PARENT], nodes[r, ND_COL_IN], nodes[r, ND_COL_TARGET]
    tagged[:] = False  # _left_tags, and the last of them
    last, left = -1, -1
    for s in range(p + 1, r):
        if nodes[s, ND_PARENT] == p and nodes[s, ND_KIND] == NK_TILE:
            left = s
            s0 = nodes[s, ND_SLOT0]
            for k in range(s0, s0 + nodes[s, ND_N_SLOTS]):
                if slots[k, SL_TID] == tin:
                    last = slots[k, SL_TAG]
                    tagged[last] = True
    memory, network = col_pj[r, CP_MEMORY], col_pj[r, CP_NETWORK]
    if not nodes[p, ND_SPATIAL]:
        if left < 0 or last < 0:
            return EE_NO_LEFT
        a0 = nodes[left, ND_ACC0]
        for j in range(a0, a0 + nodes[left, ND_N_ACC]):
            if acc[j, AC_AT_TARGET] and not acc[j, AC_COMPUTE]:
                here[p, acc[j, AC_TAG], acc[j, AC_TID]] = counts[j]
        n = max(here[p, last, tin], 0)
        level_pj[r, tgt] = memory * n
        noc_pj[r, tgt] = network * n
    else:
        n, newest = 1, -1  # the last tag in iters' order that has the tensor
        for g in range(here.shape[1]):
            if tagged[g] and it[p, g, tin] >= 0 and stamp[p, g] > newest:
                n, newest = it[p, g, tin], stamp[p, g]
        level_pj[r, tgt] = memory
        noc_pj[r, tgt] = network
        for lv in range(level_pj.shape[1]):
            if level_has[p, lv]:
                level_pj[p, lv] *= n
            if noc_has[p, lv]:
                noc_pj[p, lv] *= n
    parent_iters[r] = n
    level_has[r, tgt] = noc_has[r, tgt] = True
    return EE_NONE


@numba.njit(cache=True)
def fan_out(nodes, slots):  # type: ignore[no-untyped-def]
    """:meth:`.energy.Energy._fan`: per node, its spatial ancestors' largest fan-outs' product."""
    fan = np.ones(nodes.shape[0], dtype=np.int64)
    for r in range(1, nodes.shape[0]):
        p = nodes[r, ND_PARENT]
        f = 1
        if nodes[p, ND_KIND] == NK_TILE and nodes[p, ND_SPATIAL] and nodes[p, ND_N_SLOTS]:
            s0 = nodes[p, ND_SLOT0]
            f = slots[s0, SL_SP_ITERS]
            for k in range(s0, s0 + nodes[p, ND_N_SLOTS]):
                f = max(f, slots[k, SL_SP_ITERS])
        fan[r] = fan[p] * f
    return fan


@numba.njit(cache=True, inline="always")
def _walked(nodes, r):  # type: ignore[no-untyped-def]
    """Whether :meth:`.energy.Energy.walk` reaches node ``r`` (its parent's row is decided)."""
    p, kind = nodes[r, ND_PARENT], nodes[r, ND_KIND]
    if p < 0:
        return kind == NK_TILE
    return (nodes[p, ND_KIND] == NK_TILE and not nodes[p, ND_LEAF]
            and (kind == NK_TILE or kind == NK_COLLECTIVE))  # fmt: skip


@numba.njit(cache=True)
def walk(nodes, slots, acc, acc_pj, col_pj, n_tags, n_tids, arrays, head, out):  # type: ignore[no-untyped-def]
    """Stage 5, :meth:`.energy.Energy.walk`, in pre-order over the rows.

    Each tile node starts from its parent's tables as the parent left them (the reference hands
    copies to every child but the last, whose changes no one reads). Writes ``out`` (see
    :func:`tile_energy`); an error goes to ``head`` and stops the walk.
    """
    n = nodes.shape[0]
    sp = np.empty((n, n_tags, n_tids), dtype=np.int64)
    it = np.empty((n, n_tags, n_tids), dtype=np.int64)
    stamp = np.empty((n, n_tags), dtype=np.int64)
    here = np.empty((n, n_tags, n_tids), dtype=np.int64)
    reached = np.zeros(n, dtype=np.bool_)
    clock = np.zeros(1, dtype=np.int64)
    flags = np.zeros(n_tags, dtype=np.bool_)
    scratch = (clock, np.zeros(n_tids, dtype=np.bool_), np.zeros(n_tids, dtype=np.bool_), flags)
    fan = fan_out(nodes, slots)
    for r in range(n):
        p = nodes[r, ND_PARENT]
        reached[r] = _walked(nodes, r) and (p < 0 or reached[p])
        if not reached[r]:
            continue
        for g in range(n_tags):  # rows copied by element: no views (:mod:`.compiled`)
            for t in range(n_tids):
                here[r, g, t] = -1
        err, row = EE_NONE, -1
        if nodes[r, ND_KIND] == NK_COLLECTIVE:
            err = collective_energy(nodes, slots, acc, col_pj, r, it, stamp, here, out, flags)
        else:
            for g in range(n_tags):
                stamp[r, g] = -1 if p < 0 else stamp[p, g]
                for t in range(n_tids):
                    sp[r, g, t] = -1 if p < 0 else sp[p, g, t]
                    it[r, g, t] = -1 if p < 0 else it[p, g, t]
            if nodes[r, ND_SPATIAL] or nodes[r, ND_LEAF]:
                err, row = tile_energy(nodes, slots, acc, acc_pj, r, sp, it, stamp, here,
                                       fan[r], arrays, out, scratch)  # fmt: skip
            if not err and nodes[r, ND_SPATIAL] and not nodes[r, ND_LEAF]:
                if not _add_here(nodes, acc, r, here, it, stamp, clock, flags):
                    err = EE_RANGE
        if err:
            head[HD_ERROR], head[HD_ERROR_NODE], head[HD_ERROR_ROW] = err, r, row
            return


# --- the kernel: stage 6 (report.py) -----------------------------------------------------------


@numba.njit(cache=True, inline="always")
def group_cycles(block):  # type: ignore[no-untyped-def]
    """:func:`.report._group_cycles` of ``block[level, port, LO_*]``: ``(CS, cumm, compute)``."""
    cs_read = cs_write = cumm = comp = 0
    for g in range(block.shape[0]):
        if not block[g, 0, LO_PRESENT]:
            continue
        read, write = block[g, 0], block[g, 1]
        cs_read = max(cs_read, read[LO_RAMP_UP] + read[LO_RAMP_DOWN])
        cs_write = max(cs_write, write[LO_RAMP_UP] + write[LO_RAMP_DOWN])
        cumm = max(cumm, read[LO_CUMM], write[LO_CUMM])
        comp = max(comp, read[LO_COMPUTE_TIME], write[LO_COMPUTE_TIME])
    return cs_read + cs_write, cumm, comp


@numba.njit(cache=True)
def unit_cycles(nodes, groups, lvl, parent_iters, units, unit_has, unscaled_os):  # type: ignore[no-untyped-def]
    """:func:`.report.unit_cycles`: fills ``units`` and ``unit_has``, returns the table's sum."""
    total = 0
    for k in range(groups.shape[0]):
        r, u = groups[k, GR_NODE], groups[k, GR_UNIT]
        its = (parent_iters[r] if parent_iters[r] >= 0 else 1) & _WRAP
        cs, cumm, comp = group_cycles(lvl[k])
        if nodes[r, ND_KIND] == NK_COLLECTIVE:
            total += (cs + cumm) * its
            units[u, UT_OS] += (cs + cumm) * its
            unit_has[u, UT_OS] = True
            continue
        os_ = max(nodes[r, ND_CYCLES] - cs - comp, 0)
        total += (cs + os_) * its
        units[u, UT_CS] += cs * its
        units[u, UT_OS] += os_ if unscaled_os else os_ * its
        unit_has[u, UT_CS] = unit_has[u, UT_OS] = True
        if nodes[r, ND_LEAF]:
            total += comp * its
            m = nodes[r, ND_TMW_UNIT]
            units[m, UT_TMW] = comp * its
            unit_has[m, UT_TMW] = True
    return total


@numba.njit(cache=True, inline="always")
def _add_row(rows, row_has, row, e):  # type: ignore[no-untyped-def]
    """``rows[row] += e``, rounded to float32 (COMET's per-row sums)."""
    rows[row] = np.float64(np.float32(rows[row] + e))
    row_has[row] = True


@numba.njit(cache=True)
def level_energy(nodes, erow, order, level_pj, level_has, noc_pj, noc_has, calc_noc, rows, has):  # type: ignore[no-untyped-def]
    """:func:`.report.level_energy` into ``rows`` and ``has``; returns their float32 sum.

    The sum runs over the rows ``order`` gives (by name).

    A node adds to a row at most once, so the order of a node's rows does not matter.
    """
    for r in range(nodes.shape[0]):
        if nodes[r, ND_KIND] != NK_TILE and nodes[r, ND_KIND] != NK_COLLECTIVE:
            continue
        for lv in range(level_pj.shape[1]):
            if level_has[r, lv]:
                _add_row(rows, has, erow[r, lv, ER_LEVEL], level_pj[r, lv])
            if calc_noc and noc_has[r, lv]:
                _add_row(rows, has, erow[r, lv, ER_NOC], noc_pj[r, lv])
    total = 0.0
    for k in range(order.shape[0]):
        if has[order[k]]:
            total = np.float64(np.float32(total + rows[order[k]]))
    return total


@numba.njit(cache=True)
def energy_kernel(lv, unit_class, price, simd_pj, nodes, slots, acc, acc_pj, col_pj, groups,  # type: ignore[no-untyped-def]
                  lvl, erow, row_order, n_tags, n_tids, n_units, calc_noc, tag_instances,
                  unit_sum_total, unscaled_os):  # fmt: skip
    """Stages 5 and 6 from the arrays (module docstring).

    Returns ``(head, total_energy_pj, level_pj, level_has, noc_pj, noc_has, parent_iters,
    counts, rows, row_has, units, unit_has)``; ``head[HD_ERROR]`` non-zero: the reference
    raises there (:func:`raise_error`), the rest is undefined.
    """
    n, n_lv, n_rows = nodes.shape[0], lv.shape[0], row_order.shape[0]
    head = np.zeros(HD_SIZE, dtype=np.int64)
    level_pj = np.zeros((n, n_lv), dtype=np.float64)
    noc_pj = np.zeros((n, n_lv), dtype=np.float64)
    level_has = np.zeros((n, n_lv), dtype=np.bool_)
    noc_has = np.zeros((n, n_lv), dtype=np.bool_)
    parent_iters = np.full(n, -1, dtype=np.int64)
    counts = acc[:, AC_COUNT].copy()
    rows = np.zeros(n_rows, dtype=np.float64)
    row_has = np.zeros(n_rows, dtype=np.bool_)
    units = np.zeros((n_units, UT_COLS), dtype=np.int64)
    unit_has = np.zeros((n_units, UT_COLS), dtype=np.bool_)
    out = (counts, level_pj, level_has, noc_pj, noc_has, parent_iters)
    walk(nodes, slots, acc, acc_pj, col_pj, n_tags, n_tids,
         (lv, unit_class, price, simd_pj, tag_instances), head, out)  # fmt: skip
    total_pj = 0.0
    if not head[HD_ERROR]:
        total = unit_cycles(nodes, groups, lvl, parent_iters, units, unit_has, unscaled_os)
        head[HD_TOTAL_CYCLES] = total if unit_sum_total else nodes[0, ND_CYCLES]
        total_pj = level_energy(nodes, erow, row_order, level_pj, level_has, noc_pj, noc_has,
                                calc_noc, rows, row_has)  # fmt: skip
    return (head, total_pj, level_pj, level_has, noc_pj, noc_has, parent_iters, counts, rows,
            row_has, units, unit_has)  # fmt: skip


# --- the wrapper (Python) ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EnergyArrays:
    """The kernel's result (:func:`energy_kernel`), see the module docstring."""

    head: Ints
    total_energy_pj: float
    level_pj: Floats
    level_has: Bools
    noc_pj: Floats
    noc_has: Bools
    parent_iters: Ints
    counts: Ints
    rows: Floats
    row_has: Bools
    units: Ints
    unit_has: Bools

    @property
    def total_cycles(self) -> int:
        """The total cycles (COMET's table's sum, or natively the root's cycles)."""
        return int(self.head[HD_TOTAL_CYCLES])


def run_energy(tree: FlatTree, fe: FlatEnergyArch, calc_noc: bool = True) -> EnergyArrays:
    """The kernel on a flattened tree; the reference's exceptions where it raises.

    ``calc_noc``: add the routers' energy rows (COMET's ``--calc_noc_energy``).

    Raises:
        TreeModelError: a tree COMET cannot evaluate (as the reference words it).
        OverflowError: an integer product past the kernel's int64 range.
    """
    out = EnergyArrays(*energy_kernel(
        fe.flat.lv, fe.unit_class, fe.price, fe.simd_pj, tree.nodes, tree.slots, tree.acc,
        tree.acc_pj, tree.col_pj, tree.groups, tree.lvl, tree.erow, tree.row_order,
        max(len(tree.tags), 1), max(tree.n_tids, 1), len(tree.units), calc_noc,
        fe.tag_instances, fe.unit_sum_total, fe.unscaled_os,
    ))  # fmt: skip
    if out.head[HD_ERROR]:
        raise_error(out.head, tree)
    return out


def raise_error(head: Ints, tree: FlatTree) -> None:
    """Raise the reference's exception for the kernel's error ``head[HD_ERROR]``."""
    err = int(head[HD_ERROR])
    node = tree.tree[int(head[HD_ERROR_NODE])]
    if err == EE_RANGE:
        raise OverflowError(f"{node.label}: an integer product past int64 (compiled energy)")
    op_type = tree.op_types[int(head[HD_ERROR_NODE])]
    messages = {
        EE_NO_PARENT: f"{node.label}: expected a parent node",
        EE_NO_ITERS: f"{node.label}: no parent iteration count",
        EE_NO_INSTANCES: f"{node.label}: no parent instance count",
        EE_NO_LEFT: f"{node.label}: no tile node producing its tensor on the left",
        EE_NO_SIMD_PJ: f"op type {op_type} has no SIMD energy",
    }
    raise TreeModelError(messages.get(err, f"{node.label}: compiled energy error {err}"))


def unit_table(out: EnergyArrays, tree: FlatTree) -> dict[str, dict[str, int]]:
    """COMET's per-unit table as the reference's report gives it (``cycles``)."""
    table: dict[str, dict[str, int]] = {}
    for u, name in enumerate(tree.units):
        row = {_UT_NAMES[c]: int(out.units[u, c]) for c in range(UT_COLS) if out.unit_has[u, c]}
        if row:
            table[name] = row
    return {k: {**row, "total": sum(row.values())} for k, row in sorted(table.items())}


def energy_rows(out: EnergyArrays, tree: FlatTree) -> dict[str, float]:
    """The energy rows as the reference's report gives them (``energy_pj``)."""
    got = {name: float(out.rows[k]) for k, name in enumerate(tree.rows) if out.row_has[k]}
    return dict(sorted(got.items()))


def to_report(out: EnergyArrays, tree: FlatTree) -> dict[str, Any]:
    """What :func:`.report.report` with ``detail=False`` gives of the kernel's numbers.

    ``total_cycles``, ``total_energy_pj``, ``cycles``, ``energy_pj`` and ``root_cycles``.
    """
    return {
        "total_cycles": out.total_cycles,
        "total_energy_pj": out.total_energy_pj,
        "cycles": unit_table(out, tree),
        "energy_pj": energy_rows(out, tree),
        "root_cycles": int(tree.nodes[0, ND_CYCLES]),
    }


def analyse_compiled(
    inp: TreeMapping,
    calc_noc: bool = True,
    compat: Compat | None = None,
    fe: FlatEnergyArch | None = None,
    fold: bool = True,
) -> dict[str, Any]:
    """Stages 1-4 as the reference (:func:`.stages.analyse`), then 5 and 6 compiled.

    Args:
        inp: the tree, its hierarchy and its op chain.
        calc_noc: add the routers' energy rows.
        compat: which of COMET's defects to reproduce; all of them by default.
        fe: the arch's :func:`flatten_energy_arch` for ``compat``, when the caller has it.
        fold: fold leaves whose costs repeat (the reference's ``fold``).

    Returns:
        :func:`to_report`'s totals and tables.

    Raises:
        FitError: the tiling overflows a level.
        TreeModelError: a tree COMET cannot evaluate.
    """
    compat = compat or Compat()
    fit_check(inp, compat)
    nests = build_nests(inp)
    moves = build_movements(inp, nests)
    ss = SteadyState(inp, nests, moves, compat, None, fold)
    ss.visit(inp.mapping)
    fe = fe or flatten_energy_arch(inp.arch, compat)
    tree = flatten_tree(ss, fe)
    return to_report(run_energy(tree, fe, calc_noc), tree)
