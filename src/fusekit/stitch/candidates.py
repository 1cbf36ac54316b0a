"""Candidate fusion groups: convex op sets grown from dominant ops, plus horizontal merges.

FusionStitching's candidate generation (arXiv 1911.11576, section 4.2), as used here::

    every op alone                                  (so that every op can be covered)
    for each dominant op (classify.dominant_ops), then each fusable op no group covers yet:
        beam search: add one fusable producer or consumer at a time, keep a group only if it is
        convex and one stitched kernel can run it (schemes.analyze); rank by predicted gain
        (sum of the ops' lone costs minus the group's cost); keep the top-k groups per seed
    horizontal merges: pairs of small kept groups with no path between them whose union is
        still one kernel (independent packing, e.g. sibling reductions)
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from fusekit.hw.cpu_gpu import CPUTarget, GPUTarget
from fusekit.ir.graph import Graph
from fusekit.stitch.classify import FUSABLE, classify_graph, dominant_ops
from fusekit.stitch.model import GroupCost, estimate
from fusekit.stitch.schemes import Layout, Unfusable, analyze


@dataclass(frozen=True)
class Candidate:
    """One candidate kernel.

    Attributes:
        ops: the op names it covers.
        layout: its stitched layout; ``None`` for an op that runs alone (not stitched).
        cost: predicted cost.
        reason: for an op run alone, why it was not stitched.
    """

    ops: frozenset[str]
    layout: Layout | None
    cost: GroupCost
    reason: str = ""

    @property
    def fused(self) -> bool:
        """Whether this is a stitched kernel."""
        return self.layout is not None


@dataclass
class _Grower:
    graph: Graph
    target: CPUTarget | GPUTarget
    cache: dict[frozenset[str], Candidate | None]
    fusable: set[str]

    def lone(self, op: str) -> Candidate:
        try:
            layout = analyze(self.graph, [op]) if op in self.fusable else None
            reason = "" if layout else "not a memory-intensive op"
        except Unfusable as e:
            layout, reason = None, str(e)
        return Candidate(frozenset({op}), layout, estimate(self.graph, [op], self.target, layout),
                         reason)  # fmt: skip

    def group(self, ops: frozenset[str]) -> Candidate | None:
        if ops not in self.cache:
            found: Candidate | None = None
            if self.graph.is_convex(ops):
                try:
                    layout = analyze(self.graph, ops)
                    found = Candidate(ops, layout, estimate(self.graph, ops, self.target, layout))
                except Unfusable:
                    found = None
            self.cache[ops] = found
        return self.cache[ops]

    def neighbours(self, ops: frozenset[str]) -> set[str]:
        near = {n for o in ops for n in (*self.graph.predecessors(o), *self.graph.successors(o))}
        return (near & self.fusable) - ops


def enumerate_candidates(
    graph: Graph,
    target: CPUTarget | GPUTarget,
    *,
    top_k: int = 3,
    beam: int = 4,
    max_ops: int = 48,
    merge_max_ops: int = 8,
    wide_ops: int = 8,
) -> list[Candidate]:
    """All candidates of ``graph``: every op alone, top-k grown groups per seed, merges.

    Args:
        graph: the graph.
        target: where the kernels run (for the costs that rank groups).
        top_k: groups kept per seed.
        beam: groups kept per growth step while the groups have fewer than ``wide_ops`` ops;
            past that, one (the growth goes on greedily: each step analyses every neighbour of
            the group, so a wide beam over large groups costs most of the planning time).
        max_ops: largest group grown.
        merge_max_ops: largest smaller side of a horizontal merge.
        wide_ops: group size from which the beam narrows to one.

    Returns:
        Distinct candidates, singletons first.
    """
    classes = classify_graph(graph)
    fusable = {name for name, cls in classes.items() if cls in FUSABLE}
    grower = _Grower(graph, target, {}, fusable)
    lone = {op.name: grower.lone(op.name) for op in graph.ops}

    def gain(c: Candidate) -> float:
        return sum(lone[o].cost.total_s for o in c.ops) - c.cost.total_s

    kept: dict[frozenset[str], Candidate] = {}
    seeds: list[Candidate] = []

    def grow(seed: str) -> set[str]:
        """Beam search from ``seed``; its top-k groups with a gain join ``kept``; their ops."""
        start = grower.group(frozenset({seed}))
        if start is None:
            return set()
        seeds.append(start)
        frontier, seen = [start], {start.ops}
        pool: list[Candidate] = []
        while frontier:
            grown: list[Candidate] = []
            for cand in frontier:
                if len(cand.ops) >= max_ops:
                    continue
                for n in sorted(grower.neighbours(cand.ops)):
                    ops = cand.ops | {n}
                    if ops in seen:
                        continue
                    seen.add(ops)
                    found = grower.group(ops)
                    if found is not None:
                        grown.append(found)
            grown.sort(key=gain, reverse=True)
            frontier = grown[: beam if len(frontier[0].ops) < wide_ops else 1]
            pool += frontier
        reached: set[str] = set()
        for cand in sorted(pool, key=gain, reverse=True)[:top_k]:
            if len(cand.ops) > 1 and gain(cand) > 0:
                kept[cand.ops] = cand
                reached |= cand.ops
        return reached

    dominant = dominant_ops(graph)
    covered = set(dominant)
    for seed in dominant:
        covered |= grow(seed)
    # a chain the dominant ops' groups could not reach (e.g. elementwise ops before a reshape
    # that their reduction cannot stitch across) seeds its own growth from its last uncovered
    # op, latest first, until every fusable op with a fusable neighbour is in some group
    for op in reversed(graph.ops):
        lonely = op.name in fusable and op.name not in covered
        if lonely and grower.neighbours(frozenset({op.name})):
            covered |= grow(op.name) | {op.name}
    pool = [*seeds, *kept.values()]
    for a, b in itertools.combinations(pool, 2):
        union = a.ops | b.ops
        if min(len(a.ops), len(b.ops)) > merge_max_ops or a.ops & b.ops or union in kept:
            continue
        if graph.descendants(a.ops) & b.ops or graph.descendants(b.ops) & a.ops:
            continue
        found = grower.group(union)
        if found is not None and gain(found) > gain(a) + gain(b):
            kept[union] = found
    return [*lone.values(), *kept.values()]
