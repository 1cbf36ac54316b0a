"""The estimator: FLOPs, bytes and cycles of a schedule from level statistics, without simulating.

Every tensor's level ``l`` in a mode order has an occupancy ``rho_l`` (stored coordinates per
parent over the level's size). A statement's loop nest, in its order, has an expected number of
points per depth, with independent operands::

    N_0 = 1
    N_t = N_{t-1} * extent(v_t) * rho(v_t)      rho = prod_o rho_o (intersection, mul)
                                                rho = 1 - prod_o (1 - rho_o) (union, add/sub/max)

and each primitive handles about ``N`` tokens plus one stop per fiber: a scanner of operand
``o`` at depth ``t`` ``N_{t-1} (extent * rho_o + 1)``, a repeater ``N_t + N_{t-1}``, the value
primitives (arrays, ALUs, reducer) ``N_T``, a writer the output's stored entries. A fused
producer is replayed ``N_consumer(context) / N_producer(prefix)`` times (forked instead of
replayed when several consumers share its context and one binding's output fits in a FIFO).
Then, as in the simulator (FuseFlow's machine model, one token per primitive per cycle)::

    cycles = sum_regions max(max_p tokens_p / lanes_p, word_bytes * memory_tokens / bandwidth)
             + 2 * depth + latency * memory_levels
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fusekit.sparse.candidates import Patterns
from fusekit.sparse.fusion_table import bound_prefix, context_depth, fork_granularity
from fusekit.sparse.machine import Machine
from fusekit.sparse.program import Program, Statement
from fusekit.sparse.schedule import Schedule


@dataclass(frozen=True, slots=True)
class Estimate:
    """The estimator's answer for one schedule.

    Attributes:
        cycles: estimated cycles (sum over regions).
        flops: estimated ALU and reduction operations.
        memory_bytes: estimated bytes to and from memory.
        region_cycles: per region.
    """

    cycles: float
    flops: float
    memory_bytes: float
    region_cycles: tuple[float, ...]

    def explain(self) -> str:
        """One line for reports."""
        return f"{self.cycles:,.0f} cycles, {self.flops:,.0f} ops, {self.memory_bytes / 1e6:.2f} MB"


@dataclass(eq=False)
class Statistics:
    """Level occupancies of every tensor in any mode order, computed once and cached."""

    program: Program
    patterns: Patterns
    _cache: dict[tuple[str, tuple[int, ...]], list[float]] = field(default_factory=dict)

    def occupancy(self, name: str, order: tuple[int, ...]) -> list[float]:
        """``rho_l`` of each level of ``name`` stored in mode ``order``."""
        key = (name, order)
        if key not in self._cache:
            if name in self.program.inputs:
                coords, _ = self.program.inputs[name].coords()
            else:
                coords = np.argwhere(self.patterns.masks[name])
            shape = self.program.shapes[name]
            rhos, parent, n_parent = [], np.zeros(len(coords), np.int64), 1
            for dim in order:
                key_l = parent * shape[dim] + coords[:, dim]
                uniq, parent = np.unique(key_l, return_inverse=True)
                rhos.append(len(uniq) / max(n_parent * shape[dim], 1))
                n_parent = len(uniq)
            self._cache[key] = rhos
        return self._cache[key]


@dataclass
class _Nest:
    points: list[float]
    tokens: list[tuple[str, float, bool, int]]  # kind, tokens, memory, depth
    out_points: float


def _nest(
    st: Statement,
    order: tuple[str, ...],
    program: Program,
    stats: Statistics,
    stored_order: dict[str, tuple[int, ...]],
    fused: set[str],
    storage: dict[tuple[str, str], tuple[int, ...]],
) -> _Nest:
    ext = program.extents(st)
    union = st.combine in ("add", "sub", "max")
    rho_at: dict[tuple[int, str], float] = {}
    for k, o in enumerate(st.operands):
        if o.tensor not in stats.patterns.sparse:
            continue
        mode = storage.get(
            (st.out, o.tensor), stored_order.get(o.tensor, tuple(range(len(o.vars))))
        )
        for lvl, r in zip(mode, stats.occupancy(o.tensor, mode), strict=True):
            rho_at[(k, o.vars[lvl])] = r
    n, points, tokens = 1.0, [1.0], []
    for t, v in enumerate(order):
        scans = [
            (k, rho_at[(k, v)])
            for k in range(len(st.operands))
            if (k, v) in rho_at and rho_at[(k, v)] < 1.0
        ]
        if scans:
            rs = [r for _, r in scans]
            rho = 1 - float(np.prod([1 - r for r in rs])) if union else float(np.prod(rs))
            for k, r in scans:
                tokens.append(
                    ("scanner", n * (ext[v] * r + 1), st.operands[k].tensor not in fused, t)
                )
            if len(scans) > 1:
                tokens.append(
                    (
                        "intersecter",
                        n * (ext[v] * (1 - float(np.prod([1 - r for r in rs]))) + 1),
                        False,
                        t,
                    )
                )
        else:
            rho = 1.0
            tokens.append(("iterator", n * (ext[v] + 1), False, t))
        new = n * ext[v] * rho
        for o in st.operands:
            if v not in o.vars:
                tokens.append(("repeater", new + n, False, t))
        n = new
        points.append(n)
    for o in st.operands:
        tokens.append(("array", n, o.tensor not in fused, len(order)))
    tokens += [("alu", n, False, len(order))] * max(len(st.operands) - 1, 0)
    out_density = (
        float(stats.patterns.masks[st.out].mean()) if st.out in stats.patterns.masks else 1.0
    )
    out_points = float(np.prod([ext[v] for v in st.out_vars])) * out_density
    if st.reduce_vars:
        tokens.append(("reducer", n + out_points, False, len(order)))
    if st.epilogue:
        tokens.append(("alu", out_points, False, len(order)))
    tokens.append(("writer", out_points * 1.1, True, len(order)))
    return _Nest(points, tokens, out_points)


def estimate_region(
    program: Program,
    region: tuple[str, ...],
    orders: dict[str, tuple[str, ...]],
    stats: Statistics,
    stored_order: dict[str, tuple[int, ...]],
    machine: Machine,
    par: tuple[int, int] | None = None,
    keep: frozenset[str] = frozenset(),
    storage: tuple[tuple[str, str, tuple[int, ...]], ...] = (),
) -> tuple[float, float, float]:
    """Estimated ``(cycles, flops, memory_bytes)`` of one region.

    ``stored_order`` gives the mode order of every stored tensor; ``storage`` the re-stored
    ones per statement, as in :class:`~fusekit.sparse.schedule.Schedule`.
    """
    sts = [st for st in program.statements if st.out in region]
    names = set(region)
    per_statement = {(s, t): o for s, t, o in storage}
    nests = {
        st.out: _nest(st, orders[st.out], program, stats, stored_order, names, per_statement)
        for st in sts
    }
    consumers = {
        st.out: [(c, o.vars) for c in sts for o in c.operands if o.tensor == st.out] for st in sts
    }
    replays: dict[str, float] = {}
    lane_depth: dict[str, int] = {}
    factor = par[1] if par else 1
    for st in reversed(sts):
        cons = consumers[st.out]
        if not cons:
            replays[st.out] = 1.0
            lane_depth[st.out] = par[0] + 1 if par else 10**9
            continue
        b = len(bound_prefix(orders[cons[0][0].out], cons[0][1], st.out_vars))
        per = [
            replays[c.out]
            * nests[c.out].points[context_depth(orders[c.out], a)]
            / max(nests[st.out].points[b], 1e-9)
            for c, a in cons
        ]
        g = min(max(b, fork_granularity(st, orders[st.out], cons)), len(nests[st.out].points) - 1)
        per_binding_out = nests[st.out].out_points / max(nests[st.out].points[g], 1e-9)
        replays[st.out] = (
            max(per) if len(per) > 1 and per_binding_out <= machine.fifo_depth else sum(per)
        )
        lane_depth[st.out] = (
            0
            if any(lane_depth[c.out] < context_depth(orders[c.out], a) for c, a in cons)
            else 10**9
        )
    busiest, flops, mem_tokens = 0.0, 0.0, 0.0
    for st in sts:
        written = st.out in keep or not consumers[st.out]
        for kind, tok, memory, depth in nests[st.out].tokens:
            if kind == "writer" and not written:
                continue
            tok *= replays[st.out]
            lanes = factor if depth >= lane_depth[st.out] else 1
            busiest = max(busiest, tok / lanes)
            flops += tok if kind in ("alu", "reducer") else 0.0
            mem_tokens += tok if memory else 0.0
    memory_bytes = machine.word_bytes * mem_tokens
    mem = machine.memory
    memory_cycles = memory_bytes / mem.bytes_per_cycle if mem else 0.0
    stages: dict[str, int] = {}
    for st in sts:
        stages[st.out] = (
            len(orders[st.out])
            + 3
            + max((stages[o.tensor] for o in st.operands if o.tensor in names), default=0)
        )
    levels = 1 + max(
        (len(o.vars) for st in sts for o in st.operands if o.tensor not in names), default=0
    )
    fill = 2 * machine.channel_latency_cycles * max(stages.values()) + (
        mem.latency_cycles * levels if mem else 0
    )
    return max(busiest, memory_cycles) + fill, flops, memory_bytes


def estimate(
    program: Program, schedule: Schedule, stats: Statistics, machine: Machine | None = None
) -> Estimate:
    """Estimate a whole schedule (see the module docstring for the formula)."""
    machine = machine or Machine()
    orders = dict(schedule.orders)
    stored = {n: t.order for n, t in program.inputs.items()}
    later = [
        {o.tensor for r in schedule.regions[k + 1 :] for s in r for o in _st(program, s).operands}
        for k in range(len(schedule.regions))
    ]
    cycles, flops, mem, per = 0.0, 0.0, 0.0, []
    for k, region in enumerate(schedule.regions):
        keep = frozenset(s for s in region if s in later[k] or s in program.outputs)
        c, f, m = estimate_region(
            program, region, orders, stats, stored, machine, schedule.par, keep, schedule.storage
        )
        for s in region:
            st = _st(program, s)
            stored[s] = tuple(st.out_vars.index(v) for v in orders[s] if v in st.out_vars)
        cycles, flops, mem = cycles + c, flops + f, mem + m
        per.append(c)
    return Estimate(cycles, flops, mem, tuple(per))


def _st(program: Program, name: str) -> Statement:
    st = program.producer(name)
    assert st is not None
    return st
