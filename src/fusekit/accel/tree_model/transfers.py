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


class Transfers:
    """The transfers of one tree: per tile node and tensor, each iteration's cost (cached)."""

    def __init__(self, arch: Hierarchy, nests: Nests, moves: Moves, generalise: bool) -> None:
        self.arch, self.nests, self.moves = arch, nests, moves
        self.generalise = generalise  # the network model beyond COMET's sub-mesh table
        self._cache: dict[tuple[int, int, int, int, int], Transfer] = {}

    def transfer(self, node: TreeNode, t: int, mv: Move) -> Transfer:
        """Memory cycles, network cycles and router energy of one iteration's transfer."""
        key = (node.id, t, mv.tile, mv.unique, mv.count)
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

    def stalls(self, node: TreeNode, t: int, mvs: MoveRow, no_stall: list[int], hide: bool,
               reuse: int, different: bool) -> Cost:  # fmt: skip
        """Per-iteration stalls of one tensor's transfers against the windows ``no_stall``."""
        rw = self.nests.tiles[node.id].rw[t]
        n = len(mvs)
        pseudo = n if different else n // reuse
        c = Cost.sized(pseudo)
        start = 1 if rw else -1
        c.tile_size = mvs[0].tile
        c.access_count = pseudo
        seen: dict[int, tuple[int, float]] = {}  # per Move object (rows share them)
        n_win = len(no_stall)
        c_stall, c_mem = c.stall, c.mem_net
        noc_pj, cumm, cumm_stall = c.noc_pj, 0, 0
        last = n - reuse if rw else -1
        for idx, mv in enumerate(mvs):
            hit = seen.get(id(mv))
            if hit is None:
                memory, lat, e = self.transfer(node, t, mv)
                hit = seen[id(mv)] = (memory + lat, e)
            eff, e = hit
            noc_pj += e
            if idx == last:
                c.ramp_down = eff
                continue
            if idx == 0 and not rw:
                c.ramp_up = eff
                continue
            if not hide:
                stall = eff
            elif eff == 0:
                stall = 0
            else:
                stall = eff - (no_stall[idx] if idx < n_win else 0)
            if different:
                j = idx + start
            elif idx % reuse == 0:
                j = idx // reuse + start
            else:
                continue
            if 0 <= j < pseudo:
                c_stall[j] = stall
                c_mem[j] = eff
            cumm += eff
            cumm_stall += stall
        c.noc_pj, c.cumm, c.cumm_stall = noc_pj, cumm, cumm_stall
        return c

    def port_costs(self, node: TreeNode, t: int, op_cycles: int | None, child_cost: int,
                   hide: bool, window: list[int]) -> list[Cost]:  # fmt: skip
        """COMET's per-tensor cost at a node: [read port, write port]."""
        nest = self.nests.tiles[node.id]
        mvs = self.moves[node.id][t]
        tt = 1 if nest.rw[t] else 0
        base = nest.rel_ts[t] * op_cycles if op_cycles is not None else child_cost
        different = len(set(nest.iters)) != 1
        actual = mvs.moving()
        reuse = nest.iters[t] // actual if actual else 0
        reuse = reuse or 1
        if reuse == 1:
            no_stall = list(window)
        else:
            no_stall = [sum(window[i:i + reuse]) if i % reuse == 0 else 0
                        for i in range(len(window))]  # fmt: skip
        ports = [Cost(), Cost()]
        c = self.stalls(node, t, mvs, no_stall, hide, reuse, different)
        c.window = [base * reuse] * actual
        c.reuse = reuse
        c.tens_idx = t
        c.compute_time = sum(no_stall)
        c.hide = hide
        ports[tt] = c
        return ports


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
