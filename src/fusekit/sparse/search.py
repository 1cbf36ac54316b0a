"""The explorer: enumerate schedules, rank them with the estimator, simulate the best few.

The flow, as in every part of fusekit::

    candidates   enumerate_schedules: cuts x orders x storage (x parallelism)
    cost model   estimate: FLOPs, bytes and cycles from level statistics (model.py)
    search       keep the `top` best estimates of each cut, simulate them (simulate.py),
                 check every simulated output against the reference, return the ranking
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fusekit.sparse.candidates import Patterns, enumerate_schedules
from fusekit.sparse.machine import Machine
from fusekit.sparse.model import Estimate, Statistics, estimate, estimate_region
from fusekit.sparse.program import Program, reference
from fusekit.sparse.schedule import CUTS, Schedule
from fusekit.sparse.simulate import SimResult, simulate
from fusekit.sparse.workloads import Workload

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Point:
    """One explored schedule.

    Attributes:
        schedule: the schedule.
        estimate: the estimator's answer.
        result: the simulation, or ``None`` when pruned.
        correct: whether the simulated outputs equal the reference (``None`` when pruned).
        sim_s: wall time of the simulation.
    """

    schedule: Schedule
    estimate: Estimate
    result: SimResult | None
    correct: bool | None
    sim_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Exploration:
    """The explored space of one workload.

    Attributes:
        workload: its name.
        points: every enumerated schedule, best estimate first.
        candidates: how many schedules were enumerated.
    """

    workload: str
    points: tuple[Point, ...]
    candidates: int

    @property
    def simulated(self) -> list[Point]:
        """The simulated points, fastest first."""
        pts = [p for p in self.points if p.result is not None]
        return sorted(pts, key=lambda p: p.result.cycles if p.result else 0.0)

    def best(self, cut: str | None = None) -> Point:
        """The fastest simulated point (of one cut)."""
        pts = [p for p in self.simulated if cut is None or p.schedule.cut == cut]
        if not pts:
            raise ValueError(f"sparse: no simulated schedule for cut {cut!r}")
        return pts[0]

    def estimator_rank_of_best(self) -> int:
        """The estimator's rank (1 = first) of the best simulated schedule among the simulated."""
        sims = [p for p in self.points if p.result is not None]
        best = self.best()
        by_estimate = sorted(sims, key=lambda p: p.estimate.cycles)
        return 1 + next(k for k, p in enumerate(by_estimate) if p is best)


def matches_reference(
    actual: np.ndarray, expected: np.ndarray, dtype: np.dtype | type, terms: int
) -> bool:
    """Whether a simulated output equals the float64 reference to ``dtype``'s rounding.

    A sum of ``n`` rounded terms strays by about ``sqrt(n)`` roundings (random-walk growth; the
    worst case is ``n``); cancellation can make any one entry small, so the bound is taken
    relative to the largest entry as well as to each::

        rtol = 16 * eps(dtype) * sqrt(terms)
        |actual - expected| <= rtol * |expected| + rtol * max |expected|

    float32: ``rtol`` is 1.9e-6 for one term, 7.6e-5 for 1,433 (Cora's features);
    float64: 4.2e-14 for 1,433.

    Args:
        actual: the simulated output.
        expected: the reference (computed in float64).
        dtype: the precision the program computes in (its least precise input).
        terms: how many terms were summed into each entry (see :func:`terms`).
    """
    kind = np.dtype(dtype)
    eps = float(np.finfo(kind).eps) if kind.kind == "f" else float(np.finfo(np.float64).eps)
    rtol = 16.0 * eps * float(np.sqrt(max(terms, 1)))
    scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    return bool(np.allclose(actual, expected, rtol=rtol, atol=rtol * scale))


def compute_dtype(program: Program, name: str) -> np.dtype:
    """The least precise floating dtype among the stored inputs ``name`` is computed from."""
    dtypes = [program.inputs[t].values.dtype for t in _sources(program, name)]
    floats = [d for d in dtypes if d.kind == "f"] or [np.dtype(np.float64)]
    return max(floats, key=lambda d: float(np.finfo(d).eps))


def terms(program: Program, name: str) -> int:
    """Terms summed into each entry of ``name``, along its chain of statements.

    Each statement adds the product of its reduced variables' extents (1 for a map); errors of
    a chain add up. A stored input has none.
    """
    st = program.producer(name)
    if st is None:
        return 0
    ext = program.extents(st)
    own = int(np.prod([ext[v] for v in st.reduce_vars])) if st.reduce_vars else 1
    return own + sum(terms(program, t) for t in {o.tensor for o in st.operands})


def _sources(program: Program, name: str) -> set[str]:
    st = program.producer(name)
    if st is None:
        return {name}
    return set().union(*(_sources(program, o.tensor) for o in st.operands))


def explore(
    workload: Workload,
    machine: Machine | None = None,
    cuts: tuple[str, ...] = CUTS,
    top: int = 3,
    par: tuple[int, int] | None = None,
    limit: int = 200,
    check: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> Exploration:
    """Enumerate, estimate, prune and simulate the schedules of one workload.

    Args:
        workload: the program and its layers.
        machine: the machine (:class:`Machine()` by default).
        cuts: the region cuts to consider.
        top: how many of the best estimates of each cut to simulate.
        par: parallelism applied to every schedule.
        limit: most schedules enumerated per cut.
        check: compare every simulated output with the numpy reference.
        progress: called as ``progress(done, total)`` after each simulation.

    Returns:
        Every schedule with its estimate, and the simulations of the kept ones.
    """
    machine = machine or Machine()
    program = workload.program
    patterns = Patterns.of(program)
    stats = Statistics(program, patterns)

    def rank(
        region: tuple[str, ...],
        orders: dict[str, tuple[str, ...]],
        storage: tuple[tuple[str, str, tuple[int, ...]], ...],
        stored: dict[str, tuple[int, ...]],
    ) -> float:
        return estimate_region(
            program, region, orders, stats, stored, machine, par, storage=storage
        )[0]

    schedules = enumerate_schedules(workload, cuts, par, rank, limit=limit)
    estimates = [estimate(program, s, stats, machine) for s in schedules]
    order = np.argsort([e.cycles for e in estimates], kind="stable")
    want = set()
    for cut in cuts:
        want |= {int(i) for i in [i for i in order if schedules[i].cut == cut][:top]}
    expected = reference(program) if check else {}
    points = []
    for i in order:
        s, e = schedules[i], estimates[i]
        if int(i) not in want:
            points.append(Point(s, e, None, None))
            continue
        start = time.perf_counter()
        r = simulate(program, s, machine)
        elapsed = time.perf_counter() - start
        ok = (
            all(
                matches_reference(
                    r.outputs[n], expected[n], compute_dtype(program, n), terms(program, n)
                )
                for n in program.outputs
            )
            if check
            else None
        )
        log.info("%s: %s -> %.0f cycles (%.2f s)", workload.name, s.label(), r.cycles, elapsed)
        points.append(Point(s, e, r, ok, elapsed))
        if progress is not None:
            progress(sum(p.result is not None for p in points), len(want))
    return Exploration(workload.name, tuple(points), len(schedules))
