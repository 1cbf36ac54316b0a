"""The values of one statement's streams: read, combined, reduced and written (see :mod:`.streams`).

The levels below the materialised depth form a regular tail: each point's operand values over
the tail are read as dense blocks, combined (``einsum`` for a product), reduced into their output
groups chunk by chunk, and stored as the output tensor. The value primitives (arrays, ALUs,
reducers or a sparse accumulator, writers) record their tokens with :class:`StreamCounts`.
"""

from __future__ import annotations

import numpy as np

from fusekit.errors import expected
from fusekit.sparse.formats import SparseTensor, StoredLevel, from_coords
from fusekit.sparse.program import BINARY, UNARY, Statement
from fusekit.sparse.stream_counts import Prim, StreamCounts, add_terms, make_prim, sub_terms

_CHUNK_ELEMENTS = 1 << 22


class Operand:
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
        """Whether the operand is a dense array, located rather than scanned."""
        return self.dense_array is not None

    def next_level(self) -> StoredLevel | None:
        """The stored level the operand reaches next (``None`` past its last level)."""
        assert self.tensor is not None
        return self.tensor.levels[self.level] if self.level < len(self.tensor.levels) else None


def _operand_block(
    o: Operand,
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


def evaluate_values(
    st: Statement,
    ops: list[Operand],
    tail: tuple[str, ...],
    crd: dict[str, np.ndarray],
    extents: dict[str, int],
    n: int,
    prims: list[Prim],
    order: tuple[str, ...],
    counts: StreamCounts,
) -> tuple[SparseTensor, np.ndarray, float]:
    """Read, combine, reduce and write the values; record the value primitives.

    The streams of the tail's levels and the values are counted by :class:`StreamCounts`; the
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
                make_prim(
                    f"{kind} {o.name}.{v}",
                    "locator" if v in o.vars else "repeater",
                    stream,
                    False,
                    v,
                )
            )
        prims.append(make_prim(f"iterate {v}", "iterator", stream, False, v))
    for o in ops:
        prims.append(make_prim(f"array {o.name}", "array", values, o.stored))
    for k in range(len(ops) - 1):
        prims.append(make_prim(f"alu {st.combine} {k}", "alu", values, False))
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
            sent = add_terms(counts.stops(last - j), counts.stops(last - j - 1))
            name = f"reducer {st.reduce}" + (f" {j}" if j else "")
            prims.append(
                make_prim(
                    name, "reducer", sent, False, None, sub_terms(final, counts.stops(last - j))
                )
            )
            final = sent
    elif st.reduce_vars:
        final = add_terms(n_out_terms, counts.stops(first_reduce + 1))
        # it reads a value per cycle and drains the previous reduction's sums meanwhile; the
        # last reduction's drain follows the end of its input
        drain = counts.backlog(first_reduce, values, final)
        idle = add_terms(sub_terms(values, final), {0: np.array([drain])})
        prims.append(make_prim(f"spacc {st.reduce}", "spacc", final, False, None, idle))
    if st.epilogue:  # on the value stream of a map, on the reduced stream otherwise
        prims.append(make_prim(f"alu {st.epilogue}", "alu", final, False))
        grouped = UNARY[st.epilogue](grouped)
    prims.append(make_prim(f"write {st.out}", "writer", final, True))
    for k, v in enumerate(order):
        if v in st.out_vars:
            written = counts.stream(k + 1) if k < first_reduce else final
            prims.append(make_prim(f"write {st.out}.{v}", "writer", written, True, v))
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
