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
accumulator otherwise) and written (level writers). This module expands the levels;
:mod:`.stream_values` computes the values and :mod:`.stream_counts` counts the tokens.

Every primitive records the tokens it sends per point of one depth
(:class:`~fusekit.sparse.stream_counts.Prim`); a region
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
from fusekit.sparse.formats import LevelKind, SparseTensor
from fusekit.sparse.program import Statement
from fusekit.sparse.stream_counts import Prim, StreamCounts, Terms, joiner_gaps, joiner_stall
from fusekit.sparse.stream_values import Operand, evaluate_values

_LEVEL_KINDS = ("scanner", "iterator", "locator", "repeater")


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
        Operand(k, tensors[o.tensor], o.vars, o.tensor, o.tensor in stored)
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
    counts = StreamCounts(parents, dead, [extents[v] for v in order[tail_start:]])
    tail = order[tail_start:]
    value, group_point, drain = evaluate_values(
        st, ops, tail, crds[-1], extents, n, prims, order, counts
    )
    for t, steps in gaps.items():  # a level below a joiner waits on it, and it on that level
        below = [p.counts for p in prims if p.depth == t and p.kind in _LEVEL_KINDS]
        if not below or t >= len(parents):
            continue
        stall = joiner_stall(steps, len(parents[t]), np.max(below, axis=0), parents[t])
        if stall > 0:
            wait = ((0, np.array([stall])),)
            prims = [replace(p, wait=wait) if p.depth >= t else p for p in prims]
    return Trace(st, order, crds, parents, prims, value, group_point, tail, drain)


def _level_is_sparse(o: Operand, v: str) -> bool:
    assert o.tensor is not None
    if v not in o.level_vars:
        return False
    return o.tensor.levels[o.level_vars.index(v)].kind is not LevelKind.DENSE


def _per_parent(owner: np.ndarray, n_parent: int) -> np.ndarray:
    return np.bincount(owner, minlength=n_parent).astype(np.float64) + 1.0


def _expand_level(
    st: Statement,
    v: str,
    ops: list[Operand],
    scanners: list[Operand],
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
    ``gaps`` receives a joiner's steps from each output to the next (see :func:`joiner_gaps`).
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
        gaps[t] = joiner_gaps(joined, merged, extent, n)
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
