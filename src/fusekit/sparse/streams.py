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

Every primitive records the tokens it handles per point of one depth (:class:`Prim`); a region
weights them by how often each point is replayed (:mod:`fusekit.sparse.simulate`). A primitive
handles one token per cycle, so its busy time is its token count; streams carry one stop per
fiber and the done token.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from fusekit.errors import expected
from fusekit.sparse.formats import LevelKind, SparseTensor, StoredLevel, from_coords
from fusekit.sparse.program import BINARY, UNARY, Statement

_CHUNK_ELEMENTS = 1 << 22


@dataclass(frozen=True, slots=True)
class Prim:
    """Token counts of one primitive, aligned to the points of one depth.

    Attributes:
        name: unique within the statement, e.g. ``"scan A.k"``.
        kind: scanner, repeater, locator, iterator, intersecter, unioner, dropper, array,
            alu, reducer, spacc, writer.
        depth: the depth whose points ``counts`` is aligned to.
        counts: tokens per point of that depth (to be weighted by each point's replays).
        memory: whether each token is a word moved to or from memory.
        var: the index variable of the level, or ``None`` for value primitives.
    """

    name: str
    kind: str
    depth: int
    counts: np.ndarray
    memory: bool
    var: str | None = None


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
    """

    statement: Statement
    order: tuple[str, ...]
    crds: list[dict[str, np.ndarray]]
    parents: list[np.ndarray]
    prims: list[Prim]
    value: SparseTensor
    group_point: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    tail: tuple[str, ...] = ()

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
    tail_start = len(order)
    while tail_start > max(materialise, 0) and not sparse_at[order[tail_start - 1]]:
        tail_start -= 1
    crds: list[dict[str, np.ndarray]] = [{}]
    parents: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
    prims: list[Prim] = []
    out_set = set(st.out_vars)
    drops = {
        v
        for k, v in enumerate(order)
        if v in out_set and any(len(sparse_at[u]) > 1 for u in order[k + 1 :])
    }
    n = 1
    for t, v in enumerate(order[:tail_start], start=1):
        levels_before = [o.level for o in ops]
        owner, crd = _expand_level(st, v, ops, sparse_at[v], union, extents[v], n, prims, t)
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
                )
            )
        if v in drops:
            prims.append(Prim(f"drop {v}", "dropper", t - 1, _per_parent(owner, n), False, v))
        crds.append(new_crds)
        parents.append(owner)
        n = len(owner)
    tail = order[tail_start:]
    value, group_point = _values(
        st, ops, tail, crds[-1], extents, n, prims, tail_start, order, parents
    )
    first_reduce = min((order.index(v) for v in st.reduce_vars), default=len(order))
    for t, v in enumerate(order[:tail_start], start=1):
        if v in st.out_vars and t - 1 < first_reduce:
            n_parent = 1 if t == 1 else len(parents[t - 1])
            prims.append(
                Prim(
                    f"write {st.out}.{v}",
                    "writer",
                    t - 1,
                    _per_parent(parents[t], n_parent),
                    True,
                    v,
                )
            )
    return Trace(st, order, crds, parents, prims, value, group_point, tail)


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
) -> tuple[np.ndarray, np.ndarray]:
    """Expand every point's fiber at variable ``v``; update the operands' references."""
    fibers = []
    for o in scanners:
        level = o.next_level()
        assert level is not None
        valid = o.pos >= 0
        owner, crd, pos = level.fibers(np.where(valid, o.pos, 0))
        keep = valid[owner]
        owner, crd, pos = owner[keep], crd[keep], pos[keep]
        fibers.append((owner, crd, pos))
        prims.append(
            Prim(f"scan {o.name}.{v}", "scanner", t - 1, _per_parent(owner, n), o.stored, v)
        )
    if not fibers:
        owner = np.repeat(np.arange(n, dtype=np.int64), extent)
        crd = np.tile(np.arange(extent, dtype=np.int64), n)
        prims.append(Prim(f"iterate {v}", "iterator", t - 1, _per_parent(owner, n), False, v))
        for o in ops:
            if not o.is_located and o.level < len(o.level_vars) and o.level_vars[o.level] == v:
                o.pos = np.where(o.pos[owner] >= 0, o.pos[owner] * extent + crd, -1)
                o.level += 1
                prims.append(
                    Prim(f"locate {o.name}.{v}", "locator", t - 1, _per_parent(owner, n), False, v)
                )
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
        prims.append(Prim(f"{kind} {v}", kind, t - 1, _per_parent(joined // extent, n), False, v))
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
        prims.append(
            Prim(f"locate {o.name}.{v}", "locator", t - 1, _per_parent(owner, n), False, v)
        )
        o.pos = np.where(o.pos[owner] >= 0, o.pos[owner] * level.size + crd, -1)
        o.level += 1
    return owner, crd


def _tail_counts(tail_ext: list[int]) -> float:
    """Tokens of the innermost stream of a regular tail: elements plus one stop per fiber."""
    if not tail_ext:
        return 1.0
    inner = float(np.prod(tail_ext))
    return inner + inner / tail_ext[-1]


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
    depth: int,
    order: tuple[str, ...],
    parents: list[np.ndarray],
) -> tuple[SparseTensor, np.ndarray]:
    """Read, combine, reduce and write the values; record the value primitives.

    Value streams carry the innermost level's stops: with a regular tail they are counted per
    point in closed form, otherwise per parent fiber (its children plus one stop).
    """
    tail_ext = [extents[v] for v in tail]
    if tail_ext or depth == 0:
        vdepth, inner = depth, np.full(n, _tail_counts(tail_ext))
    else:
        vdepth = depth - 1
        inner = _per_parent(parents[depth], 1 if depth == 1 else len(parents[depth - 1]))
    for k, v in enumerate(tail):
        per = _tail_counts(tail_ext[: k + 1])
        for o in ops:
            kind = "locate" if v in o.vars else "repeat"
            prims.append(
                Prim(
                    f"{kind} {o.name}.{v}",
                    "locator" if v in o.vars else "repeater",
                    depth,
                    np.full(n, per),
                    False,
                    v,
                )
            )
        prims.append(Prim(f"iterate {v}", "iterator", depth, np.full(n, per), False, v))
    for o in ops:
        prims.append(Prim(f"array {o.name}", "array", vdepth, inner, o.stored))
    for k in range(len(ops) - 1):
        prims.append(Prim(f"alu {st.combine} {k}", "alu", vdepth, inner, False))
    tail_red = [v for v in tail if v not in st.out_vars]
    head_out = [v for v in order[: len(order) - len(tail)] if v in st.out_vars]
    tail_out = [v for v in tail if v in st.out_vars]
    per_point = int(np.prod(tail_ext)) if tail_ext else 1
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
    if st.reduce_vars:
        kind = "reducer" if trailing else "spacc"
        prims.append(Prim(f"{kind} {st.reduce}", kind, vdepth, inner, False))
    if st.epilogue and not st.reduce_vars:  # a map: the epilogue sees the value stream
        prims.append(Prim(f"alu {st.epilogue}", "alu", vdepth, inner, False))
    elif st.epilogue:
        prims.append(Prim(f"alu {st.epilogue}", "alu", depth, n_out, False))
    if st.epilogue:
        grouped = UNARY[st.epilogue](grouped)
    prims.append(Prim(f"write {st.out}", "writer", depth, n_out, True))
    coords_head = (
        np.stack(np.unravel_index(uniq, tuple(extents[v] for v in head_out)), axis=1)
        if head_out
        else np.zeros((len(uniq), 0), np.int64)
    )
    value = _build_output(st, head_out, tail_out, coords_head, grouped, extents)
    return value, group_point


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
