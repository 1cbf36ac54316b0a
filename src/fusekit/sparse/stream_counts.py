"""Token and cycle counts of a statement's streams in closed form (see :mod:`.streams`).

A primitive's counts (:class:`Prim`) are per point of one depth, as ``(depth, counts)`` terms to
be weighted by each point's replays; :class:`StreamCounts` gives the points, stops and whole
streams of every depth from the points' parents, and the joiner functions give the steps an
intersecter or unioner takes between outputs and the cycles the level below it waits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
            stops that empty fibers above ``depth`` pass down the stream (see
            :class:`StreamCounts`).
        idle: cycles it fires without sending, as ``(depth, counts)`` pairs: an intersecter's
            steps past unmatched coordinates, a unioner's skipped ``N``, a reducer's input
            values.
        wait: cycles it waits, as ``(depth, counts)`` pairs: below an intersecter, the level
            under it and everything after wait where the intersecter steps past unmatched
            coordinates and the level has nothing to do (see :func:`joiner_stall`).
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


def joiner_gaps(joined: np.ndarray, merged: np.ndarray, extent: int, n: int) -> np.ndarray:
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


def joiner_stall(p_gaps: np.ndarray, n_points: int, work: np.ndarray, owner: np.ndarray) -> float:
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


class StreamCounts:
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
            return add_terms({self.m: np.full(self.n_m, fibers)}, self._above(self.m))
        n_parent = 1 if s == 1 else len(self.parents[s - 1])
        return add_terms({s - 1: np.ones(n_parent)}, self._above(s - 1))

    def stream(self, s: int) -> dict[int, np.ndarray]:
        """Every token of the stream at depth ``s`` but its ``D``."""
        return add_terms(self.points(s), self.stops(s))

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


def add_terms(*terms: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """The sum of per-depth terms."""
    out: dict[int, np.ndarray] = {}
    for t in terms:
        for d, c in t.items():
            out[d] = out[d] + c if d in out else c
    return out


def sub_terms(a: dict[int, np.ndarray], b: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """``a - b``, term by term."""
    return add_terms(a, {d: -c for d, c in b.items()})


def make_prim(
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
