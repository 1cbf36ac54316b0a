"""Stage 4's merge: per-tensor port costs into per-level costs, then a node's cycles.

The tensors a node moves through one target level share its ports: per port, the level's
compute window is the largest of theirs, its stalls add up, and a transfer hidden under the
window uses it up for the level's other tensors on that port. A node's cycles are then its
compute window plus the largest ramp-up and ramp-down over its levels plus, per iteration, the
largest stall over the levels and ports.
"""

from __future__ import annotations

from fusekit.accel.tree import Hierarchy
from fusekit.accel.tree_model.records import Cost, LevelCosts, PortCosts

#: The (target, child) pairs of a node's port costs, in COMET's level order.
Ordered = list[tuple[tuple[str, str], list[list[Cost]]]]
#: Per target level, the compute window of each (tensor, port) cost, in merge order.
Windows = dict[str, list[list[int]]]


def sorted_pairs(arch: Hierarchy, pairs: PortCosts) -> Ordered:
    """``pairs`` by the creation order of target, then child level (COMET's map order)."""
    levels = arch.levels
    return sorted(pairs.items(), key=lambda kv: (levels[kv[0][0]].rank, levels[kv[0][1]].rank))


def merge_levels(
    arch: Hierarchy, n_it: int, pairs: PortCosts, port_use: dict[str, dict[int, int]]
) -> LevelCosts:
    """Merge per-tensor costs into per-target-level costs, windows shared per port."""
    ordered = sorted_pairs(arch, pairs)
    windows = _port_windows(arch, ordered, port_use)
    merged: LevelCosts = {}
    count: dict[str, int] = {}
    for (tgt, _chl), vec in ordered:
        if tgt not in merged:
            merged[tgt] = [Cost.sized(n_it), Cost.sized(n_it)]
            count[tgt] = 0
        for idx in (0, 1):
            for per in vec:
                if not (len(per) > idx and per[idx].stall):
                    continue
                _merge_port(merged[tgt][idx], per[idx], windows, ordered, tgt, idx,
                            count[tgt], n_it)  # fmt: skip
                count[tgt] += 1
    return merged


def _port_windows(
    arch: Hierarchy, ordered: Ordered, port_use: dict[str, dict[int, int]]
) -> Windows:
    """Each cost's window, less what the children hold of a port shared with their parent."""
    windows: Windows = {}
    for (tgt, chl), vec in ordered:
        for idx in (0, 1):
            for per in vec:
                if len(per) > idx and per[idx].stall:
                    child = arch.levels[chl]
                    w = list(per[idx].window)
                    if (
                        not child.is_compute
                        and port_use
                        and child.attrs.get("parent_child_ports_shared", False)
                    ):
                        cost = port_use.get(chl, {}).get(idx, 0)
                        w = [e - cost if e > cost else 0 for e in w]
                    windows.setdefault(tgt, []).append(w)
    return windows


def _merge_port(m: Cost, p: Cost, windows: Windows, ordered: Ordered, tgt: str, idx: int,
                k: int, n_it: int) -> None:  # fmt: skip
    """Add tensor cost ``p`` (the ``k``-th of level ``tgt``) into the level's port cost ``m``."""
    m.ramp_up += p.ramp_up
    m.ramp_down += p.ramp_down
    m.compute_time = max(m.compute_time, p.compute_time)
    if m.reuse == 0:
        m.reuse = 1
    if p.reuse > 0:
        m.reuse = min(m.reuse, p.reuse)
    m.cumm += p.cumm
    f = p.reuse
    its = min(n_it, len(windows[tgt][k]))
    sharers: list[tuple[list[int], int, int]] | None = None
    mw, mc, ms, wk = m.window, m.compulsory, m.stall, windows[tgt][k]
    pw, ps, pn = p.window, p.stall, p.mem_net
    n_mw, n_mc, n_ms, n_pw, n_ps, n_pn = map(len, (mw, mc, ms, pw, ps, pn))
    for i in range(idx, its):
        pwi = pw[i] // f if i < n_pw and pw[i] != 0 else -1
        extra = (ps[i] if i < n_ps else 0) if not p.hide and i < n_pw else 0
        stall = (pn[i] if i < n_pn else 0) // f - wk[i] // f
        for mi in range(i * f, i * f + f):
            if pwi >= 0 and mi < n_mw:
                mw[mi] = max(mw[mi], pwi)
            if extra and mi < n_mc:
                mc[mi] += extra
            if stall > 0 and mi < n_ms:
                ms[mi] += stall
        if not p.hide or i >= n_pn:
            continue
        # a transfer hidden under the compute window uses it up for the
        # level's other tensors on the same port
        if sharers is None:
            sharers = [
                (windows[tgt][kk], kf, len(windows[tgt][kk]))
                for kk, kf in _sharers(ordered, tgt, idx, k)
            ]
        used = pn[i] // f
        for win, kf, n_win in sharers:
            for mi in range(i * f, i * f + f):
                nn = mi // kf
                if nn < n_win:
                    win[nn] = max(win[nn] - used, 0)


def _sharers(ordered: Ordered, tgt: str, idx: int, k: int) -> list[tuple[int, int]]:
    """The level's other tensors on the same port: (their window index, their reuse)."""
    out = []
    seen: dict[str, int] = {}
    for (tgt1, _c1), vec1 in ordered:
        seen.setdefault(tgt1, 0)
        for idx1 in (0, 1):
            for per1 in vec1:
                if not (idx1 < len(per1) and per1[idx1].stall):
                    continue
                if tgt1 == tgt and idx1 == idx and seen[tgt1] != k:
                    out.append((seen[tgt1], per1[idx1].reuse))
                seen[tgt1] += 1
    return out


def node_cycles(arch: Hierarchy, n_it: int, merged: LevelCosts, port_overwrite: bool) -> int:
    """Compute window, largest ramps and per-iteration stalls of a node: its total cycles.

    ``port_overwrite`` (compatibility deviation): the first level's write-port stalls replace
    its read-port stalls instead of taking the larger.
    """
    out = Cost.sized(n_it)
    levels = arch.levels
    for a, (_lv, cost) in enumerate(sorted(merged.items(), key=lambda kv: levels[kv[0]].rank)):
        for idx in (0, 1):
            c = cost[idx]
            if not c.stall or c.compute_time == 0:
                continue
            out.ramp_up = max(out.ramp_up, c.ramp_up)
            out.ramp_down = max(out.ramp_down, c.ramp_down)
            out.compute_time = max(out.compute_time, c.compute_time)
            f = c.reuse
            first = a == 0 and (idx == 0 or port_overwrite)
            st, cp, os_ = c.stall, c.compulsory, out.stall
            for i in range(-(-idx // f) * f, n_it, f):  # the multiples of f from idx
                v = st[i // f] + cp[i // f]
                os_[i] = v if first else max(os_[i], v)
    total = out.compute_time + out.ramp_up + out.ramp_down + sum(out.stall)
    return total & 0xFFFFFFFF
