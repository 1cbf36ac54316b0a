r"""One compiled evaluator of a template's tilings: stages 1-6, no per-tiling Python objects.

The compiled twin's pieces (:mod:`.compiled_tree`: stages 1-3, :mod:`.compiled_upper`: stage 4,
:mod:`.compiled_energy`: stages 5 and 6) each flatten their inputs from the reference's
objects; :class:`CompiledTemplate` instead builds, once per template, dims and
:class:`~fusekit.accel.compat.Compat`, the index maps that turn one piece's output arrays into
the next one's inputs, so a tiling is a vector of values (:func:`.compiled_tree.template_values`
of its constants) and :func:`score_batch` (one ``@njit(cache=True)`` loop over a batch) gives
per tiling its status, ``total_cycles`` and ``total_energy_pj``, bit-identical to
:func:`.stages.analyse` with ``detail=False``.

The maps (rows: the ``ND_*`` nodes of :mod:`.compiled_tree` are in pre-order; the rows of
:mod:`.compiled_upper` in post-order of the tile and collective nodes; those of
:mod:`.compiled_energy` in pre-order of all nodes):

* stage 4's ``slots[s] = tree.slots[up_slot[s], :SL_COLS]`` (the tile nodes in post-order, each
  node's tensors in order); its ``ops`` are ``ops_base`` with ``ops[ops_pos[j]] =
  vals[ops_ref[j]]`` (a leaf's op vector: type, unit, counts, primitives, reduction factors);
  a collective ``c``'s sizes, read and written per source, are

  .. math:: r_c = \prod_{x \in X_c} ext_{in}[x], \qquad w_c = \prod_{x \in X_c} ext_{out}[x]

  over ``X_c``, the ``cext`` rows of its last line and its input tensor's projected dims
  (``col_x[col_x0[c] : col_x0[c + 1]]``);
* stages 5 and 6: ``nodes`` with ``ND_CYCLES`` from stage 4's ``cyc[e_up[r]]``; ``slots`` the
  tree's ``slots[:, :SL_COLS]`` (already pre-order) with ``SL_TAG`` the tree's tag ids
  (``e_slot_tag``); ``acc[j] = acc4[e_acc[j]]`` with ``AC_TAG`` renumbered
  (``tagmap[node row, tag]``) and a compute access's fields as the reference's
  :class:`~.records.Access` defaults (tile 0, precision 0, ``rw``, not at target, one
  projection, no NoC energy), another's without MAC energy; ``col_pj[r] = col_pj4[e_up[r]]``
  for a collective; per group ``k`` the level costs ``lvl[k] = glv[e_grp[k]]`` (present
  levels, ``LO_PRESENT`` set on both ports; a collective's group only its level, a temporal
  node's bound collective both ports its read port's).

Every map depends on the tree's shape alone; they are built from one tiling the reference
evaluates through stage 4 (the prototype), and checked there: the gathered arrays must equal
those the pieces flatten from the reference's objects, or the template is not compiled. A
tiling the compiled path cannot give (an error in any stage but the fit check, a numba
exception such as a zero bandwidth's division, a constant that changes the tree's shape) has
status :data:`FALLBACK`: the caller evaluates it with the reference, which raises the
reference's exception.

How the kernels are written for speed (the numbers do not depend on it): numba counts the
references of every array a function binds (its arguments, and views such as a row ``a[i]``)
with two atomic operations each, unless its pruning pass proves the counts balanced, which it
often cannot in a function with loops, early exits, allocations or calls. So the helpers called
per entry or per iteration are ``inline="always"`` (their counts are then mostly pruned), the
per-node code indexes tables by row and column instead of taking row views, and rows are
copied element by element, not by slices.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np

from fusekit.accel.comet.files import MappingTemplate
from fusekit.accel.compat import Compat
from fusekit.accel.tree import TreeMapping
from fusekit.accel.tree_model import compiled_energy as ce
from fusekit.accel.tree_model import compiled_tree as ct
from fusekit.accel.tree_model import compiled_upper as cu
from fusekit.accel.tree_model.compiled_leaf import (
    AC_AT_TARGET,
    AC_COLS,
    AC_COMPUTE,
    AC_PRECISION,
    AC_PROJ,
    AC_RW,
    AC_TAG,
    AC_TILE,
    AP_COLS,
    AP_MAC,
    AP_NOC,
    LO_COLS,
    LO_PRESENT,
    SL_COLS,
    SL_TAG,
    Floats,
    Ints,
)
from fusekit.accel.tree_model.fit import fit_check
from fusekit.accel.tree_model.nests import build_movements, build_nests
from fusekit.accel.tree_model.records import TreeModelError
from fusekit.accel.tree_model.steady import SteadyState

#: :func:`score_batch` statuses: scored, rejected by the fit check, left to the reference.
OK, NO_FIT, FALLBACK = 0, 1, 2


# --- the kernel ----------------------------------------------------------------------------------


@numba.njit(cache=True)
def _stage4_inputs(up, vals, slots3, col_ext):  # type: ignore[no-untyped-def]
    """Stage 4's ``slots``, ``ops`` and ``col`` gathered from stages 1-3's arrays."""
    up_slot, ops_base, ops_pos, ops_ref, col_base, col_skip, col_x0, col_x = up
    slots = np.empty((up_slot.shape[0], SL_COLS), dtype=np.int64)
    for s in range(up_slot.shape[0]):
        for c in range(SL_COLS):
            slots[s, c] = slots3[up_slot[s], c]
    ops = ops_base.copy()
    for j in range(ops_pos.shape[0]):
        ops[ops_pos[j]] = vals[ops_ref[j]]
    col = col_base.copy()
    for c in range(col.shape[0]):
        if col_skip[c]:
            continue
        r = 1
        w = 1
        for k in range(col_x0[c], col_x0[c + 1]):
            r *= col_ext[col_x[k], 0]
            w *= col_ext[col_x[k], 1]
        col[c, cu.CI_RSIZE] = r
        col[c, cu.CI_WSIZE] = w
    return slots, ops, col


@numba.njit(cache=True)
def _energy_inputs(en, slots3, cyc, glv, acc4, acc4_pj, col4_pj):  # type: ignore[no-untyped-def]
    """Stages 5-6's ``nodes``, ``slots``, ``acc``, ``acc_pj``, ``col_pj``, ``lvl``."""
    (nodes_base, e_up, e_slot_tag, e_acc, e_acc_node, e_acc_compute, tagmap, e_col, e_grp,
     e_grp_lvl, e_grp_tile) = en  # fmt: skip
    nodes = nodes_base.copy()
    for r in range(nodes.shape[0]):
        if e_up[r] >= 0:
            nodes[r, ce.ND_CYCLES] = cyc[e_up[r]]
    slots = np.empty((e_slot_tag.shape[0], SL_COLS), dtype=np.int64)
    for s in range(e_slot_tag.shape[0]):
        for c in range(SL_COLS):
            slots[s, c] = slots3[s, c]
        slots[s, SL_TAG] = e_slot_tag[s]
    n_acc = e_acc.shape[0]
    acc = np.empty((n_acc, AC_COLS), dtype=np.int64)
    acc_pj = np.zeros((n_acc, AP_COLS), dtype=np.float64)
    for j in range(n_acc):
        src = e_acc[j]
        for c in range(AC_COLS):
            acc[j, c] = acc4[src, c]
        acc[j, AC_TAG] = tagmap[e_acc_node[j], acc4[src, AC_TAG]]
        if e_acc_compute[j]:
            acc[j, AC_TILE] = 0
            acc[j, AC_PRECISION] = 0
            acc[j, AC_RW] = 1
            acc[j, AC_AT_TARGET] = 0
            acc[j, AC_COMPUTE] = 1
            acc[j, AC_PROJ] = 1
            acc_pj[j, AP_MAC] = acc4_pj[src, AP_MAC]
        else:
            acc[j, AC_COMPUTE] = 0
            acc_pj[j, AP_NOC] = acc4_pj[src, AP_NOC]
    col_pj = np.zeros((nodes.shape[0], 2), dtype=np.float64)
    for r in range(nodes.shape[0]):
        if e_col[r] >= 0:
            col_pj[r, 0] = col4_pj[e_col[r], 0]
            col_pj[r, 1] = col4_pj[e_col[r], 1]
    n_lv = glv.shape[1]
    lvl = np.zeros((e_grp.shape[0], n_lv, 2, LO_COLS), dtype=np.int64)
    for k in range(e_grp.shape[0]):
        g = e_grp[k]
        for i in range(n_lv):
            if e_grp_lvl[k] >= 0:
                if i != e_grp_lvl[k]:
                    continue
            elif not glv[g, i, 0, LO_PRESENT]:
                continue
            for p in range(2):
                q = 0 if e_grp_tile[k] else p
                for c in range(LO_COLS):
                    lvl[k, i, p, c] = glv[g, i, q, c]
                lvl[k, i, p, LO_PRESENT] = 1
    return nodes, slots, acc, acc_pj, col_pj, lvl


@numba.njit(cache=True)
def score_one(tree, arch, shape, up, en, energy, vals, memo):  # type: ignore[no-untyped-def]
    """Stages 1-6 of one tiling's values: ``(status, total_cycles, total_energy_pj)``.

    ``tree``: :mod:`.compiled_tree`'s ``(tabs, seqs, meta)``; ``arch``: the
    :class:`.compiled_leaf.FlatArch` arrays stage 4 reads; ``shape``: stage 4's tree shape;
    ``up``, ``en``: the maps (module docstring); ``energy``: the energy arch and statics;
    ``memo``: stage 4's leaf memo (:func:`.compiled_upper.new_leaf_memo`) for ``arch``.
    """
    tabs, seqs, meta = tree
    head, _req, slots3, _desc, col_ext = ct.tree_kernel(tabs, seqs, meta, vals)
    if head[ct.HD_ERROR]:
        return (NO_FIT if head[ct.HD_ERROR] == ct.ERR_FIT else FALLBACK), 0, 0.0
    slots, ops, col = _stage4_inputs(up, vals, slots3, col_ext)
    lv, simd, net_of, net, net_pj, generalise, port_overwrite = arch
    nodes, sgkey, refs, uses, ents, strips, colf, n_keys, n_acc = shape
    h4, cyc, glv, acc4, acc4_pj, _kt, col4_pj = cu.tree_kernel(
        lv, simd, net_of, net, net_pj, generalise, port_overwrite, True, nodes, slots, sgkey,
        ops, refs, uses, ents, strips, col, colf, n_keys, n_acc, memo,
    )  # fmt: skip
    if h4[cu.TH_ERROR]:
        return FALLBACK, 0, 0.0
    e_nodes, e_slots, acc, acc_pj, col_pj, lvl = _energy_inputs(
        en, slots3, cyc, glv, acc4, acc4_pj, col4_pj
    )
    (unit_class, price, simd_pj, groups, erow, row_order, n_tags, n_tids, n_units, calc_noc,
     tag_instances, unit_sum_total, unscaled_os) = energy  # fmt: skip
    out = ce.energy_kernel(lv, unit_class, price, simd_pj, e_nodes, e_slots, acc, acc_pj,
                           col_pj, groups, lvl, erow, row_order, n_tags, n_tids, n_units,
                           calc_noc, tag_instances, unit_sum_total, unscaled_os)  # fmt: skip
    eh = out[0]
    if eh[ce.HD_ERROR]:
        return FALLBACK, 0, 0.0
    return OK, eh[ce.HD_TOTAL_CYCLES], out[1]


@numba.njit(cache=True)
def score_batch(tree, arch, shape, up, en, energy, memo, vals):  # type: ignore[no-untyped-def]
    """:func:`score_one` of each row of ``vals``: statuses, total cycles, total energies.

    ``memo``: stage 4's leaf memo (:func:`.compiled_upper.new_leaf_memo`, one per template,
    kept across batches): a leaf tile whose per-tiling inputs (its slot rows and op vector; the
    arch is the template's) equal an earlier tiling's reuses its stage 4 results, compared
    exactly, so the numbers are those without it.
    """
    n = vals.shape[0]
    status = np.zeros(n, dtype=np.int64)
    cycles = np.zeros(n, dtype=np.int64)
    energy_pj = np.zeros(n, dtype=np.float64)
    for i in range(n):
        status[i], cycles[i], energy_pj[i] = score_one(
            tree, arch, shape, up, en, energy, vals[i], memo
        )
    return status, cycles, energy_pj


@numba.njit(cache=True)
def gather_one(tree, arch, shape, up, en, vals):  # type: ignore[no-untyped-def]
    """The gathered inputs of stages 4 and 5-6 for one tiling (the build's check)."""
    tabs, seqs, meta = tree
    _head, _req, slots3, _desc, col_ext = ct.tree_kernel(tabs, seqs, meta, vals)
    slots, ops, col = _stage4_inputs(up, vals, slots3, col_ext)
    lv, simd, net_of, net, net_pj, generalise, port_overwrite = arch
    nodes, sgkey, refs, uses, ents, strips, colf, n_keys, n_acc = shape
    _h4, cyc, glv, acc4, acc4_pj, _kt, col4_pj = cu.tree_kernel(
        lv, simd, net_of, net, net_pj, generalise, port_overwrite, True, nodes, slots, sgkey,
        ops, refs, uses, ents, strips, col, colf, n_keys, n_acc, cu.new_leaf_memo(),
    )  # fmt: skip
    e = _energy_inputs(en, slots3, cyc, glv, acc4, acc4_pj, col4_pj)
    return slots, ops, col, e[0], e[1], e[2], e[3], e[4], e[5]


# --- the template (Python, once) -----------------------------------------------------------------


def _i64(x: Sequence[Any], cols: int | None = None) -> Ints:
    a = np.array(x, dtype=np.int64)
    return a.reshape(-1, cols) if cols is not None else a.reshape(-1)


@dataclass(frozen=True, slots=True)
class CompiledTemplate:
    """A template's flattened tree and maps (module docstring); :meth:`score` its tilings."""

    tree_flat: ct.FlatTree
    args: tuple[Any, ...]  # score_batch's, up to its leaf memo
    memo: Any  # stage 4's leaf memo (:func:`.compiled_upper.new_leaf_memo`), for all batches
    plans: dict[frozenset[str], Any] = field(default_factory=dict)  # plain_rows', all batches

    @classmethod
    def build(
        cls,
        inp: TreeMapping,
        template: MappingTemplate,
        compat: Compat,
        calc_noc: bool = True,
    ) -> CompiledTemplate | None:
        """The compiled template from a prototype tiling ``inp`` of ``template``.

        ``inp`` must pass the reference's stages 1-4; ``None`` where it does not, or where the
        maps do not reproduce the pieces' own flattening of it (the template is then left to
        the reference).
        """
        try:
            fit_check(inp, compat)
            nests = build_nests(inp)
            moves = build_movements(inp, nests)
            ss = SteadyState(inp, nests, moves, compat, None, True)
            ss.visit(inp.mapping)
        except Exception:  # the prototype must evaluate; another tiling may
            return None
        flat = ct.flatten_template(inp, compat, template)
        fa = flat.arch
        shape = cu.tree_shape(inp, fa, compat)
        fe = ce.flatten_energy_arch(inp.arch, compat, fa)
        want4 = cu.flatten_tree(shape, inp, nests, moves)
        want5 = ce.flatten_tree(ss, fe)
        if flat.errors or want4.errors or shape.errors:
            return None
        up = _upper_maps(flat, shape, inp)
        en = _energy_maps(flat, shape, want5, ss)
        if up is None or en is None:
            return None
        tabs, seqs, meta = ct.kernel_args(flat)
        tree = (tabs, seqs, meta)
        arch = (fa.lv, fa.simd, fa.net_of, fa.net, fa.net_pj, fa.generalise, fa.port_overwrite)
        shp = (shape.nodes, shape.sgkey, shape.refs, shape.uses, shape.ents, shape.strips,
               shape.colf, len(shape.keys), shape.n_acc)  # fmt: skip
        energy = (fe.unit_class, fe.price, fe.simd_pj, want5.groups, want5.erow,
                  want5.row_order, max(len(want5.tags), 1), max(want5.n_tids, 1),
                  len(want5.units), calc_noc, fe.tag_instances, fe.unit_sum_total,
                  fe.unscaled_os)  # fmt: skip
        vals = ct.template_values(flat, inp.const)
        got = gather_one(tree, arch, shp, up, en, vals)
        wants = (want4.slots, want4.ops, want4.col, want5.nodes, want5.slots, want5.acc,
                 want5.acc_pj, want5.col_pj, want5.lvl)  # fmt: skip
        for g, w in zip(got, wants, strict=True):
            if g.shape != w.shape or not np.array_equal(g, w):
                return None
        return cls(flat, (tree, arch, shp, up, en, energy), cu.new_leaf_memo())

    def values(self, const: dict[str, Any]) -> Ints | None:
        """A tiling's values from its constants; ``None`` where the reference must build it."""
        try:
            return ct.template_values(self.tree_flat, const)
        except Exception:  # a shape-changing or missing constant: the reference's path
            return None

    def values_many(self, consts: Sequence[dict[str, Any]]) -> tuple[Ints | None, list[int]]:
        """:meth:`values` of each of ``consts``: one row per tiling it gives, and their indices.

        Most take :func:`.compiled_tree.plain_rows`' fast path, the rest :meth:`values`; a
        tiling neither gives (``None``) is left out.
        """
        rows, kept = ct.plain_rows(self.tree_flat, consts, self.plans)
        fast = set(kept)
        for i, const in enumerate(consts):
            if i not in fast and (v := self.values(const)) is not None:
                rows.append(v.tolist())
                kept.append(i)
        return (np.array(rows, dtype=np.int64) if rows else None), kept

    def score(self, vals: Ints) -> tuple[Ints, Ints, Floats]:
        """Statuses (``OK``, ``NO_FIT``, ``FALLBACK``), total cycles and energies of ``vals``.

        ``vals``: one tiling per row. A numba exception (e.g. a division by a zero bandwidth)
        makes the batch rerun row by row, the raising rows ``FALLBACK``.
        """
        try:
            out: tuple[Ints, Ints, Floats] = score_batch(*self.args, self.memo, vals)  # type: ignore[call-arg]
            return out
        except Exception:
            n = vals.shape[0]
            status = np.full(n, FALLBACK, dtype=np.int64)
            cycles = np.zeros(n, dtype=np.int64)
            energy = np.zeros(n, dtype=np.float64)
            for i in range(n):
                try:
                    s, c, e = score_batch(*self.args, self.memo, vals[i : i + 1])  # type: ignore[call-arg]
                except Exception:
                    continue
                status[i], cycles[i], energy[i] = s[0], c[0], e[0]
            return status, cycles, energy


def _upper_maps(flat: ct.FlatTree, shape: cu.TreeShape, inp: TreeMapping) -> Any:
    """Stage 4's maps (module docstring); ``None`` where a collective reads no last line.

    ``(up_slot, ops_base, ops_pos, ops_ref, col_base, col_skip, col_x0, col_x)``.
    """
    pre = {int(n): i for i, n in enumerate(flat.nd[:, ct.ND_ID].tolist())}
    up_slot: list[int] = []
    ops_base: list[int] = []
    ops_pos: list[int] = []
    ops_ref: list[int] = []
    for node in shape.order:
        if node.kind != "tile":
            continue
        row = flat.nd[pre[node.id]]
        up_slot += range(int(row[ct.ND_SLOT]), int(row[ct.ND_SLOT] + row[ct.ND_N_SLOTS]))
        if node.is_leaf_tile:
            o = int(flat.nd[flat.kids[row[ct.ND_KIDS]], ct.ND_ROW])
            op = flat.ops[o]
            base = len(ops_base)
            ops_base += [int(op[ct.OR_TYPE]), int(op[ct.OR_UNIT]), int(op[ct.OR_N_PRIM]),
                         int(op[ct.OR_N_RED])]  # fmt: skip
            refs = [int(r) for r in flat.prim[op[ct.OR_PRIM] : op[ct.OR_PRIM] + op[ct.OR_N_PRIM],
                                              ct.PM_REF]]  # fmt: skip
            refs += [int(r) for r in flat.red[op[ct.OR_RED] : op[ct.OR_RED] + op[ct.OR_N_RED],
                                              ct.RD_REF]]  # fmt: skip
            ops_pos += range(base + 4, base + 4 + len(refs))
            ops_ref += refs
            ops_base += [0] * len(refs)
    prob = inp.problem
    col_skip: list[int] = []
    col_x0 = [0]
    col_x: list[int] = []
    for shaped in shape.col_nodes:
        r = shape.row[shaped.id]
        co = flat.cols[flat.nd[pre[shaped.id], ct.ND_ROW]]
        skip = r in shape.errors
        xs: list[int] = []
        if not skip:
            last = int(co[ct.CO_N_LINES]) - 1
            if last < 0:
                return None
            ext = {int(flat.cext[x, ct.CX_DIM]): x
                   for x in range(int(co[ct.CO_EXT]), int(co[ct.CO_EXT] + co[ct.CO_N_EXT]))
                   if flat.cext[x, ct.CX_LINE] == last}  # fmt: skip
            if any(d not in ext for d in range(len(prob.dims))):
                return None
            xs = [ext[d] for d in prob.projection("", shaped.in_tensor)]
        col_skip.append(int(skip))
        col_x += xs
        col_x0.append(len(col_x))
    return (_i64(up_slot), _i64(ops_base), _i64(ops_pos), _i64(ops_ref), shape.col.copy(),
            _i64(col_skip), _i64(col_x0), _i64(col_x))  # fmt: skip


def _energy_maps(flat: ct.FlatTree, shape: cu.TreeShape, want: ce.FlatTree, ss: SteadyState) -> Any:
    """Stages 5-6's maps (module docstring); ``None`` where the shapes do not line up."""
    tree = want.tree
    if [n.id for n in tree] != [int(i) for i in flat.nd[:, ct.ND_ID]]:
        return None
    tag_of = {t: i for i, t in enumerate(want.tags)}
    nodes_base = want.nodes.copy()
    nodes_base[:, ce.ND_CYCLES] = 0
    e_up = [shape.row.get(n.id, -1) for n in tree]
    e_col = [shape.row[n.id] if n.kind == "collective" else -1 for n in tree]
    width = max([1, *(len(t) for t in shape.node_tags)])
    tagmap = np.zeros((len(shape.order), width), dtype=np.int64)
    for x, tags in enumerate(shape.node_tags):
        for k, t in enumerate(tags):
            tagmap[x, k] = tag_of[t]
    e_acc: list[int] = []
    e_acc_node: list[int] = []
    e_acc_compute: list[int] = []
    for r, node in enumerate(tree):
        n = int(want.nodes[r, ce.ND_N_ACC])
        if not n:
            continue
        x = shape.row.get(node.id, -1)
        if x < 0 or int(shape.nodes[x, cu.N_NACC]) != n:
            return None
        a0 = int(shape.nodes[x, cu.N_ACC0])
        e_acc += range(a0, a0 + n)
        e_acc_node += [x] * n
        e_acc_compute += [int(a.compute) for a in ss.accesses[node.id]]
    group_of = {(shape.order[x].id, key): g for g, (x, key, _name) in enumerate(shape.groups)}
    e_grp: list[int] = []
    e_grp_lvl: list[int] = []
    e_grp_tile: list[int] = []
    for k in range(want.groups.shape[0]):
        r = int(want.groups[k, ce.GR_NODE])
        node = tree[r]
        keys = list(ss.level_cost.get(node.id, {}))
        nth = k - int(want.nodes[r, ce.ND_GROUP0])
        g = group_of.get((node.id, keys[nth]))
        if g is None:
            return None
        name = shape.groups[g][2]
        e_grp.append(g)
        e_grp_lvl.append(shape.flat.index[name] if name else -1)
        e_grp_tile.append(int(bool(name) and shape.order[shape.groups[g][0]].kind == "tile"))
    slot_tag = want.slots[:, SL_TAG].copy()
    if slot_tag.shape[0] != flat.slots.shape[0]:
        return None
    return (nodes_base, _i64(e_up), slot_tag, _i64(e_acc), _i64(e_acc_node),
            _i64(e_acc_compute), tagmap, _i64(e_col), _i64(e_grp), _i64(e_grp_lvl),
            _i64(e_grp_tile))  # fmt: skip


def compile_template(
    tilings: Sequence[Any],
    inputs: Callable[[Any], TreeMapping],
    template: Callable[[], MappingTemplate | None],
    compat: Compat,
    tries: int = 8,
) -> CompiledTemplate | None:
    """The first :meth:`CompiledTemplate.build` among ``tilings`` (at most ``tries`` of them).

    Args:
        tilings: candidate prototypes.
        inputs: a tiling's tree.
        template: the template the trees are built from (after ``inputs``).
        compat: the switches.
        tries: how many candidates to try.
    """
    for t in list(tilings)[:tries]:
        inp = inputs(t)
        tpl = template()
        if tpl is None:
            return None
        try:
            got = CompiledTemplate.build(inp, tpl, compat)
        except (ValueError, TreeModelError, KeyError, IndexError):
            got = None
        if got is not None:
            return got
    return None
