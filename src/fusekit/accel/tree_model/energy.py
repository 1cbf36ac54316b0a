r"""Stage 5, energy: the accesses of stage 4 priced per level, scaled by the tree above them.

Pre-order: per tile node, each access costs

.. math::

    E = n_{inst} \cdot c \cdot s \cdot u \cdot p \cdot e_{access} / (8 \, width)

(``n_inst`` instances of the node, ``c`` accesses times the parents' iterations, tiles of ``s``
elements, ``u`` distinct tiles, ``p`` bits; doubled for a read-modify-write); a compute unit
costs its accesses times :func:`fusekit.accel.tree_model.compute.unit_energy_pj`; the routers
cost the transfers' network energy times the parents' iterations; a collective its memory and
network energy (:mod:`.collectives`) once per iteration of the node above it.
"""

from __future__ import annotations

from fusekit.accel.compat import Compat
from fusekit.accel.tree import TreeNode
from fusekit.accel.tree_model.compute import unit_energy_pj
from fusekit.accel.tree_model.records import Access, TreeModelError, f32
from fusekit.accel.tree_model.steady import SteadyState

#: Per op tag, per tensor id: a count (iterations or instances) of the nodes above.
Counts = dict[str, dict[int, int]]


def _max_count(table: Counts, tids: list[int]) -> tuple[bool, int]:
    found, best = False, 1
    for per in table.values():
        for tid, n in per.items():
            if tid in tids:
                best, found = max(best, n), True
    return found, best


def memory_pj(a: Access) -> float:
    """Energy of ``a.count`` accesses of ``a.tile`` elements at a memory level (module formula)."""
    at = a.level.attrs
    if a.rw:
        cost = at.get("parent_write_energy", 0) if a.at_target else at.get(
            "child_read_energy", 0)  # fmt: skip
    else:
        cost = at.get("parent_read_energy", 0) if a.at_target else at.get(
            "child_write_energy", 0)  # fmt: skip
    e = a.count * a.tile * a.proj_count * a.precision * float(f32(cost))
    e /= a.level.width_bytes() * 8.0
    return e * 2 if a.rmw else e


class Energy:
    """Stage 5 (see the module docstring): energy per node and level, and parents' iterations."""

    def __init__(self, ss: SteadyState, compat: Compat) -> None:
        self.ss = ss
        self.compat = compat
        self.level_pj: dict[int, dict[str, float]] = {}
        self.noc_pj: dict[int, dict[str, float]] = {}
        self.parent_iters: dict[int, int] = {}
        self.fan_out: dict[int, int] = {}  # instances of each node: its spatial ancestors' fan-out
        self._fan(ss.inp.mapping, 1)

    def _fan(self, node: TreeNode, n: int) -> None:
        self.fan_out[node.id] = n
        if node.kind == "tile" and node.spatial:
            n *= max(self.ss.nests.tiles[node.id].sp_iters, default=1)
        for c in node.children:
            self._fan(c, n)

    def _left_tensors(self, node: TreeNode) -> list[int]:
        out: list[int] = []
        for c in _left_siblings(node):
            if c.kind == "tile":
                out += [t for t in c.tensors if t not in out]
        return out

    def _left_tags(self, node: TreeNode, tid: int) -> list[str]:
        out: list[str] = []
        for c in _left_siblings(node):
            if c.kind == "tile":
                out += [c.tags[i] for i, t in enumerate(c.tensors) if t == tid]
        return out

    def walk(self, node: TreeNode, sp: Counts, iters: Counts, root: TreeNode) -> None:
        """Pre-order walk; ``sp`` and ``iters`` are the parents' instance and iteration counts."""
        if node.kind == "op":
            return
        here: Counts = {}
        if node.kind == "tile":
            if node.spatial or node.is_leaf_tile:
                here = self._tile(node, sp, iters, root)
            if node.is_leaf_tile:
                return
            for tag, per in here.items():
                for tid, n in per.items():
                    tgt = iters.setdefault(tag, {})
                    tgt[tid] = tgt[tid] * n if tid in tgt else n
        for i, c in enumerate(node.children):
            if c.kind == "collective":
                self._collective(node, c, i, here, iters)
            elif c.kind == "tile":
                self.walk(c, {k: dict(v) for k, v in sp.items()},
                          {k: dict(v) for k, v in iters.items()}, root)  # fmt: skip

    def _tile(self, node: TreeNode, sp: Counts, iters: Counts, root: TreeNode) -> Counts:
        """A spatial or leaf tile node's energy per level; returns its accesses per tensor."""
        nest = self.ss.nests.tiles[node.id]
        lv_pj: dict[str, float] = {}
        noc: dict[str, float] = {}
        here: Counts = {}
        is_root = node.parent is root
        accesses = self.ss.accesses.get(node.id, [])
        for a in accesses:
            if a.at_target and not a.compute:
                here.setdefault(a.tag, {})[a.tid] = a.count
            if not a.compute and not is_root:
                self._repeat(node, a, iters, noc)
            nodes = self._instances(node, a, sp, is_root)
            if not self.compat.tag_instances:
                nodes = self.fan_out[node.id]
            if a.compute:
                a.count *= self._compute_repeats(node, a, iters)
                e = nodes * a.count * unit_energy_pj(a, self.compat)
            else:
                e = nodes * memory_pj(a)
            lv_pj[a.level.name] = lv_pj.get(a.level.name, 0.0) + e
        self.level_pj[node.id] = lv_pj
        self.noc_pj[node.id] = noc
        cnt = 0
        for a in accesses:
            if not a.at_target:
                continue
            per = sp.setdefault(a.tag, {})
            f = nest.sp_iters[cnt] if cnt < len(nest.sp_iters) else 1
            per[a.tid] = per[a.tid] * f if a.tid in per else f
            cnt += 1
        return here

    def _repeat(self, node: TreeNode, a: Access, iters: Counts, noc: dict[str, float]) -> None:
        """Scale a memory access by its parents' iterations; its routers' energy with it."""
        found, n = _max_count(iters, self._left_tensors(node) + node.tensors)
        if not found:
            raise TreeModelError(f"{node.label}: no parent iteration count")
        a.count *= n
        iters.setdefault(a.tag, {})[a.tid] = n
        self.parent_iters[node.id] = max(self.parent_iters.get(node.id, 0), n)
        if not a.at_target:
            key = f"{a.level.name}<->{a.level.name}"
            noc[key] = noc.get(key, 0.0) + a.noc_pj * n

    def _instances(self, node: TreeNode, a: Access, sp: Counts, is_root: bool) -> int:
        """Instances of ``node`` charged for ``a``: tracked per op tag (COMET's ``sp`` table)."""
        nodes = 1
        if a.tag in sp:
            if a.tid in sp[a.tag]:
                nodes = sp[a.tag][a.tid]
            else:
                for t in node.tensors:
                    if t in sp[a.tag]:
                        nodes = max(nodes, sp[a.tag][t])
                sp[a.tag][a.tid] = nodes
        elif not is_root:
            found, nodes = _max_count(sp, self._left_tensors(node) + node.tensors)
            if not found:
                raise TreeModelError(f"{node.label}: no parent instance count")
        return nodes

    def _compute_repeats(self, node: TreeNode, a: Access, iters: Counts) -> int:
        """Iterations of the nodes above a compute unit's accesses."""
        n = 1
        if a.tag in iters:
            for t in node.tensors:
                if t in iters[a.tag]:
                    n = max(n, iters[a.tag][t])
        else:
            found, n = _max_count(iters, node.tensors)
            if not found:
                found, n = _max_count(iters, self._left_tensors(node))
        return n

    def _collective(self, node: TreeNode, c: TreeNode, i: int, here: Counts,
                    iters: Counts) -> None:  # fmt: skip
        ss = self.ss
        mem, net = ss.col_energy[c.id]
        tags = self._left_tags(c, c.in_tensor)
        if not node.spatial:
            left = next((x for x in reversed(node.children[:i]) if x.kind == "tile"), None)
            if left is None or not tags:
                raise TreeModelError(f"{c.label}: no tile node producing its tensor on the left")
            for a in ss.accesses.get(left.id, []):
                if a.at_target and not a.compute:
                    here.setdefault(a.tag, {})[a.tid] = a.count
            n = here.get(tags[-1], {}).get(c.in_tensor, 0)
            self.parent_iters[c.id] = n
            self.level_pj[c.id] = {c.target: mem * n}
            self.noc_pj[c.id] = {f"{c.target}<->{c.target}": net * n}
        else:
            n = 1
            for tag, per in iters.items():
                if c.in_tensor in per and tag in tags:
                    n = per[c.in_tensor]
            self.parent_iters[c.id] = n
            self.level_pj[c.id] = {c.target: mem}
            self.noc_pj[c.id] = {f"{c.target}<->{c.target}": net}
            for d in (self.level_pj.get(node.id, {}), self.noc_pj.get(node.id, {})):
                for k in d:
                    d[k] *= n


def _left_siblings(node: TreeNode) -> list[TreeNode]:
    """The children of ``node``'s parent left of it."""
    if node.parent is None:
        raise TreeModelError(f"{node.label}: expected a parent node")
    kids = node.parent.children
    return kids[: next(i for i, c in enumerate(kids) if c is node)]
