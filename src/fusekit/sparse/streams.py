"""One statement's lowered graph, run whole streams at a time with numpy (no step per token).

The statement is lowered level by level in its dataflow order (see :mod:`fusekit.sparse.graph`
for the same primitives one token at a time). At depth ``t`` the simulator holds one row per
point of the iteration space bound so far (the coordinates of the first ``t`` variables and each
operand's reference); a level expands every point's fiber at once (scanner), intersects or
unites the fibers of several operands (intersecter, unioner), locates dense levels (locator) and
repeats the references of the operands the level does not index (repeater). Trailing levels
where no operand is compressed are not materialised: their streams are regular and are counted
in closed form, and their values are computed with ``einsum``. Values are read by reference
(array), combined (ALU), reduced (reducer when the reduced variables are innermost, sparse
accumulator otherwise) and written (level writers).

Every primitive records the tokens it sends per point of one depth (:class:`Prim`); a region
weights them by how often each point is replayed (:mod:`fusekit.sparse.simulate`). The counts are
the per-token machine's, token for token (``tests/sparse/test_graph.py``): a stream carries its
points, one stop per fiber, one stop per empty fiber above (a scanner forwards a stop that closes
no fiber of its own) and the done token; a scanner given an absent reference (``N``) sends ``N``
and then its stop. A primitive fires once per cycle: its busy time is its tokens plus the steps
that send nothing (an intersecter's step past an unmatched coordinate, a unioner's skipped ``N``,
a reducer's inputs, an accumulator's reads) and the cycles a level below an intersecter waits.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

import numpy as np

from fusekit.errors import expected
from fusekit.sparse.formats import LevelKind, SparseTensor, StoredLevel, from_coords
from fusekit.sparse.program import BINARY, UNARY, Statement

_CHUNK_ELEMENTS = 1 << 22


Terms = tuple[tuple[int, np.ndarray], ...]


@dataclass(frozen=True, slots=True)
class Prim:
    """Token counts of one primitive, aligned to the points of one depth.

    Attributes:
        name: unique within the statement, e.g. ``"scan A.k"``.
        kind: scanner, repeater, locator, iterator, intersecter, unioner, array, alu,
            reducer, spacc, writer.
        depth: the depth whose points ``counts`` is aligned to.
        counts: tokens sent per point of that depth (a writer: tokens taken), to be weighted by
            each point's replays.
        memory: whether each token is a word moved to or from memory.
        var: the index variable of the level, or ``None`` for value primitives.
        extra: more tokens sent, as ``(depth, counts)`` pairs aligned to shallower depths: the
            stops that empty fibers above ``depth`` pass down the stream (see :class:`_Counts`).
        idle: cycles it fires without sending, as ``(depth, counts)`` pairs: an intersecter's
            steps past unmatched coordinates, a unioner's skipped ``N``, a reducer's input
            values.
        wait: cycles it waits, as ``(depth, counts)`` pairs: below an intersecter, the level
            under it and everything after wait where the intersecter steps past unmatched
            coordinates and the level has nothing to do (see :func:`_stall`).
    """

    name: str
    kind: str
    depth: int
    counts: np.ndarray
    memory: bool
    var: str | None = None
    extra: Terms = ()
    idle: Terms = ()
    wait: Terms = ()


@dataclass(eq=False)
class Trace:
    """One statement evaluated in one order.

    Attributes:
        statement: the statement.
        order: its dataflow order.
        crds: per materialised depth ``t``, the coordinate of each bound variable at each point.
        parents: per depth ``t >= 1``, each point's parent at depth ``t - 1``.
        prims: the primitives' token counts.
        value: the output tensor.
        out_depth: the depth each output point's representative belongs to (the last
            materialised one) and the index of that point, per output group.
        tail: the variables of the regular tail (not materialised).
        drain_cycles: the results a sparse accumulator still sends after its input ends.
    """

    statement: Statement
    order: tuple[str, ...]
    crds: list[dict[str, np.ndarray]]
    parents: list[np.ndarray]
    prims: list[Prim]
    value: SparseTensor
    group_point: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    tail: tuple[str, ...] = ()
    drain_cycles: float = 0.0

    def weights(self, base_depth: int, base: np.ndarray) -> list[np.ndarray]:
        """Per-depth point weights (replays), given those of the points at ``base_depth``.

        Depths below the base inherit their parent's weight; a depth above it (a prefix the
        consumer binds) is located once per context point, so it gets the sum of its
        children's weights. ``base`` has shape ``[lanes, n_points]``.
        """
        w: list[np.ndarray] = [np.zeros((base.shape[0], 0))] * len(self.crds)
        w[base_depth] = base
        for t in range(base_depth + 1, len(self.crds)):
            w[t] = w[t - 1][:, self.parents[t]]
        for t in range(base_depth - 1, -1, -1):
            size = 1 if t == 0 else len(self.parents[t])
            w[t] = np.stack(
                [np.bincount(self.parents[t + 1], weights=row, minlength=size) for row in w[t + 1]]
            )
        return w


class _Operand:
    """The evaluation state of one operand: its tensor, the level reached, its references."""

    def __init__(
        self,
        index: int,
        tensor: SparseTensor | np.ndarray,
        vars_: tuple[str, ...],
        name: str,
        stored: bool,
    ) -> None:
        self.index = index
        self.name = name
        self.stored = stored
        self.dense_array = tensor if isinstance(tensor, np.ndarray) else None
        self.tensor = tensor if isinstance(tensor, SparseTensor) else None
        self.vars = vars_
        self.level_vars = (
            tuple(vars_[d] for d in self.tensor.order) if self.tensor is not None else vars_
        )
        self.level = 0
        self.pos = np.zeros(1, dtype=np.int64)

    @property
    def is_located(self) -> bool:
        return self.dense_array is not None

    def next_level(self) -> StoredLevel | None:
        assert self.tensor is not None
        return self.tensor.levels[self.level] if self.level < len(self.tensor.levels) else None


def check_order(
    st: Statement, order: tuple[str, ...], tensors: dict[str, SparseTensor | np.ndarray]
) -> None:
    """Check that ``order`` visits every sparse operand's levels in its storage order.

    Raises:
        ValueError: naming the statement, the operand and the level out of order.
    """
    if sorted(order) != sorted(st.vars):
        raise ValueError(
            expected(f"statement {st.out}", "order", f"a permutation of {st.vars}", order)
        )
    for op in st.operands:
        t = tensors[op.tensor]
        if isinstance(t, np.ndarray):
            continue
        level_vars = [op.vars[d] for d in t.order]
        ranks = [order.index(v) for v in level_vars]
        if ranks != sorted(ranks):
            bad = next(k for k in range(1, len(ranks)) if ranks[k] < ranks[k - 1])
            raise ValueError(
                expected(
                    f"statement {st.out}",
                    f"order of {op.tensor} level {bad}",
                    f"{level_vars[bad - 1]} before {level_vars[bad]} (storage order {level_vars})",
                    order,
                )
            )


def evaluate(
    st: Statement,
    order: tuple[str, ...],
    tensors: dict[str, SparseTensor | np.ndarray],
    extents: dict[str, int],
    materialise: int = 0,
    stored: frozenset[str] = frozenset(),
) -> Trace:
    """Run one statement's lowered graph over whole streams.

    Args:
        st: the statement.
        order: its dataflow order (a permutation of ``st.vars``).
        tensors: operand values: stored tensors, or dense arrays for located operands.
        extents: the extent of every variable.
        materialise: materialise at least this many levels (a fused producer's context depth).
        stored: operands read from memory (the others come from a fused producer's stream).

    Returns:
        The trace: per-depth points, token counts of every primitive and the output.
    """
    check_order(st, order, tensors)
    ops = [
        _Operand(k, tensors[o.tensor], o.vars, o.tensor, o.tensor in stored)
        for k, o in enumerate(st.operands)
    ]
    union = st.combine in ("add", "sub", "max")
    sparse_at = {v: [o for o in ops if not o.is_located and _level_is_sparse(o, v)] for v in order}
    if union and sum(not o.is_located for o in ops) > 1:
        # a union of sparse operands scans their dense levels too (see graph.lower_statement)
        sparse_at = {v: [o for o in ops if not o.is_located and v in o.level_vars] for v in order}
    tail_start = len(order)
    while tail_start > max(materialise, 0) and not sparse_at[order[tail_start - 1]]:
        tail_start -= 1
    crds: list[dict[str, np.ndarray]] = [{}]
    parents: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
    prims: list[Prim] = []
    n = 1
    dead: list[np.ndarray] = []  # per depth d: the points with no child at depth d + 1
    gaps: dict[int, np.ndarray] = {}  # per depth: a joiner's steps to its next output
    for t, v in enumerate(order[:tail_start], start=1):
        above = tuple(enumerate(dead))  # the stops of the empty fibers above this level
        levels_before = [o.level for o in ops]
        owner, crd = _expand_level(
            st, v, ops, sparse_at[v], union, extents[v], n, prims, t, above, gaps
        )
        for o, before in zip(ops, levels_before, strict=True):
            if o.level == before and not o.is_located:
                o.pos = o.pos[owner]
        new_crds = {u: c[owner] for u, c in crds[-1].items()}
        new_crds[v] = crd
        for o, before in zip(ops, levels_before, strict=True):
            if o.level != before:
                continue
            kind = "locate" if o.is_located and v in o.vars else "repeat"
            prims.append(
                Prim(
                    f"{kind} {o.name}.{v}",
                    f"{kind[:-1]}or" if kind == "locate" else "repeater",
                    t - 1,
                    _per_parent(owner, n),
                    False,
                    v,
                    above,
                )
            )
        crds.append(new_crds)
        parents.append(owner)
        dead.append((np.bincount(owner, minlength=n) == 0).astype(np.float64))
        n = len(owner)
    counts = _Counts(parents, dead, [extents[v] for v in order[tail_start:]])
    tail = order[tail_start:]
    value, group_point, drain = _values(st, ops, tail, crds[-1], extents, n, prims, order, counts)
    for t, steps in gaps.items():  # a level below a joiner waits on it, and it on that level
        below = [p.counts for p in prims if p.depth == t and p.kind in _LEVEL_KINDS]
        if not below or t >= len(parents):
            continue
        stall = _stall(steps, len(parents[t]), np.max(below, axis=0), parents[t])
        if stall > 0:
            wait = ((0, np.array([stall])),)
            prims = [replace(p, wait=wait) if p.depth >= t else p for p in prims]
    return Trace(st, order, crds, parents, prims, value, group_point, tail, drain)


_LEVEL_KINDS = ("scanner", "iterator", "locator", "repeater")


def _gaps(joined: np.ndarray, merged: np.ndarray, extent: int, n: int) -> np.ndarray:
    """A joiner's steps before each output, in output order: its points, then its stops.

    The joiner steps once per coordinate of the union of its inputs and once per stop; the
    ``i``-th union coordinate of parent ``p`` is step ``i + p``, the stop of ``p`` step
    ``#{union coordinates of parents <= p} + p``. Returns ``[steps before each output point,
    steps before each stop]`` (an output's steps count from the previous output's).
    """
    owner = joined // extent
    point_step = np.searchsorted(joined, merged) + merged // extent
    stop_step = np.searchsorted(owner, np.arange(n), side="right") + np.arange(n)
    steps = np.concatenate([point_step, stop_step])
    order = np.argsort(steps, kind="stable")
    before = np.empty(len(steps))
    before[order] = np.diff(np.concatenate([[-1], steps[order]]))
    return before


def _stall(p_gaps: np.ndarray, n_points: int, work: np.ndarray, owner: np.ndarray) -> float:
    """Cycles lost between a joiner and the level below it (a two-stage flow shop).

    Item ``j`` (an output point, or a stop) takes ``a_j`` joiner steps, then ``b_j`` cycles of
    the level below (its fiber: children and stop; a stop passes in none). In a pipeline the
    pair ends at ``max_k (sum_{j<=k} a_j + sum_{j>=k} b_j)``; the loss is that less
    ``max(sum a, sum b)``.
    """
    a_points, a_stops = p_gaps[:n_points], p_gaps[n_points:]
    # items in stream order: each parent's points, then its stop
    n = len(a_stops)
    pos_points = np.arange(n_points) + owner
    pos_stops = np.searchsorted(owner, np.arange(n), side="right") + np.arange(n)
    a = np.zeros(n_points + n)
    b = np.zeros(n_points + n)
    a[pos_points], a[pos_stops] = a_points, a_stops
    b[pos_points] = work
    end = np.max(np.cumsum(a) + np.cumsum(b[::-1])[::-1], initial=0.0)
    return float(end - max(a.sum(), b.sum()))


class _Counts:
    """Token counts of a statement's streams, as per-point terms of the depths they weigh on.

    The stream at depth ``s`` (a level's coordinates or references, or the values at the
    innermost depth ``T``) is the per-token machine's: its points, one stop per fiber, and one
    stop per empty fiber above, which every scanner below forwards as ``S(k+1)``::

        stream(s) = P_s + stops(s) (+ D)      stops(s) = P_{s-1} + sum_{d <= s-2} E_d

    with ``P_s`` the points at depth ``s`` and ``E_d`` the points at depth ``d`` without a child
    (dead ends). Depths past the materialised ``M`` are a regular tail of extents ``tail``.
    """

    def __init__(self, parents: list[np.ndarray], dead: list[np.ndarray], tail: list[int]):
        self.parents = parents
        self.dead = dead
        self.tail = tail
        self.m = len(parents) - 1
        self.n_m = 1 if self.m == 0 else len(parents[self.m])

    def _above(self, d: int) -> dict[int, np.ndarray]:
        return {k: self.dead[k] for k in range(min(d, len(self.dead)))}

    def points(self, s: int) -> dict[int, np.ndarray]:
        """``P_s``, as children per point of depth ``s - 1`` (tail: per point of ``M``)."""
        if s == 0:
            return {}
        if s > self.m:
            return {self.m: np.full(self.n_m, float(np.prod(self.tail[: s - self.m])))}
        n_parent = 1 if s == 1 else len(self.parents[s - 1])
        return {s - 1: np.bincount(self.parents[s], minlength=n_parent).astype(np.float64)}

    def stops(self, s: int) -> dict[int, np.ndarray]:
        """The stops of the stream at depth ``s``: one per fiber, one per dead end above."""
        if s == 0:
            return {}
        if s > self.m:
            fibers = float(np.prod(self.tail[: s - self.m - 1]))
            return _add({self.m: np.full(self.n_m, fibers)}, self._above(self.m))
        n_parent = 1 if s == 1 else len(self.parents[s - 1])
        return _add({s - 1: np.ones(n_parent)}, self._above(s - 1))

    def stream(self, s: int) -> dict[int, np.ndarray]:
        """Every token of the stream at depth ``s`` but its ``D``."""
        return _add(self.points(s), self.stops(s))

    def at(self, terms: dict[int, np.ndarray], g: int) -> np.ndarray:
        """``terms`` summed per point of depth ``g`` (terms above ``g`` left out)."""
        n_g = 1 if g == 0 else len(self.parents[g])
        out = np.zeros(n_g)
        for d, c in terms.items():
            if d < g:
                continue
            anc = np.arange(len(c))
            for k in range(d, g, -1):
                anc = self.parents[k][anc]
            out += np.bincount(anc, weights=c, minlength=n_g)
        return out

    def backlog(self, g: int, taken: dict[int, np.ndarray], sent: dict[int, np.ndarray]) -> float:
        """Tokens an accumulator still holds when its input ends.

        It takes a token per cycle and sends one per cycle meanwhile; the results of a reduction
        (a point of depth ``g``) queue when its input ends. With ``in_r`` and ``out_r`` the tokens
        taken and sent per reduction, the queue after the last one is (Lindley's recursion)::

            q = out_last + max(0, max_k sum_{r >= k} (out_{r-1} - in_r))
        """
        if g >= self.m:  # reductions inside the regular tail: the last one's results
            per = self.at(sent, self.m)
            return (
                float(per[-1] / max(float(np.prod(self.tail[: g - self.m])), 1.0))
                if len(per)
                else 0.0
            )
        t_in, t_out = self.at(taken, g), self.at(sent, g)
        if not len(t_out):
            return 0.0
        steps = t_out[:-1] - t_in[1:]
        waiting = float(np.max(np.cumsum(steps[::-1]), initial=0.0))
        return float(t_out[-1]) + waiting


def _add(*terms: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    out: dict[int, np.ndarray] = {}
    for t in terms:
        for d, c in t.items():
            out[d] = out[d] + c if d in out else c
    return out


def _sub(a: dict[int, np.ndarray], b: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    return _add(a, {d: -c for d, c in b.items()})


def _prim(
    name: str,
    kind: str,
    sent: dict[int, np.ndarray],
    memory: bool,
    var: str | None = None,
    idle: dict[int, np.ndarray] | None = None,
) -> Prim:
    """A primitive sending ``sent`` (its deepest term is its depth) and idling ``idle``."""
    depth = max(sent)
    extra = tuple((d, c) for d, c in sorted(sent.items()) if d != depth)
    idle_terms = tuple(sorted((idle or {}).items()))
    return Prim(name, kind, depth, sent[depth], memory, var, extra, idle_terms)


def _level_is_sparse(o: _Operand, v: str) -> bool:
    assert o.tensor is not None
    if v not in o.level_vars:
        return False
    return o.tensor.levels[o.level_vars.index(v)].kind is not LevelKind.DENSE


def _per_parent(owner: np.ndarray, n_parent: int) -> np.ndarray:
    return np.bincount(owner, minlength=n_parent).astype(np.float64) + 1.0


def _expand_level(
    st: Statement,
    v: str,
    ops: list[_Operand],
    scanners: list[_Operand],
    union: bool,
    extent: int,
    n: int,
    prims: list[Prim],
    t: int,
    above: Terms,
    gaps: dict[int, np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """Expand every point's fiber at variable ``v``; update the operands' references.

    ``above``: the stops of empty fibers above the level, which every stream of it carries;
    ``gaps`` receives a joiner's steps from each output to the next (see :func:`_gaps`).
    A scanner given an absent reference (``N``: a unioner's missing side) sends ``N`` and the
    closing stop; the unioner skips that ``N`` in a cycle of its own.
    """
    fibers = []
    absent = np.zeros(n)
    for o in scanners:
        level = o.next_level()
        assert level is not None
        valid = o.pos >= 0
        present = np.flatnonzero(valid)
        owner, crd, pos = level.fibers(o.pos[present])
        owner = present[owner]
        fibers.append((owner, crd, pos))
        absent += ~valid
        sent = _per_parent(owner, n) + ~valid
        prims.append(Prim(f"scan {o.name}.{v}", "scanner", t - 1, sent, o.stored, v, above))
    if not fibers:
        owner = np.repeat(np.arange(n, dtype=np.int64), extent)
        crd = np.tile(np.arange(extent, dtype=np.int64), n)
        per = _per_parent(owner, n)
        prims.append(Prim(f"iterate {v}", "iterator", t - 1, per, False, v, above))
        for o in ops:
            if not o.is_located and o.level < len(o.level_vars) and o.level_vars[o.level] == v:
                o.pos = np.where(o.pos[owner] >= 0, o.pos[owner] * extent + crd, -1)
                o.level += 1
                prims.append(Prim(f"locate {o.name}.{v}", "locator", t - 1, per, False, v, above))
        return owner, crd
    keys = [f[0] * extent + f[1] for f in fibers]
    merged = keys[0]
    if len(fibers) > 1:
        joined = functools.reduce(np.union1d, keys)  # every coordinate a merger compares
        if union:
            merged = joined
        else:
            for k in keys[1:]:
                merged = np.intersect1d(merged, k, assume_unique=True)
        kind = "unioner" if union else "intersecter"
        gaps[t] = _gaps(joined, merged, extent, n)
        sent = _per_parent(merged // extent, n)
        steps = np.bincount(joined // extent, minlength=n) - (sent - 1.0) + absent
        prims.append(Prim(f"{kind} {v}", kind, t - 1, sent, False, v, above, ((t - 1, steps),)))
    owner, crd = merged // extent, merged % extent
    for o, k, f in zip(scanners, keys, fibers, strict=True):
        at = np.searchsorted(k, merged)
        at = np.minimum(at, len(k) - 1) if len(k) else at
        hit = (k[at] == merged) if len(k) else np.zeros(len(merged), bool)
        o.pos = np.where(hit, f[2][at] if len(k) else 0, -1)
        o.level += 1
    for o in ops:
        if (
            o in scanners
            or o.is_located
            or o.level >= len(o.level_vars)
            or o.level_vars[o.level] != v
        ):
            continue
        level = o.next_level()
        assert level is not None
        per = _per_parent(owner, n)
        prims.append(Prim(f"locate {o.name}.{v}", "locator", t - 1, per, False, v, above))
        o.pos = np.where(o.pos[owner] >= 0, o.pos[owner] * level.size + crd, -1)
        o.level += 1
    return owner, crd


def _operand_block(
    o: _Operand,
    points: np.ndarray,
    tail: tuple[str, ...],
    crd: dict[str, np.ndarray],
    extents: dict[str, int],
) -> np.ndarray:
    """Values of operand ``o`` at the given points over the tail: ``[len(points), *tail]``."""
    shape = [len(points)] + [extents[v] if v in o.vars else 1 for v in tail]
    if o.dense_array is not None:
        arr = o.dense_array
        head = [d for d, v in enumerate(o.vars) if v not in tail]
        rest = [d for v in tail for d, u in enumerate(o.vars) if u == v]
        moved = np.transpose(arr, head + rest)
        if not head:
            return np.broadcast_to(moved.reshape([1, *shape[1:]]), shape)
        idx = tuple(crd[o.vars[d]][points] for d in head)
        return np.asarray(moved[idx]).reshape(shape)
    assert o.tensor is not None
    sizes = [o.tensor.levels[k].size for k in range(o.level, len(o.level_vars))]
    tail_vars = [v for v in tail if v in o.vars]
    if list(o.level_vars[o.level :]) != tail_vars:
        raise ValueError(
            expected(
                f"operand {o.name}",
                "tail levels",
                f"in storage order {o.level_vars[o.level :]}",
                tail_vars,
            )
        )
    block = int(np.prod(sizes)) if sizes else 1
    if not len(o.tensor.values):  # nothing stored: every reference is absent
        return np.zeros(shape)
    pos = o.pos[points]
    flat = np.where(pos[:, None] >= 0, pos[:, None] * block + np.arange(block), 0)
    vals = np.where(pos[:, None] >= 0, o.tensor.values[flat], 0.0)
    return vals.reshape(shape)


def _values(
    st: Statement,
    ops: list[_Operand],
    tail: tuple[str, ...],
    crd: dict[str, np.ndarray],
    extents: dict[str, int],
    n: int,
    prims: list[Prim],
    order: tuple[str, ...],
    counts: _Counts,
) -> tuple[SparseTensor, np.ndarray, float]:
    """Read, combine, reduce and write the values; record the value primitives.

    The streams of the tail's levels and the values are counted by :class:`_Counts`; the
    reduction is the per-token machine's: a reducer per trailing reduced level sends a value at
    every stop of its input and the stops one level up (``S(k>=1)`` becomes value, ``S(k-1)``);
    a sparse accumulator (a reduced level with output levels inside it) sends the output
    coordinates of each reduction and one stop per reduction.
    """
    depth = counts.m
    last = len(order)
    values = counts.stream(last)
    for k, v in enumerate(tail):
        stream = counts.stream(depth + k + 1)
        for o in ops:
            kind = "locate" if v in o.vars else "repeat"
            prims.append(
                _prim(
                    f"{kind} {o.name}.{v}",
                    "locator" if v in o.vars else "repeater",
                    stream,
                    False,
                    v,
                )
            )
        prims.append(_prim(f"iterate {v}", "iterator", stream, False, v))
    for o in ops:
        prims.append(_prim(f"array {o.name}", "array", values, o.stored))
    for k in range(len(ops) - 1):
        prims.append(_prim(f"alu {st.combine} {k}", "alu", values, False))
    tail_red = [v for v in tail if v not in st.out_vars]
    head_out = [v for v in order[: len(order) - len(tail)] if v in st.out_vars]
    tail_out = [v for v in tail if v in st.out_vars]
    per_point = int(np.prod(counts.tail)) if tail else 1
    chunk = max(1, _CHUNK_ELEMENTS // max(per_point, 1))
    out_tail_shape = [extents[v] for v in tail_out]
    head_red = [v for v in order[: len(order) - len(tail)] if v not in st.out_vars]
    if head_out:
        key = np.ravel_multi_index(
            tuple(crd[v] for v in head_out), tuple(extents[v] for v in head_out)
        )
    else:
        key = np.zeros(n, dtype=np.int64)
    sort = np.argsort(key, kind="stable")
    skey = key[sort]
    uniq, first = np.unique(skey, return_index=True)
    fn = np.add if st.reduce == "sum" else np.maximum
    grouped = np.zeros((len(uniq), *out_tail_shape))
    seen = np.zeros(len(uniq), dtype=bool)
    # combine and reduce chunk by chunk: each chunk's points are reduced into their groups
    for start in range(0, n, chunk):
        pts = sort[start : min(n, start + chunk)]
        blocks = [_operand_block(o, pts, tail, crd, extents) for o in ops]
        part = _combine_tail(st, blocks, tail, tail_red)
        g = np.searchsorted(uniq, skey[start : start + len(pts)])
        cut = np.flatnonzero(np.diff(g)) + 1
        starts = np.concatenate([[0], cut])
        red = fn.reduceat(part, starts, axis=0) if head_red else part[starts]
        gid = g[starts]
        was = seen[gid].reshape((len(gid),) + (1,) * len(out_tail_shape))
        grouped[gid] = np.where(was, fn(grouped[gid], red), red)
        seen[gid] = True
    group_point = sort[first] if n else np.zeros(0, np.int64)
    trailing = all(
        order.index(v) > max((order.index(u) for u in st.out_vars), default=-1)
        for v in st.reduce_vars
    )
    n_out = np.bincount(group_point, minlength=n).astype(np.float64) * (
        np.prod(out_tail_shape) if out_tail_shape else 1
    )
    n_out_terms = {depth: n_out}
    final, drain = values, 0.0
    first_reduce = min((order.index(v) for v in st.reduce_vars), default=last)
    if st.reduce_vars and trailing:  # one reducer per reduced level, innermost first
        for j in range(len(st.reduce_vars)):
            sent = _add(counts.stops(last - j), counts.stops(last - j - 1))
            name = f"reducer {st.reduce}" + (f" {j}" if j else "")
            prims.append(
                _prim(name, "reducer", sent, False, None, _sub(final, counts.stops(last - j)))
            )
            final = sent
    elif st.reduce_vars:
        final = _add(n_out_terms, counts.stops(first_reduce + 1))
        # it reads a value per cycle and drains the previous reduction's sums meanwhile; the
        # last reduction's drain follows the end of its input
        drain = counts.backlog(first_reduce, values, final)
        idle = _add(_sub(values, final), {0: np.array([drain])})
        prims.append(_prim(f"spacc {st.reduce}", "spacc", final, False, None, idle))
    if st.epilogue:  # on the value stream of a map, on the reduced stream otherwise
        prims.append(_prim(f"alu {st.epilogue}", "alu", final, False))
        grouped = UNARY[st.epilogue](grouped)
    prims.append(_prim(f"write {st.out}", "writer", final, True))
    for k, v in enumerate(order):
        if v in st.out_vars:
            written = counts.stream(k + 1) if k < first_reduce else final
            prims.append(_prim(f"write {st.out}.{v}", "writer", written, True, v))
    coords_head = (
        np.stack(np.unravel_index(uniq, tuple(extents[v] for v in head_out)), axis=1)
        if head_out
        else np.zeros((len(uniq), 0), np.int64)
    )
    value = _build_output(st, head_out, tail_out, coords_head, grouped, extents)
    return value, group_point, drain


def _combine_tail(
    st: Statement, blocks: list[np.ndarray], tail: tuple[str, ...], tail_red: list[str]
) -> np.ndarray:
    letters = "abcdefghijklm"
    tail_sizes = [max(b.shape[1 + k] for b in blocks) for k in range(len(tail))]
    if st.combine == "mul":
        keep = "z" + "".join(letters[k] for k, v in enumerate(tail) if v not in tail_red)
        if st.reduce == "max" and tail_red:
            prod = blocks[0]
            for b in blocks[1:]:
                prod = prod * b
            axes = tuple(1 + k for k, v in enumerate(tail) if v in tail_red)
            return np.asarray(prod.max(axis=axes))
        subs = []
        squeezed = []
        for b in blocks:
            own = [k for k in range(len(tail)) if b.shape[1 + k] != 1 or tail_sizes[k] == 1]
            subs.append("z" + "".join(letters[k] for k in own))
            squeezed.append(b.reshape((b.shape[0], *(b.shape[1 + k] for k in own))))
        spec = ",".join(subs) + "->" + keep
        return np.asarray(np.einsum(spec, *squeezed, optimize=len(blocks) > 2))
    if st.combine == "copy":
        combined = blocks[0]
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            combined = BINARY[st.combine](blocks[0], blocks[1])
    full = np.broadcast_shapes(*(b.shape for b in blocks))
    combined = np.broadcast_to(combined, full)
    axes = tuple(1 + k for k, v in enumerate(tail) if v in tail_red)
    if not axes:
        return np.asarray(combined)
    return np.asarray(combined.sum(axis=axes) if st.reduce == "sum" else combined.max(axis=axes))


def _build_output(
    st: Statement,
    head_out: list[str],
    tail_out: list[str],
    coords_head: np.ndarray,
    grouped: np.ndarray,
    extents: dict[str, int],
) -> SparseTensor:
    """Store the output points in the statement's output order, one level per variable."""
    stream = [*head_out, *tail_out]
    g = len(coords_head)
    tail_shape = [extents[v] for v in tail_out]
    m = int(np.prod(tail_shape)) if tail_shape else 1
    tail_coords = (
        np.stack(np.unravel_index(np.arange(m), tail_shape), axis=1)
        if tail_shape
        else np.zeros((1, 0), np.int64)
    )
    coords = np.concatenate(
        [np.repeat(coords_head, m, axis=0), np.tile(tail_coords, (g, 1))], axis=1
    )
    values = grouped.reshape(-1)
    order = tuple(st.out_vars.index(v) for v in stream)
    shape = tuple(extents[v] for v in st.out_vars)
    return from_coords(st.out, shape, coords, values, order)
