r"""Stage 4 of a whole tree, compiled: :class:`.steady.SteadyState` above the leaves.

The second piece of the compiled twin of the tree model (numba, ``@njit(cache=True)``), after
:mod:`.compiled_leaf`: one kernel, :func:`tree_kernel`, walks a whole tree in post-order and
evaluates every node's stage 4: leaves (:func:`.compiled_leaf.leaf_kernel`, called from the
kernel), spatial tile nodes (:meth:`~.steady.SteadyState.visit_spatial`), temporal tile nodes
over sequential children (:meth:`~.steady.SteadyState.visit_temporal`, and the pass-through of
a temporal node without bindings) and collectives
(:meth:`~.steady.SteadyState.visit_collective`). :func:`tree_result` wraps its arrays into the
reference's tables (``node_cost``, ``level_cost``, ``accesses``, ``ramp_up``, ``ramp_down``,
``reuse``, ``actual``, ``col_energy``); the results are bit-identical (tested node by node,
``tests/accel/test_compiled_upper.py``).

Inputs (:mod:`.compiled_leaf`'s conventions; the column names are this module's constants):

* the tree's shape (:func:`tree_shape`, once per template: the tilings of one template share
  it): a node table ``nodes[row, N_*]``, one row per tile or collective node in post-order (so
  the kernel walks rows in order and a node's children come before it), with its kind
  (``NK_*``), its slots, its op, and spans of the concatenated tables below;
  ``refs`` (node rows): a spatial node's window (the child, or the bound children), a
  temporal node's bound collectives (each one merged level cost) and the pass-through's child;
  ``uses`` (node rows): the children whose level costs hold a shared port (spatial), or the
  children whose cycles a temporal node sums; ``ents[entry, E_*]``: per spatial node, the
  (child, tensor) pairs whose tag the child runs, each a port cost, with how it hides
  (``HIDE_*``); ``strips[row, ST_*]``: the reused reads whose ramp-ups leave the window
  (:meth:`~.steady.SteadyState.window_vector` as a program); ``sgkey[slot]`` numbers the
  tree's (tensor, tag) keys, sorted, for the per-key tables;
* the numbers of one tiling (:func:`flatten_tree`): every tile node's slots concatenated
  (``slots[slot, SL_*]``), the leaves' ops concatenated (``ops``), and per collective its
  ints and floats (``col[c, CI_*]``, ``colf[c, CF_*]``).

Outputs: ``head[TH_*]`` (the first error in post-order, and where), per node row its cycles
(``cyc``), per merged level cost group its costs per level and port (``glv[group, level, port,
LU_*]``: :data:`.compiled_leaf.LO_PRESENT` .. ``LO_RAMP_DOWN`` and ``LU_CUMM_STALL``), the
accesses (``acc[row, AC_*]``, ``acc_pj[row, AP_*]``: a leaf's as :mod:`.compiled_leaf`, a
spatial node's two per entry, at the target and at the child), per node and key its tables
(``kt[row, key, KT_*]``) and per collective its energies (``col_pj[row, CP_*]``).

The formulas, as in the reference (:mod:`.steady`, :mod:`.transfers`, :mod:`.merge`,
:mod:`.collectives`, :mod:`fusekit.accel.noc`). A spatial node of ``n`` iterations over a
window of ``W`` cycles (the child's, or the bound children's summed, 32-bit wrap) starts from
the window vector ``w_i = W``; for every key the node reuses ``f > 1`` times and a child (or,
below a single non-leaf child, a grandchild, and then its children) moves once, its ramp-up
``u`` leaves every iteration but each ``f``-th: :math:`w_i \leftarrow (w_i - u) \bmod 2^{32}`.
Each entry (a tensor the child reads or writes) with reuse ``f = n_t // a`` covers the windows

.. math:: v_i = \sum_{j=i}^{i+f-1} w_j \ (i \equiv 0 \bmod f), \qquad v_i = 0 \text{ otherwise}

and its picked iteration ``i`` moves ``e_i`` cycles (memory plus network,
:func:`.compiled_leaf.transfer`) and stalls ``e_i - v_i`` (hidden) or ``e_i`` (not hidden: a
collective child, or a dependent tensor under sequential bindings), the first read and the last
write being ramps; the entry's window is ``W f`` over its ``a`` moving iterations, less what
the children's transfers hold of a port shared with the parent (a read port: the children's
write ``cumm + ramp_down``; a write port: their read ``cumm + ramp_up``). Per target level and
port the entries merge (:mod:`.merge`: stalls over windows add, a hidden transfer uses up the
later entries' windows, a not hidden one adds its own stalls as compulsory) and

.. math::

    cycles = \max_{level, port} \sum_i w_i + \max ramp_{up} + \max ramp_{down}
             + \sum_i \max_{level, port} (stall_i + compulsory_i) \pmod{2^{32}}.

A temporal node with bindings sums its children's cycles, a bound collective's times the
node's ``n`` iterations (its merged cost: ``compute_time = cumm = n c``); without bindings it
takes its last child's. A collective's cycles are its memory cycles (per kind, float64 as
:mod:`.collectives`: gather, broadcast, reduction, all-gather, all-reduce, scatter) plus its
network cycles (:func:`fusekit.accel.noc.link_latency`: hops and data of the sub-mesh, float32;
all-reduce and all-gather in two parts, a reduction's ``s q n / 16`` cycles on the way), and
its energies the blocks read and written and ORION's router energy.

What is not here: the merged costs' per-iteration vectors (no parent reads them; the merged
windows are not computed at all). The reference's leaf ``memo`` has a twin, :func:`new_leaf_memo`
(kept by a compiled template for all its batches): a leaf whose slot rows and op equal a kept
leaf's, compared in full behind a 64-bit hash (:func:`leaf_lookup`), reuses its results in
:func:`tree_kernel` without a call; only a miss runs :func:`leaf_node`. The
:class:`~fusekit.accel.compat.Compat` switches read: ``simd_constants``, ``mesh_table`` and
``port_overwrite`` (through :class:`.compiled_leaf.FlatArch`) and ``binding_misread`` (the
shape: whether a spatial node's binding is sequential); the others act in stages 1, 5 and 6.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np

from fusekit.accel.compat import Compat
from fusekit.accel.noc import MeshShapeError
from fusekit.accel.tree import Hierarchy, TreeMapping, TreeNode
from fusekit.accel.tree_model import compiled_leaf as cl
from fusekit.accel.tree_model.compiled_leaf import (
    AC_AT_TARGET,
    AC_COLS,
    AC_COUNT,
    AC_LEVEL,
    AC_PRECISION,
    AC_PROJ,
    AC_RMW,
    AC_RW,
    AC_TAG,
    AC_TID,
    AC_TILE,
    AP_COLS,
    AP_MAC,
    AP_NOC,
    ERR_EMPTY,
    ERR_MESH,
    ERR_NONE,
    H_ERROR,
    H_ERROR_A,
    H_ERROR_B,
    H_ERROR_SLOT,
    H_SIZE,
    H_TOTAL,
    LO_COLS,
    LO_COMPUTE_TIME,
    LO_CUMM,
    LO_PRESENT,
    LO_RAMP_DOWN,
    LO_RAMP_UP,
    LO_REUSE,
    LV_COMPUTE,
    LV_SHARED_PORTS,
    NET_CHANNEL,
    NET_HOP_LATENCY,
    NET_QUEUING,
    OP_HEAD,
    SL_CHILD,
    SL_COLS,
    SL_DEPENDENT,
    SL_ITERS,
    SL_KEPT_TILE,
    SL_KEY,
    SL_MOVED_TILE,
    SL_MOVED_UNIQUE,
    SL_N,
    SL_PERIOD,
    SL_RMW,
    SL_RW,
    SL_SCALE,
    SL_TAG,
    SL_TARGET,
    SL_TID,
    TB_ACTUAL,
    TB_DOWN,
    TB_DOWN_HAS,
    TB_REUSE,
    TB_UP,
    TB_UP_HAS,
    FlatArch,
    Floats,
    Ints,
    entry_order,
    firsts_count,
    hops_data,
    is_first,
    leaf_kernel,
    merged_cost,
    moving,
    node_cycles,
    read_target_seen,
    router_pj,
    sub_mesh,
    transfer,
    use_up,
)
from fusekit.accel.tree_model.fit import binding_of
from fusekit.accel.tree_model.records import (
    Access,
    Cost,
    Moves,
    Nests,
    TreeModelError,
)
from fusekit.accel.tree_model.steady import NodeLevels, PerTensor

# --- the layout (see the module docstring) -----------------------------------------------------

#: ``nodes`` columns.
N_KIND, N_SLOT0, N_NSLOT, N_OP0, N_NOP, N_REF0, N_NREF, N_USE0, N_NUSE = range(9)
N_ENT0, N_NENT, N_STRIP0, N_NSTRIP, N_GRP0, N_NGRP, N_ACC0, N_NACC = range(9, 17)
N_COL, N_LIST, N_SHARED, N_HIT_TGT, N_HIT_CHL, N_ERROR = range(17, 23)
N_COLS = 23
#: ``N_KIND`` values.
NK_LEAF, NK_SPATIAL, NK_TEMPORAL, NK_PASS, NK_COLLECTIVE = range(5)

#: ``ents`` columns: the slot (a row of ``slots``), the child's node row, how it hides.
E_SLOT, E_CHILD, E_HIDE = 0, 1, 2
E_COLS = 3
#: ``E_HIDE`` values: not hidden, hidden, hidden unless the tensor is dependent.
HIDE_OFF, HIDE_ON, HIDE_INDEPENDENT = 0, 1, 2

#: ``strips`` columns: the operation, its node row, the rows of its sub-program that follow.
ST_OP, ST_NODE, ST_NSUB = 0, 1, 2
ST_COLS = 3
#: ``ST_OP`` values: a child's reused reads (``_strip_ramps``); a grandchild's, each repeating
#: the sub-program (the strips of its children) once per reused read.
OP_STRIP, OP_NESTED = 0, 1

#: ``col`` columns (ints of a collective).
CI_NET, CI_KIND, CI_RED, CI_TARGET, CI_RSIZE, CI_WSIZE, CI_NSRC, CI_NDST, CI_SF = range(9)
CI_PORT, CI_BROADCAST, CI_REDUCTION = 9, 10, 11
CI_COLS = 12
#: ``colf`` columns (floats of a collective).
CF_SCALE, CF_LR, CF_LW, CF_MW, CF_BLOCK, CF_RC, CF_WC = range(7)
CF_COLS = 7
#: ``CI_KIND`` values (any other kind: a scatter's memory model, its own name on the network).
CK_GATHER, CK_BROADCAST, CK_REDUCTION, CK_ALLGATHER, CK_ALLREDUCE, CK_SCATTER, CK_OTHER = range(7)
_COL_KINDS = {
    "gather": CK_GATHER,
    "broadcast": CK_BROADCAST,
    "reduction": CK_REDUCTION,
    "allgather": CK_ALLGATHER,
    "allreduce": CK_ALLREDUCE,
    "scatter": CK_SCATTER,
}
#: ``CI_RED`` values: no reduction op, :data:`fusekit.accel.noc.REDUCE_PJ`'s ops, another one.
RO_NONE, RO_ADD, RO_MAX, RO_MULT, RO_UNKNOWN = range(5)
_RED_OPS = {"": RO_NONE, "add": RO_ADD, "max": RO_MAX, "mult": RO_MULT}
#: :data:`fusekit.accel.noc.REDUCE_PJ` by ``RO_*`` (float32 values).
_REDUCE_PJ = np.array([0.0, 0.11, 0.0025, 0.64, 0.0], dtype=np.float32)
#: :data:`.collectives.RED_COST`.
RED_COST = 1

#: ``glv[group, level, port]`` columns: :data:`.compiled_leaf.LO_COLS`, then the cumulated
#: stall (a collective's cycles; 0 in a merged cost).
LU_CUMM_STALL = LO_COLS
LU_COLS = LO_COLS + 1

#: ``kt[row, key]`` columns: the reuse and moving iterations, the ramp-up and ramp-down tables.
KT_REUSE_HAS, KT_REUSE, KT_ACTUAL, KT_UP_HAS, KT_UP, KT_DOWN_HAS, KT_DOWN = range(7)
KT_COLS = 7
#: ``col_pj`` columns: a collective's memory and network energy.
CP_MEMORY, CP_NETWORK = 0, 1

#: ``head`` entries: :mod:`.compiled_leaf`'s error fields, then the node row.
TH_ERROR, TH_SLOT, TH_A, TH_B, TH_NODE = H_ERROR, H_ERROR_SLOT, H_ERROR_A, H_ERROR_B, 4
TH_SIZE = 5
#: Errors beyond :mod:`.compiled_leaf`'s: found by the shape or the flattening (the exception is
#: kept there), a scatter to one destination, a division by zero, an unknown reduction op.
ERR_FLAT, ERR_SCATTER, ERR_ZERO_DIV, ERR_RED_OP = 20, 21, 22, 23

#: Entry scratch columns (:func:`spatial_node`).
EO_TGT, EO_CHL, EO_IDX, EO_PSEUDO, EO_ACTUAL, EO_WIN, EO_REUSE, EO_HIDE = range(8)
EO_UP, EO_DOWN, EO_CUMM, EO_CT = 8, 9, 10, 11
EO_COLS = 12
_WRAP = 0xFFFFFFFF


# --- the shape (Python, once per template) ------------------------------------------------------

#: The key of one merged level cost group: the reference's :data:`.steady.NodeLevels` key.
GroupKey = int | tuple[int, ...]


@dataclass(slots=True)
class _Builder:
    """The tables of :class:`TreeShape` while the walk fills them."""

    arch: Hierarchy
    flat: FlatArch
    compat: Compat
    order: list[TreeNode] = field(default_factory=list)
    row: dict[int, int] = field(default_factory=dict)
    nodes: list[list[int]] = field(default_factory=list)
    refs: list[int] = field(default_factory=list)
    uses: list[int] = field(default_factory=list)
    ents: list[tuple[int, int, int]] = field(default_factory=list)
    strips: list[tuple[int, int, int]] = field(default_factory=list)
    groups: list[tuple[int, GroupKey, str]] = field(default_factory=list)
    cols: list[list[int]] = field(default_factory=list)
    colf: list[list[float]] = field(default_factory=list)
    col_nodes: list[TreeNode] = field(default_factory=list)
    errors: dict[int, BaseException] = field(default_factory=dict)
    n_slots: int = 0
    n_acc: int = 0
    n_ops: int = 0


@dataclass(frozen=True, slots=True)
class TreeShape:
    """A tree's structure as arrays (module docstring): what every tiling of a template shares.

    ``order``: the node rows' tree nodes; ``groups``: per merged level cost group its node row,
    its key and the level a collective's cost is on; ``slot_static``: per slot the columns the
    tree fixes (``SL_TID`` .. ``SL_RMW``); ``node_tags``: per node row the tags ``SL_TAG``
    numbers; ``keys``: the (tensor, tag) keys ``sgkey`` numbers; ``errors``: per node row the
    reference's exception where the structure alone makes it raise.
    """

    flat: FlatArch
    order: tuple[TreeNode, ...]
    row: dict[int, int]
    nodes: Ints
    refs: Ints
    uses: Ints
    ents: Ints
    strips: Ints
    sgkey: Ints
    col: Ints
    colf: Floats
    col_nodes: tuple[TreeNode, ...]
    groups: tuple[tuple[int, GroupKey, str], ...]
    slot_static: tuple[tuple[int, ...], ...]
    node_tags: tuple[tuple[str, ...], ...]
    keys: tuple[tuple[int, str], ...]
    errors: dict[int, BaseException]
    n_acc: int


def _has_reuse(node: TreeNode) -> bool:
    """Whether the reference keeps reuse tables of ``node`` (spatial and leaf tiles)."""
    return node.kind == "tile" and (node.spatial or node.is_leaf_tile)


def _counted(node: TreeNode) -> bool:
    """Whether ``node`` gets a row (a tile or a collective: the nodes with cycles)."""
    return node.kind in ("tile", "collective")


def tree_shape(inp: TreeMapping, flat: FlatArch, compat: Compat) -> TreeShape:
    """The shape of ``inp``'s tree (module docstring), for ``flat``'s arch and ``compat``.

    The exceptions the reference raises from the structure alone are kept per node (raised
    where the kernel reaches the node, so the first error in post-order is the reference's).
    """
    b = _Builder(inp.arch, flat, compat)
    _walk(b, inp.mapping)
    keys = sorted({(t, tag) for n in b.order if n.kind == "tile"
                   for t, tag in zip(n.tensors, n.tags, strict=True)})  # fmt: skip
    key_of = {k: i for i, k in enumerate(keys)}
    sgkey: list[int] = []
    static: list[tuple[int, ...]] = []
    node_tags: list[tuple[str, ...]] = []
    index = flat.index
    for node in b.order:
        tags: dict[str, int] = {}
        local: dict[tuple[int, str], int] = {}
        for t, tid in enumerate(node.tensors if node.kind == "tile" else ()):
            tag = node.tags[t]
            sgkey.append(key_of[(tid, tag)])
            static.append((tid, tags.setdefault(tag, len(tags)),
                           local.setdefault((tid, tag), len(local)), index[node.targets[t]],
                           index[node.childs[t]], node.scale[t], node.rmw[t]))  # fmt: skip
        node_tags.append(tuple(tags))
    return TreeShape(
        flat=flat, order=tuple(b.order), row=b.row,
        nodes=np.array(b.nodes, dtype=np.int64).reshape(-1, N_COLS),
        refs=np.array(b.refs, dtype=np.int64), uses=np.array(b.uses, dtype=np.int64),
        ents=np.array(b.ents, dtype=np.int64).reshape(-1, E_COLS),
        strips=np.array(b.strips, dtype=np.int64).reshape(-1, ST_COLS),
        sgkey=np.array(sgkey, dtype=np.int64),
        col=np.array(b.cols, dtype=np.int64).reshape(-1, CI_COLS),
        colf=np.array(b.colf, dtype=np.float64).reshape(-1, CF_COLS),
        col_nodes=tuple(b.col_nodes), groups=tuple(b.groups), slot_static=tuple(static),
        node_tags=tuple(node_tags), keys=tuple(keys), errors=b.errors, n_acc=b.n_acc,
    )  # fmt: skip


def _walk(b: _Builder, node: TreeNode) -> None:
    """Post-order: the children's rows, then ``node``'s (:meth:`.steady.SteadyState._visit`)."""
    if not _counted(node):
        return
    for c in node.children:
        _walk(b, c)
    r = len(b.order)
    b.order.append(node)
    b.row[node.id] = r
    row = [0] * N_COLS
    row[N_HIT_TGT] = row[N_HIT_CHL] = row[N_COL] = -1
    row[N_SLOT0] = b.n_slots
    row[N_ACC0], row[N_GRP0] = b.n_acc, len(b.groups)
    row[N_REF0], row[N_USE0] = len(b.refs), len(b.uses)
    row[N_ENT0], row[N_STRIP0] = len(b.ents), len(b.strips)
    b.nodes.append(row)
    try:
        if node.kind == "collective":
            _collective_row(b, node, row)
        else:
            row[N_NSLOT] = len(node.tensors)
            b.n_slots += len(node.tensors)
            _tile_row(b, node, row)
    except (TreeModelError, KeyError) as e:
        b.errors[r] = e
        row[N_ERROR] = 1
    row[N_NREF], row[N_NUSE] = len(b.refs) - row[N_REF0], len(b.uses) - row[N_USE0]
    row[N_NENT], row[N_NSTRIP] = len(b.ents) - row[N_ENT0], len(b.strips) - row[N_STRIP0]
    row[N_NGRP] = len(b.groups) - row[N_GRP0]
    b.n_acc += row[N_NACC]


def _tile_row(b: _Builder, node: TreeNode, row: list[int]) -> None:
    """A tile node's row: a leaf, a pass-through, a temporal or a spatial node."""
    if node.is_leaf_tile:
        row[N_KIND] = NK_LEAF
        row[N_NACC] = len(node.tensors) + 1
        op = node.children[0]
        row[N_OP0], row[N_NOP] = b.n_ops, OP_HEAD + len(op.primitive) + len(op.red_dims)
        b.n_ops += row[N_NOP]
        b.groups.append((b.row[node.id], node.children[0].id, ""))
        return
    row[N_KIND] = NK_SPATIAL if node.spatial else NK_TEMPORAL
    bindings = [c.binding for c in node.children if c.kind == "bind"]
    if any(x != "sequential" for x in bindings):
        raise TreeModelError(
            f"{node.label}: only sequential bindings are modelled (got {', '.join(bindings)})"
        )
    group: list[TreeNode] = []
    if not bindings:
        child = node.children[-1]
        if not _counted(child):
            raise KeyError(child.id)  # the reference reads the cycles of an op or a binding
        if not node.spatial:
            row[N_KIND] = NK_PASS
            b.refs.append(b.row[child.id])
            return
        group = [child]
    else:
        kids = node.children
        for i, c in enumerate(kids):
            if c.kind == "bind" and i % 2 == 0:
                for x in [x for x in kids[i:] if x.kind in ("tile", "collective")][:2]:
                    if all(x.id != g.id for g in group):
                        group.append(x)
        row[N_LIST] = 1
    if node.spatial:
        b.refs.extend(b.row[x.id] for x in group)
        _spatial_row(b, node, row, group if bindings else group[0])
    else:
        _temporal_row(b, node, group)


def _temporal_row(b: _Builder, node: TreeNode, group: list[TreeNode]) -> None:
    """A temporal node's bound collectives (its level costs) and the children it sums."""
    bound = [c for c in group if c.kind == "collective"]
    for c in bound:
        b.refs.append(b.row[c.id])
        b.groups.append((b.row[node.id], c.id, c.target))
    for c in node.children:
        if c.kind == "bind":
            continue
        if c.kind == "op" or (c.kind == "collective" and all(c.id != x.id for x in bound)):
            raise KeyError(c.id)  # the reference reads a cost it never set
        b.uses.append(b.row[c.id])


def _spatial_row(
    b: _Builder, node: TreeNode, row: list[int], children: TreeNode | list[TreeNode]
) -> None:
    """A spatial node's entries, window program, shared-port users and dummy pair."""
    seq_parent = binding_of(node, b.compat.binding_misread) == "sequential"
    row[N_SHARED] = int(any(b.arch.levels[c].attrs.get("parent_child_ports_shared", False)
                            for c in node.childs))  # fmt: skip
    single = not isinstance(children, list)
    group = [children] if isinstance(children, TreeNode) else children
    hit_pair: tuple[str, str] | None = None
    for child in group:
        is_tile = child.kind == "tile"
        for t in range(len(node.tensors)):
            if single and is_tile and node.childs[t] in child.targets:
                hit_pair = (node.targets[t], node.childs[t])
            elif single and not is_tile and node.childs[t] == child.target:
                hit_pair = (node.targets[t], node.childs[t])
            hit = (node.tags[t] in child.tags) if is_tile else (node.tags[t] == child.tag)
            if not hit:
                continue
            if not is_tile:
                hide = HIDE_OFF
            elif single and not seq_parent:
                hide = HIDE_ON
            else:
                hide = HIDE_INDEPENDENT
            b.ents.append((b.n_slots - len(node.tensors) + t, b.row[child.id], hide))
    n_ent = len(b.ents) - row[N_ENT0]
    row[N_NACC] = 2 * n_ent
    if single and n_ent == 0 and hit_pair is not None:
        row[N_HIT_TGT] = b.flat.index[hit_pair[0]]
        row[N_HIT_CHL] = b.flat.index[hit_pair[1]]
    b.groups.append((b.row[node.id], _children_key(children), ""))
    _strip_program(b, children)
    if row[N_SHARED]:
        if not single:
            users = group
        elif group[0].kind == "collective" or group[0].is_leaf_tile:
            users = group
        else:
            users = [c for c in group[0].children if _counted(c)]
        b.uses.extend(b.row[c.id] for c in users)


def _strip_program(b: _Builder, children: TreeNode | list[TreeNode]) -> None:
    """:meth:`.steady.SteadyState.window_vector` as rows of ``strips``."""
    if isinstance(children, list):
        b.strips.extend((OP_STRIP, b.row[c.id], 0) for c in children if _has_reuse(c))
        return
    if children.kind == "tile" and children.is_leaf_tile:
        b.strips.append((OP_STRIP, b.row[children.id], 0))
        return
    for c in children.children:
        if _has_reuse(c):
            sub = [g for g in c.children if _has_reuse(g)]
            b.strips.append((OP_NESTED, b.row[c.id], len(sub)))
            b.strips.extend((OP_STRIP, b.row[g.id], 0) for g in sub)


def _children_key(children: TreeNode | list[TreeNode]) -> GroupKey:
    """:func:`.steady._children_key`."""
    return tuple(c.id for c in children) if isinstance(children, list) else children.id


def _collective_row(b: _Builder, node: TreeNode, row: list[int]) -> None:
    """A collective's row and the ints and floats its cost reads but its sizes."""
    arch, flat = b.arch, b.flat
    lv = arch.levels[node.target]
    row[N_KIND] = NK_COLLECTIVE
    row[N_COL] = len(b.cols)
    b.col_nodes.append(node)
    b.groups.append((b.row[node.id], node.id, lv.name))
    g = flat.index[lv.name]
    net = lv.link_net
    ci = [0] * CI_COLS
    cf = [0.0] * CF_COLS
    b.cols.append(ci)
    b.colf.append(cf)
    if net is None:
        raise TreeModelError(f"{node.label}: {lv.name} has no link network (link_transfers)")
    n_src = math.prod(arch.levels[s].instances for s in node.src)
    ci[CI_NET], ci[CI_TARGET] = int(flat.net_of[g, g]), g
    ci[CI_KIND] = _COL_KINDS.get(node.col_type, CK_OTHER)
    ci[CI_RED] = _RED_OPS.get(node.red_op, RO_UNKNOWN)
    ci[CI_NSRC], ci[CI_NDST] = n_src, math.prod(arch.levels[s].instances for s in node.dest)
    ci[CI_SF] = node.spatial_factor or n_src
    ci[CI_PORT], ci[CI_BROADCAST], ci[CI_REDUCTION] = net.port_bw, net.broadcast, net.reduction
    a = lv.attrs
    cf[CF_SCALE] = node.precision / 8.0
    cf[CF_LR], cf[CF_LW] = float(lv.bw("link_read_bw")), float(lv.bw("link_write_bw"))
    cf[CF_MW], cf[CF_BLOCK] = float(lv.bw("child_write_bw")), float(lv.width_bytes())
    cf[CF_RC] = float(a.get("child_read_energy", 0))
    cf[CF_WC] = float(a.get("child_write_energy", 0))


# --- the numbers of one tiling (Python) ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FlatTree:
    """One tiling of a shape as arrays: its slots, its ops, its collectives' ints."""

    shape: TreeShape
    nodes: Ints
    slots: Ints
    ops: Ints
    col: Ints
    errors: dict[int, BaseException]


def flatten_tree(shape: TreeShape, inp: TreeMapping, nests: Nests, moves: Moves) -> FlatTree:
    """The numbers of ``inp`` (stages 2 and 3: ``nests``, ``moves``) over its ``shape``.

    ``inp``'s tree must have ``shape``'s structure (a tiling of the same template): its node
    ids are checked, its numbers (the ops' primitives, the moves) are its own.

    Raises:
        ValueError: ``inp``'s tree is not of ``shape``.
    """
    flat = shape.flat
    rows: list[tuple[int, ...]] = []
    ops: list[int] = []
    static = shape.slot_static
    s = 0
    order = _post_order(inp.mapping)
    if len(order) != len(shape.order) or any(
        a.id != b.id for a, b in zip(order, shape.order, strict=True)
    ):
        raise ValueError("compiled tree: the tree is not of the shape given")
    for node in order:
        if node.kind != "tile":
            continue
        nest, mv = nests.tiles[node.id], moves[node.id]
        iters, sp, rel, rw, dep = nest.iters, nest.sp_iters, nest.rel_ts, nest.rw, nest.dependent
        for t in range(len(node.tensors)):
            m = mv[t]
            moved, kept = m.moved, m.kept
            rows.append((*static[s], rw[t], dep[t], iters[t], sp[t], rel[t], m.n, m.period,
                         moved.tile, moved.unique, moved.count, kept.tile, kept.unique,
                         kept.count))  # fmt: skip
            s += 1
        if node.is_leaf_tile:
            op = node.children[0]
            types = flat.op_types
            prim = list(op.primitive.values())
            red = [op.red_factors[d] for d in op.red_dims]
            ops += [types.index(op.op_type) if op.op_type in types else -1,
                    flat.index[node.childs[0]], len(prim), len(red), *prim, *red]  # fmt: skip
    col, errors = _collective_sizes(shape, order, inp, nests)
    nodes = shape.nodes
    if errors:
        nodes = nodes.copy()
        for r in errors:
            nodes[r, N_ERROR] = 1
    slots = np.array(rows, dtype=np.int64).reshape(-1, SL_COLS)
    return FlatTree(shape, nodes, slots, np.array(ops, dtype=np.int64), col,
                    {**shape.errors, **errors})  # fmt: skip


def _post_order(root: TreeNode) -> list[TreeNode]:
    """The tile and collective nodes under ``root`` in post-order (the shape's rows)."""
    out: list[TreeNode] = []

    def walk(node: TreeNode) -> None:
        if _counted(node):
            for c in node.children:
                walk(c)
            out.append(node)

    walk(root)
    return out


def _collective_sizes(
    shape: TreeShape, order: list[TreeNode], inp: TreeMapping, nests: Nests
) -> tuple[Ints, dict[int, BaseException]]:
    """Each collective's elements read and written per source (``collective_cost``'s sizes)."""
    col = shape.col.copy()
    errors: dict[int, BaseException] = {}
    prob = inp.problem
    for c, shaped in enumerate(shape.col_nodes):
        r = shape.row[shaped.id]
        node = order[r]
        if r in shape.errors:
            continue
        proj = prob.projection("", node.in_tensor)
        ext_in = nests.col_in[node.id][-1]
        ext_out = nests.col_out[node.id][-1]
        missing = [d for d in sorted(range(len(prob.dims)), key=lambda d: prob.dims[d])
                   if d not in ext_in]  # fmt: skip
        if missing:
            errors[r] = TreeModelError(f"{node.label}: no extent of dim {prob.dims[missing[0]]}")
            continue
        col[c, CI_RSIZE] = math.prod(ext_in[d] for d in proj)
        col[c, CI_WSIZE] = math.prod(ext_out[d] for d in proj)
    return col, errors


# --- the kernel: windows and port use (steady.py) ----------------------------------------------


@numba.njit(cache=True, inline="always")
def _count_reuse(slots, a, b, sgkey, kt):  # type: ignore[no-untyped-def]
    """:meth:`.steady.SteadyState._count_reuse` of the slots ``a .. b - 1`` into ``kt``."""
    for s in range(a, b):
        actual = moving(slots[s], slots[s, SL_N])
        f = slots[s, SL_ITERS] // actual if actual else 0
        g = sgkey[s]
        kt[g, KT_REUSE_HAS] = 1
        kt[g, KT_REUSE] = f or 1
        kt[g, KT_ACTUAL] = actual


@numba.njit(cache=True, inline="always")
def _less_ramp(win, f, up):  # type: ignore[no-untyped-def]
    """:func:`.steady._less_ramp`: ``up`` off every window but each ``f``-th (32-bit wrap)."""
    for i in range(win.shape[0]):
        if i % f:
            win[i] = (win[i] - up) & _WRAP


@numba.njit(cache=True, inline="always")
def _strips_once(parent, child, g, win):  # type: ignore[no-untyped-def]
    """Key ``g``'s ramp-up off ``win`` when the parent reuses it and the child moves it once.

    Returns whether it did (the reference's condition of ``_strip_ramps``).
    """
    f = parent[g, KT_REUSE]
    if not parent[g, KT_REUSE_HAS] or f == 1:
        return False
    if not child[g, KT_REUSE_HAS] or child[g, KT_ACTUAL] != 1:
        return False
    _less_ramp(win, f, child[g, KT_UP] if child[g, KT_UP_HAS] else 0)
    return True


@numba.njit(cache=True, inline="always")
def window_vector(kt, x, strips, s0, ns, win):  # type: ignore[no-untyped-def]
    """:meth:`.steady.SteadyState.window_vector` of node row ``x`` by its strip program."""
    n_keys = kt.shape[1]
    s = s0
    while s < s0 + ns:
        c, n_sub = strips[s, ST_NODE], strips[s, ST_NSUB]
        for g in range(n_keys):
            if _strips_once(kt[x], kt[c], g, win) and strips[s, ST_OP] == OP_NESTED:
                for q in range(s + 1, s + 1 + n_sub):
                    for h in range(n_keys):
                        _strips_once(kt[x], kt[strips[q, ST_NODE]], h, win)
        s += 1 + n_sub


@numba.njit(cache=True, inline="always")
def port_use(nodes, uses, u0, nu, glv, use):  # type: ignore[no-untyped-def]
    """:meth:`.steady.SteadyState.port_use`: per level, the cycles the children hold a port.

    A read (port 0) holds the child's write port (``use[level, 1]``) for its cycles and
    ramp-up, a write its read port for its cycles and ramp-down.
    """
    for k in range(u0, u0 + nu):
        c = uses[k]
        for grp in range(nodes[c, N_GRP0], nodes[c, N_GRP0] + nodes[c, N_NGRP]):
            for lv in range(glv.shape[1]):
                if glv[grp, lv, 0, LO_PRESENT]:
                    read, write = glv[grp, lv, 0], glv[grp, lv, 1]
                    use[lv, 1] += read[LO_CUMM] + read[LO_RAMP_UP]
                    use[lv, 0] += write[LO_CUMM] + write[LO_RAMP_DOWN]


# --- the kernel: a spatial node's port costs (transfers.py) ------------------------------------


@numba.njit(cache=True, inline="always")
def _covered(win, i, f):  # type: ignore[no-untyped-def]
    """The window iteration ``i`` hides under at reuse ``f`` (``port_costs``' ``no_stall``)."""
    if i >= win.shape[0]:
        return 0
    if f == 1:
        return win[i]
    if i % f:
        return 0
    w = 0
    for j in range(i, min(i + f, win.shape[0])):
        w += win[j]
    return w


@numba.njit(cache=True)
def entry_cost(lv, net_of, net, net_pj, generalise, sl, win, hide, different, eff, stl):  # type: ignore[no-untyped-def]
    """:meth:`.transfers.Transfers.port_costs` of a spatial node's tensor (slot row ``sl``).

    ``win``: the node's window vector; ``hide``: whether the window hides the transfers.
    Writes the per-iteration transfers and stalls (``mem_net``, ``stall``) into the first
    ``pseudo`` entries of ``eff`` and ``stl``. Returns ``(error, a, b, pseudo, reuse, actual,
    ramp_up, ramp_down, cumm, noc_pj)``.
    """
    n, period = sl[SL_N], sl[SL_PERIOD]
    actual = moving(sl, n)
    reuse = sl[SL_ITERS] // actual if actual else 0
    reuse = reuse or 1
    pseudo = n if different else n // reuse
    if n == 0:
        return ERR_EMPTY, 0, 0, 0, 0, 0, 0, 0, 0, 0.0
    mv, kp = SL_MOVED_TILE, SL_KEPT_TILE  # each move's tile, distinct tiles, children
    err, memory, lat, moved_pj, a, b = transfer(lv, net_of, net, net_pj, sl, sl[mv], sl[mv + 1],
                                                sl[mv + 2], generalise)  # fmt: skip
    if err:
        return err, a, b, 0, 0, 0, 0, 0, 0, 0.0
    moved = memory + lat
    kept, kept_pj = 0, 0.0
    firsts = firsts_count(n, period)
    if firsts < n:
        err, memory, lat, kept_pj, a, b = transfer(lv, net_of, net, net_pj, sl, sl[kp],
                                                   sl[kp + 1], sl[kp + 2], generalise)  # fmt: skip
        if err:
            return err, a, b, 0, 0, 0, 0, 0, 0, 0.0
        kept = memory + lat
    noc = 0.0  # every iteration's router energy, in iteration order (float rounding)
    if kept_pj == 0.0:
        for _ in range(firsts):
            noc += moved_pj
    else:
        for i in range(n):
            noc += moved_pj if is_first(i, period) else kept_pj
    step = 1 if different else reuse
    rw = sl[SL_RW] != 0
    skip = -1  # the picked iteration that is a ramp, not a stall
    up = down = 0
    if rw:
        last = n - reuse
        if last >= 0:
            down = moved if is_first(last, period) else kept
            if last % step == 0:
                skip = last // step
    else:
        skip = 0
    shift = 1 if rw else -1
    eff[:pseudo] = 0
    stl[:pseudo] = 0
    cumm = 0
    for j in range(-(-n // step)):
        i = j * step
        e = moved if is_first(i, period) else kept
        if j == 0 and not rw:
            up = e
        s = e
        if hide:
            s = e - _covered(win, i, reuse) if e else 0
        if j == skip:
            e = s = 0
        cumm += e
        k = j + shift
        if 0 <= k < pseudo:
            eff[k] = e
            stl[k] = s
    return ERR_NONE, 0, 0, pseudo, reuse, actual, up, down, cumm, noc


# --- the kernel: a spatial node's merge (merge.py) ---------------------------------------------


@numba.njit(cache=True, inline="always")
def _add_stalls(ms, mc, e, eo, eff, stl, wk, n_it):  # type: ignore[no-untyped-def]
    """:func:`.merge._add_unit_reuse` and ``_add_reused`` of entry ``e`` (no windows kept).

    The transfer's excess over its window adds to the port's stalls ``ms``, a tensor not hidden
    adds its own stalls to the compulsory ones ``mc``, over the ``f`` iterations each covers.
    """
    idx, f, pseudo = eo[e, EO_IDX], eo[e, EO_REUSE], eo[e, EO_PSEUDO]
    hidden = eo[e, EO_HIDE] != 0
    its = min(n_it, eo[e, EO_ACTUAL])
    if f == 1:
        if not hidden:
            for i in range(idx, min(its, pseudo)):
                mc[i] += stl[e, i]
        for i in range(idx, its):
            x = eff[e, i] if i < pseudo else 0
            if x > wk[i]:
                ms[i] += x - wk[i]
        return
    for i in range(idx, its):
        extra = 0 if hidden or i >= pseudo else stl[e, i]
        s = (eff[e, i] if i < pseudo else 0) // f - wk[i] // f
        for mi in range(i * f, min(i * f + f, n_it)):
            if extra:
                mc[mi] += extra
            if s > 0:
                ms[mi] += s


@numba.njit(cache=True)
def merge_entries(lv, eo, eff, stl, use, n_it, port_overwrite, lvl):  # type: ignore[no-untyped-def]
    """:func:`.merge.merge_levels` with shared ports, then :func:`.merge.node_cycles`.

    ``eo[entry, EO_*]``: each port cost (a dummy pair included), ``eff`` and ``stl`` their
    per-iteration transfers and stalls, ``use[level, port]`` what the children hold of each
    port. Fills ``lvl[level, port]`` and returns the node's cycles.
    """
    n_lv, n_e = lv.shape[0], eo.shape[0]
    lvl.fill(0)
    for e in range(n_e):
        lvl[eo[e, EO_TGT], 0, LO_PRESENT] = lvl[eo[e, EO_TGT], 1, LO_PRESENT] = 1
    group = np.empty(n_lv, dtype=np.int64)
    n_groups = 0
    for g in range(n_lv):
        group[g] = n_groups if lvl[g, 0, LO_PRESENT] else -1
        n_groups += lvl[g, 0, LO_PRESENT]
    ms = np.zeros((n_groups, 2, n_it), dtype=np.int64)
    mc = np.zeros((n_groups, 2, n_it), dtype=np.int64)
    order = entry_order(eo, eo[:, EO_PSEUDO], EO_TGT, EO_CHL, EO_IDX)
    width = 1
    for e in range(n_e):
        width = max(width, eo[e, EO_ACTUAL])
    windows = np.empty((n_e, width), dtype=np.int64)
    for e in range(n_e):  # _port_windows
        w, chl = eo[e, EO_WIN], eo[e, EO_CHL]
        if not lv[chl, LV_COMPUTE] and lv[chl, LV_SHARED_PORTS]:
            cost = use[chl, eo[e, EO_IDX]]
            w = w - cost if w > cost else 0
        windows[e, : eo[e, EO_ACTUAL]] = w
    used = np.empty(max(n_it, 1), dtype=np.int64)
    for k in range(order.shape[0]):  # _merge_port
        e = order[k]
        tgt, idx, f = eo[e, EO_TGT], eo[e, EO_IDX], eo[e, EO_REUSE]
        m = lvl[tgt, idx]
        m[LO_RAMP_UP] += eo[e, EO_UP]
        m[LO_RAMP_DOWN] += eo[e, EO_DOWN]
        m[LO_COMPUTE_TIME] = max(m[LO_COMPUTE_TIME], eo[e, EO_CT])
        if m[LO_REUSE] == 0:
            m[LO_REUSE] = 1
        if f > 0:
            m[LO_REUSE] = min(m[LO_REUSE], f)
        m[LO_CUMM] += eo[e, EO_CUMM]
        _add_stalls(ms[group[tgt], idx], mc[group[tgt], idx], e, eo, eff, stl, windows[e], n_it)
        hidden = min(n_it, eo[e, EO_ACTUAL], eo[e, EO_PSEUDO])
        if not eo[e, EO_HIDE] or hidden <= idx:
            continue
        n_used = hidden - idx  # a hidden transfer uses up the later entries' windows
        for i in range(n_used):
            used[i] = eff[e, idx + i] // f
        for kk in range(k + 1, order.shape[0]):
            o = order[kk]
            if eo[o, EO_TGT] == tgt and eo[o, EO_IDX] == idx:
                use_up(windows[o], eo[o, EO_ACTUAL], used[:n_used], idx, f, eo[o, EO_REUSE])
    return node_cycles(lvl, group, ms + mc, n_it, port_overwrite)


# --- the kernel: the nodes (steady.py, collectives.py) -----------------------------------------


@numba.njit(cache=True, inline="always")
def _max_iters(slots, a, b):  # type: ignore[no-untyped-def]
    """The node's iterations (the largest of its slots') and whether the slots' differ."""
    n_it, low = slots[a, SL_ITERS], slots[a, SL_ITERS]
    for s in range(a + 1, b):
        n_it = max(n_it, slots[s, SL_ITERS])
        low = min(low, slots[s, SL_ITERS])
    return n_it, low != n_it


@numba.njit(cache=True, inline="always")
def _spatial_accesses(sl, at, pseudo, noc, acc, acc_pj):  # type: ignore[no-untyped-def]
    """A spatial entry's two accesses (rows ``at``, ``at + 1``): at its target, at its child."""
    for r in range(at, at + 2):
        acc[r, AC_LEVEL] = sl[SL_TARGET] if r == at else sl[SL_CHILD]
        acc[r, AC_COUNT] = pseudo
        acc[r, AC_TILE] = sl[SL_MOVED_TILE]
        acc[r, AC_PRECISION] = sl[SL_SCALE]
        acc[r, AC_RW] = sl[SL_RW]
        acc[r, AC_AT_TARGET] = 1 if r == at else 0
        acc[r, AC_TID] = sl[SL_TID]
        acc[r, AC_RMW] = sl[SL_RMW]
        acc[r, AC_PROJ] = sl[SL_MOVED_UNIQUE] or 1
        acc[r, AC_TAG] = sl[SL_TAG]
    acc_pj[at + 1, AP_NOC] = noc


@numba.njit(cache=True)
def _keep_ramp_ups(eo, ents, e0, ne, sgkey, kt_row):  # type: ignore[no-untyped-def]
    """:meth:`.steady.SteadyState._keep_ramp_ups` of a spatial node's read entries.

    Per target level its table (each key's last ramp-up); the tables of the levels whose sums
    are the largest, in order.
    """
    sums = np.zeros(ne, dtype=np.int64)  # per read entry opening a target level: its sum
    top = -1
    for e in range(ne):
        if eo[e, EO_IDX] or read_target_seen(eo, e, EO_IDX, EO_TGT):
            continue
        for u in range(e, ne):
            if (
                not eo[u, EO_IDX]
                and eo[u, EO_TGT] == eo[e, EO_TGT]
                and not _again(eo, ents, e0, sgkey, u)
            ):
                sums[e] += eo[u, EO_UP]
        top = max(top, sums[e])
    for e in range(ne):
        if eo[e, EO_IDX] or read_target_seen(eo, e, EO_IDX, EO_TGT) or sums[e] != top:
            continue
        for u in range(e, ne):
            if not eo[u, EO_IDX] and eo[u, EO_TGT] == eo[e, EO_TGT]:
                g = sgkey[ents[e0 + u, E_SLOT]]
                kt_row[g, KT_UP_HAS] = 1
                kt_row[g, KT_UP] = eo[u, EO_UP]


@numba.njit(cache=True, inline="always")
def _again(eo, ents, e0, sgkey, u):  # type: ignore[no-untyped-def]
    """Whether a later read entry has ``u``'s target level and key (it overwrites ``u``'s)."""
    g = sgkey[ents[e0 + u, E_SLOT]]
    for v in range(u + 1, eo.shape[0]):
        if (not eo[v, EO_IDX] and eo[v, EO_TGT] == eo[u, EO_TGT]
                and sgkey[ents[e0 + v, E_SLOT]] == g):  # fmt: skip
            return True
    return False


@numba.njit(cache=True)
def spatial_node(lv, net_of, net, net_pj, generalise, port_overwrite, nodes, slots, sgkey,  # type: ignore[no-untyped-def]
                 refs, uses, ents, strips, x, cyc, glv, acc, acc_pj, kt, head):  # fmt: skip
    """:meth:`.steady.SteadyState.visit_spatial` of node row ``x``; returns an error code."""
    nd = nodes[x]
    a, b = nd[N_SLOT0], nd[N_SLOT0] + nd[N_NSLOT]
    _count_reuse(slots, a, b, sgkey, kt[x])
    n_it, different = _max_iters(slots, a, b)
    wsum = 0
    for r in range(nd[N_REF0], nd[N_REF0] + nd[N_NREF]):
        wsum += cyc[refs[r]]
    if nd[N_LIST]:
        wsum &= _WRAP
    win = np.full(n_it, wsum, dtype=np.int64)
    window_vector(kt, x, strips, nd[N_STRIP0], nd[N_NSTRIP], win)
    ct = 0
    for i in range(n_it):
        ct += win[i]
    n_lv = lv.shape[0]
    use = np.zeros((n_lv, 2), dtype=np.int64)
    if nd[N_SHARED]:
        port_use(nodes, uses, nd[N_USE0], nd[N_NUSE], glv, use)
    e0, ne = nd[N_ENT0], nd[N_NENT]
    dummy = nd[N_HIT_TGT] >= 0
    n_e = ne + 2 if dummy else ne
    width = max(n_it, 1)
    for e in range(e0, e0 + ne):
        width = max(width, slots[ents[e, E_SLOT], SL_N])
    eo = np.zeros((n_e, EO_COLS), dtype=np.int64)
    eff = np.zeros((n_e, width), dtype=np.int64)
    stl = np.zeros((n_e, width), dtype=np.int64)
    for e in range(ne):
        s = ents[e0 + e, E_SLOT]
        sl = slots[s]
        mode = ents[e0 + e, E_HIDE]
        hide = mode == HIDE_ON or (mode == HIDE_INDEPENDENT and not sl[SL_DEPENDENT])
        err, ea, eb, pseudo, reuse, actual, up, down, cumm, noc = entry_cost(
            lv, net_of, net, net_pj, generalise, sl, win, hide, different, eff[e], stl[e]
        )
        if err:
            head[TH_SLOT], head[TH_A], head[TH_B] = s - a, ea, eb
            return err
        o = eo[e]
        o[EO_TGT], o[EO_CHL], o[EO_IDX] = sl[SL_TARGET], sl[SL_CHILD], sl[SL_RW] != 0
        o[EO_PSEUDO], o[EO_ACTUAL], o[EO_WIN] = pseudo, actual, wsum * reuse
        o[EO_REUSE], o[EO_HIDE], o[EO_UP], o[EO_DOWN] = reuse, hide, up, down
        o[EO_CUMM], o[EO_CT] = cumm, ct
        _spatial_accesses(sl, nd[N_ACC0] + 2 * e, pseudo, noc, acc, acc_pj)
    _keep_ramp_ups(eo, ents, e0, ne, sgkey, kt[x])
    if dummy:  # the child's cycles on both ports of the pair it meets (no tensor moves)
        c = cyc[refs[nd[N_REF0]]]
        for e in range(ne, ne + 2):
            o = eo[e]
            o[EO_TGT], o[EO_CHL], o[EO_IDX] = nd[N_HIT_TGT], nd[N_HIT_CHL], e - ne
            o[EO_PSEUDO] = o[EO_ACTUAL] = n_it
            o[EO_WIN], o[EO_REUSE], o[EO_HIDE], o[EO_CT] = c, 1, 1, n_it * c
    lvl = np.zeros((n_lv, 2, LO_COLS), dtype=np.int64)
    cyc[x] = merge_entries(lv, eo, eff, stl, use, n_it, port_overwrite, lvl)
    glv[nd[N_GRP0], :, :, :LO_COLS] = lvl
    return ERR_NONE


@numba.njit(cache=True, inline="always")
def temporal_node(nodes, slots, refs, uses, col, x, cyc, glv):  # type: ignore[no-untyped-def]
    """:meth:`.steady.SteadyState.visit_temporal` of node row ``x``."""
    nd = nodes[x]
    n, _ = _max_iters(slots, nd[N_SLOT0], nd[N_SLOT0] + nd[N_NSLOT])
    for k in range(nd[N_NREF]):  # each bound collective: n times its cycles on its level
        c = refs[nd[N_REF0] + k]
        m = glv[nd[N_GRP0] + k, col[nodes[c, N_COL], CI_TARGET]]
        for idx in range(2):
            m[idx, LO_PRESENT] = 1
            m[idx, LO_COMPUTE_TIME] = m[idx, LO_CUMM] = n * cyc[c]
    total = 0
    for k in range(nd[N_USE0], nd[N_USE0] + nd[N_NUSE]):
        c = uses[k]
        total += n * cyc[c] if nodes[c, N_KIND] == NK_COLLECTIVE else cyc[c]
    cyc[x] = total & _WRAP


#: The most leaf results one :func:`new_leaf_memo` keeps (later distinct leaves are evaluated
#: and not kept): bounds its memory, kept for all of a template's batches (an entry is about
#: 2 KiB: at most about 64 MiB; every tiling of edge 1024x1024x256 keeps 2,548 entries).
LEAF_MEMO_MAX = 1 << 15
_I1 = numba.types.int64[:]
_I2 = numba.types.int64[:, :]
_I3 = numba.types.int64[:, :, :]
_F2 = numba.types.float64[:, :]


@numba.njit(cache=True)
def new_leaf_memo():  # type: ignore[no-untyped-def]
    """An empty leaf memo for :func:`tree_kernel`: ``(index, keys, heads, accs, pjs, lvls, tabs)``.

    ``index`` maps a key's 64-bit hash (:func:`_leaf_key`) to its entry; entry ``i`` holds the
    key itself (``keys[i]``, for the exact check) and :func:`.compiled_leaf.leaf_kernel`'s
    ``head``, ``acc``, ``acc_pj``, ``lvl`` and ``tab`` for it. One memo serves one
    ``(lv, simd, net_of, net, net_pj, generalise, port_overwrite, fold)``: the arch arrays and
    switches the key leaves out (:func:`.compiled.score_batch` makes one per batch).
    """
    index = numba.typed.Dict.empty(key_type=numba.types.uint64, value_type=numba.types.int64)
    keys = numba.typed.List.empty_list(_I1)
    heads = numba.typed.List.empty_list(_I1)
    accs = numba.typed.List.empty_list(_I2)
    pjs = numba.typed.List.empty_list(_F2)
    lvls = numba.typed.List.empty_list(_I3)
    tabs = numba.typed.List.empty_list(_I2)
    return index, keys, heads, accs, pjs, lvls, tabs


@numba.njit(cache=True, inline="always")
def _leaf_key(x, leaf_slots, op):  # type: ignore[no-untyped-def]
    """A leaf's memo key and its 64-bit hash (FNV-1a over the key's int64 words).

    The key is the node row ``x``, then every column of the leaf's slot rows, then its op
    vector: all that :func:`.compiled_leaf.leaf_kernel` reads beyond the arch arrays and
    switches (fixed for a memo), so equal keys give equal results.
    """
    n = leaf_slots.shape[0] * leaf_slots.shape[1]
    key = np.empty(1 + n + op.shape[0], dtype=np.int64)
    key[0] = x
    key[1 : 1 + n] = leaf_slots.reshape(-1)
    key[1 + n :] = op
    h = np.uint64(14695981039346656037)
    prime = np.uint64(1099511628211)
    for v in key:
        h = (h ^ np.uint64(v)) * prime
    return key, h


@numba.njit(cache=True, inline="always")
def _same(a, b):  # type: ignore[no-untyped-def]
    """Whether two keys are equal (the exact check behind a hash hit)."""
    if a.shape[0] != b.shape[0]:
        return False
    for i in range(a.shape[0]):
        if a[i] != b[i]:
            return False
    return True


@numba.njit(cache=True, inline="always")
def leaf_lookup(nodes, slots, ops, x, memo):  # type: ignore[no-untyped-def]
    """Leaf row ``x``'s memo key, its hash and entry: ``-1`` none, ``-2`` another key's.

    The hash only finds the candidate; the keys are compared in full, so a collision runs the
    kernel (and keeps the first entry).
    """
    nd = nodes[x]
    a, b = nd[N_SLOT0], nd[N_SLOT0] + nd[N_NSLOT]
    key, h = _leaf_key(x, slots[a:b], ops[nd[N_OP0] : nd[N_OP0] + nd[N_NOP]])
    index, keys = memo[0], memo[1]
    e = index[h] if h in index else -1
    if e >= 0 and not _same(keys[e], key):
        e = -2
    return key, h, e


@numba.njit(cache=True, inline="always")
def leaf_store(nodes, slots, sgkey, x, cyc, glv, acc, acc_pj, kt, lh, la, lp, lvl, tab):  # type: ignore[no-untyped-def]
    """A leaf's kernel results (``head``, ``acc``, ``acc_pj``, ``lvl``, ``tab``) into the tables."""
    nd = nodes[x]
    cyc[x] = lh[H_TOTAL]
    r0 = nd[N_ACC0]
    acc[r0 : r0 + la.shape[0]] = la
    acc_pj[r0 : r0 + la.shape[0]] = lp
    glv[nd[N_GRP0], :, :, :LO_COLS] = lvl
    for s in range(nd[N_SLOT0], nd[N_SLOT0] + nd[N_NSLOT]):
        t, g = slots[s, SL_KEY], sgkey[s]
        kt[x, g, KT_REUSE_HAS] = 1
        kt[x, g, KT_REUSE], kt[x, g, KT_ACTUAL] = tab[t, TB_REUSE], tab[t, TB_ACTUAL]
        kt[x, g, KT_UP_HAS], kt[x, g, KT_UP] = tab[t, TB_UP_HAS], tab[t, TB_UP]
        kt[x, g, KT_DOWN_HAS], kt[x, g, KT_DOWN] = tab[t, TB_DOWN_HAS], tab[t, TB_DOWN]


@numba.njit(cache=True)
def leaf_node(lv, simd, net_of, net, net_pj, generalise, port_overwrite, fold, nodes, slots,  # type: ignore[no-untyped-def]
              sgkey, ops, x, cyc, glv, acc, acc_pj, kt, head, memo, key, h, e):  # fmt: skip
    """A leaf that missed the memo: its kernel's results into the tree's tables; an error code.

    ``key, h, e``: :func:`leaf_lookup`'s; the kernel is :func:`.compiled_leaf.leaf_kernel`.

    ``memo`` (:func:`new_leaf_memo`): the results are kept under ``key`` where no entry has its
    hash (``e == -1``) and the leaf does not err; a leaf whose key equals a kept one's reuses
    that one's results (:func:`tree_kernel`) instead of running the kernel.
    """
    nd = nodes[x]
    a, b = nd[N_SLOT0], nd[N_SLOT0] + nd[N_NSLOT]
    op = ops[nd[N_OP0] : nd[N_OP0] + nd[N_NOP]]
    index, keys, heads, accs, pjs, lvls, tabs = memo
    lh, la, lp, _so, _sp, lvl, tab = leaf_kernel(
        lv, simd, net_of, net, net_pj, slots[a:b], op, generalise, port_overwrite, fold
    )
    if lh[H_ERROR]:
        head[TH_SLOT], head[TH_A], head[TH_B] = lh[H_ERROR_SLOT], lh[H_ERROR_A], lh[H_ERROR_B]
        return lh[H_ERROR]
    if e == -1 and len(keys) < LEAF_MEMO_MAX:
        index[h] = len(keys)
        keys.append(key)
        heads.append(lh)
        accs.append(la)
        pjs.append(lp)
        lvls.append(lvl)
        tabs.append(tab)
    leaf_store(nodes, slots, sgkey, x, cyc, glv, acc, acc_pj, kt, lh, la, lp, lvl, tab)
    return ERR_NONE


# --- the kernel: collectives (collectives.py, noc.py) ------------------------------------------


@numba.njit(cache=True)
def collective_link(net, net_pj, n_id, kind, red, tile, nodes, scale, generalise):  # type: ignore[no-untyped-def]
    """:func:`fusekit.accel.noc.link_latency` and ``link_energy_pj`` of a collective.

    One distinct tile of ``tile`` elements among ``nodes`` peers; an all-reduce is a reduction
    then a broadcast, an all-gather a gather then a broadcast. Returns ``(error, cycles, pJ,
    a, b)``; ``a, b``: the sub-mesh of a mesh error.
    """
    if nodes == 1:
        return ERR_NONE, 0, 0.0, 0, 0
    sx, sy = sub_mesh(net, n_id, nodes)
    ok, hops, data = hops_data(sx, sy, generalise)
    if not ok:
        return ERR_MESH, 0, 0.0, sx, sy
    parts = 2 if kind == CK_ALLREDUCE or kind == CK_ALLGATHER else 1
    reduces = red != RO_NONE and (kind == CK_REDUCTION or kind == CK_ALLREDUCE)
    if reduces and red == RO_UNKNOWN:
        return ERR_RED_OP, 0, 0.0, 0, 0
    # link_latency
    bits = np.float32(scale * 8)
    w, tq = net[n_id, NET_CHANNEL], net[n_id, NET_QUEUING]
    router = queue = reduce_t = np.float32(0)
    for i in range(parts):
        router = np.float32(router + np.float32(hops * net[n_id, NET_HOP_LATENCY]))
        q2d = tile * data
        if kind == CK_SCATTER:
            q2d = int(np.float32(q2d) / np.float32(nodes))
        if reduces and i == 0:
            reduce_t = np.float32(q2d * nodes * 1.0 / 16.0)
        flits = np.float32(np.float32(np.float32(q2d) * bits) / np.float32(w))
        queue = np.float32(queue + np.float32(flits * np.float32(tq)))
    cycles = int(np.float32(np.float32(router + queue) + reduce_t))
    # link_energy_pj
    hops_all = q_all = 0
    reduce_e = np.float32(0)
    for i in range(parts):
        hops_all += hops
        q = (tile * data) & _WRAP
        if kind == CK_SCATTER:
            q = int(np.float32(q) / np.float32(nodes))
        if reduces and i == 0:
            reduce_e = np.float32(np.float32((q * nodes) & _WRAP) * _REDUCE_PJ[red])
        q_all += q
    q_bits = int(np.float32(q_all) * np.float32(np.float32(scale) * np.float32(8)))
    e = router_pj(net_pj[n_id], hops_all, tq, q_bits, sx)
    return ERR_NONE, cycles, np.float64(np.float32(np.float32(e) + reduce_e)), 0, 0


@numba.njit(cache=True, inline="always")
def _divisors_ok(ci, cf):  # type: ignore[no-untyped-def]
    """Whether no division of the collective's memory model is by zero (Python would raise)."""
    kind = ci[CI_KIND]
    port = np.float64(ci[CI_PORT])
    lr, lw = min(cf[CF_LR], port), min(cf[CF_LW], port)
    if kind == CK_GATHER:
        ports = np.float64(min(2, ci[CI_NSRC] - 1))
        lw = min(min(cf[CF_LW], ports * port), cf[CF_MW])
        return lw * ci[CI_NSRC] != 0 and lr != 0 and cf[CF_BLOCK] != 0
    if kind != CK_SCATTER and kind != CK_OTHER:
        return lr != 0 and lw != 0 and cf[CF_BLOCK] != 0
    sf = ci[CI_NDST]
    lr = min(cf[CF_LR], np.float64(min(2, sf - 1)) * port)
    return lr * sf != 0 and sf * lw != 0 and sf * cf[CF_BLOCK] != 0 and cf[CF_BLOCK] != 0


@numba.njit(cache=True)
def collective_memory(ci, cf):  # type: ignore[no-untyped-def]
    """:data:`.collectives.KINDS`' memory model: ``(cycles, read pJ, write pJ)``, float64."""
    kind = ci[CI_KIND]
    rsize, wsize, n_src, n_dst, sf = ci[CI_RSIZE], ci[CI_WSIZE], ci[CI_NSRC], ci[CI_NDST], ci[CI_SF]
    scale, block, rc, wc = cf[CF_SCALE], cf[CF_BLOCK], cf[CF_RC], cf[CF_WC]
    port = np.float64(ci[CI_PORT])
    lr, lw = min(cf[CF_LR], port), min(cf[CF_LW], port)
    bcast, red = ci[CI_BROADCAST] != 0, ci[CI_REDUCTION] != 0
    if kind == CK_GATHER:
        lw = min(min(cf[CF_LW], np.float64(min(2, n_src - 1)) * port), cf[CF_MW])
        mem = max(math.ceil((n_src - 1) * wsize * scale / (lw * n_src)),
                  math.ceil(rsize * scale / lr))  # fmt: skip
        return mem, rsize * scale / block * rc, (n_src - 1) * rsize * scale / block * wc
    if kind == CK_BROADCAST:
        tw = math.ceil(rsize * scale / lw)
        we = (n_dst - 1) * rsize * scale / block * wc
        if bcast:
            return max(math.ceil(rsize * scale / lr), tw), rsize * scale / block * rc, we
        return (
            max(math.ceil(rsize * scale / lr * n_dst), tw),
            n_dst * rsize * scale / block * rc,
            we,
        )
    if kind == CK_REDUCTION:
        rb, wb = rsize * scale / lr, rsize * scale / lw
        re_ = rsize * scale * n_src / block * rc
        we = rsize * scale / block * wc
        if red:
            return math.ceil(rb + wb + wb * RED_COST), re_, we
        mem = math.ceil(max(rb * (n_src - 1), wb * (n_src - 1)) + wb * RED_COST)
        return mem, re_ * (n_src - 1), we * (n_src - 1)
    if kind == CK_ALLGATHER:
        rb, wb = rsize * n_src * scale / lr, rsize * n_src * scale / lw
        re_ = rsize * n_src * scale / block * rc
        we = rsize * n_src * scale / block * wc * sf
        if bcast:
            return math.ceil(wb * sf), re_, we
        return max(math.ceil(wb * sf), math.ceil(rb * sf)), re_ * sf, we
    if kind == CK_ALLREDUCE:
        rb, wb = rsize * n_src * scale / lr, wsize * n_src * scale / lw
        re_ = rsize * n_src * scale / block * rc
        we = wsize * n_src * scale / block * wc
        if bcast and red:
            return math.ceil(wb + rb + wb * RED_COST), re_, we
        if bcast:
            return math.ceil((wb + rb) * sf + wb * RED_COST), re_ * sf, we * sf
        return math.ceil((2 * rb + wb) * sf + wb * RED_COST), re_ * (sf * 2), we * sf
    sf = n_dst  # a scatter (any other kind too)
    lr = min(cf[CF_LR], np.float64(min(2, n_dst - 1)) * port)
    mem = math.ceil((sf - 1) * rsize * scale / (lr * sf)) + math.ceil(wsize * scale / (sf * lw))
    return mem, (sf - 1) * rsize * scale / (sf * block) * rc, wsize * scale / block * wc


@numba.njit(cache=True)
def collective_node(net, net_pj, generalise, nodes, col, colf, x, cyc, glv, col_pj, head):  # type: ignore[no-untyped-def]
    """:meth:`.steady.SteadyState.visit_collective` of node row ``x``; returns an error code."""
    c = nodes[x, N_COL]
    ci, cf = col[c], colf[c]
    err, lat, pj, a, b = collective_link(
        net, net_pj, ci[CI_NET], ci[CI_KIND], ci[CI_RED], ci[CI_RSIZE], ci[CI_NSRC],
        cf[CF_SCALE], generalise,
    )  # fmt: skip
    if err:
        head[TH_A], head[TH_B] = a, b
        return err
    kind = ci[CI_KIND]
    if (kind == CK_SCATTER or kind == CK_OTHER) and ci[CI_NDST] <= 1:
        return ERR_SCATTER
    if not _divisors_ok(ci, cf):
        return ERR_ZERO_DIV
    mem, read_pj, write_pj = collective_memory(ci, cf)
    cyc[x] = mem + lat
    col_pj[x, CP_MEMORY], col_pj[x, CP_NETWORK] = read_pj + write_pj, pj
    m = glv[nodes[x, N_GRP0], ci[CI_TARGET]]
    for idx in range(2):
        m[idx, LO_PRESENT], m[idx, LO_REUSE] = 1, 1
        m[idx, LO_CUMM] = m[idx, LU_CUMM_STALL] = cyc[x]
    return ERR_NONE


# --- the kernel: the walk ------------------------------------------------------------------------


@numba.njit(cache=True)
def tree_kernel(lv, simd, net_of, net, net_pj, generalise, port_overwrite, fold, nodes, slots,  # type: ignore[no-untyped-def]
                sgkey, ops, refs, uses, ents, strips, col, colf, n_keys, n_acc, memo):  # fmt: skip
    """Stage 4 of a whole tree from its arrays (module docstring), rows in post-order.

    ``memo``: the leaf memo (:func:`new_leaf_memo`, :func:`leaf_node`), shared by the tilings
    of one batch: the same numbers, fewer leaf kernels.

    Returns ``(head, cyc, glv, acc, acc_pj, kt, col_pj)``; ``head[TH_ERROR]`` non-zero: the
    reference raises at node row ``head[TH_NODE]`` (:func:`raise_tree_error`), the rest is
    undefined.
    """
    n = nodes.shape[0]
    n_groups = 0
    for x in range(n):
        n_groups = max(n_groups, nodes[x, N_GRP0] + nodes[x, N_NGRP])
    head = np.zeros(TH_SIZE, dtype=np.int64)
    cyc = np.zeros(n, dtype=np.int64)
    glv = np.zeros((n_groups, lv.shape[0], 2, LU_COLS), dtype=np.int64)
    acc = np.zeros((n_acc, AC_COLS), dtype=np.int64)
    acc_pj = np.zeros((n_acc, AP_COLS), dtype=np.float64)
    kt = np.zeros((n, n_keys, KT_COLS), dtype=np.int64)
    col_pj = np.zeros((n, 2), dtype=np.float64)
    for x in range(n):
        kind = nodes[x, N_KIND]
        err = ERR_FLAT if nodes[x, N_ERROR] else ERR_NONE
        if err:
            pass
        elif kind == NK_LEAF:
            key, h, e = leaf_lookup(nodes, slots, ops, x, memo)
            if e >= 0:  # a kept leaf: its results (no kernel, no call)
                leaf_store(nodes, slots, sgkey, x, cyc, glv, acc, acc_pj, kt, memo[2][e],
                           memo[3][e], memo[4][e], memo[5][e], memo[6][e])  # fmt: skip
            else:
                err = leaf_node(
                    lv, simd, net_of, net, net_pj, generalise, port_overwrite, fold, nodes,
                    slots, sgkey, ops, x, cyc, glv, acc, acc_pj, kt, head, memo, key, h, e,
                )  # fmt: skip
        elif kind == NK_SPATIAL:
            err = spatial_node(lv, net_of, net, net_pj, generalise, port_overwrite, nodes, slots,
                               sgkey, refs, uses, ents, strips, x, cyc, glv, acc, acc_pj, kt,
                               head)  # fmt: skip
        elif kind == NK_TEMPORAL:
            temporal_node(nodes, slots, refs, uses, col, x, cyc, glv)
        elif kind == NK_PASS:
            cyc[x] = cyc[refs[nodes[x, N_REF0]]]
        else:
            err = collective_node(net, net_pj, generalise, nodes, col, colf, x, cyc, glv, col_pj,
                                  head)  # fmt: skip
        if err:
            head[TH_ERROR], head[TH_NODE] = err, x
            return head, cyc, glv, acc, acc_pj, kt, col_pj
    return head, cyc, glv, acc, acc_pj, kt, col_pj


# --- the wrapper (Python) ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TreeArrays:
    """The kernel's result (:func:`tree_kernel`), see the module docstring for the columns."""

    head: Ints
    cyc: Ints
    glv: Ints
    acc: Ints
    acc_pj: Floats
    kt: Ints
    col_pj: Floats


def run_tree(ft: FlatTree, fold: bool = True) -> TreeArrays:
    """The kernel on a flattened tree; the reference's exception where it raises.

    Raises:
        TreeModelError: a tree COMET cannot evaluate (as the reference words it).
        MeshShapeError: a transfer or collective on a sub-mesh outside COMET's table.
        KeyError: a cost the reference reads but never set (as the reference).
        IndexError: a tensor that moves over no iteration (as the reference).
        OverflowError: a transfer of infinite cycles (as the reference).
        ZeroDivisionError: a collective over a zero bandwidth (as the reference).
    """
    sh, flat = ft.shape, ft.shape.flat
    out = TreeArrays(*tree_kernel(flat.lv, flat.simd, flat.net_of, flat.net, flat.net_pj,
                                  flat.generalise, flat.port_overwrite, fold, ft.nodes, ft.slots,
                                  sh.sgkey, ft.ops, sh.refs, sh.uses, sh.ents, sh.strips, ft.col,
                                  sh.colf, len(sh.keys), sh.n_acc, new_leaf_memo()))  # fmt: skip
    if out.head[TH_ERROR]:
        raise_tree_error(out.head, ft)
    return out


def raise_tree_error(head: Ints, ft: FlatTree) -> None:
    """Raise the reference's exception for the kernel's error ``head[TH_ERROR]``."""
    x, err = int(head[TH_NODE]), int(head[TH_ERROR])
    node = ft.shape.order[x]
    if err == ERR_FLAT:
        raise ft.errors[x]
    if err == ERR_SCATTER:
        raise TreeModelError(f"{node.label}: a scatter needs more than one destination")
    if err == ERR_ZERO_DIV:
        raise ZeroDivisionError("float division by zero")
    if err == ERR_RED_OP:
        raise KeyError(node.red_op)
    if err == ERR_MESH and node.kind == "collective":
        a, b = int(head[TH_A]), int(head[TH_B])
        raise MeshShapeError(
            f"{node.label}: a {a}x{b} sub-mesh is not in COMET's collective table "
            "(1x1, 2x2, 4x4, 16x16): COMET aborts with std::out_of_range"
        )
    empty = np.zeros((0, SL_COLS), dtype=np.int64)
    leaf = cl.FlatLeaf(node, empty, np.zeros(0, dtype=np.int64), (), ())
    cl.raise_error(head[:H_SIZE], leaf, ft.shape.flat)


@dataclass(slots=True)
class TreeResult:
    """The kernel's result as the reference's :class:`.steady.SteadyState` tables.

    The merged costs' per-iteration vectors are left empty (no parent reads them).
    """

    node_cost: dict[int, int] = field(default_factory=dict)
    level_cost: dict[int, NodeLevels] = field(default_factory=dict)
    accesses: dict[int, list[Access]] = field(default_factory=dict)
    reuse: dict[int, PerTensor] = field(default_factory=dict)
    actual: dict[int, PerTensor] = field(default_factory=dict)
    ramp_up: dict[int, PerTensor] = field(default_factory=dict)
    ramp_down: dict[int, PerTensor] = field(default_factory=dict)
    col_energy: dict[int, tuple[float, float]] = field(default_factory=dict)


def _cost(row: Any) -> Cost:
    """A level cost of the kernel as a :class:`~.records.Cost` without its vectors."""
    c = merged_cost(row)
    c.cumm_stall = int(row[LU_CUMM_STALL])
    return c


def _table(kt: Any, keys: Sequence[tuple[int, str]], has: int, col: int) -> PerTensor:
    """One of a node's per-key tables as a dict (in key order; the reference's order differs)."""
    return {key: int(kt[g, col]) for g, key in enumerate(keys) if kt[g, has]}


def tree_result(out: TreeArrays, ft: FlatTree) -> TreeResult:
    """The kernel's arrays as the reference's tables (:class:`TreeResult`)."""
    sh = ft.shape
    names = sh.flat.names
    res = TreeResult()
    for x, node in enumerate(sh.order):
        res.node_cost[node.id] = int(out.cyc[x])
    for g, (x, key, name) in enumerate(sh.groups):
        node = sh.order[x]
        glv = out.glv[g]
        if name:  # a collective's cost on its level (for a temporal node: both ports one cost)
            i = sh.flat.index[name]
            both = [_cost(glv[i, 0]), _cost(glv[i, 1])]
            if node.kind == "tile":
                both = [both[0], both[0]]
            merged = {name: both}
        else:
            merged = {names[i]: [_cost(glv[i, 0]), _cost(glv[i, 1])]
                      for i in range(len(names)) if glv[i, 0, LO_PRESENT]}  # fmt: skip
        res.level_cost.setdefault(node.id, {})[key] = merged
    for x, node in enumerate(sh.order):
        kind = int(ft.nodes[x, N_KIND])
        if kind == NK_TEMPORAL:
            res.level_cost.setdefault(node.id, {})
        if kind == NK_COLLECTIVE:
            pj = out.col_pj[x]
            res.col_energy[node.id] = (float(pj[CP_MEMORY]), float(pj[CP_NETWORK]))
        if kind in (NK_LEAF, NK_SPATIAL):
            res.accesses[node.id] = _accesses(out, ft, x)
            kt = out.kt[x]
            res.reuse[node.id] = _table(kt, sh.keys, KT_REUSE_HAS, KT_REUSE)
            res.actual[node.id] = _table(kt, sh.keys, KT_REUSE_HAS, KT_ACTUAL)
            for table, has, col in ((res.ramp_up, KT_UP_HAS, KT_UP),
                                    (res.ramp_down, KT_DOWN_HAS, KT_DOWN)):  # fmt: skip
                got = _table(kt, sh.keys, has, col)
                if got:
                    table[node.id] = got
    return res


def _accesses(out: TreeArrays, ft: FlatTree, x: int) -> list[Access]:
    """Node row ``x``'s accesses (a leaf's: its tensors', then its compute unit's)."""
    sh = ft.shape
    node, levels, tags = sh.order[x], sh.flat.levels, sh.node_tags[x]
    r0, n = int(ft.nodes[x, N_ACC0]), int(sh.nodes[x, N_NACC])
    rows = out.acc[r0 : r0 + n].tolist()
    pjs = out.acc_pj[r0 : r0 + n].tolist()
    leaf = node.is_leaf_tile
    accesses = []
    for k, (r, pj) in enumerate(zip(rows, pjs, strict=True)):
        if leaf and k == n - 1:
            op = node.children[0]
            accesses.append(Access(
                level=levels[r[AC_LEVEL]], count=r[AC_COUNT], at_target=False, compute=True,
                tag=tags[r[AC_TAG]], op_type=op.op_type, rmw=bool(r[AC_RMW]), tid=r[AC_TID],
                mac_pj=pj[AP_MAC],
            ))  # fmt: skip
            continue
        at = bool(r[AC_AT_TARGET])
        accesses.append(Access(
            level=levels[r[AC_LEVEL]], count=r[AC_COUNT], tile=r[AC_TILE],
            precision=r[AC_PRECISION], rw=bool(r[AC_RW]), at_target=at, tid=r[AC_TID],
            rmw=bool(r[AC_RMW]), proj_count=r[AC_PROJ], tag=tags[r[AC_TAG]],
            noc_pj=pj[AP_NOC],
        ))  # fmt: skip
    return accesses


def steady_state(
    inp: TreeMapping,
    nests: Nests,
    moves: Moves,
    flat: FlatArch,
    compat: Compat,
    shape: TreeShape | None = None,
    fold: bool = True,
) -> TreeResult:
    """Stage 4 of ``inp`` compiled: the reference's ``SteadyState(...).visit(root)`` tables.

    Args:
        inp: the tree (a tile node at its root).
        nests: its loop nests (stage 2).
        moves: its moves (stage 3).
        flat: the arch and compatibility switches (:func:`.compiled_leaf.flatten_arch`).
        compat: the switches (``binding_misread`` shapes the tree).
        shape: the template's shape (:func:`tree_shape`), when the caller keeps it.
        fold: fold leaves whose transfers repeat (the same numbers).

    Raises:
        TreeModelError: as the reference.
        MeshShapeError: as the reference.
    """
    shape = shape or tree_shape(inp, flat, compat)
    ft = flatten_tree(shape, inp, nests, moves)
    return tree_result(run_tree(ft, fold), ft)
