r"""Stages 1-3 of a whole tree, compiled: the fit check, the loop nests and the moves.

The backbone of the compiled twin of the tree model (numba, ``@njit(cache=True)``; the first
piece, a leaf's stage 4, is :mod:`.compiled_leaf`, whose layout this module extends). The tilings
of one mapping template share their tree's shape and differ only in the numbers the template's
value texts give (factors, tile primitives, tile steps, reduction factors). So the tree is
flattened once per template and :class:`~fusekit.accel.compat.Compat`
(:func:`flatten_template`, from one reference tree of the template) and each tiling is a vector
of values (:func:`template_values` from the constants, or :func:`tree_values` from a built tree);
:func:`tree_kernel` computes stages 1-3 from the two, :func:`run_tree` raises the reference's
exceptions, :func:`to_nests` and :func:`to_moves` give the reference's records. The results are
bit-identical to :func:`.fit.fit_check`, :func:`.nests.build_nests` and
:func:`.nests.build_movements` (tested tiling by tiling, ``tests/accel/test_compiled_tree.py``).

Layout (the column names are this module's constants; levels by :mod:`.compiled_leaf`'s index,
rank order; dims by the problem's dim ids):

* ``vals``: one tiling's values, ``vals[ref]``. With a template (``FlatTree.template``) ``ref``
  is the id of a value text of the template (:class:`~fusekit.accel.comet.files.MappingTemplate`
  numbers them by first use) and ``vals`` is
  :func:`~fusekit.accel.comet.files.resolve_values` of the constants; without, each entry of
  the tree below is its own ``ref``, in pre-order;
* ``nd[node, ND_*]``: every node of the tree in pre-order (``FlatTree.nodes`` the reference's
  nodes): kind (``NK_*``), id, parent, children (``kids[ND_KIDS : ND_KIDS + ND_N_KIDS]``),
  spatial and leaf flags, a binding node's binding and a temporal tile's fit binding (``B_*``,
  the binding its tiles share their levels under), its slots, its op or collective row, its
  fit groups, the stage-3 error it raises (``-1``: none) and whether stages 1-3 walk it;
* ``slots[slot, *]``: every tile node's tensors concatenated (a node's ``ND_SLOT``,
  ``ND_N_SLOTS``); the first ``SL_COLS`` columns are :mod:`.compiled_leaf`'s (``SL_TAG`` and
  ``SL_KEY`` number the node's own tags and keys, ``FlatTree.node_tags``, ``node_keys``), so a
  leaf's rows slice into its kernel; ``ST_*`` follow: node, global (tensor, tag) key
  (``FlatTree.keys``), factor entries, lines, projection and order rows, whether its factors
  grow the time steps, fit group, and for a spatial slot the parent slot its moves follow
  (``ST_PIDX``) and the one its iterations copy (``ST_ITERS_FROM``), and its stage-3 error;
* ``fac[e, FC_*]``: a slot's factors, line by line in the loop order: slot, line, dim, ``ref``;
  the kernel's ``desc[e] = (end, stride)``, so a slot's ``Nest.desc`` is its entries;
* ``pd[j, PD_*]``: a slot's projection (``Chain.projection``): dim and its entries on the first
  and last line (``-1``: none); ``od[j, OD_*]``: a temporal slot's loop order: the last line's
  entry of the dim and whether it is projected;
* ``grp[g, GR_*]``: per tile node, its distinct (tensor, target level) pairs: the level and
  whether it is the first group of that level in the node;
* ``ops[o, OR_*]``: op nodes: type (``FlatArch.op_types``), unit (its tile's first child
  level), GEMM flag, ranges of ``prim[p, PM_*]`` (dim, ``ref``, the primitive's dict order),
  ``red[r, RD_*]`` (per ``red_dims`` entry: dim, ``ref``) and ``okey[q, OK_*]`` (per tile-steps
  tensor: global key, range of ``step[s, TS_*]``: dim, ``ref``);
* ``cols[c, CO_*]``: collectives: kind (index in ``COLLECTIVE_TYPES``), reduction op, dim,
  source and sink instances, target and child level, tensors, precision, spatial factor,
  write-back, the key stage 1 reads (``CO_FIT_SRC``) and writes (``CO_KEY``), and the range of
  ``cext[x, CX_*]``: per line and dim of the loops it reads (line, dim, source entry, source
  kind: a ``fac`` entry or an earlier ``cext`` row); the kernel's ``col_ext[x] = (in, out)``;
* ``post``: the nodes stages 1 and 2 visit, in their post-order; ``pre``: the tile nodes stage
  3 visits, in pre-order; ``cap[level]``: the bytes the fit check allows (``-1``: unchecked).

The kernel's outputs: ``head[HD_*]`` (error code ``ERR_*`` and its index), ``req[level]`` (the
bytes requested), the slots with the per-tiling columns filled (``SL_ITERS`` to
``SL_KEPT_COUNT``, as stage 4 reads them: after stage 3 set a spatial slot's iterations),
``desc[e]`` and ``col_ext[x]``.

The formulas (the reference's; absent dims read 0, which every formula keeps). Stage 1, per
(tensor, tag) key ``k`` and dim ``d`` an extent :math:`x_{k,d}`, set by an op's tile steps and
grown by every tile factor :math:`f \ne 1`, :math:`x_{k,d} \leftarrow x_{k,d} f`; a collective
copies the extent of its tensor's first tag (gather, all-gather: the dim times the sources;
scatter: ``int(x / sinks)``). A temporal tile asks each target level for

.. math:: b_{level} = \sum_{tensor} \max_{tags}
          \mathrm{int}\Big(\prod_{d \in proj} x_{k,d} \cdot bits / 8.0\Big)

which adds to the level's occupancy, or under a sequential binding takes the larger, under a
parallel or sharing one nothing; a level rejects the tiling where occupancy exceeds
``width * depth`` (half natively when double-buffered). Stage 2, per key the stride
:math:`s_{k,d}` from the op's tile steps; a factor's loop is :math:`(end, stride) = (s f, s)`,
then :math:`s \leftarrow s f`; a temporal slot iterates :math:`\prod f` times (a spatial one
fans out so), its child's time steps per iteration are the key's steps
(:math:`\prod_d \lfloor ts_d / prim_d \rfloor` from a GEMM, else 1), which then grow by
:math:`\prod f`. Stage 3, a temporal slot moves a tile of :math:`\prod_{d \in proj} stride_d`
elements every ``period`` iterations, the product of the steps (``end // stride``) of the loops
inside the innermost projected loop of more than one step (0: none); a spatial slot moves
:math:`\prod_{d \in proj} \lceil end^{last}_d / stride^{first}_d \rceil` distinct tiles of
:math:`\prod_{d \in proj} stride^{first}_d` elements to its children when its parent's tile
moves.

Errors: whether the reference raises depends on the tree's shape, not its values (a missing
binding or projection, a collective without a producer, a spatial tile without a temporal
parent, ...), except a spatial slot's division by a zero stride (a dim the op's tile steps leave
out, or scattered to nothing). So :func:`flatten_template` runs the reference's walks on the
reference tree and records each error (``FlatTree.errors``) where the walk meets it: stage 1's
(``err1``) every tiling raises, stage 2's (``err2``) every tiling that fits, stage 3's at its
node (``ND_ERR``) or slot (``ST_ERR``, after ``ST_ERR_AT`` of its projected dims) of the
pre-order; the kernel stops at the first error it reaches, the zero division its own. Reading
a template's text ids leans on :mod:`fusekit.accel.comet.files`' compiled nodes
(``TemplateTile``, ``TemplateOp``). Not here: numbers past ``2**63`` (Python's integers do not
wrap) and templates whose constants change the tree's shape (a permutation or a reduction dim
named by a constant that a tiling changes: :func:`template_values` refuses them).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

from fusekit.accel.comet.files import (
    COLLECTIVE_TYPES,
    CometInputError,
    MappingTemplate,
    TemplateNode,
    TemplateOp,
    TemplateTile,
    resolve_values,
)
from fusekit.accel.compat import Compat
from fusekit.accel.tree import TreeMapping, TreeNode, pre_order
from fusekit.accel.tree_model.compiled_leaf import (
    SL_CHILD,
    SL_COLS,
    SL_DEPENDENT,
    SL_ITERS,
    SL_KEPT_COUNT,
    SL_KEPT_TILE,
    SL_KEPT_UNIQUE,
    SL_KEY,
    SL_MOVED_COUNT,
    SL_MOVED_TILE,
    SL_MOVED_UNIQUE,
    SL_N,
    SL_PERIOD,
    SL_REL_TS,
    SL_RMW,
    SL_RW,
    SL_SCALE,
    SL_SP_ITERS,
    SL_TAG,
    SL_TARGET,
    SL_TID,
    FlatArch,
    FlatLeaf,
    Ints,
    flatten_arch,
)
from fusekit.accel.tree_model.fit import binding_of, fit_check
from fusekit.accel.tree_model.nests import build_nests
from fusekit.accel.tree_model.records import (
    FitError,
    Move,
    MoveRow,
    Moves,
    Nest,
    Nests,
    TreeModelError,
)

# --- the layout (see the module docstring) -----------------------------------------------------

#: ``nd`` columns; ``NK_*``: node kinds; ``B_*``: bindings.
ND_KIND, ND_ID, ND_PARENT, ND_KIDS, ND_N_KIDS, ND_SPATIAL, ND_LEAF = 0, 1, 2, 3, 4, 5, 6
ND_BIND, ND_FIT_BIND, ND_SLOT, ND_N_SLOTS, ND_ROW, ND_GROUP, ND_N_GROUPS = 7, 8, 9, 10, 11, 12, 13
ND_ERR, ND_WALKED = 14, 15
ND_COLS = 16
NK_TILE, NK_OP, NK_BIND, NK_COLLECTIVE = 0, 1, 2, 3
_KIND_CODES = {"tile": NK_TILE, "op": NK_OP, "bind": NK_BIND, "collective": NK_COLLECTIVE}
B_NONE, B_SEQUENTIAL, B_PIPELINE, B_PARALLEL, B_SHARING = 0, 1, 2, 3, 4
_BINDINGS = {"none": B_NONE, "sequential": B_SEQUENTIAL, "pipeline": B_PIPELINE,
             "parallel": B_PARALLEL, "sharing": B_SHARING}  # fmt: skip

#: ``slots`` columns after :mod:`.compiled_leaf`'s ``SL_*``.
ST_NODE, ST_GKEY, ST_FAC, ST_N_FAC, ST_N_LINES = 20, 21, 22, 23, 24
ST_PROJ, ST_N_PROJ, ST_ORDER, ST_N_ORDER, ST_GROW, ST_GROUP = 25, 26, 27, 28, 29, 30
ST_PIDX, ST_ITERS_FROM, ST_ERR, ST_ERR_AT = 31, 32, 33, 34
ST_COLS = 35

#: ``fac``, ``pd``, ``od``, ``grp`` columns.
FC_SLOT, FC_LINE, FC_DIM, FC_REF = 0, 1, 2, 3
PD_DIM, PD_FIRST, PD_LAST = 0, 1, 2
OD_ENT, OD_IN_PROJ = 0, 1
GR_LEVEL, GR_FIRST = 0, 1

#: ``ops`` columns, then ``prim``, ``red``, ``okey`` and ``step`` columns.
OR_NODE, OR_TYPE, OR_UNIT, OR_GEMM, OR_PRIM, OR_N_PRIM, OR_RED, OR_N_RED = 0, 1, 2, 3, 4, 5, 6, 7
OR_KEYS, OR_N_KEYS = 8, 9
OR_COLS = 10
PM_DIM, PM_REF = 0, 1
RD_DIM, RD_REF = 0, 1
OK_KEY, OK_TID, OK_STEP, OK_N_STEP = 0, 1, 2, 3
TS_DIM, TS_REF = 0, 1

#: ``cols`` columns; ``RED_OPS``: the reduction ops by code.
CO_NODE, CO_TYPE, CO_RED_OP, CO_DIM, CO_N_SRC, CO_N_DST, CO_TARGET = 0, 1, 2, 3, 4, 5, 6
CO_CHILD, CO_IN, CO_OUT, CO_PRECISION, CO_SPATIAL_FACTOR, CO_WB = 7, 8, 9, 10, 11, 12
CO_FIT_SRC, CO_KEY, CO_EXT, CO_N_EXT, CO_N_LINES = 13, 14, 15, 16, 17
CO_COLS = 18
RED_OPS = ("", "max", "add", "mult")
_GROW_TYPES = (COLLECTIVE_TYPES.index("gather"), COLLECTIVE_TYPES.index("allgather"))
CT_GATHER, CT_ALLGATHER = _GROW_TYPES
CT_SCATTER = COLLECTIVE_TYPES.index("scatter")
#: ``cext`` columns.
CX_LINE, CX_DIM, CX_SRC, CX_FROM_COL = 0, 1, 2, 3

#: The kernel's tables, in its argument ``tabs``; ``meta`` entries.
TABLES = ("nd", "slots", "fac", "pd", "od", "grp", "ops", "prim", "okey", "step", "cols", "cext")
M_KEYS, M_DIMS, M_ERR1, M_ERR2 = 0, 1, 2, 3

#: ``head`` entries of the kernel's result; ``ERR_*``: its error codes.
HD_ERROR, HD_INDEX = 0, 1
HD_SIZE = 2
#: ``ERR_FIT``: the fit check rejects (``req``); ``ERR_RAISE``: the recorded error
#: ``FlatTree.errors[head[HD_INDEX]]``; ``ERR_ZERO_DIV``: slot ``head[HD_INDEX]`` divides by 0.
ERR_NONE, ERR_FIT, ERR_RAISE, ERR_ZERO_DIV = 0, 1, 2, 3

#: A recorded error: the reference's exception (raised afresh each time, :func:`raise_error`).
Recorded = BaseException


@dataclass(frozen=True, slots=True)
class FlatTree:
    """A template's tree as arrays (module docstring), for one ``Compat``."""

    arch: FlatArch
    compat: Compat
    nodes: tuple[TreeNode, ...]
    nd: Ints
    kids: Ints
    slots: Ints
    fac: Ints
    pd: Ints
    od: Ints
    grp: Ints
    ops: Ints
    prim: Ints
    red: Ints
    okey: Ints
    step: Ints
    cols: Ints
    cext: Ints
    post: Ints
    pre: Ints
    cap: Ints
    keys: tuple[tuple[int, str], ...]
    node_tags: tuple[tuple[str, ...], ...]
    node_keys: tuple[tuple[tuple[int, str], ...], ...]
    n_dims: int
    n_vals: int
    ref_vals: Ints
    errors: tuple[Recorded, ...]
    err1: int
    err2: int
    template: MappingTemplate | None
    shape_consts: tuple[tuple[str, str, str], ...]
    mapping_file: str
    fit_order: tuple[int, ...]


# --- flattening (Python) -----------------------------------------------------------------------


def _record(errors: list[Recorded], e: BaseException) -> int:
    """Record exception ``e``; its index in ``errors``."""
    errors.append(e.with_traceback(None))
    return len(errors) - 1


def _shape_text(kind: str, text: str, const: dict[str, Any]) -> str:
    """What a permutation (``kind`` ``perm``) or reduction-dim text names under ``const``."""
    if kind == "perm":
        return str(const.get(text, text))
    return str(const[text]) if text in const and len(text) != 1 else text


class _Refs:
    """Where each value of the tree comes from: a template's text ids, or one ref per entry."""

    def __init__(self, inp: TreeMapping, template: MappingTemplate | None) -> None:
        self.values: list[int] = []
        self.tiles: dict[int, list[list[dict[int, int]]]] = {}
        self.prims: dict[int, dict[int, int]] = {}
        self.steps: dict[int, dict[int, dict[int, int]]] = {}
        self.reds: dict[int, dict[int, int]] = {}
        self.shape: list[tuple[str, str, str]] = []
        self.template = template
        if template is not None:
            try:
                self.values = resolve_values(template.texts, inp.const, template.file)
            except CometInputError as e:
                raise ValueError(f"compiled tree: the template's values do not resolve: {e}") from e
            self._match(template, template.root, inp.mapping, inp.const)

    def _match(
        self, tpl: MappingTemplate, tn: TemplateNode, node: TreeNode, const: dict[str, Any]
    ) -> None:
        """Read the text ids of template node ``tn``, the template's form of ``node``."""
        if tn.id != node.id or len(tn.children) != len(node.children):
            raise ValueError(f"compiled tree: the template is not the tree's ({node.label})")
        if isinstance(tn, TemplateTile):
            perm = _shape_text("perm", tn.perm, const)
            self.shape.append(("perm", tn.perm, perm))
            order = tn.order(perm, tpl.prob, tpl.file)
            self.tiles[node.id] = [[dict(line) for line in lines] for lines in order.fill]
        elif isinstance(tn, TemplateOp):
            self.prims[node.id] = dict(tn.primitive)
            self.steps[node.id] = {t: dict(terms) for t, terms in tn.steps}
            red: dict[int, int] = {}
            for (text, i), did in zip(tn.reductions, node.red_dims, strict=True):
                self.shape.append(("red", text, _shape_text("red", text, const)))
                red[did] = i
            self.reds[node.id] = red
        for a, b in zip(tn.children, node.children, strict=True):
            self._match(tpl, a, b, const)

    def ref(self, table: Any, where: tuple[Any, ...], value: int) -> int:
        """The ref of a value (``table[where...]``'s text id with a template, else a new one)."""
        if self.template is None:
            self.values.append(value)
            return len(self.values) - 1
        try:
            for k in where:
                table = table[k]
        except (KeyError, IndexError) as e:
            raise ValueError(f"compiled tree: no template text for {where}") from e
        i = int(table)
        if self.values[i] != value:
            raise ValueError(f"compiled tree: the template's value of {where} is not the tree's")
        return i


def _rows(rows: list[list[int]], cols: int) -> Ints:
    return np.array(rows, dtype=np.int64).reshape(-1, cols)


class _Flattener:
    """Builds a :class:`FlatTree`: node rows in pre-order, then the walks' structure."""

    def __init__(self, inp: TreeMapping, compat: Compat, template: MappingTemplate | None) -> None:
        self.inp, self.compat, self.prob = inp, compat, inp.problem
        self.arch = flatten_arch(inp.arch, compat)
        self.nodes = tuple(pre_order(inp.mapping))
        self.at = {id(n): i for i, n in enumerate(self.nodes)}
        self.refs = _Refs(inp, template)
        self.errors: list[Recorded] = []
        self.keys: dict[tuple[int, str], int] = {}
        self.outs = frozenset(self.prob.tensors.index(o.out) for o in self.prob.ops.values())
        self.nd = [[0] * ND_COLS for _ in self.nodes]
        self.kids: list[int] = []
        self.slots: list[list[int]] = []
        self.lines: list[list[dict[int, int]]] = []  # per slot, per line: dim -> entry
        self.projs: list[tuple[int, ...] | None] = []  # per slot
        self.fac: list[list[int]] = []
        self.pd: list[list[int]] = []
        self.od: list[list[int]] = []
        self.grp: list[list[int]] = []
        self.ops: list[list[int]] = []
        self.prim: list[list[int]] = []
        self.red: list[list[int]] = []
        self.okey: list[list[int]] = []
        self.step: list[list[int]] = []
        self.cols: list[list[int]] = []
        self.cext: list[list[int]] = []
        self.node_tags: list[tuple[str, ...]] = []
        self.node_keys: list[tuple[tuple[int, str], ...]] = []
        self.post: list[int] = []
        self.pre: list[int] = []

    def key(self, key: tuple[int, str]) -> int:
        """The global number of a (tensor, tag) key."""
        return self.keys.setdefault(key, len(self.keys))

    def projection(self, key: tuple[int, str]) -> tuple[int, ...] | None:
        """``Chain.projection`` of a key, ``None`` where it raises (a recorded error's)."""
        try:
            return self.prob.projection(key[1], key[0])
        except KeyError:
            return None

    def is_rw(self, key: tuple[int, str]) -> bool:
        """:meth:`.nests._NestWalk.is_rw`."""
        op = self.prob.ops.get(key[1])
        return key[0] in op.rw if op is not None and key[0] in op.projections else True

    # -- node rows, in pre-order

    def node(self, i: int, n: TreeNode) -> None:
        """The row of node ``i`` and its kind's rows."""
        row = self.nd[i]
        row[ND_KIND], row[ND_ID] = _KIND_CODES[n.kind], n.id
        row[ND_PARENT] = self.at[id(n.parent)] if n.parent is not None else -1
        row[ND_KIDS], row[ND_N_KIDS] = len(self.kids), len(n.children)
        self.kids += [self.at[id(c)] for c in n.children]
        row[ND_SPATIAL], row[ND_LEAF] = int(n.spatial), int(n.is_leaf_tile)
        row[ND_BIND] = _BINDINGS.get(n.binding, B_NONE)
        row[ND_FIT_BIND] = row[ND_ROW] = row[ND_ERR] = -1
        row[ND_SLOT], row[ND_GROUP] = len(self.slots), len(self.grp)
        tags: dict[str, int] = {}
        keys: dict[tuple[int, str], int] = {}
        if n.kind == "tile":
            for t in range(len(n.tensors)):
                self.slot(i, n, t, tags, keys)
            row[ND_N_SLOTS] = len(n.tensors)
            row[ND_N_GROUPS] = len(self.grp) - row[ND_GROUP]
            if n.parent is not None and not n.spatial:
                row[ND_FIT_BIND] = self.fit_binding(n, n.parent)
        elif n.kind == "op":
            row[ND_ROW] = self.op(i, n)
        elif n.kind == "collective":
            row[ND_ROW] = self.collective(i, n)
        self.node_tags.append(tuple(tags))
        self.node_keys.append(tuple(keys))

    def fit_binding(self, n: TreeNode, parent: TreeNode) -> int:
        """:func:`.fit._binding`'s code (``B_NONE`` where it raises: a recorded error)."""
        misread = self.compat.binding_misread
        try:
            b = binding_of(n, misread)
            if b == "none":
                b = binding_of(parent, misread)
        except TreeModelError:
            return B_NONE
        return _BINDINGS[b]

    def slot(
        self, i: int, n: TreeNode, t: int, tags: dict[str, int], keys: dict[tuple[int, str], int]
    ) -> None:
        """Slot ``t`` of tile node ``i``: its row, factor entries, projection and order rows."""
        s, tid, tag = len(self.slots), n.tensors[t], n.tags[t]
        index = self.arch.index
        row = [0] * ST_COLS
        row[SL_TID], row[SL_TAG] = tid, tags.setdefault(tag, len(tags))
        row[SL_KEY] = keys.setdefault((tid, tag), len(keys))
        row[SL_TARGET], row[SL_CHILD] = index[n.targets[t]], index[n.childs[t]]
        row[SL_SCALE], row[SL_RMW] = n.scale[t], int(n.rmw[t])
        row[SL_RW] = int(self.is_rw((tid, tag)))
        row[SL_DEPENDENT] = int(tid in self.prob.intermediates)
        row[ST_NODE], row[ST_GKEY] = i, self.key((tid, tag))
        row[ST_FAC], row[ST_N_LINES] = len(self.fac), len(n.tilings[t])
        lines = []
        for line, fac in enumerate(n.tilings[t]):
            ents = {}
            for d, v in fac.items():
                ents[d] = len(self.fac)
                ref = self.refs.ref(self.refs.tiles, (n.id, t, line, d), v)
                self.fac.append([s, line, d, ref])
            lines.append(ents)
        row[ST_N_FAC] = len(self.fac) - row[ST_FAC]
        proj = self.projection((tid, tag))
        first, last = (lines[0], lines[-1]) if lines else ({}, {})
        row[ST_PROJ], row[ST_N_PROJ] = len(self.pd), len(proj or ())
        self.pd += [[d, first.get(d, -1), last.get(d, -1)] for d in proj or ()]
        row[ST_ORDER] = len(self.od)
        if not n.spatial:
            self.od += [[last.get(d, -1), int(d in (proj or ()))] for d in n.order]
        row[ST_N_ORDER] = len(self.od) - row[ST_ORDER]
        row[ST_GROW] = int(any(n.tilings[t]))
        row[ST_GROUP] = self.group(i, index[n.targets[t]], tid)
        row[ST_PIDX] = row[ST_ITERS_FROM] = row[ST_ERR] = -1
        self.slots.append(row)
        self.lines.append(lines)
        self.projs.append(proj)

    def group(self, i: int, level: int, tid: int) -> int:
        """The fit group (tensor, target level) of a slot of node ``i`` (new ones appended)."""
        g0 = self.nd[i][ND_GROUP]
        for g in range(g0, len(self.grp)):
            if self.grp[g][2:] == [level, tid]:
                return g
        first = all(self.grp[g][GR_LEVEL] != level for g in range(g0, len(self.grp)))
        self.grp.append([level, int(first), level, tid])
        return len(self.grp) - 1

    def op(self, i: int, n: TreeNode) -> int:
        """An op's row, its primitive, reduction and tile-steps rows."""
        types, refs = self.arch.op_types, self.refs
        p = n.parent
        under_tile = p is not None and p.kind == "tile" and bool(p.childs)
        unit = self.arch.index[p.childs[0]] if p is not None and under_tile else -1
        row = [0] * OR_COLS
        row[OR_NODE], row[OR_UNIT], row[OR_GEMM] = i, unit, int(n.op_type == "gemm")
        row[OR_TYPE] = types.index(n.op_type) if n.op_type in types else -1
        row[OR_PRIM], row[OR_N_PRIM] = len(self.prim), len(n.primitive)
        self.prim += [[d, refs.ref(refs.prims, (n.id, d), v)] for d, v in n.primitive.items()]
        row[OR_RED], row[OR_N_RED] = len(self.red), len(n.red_dims)
        self.red += [[d, refs.ref(refs.reds, (n.id, d), n.red_factors[d])] for d in n.red_dims]
        row[OR_KEYS], row[OR_N_KEYS] = len(self.okey), len(n.tilesizes)
        for t, ts in n.tilesizes.items():
            self.okey.append([self.key((t, n.op_name)), t, len(self.step), len(ts)])
            self.step += [[d, refs.ref(refs.steps, (n.id, t, d), v)] for d, v in ts.items()]
        self.ops.append(row)
        return len(self.ops) - 1

    def collective(self, i: int, n: TreeNode) -> int:
        """A collective's row (its sources: :meth:`walk_keys`, :meth:`walk_loops`)."""
        levels, index = self.inp.arch.levels, self.arch.index
        row = [0] * CO_COLS
        row[CO_NODE], row[CO_TYPE] = i, COLLECTIVE_TYPES.index(n.col_type)
        row[CO_RED_OP], row[CO_DIM] = RED_OPS.index(n.red_op), n.dim
        row[CO_N_SRC] = int(np.prod([levels[s].instances for s in n.src], dtype=np.int64))
        row[CO_N_DST] = int(np.prod([levels[s].instances for s in n.dest], dtype=np.int64))
        row[CO_TARGET], row[CO_CHILD] = index[n.target], index[n.child]
        row[CO_IN], row[CO_OUT], row[CO_PRECISION] = n.in_tensor, n.out_tensor, n.precision
        row[CO_SPATIAL_FACTOR], row[CO_WB] = n.spatial_factor, int(n.wb_output)
        row[CO_FIT_SRC], row[CO_KEY] = -1, self.key((n.in_tensor, n.tag))
        self.cols.append(row)
        return len(self.cols) - 1

    # -- the walks' structure

    def walk(self, n: TreeNode) -> None:
        """Stages 1 and 2's post-order: a tile's children but its bindings, then the tile."""
        if n.kind == "tile":
            for c in n.children:
                if c.kind != "bind":
                    self.walk(c)
        if n.kind in ("tile", "op", "collective"):
            self.post.append(self.at[id(n)])

    def walk_keys(self) -> None:
        """Stage 1's keys: the tile each collective reads (its tensor's first tag so far)."""
        present: set[tuple[int, str]] = set()
        for i in self.post:
            n = self.nodes[i]
            if n.kind == "tile":
                present.update(zip(n.tensors, n.tags, strict=True))
            elif n.kind == "op":
                present.update((t, n.op_name) for t in n.tilesizes)
            else:
                tags = [tag for tid, tag in present if tid == n.in_tensor]
                left = n.parent.children[: n.position()] if n.parent is not None else []
                if tags and any(c.kind == "tile" and n.in_tensor in c.tensors for c in left):
                    self.cols[self.nd[i][ND_ROW]][CO_FIT_SRC] = self.key((n.in_tensor, min(tags)))
                present.add((n.in_tensor, n.tag))

    def walk_loops(self) -> None:
        """Stage 2's producers: the loops each collective reads (a slot's or a collective's)."""
        produced: dict[tuple[str, int], tuple[bool, int]] = {}  # (level, tid) -> (col?, row)
        for i in self.post:
            n = self.nodes[i]
            if n.kind == "tile":
                for t, tid in enumerate(n.tensors):
                    if tid in self.outs:
                        produced[(n.targets[t], tid)] = (False, self.nd[i][ND_SLOT] + t)
            elif n.kind == "collective":
                c = self.nd[i][ND_ROW]
                src = produced.get((n.target, n.in_tensor))
                if src is None:
                    return  # a recorded error: stage 2 stops here
                row = self.cols[c]
                row[CO_EXT] = len(self.cext)
                if src[0]:
                    s_row = self.cols[src[1]]
                    first, count = s_row[CO_EXT], s_row[CO_N_EXT]
                    self.cext += [[*self.cext[x][:2], x, 1] for x in range(first, first + count)]
                    row[CO_N_LINES] = s_row[CO_N_LINES]
                else:
                    s = self.slots[src[1]]
                    ents = range(s[ST_FAC], s[ST_FAC] + s[ST_N_FAC])
                    self.cext += [[self.fac[e][FC_LINE], self.fac[e][FC_DIM], e, 0] for e in ents]
                    row[CO_N_LINES] = s[ST_N_LINES]
                row[CO_N_EXT] = len(self.cext) - row[CO_EXT]
                if (n.target, n.out_tensor) in produced:
                    produced[(n.target, n.out_tensor)] = (True, c)

    def walk_moves(self, n: TreeNode, nests: Nests) -> bool:
        """Stage 3's pre-order from ``n``: spatial slots' parents, errors; ``False`` at one."""
        i = self.at[id(n)]
        self.pre.append(i)
        if n.spatial:
            ok = self.spatial_parents(i, n, nests)
        else:
            ok = self.temporal_checks(i, n, nests)
        if not ok:
            return False
        return all(self.walk_moves(c, nests) for c in n.children if c.kind == "tile")

    def temporal_checks(self, i: int, n: TreeNode, nests: Nests) -> bool:
        """A temporal node's lookups (:func:`.nests.temporal_period`'s); the first error's."""
        nest = nests.tiles[n.id]
        for t in range(len(n.tensors)):
            try:
                proj = self.prob.projection(n.tags[t], n.tensors[t])
                desc = nest.desc[t][-1]
                for d in proj:
                    _ = desc[d][1]
                for d in n.order:
                    _ = desc[d]
            except Exception as e:  # raised where the reference raises
                self.slots[self.nd[i][ND_SLOT] + t][ST_ERR] = _record(self.errors, e)
                return False
        return True

    def spatial_parents(self, i: int, n: TreeNode, nests: Nests) -> bool:
        """A spatial node's parent slots (:func:`.nests._spatial_moves`); the first error's."""
        parent = n.parent
        if parent is None or parent.kind != "tile" or parent.spatial:
            e = TreeModelError(f"{n.label}: a spatial tile needs a temporal tile above")
            self.nd[i][ND_ERR] = _record(self.errors, e)
            return False
        p0 = self.nd[self.at[id(parent)]][ND_SLOT]
        first_at: dict[tuple[int, str], int] = {}
        last_at: dict[tuple[int, str], int] = {}
        for j, key in enumerate(zip(parent.tensors, parent.tags, strict=True)):
            first_at.setdefault(key, j)
            last_at[key] = j
        pidx = 0
        for t, key in enumerate(zip(n.tensors, n.tags, strict=True)):
            row = self.slots[self.nd[i][ND_SLOT] + t]
            if key in first_at:
                pidx = first_at[key]
                if n.targets[t] == parent.targets[pidx]:
                    row[ST_ITERS_FROM] = p0 + last_at[key]
            row[ST_PIDX] = p0 + pidx
            at = 0
            try:
                desc = nests.tiles[n.id].desc[t]
                first, last = desc[0], desc[-1]
                for d in self.prob.projection(key[1], key[0]):
                    _ = last[d][0], first[d][1]
                    at += 1
                list(parent.tensors)[pidx]  # the parent's moves, one per tensor
            except Exception as e:  # raised where the reference raises
                row[ST_ERR], row[ST_ERR_AT] = _record(self.errors, e), at
                return False
        return True

    def caps(self) -> list[int]:
        """Per level, the bytes the fit check allows (``-1``: DRAM, unchecked)."""
        out = []
        for lv in self.arch.levels:
            cap = lv.capacity_bytes()
            if not self.compat.full_double_buffer and lv.attrs.get("doublebuffered"):
                cap //= 2
            out.append(-1 if lv.name == "DRAM" else cap)
        return out

    def build(self) -> FlatTree:
        """The flat tree, the reference tree's structural errors recorded."""
        inp = self.inp
        for i, n in enumerate(self.nodes):
            self.node(i, n)
        self.walk(inp.mapping)
        for i in self.post:
            self.nd[i][ND_WALKED] = 1
        self.walk_keys()
        self.walk_loops()
        err1 = err2 = -1
        try:
            fit_check(inp, self.compat)
        except FitError:
            pass
        except Exception as e:  # structural: every tiling raises it
            err1 = _record(self.errors, e)
        if err1 < 0:
            try:
                nests = build_nests(inp)
            except Exception as e:  # structural: every tiling that fits raises it
                err2 = _record(self.errors, e)
            if err2 < 0 and inp.mapping.kind == "tile":
                self.walk_moves(inp.mapping, nests)
        names = self.arch.names
        return FlatTree(
            arch=self.arch, compat=self.compat, nodes=self.nodes, nd=_rows(self.nd, ND_COLS),
            kids=np.array(self.kids, dtype=np.int64), slots=_rows(self.slots, ST_COLS),
            fac=_rows(self.fac, 4), pd=_rows(self.pd, 3), od=_rows(self.od, 2),
            grp=_rows([g[:2] for g in self.grp], 2), ops=_rows(self.ops, OR_COLS),
            prim=_rows(self.prim, 2), red=_rows(self.red, 2), okey=_rows(self.okey, 4),
            step=_rows(self.step, 2), cols=_rows(self.cols, CO_COLS), cext=_rows(self.cext, 4),
            post=np.array(self.post, dtype=np.int64), pre=np.array(self.pre, dtype=np.int64),
            cap=np.array(self.caps(), dtype=np.int64), keys=tuple(self.keys),
            node_tags=tuple(self.node_tags), node_keys=tuple(self.node_keys),
            n_dims=len(self.prob.dims), n_vals=len(self.refs.values),
            ref_vals=np.array(self.refs.values, dtype=np.int64), errors=tuple(self.errors),
            err1=err1, err2=err2, template=self.refs.template,
            shape_consts=tuple(self.refs.shape), mapping_file=inp.mapping_file,
            fit_order=tuple(sorted(range(len(names)), key=lambda g: names[g])),
        )  # fmt: skip


def flatten_template(
    inp: TreeMapping, compat: Compat, template: MappingTemplate | None = None
) -> FlatTree:
    """The tree of ``inp`` as arrays, for every tiling of its template (module docstring).

    Args:
        inp: one tree of the template (any tiling: the shape is the template's).
        compat: the compatibility switches (stage 1 reads ``binding_misread`` and
            ``full_double_buffer``; the arch's arrays, :func:`.compiled_leaf.flatten_arch`,
            the others).
        template: the template ``inp`` was built from: the values are then its texts'
            (:func:`template_values`); ``None``: one value per entry (:func:`tree_values`).

    Raises:
        ValueError: ``template`` is not the template of ``inp``, or two levels share a rank.
    """
    return _Flattener(inp, compat, template).build()


# --- a tiling's values (Python) ----------------------------------------------------------------


def template_values(flat: FlatTree, const: dict[str, Any]) -> Ints:
    """A tiling's values from its constants (``flat`` flattened with its template).

    Raises:
        ValueError: ``flat`` has no template, or ``const`` changes the tree's shape (a
            permutation or reduction dim named by a constant).
        CometInputError: a value is missing or not a count (as building the tree raises it).
    """
    tpl = flat.template
    if tpl is None:
        raise ValueError("compiled tree: flattened without a template (use tree_values)")
    for kind, text, want in flat.shape_consts:
        got = _shape_text(kind, text, const) if text in const else text
        if got != want:
            raise ValueError(f"compiled tree: constant {text!r} changes the tree's shape")
    vals = _plain_values(tpl.texts.texts, const)
    if vals is not None:
        return np.array(vals, dtype=np.int64)
    try:
        vals = resolve_values(tpl.texts, const, tpl.file)
    except CometInputError:
        tpl.build(const)  # the error a walk of the document meets first
        raise
    return np.array(vals, dtype=np.int64)


def plain_rows(
    flat: FlatTree,
    consts: Sequence[dict[str, Any]],
    plans: dict[frozenset[str], _PlainPlan] | None = None,
) -> tuple[list[Sequence[int]], list[int]]:
    """:func:`template_values` of each of ``consts`` that takes its fast path, and their indices.

    A constants dict whose shape constants name what the template's do and whose texts all
    take :func:`_plain_values`' path gives the same values as :func:`template_values`; the
    others are not given (``template_values`` raises for them or resolves them in full). The
    texts are read through a :class:`_PlainPlan` per key set (a search's dicts share one),
    kept in ``plans`` across calls when given.
    """
    tpl = flat.template
    if tpl is None:
        return [], []
    plans = {} if plans is None else plans
    rows: list[Sequence[int]] = []
    kept: list[int] = []
    plan: _PlainPlan | None = None
    for i, const in enumerate(consts):
        if plan is None or const.keys() != plan.keys:
            keys = frozenset(const)
            plan = plans.get(keys)
            if plan is None:
                plan = plans[keys] = _PlainPlan(tpl.texts.texts, flat.shape_consts, const)
        vals = plan.values(const)
        if vals is not None:
            rows.append(vals)
            kept.append(i)
    return rows, kept


#: The largest value the compiled tree holds (``int64``).
_INT64_MAX = 2**63 - 1


class _PlainPlan:
    """How :func:`plain_rows` reads a template's texts from constants dicts with given keys.

    Each text is a constant (read by one ``itemgetter``) or a literal count; the shape
    constants' verdicts are kept per tuple of their values. ``values`` is
    :func:`_plain_values` with the shape check of :func:`template_values`: ``None`` where
    either would not give the values.
    """

    def __init__(
        self, texts: list[str], checks: tuple[tuple[str, str, str], ...], const: dict[str, Any]
    ) -> None:
        self.keys = set(const)
        self.ok = True
        names = [t for t in texts if t in self.keys]
        self.literals: list[tuple[int, int]] = []  # (position, value) of digit texts
        for pos, t in enumerate(texts):
            if t in self.keys:
                continue
            if not (t.isascii() and t.isdigit()) or not 1 <= int(t) <= _INT64_MAX:
                self.ok = False  # every dict of these keys takes the full path
            else:
                self.literals.append((pos, int(t)))
        self.get = _getter(names)
        self.checks = [(k, t, w) for k, t, w in checks if t in self.keys]
        if any(t != w for _k, t, w in checks if t not in self.keys):
            self.ok = False
        self.shape_get = _getter([t for _k, t, _w in self.checks])
        self.verdicts: dict[tuple[Any, ...], bool] = {}

    def values(self, const: dict[str, Any]) -> Sequence[int] | None:
        """The texts' values read from ``const``, or ``None`` (see the class docstring)."""
        if not self.ok or not self._shapes_ok(const):
            return None
        vals = self.get(const)
        if vals and (set(map(type, vals)) != {int} or min(vals) < 1 or max(vals) > _INT64_MAX):
            return None  # not a count, or past int64 (the reference's path)
        if not self.literals:
            return vals
        out = list(vals)
        for pos, v in self.literals:
            out.insert(pos, v)
        return out

    def _shapes_ok(self, const: dict[str, Any]) -> bool:
        key = self.shape_get(const)
        try:
            hit = self.verdicts.get(key)
        except TypeError:  # an unhashable value: checked each time
            hit = None
        if hit is None:
            hit = all(_shape_text(k, t, const) == w for k, t, w in self.checks)
            try:
                self.verdicts[key] = hit
            except TypeError:
                pass
        return hit


def _getter(names: list[str]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """``const -> tuple of const[n] for n in names`` (an ``itemgetter``, always a tuple)."""
    if not names:
        return lambda _c: ()
    get = operator.itemgetter(*names)
    if len(names) == 1:
        return lambda c: (get(c),)
    return get


def _plain_values(texts: list[str], const: dict[str, Any]) -> list[int] | None:
    """The texts' values where each is a positive int constant or digits naming no constant.

    What :func:`~fusekit.accel.comet.files.resolve_values` gives for such texts, without its checks;
    ``None`` where a text is anything else (the caller resolves them all, raising as it does).
    """
    out = []
    for key in texts:
        v = const.get(key)
        if v is None and key not in const and key.isascii() and key.isdigit():
            v = int(key)
        if type(v) is not int or v < 1:
            return None
        out.append(v)
    return out


def tree_values(flat: FlatTree, root: TreeNode) -> Ints:
    """A tiling's values read off its tree (a tree of ``flat``'s shape, e.g. ``Space.inputs``).

    Raises:
        ValueError: ``root`` is not of ``flat``'s shape.
    """
    nodes = pre_order(root)
    if [n.id for n in nodes] != [int(x) for x in flat.nd[:, ND_ID]]:
        raise ValueError("compiled tree: the tree is not of the template's shape")
    vals = np.zeros(flat.n_vals, dtype=np.int64)
    nd, slots, fac = flat.nd.tolist(), flat.slots.tolist(), flat.fac.tolist()
    for i, n in enumerate(nodes):
        row = nd[i]
        if row[ND_KIND] == NK_TILE:
            for s in range(row[ND_SLOT], row[ND_SLOT] + row[ND_N_SLOTS]):
                lines = n.tilings[s - row[ND_SLOT]]
                for e in range(slots[s][ST_FAC], slots[s][ST_FAC] + slots[s][ST_N_FAC]):
                    _s, line, d, ref = fac[e]
                    vals[ref] = lines[line][d]
        elif row[ND_KIND] == NK_OP:
            op = flat.ops[row[ND_ROW]]
            for p in range(op[OR_PRIM], op[OR_PRIM] + op[OR_N_PRIM]):
                vals[flat.prim[p, PM_REF]] = n.primitive[int(flat.prim[p, PM_DIM])]
            for r in range(op[OR_RED], op[OR_RED] + op[OR_N_RED]):
                vals[flat.red[r, RD_REF]] = n.red_factors[int(flat.red[r, RD_DIM])]
            for key in flat.okey[op[OR_KEYS] : op[OR_KEYS] + op[OR_N_KEYS]].tolist():
                ts = n.tilesizes[key[OK_TID]]
                for d, ref in flat.step[key[OK_STEP] : key[OK_STEP] + key[OK_N_STEP]].tolist():
                    vals[ref] = ts[d]
    return vals


# --- the kernel: stage 1, the fit check --------------------------------------------------------


@numba.njit(cache=True, inline="always")
def _tile_steps(okey, step, vals, q, rows):  # type: ignore[no-untyped-def]
    """An op's tile steps of key row ``q`` replace its key's row (``dict(ts)``)."""
    k = okey[q, OK_KEY]
    rows[k, :] = 0
    for x in range(okey[q, OK_STEP], okey[q, OK_STEP] + okey[q, OK_N_STEP]):
        rows[k, step[x, TS_DIM]] = vals[step[x, TS_REF]]


@numba.njit(cache=True, inline="always")
def _after(kind, x, n_src, n_dst):  # type: ignore[no-untyped-def]
    """:func:`.nests.extent_after` of the collective's dim: gathered or scattered."""
    if kind == CT_GATHER or kind == CT_ALLGATHER:
        return x * n_src
    if kind == CT_SCATTER:
        return int(x / n_dst)
    return x


@numba.njit(cache=True, inline="always")
def _grow(slots, fac, vals, s, sizes):  # type: ignore[no-untyped-def]
    """:func:`.fit._grow` of slot ``s``: its key's extents times its factors."""
    k = slots[s, ST_GKEY]
    for e in range(slots[s, ST_FAC], slots[s, ST_FAC] + slots[s, ST_N_FAC]):
        v = vals[fac[e, FC_REF]]
        if v != 1:
            sizes[k, fac[e, FC_DIM]] *= v


@numba.njit(cache=True, inline="always")
def _tile_bytes(slots, pd, s, sizes):  # type: ignore[no-untyped-def]
    """The bytes of slot ``s``'s tile (:func:`.fit._requested_bytes`, float as the reference)."""
    k = slots[s, ST_GKEY]
    elems = 1
    for j in range(slots[s, ST_PROJ], slots[s, ST_PROJ] + slots[s, ST_N_PROJ]):
        elems *= sizes[k, pd[j, PD_DIM]]
    return int(elems * slots[s, SL_SCALE] / 8.0)


@numba.njit(cache=True, inline="always")
def _occupy(nd, slots, pd, grp, i, sizes, req, occupied, largest, here):  # type: ignore[no-untyped-def]
    """:func:`.fit._occupy` of temporal node ``i``'s requests (per group the largest)."""
    g0, g1 = nd[i, ND_GROUP], nd[i, ND_GROUP] + nd[i, ND_N_GROUPS]
    for g in range(g0, g1):
        largest[g] = -1
        here[grp[g, GR_LEVEL]] = 0
    for s in range(nd[i, ND_SLOT], nd[i, ND_SLOT] + nd[i, ND_N_SLOTS]):
        g = slots[s, ST_GROUP]
        largest[g] = max(largest[g], _tile_bytes(slots, pd, s, sizes))
    for g in range(g0, g1):
        here[grp[g, GR_LEVEL]] += largest[g]
    binding = nd[i, ND_FIT_BIND]
    for g in range(g0, g1):
        if not grp[g, GR_FIRST]:
            continue
        lv = grp[g, GR_LEVEL]
        if occupied[lv] and binding != B_NONE:
            if binding == B_SEQUENTIAL:
                req[lv] = max(req[lv], here[lv])
            elif binding == B_PIPELINE:
                req[lv] += here[lv]
        else:
            req[lv] += here[lv]
            occupied[lv] = True


@numba.njit(cache=True, inline="always")
def _fit_collective(cols, c, sizes):  # type: ignore[no-untyped-def]
    """A collective's tile: its tensor's first tag's, gathered or scattered."""
    row = sizes[cols[c, CO_FIT_SRC]].copy()
    k, d = cols[c, CO_KEY], cols[c, CO_DIM]
    sizes[k, :] = row
    sizes[k, d] = _after(cols[c, CO_TYPE], row[d], cols[c, CO_N_SRC], cols[c, CO_N_DST])


@numba.njit(cache=True)
def fit_stage(tabs, seqs, meta, vals, req):  # type: ignore[no-untyped-def]
    """Stage 1 (:func:`.fit.fit_check`): fills ``req`` per level; whether the tiling fits."""
    nd, slots, fac, pd, _od, grp, ops, _prim, okey, step, cols, _cext = tabs
    post, _pre, cap = seqs
    n_levels = cap.shape[0]
    sizes = np.zeros((meta[M_KEYS], meta[M_DIMS]), dtype=np.int64)
    occupied = np.zeros(n_levels, dtype=np.bool_)
    largest = np.empty(grp.shape[0], dtype=np.int64)
    here = np.zeros(n_levels, dtype=np.int64)
    req[:] = 0
    for i in post:
        kind = nd[i, ND_KIND]
        if kind == NK_TILE:
            for s in range(nd[i, ND_SLOT], nd[i, ND_SLOT] + nd[i, ND_N_SLOTS]):
                _grow(slots, fac, vals, s, sizes)
            if nd[i, ND_FIT_BIND] >= 0:
                _occupy(nd, slots, pd, grp, i, sizes, req, occupied, largest, here)
        elif kind == NK_OP:
            o = nd[i, ND_ROW]
            for q in range(ops[o, OR_KEYS], ops[o, OR_KEYS] + ops[o, OR_N_KEYS]):
                _tile_steps(okey, step, vals, q, sizes)
        elif kind == NK_COLLECTIVE:
            _fit_collective(cols, nd[i, ND_ROW], sizes)
    fits = True
    for lv in range(n_levels):
        if cap[lv] >= 0 and req[lv] > cap[lv]:
            fits = False
    return fits


# --- the kernel: stage 2, the loop nests -------------------------------------------------------


@numba.njit(cache=True, inline="always")
def _step_of(okey, step, vals, q, d):  # type: ignore[no-untyped-def]
    """``ts.get(d, 0)``: the tile step of dim ``d`` of key row ``q``."""
    for x in range(okey[q, OK_STEP] + okey[q, OK_N_STEP] - 1, okey[q, OK_STEP] - 1, -1):
        if step[x, TS_DIM] == d:
            return vals[step[x, TS_REF]]
    return 0


@numba.njit(cache=True, inline="always")
def _nest_op(ops, prim, okey, step, vals, o, stride, steps):  # type: ignore[no-untyped-def]
    """:meth:`.nests._NestWalk.op`: strides from the tile steps; a GEMM's primitives per tile."""
    for q in range(ops[o, OR_KEYS], ops[o, OR_KEYS] + ops[o, OR_N_KEYS]):
        _tile_steps(okey, step, vals, q, stride)
        rel = 1
        if ops[o, OR_GEMM]:
            for p in range(ops[o, OR_PRIM], ops[o, OR_PRIM] + ops[o, OR_N_PRIM]):
                rel *= _step_of(okey, step, vals, q, prim[p, PM_DIM]) // vals[prim[p, PM_REF]]
        steps[okey[q, OK_KEY]] = rel


@numba.njit(cache=True, inline="always")
def _nest_tile(nd, slots, fac, vals, i, stride, steps, out, desc):  # type: ignore[no-untyped-def]
    """:meth:`.nests._NestWalk.tile`: each slot's loops, iterations and time steps."""
    spatial = nd[i, ND_SPATIAL]
    for s in range(nd[i, ND_SLOT], nd[i, ND_SLOT] + nd[i, ND_N_SLOTS]):
        k = slots[s, ST_GKEY]
        rel = steps[k]
        product = 1
        for e in range(slots[s, ST_FAC], slots[s, ST_FAC] + slots[s, ST_N_FAC]):
            d, v = fac[e, FC_DIM], vals[fac[e, FC_REF]]
            st = stride[k, d]
            desc[e, 0], desc[e, 1] = st * v, st
            if v != 1:
                stride[k, d] = st * v
                product *= v
        out[s, SL_REL_TS] = rel
        out[s, SL_ITERS] = 1 if spatial else product
        out[s, SL_SP_ITERS] = product if spatial else 1
        if not spatial and slots[s, ST_GROW]:
            steps[k] = rel * product


@numba.njit(cache=True, inline="always")
def _nest_collective(cols, cext, desc, c, stride, steps, col_ext):  # type: ignore[no-untyped-def]
    """:meth:`.nests._NestWalk.collective`: the extents in and out; the write-back's strides."""
    kind, dim = cols[c, CO_TYPE], cols[c, CO_DIM]
    x0, x1 = cols[c, CO_EXT], cols[c, CO_EXT] + cols[c, CO_N_EXT]
    for x in range(x0, x1):
        src = cext[x, CX_SRC]
        v = col_ext[src, 1] if cext[x, CX_FROM_COL] else desc[src, 0]
        col_ext[x, 0] = v
        if cext[x, CX_DIM] == dim:
            v = _after(kind, v, cols[c, CO_N_SRC], cols[c, CO_N_DST])
        col_ext[x, 1] = v
    if cols[c, CO_WB]:
        k = cols[c, CO_KEY]
        stride[k, :] = 0
        for x in range(x0, x1):
            if cext[x, CX_LINE] == cols[c, CO_N_LINES] - 1:
                stride[k, cext[x, CX_DIM]] = col_ext[x, 1]
        steps[k] = 1


@numba.njit(cache=True)
def nest_stage(tabs, post, meta, vals, out, desc, col_ext):  # type: ignore[no-untyped-def]
    """Stage 2 (:func:`.nests.build_nests`): ``out``'s nest columns, ``desc`` and ``col_ext``."""
    nd, slots, fac, _pd, _od, _grp, ops, prim, okey, step, cols, cext = tabs
    stride = np.zeros((meta[M_KEYS], meta[M_DIMS]), dtype=np.int64)
    steps = np.zeros(meta[M_KEYS], dtype=np.int64)
    for i in post:
        kind = nd[i, ND_KIND]
        if kind == NK_TILE:
            _nest_tile(nd, slots, fac, vals, i, stride, steps, out, desc)
        elif kind == NK_OP:
            _nest_op(ops, prim, okey, step, vals, nd[i, ND_ROW], stride, steps)
        elif kind == NK_COLLECTIVE:
            _nest_collective(cols, cext, desc, nd[i, ND_ROW], stride, steps, col_ext)


# --- the kernel: stage 3, the moves ------------------------------------------------------------


@numba.njit(cache=True, inline="always")
def _temporal_row(slots, pd, od, desc, s, out):  # type: ignore[no-untyped-def]
    """:func:`.nests.temporal_period`: slot ``s``'s tile and period, then its moves."""
    tile = 1
    for j in range(slots[s, ST_PROJ], slots[s, ST_PROJ] + slots[s, ST_N_PROJ]):
        tile *= desc[pd[j, PD_LAST], 1]
    period, inner = 0, 1
    for j in range(slots[s, ST_ORDER], slots[s, ST_ORDER] + slots[s, ST_N_ORDER]):
        e = od[j, OD_ENT]
        end, stride = desc[e, 0], desc[e, 1]
        n_steps = end // stride if stride else 1
        if n_steps > 1:
            if od[j, OD_IN_PROJ]:
                period = inner
                break
            inner *= n_steps
    out[s, SL_N], out[s, SL_PERIOD] = out[s, SL_ITERS], period
    out[s, SL_MOVED_TILE], out[s, SL_MOVED_UNIQUE], out[s, SL_MOVED_COUNT] = tile, 1, 1
    out[s, SL_KEPT_TILE], out[s, SL_KEPT_UNIQUE], out[s, SL_KEPT_COUNT] = tile, 0, 1


@numba.njit(cache=True, inline="always")
def _spatial_row(slots, pd, desc, s, out):  # type: ignore[no-untyped-def]
    """:func:`.nests._spatial_moves` of slot ``s``: ``(error code, index)``."""
    if slots[s, ST_ITERS_FROM] >= 0:
        out[s, SL_ITERS] = out[slots[s, ST_ITERS_FROM], SL_ITERS]
    err, at = slots[s, ST_ERR], slots[s, ST_ERR_AT]
    unique = tile = 1
    for jj in range(slots[s, ST_N_PROJ]):
        if err >= 0 and jj == at:
            return ERR_RAISE, err
        j = slots[s, ST_PROJ] + jj
        stride = desc[pd[j, PD_FIRST], 1]
        if stride == 0:
            return ERR_ZERO_DIV, s
        unique *= -(-desc[pd[j, PD_LAST], 0] // stride)
        tile *= stride
    if err >= 0:
        return ERR_RAISE, err
    p, sp = slots[s, ST_PIDX], out[s, SL_SP_ITERS]
    out[s, SL_N], out[s, SL_PERIOD] = out[p, SL_ITERS], out[p, SL_PERIOD]
    out[s, SL_MOVED_TILE], out[s, SL_MOVED_UNIQUE], out[s, SL_MOVED_COUNT] = tile, unique, sp
    out[s, SL_KEPT_TILE], out[s, SL_KEPT_UNIQUE], out[s, SL_KEPT_COUNT] = tile, 0, sp
    return ERR_NONE, 0


@numba.njit(cache=True)
def move_stage(nd, slots, pd, od, pre, desc, out):  # type: ignore[no-untyped-def]
    """Stage 3 (:func:`.nests.build_movements`): ``out``'s move columns; ``(error, index)``."""
    for i in pre:
        if nd[i, ND_ERR] >= 0:
            return ERR_RAISE, nd[i, ND_ERR]
        for s in range(nd[i, ND_SLOT], nd[i, ND_SLOT] + nd[i, ND_N_SLOTS]):
            if nd[i, ND_SPATIAL]:
                err, index = _spatial_row(slots, pd, desc, s, out)
                if err:
                    return err, index
            elif slots[s, ST_ERR] >= 0:
                return ERR_RAISE, slots[s, ST_ERR]
            else:
                _temporal_row(slots, pd, od, desc, s, out)
    return ERR_NONE, 0


# --- the kernel: stages 1-3 --------------------------------------------------------------------


@numba.njit(cache=True)
def tree_kernel(tabs, seqs, meta, vals):  # type: ignore[no-untyped-def]
    """Stages 1-3 of one tiling (module docstring): ``(head, req, slots, desc, col_ext)``.

    ``tabs``: the tables (:data:`TABLES` order), ``seqs``: ``(post, pre, cap)``, ``meta``:
    ``M_*``. ``head[HD_ERROR]`` non-zero: the reference raises there (:func:`raise_error`); the
    columns of the stages not reached are undefined.
    """
    nd, slots, fac, pd, od, _grp, _ops, _prim, _okey, _step, _cols, cext = tabs
    post, pre, cap = seqs
    head = np.zeros(HD_SIZE, dtype=np.int64)
    req = np.zeros(cap.shape[0], dtype=np.int64)
    out = slots.copy()
    desc = np.zeros((fac.shape[0], 2), dtype=np.int64)
    col_ext = np.zeros((cext.shape[0], 2), dtype=np.int64)
    if meta[M_ERR1] >= 0:
        head[HD_ERROR], head[HD_INDEX] = ERR_RAISE, meta[M_ERR1]
    elif not fit_stage(tabs, seqs, meta, vals, req):
        head[HD_ERROR] = ERR_FIT
    elif meta[M_ERR2] >= 0:
        head[HD_ERROR], head[HD_INDEX] = ERR_RAISE, meta[M_ERR2]
    else:
        nest_stage(tabs, post, meta, vals, out, desc, col_ext)
        head[HD_ERROR], head[HD_INDEX] = move_stage(nd, slots, pd, od, pre, desc, out)
    return head, req, out, desc, col_ext


@numba.njit(cache=True)
def tree_batch(tabs, seqs, meta, vals):  # type: ignore[no-untyped-def]
    """:func:`tree_kernel` of every row of ``vals`` (one tiling a row), stacked."""
    _nd, slots, fac, _pd, _od, _grp, _ops, _prim, _okey, _step, _cols, cext = tabs
    cap = seqs[2]
    n = vals.shape[0]
    heads = np.zeros((n, HD_SIZE), dtype=np.int64)
    reqs = np.zeros((n, cap.shape[0]), dtype=np.int64)
    outs = np.zeros((n, slots.shape[0], slots.shape[1]), dtype=np.int64)
    descs = np.zeros((n, fac.shape[0], 2), dtype=np.int64)
    exts = np.zeros((n, cext.shape[0], 2), dtype=np.int64)
    for r in range(n):
        h, q, o, d, x = tree_kernel(tabs, seqs, meta, vals[r])
        heads[r], reqs[r], outs[r], descs[r], exts[r] = h, q, o, d, x
    return heads, reqs, outs, descs, exts


# --- the wrapper (Python) ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TreeArrays:
    """The kernel's result for one tiling (:func:`tree_kernel`; columns: module docstring)."""

    head: Ints
    req: Ints
    slots: Ints
    desc: Ints
    col_ext: Ints


def kernel_args(flat: FlatTree) -> tuple[Any, ...]:
    """The kernel's arguments before the values: ``tabs``, ``seqs``, ``meta``."""
    tabs = tuple(getattr(flat, name) for name in TABLES)
    meta = np.array([len(flat.keys), flat.n_dims, flat.err1, flat.err2], dtype=np.int64)
    return tabs, (flat.post, flat.pre, flat.cap), meta


def evaluate(flat: FlatTree, vals: Ints) -> TreeArrays:
    """Stages 1-3 of the tiling of values ``vals``; an error is left in ``head``."""
    tabs, seqs, meta = kernel_args(flat)
    return TreeArrays(*tree_kernel(tabs, seqs, meta, vals))


def evaluate_batch(flat: FlatTree, vals: Ints) -> TreeArrays:
    """Stages 1-3 of each row of ``vals`` (``[tiling, value]``): the arrays, stacked."""
    tabs, seqs, meta = kernel_args(flat)
    return TreeArrays(*tree_batch(tabs, seqs, meta, vals))


def run_tree(flat: FlatTree, vals: Ints) -> TreeArrays:
    """Stages 1-3 of the tiling of values ``vals``; the reference's exceptions where it raises.

    Raises:
        FitError: the tiling overflows a level.
        TreeModelError: a tree COMET cannot evaluate (as the reference words it).
        ZeroDivisionError: a spatial tile over a zero stride (as the reference).
    """
    out = evaluate(flat, vals)
    if out.head[HD_ERROR]:
        raise_error(flat, out)
    return out


def fit_overflows(flat: FlatTree, req: Ints) -> list[tuple[str, int, int]]:
    """The overflowing levels as :class:`~.records.FitError` lists them (by name)."""
    names, cap = flat.arch.names, flat.cap
    return [(names[g], int(cap[g]), int(req[g])) for g in flat.fit_order
            if cap[g] >= 0 and req[g] > cap[g]]  # fmt: skip


def raise_error(flat: FlatTree, out: TreeArrays) -> None:
    """Raise the reference's exception for the kernel's error ``out.head[HD_ERROR]``."""
    err, index = int(out.head[HD_ERROR]), int(out.head[HD_INDEX])
    if err == ERR_FIT:
        raise FitError(flat.mapping_file, fit_overflows(flat, out.req))
    if err == ERR_ZERO_DIV:
        raise ZeroDivisionError("integer division or modulo by zero")
    if err == ERR_RAISE:
        recorded = flat.errors[index]
        try:
            fresh = type(recorded)(*recorded.args)
        except TypeError:  # an exception whose arguments are not its constructor's
            fresh = recorded
        raise fresh
    raise TreeModelError(f"compiled tree: error {err}")


def to_nests(flat: FlatTree, out: TreeArrays) -> Nests:
    """The loop nests (:class:`~.records.Nests`) as stage 4 reads them (after stage 3)."""
    nests = Nests()
    nd, slots, fac = flat.nd.tolist(), out.slots.tolist(), flat.fac.tolist()
    desc, ext, cext = out.desc.tolist(), out.col_ext.tolist(), flat.cext.tolist()
    for i in flat.post.tolist():
        row, node = nd[i], flat.nodes[i]
        if row[ND_KIND] == NK_TILE:
            nest = Nest([], [], [], [], [], [])
            for s in range(row[ND_SLOT], row[ND_SLOT] + row[ND_N_SLOTS]):
                sl = slots[s]
                lines: list[dict[int, tuple[int, int]]] = [{} for _ in range(sl[ST_N_LINES])]
                for e in range(sl[ST_FAC], sl[ST_FAC] + sl[ST_N_FAC]):
                    lines[fac[e][FC_LINE]][fac[e][FC_DIM]] = (desc[e][0], desc[e][1])
                nest.desc.append(lines)
                nest.iters.append(sl[SL_ITERS])
                nest.sp_iters.append(sl[SL_SP_ITERS])
                nest.rel_ts.append(sl[SL_REL_TS])
                nest.rw.append(bool(sl[SL_RW]))
                nest.dependent.append(bool(sl[SL_DEPENDENT]))
            nests.tiles[node.id] = nest
        elif row[ND_KIND] == NK_COLLECTIVE:
            co = flat.cols[row[ND_ROW]]
            ins: list[dict[int, int]] = [{} for _ in range(int(co[CO_N_LINES]))]
            outs: list[dict[int, int]] = [{} for _ in range(int(co[CO_N_LINES]))]
            for x in range(co[CO_EXT], co[CO_EXT] + co[CO_N_EXT]):
                line, d = cext[x][CX_LINE], cext[x][CX_DIM]
                ins[line][d], outs[line][d] = ext[x]
            nests.col_in[node.id], nests.col_out[node.id] = ins, outs
    return nests


def to_moves(flat: FlatTree, out: TreeArrays) -> Moves:
    """The moves (:data:`~.records.Moves`) of every tile node stage 3 visits."""
    moves: Moves = {}
    nd, slots = flat.nd.tolist(), out.slots.tolist()
    for i in flat.pre.tolist():
        rows = []
        for s in range(nd[i][ND_SLOT], nd[i][ND_SLOT] + nd[i][ND_N_SLOTS]):
            sl = slots[s]
            moved = Move(sl[SL_MOVED_TILE], sl[SL_MOVED_UNIQUE], sl[SL_MOVED_COUNT])
            kept = Move(sl[SL_KEPT_TILE], sl[SL_KEPT_UNIQUE], sl[SL_KEPT_COUNT])
            rows.append(MoveRow(sl[SL_N], sl[SL_PERIOD], moved, kept))
        moves[flat.nodes[i].id] = rows
    return moves


def op_vector(flat: FlatTree, o: int, vals: Ints) -> Ints:
    """Op row ``o`` as :mod:`.compiled_leaf`'s ``op`` vector for the values ``vals``."""
    op = flat.ops[o]
    prim = vals[flat.prim[op[OR_PRIM] : op[OR_PRIM] + op[OR_N_PRIM], PM_REF]]
    red = vals[flat.red[op[OR_RED] : op[OR_RED] + op[OR_N_RED], RD_REF]]
    head = [op[OR_TYPE], op[OR_UNIT], op[OR_N_PRIM], op[OR_N_RED]]
    return np.concatenate((np.array(head, dtype=np.int64), prim, red))


def flat_leaf(flat: FlatTree, out: TreeArrays, vals: Ints, i: int) -> FlatLeaf:
    """Leaf tile node ``i`` (``ND_LEAF``) as :mod:`.compiled_leaf` flattens it."""
    row = flat.nd[i]
    s0, n = int(row[ND_SLOT]), int(row[ND_N_SLOTS])
    slots = np.ascontiguousarray(out.slots[s0 : s0 + n, :SL_COLS])
    op = op_vector(flat, int(flat.nd[flat.kids[row[ND_KIDS]], ND_ROW]), vals)
    return FlatLeaf(flat.nodes[i], slots, op, flat.node_tags[i], flat.node_keys[i])
