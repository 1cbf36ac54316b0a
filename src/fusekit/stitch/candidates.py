"""Candidate fusion groups: convex op sets grown from dominant ops, plus horizontal merges.

FusionStitching's candidate generation (arXiv 1911.11576, section 4.2), as used here::

    every op alone                                  (so that every op can be covered)
    for each dominant op (classify.dominant_ops), then each fusable op no group covers yet:
        beam search: add one fusable producer or consumer at a time, keep a group only if it is
        convex and one stitched kernel can run it (schemes.analyze); rank by predicted gain
        (sum of the ops' lone costs minus the group's cost); keep the top-k groups per seed
    horizontal merges: pairs of small kept groups with no path between them whose union is
        still one kernel (independent packing, e.g. sibling reductions)

On a large graph (more than ``beam_ops`` fusable ops) the beam search is replaced by a greedy
merge, as Inductor's scheduler fuses: start from every op alone, repeatedly merge the pair of
groups (a producer and its consumer, or two readers of one tensor) with the largest predicted
gain whose union is one kernel and leaves the groups acyclic, until no merge gains. Every group
formed on the way is a candidate, so the final partition is one feasible plan and the ILP may
still split what the merge joined. The beam's groups overlap one another (each is grown from
its own seed, and on a long chain such as the layers of a backward graph each reaches into the
next layers), so on a large graph they tile it badly and cost most of the planning time.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fusekit.hw.cpu_gpu import CPUTarget, GPUTarget
from fusekit.ir.expr import Access, IBin, IndexTerm, IVar, walk
from fusekit.ir.graph import Graph
from fusekit.ir.op import Op
from fusekit.stitch.classify import FUSABLE, OpClass, classify_graph, dominant_ops
from fusekit.stitch.epilogue import epilogue_gemm
from fusekit.stitch.model import GroupCost, estimate, estimate_epilogue
from fusekit.stitch.schemes import Layout, Unfusable, analyze, fold_layouts


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
    #: layout ops that only feed returned views (:func:`returned_views`): each alone
    views: set[str] = field(default_factory=set)
    nonconvex: set[frozenset[str]] = field(default_factory=set)

    def lone(self, op: str) -> Candidate:
        try:
            layout = analyze(self.graph, [op]) if op in self.fusable | self.views else None
            reason = "" if layout else "not a memory-intensive op"
        except Unfusable as e:
            layout, reason = None, str(e)
        gemm = epilogue_gemm(self.graph, op)
        cost = (
            estimate(self.graph, [op], self.target, layout) if gemm is None
            else estimate_epilogue(self.graph, gemm, op, self.target)
        )  # fmt: skip
        return Candidate(frozenset({op}), layout, cost, reason)

    def group(self, ops: frozenset[str]) -> Candidate | None:
        """The candidate of ``ops`` if it is convex and one kernel (memoised), else ``None``.

        A set in ``cache`` passed this check: the greedy merge (``group_unchecked``) and the
        beam search never run on one graph.
        """
        if ops in self.nonconvex or (ops not in self.cache and not self.graph.is_convex(ops)):
            self.nonconvex.add(ops)
            return None
        return self.group_unchecked(ops)

    def group_unchecked(self, ops: frozenset[str]) -> Candidate | None:
        """:meth:`group` without the convexity check (the caller keeps the groups acyclic)."""
        if ops not in self.cache:
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


def returned_views(graph: Graph, classes: Mapping[str, OpClass]) -> set[str]:
    """Layout ops that only feed the graph's outputs through layout ops (and no other op).

    Eager returns these as views of a computed tensor (``out.view(-1, h).t()`` for the next
    GEMM's backward); each runs alone as a view. Grouped, the first of them would be a copy
    written by its source's kernel, a transposed one at that.
    """
    views: set[str] = set()
    for op in reversed(graph.ops):
        if classes.get(op.name) is not OpClass.LAYOUT:
            continue
        readers = graph.consumers(op.name)
        if (op.name in graph.outputs or readers) and all(r.name in views for r in readers):
            views.add(op.name)
    # only chains with a transpose: a returned reshape or unsqueeze costs its group nothing
    kept: set[str] = set()
    for leaf in (n for n in graph.outputs if n in views):
        chain, name = [], leaf
        while name in views and name not in chain:
            chain.append(name)
            sources = [t for t in graph.op(name).inputs if t in views]
            name = sources[0] if sources else ""
        if _strided(graph, chain[::-1]):
            kept.update(chain)
    return kept


def _strided(graph: Graph, chain: Sequence[str]) -> bool:
    """Whether a chain of layout ops (source first) transposes and each is a strided view.

    A view eager cannot make either (a reshape of a transposed tensor) is better written by
    its source's kernel than copied again after it.
    """
    from fusekit.ir.strides import fit_strides
    from fusekit.stitch.codegen.render import strides

    if not any(_transposes(graph.op(n)) for n in chain):
        return False
    folded: dict[str, Op] = {}
    for name in chain:
        op = graph.op(name)
        try:
            read = fold_layouts(op.expr, folded)
        except Unfusable:
            return False
        out_vars = tuple(t.name for t in op.out.indices if isinstance(t, IVar))
        shape = graph.tensor(name).shape
        if not isinstance(read, Access) or len(out_vars) != len(op.out.indices):
            return False
        source = graph.tensor(read.tensor).shape
        if not all(isinstance(d, int) for d in (*shape, *source)):
            return False
        sizes = tuple(int(d) for d in shape)
        if (
            fit_strides(read, out_vars, sizes, tuple(strides(tuple(int(d) for d in source))))
            is None
        ):
            return False
        folded[name] = op
    return True


def _transposes(op: Op) -> bool:
    """Whether a layout op reads its source in another order of its variables than it writes."""
    out = [t.name for t in op.out.indices if isinstance(t, IVar)]
    read = [
        v.name for n in walk(op.expr) if isinstance(n, Access)
        for t in n.indices for v in _ivars(t)
    ]  # fmt: skip
    common = [v for v in dict.fromkeys(read) if v in out]
    return common != [v for v in out if v in common]


def _ivars(t: IndexTerm) -> list[IVar]:
    if isinstance(t, IVar):
        return [t]
    if isinstance(t, IBin):
        return [*_ivars(t.left), *_ivars(t.right)]
    return []


def rebuild(
    graph: Graph, target: CPUTarget | GPUTarget, groups: list[frozenset[str]]
) -> list[Candidate]:
    """The candidates of ``groups`` (a cached plan's), as :func:`enumerate_candidates` makes them.

    Raises:
        ValueError: if some group is no longer one kernel of ``graph`` (an unknown op, or a
            group that does not stitch).
    """
    classes = classify_graph(graph)
    views = returned_views(graph, classes)
    fusable = {name for name, cls in classes.items() if cls in FUSABLE} - views
    grower = _Grower(graph, target, {}, fusable, views)
    known = {op.name for op in graph.ops}
    out = []
    for ops in groups:
        if not ops <= known:
            raise ValueError(f"stitch: a cached group names unknown ops {sorted(ops - known)}")
        found = grower.lone(next(iter(ops))) if len(ops) == 1 else grower.group_unchecked(ops)
        if found is None:
            raise ValueError(f"stitch: a cached group no longer stitches: {sorted(ops)}")
        out.append(found)
    return out


def enumerate_candidates(
    graph: Graph,
    target: CPUTarget | GPUTarget,
    *,
    top_k: int = 3,
    beam: int = 4,
    max_ops: int = 48,
    merge_max_ops: int = 8,
    wide_ops: int = 8,
    beam_ops: int = 64,
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
        beam_ops: most fusable ops for the beam search; a larger graph is merged greedily.

    Returns:
        Distinct candidates, singletons first.
    """
    classes = classify_graph(graph)
    views = returned_views(graph, classes)
    fusable = {name for name, cls in classes.items() if cls in FUSABLE} - views
    grower = _Grower(graph, target, {}, fusable, views)
    lone = {op.name: grower.lone(op.name) for op in graph.ops}

    def gain(c: Candidate) -> float:
        return sum(lone[o].cost.total_s for o in c.ops) - c.cost.total_s

    kept: dict[frozenset[str], Candidate] = {}
    seeds: list[Candidate] = []
    if len(fusable) > beam_ops:
        for cand in merge_greedily(grower, lone, max_ops):
            kept[cand.ops] = cand
        return [*lone.values(), *kept.values()]

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


#: Most full-size arrays (inputs and outputs as large as the iteration space) one merged kernel
#: streams. Past the 8 ways of an L1 set, rows of arrays that sit at the same offset in their
#: pages (every large allocation) evict each other between the stages of a row: a kernel
#: stitching two LayerNorm backwards (9 such arrays) ran 7x slower per byte than one (4). That
#: was measured before the row loops were compiled noalias (codegen/noalias.py), when LLVM
#: vectorised a loop over many arrays only behind run-time overlap checks, so part of it may
#: have been scalar code. With noalias, merging GPT-2's and Llama's residual streams past this
#: limit (up to 66 arrays) was not faster, so the limit stays.
MAX_STREAMS = 8


def streams(graph: Graph, layout: Layout) -> int:
    """The group's inputs and outputs with as many elements as its iteration space."""
    n = math.prod(layout.extents)
    return sum(1 for t in (*layout.inputs, *layout.outputs) if graph.tensor(t).numel() >= n)


def merge_greedily(grower: _Grower, lone: dict[str, Candidate], max_ops: int) -> list[Candidate]:
    """Every group a greedy producer-consumer merge forms (module docstring), in merge order.

    A merge of groups ``a`` and ``b`` is allowed when no path of groups leads from one to the
    other through a third (the quotient graph stays acyclic, so every group stays convex) and
    :func:`analyze` accepts the union; its gain is ``cost(a) + cost(b) - cost(a | b)``.
    """
    graph = grower.graph
    group_of = {name: name for name in lone}  # op -> id of its group (an op name)
    members: dict[str, frozenset[str]] = {name: frozenset({name}) for name in lone}
    cost = {name: c.cost.total_s for name, c in lone.items()}
    succ: dict[str, set[str]] = {n: set(graph.successors(n)) for n in lone}
    pred: dict[str, set[str]] = {n: set(graph.predecessors(n)) for n in lone}
    version = dict.fromkeys(lone, 0)
    heap: list[tuple[float, str, str, int, int]] = []
    formed: list[Candidate] = []

    def push(a: str, b: str) -> None:
        """Queue the merge of groups ``a`` and ``b`` (neighbours or siblings) if it gains."""
        ops = members[a] | members[b]
        if len(ops) > max_ops or not ops <= grower.fusable:
            return
        found = grower.group_unchecked(ops)
        if found is None or found.layout is None or streams(graph, found.layout) > MAX_STREAMS:
            return
        gain = cost[a] + cost[b] - found.cost.total_s
        if gain > 0:
            heapq.heappush(heap, (-gain, a, b, version[a], version[b]))

    def reaches(a: str, b: str) -> bool:
        """Whether a path of two or more group edges leads from ``a`` to ``b``."""
        stack = [s for s in succ[a] if s != b]
        seen = set(stack)
        while stack:
            g = stack.pop()
            if g == b:
                return True
            for s in succ[g]:
                if s not in seen:
                    seen.add(s)
                    stack.append(s)
        return False

    for op in graph.ops:
        if op.name in grower.fusable:
            for s in graph.successors(op.name):
                if s in grower.fusable:
                    push(op.name, s)
    for t in graph.tensors:  # siblings: two readers of one tensor read it once together
        readers = [c.name for c in graph.consumers(t.name) if c.name in grower.fusable]
        for a, b in itertools.combinations(readers[:8], 2):
            push(a, b)
    while heap:
        _, a, b, va, vb = heapq.heappop(heap)
        if version.get(a) != va or version.get(b) != vb:
            continue  # one side merged since: its pairs were queued again
        if reaches(a, b) or reaches(b, a):
            continue
        cand = grower.group_unchecked(members[a] | members[b])
        assert cand is not None
        # b joins a: a keeps its id
        for name in members[b]:
            group_of[name] = a
        members[a] = cand.ops
        cost[a] = cand.cost.total_s
        succ[a] = (succ[a] | succ.pop(b)) - {a, b}
        pred[a] = (pred[a] | pred.pop(b)) - {a, b}
        for g in succ[a]:
            pred[g] = (pred[g] - {b}) | {a}
        for g in pred[a]:
            succ[g] = (succ[g] - {b}) | {a}
        del members[b], cost[b], version[b]
        version[a] += 1
        formed.append(cand)
        for g in pred[a]:
            push(g, a)
        for g in succ[a]:
            push(a, g)
        for g in {group_of[c.name] for t in cand.ops for p in graph.predecessors(t)
                  for c in graph.consumers(p)} - {a}:  # fmt: skip
            push(a, g)
    return formed
