"""The estimator: FLOPs, bytes and cycles of a schedule from level statistics, without simulating.

Every tensor's level ``l`` in a mode order has an occupancy ``rho_l`` (stored coordinates per
parent over the level's size). A statement's loop nest, in its order, has an expected number of
points per depth, with independent operands::

    N_0 = 1
    N_t = N_{t-1} * extent(v_t) * rho(v_t)      rho = prod_o rho_o (intersection, mul)
                                                rho = 1 - prod_o (1 - rho_o) (union, add/sub/max)

and each primitive handles the tokens of its stream as the per-token machine counts them
(:mod:`fusekit.sparse.graph`): the points, one stop per fiber, one stop per expected empty fiber
above (``E_d = N_d (1 - rho_{d+1})^extent``) and the done token. A scanner of operand ``o`` at
depth ``t`` sends ``N_{t-1} extent rho_o + stops_t`` (plus an ``N`` where a unioner one level up
found ``o`` absent), an intersecter steps over the union of its inputs, a repeater or an
iterator sends ``N_t + stops_t``, the arrays and ALUs the value stream ``N_T + stops_T``, a
reducer takes that and sends a value per stop and the stops one level up, a sparse accumulator
sends the output entries and a stop per reduction, and writers take what they store. A fused
producer is replayed ``N_consumer(context) / N_producer(prefix)`` times (forked instead of
replayed when several consumers share its context and one binding's output fits in a FIFO).
Then, as in the simulator (FuseFlow's machine model, one token per primitive per cycle)::

    cycles = sum_regions max(max_p tokens_p / lanes_p, word_bytes * memory_tokens / bandwidth)
             + latency * stages + memory_latency * memory_levels

with ``stages = sum over the longest chain of fused statements of (2 * levels + 3)``.
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
    tokens: list[tuple[str, float, bool, int]]  # kind, busy cycles (= tokens), memory, depth
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
    """Expected points per depth and tokens per primitive, as the per-token machine counts them.

    A stream at depth ``t`` carries its points, one stop per fiber and one stop per empty fiber
    above (``E_d = N_d (1 - rho_{d+1})^extent``: no coordinate of the fiber survives); a scanner
    given an absent reference (a unioner's missing side one level up) sends ``N`` and a stop.
    """
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
    points: list[float] = [1.0]  # N_t
    empty: list[float] = []  # E_d: the expected empty fibers under depth d
    tokens: list[tuple[str, float, bool, int]] = []
    absent: dict[int, float] = {}  # operand -> share of the points where it is absent (N)

    def stops(s: int) -> float:
        return points[s - 1] + sum(empty[: s - 1]) if s >= 1 else 0.0

    for t, v in enumerate(order, start=1):
        n = points[-1]
        fiber_stops = n + sum(empty)  # one per fiber and one per empty fiber above
        joined = union and len({k for k, _ in rho_at}) > 1  # sparse operands scan every level
        scans = [
            (k, rho_at[(k, v)])
            for k in range(len(st.operands))
            if (k, v) in rho_at and (rho_at[(k, v)] < 1.0 or joined)
        ]
        if scans:
            rs = [r for _, r in scans]
            either = 1 - float(np.prod([1 - r for r in rs]))
            rho = either if union else float(np.prod(rs))
            nulls = {k: n * absent.get(k, 0.0) for k, _ in scans}
            for k, r in scans:
                stored = st.operands[k].tensor not in fused
                tokens.append(("scanner", n * ext[v] * r + fiber_stops + nulls[k] + 1, stored, t))
            if len(scans) > 1:  # one step per coordinate of either side, per stop, per N
                steps = n * ext[v] * either + fiber_stops + sum(nulls.values()) + 1
                tokens.append(("intersecter", steps, False, t))
            absent = (
                {k: (1 - r) * (1 - (1 - either) / (1 - r)) / either for k, r in scans}
                if union and len(scans) > 1 and either > 0
                else {}
            )
        else:
            rho = 1.0
            tokens.append(("iterator", n * ext[v] + fiber_stops + 1, False, t))
        new = n * ext[v] * rho
        for o in st.operands:
            if v not in o.vars:
                tokens.append(("repeater", new + fiber_stops + 1, False, t))
        empty.append(n * (1 - rho) ** ext[v])
        points.append(new)
    last = len(order)
    values = points[last] + stops(last) + 1
    for o in st.operands:
        tokens.append(("array", values, o.tensor not in fused, last))
    tokens += [("alu", values, False, last)] * max(len(st.operands) - 1, 0)
    out_density = (
        float(stats.patterns.masks[st.out].mean()) if st.out in stats.patterns.masks else 1.0
    )
    out_points = float(np.prod([ext[v] for v in st.out_vars])) * out_density
    first = min((order.index(v) for v in st.reduce_vars), default=last)
    final = values
    if st.reduce_vars and all(order.index(v) >= len(st.out_vars) for v in st.reduce_vars):
        for j in range(len(st.reduce_vars)):  # a reducer per trailing reduced level
            sent = stops(last - j) + stops(last - j - 1) + 1
            tokens.append(("reducer", final + stops(last - j - 1), False, last))
            final = sent
    elif st.reduce_vars:  # a sparse accumulator: the sums of each reduction, then a stop
        tokens.append(("spacc", values, False, last))
        final = out_points + stops(first + 1) + 1
    if st.epilogue:
        tokens.append(("alu", final, False, last))
    tokens.append(("writer", final, True, last))
    for k, v in enumerate(order):
        if v in st.out_vars:
            written = points[k + 1] + stops(k + 1) + 1 if k < first else final
            tokens.append(("writer", written, True, last))
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
            flops += tok if kind in ("alu", "reducer", "spacc") else 0.0
            mem_tokens += tok if memory else 0.0
    memory_bytes = machine.word_bytes * mem_tokens
    mem = machine.memory
    memory_cycles = memory_bytes / mem.bytes_per_cycle if mem else 0.0
    stages: dict[str, int] = {}
    for st in sts:  # two per level, three for the values (see simulate.RegionResult)
        stages[st.out] = (
            2 * len(orders[st.out])
            + 3
            + max((stages[o.tensor] for o in st.operands if o.tensor in names), default=0)
        )
    levels = 1 + max(
        (len(o.vars) for st in sts for o in st.operands if o.tensor not in names), default=0
    )
    fill = machine.channel_latency_cycles * max(stages.values()) + (
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
