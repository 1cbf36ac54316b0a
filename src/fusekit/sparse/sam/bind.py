"""Tensors in and out of SAM level storage.

A SAM format such as ``ds10`` gives one letter per stored level (``d`` dense, ``s`` compressed)
and then the tensor modes in storage order; ``none`` is an order-0 tensor. :func:`bind` stores a
dense numpy array that way:

- a compressed level keeps, per parent position ``q``, the coordinates whose subtree holds a
  nonzero: ``crd[seg[q]:seg[q+1]]``, child positions ``seg[q] .. seg[q+1]-1`` (CSF);
- a dense level keeps every coordinate: child position ``q * dim + c`` (SAM's uncompressed
  scanner computes the same reference);
- the values array is indexed by the last level's positions (a scalar is ``[value]``).

:func:`decode` turns the streams the output's level writers received back into a dense array.
It aligns the fibers of each level with the coordinates of the level above: one fiber per
coordinate, or, when a coordinate dropper removed outer coordinates (SAM's dropper passes the
inner stream on unchanged, with the dropped coordinates' empty fibers), one per coordinate after
the empty fibers are set aside, which is what SAM's compressed writer records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fusekit.sparse.sim.tokens import EMPTY, Stop, Token, is_number


@dataclass(frozen=True, slots=True)
class Level:
    """One stored level: ``kind`` ``s``/``d``, the tensor ``mode`` it holds, its ``dim``."""

    kind: str
    mode: int
    dim: int
    seg: np.ndarray | None = None
    crd: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class BoundTensor:
    """A tensor in SAM storage: levels in storage order and the values array."""

    name: str
    format: str
    shape: tuple[int, ...]
    levels: tuple[Level, ...]
    vals: np.ndarray

    def level_of(self, mode: int) -> Level | None:
        """The level that stores ``mode``, or ``None``."""
        return next((lv for lv in self.levels if lv.mode == mode), None)


def format_rank(fmt: str) -> int:
    """The number of stored levels of a SAM format (0 for ``none``)."""
    return 0 if fmt == "none" else len(fmt) // 2


def mode_order(fmt: str) -> tuple[int, ...]:
    """The modes in storage order (``ss10`` -> ``(1, 0)``)."""
    if fmt == "none":
        return ()
    r = format_rank(fmt)
    return tuple(int(d) for d in fmt[r:])


def bind(name: str, fmt: str, array: np.ndarray) -> BoundTensor:
    """Store ``array`` (logical layout) in SAM format ``fmt``.

    The caller checks that ``array.ndim`` equals the format's rank.
    """
    a = np.asarray(array, dtype=np.float64)
    if fmt == "none":
        return BoundTensor(name, fmt, (), (), np.array([a.item()]))
    kinds, modes = fmt[: format_rank(fmt)], mode_order(fmt)
    t = np.transpose(a, modes)
    parents: list[tuple[int, np.ndarray]] = [(0, t)]
    levels: list[Level] = []
    for kind, mode in zip(kinds, modes, strict=True):
        dim = int(a.shape[mode])
        children: list[tuple[int, np.ndarray]] = []
        if kind == "d":
            for q, sub in parents:
                children.extend((q * dim + c, sub[c]) for c in range(dim))
            levels.append(Level("d", mode, dim))
        else:
            seg, crd = [0], list[int]()
            for _, sub in parents:
                nz = np.flatnonzero(sub.reshape(dim, -1).any(axis=1) if sub.ndim > 1 else sub != 0)
                for c in nz:
                    children.append((len(crd), sub[c]))
                    crd.append(int(c))
                seg.append(len(crd))
            levels.append(Level("s", mode, dim, np.array(seg), np.array(crd, dtype=np.int64)))
        parents = children
    size = max((q for q, _ in parents), default=-1) + 1
    vals = np.zeros(size)
    for q, v in parents:
        vals[q] = float(v)
    return BoundTensor(name, fmt, tuple(int(s) for s in a.shape), tuple(levels), vals)


Tree = list[Any]


def parse_tree(stream: list[Token], depth: int) -> Tree:
    """The nested fibers of a stream ``depth`` levels deep (the root fiber; ``[]`` if none).

    ``Stop(k)`` closes the innermost fiber and ``k`` enclosing ones; a stop that follows a stop
    opens one fresh fiber at the shallowest depth the earlier stop closed, so that, two deep,
    ``1, S0, S0, S1`` holds ``[[1], [], []]`` and ``S1`` the empty root. SAM spells a root with
    one empty fiber ``S1`` too; :func:`decode` settles that against the level above.
    ``EMPTY`` opens a fiber without an entry.
    """
    top: Tree = []
    stack: list[Tree] = [top]
    for tok in stream:
        if isinstance(tok, Stop):
            target = max(depth - 1 - tok.level, 0)
            for _ in range(len(stack) - 1, max(len(stack) - 1, target) + 1):
                if len(stack) - 1 < depth:
                    stack[-1].append(fresh := list[Any]())
                    stack.append(fresh)
            del stack[target + 1 :]
        elif is_number(tok) or tok is EMPTY:
            while len(stack) - 1 < depth:
                stack[-1].append(fresh := list[Any]())
                stack.append(fresh)
            if tok is not EMPTY:
                stack[-1].append(tok)
    return top[0] if top else []


def _has_entry(node: Any) -> bool:
    return any(_has_entry(x) for x in node) if isinstance(node, list) else True


def _match(n: int, children: Tree) -> Tree | None:
    """``children`` paired one per parent entry (``n`` of them), or ``None``.

    One child per entry; or, when a coordinate dropper removed entries, the non-empty children;
    or, for no child at all, an empty one per entry (SAM's ambiguous ``S(k>=1)``); for no entry,
    children that hold only zeros (a reduction of that ambiguous empty fiber).
    """
    if len(children) == n:
        return children
    kept = [c for c in children if _has_entry(c)]
    if len(kept) == n:
        return kept
    if not kept or (n == 0 and not any(_nonzero(c) for c in children)):
        return [[] for _ in range(n)]
    return None


def _nonzero(node: Any) -> bool:
    return any(_nonzero(x) for x in node) if isinstance(node, list) else node != 0


def decode(
    fmt: str, shape: tuple[int, ...], levels: list[list[Token]], vals: list[Token]
) -> np.ndarray:
    """The dense output from its writers' input streams.

    Args:
        fmt: the output's SAM format.
        shape: its logical shape.
        levels: the coordinate stream each level writer received, in storage order.
        vals: the value stream the value writer received.

    Returns:
        A dense array of ``shape`` (0-d for a scalar).

    Raises:
        ValueError: when the streams do not nest (fibers that match no coordinate, or values
            that match no innermost coordinate).
    """
    flat = [0.0 if v is EMPTY else float(v) for v in vals if is_number(v) or v is EMPTY]  # type: ignore[arg-type]
    if fmt == "none":
        if sum(1 for v in flat if v != 0) > 1:
            raise ValueError(f"expected one value for a scalar output (got {flat})")
        return np.array(sum(flat))
    rank = len(levels)
    trees = [parse_tree(s, d) for d, s in enumerate(levels, start=1)]
    try:  # values nested as the innermost coordinates are
        pairs = _walk([*trees, parse_tree(vals, rank)], rank)
    except ValueError:  # values without stops, in coordinate order
        paths = [p for p, _ in _walk(trees, rank, values=False)]
        if len(paths) != len(flat):
            raise
        pairs = list(zip(paths, flat, strict=True))
    out = np.zeros(shape)
    modes = mode_order(fmt)
    for path, v in pairs:
        idx = [0] * len(modes)
        for c, m in zip(path, modes, strict=True):
            idx[m] = c
        out[tuple(idx)] = float(v)
    return out


def _walk(trees: list[Tree], rank: int, values: bool = True) -> list[tuple[tuple[int, ...], Any]]:
    """Every innermost coordinate path with its value (``trees[rank]``: the value tree)."""
    found: list[tuple[tuple[int, ...], Any]] = []
    last = rank + 1 if values else rank

    def walk(d: int, prefix: tuple[int, ...], nodes: list[Tree]) -> None:
        coords = nodes[d]
        if d == rank - 1:
            vals = nodes[rank] if values else [None] * len(coords)
            if len(vals) != len(coords) and (coords or any(v != 0 for v in vals)):
                raise ValueError(
                    f"expected {len(coords)} value(s) under {prefix} (got {len(vals)})"
                )
            found.extend(((*prefix, int(c)), v) for c, v in zip(coords, vals, strict=False))
            return
        below = []
        for level in range(d + 1, last):
            m = _match(len(coords), nodes[level])
            if m is None:
                raise ValueError(
                    f"expected the writer of level {level} to hold one fiber per coordinate of "
                    f"level {d} under {prefix} ({len(coords)}) (got {len(nodes[level])})"
                )
            below.append(m)
        for k, c in enumerate(coords):
            walk(d + 1, (*prefix, int(c)), [*nodes[: d + 1], *(m[k] for m in below)])

    walk(0, (), trees)
    return found
