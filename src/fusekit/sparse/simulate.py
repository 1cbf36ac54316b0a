"""Regions and programs on the streaming machine: fusion replays, forks, lanes and cycles.

A region is one streaming graph: its statements' lowered graphs (:mod:`fusekit.sparse.streams`)
run concurrently, a fused producer feeding its consumer's stream instead of memory. Fusion
follows the region's fusion table (:mod:`fusekit.sparse.fusion_table`): a producer is replayed
at its consumer's *context depth* (factored iteration), and since its streams for one binding of
the context are identical at every replay, the simulator runs them once and weights their token
counts by the number of replays; a stream read by several consumers forks instead where one row
of it fits in a FIFO. Parallel lanes split the points at and below one level of the region's
root. Regions run one after another, their intermediates through memory; the cycle model of a
region is in :class:`RegionResult`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fusekit.errors import expected
from fusekit.sparse.formats import SparseTensor, restore
from fusekit.sparse.fusion_table import bound_prefix, context_depth, fork_granularity, fusion_legal
from fusekit.sparse.machine import Machine
from fusekit.sparse.program import Operand, Program, Statement
from fusekit.sparse.schedule import Schedule
from fusekit.sparse.streams import Trace, evaluate


@dataclass(frozen=True, slots=True)
class PrimResult:
    """A primitive's tokens in a simulated region.

    Attributes:
        statement: the statement it belongs to.
        name: its name within the statement.
        kind: its kind.
        tokens: tokens sent over all lanes, ``D`` included (a writer: tokens taken), as the
            per-token machine counts them (:func:`fusekit.sparse.graph.run_statement`).
        busy_cycles: cycles its busiest lane is occupied: it fires (one step per cycle: a token
            sent, or one taken without sending, such as an intersecter's step past a
            coordinate) or waits on a joiner above to close a fiber
            (:attr:`~fusekit.sparse.stream_counts.Prim.wait`).
        memory: whether its tokens are memory words.
        firings: cycles it fires over all lanes.
    """

    statement: str
    name: str
    kind: str
    tokens: float
    busy_cycles: float
    memory: bool
    firings: float = 0.0


@dataclass(frozen=True, slots=True)
class RegionResult:
    """One region (one streaming graph) simulated.

    The cycle model (:func:`region_cycles`)::

        compute_cycles = max_p busy_p (+ drain)             one token per primitive per cycle
        memory_cycles  = word_bytes * sum_{p reads/writes memory} tokens_p / bandwidth
        fill_cycles    = latency * stages + memory_latency * memory_levels
        cycles         = max(compute_cycles, memory_cycles) + fill_cycles

    ``busy_p`` counts the cycles primitive ``p`` fires and those it waits on an intersecter
    above it; ``drain`` is what the sparse accumulator of the region's last statement still
    sends after its input ends (:attr:`~fusekit.sparse.streams.Trace.drain_cycles`);
    ``stages`` is the longest chain of primitives a token crosses, one channel each: two per
    level (a scanner, then the joiner, locator or repeater feeding the next level's), three for
    the values (array, ALU or reducer, writer), through every fused producer. Checked against
    the per-token machine in ``tests/sparse/test_graph.py``.
    """

    statements: tuple[str, ...]
    prims: tuple[PrimResult, ...]
    compute_cycles: float
    memory_cycles: float
    fill_cycles: float
    cycles: float
    flops: float
    memory_bytes: float


_FLOP_KINDS = ("alu", "reducer", "spacc")


def _stored_value(t: SparseTensor) -> SparseTensor | np.ndarray:
    """Dense tensors are read by random access (located), sparse ones scanned."""
    if not t.is_dense:
        return t
    return t.values.reshape(t.shape) if t.order == tuple(range(t.rank)) else t.to_dense()


def simulate_region(
    program: Program,
    statements: tuple[Statement, ...],
    orders: dict[str, tuple[str, ...]],
    values: dict[str, SparseTensor],
    machine: Machine,
    par: tuple[str, int] | None = None,
    keep: frozenset[str] = frozenset(),
) -> RegionResult:
    """Simulate one fused region and add its outputs to ``values``.

    Args:
        program: the program (for shapes).
        statements: the region's statements in a topological order.
        orders: the dataflow order of each statement.
        values: every tensor computed or stored so far; the region's outputs are added.
        machine: the machine.
        par: ``(var, factor)``: replicate the levels at and below the root statement's variable
            ``var`` ``factor`` times; points go to lane ``coordinate % factor``.
        keep: outputs that must be written to memory even if consumed inside the region.

    Returns:
        The region's primitives and cycles.
    """
    names = {st.out for st in statements}
    consumers: dict[str, list[tuple[Statement, tuple[str, ...]]]] = {n: [] for n in names}
    for st in statements:
        for o in st.operands:
            if o.tensor in names:
                consumers[o.tensor].append((st, o.vars))
    materialise = {st.out: 0 for st in statements}
    for st in statements:
        for o in st.operands:
            if o.tensor in names:
                d = context_depth(orders[st.out], o.vars)
                materialise[st.out] = max(materialise[st.out], d)
                producer = program.producer(o.tensor)
                assert producer is not None
                b = len(bound_prefix(orders[st.out], o.vars, producer.out_vars))
                materialise[producer.out] = max(materialise[producer.out], b)
                if not fusion_legal(orders[st.out], o.vars, producer, orders[producer.out]):
                    prefix = bound_prefix(orders[st.out], o.vars, producer.out_vars)
                    raise ValueError(
                        expected(
                            f"region {sorted(names)}",
                            f"order of {producer.out}",
                            f"starting with {prefix} and emitting outputs as {st.out} reads them",
                            orders[producer.out],
                        )
                    )
    lanes = par[1] if par else 1
    for st in statements:
        if par and not consumers[st.out] and par[0] in orders[st.out]:
            materialise[st.out] = max(materialise[st.out], orders[st.out].index(par[0]) + 1)
    traces: dict[str, Trace] = {}
    for st in statements:
        tensors = {o.tensor: _stored_value(values[o.tensor]) for o in st.operands}
        stored = frozenset(o.tensor for o in st.operands if o.tensor not in names)
        traces[st.out] = evaluate(
            st, orders[st.out], tensors, program.extents(st), materialise[st.out], stored
        )
        values[st.out] = traces[st.out].value
    # weights, consumers first
    weights: dict[str, list[np.ndarray]] = {}
    replicated: dict[str, int] = {}
    prefix_depth: dict[str, int] = {st.out: 0 for st in statements}
    for st in reversed(statements):
        tr = traces[st.out]
        if not consumers[st.out]:
            base = np.ones((lanes, 1))
            split = 0
            if par and par[0] in tr.order:
                t_v = tr.order.index(par[0]) + 1
                if t_v < len(tr.crds):
                    lane = tr.crds[t_v][par[0]] % lanes
                    split = t_v
                    w = tr.weights(0, np.ones((1, 1)))
                    base_t = np.zeros((lanes, len(lane)))
                    base_t[lane, np.arange(len(lane))] = w[t_v][0]
                    full = tr.weights(t_v, base_t)
                    full[:t_v] = [np.repeat(x / lanes, lanes, axis=0) for x in w[:t_v]]
                    weights[st.out] = full
                    replicated[st.out] = split
                    continue
            weights[st.out] = tr.weights(0, base / lanes if lanes > 1 else base)
            replicated[st.out] = 10**9 if lanes > 1 else 0
            continue
        prefixes = {len(bound_prefix(orders[c.out], a, st.out_vars)) for c, a in consumers[st.out]}
        if len(prefixes) != 1:
            raise ValueError(
                expected(
                    f"region {sorted(names)}",
                    f"consumers of {st.out}",
                    "one context depth",
                    prefixes,
                )
            )
        b = prefixes.pop()
        prefix_depth[st.out] = b
        size = 1 if b == 0 else len(tr.parents[b])
        keys_p = _keys(tr.crds[b], tr.order[:b], program.extents(st))
        per_consumer = []
        rep = 10**9
        for cons, access in consumers[st.out]:
            ctr = traces[cons.out]
            d = context_depth(orders[cons.out], access)
            rename = dict(zip(access, st.out_vars, strict=True))
            bound = [v for v in orders[cons.out][:d] if v in rename]
            wc = weights[cons.out][d]
            base = np.zeros((lanes, size))
            if b == 0:
                base += wc.sum(axis=1, keepdims=True)
            else:
                keys_c = _keys(
                    {rename[v]: ctr.crds[d][v] for v in bound}, tr.order[:b], program.extents(st)
                )
                at = np.searchsorted(keys_p, keys_c)
                hit = (at < len(keys_p)) & (keys_p[np.minimum(at, len(keys_p) - 1)] == keys_c)
                for k_lane in range(lanes):
                    base[k_lane] += np.bincount(at[hit], weights=wc[k_lane][hit], minlength=size)
            per_consumer.append(base)
            if replicated[cons.out] <= d:
                rep = 0
        g = fork_granularity(st, orders[st.out], consumers[st.out])
        base = _fork_or_replay(tr, b, g, per_consumer, machine.fifo_depth)
        replicated[st.out] = rep
        weights[st.out] = tr.weights(b, base)
    # primitives
    prims: list[PrimResult] = []
    for st in statements:
        tr, w = traces[st.out], weights[st.out]
        written = st.out in keep or not consumers[st.out]
        for p in tr.prims:
            if p.kind == "writer" and not written:
                continue
            if p.depth < prefix_depth[st.out]:
                # a level the consumer binds: located once per context point, not scanned
                per_lane = w[p.depth + 1].sum(axis=1)
                idle = idle_wait = np.zeros(lanes)
            else:
                per_lane = _weigh(w, ((p.depth, p.counts), *p.extra), prefix_depth[st.out], lanes)
                idle = _weigh(w, p.idle, prefix_depth[st.out], lanes)
                idle_wait = idle + _weigh(w, p.wait, prefix_depth[st.out], lanes)
            tokens, firings = float(per_lane.sum()), float((per_lane + idle).sum())
            on_lanes = p.depth >= replicated[st.out] and lanes > 1
            occupied = per_lane + (idle_wait if p.depth >= prefix_depth[st.out] else idle)
            busy = float(occupied.max()) if on_lanes else float(occupied.sum())
            prims.append(
                PrimResult(
                    st.out, p.name, p.kind, tokens + 1.0, busy + 1.0, p.memory, firings + 1.0
                )
            )
    return _region_cycles(statements, traces, prims, machine, names)


def _weigh(
    w: list[np.ndarray], terms: tuple[tuple[int, np.ndarray], ...], prefix: int, lanes: int
) -> np.ndarray:
    """Per lane, the tokens of per-point ``terms`` weighted by the points' replays.

    Terms above the consumer's bound prefix are not streamed by a fused producer.
    """
    out = np.zeros(lanes)
    for d, c in terms:
        if d >= prefix and len(c):
            out = out + w[d] @ c
    return out


def _fork_or_replay(
    tr: Trace, b: int, g: int, per_consumer: list[np.ndarray], fifo_depth: int
) -> np.ndarray:
    """Replays of a producer's streams, per binding of its context (depth ``b``).

    One consumer: its context count. Several consumers binding the same context: the stream
    forks (runs once per context, as often as the most demanding consumer asks) where the
    producer's output for one binding of its first ``g`` variables (see
    :func:`fork_granularity`) fits in a FIFO of ``fifo_depth`` tokens, so that the consumer
    waiting for another's reduction can buffer it; elsewhere it is replayed once per consumer.
    """
    if len(per_consumer) == 1:
        return per_consumer[0]
    total = np.sum(per_consumer, axis=0)
    most = np.max(per_consumer, axis=0)
    writer = next(p for p in tr.prims if p.name == f"write {tr.statement.out}")
    tokens = writer.counts
    g = max(b, min(g, writer.depth))
    for t in range(writer.depth, g, -1):
        tokens = np.bincount(
            tr.parents[t], weights=tokens, minlength=len(tr.parents[t - 1]) if t - 1 > 0 else 1
        )
    worst = tokens
    for t in range(g, b, -1):
        up = np.zeros(len(tr.parents[t - 1]) if t - 1 > 0 else 1)
        np.maximum.at(up, tr.parents[t], worst)
        worst = up
    fits = worst <= fifo_depth
    return np.asarray(np.where(fits[None, :], most, total))


def _keys(
    crds: dict[str, np.ndarray], vars_: tuple[str, ...], extents: dict[str, int]
) -> np.ndarray:
    if not vars_:
        return np.zeros(1, dtype=np.int64)
    return np.ravel_multi_index(tuple(crds[v] for v in vars_), tuple(extents[v] for v in vars_))


def _region_cycles(
    statements: tuple[Statement, ...],
    traces: dict[str, Trace],
    prims: list[PrimResult],
    machine: Machine,
    names: set[str],
) -> RegionResult:
    """The region's cycles: ``max(compute, memory) + fill`` (see :class:`RegionResult`)."""
    # a sparse accumulator at the region's end sends its last results after its input ends
    roots = {
        st.out
        for st in statements
        if not any(st.out in (o.tensor for o in c.operands) for c in statements)
    }
    drain = max((traces[s].drain_cycles for s in roots), default=0.0)
    compute_cycles = max(
        (
            p.busy_cycles + (0.0 if p.kind == "spacc" and p.statement in roots else drain)
            for p in prims
        ),
        default=0.0,
    )
    memory_bytes = machine.word_bytes * sum(p.tokens for p in prims if p.memory)
    mem = machine.memory
    memory_cycles = memory_bytes / mem.bytes_per_cycle if mem else 0.0
    depth: dict[str, int] = {}
    for st in statements:
        own = 2 * len(traces[st.out].order) + 3
        depth[st.out] = own + max(
            (depth[o.tensor] for o in st.operands if o.tensor in names), default=0
        )
    memory_levels = 1 + max(
        (len(o.vars) for st in statements for o in st.operands if o.tensor not in names), default=0
    )
    fill_cycles = machine.channel_latency_cycles * max(depth.values()) + (
        mem.latency_cycles * memory_levels if mem else 0
    )
    flops = sum(p.firings for p in prims if p.kind in _FLOP_KINDS)
    return RegionResult(
        tuple(st.out for st in statements),
        tuple(prims),
        compute_cycles,
        memory_cycles,
        float(fill_cycles),
        max(compute_cycles, memory_cycles) + fill_cycles,
        flops,
        memory_bytes,
    )


# -- whole programs -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SimResult:
    """A program simulated under one schedule.

    Attributes:
        schedule: the schedule.
        regions: one result per region, in execution order.
        cycles: the sum of the regions' cycles (regions run one after the other).
        flops: ALU, reducer and accumulator tokens (one operation each).
        memory_bytes: bytes moved to and from memory.
        outputs: the program's outputs, dense.
    """

    schedule: Schedule
    regions: tuple[RegionResult, ...]
    cycles: float
    flops: float
    memory_bytes: float
    outputs: dict[str, np.ndarray]


def simulate(program: Program, schedule: Schedule, machine: Machine | None = None) -> SimResult:
    """Simulate a program under a schedule.

    Args:
        program: the program.
        schedule: region cuts, dataflow and storage orders, parallelism.
        machine: the machine; :class:`Machine()` by default.

    Returns:
        Cycles per region and in total, FLOPs, memory bytes and the outputs.

    Raises:
        ValueError: if the schedule does not cover every statement exactly once, or an order
            is illegal (naming the statement, the tensor and the level).
    """
    machine = machine or Machine()
    covered = [s for r in schedule.regions for s in r]
    if sorted(covered) != sorted(st.out for st in program.statements):
        raise ValueError(expected("simulate", "schedule.regions", "every statement once", covered))
    orders = dict(schedule.orders)
    storage = {(s, t): o for s, t, o in schedule.storage}
    values: dict[str, SparseTensor] = dict(program.inputs)
    later_reads = _reads_after(program, schedule.regions)
    results = []
    for k, region in enumerate(schedule.regions):
        sts = tuple(st for st in program.statements if st.out in region)
        local = dict(values)
        for st in sts:
            for o in st.operands:
                if (st.out, o.tensor) in storage:
                    alias = f"{o.tensor}_{''.join(map(str, storage[(st.out, o.tensor)]))}"
                    if alias not in local:
                        local[alias] = restore(values[o.tensor], storage[(st.out, o.tensor)])
        sts = tuple(_rename(st, storage) for st in sts)
        root = next(
            st
            for st in reversed(sts)
            if not any(st.out in (o.tensor for o in c.operands) for c in sts)
        )
        root_order = orders[root.out]
        par = (
            (root_order[schedule.par[0]], schedule.par[1])
            if schedule.par and schedule.par[0] < len(root_order)
            else None
        )
        keep = frozenset(s for s in region if s in later_reads[k] or s in program.outputs)
        result = simulate_region(
            _with_aliases(program, local), sts, orders, local, machine, par, keep
        )
        for s in region:
            values[s] = local[s]
        results.append(result)
    outputs = {name: values[name].to_dense() for name in program.outputs}
    return SimResult(
        schedule,
        tuple(results),
        sum(r.cycles for r in results),
        sum(r.flops for r in results),
        sum(r.memory_bytes for r in results),
        outputs,
    )


def _rename(st: Statement, storage: dict[tuple[str, str], tuple[int, ...]]) -> Statement:
    ops = tuple(
        Operand(f"{o.tensor}_{''.join(map(str, storage[(st.out, o.tensor)]))}", o.vars)
        if (st.out, o.tensor) in storage
        else o
        for o in st.operands
    )
    return Statement(st.out, st.out_vars, ops, st.combine, st.reduce, st.epilogue)


def _with_aliases(program: Program, values: dict[str, SparseTensor]) -> Program:
    """The program with re-stored inputs added, so statements may read them by alias."""
    extra = {n: t for n, t in values.items() if n not in program.shapes}
    if not extra:
        return program
    shapes = {**program.shapes, **{n: t.shape for n, t in extra.items()}}
    clone = object.__new__(Program)
    object.__setattr__(clone, "name", program.name)
    object.__setattr__(clone, "statements", program.statements)
    object.__setattr__(clone, "inputs", {**program.inputs, **extra})
    object.__setattr__(clone, "outputs", program.outputs)
    object.__setattr__(clone, "shapes", shapes)
    return clone


def _reads_after(program: Program, regions: tuple[tuple[str, ...], ...]) -> list[set[str]]:
    """Per region, the tensors read by later regions."""
    out = []
    for k in range(len(regions)):
        later = {
            o.tensor for r in regions[k + 1 :] for s in r for o in _statement(program, s).operands
        }
        out.append(later)
    return out


def _statement(program: Program, name: str) -> Statement:
    st = program.producer(name)
    if st is None:
        raise ValueError(expected("simulate", "region statement", "a statement's output", name))
    return st
