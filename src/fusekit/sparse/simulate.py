"""The streaming machine, simulated stream by stream with numpy (no Python step per token).

Each statement of a region is lowered level by level in its dataflow order (see
:mod:`fusekit.sparse.graph` for the primitives). The simulator evaluates the lowered graph the
way the hardware would, but whole streams at a time: at depth ``t`` it holds one row per point of
the iteration space bound so far (the coordinates of the first ``t`` variables and each
operand's reference), and a level expands every point's fiber at once (scanner), intersects or
unites the fibers of several operands (intersecter, unioner), and repeats the references of the
operands the level does not index (repeater). Trailing levels where no operand is compressed
are not materialised: their streams are regular and are counted in closed form, and their
values are computed with ``einsum`` (the innermost ALU and reducer work). Values are read by
reference (array), combined (ALU), reduced (reducer when the reduced variables are innermost,
sparse accumulator otherwise) and written level by level (level writer).

Every primitive records the tokens it handles. A primitive handles one token per cycle, so its
busy time is its token count; tokens include one stop per fiber and the done token.

Fusion. A producer fused into its consumer is not written: the consumer's coordinate stream
drives the producer's scanners (factored iteration: the producer runs once per point of the
consumer at its *context depth*, the shallowest depth where every variable bound so far that
the producer does not index has been bound, see :func:`context_depth`). The producer's
streams for one binding of the context are identical each time they are replayed, so the
simulator computes them once and weights their token counts by the number of replays.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fusekit.errors import expected
from fusekit.sparse.formats import LevelKind, SparseTensor, StoredLevel
from fusekit.sparse.machine import Machine
from fusekit.sparse.program import BINARY, UNARY, Program, Statement
from fusekit.sparse.schedule import Schedule

#: Tail work per chunk: materialised points times tail elements computed at once.
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


def _ancestor(parents: list[np.ndarray], points: np.ndarray, src: int, dst: int) -> np.ndarray:
    for t in range(src, dst, -1):
        points = parents[t][points]
    return points


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
    if len(fibers) == 1:
        merged = keys[0]
    else:
        merged = keys[0]
        for k in keys[1:]:
            merged = (
                np.union1d(merged, k) if union else np.intersect1d(merged, k, assume_unique=True)
            )
        joined = keys[0]
        for k in keys[1:]:
            joined = np.union1d(joined, k)
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


def from_coords(
    name: str,
    shape: tuple[int, ...],
    coords: np.ndarray,
    values: np.ndarray,
    order: tuple[int, ...],
) -> SparseTensor:
    """Build a tensor from points sorted in storage order (``coords`` columns in storage order).

    A level is dense where every fiber is full, compressed otherwise.
    """
    levels: list[StoredLevel] = []
    n_parent = 1
    parent_id = np.zeros(len(coords), dtype=np.int64)
    for lvl, dim in enumerate(order):
        size = shape[dim]
        key = parent_id * size + coords[:, lvl]
        uniq, inverse = np.unique(key, return_inverse=True)
        if len(uniq) == n_parent * size:
            levels.append(StoredLevel(LevelKind.DENSE, size))
            parent_id = key
            n_parent = n_parent * size
        else:
            owner = uniq // size
            seg = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=n_parent))])
            levels.append(
                StoredLevel(
                    LevelKind.COMPRESSED, size, seg.astype(np.int64), (uniq % size).astype(np.int64)
                )
            )
            parent_id = inverse.astype(np.int64)
            n_parent = len(uniq)
    vals = np.zeros(n_parent, dtype=np.float64)
    vals[parent_id] = values
    return SparseTensor(
        name,
        shape,
        order,
        tuple(levels),
        vals,
        "dense" if all(lv.kind is LevelKind.DENSE for lv in levels) else "sparse",
    )


# -- regions ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PrimResult:
    """A primitive's tokens in a simulated region.

    Attributes:
        statement: the statement it belongs to.
        name: its name within the statement.
        kind: its kind.
        tokens: tokens over all lanes (= cycles busy on one lane when not replicated).
        busy_cycles: cycles of its busiest lane.
        memory: whether its tokens are memory words.
    """

    statement: str
    name: str
    kind: str
    tokens: float
    busy_cycles: float
    memory: bool


@dataclass(frozen=True, slots=True)
class RegionResult:
    """One region (one streaming graph) simulated.

    The cycle model (:func:`region_cycles`)::

        compute_cycles = max_p busy_p                       one token per primitive per cycle
        memory_cycles  = word_bytes * sum_{p reads/writes memory} tokens_p / bandwidth
        fill_cycles    = 2 * depth + latency * memory_levels  (primitive + channel per stage)
        cycles         = max(compute_cycles, memory_cycles) + fill_cycles
    """

    statements: tuple[str, ...]
    prims: tuple[PrimResult, ...]
    compute_cycles: float
    memory_cycles: float
    fill_cycles: float
    cycles: float
    flops: float
    memory_bytes: float


def context_depth(consumer_order: tuple[str, ...], access_vars: tuple[str, ...]) -> int:
    """The depth of a consumer's loop nest at which a fused producer is replayed.

    With the producer's output read as ``T[access_vars]``, the producer streams ``T``'s
    sub-tensor once per consumer point at depth ``d``: the first access variable is bound and
    every variable of the consumer that is not an access variable but comes before the last
    access variable is bound too (it changes the stream the consumer expects, so the producer
    must be replayed for it). Factored iteration: variables after the last access variable
    never replay the producer.
    """
    pos = [consumer_order.index(v) for v in access_vars]
    first, last = min(pos), max(pos)
    foreign = [p for p in range(last) if consumer_order[p] not in access_vars]
    return max(first + 1, max(foreign, default=-1) + 1)


def bound_prefix(
    consumer_order: tuple[str, ...], access_vars: tuple[str, ...], producer_out: tuple[str, ...]
) -> tuple[str, ...]:
    """The producer's output variables bound by the consumer's context, in consumer order."""
    d = context_depth(consumer_order, access_vars)
    rename = dict(zip(access_vars, producer_out, strict=True))
    return tuple(rename[v] for v in consumer_order[:d] if v in rename)


def fusion_legal(
    consumer_order: tuple[str, ...],
    access_vars: tuple[str, ...],
    producer: Statement,
    producer_order: tuple[str, ...],
) -> bool:
    """Whether a producer's order can feed its consumer's order without a buffer.

    The producer's order must start with the context's bound variables, and it must emit its
    output variables in the order the consumer reads them.
    """
    prefix = bound_prefix(consumer_order, access_vars, producer.out_vars)
    if producer_order[: len(prefix)] != prefix:
        return False
    rename = dict(zip(access_vars, producer.out_vars, strict=True))
    wanted = [rename[v] for v in consumer_order if v in rename]
    emitted = [v for v in producer_order if v in producer.out_vars]
    return wanted == emitted


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
            else:
                per_lane = w[p.depth] @ p.counts if len(p.counts) else np.zeros(lanes)
            tokens = float(per_lane.sum())
            on_lanes = p.depth >= replicated[st.out] and lanes > 1
            busy = float(per_lane.max()) if on_lanes else tokens
            prims.append(PrimResult(st.out, p.name, p.kind, tokens + 1.0, busy + 1.0, p.memory))
    return _region_cycles(statements, traces, prims, machine, names)


def fork_granularity(
    producer: Statement,
    producer_order: tuple[str, ...],
    consumers: list[tuple[Statement, tuple[str, ...]]],
) -> int:
    """How many leading variables of a producer's order a forked stream must buffer under.

    A consumer's values are final once it has seen one binding of the leading producer
    variables that are its own output variables (a reduction consumer finishes a row when its
    reduced variables are exhausted); the consumer that waits for another's result buffers the
    producer's output for one binding of the coarsest such prefix.
    """
    depth = len(producer_order)
    for cons, access in consumers:
        rename = dict(zip(producer.out_vars, access, strict=True))
        g = 0
        for v in producer_order:
            if v not in rename or rename[v] not in cons.out_vars:
                break
            g += 1
        depth = min(depth, g)
    return depth


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
    writer = next(p for p in tr.prims if p.kind == "writer")
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
    compute_cycles = max((p.busy_cycles for p in prims), default=0.0)
    memory_bytes = machine.word_bytes * sum(p.tokens for p in prims if p.memory)
    mem = machine.memory
    memory_cycles = memory_bytes / mem.bytes_per_cycle if mem else 0.0
    depth: dict[str, int] = {}
    for st in statements:
        own = len(traces[st.out].order) + 3
        depth[st.out] = own + max(
            (depth[o.tensor] for o in st.operands if o.tensor in names), default=0
        )
    memory_levels = 1 + max(
        (len(o.vars) for st in statements for o in st.operands if o.tensor not in names), default=0
    )
    fill_cycles = 2 * machine.channel_latency_cycles * max(depth.values()) + (
        mem.latency_cycles * memory_levels if mem else 0
    )
    flops = sum(p.tokens for p in prims if p.kind in _FLOP_KINDS)
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


def restore(t: SparseTensor, order: tuple[int, ...]) -> SparseTensor:
    """Store ``t`` again in another mode order (levels dense where full, compressed otherwise)."""
    if tuple(order) == t.order:
        return t
    coords, vals = t.coords()
    stored = coords[:, list(order)]
    key = np.lexsort(stored.T[::-1])
    return from_coords(t.name, t.shape, stored[key], vals[key], tuple(order))


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
    from fusekit.sparse.program import Operand

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
