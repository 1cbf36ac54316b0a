r"""The fusion plan: a greedy plan, then the ILP over all candidates (HiGHS), warm-started by it.

.. math::

    \min \sum_c t_c x_c \;\text{s.t.}\; \sum_{c \ni o} x_c = 1 \;\forall \text{ops } o,
    \quad \text{no cycle among the chosen groups}, \quad x_c \in \{0,1\}

(FusionStitching, arXiv 1911.11576, section 4.3). The cycle constraints are lazy: each solve's
groups are contracted (:meth:`fusekit.ir.Graph.find_quotient_cycle`) and a cycle found forbids
its chosen candidates together. The greedy plan (best gain first, skipping overlaps and cycles,
the rest alone) is the MIP start, so the ILP answer is never worse; on time-out the best plan
passing every cycle check is returned with a warning. A graph planned before for the same target
and options takes its groups from the plan cache (:mod:`fusekit.stitch.plancache`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from fusekit.hw.cpu_gpu import CPUTarget, GPUTarget
from fusekit.ir.expr import Opaque
from fusekit.ir.graph import Graph, format_graph
from fusekit.ir.refine import refine_dims
from fusekit.search.ilp import solve_partition
from fusekit.stitch import plancache
from fusekit.stitch.candidates import Candidate, enumerate_candidates, rebuild
from fusekit.stitch.epilogue import split_epilogues

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plan:
    """A fusion plan.

    Attributes:
        graph: the planned graph.
        groups: the chosen candidates, in an order that runs each after the groups it reads.
        objective_s: predicted time of the plan (sum of its kernels' costs).
        bound_s: the ILP's proven lower bound.
        greedy_s: predicted time of the greedy plan.
        unfused_s: predicted time with every op alone.
        solve_s: ILP wall time (candidate generation excluded).
        candidates_s: candidate generation wall time.
        n_candidates: candidates the ILP chose from.
        optimal: whether the ILP proved the plan optimal.
        timed_out: whether the time limit cut the ILP short.
        method: ``"ilp"`` or ``"greedy"``.
        cached: whether the groups came from the plan cache (:mod:`fusekit.stitch.plancache`;
            the figures are those of the run that planned them).
    """

    graph: Graph
    groups: tuple[Candidate, ...]
    objective_s: float
    bound_s: float
    greedy_s: float
    unfused_s: float
    solve_s: float
    candidates_s: float
    n_candidates: int
    optimal: bool
    timed_out: bool
    method: str
    cached: bool = False

    @property
    def kernels(self) -> int:
        """Kernels the plan launches."""
        return len(self.groups)

    def describe(self) -> str:
        """The plan in a few lines: totals, then one line per kernel (scheme, ops)."""
        lines = [
            f"{self.graph.name}: {len(self.graph.ops)} ops -> {self.kernels} kernels, predicted "
            f"{self.objective_s * 1e6:.1f} us (every op alone {self.unfused_s * 1e6:.1f} us)"
        ]
        for k, g in enumerate(self.groups):
            scheme = g.layout.scheme.value if g.layout is not None else "alone"
            ops = sorted(g.ops)
            names = ", ".join(ops[:6]) + (f", ... ({len(ops)} ops)" if len(ops) > 6 else "")
            lines.append(f"  {k:3d} {scheme:8s} {names}")
        return "\n".join(lines)


#: Substrings of the ATen ops that draw from torch's random generator.
RANDOM = ("rand", "bernoulli", "normal", "dropout", "multinomial", "exponential", "uniform")


def random_ops(graph: Graph) -> list[str]:
    """The opaque ops that draw random numbers, in program order."""
    return [
        op.name
        for op in graph.ops
        if isinstance(op.expr, Opaque) and any(r in op.expr.target for r in RANDOM)
    ]


def _order(graph: Graph, groups: list[Candidate]) -> tuple[Candidate, ...]:
    """Groups in the order of their first op in the graph's topological order (acyclic plan).

    Ops that draw random numbers run in program order, so that a seeded generator gives the
    numbers eager gives (torch's RNG semantics): each waits for the ones before it.
    """
    position = {name: i for i, name in enumerate(graph.topological_order())}
    drawn = random_ops(graph)
    earlier = {name: set(drawn[:i]) for i, name in enumerate(drawn)}
    remaining = list(groups)
    done: set[str] = set()
    ordered: list[Candidate] = []
    while remaining:
        for g in sorted(remaining, key=lambda c: min(position[o] for o in c.ops)):
            needs = {p for o in g.ops for p in graph.predecessors(o)} - g.ops
            needs |= {p for o in g.ops for p in earlier.get(o, ())} - g.ops
            if needs <= done:
                ordered.append(g)
                done |= g.ops
                remaining.remove(g)
                break
        else:
            raise ValueError("stitch: the chosen groups form a cycle")
    return tuple(ordered)


def greedy(graph: Graph, candidates: list[Candidate]) -> list[int]:
    """Indices of the greedy plan: largest gain first, no overlap, no cycle, the rest alone."""
    lone = {next(iter(c.ops)): i for i, c in enumerate(candidates) if len(c.ops) == 1}

    def gain(c: Candidate) -> float:
        return sum(candidates[lone[o]].cost.total_s for o in c.ops) - c.cost.total_s

    chosen: list[int] = []
    taken: set[str] = set()
    multi = [i for i, c in enumerate(candidates) if len(c.ops) > 1]
    for i in sorted(multi, key=lambda i: gain(candidates[i]), reverse=True):
        c = candidates[i]
        if c.ops & taken or gain(c) <= 0:
            continue
        groups = [candidates[j].ops for j in chosen] + [c.ops]
        if graph.find_quotient_cycle(groups) is None:
            chosen.append(i)
            taken |= c.ops
    chosen += [lone[op.name] for op in graph.ops if op.name not in taken]
    return chosen


def plan(
    graph: Graph,
    target: CPUTarget | GPUTarget,
    *,
    method: str = "ilp",
    time_limit_s: float = 5.0,
    top_k: int = 3,
    cache: bool = True,
) -> Plan:
    """Plan the fusion of ``graph`` for ``target``.

    The graph is planned with its merged dims split (:func:`fusekit.ir.refine.refine_dims`)
    and each GEMM's addend split off (:func:`fusekit.stitch.epilogue.split_epilogues`): the
    plan's graph has the same inputs and outputs and may differ inside.

    Args:
        graph: the graph (ops the planner cannot fuse run alone).
        target: the CPU or GPU.
        method: ``"ilp"`` (HiGHS, greedy warm start) or ``"greedy"``.
        time_limit_s: ILP time limit; the best plan found so far is returned on time-out.
        top_k: candidate groups kept per dominant op.
        cache: read and write the plan cache (:mod:`fusekit.stitch.plancache`; also off with
            ``FUSEKIT_PLAN_CACHE=0``).

    Returns:
        The :class:`Plan`.

    Raises:
        ValueError: for an unknown ``method``.
    """
    if method not in ("ilp", "greedy"):
        raise ValueError(f"stitch: expected 'method' to be 'ilp' or 'greedy' (got {method!r})")
    start = time.perf_counter()
    graph = refine_dims(graph)  # reshapes of merged dims become plain reads
    graph = split_epilogues(graph)  # a GEMM's bias add may stitch into its consumer
    key = None
    if cache and plancache.enabled():
        key = plancache.plan_key(format_graph(graph), target, (method, time_limit_s, top_k))
        hit = _cached(graph, target, key)
        if hit is not None:
            return hit
    found = _plan(graph, target, method, time_limit_s, top_k, start)
    if key is not None:
        plancache.store(key, [sorted(g.ops) for g in found.groups],
                        {k: getattr(found, k) for k in plancache.FIGURES})  # fmt: skip
    return found


def _cached(graph: Graph, target: CPUTarget | GPUTarget, key: str) -> Plan | None:
    """The plan cached under ``key``, its groups rebuilt; ``None`` if absent or stale."""
    entry = plancache.load(key)
    if entry is None:
        return None
    try:
        groups = rebuild(graph, target, [frozenset(g) for g in entry["groups"]])
        covered = sorted(o for g in groups for o in g.ops)
        if covered != sorted(op.name for op in graph.ops):
            raise ValueError("stitch: a cached plan does not cover every op once")
        ordered = _order(graph, groups)
    except ValueError as e:
        log.info("stitch: planning again: %s", e)
        return None
    figures = {k: entry[k] for k in plancache.FIGURES}
    return Plan(graph, ordered, **figures, cached=True)


def _plan(
    graph: Graph,
    target: CPUTarget | GPUTarget,
    method: str,
    time_limit_s: float,
    top_k: int,
    start: float,
) -> Plan:
    """:func:`plan` on the refined graph, without the cache."""
    candidates = enumerate_candidates(graph, target, top_k=top_k)
    candidates_s = time.perf_counter() - start
    unfused_s = sum(c.cost.total_s for c in candidates if len(c.ops) == 1)
    warm = greedy(graph, candidates)
    greedy_s = sum(candidates[i].cost.total_s for i in warm)
    if method == "greedy":
        chosen = [candidates[i] for i in warm]
        return Plan(graph, _order(graph, chosen), greedy_s, 0.0, greedy_s, unfused_s, 0.0,
                    candidates_s, len(candidates), False, False, "greedy")  # fmt: skip
    index = {op.name: i for i, op in enumerate(graph.ops)}
    by_ops = {c.ops: i for i, c in enumerate(candidates)}

    def cycles(chosen: list[int]) -> list[list[int]]:
        groups = [candidates[i].ops for i in chosen if len(candidates[i].ops) > 1]
        cycle = graph.find_quotient_cycle(groups)
        if cycle is None:
            return []
        return [[by_ops[g] for g in cycle if g in by_ops]]

    result = solve_partition(
        [c.cost.total_s for c in candidates],
        [[index[o] for o in c.ops] for c in candidates],
        len(graph.ops),
        lazy=cycles,
        warm_start=warm,
        time_limit_s=time_limit_s,
    )
    if result.timed_out:
        log.warning("stitch: the ILP hit its %.3g s limit; using the best plan found", time_limit_s)
    chosen = [candidates[i] for i in result.chosen]
    return Plan(graph, _order(graph, chosen), result.objective, result.bound, greedy_s, unfused_s,
                result.solve_s, candidates_s, len(candidates), result.optimal, result.timed_out,
                "ilp")  # fmt: skip
