"""Stage 4, the steady state: cycles of every node and the accesses it makes, post-order.

Per tile node and tensor, the memory and network cycles of every iteration are set against the
child's compute window (stalls, ramp-up of the first read, ramp-down of the last write,
:mod:`.transfers`), merged per target level and port (:mod:`.merge`); a node's cycles are the
compute window plus ramps plus stalls; a temporal node with sequential children sums them;
a collective costs its own cycles (:mod:`.collectives`).

With a ``memo`` (the tilings of one template, same dims and compatibility), a leaf or a
spatial node whose inputs another tiling already gave is restored from it, and the transfers'
costs are kept in it (:class:`.transfers.Transfers`).
"""

from __future__ import annotations

import math
from dataclasses import fields, replace
from operator import attrgetter
from typing import Any, TypeVar

from fusekit.accel.compat import Compat
from fusekit.accel.noc import MeshShapeError
from fusekit.accel.tree import TreeMapping, TreeNode
from fusekit.accel.tree_model.collectives import collective_cost
from fusekit.accel.tree_model.compute import MAC_PJ, compute_cycles
from fusekit.accel.tree_model.fit import binding_of
from fusekit.accel.tree_model.merge import merge_levels, node_cycles
from fusekit.accel.tree_model.records import (
    Access,
    Children,
    Cost,
    LevelCosts,
    Moves,
    Nests,
    PortCosts,
    TreeModelError,
    f32,
)
from fusekit.accel.tree_model.transfers import Transfer, TransferKey, Transfers

#: A tile node's memory windows: each child (or group of bound children) and its cycles.
Windows = list[tuple[Children, int]]
#: A node's level costs, by the child (op or collective id) or children (their ids) they serve.
NodeLevels = dict[int | tuple[int, ...], LevelCosts]
#: Per (tensor id, op tag): a count (reuse factor, distinct tiles, ramp cycles).
PerTensor = dict[tuple[int, str], int]
#: A leaf's stage-4 results: accesses, level costs, cycles, ramp-downs, ramp-ups.
LeafResult = tuple[list[Access], NodeLevels, int, PerTensor | None, PerTensor | None]
#: A spatial node's window: its children, their cycles, the windows less ramps, port use.
Group = tuple[Children, int, list[int], dict[str, dict[int, int]]]
#: A spatial node's stage-4 results: access values, level costs, cycles, ramp-ups.
NodeResult = tuple[list[tuple[Any, ...]], NodeLevels, int | None, PerTensor | None]
#: A leaf is folded when it runs at least this many periods (it is evaluated at 2 and 3) and
#: at least ``FOLD_MIN_ITERATIONS``: below, walking every iteration costs less.
FOLD_MIN_PERIODS = 6
FOLD_MIN_ITERATIONS = 32
#: The key of the transfers cache in a ``memo`` (the leaves' keys start with a node id).
TRANSFERS_KEY = ("transfers",)
_R = TypeVar("_R", Access, Cost)
#: A record's field values, in its constructor's order.
_VALUES = {cls: attrgetter(*(f.name for f in fields(cls))) for cls in (Access, Cost)}


class FoldError(Exception):
    """Two evaluations of a leaf differ where an affine extension cannot follow (unfolded)."""


def _affine(a: Any, b: Any, k: int) -> Any:
    """``a`` at two periods and ``b`` at three, extended by ``k`` more periods."""
    if type(a) is int or type(a) is float:  # the common case first
        return a + k * (b - a)
    if isinstance(a, bool) or not isinstance(a, int | float):
        if a is b or a == b:
            return a
        if isinstance(a, list):
            return []  # per-iteration vectors are not kept for a folded leaf
        raise FoldError(f"{a!r} != {b!r}")
    return a + k * (b - a)


def _extend(a: _R, b: _R, k: int) -> _R:
    """A record whose every number is extended (:func:`_affine`)."""
    values = _VALUES[type(a)]
    return type(a)(*(_affine(x, y, k) for x, y in zip(values(a), values(b), strict=True)))


class SteadyState:
    """Stage 4 (see the module docstring): cycles of every node, and the accesses they make."""

    def __init__(
        self,
        inp: TreeMapping,
        nests: Nests,
        moves: Moves,
        compat: Compat,
        memo: dict[tuple[Any, ...], Any] | None = None,
        fold: bool = True,
    ) -> None:
        self.inp, self.arch, self.nests, self.moves = inp, inp.arch, nests, moves
        self.memo = memo
        self.fold = fold
        self.compat = compat
        shared: dict[TransferKey, Transfer] | None = None
        if memo is not None:
            shared = memo.setdefault(TRANSFERS_KEY, {})
        self.transfers = Transfers(inp.arch, nests, moves, not compat.mesh_table, shared)
        self.node_cost: dict[int, int] = {}
        self.level_cost: dict[int, NodeLevels] = {}
        self.reuse: dict[int, PerTensor] = {}
        self.actual: dict[int, PerTensor] = {}
        self.ramp_up: dict[int, PerTensor] = {}
        self.ramp_down: dict[int, PerTensor] = {}
        self.accesses: dict[int, list[Access]] = {}
        self.col_energy: dict[int, tuple[float, float]] = {}  # memory pJ, network pJ

    def rank(self, name: str) -> int:
        """COMET orders its per-level maps by level creation."""
        return self.arch.levels[name].rank

    # -- windows -------------------------------------------------------------------------------

    def _strip_ramps(self, parent: TreeNode, child: TreeNode, win: list[int]) -> None:
        """Reads hidden by the parent's reuse: their ramp-up is not paid on reused iterations."""
        for key, f in sorted(self.reuse.get(parent.id, {}).items()):
            if (f != 1 and key in self.reuse.get(child.id, {})
                    and self.actual.get(child.id, {}).get(key) == 1):  # fmt: skip
                up = self.ramp_up.get(child.id, {}).get(key, 0)
                _less_ramp(win, f, up)

    def window_vector(self, parent: TreeNode, children: Children, win: list[int]) -> None:
        """COMET's memory windows of a node's children, less reused reads' ramp-ups."""
        if isinstance(children, list):
            for c in children:
                self._strip_ramps(parent, c, win)
            return
        child = children
        if child.kind == "tile" and child.is_leaf_tile:
            self._strip_ramps(parent, child, win)
            return
        for c in child.children:
            for key, f in sorted(self.reuse.get(parent.id, {}).items()):
                if (f != 1 and key in self.reuse.get(c.id, {})
                        and self.actual.get(c.id, {}).get(key) == 1):  # fmt: skip
                    up = self.ramp_up.get(c.id, {}).get(key, 0)
                    _less_ramp(win, f, up)
                    self.window_vector(parent, list(c.children), win)

    def port_use(self, children: Children) -> dict[str, dict[int, int]]:
        """Cycles the children's transfers hold each port of a shared-port level.

        A read (port 0) holds the child's write port for its cycles and ramp-up, a write
        (port 1) its read port for its cycles and ramp-down.
        """
        out: dict[str, dict[int, int]] = {}

        def add(levels: LevelCosts) -> None:
            for lv, (read, write) in levels.items():
                ports = out.setdefault(lv, {})
                ports[1] = ports.get(1, 0) + read.cumm + read.ramp_up
                ports[0] = ports.get(0, 0) + write.cumm + write.ramp_down

        def add_node(n: TreeNode) -> None:
            for levels in self.level_cost.get(n.id, {}).values():
                add(levels)

        if isinstance(children, list):
            for c in children:
                add_node(c)
        elif children.kind == "collective" or children.is_leaf_tile:
            add_node(children)
        else:
            for c in children.children:
                if c.kind != "bind":
                    add_node(c)
        return out

    # -- the walk ------------------------------------------------------------------------------

    def visit(self, node: TreeNode) -> None:
        """Post-order walk (COMET's steady-state walker); errors name the node."""
        try:
            self._visit(node)
        except MeshShapeError as e:
            if str(e).startswith(("DataMovement", "CollectiveOp")):
                raise
            raise MeshShapeError(f"{node.label}: {e}") from None

    def _visit(self, node: TreeNode) -> None:
        if node.kind == "collective":
            self.visit_collective(node)
            return
        if node.kind != "tile":
            return
        if node.spatial or node.is_leaf_tile:
            self._count_reuse(node)
        bindings = []
        for c in node.children:
            if c.kind == "bind":
                bindings.append(c.binding)
            self.visit(c)
        if node.is_leaf_tile:
            self.visit_leaf(node)
            return
        if any(b != "sequential" for b in bindings):
            raise TreeModelError(
                f"{node.label}: only sequential bindings are modelled (got {', '.join(bindings)})"
            )
        windows: Windows = []
        if not bindings:
            child = node.children[-1]
            if not node.spatial:
                self.node_cost[node.id] = self.node_cost[child.id]
                return
            windows.append((child, self.node_cost[child.id]))
        else:
            group: list[TreeNode] = []
            kids = node.children
            for i, c in enumerate(kids):
                if c.kind == "bind" and i % 2 == 0:
                    found = [x for x in kids[i:] if x.kind in ("tile", "collective")][:2]
                    for x in found:
                        if all(x.id != g.id for g in group):  # node ids are unique
                            group.append(x)
            windows.append((group, sum(self.node_cost[x.id] for x in group) & 0xFFFFFFFF))
        if node.spatial:
            self.visit_spatial(node, windows)
        else:
            self.visit_temporal(node, windows)

    def _count_reuse(self, node: TreeNode) -> None:
        """Per tensor: the iterations that move a new tile, and the reuse factor between."""
        iters, rows = self.nests.tiles[node.id].iters, self.moves[node.id]
        reuse = self.reuse.setdefault(node.id, {})
        moving = self.actual.setdefault(node.id, {})
        for t, key in enumerate(zip(node.tensors, node.tags, strict=True)):
            actual = rows[t].moving()
            f = iters[t] // actual if actual else 0
            reuse[key] = f or 1
            moving[key] = actual

    def visit_collective(self, node: TreeNode) -> None:
        """A collective's cycles on both ports of its level, and its energies."""
        cyc, memory_pj, network_pj = collective_cost(
            self.inp, self.nests, node, self.transfers.generalise
        )
        both = [Cost(), Cost()]
        for c in both:
            c.cumm = c.cumm_stall = cyc
            c.reuse = 1
        self.level_cost[node.id] = {node.id: {self.arch.levels[node.target].name: both}}
        self.node_cost[node.id] = cyc
        self.col_energy[node.id] = (memory_pj, network_pj)

    def _access(self, node: TreeNode, t: int, c: Cost, level: str, at_target: bool) -> Access:
        first = self.moves[node.id][t].moved.unique  # the tiles of iteration 0
        return Access(
            level=self.arch.levels[level], count=c.access_count, tile=c.tile_size,
            precision=node.scale[t], rw=self.nests.tiles[node.id].rw[t], at_target=at_target,
            tid=node.tensors[t], rmw=node.rmw[t], proj_count=first or 1, tag=node.tags[t],
            noc_pj=0.0 if at_target else c.noc_pj,
        )  # fmt: skip

    def _keep_ramp_ups(self, node: TreeNode, ups: dict[str, PerTensor]) -> None:
        """Remember the ramp-ups of the target level that pays the most of them."""
        if not ups:
            return
        sums = {lv: sum(v.values()) for lv, v in ups.items()}
        top = max(sums.values())
        for lv, s in sums.items():
            if s == top:
                self.ramp_up.setdefault(node.id, {}).update(ups[lv])

    def _leaf_key(self, node: TreeNode) -> tuple[Any, ...]:
        """All a leaf's stage-4 results depend on besides the tree's shape and the arch."""
        nest, op = self.nests.tiles[node.id], node.children[0]
        return (
            node.id, _desc_key(nest.desc), tuple(nest.iters), tuple(nest.rel_ts),
            tuple(sorted(op.primitive.items())), tuple(sorted(op.red_factors.items())),
        )  # fmt: skip

    def visit_leaf(self, node: TreeNode) -> None:
        """A tile node right above an op: its transfers against the op's compute time.

        With a ``memo`` (a tiling sweep over one template, :class:`fusekit.accel.comet.space.
        Space`), a leaf whose nest another tiling already gave is restored from it: a leaf
        reads nothing above itself. Energy later scales the accesses, so they are copied.
        """
        if self.memo is None:
            self._visit_leaf(node)
            return
        key = self._leaf_key(node)
        hit = self.memo.get(key)
        if hit is not None:
            acc, level_cost, total, down, up = hit
            self.accesses[node.id] = [Access(*values) for values in acc]
            self.level_cost[node.id] = level_cost
            self.node_cost[node.id] = total
            if down is not None:
                self.ramp_down[node.id] = dict(down)
            if up is not None:
                self.ramp_up[node.id] = dict(up)
            return
        self._visit_leaf(node)
        down, up = self.ramp_down.get(node.id), self.ramp_up.get(node.id)
        access_values = _VALUES[Access]
        self.memo[key] = (
            [access_values(a) for a in self.accesses[node.id]], self.level_cost[node.id],
            self.node_cost[node.id],
            None if down is None else dict(down), None if up is None else dict(up),
        )  # fmt: skip

    def leaf_period(self, node: TreeNode) -> int | None:
        """The period of a leaf's transfers when it can be folded, else ``None``.

        Every tensor of the leaf moves a new tile each ``P_t`` iterations, or once (its
        :class:`~.records.MoveRow`'s period); with all tensors over the same ``n`` iterations,
        the leaf's per-iteration costs repeat every ``L = lcm(P_t)`` iterations except in the
        first and the last period (the first read, the last write, the window shifted by one).
        """
        nest = self.nests.tiles[node.id]
        if len(set(nest.iters)) != 1:
            return None
        n = nest.iters[0]
        period = 1
        for row in self.moves[node.id]:
            if row.period > 0:
                period = math.lcm(period, row.period)
        if n < max(FOLD_MIN_PERIODS * period, FOLD_MIN_ITERATIONS) or n % period:
            return None
        return period

    def _visit_leaf(self, node: TreeNode) -> None:
        r"""A leaf, folded where its costs repeat (:meth:`leaf_period`).

        A folded leaf of ``n = mL`` iterations is evaluated at ``2L`` and ``3L`` iterations
        (the first ``2L`` and ``3L`` of its moves): the middle periods add the same costs, so
        every count and cycle total ``x`` at ``n`` is

        .. math:: x(n) = x(2L) + (m - 2) \, (x(3L) - x(2L)).

        A total at or past COMET's 32-bit wrap, or two runs that differ in anything but
        numbers, evaluate the leaf whole instead (``fold=False`` always does).
        """
        period = self.leaf_period(node) if self.fold else None
        if period is None:
            self._leaf(node)
            return
        nest, moves = self.nests.tiles[node.id], self.moves[node.id]
        runs: list[LeafResult] = []
        try:
            for m in (2, 3):
                n = m * period
                self.nests.tiles[node.id] = replace(nest, iters=[n] * len(nest.iters))
                self.moves[node.id] = [mv[:n] for mv in moves]
                self._leaf(node)
                runs.append(self._take_leaf(node))
        finally:
            self.nests.tiles[node.id], self.moves[node.id] = nest, moves
        try:
            self._put_leaf(node, _extend_leaf(runs[0], runs[1], nest.iters[0] // period - 2))
        except FoldError:
            self._leaf(node)

    def _take_leaf(self, node: TreeNode) -> LeafResult:
        """Remove and return what :meth:`_leaf` wrote of ``node``."""
        return (
            self.accesses.pop(node.id), self.level_cost.pop(node.id),
            self.node_cost.pop(node.id), self.ramp_down.pop(node.id, None),
            self.ramp_up.pop(node.id, None),
        )  # fmt: skip

    def _put_leaf(self, node: TreeNode, res: LeafResult) -> None:
        acc, level_cost, total, down, up = res
        self.accesses[node.id] = acc
        self.level_cost[node.id] = level_cost
        self.node_cost[node.id] = total
        if down is not None:
            self.ramp_down[node.id] = down
        if up is not None:
            self.ramp_up[node.id] = up

    def _leaf(self, node: TreeNode) -> None:
        op = node.children[0]
        nest = self.nests.tiles[node.id]
        n_it = max(nest.iters)
        pairs: PortCosts = {}
        ups: dict[str, PerTensor] = {}
        acc: list[Access] = []
        max_acc = 0
        for t, tid in enumerate(node.tensors):
            child = self.arch.levels[node.childs[t]]
            if not child.is_compute:
                raise TreeModelError(f"{node.label}: the child of an op's tile must compute")
            cyc = compute_cycles(child, op, not self.compat.simd_constants)
            ports = self.transfers.port_costs(node, t, cyc, 0, True, [cyc] * n_it)
            c = ports[1 if nest.rw[t] else 0]
            acc.append(self._access(node, t, c, node.targets[t], True))
            max_acc = max(max_acc, c.access_count)
            key = (tid, node.tags[t])
            if nest.rw[t]:
                self.ramp_down.setdefault(node.id, {})[key] = c.ramp_down
            else:
                ups.setdefault(node.targets[t], {})[key] = c.ramp_up
            pairs.setdefault((node.targets[t], node.childs[t]), []).append(ports)
        unit = self.arch.levels[node.childs[0]]
        mac = float(f32(math.prod(op.primitive.values()) * MAC_PJ))
        acc.append(Access(level=unit, count=max_acc, at_target=False, compute=True,
                          tag=node.tags[0], op_type=op.op_type, rmw=node.rmw[0],
                          tid=node.tensors[0], mac_pj=mac))  # fmt: skip
        self.accesses[node.id] = acc
        merged = merge_levels(self.arch, n_it, pairs, {})
        self.level_cost[node.id] = {op.id: merged}
        self.node_cost[node.id] = node_cycles(self.arch, n_it, merged, self.compat.port_overwrite)
        self._keep_ramp_ups(node, ups)

    def visit_spatial(self, node: TreeNode, windows: Windows) -> None:
        """A spatial tile node: its tensors' transfers to the children against their windows.

        With a ``memo``, a node whose inputs another tiling already gave (:meth:`_spatial_key`:
        its nest and moves, and per window its cycles, the children's windows and port use)
        is restored from it, its accesses copied.
        """
        nest = self.nests.tiles[node.id]
        n_it = max(nest.iters)
        seq_parent = binding_of(node, self.compat.binding_misread) == "sequential"
        shared = any(self.arch.levels[c].attrs.get("parent_child_ports_shared", False)
                     for c in node.childs)  # fmt: skip
        groups: list[Group] = []
        for children, wsum in windows:
            win = [wsum] * n_it
            self.window_vector(node, children, win)
            groups.append((children, wsum, win, self.port_use(children) if shared else {}))
        if self.memo is None:
            self._spatial(node, n_it, seq_parent, groups)
            return
        key = self._spatial_key(node, seq_parent, groups)
        hit = self.memo.get(key)
        if hit is not None:
            self._put_node(node, hit)
            return
        self._spatial(node, n_it, seq_parent, groups)
        self.memo[key] = self._node_result(node)

    def _spatial(self, node: TreeNode, n_it: int, seq_parent: bool, groups: list[Group]) -> None:
        """A spatial node's accesses, level costs per window and cycles."""
        self.accesses.setdefault(node.id, [])
        levels = self.level_cost[node.id] = {}
        port_overwrite = self.compat.port_overwrite
        for children, wsum, win, use in groups:
            pairs = self._spatial_pairs(node, children, wsum, win, seq_parent)
            merged = merge_levels(self.arch, n_it, pairs, use)
            levels[_children_key(children)] = merged
            self.node_cost[node.id] = node_cycles(self.arch, n_it, merged, port_overwrite)

    def _spatial_key(
        self, node: TreeNode, seq_parent: bool, groups: list[Group]
    ) -> tuple[Any, ...]:
        """All a spatial node's stage-4 results depend on besides the tree's shape and the arch.

        Its nest's iterations, ports and dependences, its moves, its binding and per window:
        the children, their cycles, the windows less their ramps, their use of shared ports.
        """
        nest = self.nests.tiles[node.id]
        rows = tuple(
            (r.n, r.period, r.moved.tile, r.moved.unique, r.moved.count, r.kept.tile,
             r.kept.unique, r.kept.count)
            for r in self.moves[node.id]
        )  # fmt: skip
        per_window = tuple(
            (_children_key(children), wsum, tuple(win),
             tuple(sorted((lv, tuple(sorted(ports.items()))) for lv, ports in use.items())))
            for children, wsum, win, use in groups
        )  # fmt: skip
        return (
            "spatial", node.id, seq_parent, tuple(nest.iters), tuple(nest.rw),
            tuple(nest.dependent), rows, per_window,
        )  # fmt: skip

    def _node_result(self, node: TreeNode) -> NodeResult:
        """What a spatial node's visit wrote, to restore with :meth:`_put_node`."""
        up = self.ramp_up.get(node.id)
        access_values = _VALUES[Access]
        return (
            [access_values(a) for a in self.accesses[node.id]], self.level_cost[node.id],
            self.node_cost.get(node.id), None if up is None else dict(up),
        )  # fmt: skip

    def _put_node(self, node: TreeNode, res: NodeResult) -> None:
        acc, level_cost, total, up = res
        self.accesses[node.id] = [Access(*values) for values in acc]
        self.level_cost[node.id] = level_cost
        if total is not None:
            self.node_cost[node.id] = total
        if up is not None:
            self.ramp_up[node.id] = dict(up)

    def _spatial_pairs(self, node: TreeNode, children: Children, wsum: int, win: list[int],
                       seq_parent: bool) -> PortCosts:  # fmt: skip
        """The port costs of a spatial node's tensors that reach ``children``."""
        nest = self.nests.tiles[node.id]
        acc = self.accesses[node.id]
        group = children if isinstance(children, list) else [children]
        pairs: PortCosts = {}
        ups: dict[str, PerTensor] = {}
        hit_pair: tuple[str, str] | None = None
        for child in group:
            is_tile = child.kind == "tile"
            hide = is_tile  # a collective child always conflicts with the write-back
            for t, tid in enumerate(node.tensors):
                tag = node.tags[t]
                pair = (node.targets[t], node.childs[t])
                if not isinstance(children, list):
                    if is_tile and node.childs[t] in child.targets:
                        hit_pair = pair
                    elif not is_tile and node.childs[t] == child.target:
                        hit_pair = pair
                    if is_tile and seq_parent:
                        hide = not nest.dependent[t]
                elif is_tile:
                    hide = not nest.dependent[t]
                hit = (tag in child.tags) if is_tile else (tag == child.tag)
                if not hit:
                    continue
                ports = self.transfers.port_costs(node, t, None, wsum, hide, win)
                c = ports[1 if nest.rw[t] else 0]
                acc.append(self._access(node, t, c, node.targets[t], True))
                acc.append(self._access(node, t, c, node.childs[t], False))
                if not nest.rw[t]:
                    ups.setdefault(node.targets[t], {})[(tid, tag)] = c.ramp_up
                pairs.setdefault(pair, []).append(ports)
        self._keep_ramp_ups(node, ups)
        if not isinstance(children, list) and not pairs and hit_pair is not None:
            n_it = max(nest.iters)
            dummy = Cost.sized(n_it)
            dummy.window = [self.node_cost[children.id]] * n_it
            dummy.compute_time = n_it * self.node_cost[children.id]
            dummy.reuse = 1
            pairs[hit_pair] = [[dummy, dummy]]
        return pairs

    def visit_temporal(self, node: TreeNode, windows: Windows) -> None:
        """A temporal node over sequential children: their cycles add up."""
        nest = self.nests.tiles[node.id]
        self.level_cost.setdefault(node.id, {})
        total = 0
        for children, _w in windows:
            group = children if isinstance(children, list) else [children]
            for c in group:
                if c.kind == "collective":
                    n = max(nest.iters)
                    cost = Cost.sized(n)
                    cost.compute_time = n * self.node_cost[c.id]
                    cost.cumm = n * self.node_cost[c.id]
                    self.level_cost[node.id][c.id] = {c.target: [cost, cost]}
        for c in node.children:
            if c.kind == "bind":
                continue
            if c.kind == "collective":
                total += self.level_cost[node.id][c.id][c.target][0].compute_time
            else:
                total += self.node_cost[c.id]
        self.node_cost[node.id] = total & 0xFFFFFFFF


def _desc_key(desc: list[list[dict[int, tuple[int, int]]]]) -> tuple[Any, ...]:
    """A nest's loop descriptors as a key: per tensor and spatial index, its (dim, loop) items."""
    return tuple([tuple([tuple(loops.items()) for loops in per]) for per in desc])


def _children_key(children: Children) -> int | tuple[int, ...]:
    """The key of a node's level costs for ``children``: the child's id, or the group's."""
    return tuple(c.id for c in children) if isinstance(children, list) else children.id


def _less_ramp(win: list[int], f: int, up: int) -> None:
    """Take ramp-up ``up`` off every window but each ``f``-th (COMET's 32-bit wrap)."""
    win[:] = [(w - up) & 0xFFFFFFFF if i % f else w for i, w in enumerate(win)]


def _extend_leaf(a: LeafResult, b: LeafResult, k: int) -> LeafResult:
    """A leaf's results at ``2L`` and ``3L`` iterations extended by ``k`` periods.

    Raises:
        FoldError: the runs differ in more than numbers, or the cycles reach 2**32.
    """
    acc_a, lv_a, total_a, down_a, up_a = a
    acc_b, lv_b, total_b, down_b, up_b = b
    if len(acc_a) != len(acc_b) or lv_a.keys() != lv_b.keys():
        raise FoldError("the runs differ in shape")
    acc = [_extend(x, y, k) for x, y in zip(acc_a, acc_b, strict=True)]
    levels: NodeLevels = {}
    for key, per in lv_a.items():
        other = lv_b[key]
        if per.keys() != other.keys():
            raise FoldError("the runs differ in levels")
        levels[key] = {lv: [_extend(x, y, k) for x, y in zip(cv, other[lv], strict=True)]
                       for lv, cv in per.items()}  # fmt: skip
    total = _affine(total_a, total_b, k)
    if not 0 <= total < 1 << 32:
        raise FoldError("the cycles reach COMET's 32-bit wrap")

    def table(x: PerTensor | None, y: PerTensor | None) -> PerTensor | None:
        if x is None or y is None:
            if x is not y:
                raise FoldError("the runs differ in ramps")
            return None
        if x.keys() != y.keys():
            raise FoldError("the runs differ in ramps")
        return {key: _affine(v, y[key], k) for key, v in x.items()}

    return acc, levels, total, table(down_a, down_b), table(up_a, up_b)
