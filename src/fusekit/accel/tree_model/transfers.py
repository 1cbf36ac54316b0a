r"""Stage 4's transfers: one iteration's memory and network cycles, and the stalls they cause.

A tile of ``s`` elements of ``p`` bits moving between a target level and its child takes

.. math::

    t_{mem} = \max\Big(\Big\lceil \frac{k \, u \, s \, p / 8}{BW_{target}} \Big\rceil,
                       \Big\lceil \frac{s \, p / 8}{BW_{child}} \Big\rceil\Big)

cycles (``u`` distinct tiles, ``k`` children each served alone where the network cannot
broadcast or reduce, a read-modify-write paying the target's read too; COMET's float32
arithmetic), plus the network's link latency (:mod:`fusekit.accel.noc`). A transfer stalls its
iteration by what exceeds the compute window it hides under; the first read (ramp-up) and the
last write (ramp-down) are not hidden.
"""

from __future__ import annotations

import math

from fusekit.accel.noc import link_energy_pj, link_latency
from fusekit.accel.tree import Hierarchy, Level, Network, TreeNode
from fusekit.accel.tree_model.records import Cost, Move, MoveRow, Moves, Nests, TreeModelError, f32

#: One iteration's transfer: memory cycles, network cycles, router energy (pJ).
Transfer = tuple[int, int, float]
#: All a transfer depends on besides the arch: target and child level, read-write,
#: read-modify-write, precision, tile, distinct tiles, spatial children, generalised network.
TransferKey = tuple[str, str, bool, bool, int, int, int, int, bool]


class Transfers:
    """The transfers of one tree: per tile node and tensor, each iteration's cost (cached).

    ``shared``: the cache of :meth:`transfer`, to share among trees over the same arch (the
    tilings of a template).
    """

    def __init__(
        self,
        arch: Hierarchy,
        nests: Nests,
        moves: Moves,
        generalise: bool,
        shared: dict[TransferKey, Transfer] | None = None,
    ) -> None:
        self.arch, self.nests, self.moves = arch, nests, moves
        self.generalise = generalise  # the network model beyond COMET's sub-mesh table
        self._cache: dict[TransferKey, Transfer] = {} if shared is None else shared

    def transfer(self, node: TreeNode, t: int, mv: Move) -> Transfer:
        """Memory cycles, network cycles and router energy of one iteration's transfer."""
        key = (node.targets[t], node.childs[t], self.nests.tiles[node.id].rw[t], node.rmw[t],
               node.scale[t], mv.tile, mv.unique, mv.count, self.generalise)  # fmt: skip
        hit = self._cache.get(key)
        if hit is None:
            hit = self._transfer(node, t, mv)
            self._cache[key] = hit
        return hit

    def _transfer(self, node: TreeNode, t: int, mv: Move) -> Transfer:
        target = self.arch.levels[node.targets[t]]
        child = self.arch.levels[node.childs[t]]
        net = target.link_net if target is child else target.child_nets.get(child.name)
        if net is None:
            raise TreeModelError(f"{node.label}: no network from {target.name} to {child.name}")
        rw = self.nests.tiles[node.id].rw[t]
        scale = f32(f32(node.scale[t]) / f32(8.0))
        memory = _memory_cycles(target, child, net, rw, node.rmw[t], mv, scale)
        nodes, size = mv.count, mv.tile
        num = max(mv.unique, 1) if rw else mv.unique
        kind = "gather" if rw else ("broadcast" if num == 1 else "scatter")
        lat = link_latency(net, kind, size, mv.unique, nodes, float(scale),
                           generalise=self.generalise)  # fmt: skip
        e = link_energy_pj(net, kind, size, mv.unique, nodes, float(scale),
                           generalise=self.generalise)  # fmt: skip
        return memory, lat, e

    def _cycles(self, node: TreeNode, t: int, mv: Move) -> tuple[int, float]:
        """One iteration's transfer cycles (memory plus network) and router energy."""
        memory, lat, e = self.transfer(node, t, mv)
        return memory + lat, e

    def stalls(self, node: TreeNode, t: int, mvs: MoveRow, no_stall: list[int], hide: bool,
               reuse: int, different: bool) -> Cost:  # fmt: skip
        """Per-iteration stalls of one tensor's transfers against the windows ``no_stall``.

        An iteration's stall is its transfer cycles less its window (all of them where the
        transfer is not hidden, none where it moves nothing). The iterations that count are
        every one (``different``) or every ``reuse``-th; the ``k``-th of them is kept at
        ``k + 1`` for a write, ``k - 1`` for a read. The first read is the ramp-up, the write
        at ``n - reuse`` the ramp-down: neither counts. Every iteration adds its router energy.
        """
        rw = self.nests.tiles[node.id].rw[t]
        n = len(mvs)
        pseudo = n if different else n // reuse
        c = Cost.sized(pseudo)
        c.tile_size = mvs[0].tile
        c.access_count = pseudo
        moved = self._cycles(node, t, mvs.moved)
        kept = self._cycles(node, t, mvs.kept) if mvs.firsts() < n else (0, 0.0)
        c.noc_pj = _energy_sum(mvs, moved[1], kept[1])
        step = 1 if different else reuse
        effs = _picked(mvs, step, moved[0], kept[0])
        waits = no_stall[0:n:step]
        waits += [0] * (len(effs) - len(waits))  # past the windows: nothing hides the transfer
        if not hide:
            stalls = list(effs)
        else:
            stalls = [eff - w if eff else 0 for eff, w in zip(effs, waits, strict=True)]
        skip = -1  # the picked iteration that is a ramp, not a stall
        if rw:
            last = n - reuse
            if last >= 0:
                c.ramp_down = moved[0] if _is_first(mvs, last) else kept[0]
                if last % step == 0:
                    skip = last // step
        else:
            c.ramp_up = effs[0]
            skip = 0
        if skip >= 0:
            effs[skip] = stalls[skip] = 0
        shift = 1 if rw else -1
        _place(c.stall, stalls, shift)
        _place(c.mem_net, effs, shift)
        c.cumm, c.cumm_stall = sum(effs), sum(stalls)
        return c

    def port_costs(self, node: TreeNode, t: int, op_cycles: int | None, child_cost: int,
                   hide: bool, window: list[int]) -> list[Cost]:  # fmt: skip
        """COMET's per-tensor cost at a node: [read port, write port]."""
        nest = self.nests.tiles[node.id]
        mvs = self.moves[node.id][t]
        base = nest.rel_ts[t] * op_cycles if op_cycles is not None else child_cost
        different = len(set(nest.iters)) != 1
        actual = mvs.moving()
        reuse = nest.iters[t] // actual if actual else 0
        reuse = reuse or 1
        if reuse == 1:
            no_stall = window  # read only
        else:  # each reuse-th iteration's window covers the reused ones after it
            no_stall = [0] * len(window)
            no_stall[::reuse] = [sum(window[i:i + reuse])
                                 for i in range(0, len(window), reuse)]  # fmt: skip
        c = self.stalls(node, t, mvs, no_stall, hide, reuse, different)
        c.window = [base * reuse] * actual
        c.reuse = reuse
        c.tens_idx = t
        c.compute_time = sum(window)
        c.hide = hide
        return [Cost(), c] if nest.rw[t] else [c, Cost()]


def _is_first(mvs: MoveRow, i: int) -> bool:
    """Whether iteration ``i`` of ``mvs`` gets its ``moved`` move."""
    return i == 0 or (mvs.period > 0 and i % mvs.period == 0)


def _picked(mvs: MoveRow, step: int, moved: int, kept: int) -> list[int]:
    """``moved`` or ``kept`` of every ``step``-th iteration of ``mvs``, as it gets either."""
    picked = range(0, len(mvs), step)
    if mvs.period <= 0:
        out = [kept] * len(picked)
        out[0] = moved
        return out
    return [moved if i % mvs.period == 0 else kept for i in picked]


def _energy_sum(mvs: MoveRow, moved: float, kept: float) -> float:
    """The router energy of every iteration, added in iteration order (float rounding)."""
    total = 0.0
    if kept == 0.0:  # adding 0.0 leaves the total as it is
        for _ in range(mvs.firsts()):
            total += moved
        return total
    for i in range(len(mvs)):
        total += moved if _is_first(mvs, i) else kept
    return total


def _place(dst: list[int], src: list[int], shift: int) -> None:
    """``dst[k + shift] = src[k]`` for every ``k`` that lands inside ``dst``."""
    lo = max(0, -shift)
    hi = min(len(src), len(dst) - shift)
    if hi > lo:
        dst[lo + shift : hi + shift] = src[lo:hi]


def _memory_cycles(
    target: Level, child: Level, net: Network, rw: bool, rmw: bool, mv: Move, scale: f32
) -> int:
    """The slower side of a transfer: the target's ports (shared by the tiles) or the child's."""
    size, num, nodes = mv.tile, mv.unique, mv.count
    ports = int(target.attrs.get("ports", 1))
    used = max(min(num, ports), 1)
    if rw:
        tbw = target.bw("child_write_bw")
        num = max(num, 1)
    else:
        tbw = target.bw("child_read_bw")
    if used < ports:
        tbw = tbw // ports * used
    if child.is_compute:
        cbw = net.port_bw
    else:
        cbw = child.bw("parent_read_bw" if rw else "parent_write_bw")
    tbw = min(tbw, used * net.port_bw)
    cbw = min(cbw, net.port_bw)
    support = net.reduction if rw else net.broadcast
    scatter = 1 if support or num == 0 else -(-nodes // num)
    t_target = math.ceil(f32(f32(f32(f32(scatter) * f32(num)) * f32(size)) * scale / f32(tbw)))
    t_child = 0 if num == 0 else math.ceil(f32(f32(f32(size) * scale) / f32(cbw)))
    if rw and rmw:
        rbw = target.bw("child_read_bw")
        if used < ports:
            rbw = rbw // ports * used
        t_target += math.ceil(f32(f32(f32(f32(scatter) * f32(num)) * f32(size)) * scale
                                  / f32(rbw)))  # fmt: skip
    return int(max(t_target, t_child))
