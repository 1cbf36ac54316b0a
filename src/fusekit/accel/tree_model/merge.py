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
#: A per-tensor port cost that stalls: its child level, its port (0 read, 1 write), the cost.
Entry = tuple[str, int, Cost]


def sorted_pairs(arch: Hierarchy, pairs: PortCosts) -> Ordered:
    """``pairs`` by the creation order of target, then child level (COMET's map order)."""
    levels = arch.levels
    return sorted(pairs.items(), key=lambda kv: (levels[kv[0][0]].rank, levels[kv[0][1]].rank))


def merge_levels(
    arch: Hierarchy, n_it: int, pairs: PortCosts, port_use: dict[str, dict[int, int]]
) -> LevelCosts:
    """Merge per-tensor costs into per-target-level costs, windows shared per port."""
    merged: LevelCosts = {}
    for tgt, entries in _entries(sorted_pairs(arch, pairs)).items():
        merged[tgt] = [Cost.sized(n_it), Cost.sized(n_it)]
        windows = _port_windows(arch, entries, port_use)
        for k, (_chl, idx, p) in enumerate(entries):
            _merge_port(merged[tgt][idx], p, k, entries, windows, n_it)
    return merged


def _entries(ordered: Ordered) -> dict[str, list[Entry]]:
    """Per target level, its port costs that stall, in merge order (pair, port, tensor)."""
    out: dict[str, list[Entry]] = {}
    for (tgt, chl), vec in ordered:
        entries = out.setdefault(tgt, [])
        for idx in (0, 1):
            for per in vec:
                if len(per) > idx and per[idx].stall:
                    entries.append((chl, idx, per[idx]))
    return out


def _port_windows(
    arch: Hierarchy, entries: list[Entry], port_use: dict[str, dict[int, int]]
) -> list[list[int]]:
    """Each cost's window, less what the children hold of a port shared with their parent."""
    windows = []
    for chl, idx, p in entries:
        child = arch.levels[chl]
        w = list(p.window)
        if (
            not child.is_compute
            and port_use
            and child.attrs.get("parent_child_ports_shared", False)
        ):
            cost = port_use.get(chl, {}).get(idx, 0)
            w = [e - cost if e > cost else 0 for e in w]
        windows.append(w)
    return windows


def _merge_port(
    m: Cost, p: Cost, k: int, entries: list[Entry], windows: list[list[int]], n_it: int
) -> None:
    """Add tensor cost ``p`` (the level's ``k``-th entry) into the level's port cost ``m``.

    Per iteration ``i`` from the port's index and each of the level's iterations
    ``i f .. i f + f - 1`` it covers (``f`` its reuse): the level's window is the largest of
    the tensors', a tensor not hidden adds its stall as compulsory, and the transfer's excess
    over its window (both per reuse) adds to the level's stall.
    """
    m.ramp_up += p.ramp_up
    m.ramp_down += p.ramp_down
    m.compute_time = max(m.compute_time, p.compute_time)
    if m.reuse == 0:
        m.reuse = 1
    if p.reuse > 0:
        m.reuse = min(m.reuse, p.reuse)
    m.cumm += p.cumm
    f = p.reuse
    idx = entries[k][1]
    wk = windows[k]
    its = min(n_it, len(wk))
    if f == 1:
        _add_unit_reuse(m, p, wk, idx, its)
    else:
        _add_reused(m, p, wk, idx, its)
    hidden = min(its, len(p.mem_net))
    if not p.hide or hidden <= idx:
        return
    # a transfer hidden under the compute window uses it up for the
    # level's other tensors on the same port
    used = [x // f for x in p.mem_net[idx:hidden]]
    for kk, (_chl, idx1, other) in enumerate(entries):
        if idx1 == idx and kk != k:
            _use_up(windows[kk], used, idx, f, other.reuse)


def _add_unit_reuse(m: Cost, p: Cost, wk: list[int], lo: int, hi: int) -> None:
    """:func:`_merge_port`'s iterations ``lo .. hi - 1`` of a tensor without reuse (``f = 1``)."""
    mw, mc, ms = m.window, m.compulsory, m.stall
    pw, ps, pn = p.window, p.stall, p.mem_net
    top = min(hi, len(pw), len(mw))
    if top > lo:  # the largest window (a window of 0 is none)
        pairs = zip(mw[lo:top], pw[lo:top], strict=True)
        mw[lo:top] = [x if x > 0 and x > w else w for w, x in pairs]
    if not p.hide:
        top = min(hi, len(pw), len(ps), len(mc))
        if top > lo:  # the tensor's own stalls, not hidden
            mc[lo:top] = [c + x for c, x in zip(mc[lo:top], ps[lo:top], strict=True)]
    top = min(hi, len(ms))
    if top > lo:  # the transfer's excess over its window
        moved = pn[lo:top]
        moved += [0] * (top - lo - len(moved))  # past the tensor's iterations: nothing moves
        triples = zip(ms[lo:top], moved, wk[lo:top], strict=True)
        ms[lo:top] = [s + (x - w) if x > w else s for s, x, w in triples]


def _add_reused(m: Cost, p: Cost, wk: list[int], lo: int, hi: int) -> None:
    """:func:`_merge_port`'s iterations ``lo .. hi - 1`` of a tensor reused ``f`` times."""
    f = p.reuse
    mw, mc, ms = m.window, m.compulsory, m.stall
    pw, ps, pn = p.window, p.stall, p.mem_net
    n_mw, n_mc, n_ms, n_pw, n_ps, n_pn = map(len, (mw, mc, ms, pw, ps, pn))
    for i in range(lo, hi):
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


def _use_up(win: list[int], used: list[int], lo: int, f: int, kf: int) -> None:
    """Take ``used[i - lo]`` off window ``win`` (reuse ``kf``) at each level iteration of ``i``.

    Iteration ``i`` covers the level's iterations ``i f .. i f + f - 1``, the ``m``-th of them
    window entry ``m // kf``; no entry goes below 0.
    """
    n_win = len(win)
    if f == 1 and kf == 1:
        top = min(lo + len(used), n_win)
        if top > lo:
            pairs = zip(win[lo:top], used[: top - lo], strict=True)
            win[lo:top] = [w - u if w > u else 0 for w, u in pairs]
        return
    for i, u in enumerate(used, lo):
        for mi in range(i * f, i * f + f):
            nn = mi // kf
            if nn < n_win:
                win[nn] = max(win[nn] - u, 0)


def node_cycles(arch: Hierarchy, n_it: int, merged: LevelCosts, port_overwrite: bool) -> int:
    """Compute window, largest ramps and per-iteration stalls of a node: its total cycles.

    Per level and port, the iterations from the port's index that are multiples of its reuse
    ``f`` stall by its stall plus compulsory stall (per ``f`` iterations); the node's stall at
    an iteration is the largest over levels and ports. ``port_overwrite`` (compatibility
    deviation): the first level's write-port stalls replace its read-port stalls instead of
    taking the larger.
    """
    stall = [0] * n_it
    ramp_up = ramp_down = compute_time = 0
    levels = arch.levels
    for a, (_lv, cost) in enumerate(sorted(merged.items(), key=lambda kv: levels[kv[0]].rank)):
        for idx in (0, 1):
            c = cost[idx]
            if not c.stall or c.compute_time == 0:
                continue
            ramp_up = max(ramp_up, c.ramp_up)
            ramp_down = max(ramp_down, c.ramp_down)
            compute_time = max(compute_time, c.compute_time)
            f = c.reuse
            first = a == 0 and (idx == 0 or port_overwrite)
            start = -(-idx // f) * f  # the first multiple of f from idx
            slots = range(start, n_it, f)
            j0, j1 = start // f, start // f + len(slots)
            per = [s + x for s, x in zip(c.stall[j0:j1], c.compulsory[j0:j1], strict=True)]
            if first:
                stall[start:n_it:f] = per
            else:
                pairs = zip(stall[start:n_it:f], per, strict=True)
                stall[start:n_it:f] = [v if v > o else o for o, v in pairs]
    total = compute_time + ramp_up + ramp_down + sum(stall)
    return total & 0xFFFFFFFF
