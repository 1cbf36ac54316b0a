"""The mapper: enumerate mappings, prune by a lower bound, evaluate in parallel, keep the best.

Work is split into chunks of candidates and run through a :class:`fusekit.search.Executor`. In
each chunk and for each fusion level, a candidate whose lower bound (latency and energy,
:func:`fusekit.accel.bound.lower_bound`) is dominated by a mapping already evaluated is skipped:
it can be neither on the Pareto front nor the best by latency, energy or energy-delay product.
One bound serves every loop order, binding and collective model of a (fusion, partition, tiles)
point, so it is computed once per point (and binding). The fronts of the chunks are merged at
the end.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from fusekit.accel.bound import lower_bound
from fusekit.accel.candidates import enumerate_mappings
from fusekit.accel.mapping import Fusion, Mapping
from fusekit.accel.model import evaluate, prepare
from fusekit.accel.problem import Problem, make_problem
from fusekit.hw import Accelerator
from fusekit.hw.cpu_gpu import plain
from fusekit.ir import format_op
from fusekit.search import Executor, SerialExecutor

log = logging.getLogger(__name__)

Objective = Literal["latency", "energy", "edp"]
OBJECTIVES: tuple[Objective, ...] = ("latency", "energy", "edp")
#: Candidates per chunk: a worker's job, with one stage memo (:func:`fusekit.accel.model.prepare`).
CHUNK_SIZE = 4000


@dataclass(frozen=True, slots=True)
class Scored:
    """A mapping with its cost."""

    mapping: Mapping
    latency_cycles: float
    energy_pj: float

    @property
    def edp(self) -> float:
        """Energy-delay product."""
        return self.latency_cycles * self.energy_pj

    def score(self, objective: Objective) -> tuple[float, float]:
        """The value ``objective`` minimises, then the tie-break (the other of the two)."""
        if objective == "latency":
            return self.latency_cycles, self.energy_pj
        if objective == "energy":
            return self.energy_pj, self.latency_cycles
        return self.edp, self.latency_cycles


@dataclass(frozen=True, slots=True)
class SearchResult:
    """What the mapper found.

    Attributes:
        best: objective -> best mapping over every fusion level.
        best_by_fusion: fusion level -> objective -> best mapping of that level.
        pareto: the latency-energy Pareto front, by latency.
        candidates: valid mappings enumerated.
        evaluated: mappings the cost model evaluated (the rest were pruned).
        wall_s: wall-clock seconds of the search.
        workers: executor workers.
    """

    best: dict[Objective, Scored]
    best_by_fusion: dict[Fusion, dict[Objective, Scored]]
    pareto: tuple[Scored, ...]
    candidates: int
    evaluated: int
    wall_s: float
    workers: int

    @property
    def evaluated_per_s_per_worker(self) -> float:
        """Cost-model evaluations per second per worker."""
        return self.evaluated / self.wall_s / self.workers if self.wall_s > 0 else math.inf


def pareto_front(points: Sequence[Scored]) -> tuple[Scored, ...]:
    """The points no other point beats in both latency and energy, by latency."""
    front: list[Scored] = []
    for p in sorted(points, key=lambda s: (s.latency_cycles, s.energy_pj)):
        if not front or p.energy_pj < front[-1].energy_pj:
            front.append(p)
    return tuple(front)


ProblemSpec = tuple[str, tuple[str, ...], tuple[tuple[str, int], ...]]


def problem_spec(problem: Problem) -> ProblemSpec:
    """A small picklable key that rebuilds ``problem`` (see :func:`make_problem`)."""
    ops = tuple(format_op(s.op) for s in problem.stages)
    return problem.name, ops, tuple(problem.extents.items())


@lru_cache(maxsize=16)
def _problem(spec: ProblemSpec) -> Problem:
    return make_problem(spec[0], spec[1], dict(spec[2]))


def picklable(hw: Accelerator) -> Accelerator:
    """``hw`` with plain-dict tables, so that it can be sent to worker processes."""
    return dataclasses.replace(
        hw,
        simd_op_pj=dict(hw.simd_op_pj),
        simd_op_cycles=dict(hw.simd_op_cycles),
        comet_arch=plain(hw.comet_arch) if hw.comet_arch is not None else None,
    )


ChunkResult = tuple[list[Scored], dict[Fusion, dict[Objective, Scored]], int]


def evaluate_chunk(
    item: tuple[ProblemSpec, Accelerator, list[Mapping], Objective | Literal["pareto"] | None],
) -> ChunkResult:
    """Evaluate one chunk with lower-bound pruning (a worker's job).

    Returns:
        The chunk's fronts (all fusion levels), its best per fusion level and objective, and
        how many mappings were evaluated.
    """
    spec, hw, mappings, prune = item
    problem = _problem(spec)
    prepared = prepare(problem, hw)  # once per chunk
    fronts: dict[Fusion, list[Scored]] = {}
    best: dict[Fusion, dict[Objective, Scored]] = {}
    evaluated = 0
    bounds: dict[tuple[object, ...], tuple[float, float]] = {}
    for m in mappings:
        front = fronts.setdefault(m.fusion, [])
        mine = best.setdefault(m.fusion, {})
        if prune and front:
            key = (
                m.fusion,
                m.binding,
                m.spatial_row,
                m.spatial_col,
                m.tile_row,
                m.tile_col,
                m.tile_red,
            )
            if key not in bounds:
                bounds[key] = lower_bound(problem, hw, m, prepared.rates)
            lb = Scored(m, *bounds[key])
            if prune == "pareto":
                if lb.edp >= mine["edp"].edp and any(
                    f.latency_cycles <= lb.latency_cycles and f.energy_pj <= lb.energy_pj
                    for f in front
                ):
                    continue
            elif lb.score(prune) >= mine[prune].score(prune):
                continue
        b = evaluate(problem, hw, m, prepared)
        evaluated += 1
        s = Scored(m, b.latency_cycles, b.energy_pj)
        if not any(
            f.latency_cycles <= s.latency_cycles and f.energy_pj <= s.energy_pj for f in front
        ):
            front[:] = [
                f
                for f in front
                if not (s.latency_cycles <= f.latency_cycles and s.energy_pj <= f.energy_pj)
            ]
            front.append(s)
        for obj in OBJECTIVES:
            if obj not in mine or s.score(obj) < mine[obj].score(obj):
                mine[obj] = s
    return [s for f in fronts.values() for s in f], best, evaluated


def explore(
    problem: Problem,
    hw: Accelerator,
    executor: Executor | None = None,
    fusions: Sequence[Fusion] = tuple(Fusion),
    collectives: Sequence[str] = ("mesh", "ring", "tree"),
    chunk_size: int = CHUNK_SIZE,
    prune: Objective | Literal["pareto"] | None = "pareto",
    on_chunk: Callable[[int, int], None] | None = None,
) -> SearchResult:
    """Search the mapping space of ``problem`` on ``hw``.

    Args:
        problem: the compound op.
        hw: the accelerator.
        executor: where chunks run; :class:`SerialExecutor` by default.
        fusions: fusion levels to search.
        collectives: collective cost models to search.
        chunk_size: candidates per chunk.
        prune: ``"pareto"`` skips candidates whose bound is dominated by an evaluated mapping
            and cannot beat the best EDP (exact front and bests); an objective skips those whose
            bound cannot beat that objective's best (exact best for it, partial front);
            ``None`` evaluates everything.
        on_chunk: called as ``on_chunk(done, total)`` after the chunks come back.

    Returns:
        The best mappings and the Pareto front.

    Raises:
        ValueError: no valid mapping exists.
    """
    executor = executor or SerialExecutor()
    start = time.perf_counter()
    candidates = list(enumerate_mappings(problem, hw, fusions, collectives=collectives))
    if not candidates:
        raise ValueError(f"accel: expected at least one valid mapping of {problem.name} (got none)")
    spec, sendable = problem_spec(problem), picklable(hw)
    chunks = [
        (spec, sendable, candidates[i : i + chunk_size], prune)
        for i in range(0, len(candidates), chunk_size)
    ]
    results = executor.map(evaluate_chunk, chunks)
    if on_chunk is not None:
        on_chunk(len(chunks), len(chunks))
    points = [s for r in results for s in r[0]]
    best_by_fusion: dict[Fusion, dict[Objective, Scored]] = {}
    for _, best, _ in results:
        for fusion, per in best.items():
            mine = best_by_fusion.setdefault(fusion, {})
            for obj, s in per.items():
                if obj not in mine or s.score(obj) < mine[obj].score(obj):
                    mine[obj] = s
    overall = {
        obj: min((per[obj] for per in best_by_fusion.values()), key=lambda s: s.score(obj))
        for obj in OBJECTIVES
    }
    wall_s = time.perf_counter() - start
    evaluated = sum(r[2] for r in results)
    log.info("explored %d candidates, evaluated %d in %.2f s", len(candidates), evaluated, wall_s)
    return SearchResult(
        overall,
        best_by_fusion,
        pareto_front(points),
        len(candidates),
        evaluated,
        wall_s,
        executor.workers,
    )
