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

import struct

from fusekit.accel.compat import Compat
from fusekit.accel.tree import Level, TreeNode
from fusekit.accel.tree_model.compute import unit_energy_pj
from fusekit.accel.tree_model.records import Access, TreeModelError, f32
from fusekit.accel.tree_model.steady import SteadyState

#: Per op tag, per tensor id: a count (iterations or instances) of the nodes above.
Counts = dict[str, dict[int, int]]


def _max_count(table: Counts, tids: frozenset[int]) -> tuple[bool, int]:
    """The largest count of ``tids`` in ``table`` (at least 1) and whether there is one."""
    found, best = False, 1
    for per in table.values():
        for tid, n in per.items():
            if tid in tids:
                found = True
                if n > best:
                    best = n
    return found, best


_F32 = struct.Struct("f")


def round_f32(x: float) -> float:
    """``x`` rounded to float32 as numpy rounds it, as a Python float (without numpy scalars).

    A sum of two float32 values rounded so is their float32 sum: float64 holds more than twice
    float32's precision, so rounding twice (to float64, then float32) is harmless.
    """
    try:
        return _F32.unpack(_F32.pack(x))[0]  # type: ignore[no-any-return]
    except (OverflowError, struct.error):  # beyond float32's range (infinity), not a number
        return float(f32(x))


def block_price(level: Level, rw: bool, at_target: bool) -> tuple[float, float]:
    """One access's energy at ``level`` (float32, as COMET reads it) and the bits of a block."""
    if rw:
        key = "parent_write_energy" if at_target else "child_read_energy"
    else:
        key = "parent_read_energy" if at_target else "child_write_energy"
    return round_f32(level.attrs.get(key, 0)), level.width_bytes() * 8.0


def memory_pj(a: Access, price: tuple[float, float] | None = None) -> float:
    """Energy of ``a.count`` accesses of ``a.tile`` elements at a memory level (module formula).

    ``price``: :func:`block_price` of the access, when the caller has it.
    """
    cost, bits = price or block_price(a.level, a.rw, a.at_target)
    e = a.count * a.tile * a.proj_count * a.precision * cost
    e /= bits
    return e * 2 if a.rmw else e


class Energy:
    """Stage 5 (see the module docstring): energy per node and level, and parents' iterations."""

    def __init__(self, ss: SteadyState, compat: Compat) -> None:
        self.ss = ss
        self.compat = compat
        self.level_pj: dict[int, dict[str, float]] = {}
        self.noc_pj: dict[int, dict[str, float]] = {}
        self.parent_iters: dict[int, int] = {}
        #: instances of each node, its spatial ancestors' fan-out (native: ``tag_instances`` off)
        self.fan_out: dict[int, int] = {}
        self.scopes: dict[int, frozenset[int]] = {}  # per node: see _scope
        self.prices: dict[tuple[str, bool, bool], tuple[float, float]] = {}  # see _price
        if not compat.tag_instances:
            self._fan(ss.inp.mapping, 1)

    def _fan(self, node: TreeNode, n: int) -> None:
        self.fan_out[node.id] = n
        if node.kind == "tile" and node.spatial:
            n *= max(self.ss.nests.tiles[node.id].sp_iters, default=1)
        for c in node.children:
            self._fan(c, n)

    def _scope(self, node: TreeNode) -> frozenset[int]:
        """The tensors of ``node`` and of the tile nodes on its left: whose counts it reads."""
        scope = self.scopes.get(node.id)
        if scope is None:
            left = [t for c in _left_siblings(node) if c.kind == "tile" for t in c.tensors]
            scope = self.scopes[node.id] = frozenset(left + node.tensors)
        return scope

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
        last = _last_reader(node.children)
        for i, c in enumerate(node.children):
            if c.kind == "collective":
                self._collective(node, c, i, here, iters)
            elif c.kind == "tile" and i == last:  # no one reads the counts after it: its own
                self.walk(c, sp, iters, root)
            elif c.kind == "tile":
                self.walk(c, {k: dict(v) for k, v in sp.items()},
                          {k: dict(v) for k, v in iters.items()}, root)  # fmt: skip

    def _tile(self, node: TreeNode, sp: Counts, iters: Counts, root: TreeNode) -> Counts:
        """A spatial or leaf tile node's energy per level; returns its accesses per tensor."""
        lv_pj: dict[str, float] = {}
        noc: dict[str, float] = {}
        here: Counts = {}
        is_root = node.parent is root
        fan_out = None if self.compat.tag_instances else self.fan_out[node.id]
        accesses = self.ss.accesses.get(node.id, [])
        repeats = 0  # the parents' iterations of its memory accesses, looked up on first use
        for a in accesses:
            memory = not a.compute
            if memory and a.at_target:
                _put(here, a.tag, a.tid, a.count)
            if memory and not is_root:
                repeats = repeats or self._parent_iters(node, iters)
                self._repeat(a, repeats, iters, noc)
            nodes = self._instances(node, a, sp, is_root)
            if fan_out is not None:
                nodes = fan_out
            if memory:
                price = self.prices.get((a.level.name, a.rw, a.at_target)) or self._price(a)
                e = nodes * memory_pj(a, price)
            else:
                a.count *= self._compute_repeats(node, a, iters)
                e = nodes * a.count * unit_energy_pj(a, self.compat)
            name = a.level.name
            lv_pj[name] = lv_pj.get(name, 0.0) + e
        self.level_pj[node.id] = lv_pj
        self.noc_pj[node.id] = noc
        self._fan_out_here(node, accesses, sp)
        return here

    def _fan_out_here(self, node: TreeNode, accesses: list[Access], sp: Counts) -> None:
        """Multiply the instance counts of the tensors ``node`` targets by its fan-out."""
        factors = self.ss.nests.tiles[node.id].sp_iters
        cnt = 0
        for a in accesses:
            if not a.at_target:
                continue
            f = factors[cnt] if cnt < len(factors) else 1
            per = sp.get(a.tag)
            if per is None:
                sp[a.tag] = {a.tid: f}
            else:
                per[a.tid] = per[a.tid] * f if a.tid in per else f
            cnt += 1

    def _price(self, a: Access) -> tuple[float, float]:
        """The :func:`block_price` of ``a``, kept per level and kind of access."""
        price = self.prices[(a.level.name, a.rw, a.at_target)] = block_price(
            a.level, a.rw, a.at_target)  # fmt: skip
        return price

    def _parent_iters(self, node: TreeNode, iters: Counts) -> int:
        """The largest iteration count above ``node`` of its tensors or its left siblings'.

        The same for each of its memory accesses (:meth:`_repeat` sets entries to it only).
        """
        found, n = _max_count(iters, self._scope(node))
        if not found:
            raise TreeModelError(f"{node.label}: no parent iteration count")
        self.parent_iters[node.id] = max(self.parent_iters.get(node.id, 0), n)
        return n

    @staticmethod
    def _repeat(a: Access, n: int, iters: Counts, noc: dict[str, float]) -> None:
        """Scale a memory access by its parents' iterations ``n``; its routers' energy with it."""
        a.count *= n
        _put(iters, a.tag, a.tid, n)
        if not a.at_target:
            key = f"{a.level.name}<->{a.level.name}"
            noc[key] = noc.get(key, 0.0) + a.noc_pj * n

    def _instances(self, node: TreeNode, a: Access, sp: Counts, is_root: bool) -> int:
        """Instances of ``node`` charged for ``a``: tracked per op tag (COMET's ``sp`` table)."""
        per = sp.get(a.tag)
        if per is not None:
            nodes = per.get(a.tid)
            if nodes is None:
                nodes = max([1] + [per[t] for t in node.tensors if t in per])
                per[a.tid] = nodes
            return nodes
        if is_root:
            return 1
        found, nodes = _max_count(sp, self._scope(node))
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
            found, n = _max_count(iters, frozenset(node.tensors))
            if not found:  # none of its own: those of the tile nodes on its left
                found, n = _max_count(iters, self._scope(node))
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


def _put(table: Counts, tag: str, tid: int, n: int) -> None:
    """Set ``table[tag][tid]`` to ``n``."""
    per = table.get(tag)
    if per is None:
        table[tag] = {tid: n}
    else:
        per[tid] = n


def _last_reader(kids: list[TreeNode]) -> int:
    """The index of the last tile or collective among ``kids`` (they read the counts); -1."""
    for i in range(len(kids) - 1, -1, -1):
        if kids[i].kind in ("tile", "collective"):
            return i
    return -1


def _left_siblings(node: TreeNode) -> list[TreeNode]:
    """The children of ``node``'s parent left of it."""
    if node.parent is None:
        raise TreeModelError(f"{node.label}: expected a parent node")
    return node.parent.children[: node.position()]
