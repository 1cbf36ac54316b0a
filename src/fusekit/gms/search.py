"""Tune a g-mm-s problem: rank its configuration space by the model, measure only the best few.

The flow of :func:`tune`::

    features(plan(problem))           sizes, GEMM rows of each order, skew (fusekit.gms.features)
    space = cpu_space | gpu_space     every strategy x plan knobs x launch knobs (candidates)
    predicted = model.predict(...)    one number per point, no kernel runs (fusekit.gms.model)
    chosen = best point of every strategy, then the next best overall, up to the budget
    measure chosen points             in an Executor (serial, local processes, Ray); every batch
                                      goes into the TuningCache as soon as it is measured, and
                                      points already there are not measured again (resumable);
                                      the cache is read through check_point/check_coef, so a
                                      corrupt or planted part is never used
    best measured point -> TuneResult

``exhaustive=True`` measures every point, for comparison (``benchmarks/gms_search.py``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fusekit.errors import expected
from fusekit.gms import model
from fusekit.gms.api import gms
from fusekit.gms.candidates import Config, Strategy, config_of, cpu_space, gpu_space
from fusekit.gms.features import Features, features, signature
from fusekit.gms.launch import launch
from fusekit.gms.planning.build import plan
from fusekit.hw import CPUTarget, GPUTarget, detect
from fusekit.search.executor import Executor, SerialExecutor
from fusekit.search.measure import time_call
from fusekit.search.space import Point, Space, point_key

if TYPE_CHECKING:
    from fusekit.gms.planning.layout import GMSPlan
    from fusekit.gms.problem import GMSProblem
    from fusekit.search.cache import TuningCache

#: Name of the gms model's coefficients in the tuning cache.
MODEL_NAME = "gms-model"
#: Default share of the space a pruned search measures.
DEFAULT_BUDGET = 0.05


def hardware_key(target: CPUTarget | GPUTarget) -> str:
    """What identifies a machine for cached measurements: its identity, not its measured rates.

    ``detect()`` re-measures bandwidth and FLOP/s with some noise; the key uses the name,
    description (processor model, threads), parallel units and cache size, which do not move.
    """
    ident = {
        "kind": target.kind,
        "name": target.name,
        "description": target.description,
        "units": target.parallel_units,
        "llc": target.last_level_cache_bytes,
    }
    blob = json.dumps(ident, sort_keys=True).encode()
    return f"{target.name}-{hashlib.sha256(blob).hexdigest()[:12]}"


def space_of(f: Features, target: CPUTarget | GPUTarget) -> Space:
    """The configuration space of a problem on a target."""
    if isinstance(target, CPUTarget):
        return cpu_space(f.reduce, target.cores)
    elem = {"fp64": 8, "fp32": 4}.get(f.dtype, 2)
    return gpu_space(f.reduce, target.shared_mem_per_sm_bytes, f.k, f.m, elem)


_SPACES: dict[tuple[Any, ...], tuple[list[Point], list[Config], frozenset[str]]] = {}


def _space(f: Features, target: CPUTarget | GPUTarget) -> tuple[list[Point], list[Config], Any]:
    key = (target.name, target.parallel_units, f.reduce, f.dtype, f.k, f.m)
    if key not in _SPACES:
        points = space_of(f, target).points()
        keys = frozenset(point_key(p) for p in points)
        _SPACES[key] = (points, [config_of(p) for p in points], keys)
    return _SPACES[key]


def space_configs(f: Features, target: CPUTarget | GPUTarget) -> tuple[list[Point], list[Config]]:
    """The points of a problem's space and their configurations, enumerated once per kind.

    Spaces depend only on the target, the reduce, the dtype and the widths, so the tuner, the
    selector and the commands share one enumeration (treat the lists as read-only).
    """
    points, configs, _ = _space(f, target)
    return points, configs


def space_keys(f: Features, target: CPUTarget | GPUTarget) -> frozenset[str]:
    """The point keys of a problem's space: a cached point outside them is never used."""
    keys: frozenset[str] = _space(f, target)[2]
    return keys


# ---- what a tuning cache may hold for gms (the cache itself checks only generic types) ----


@functools.cache
def _knobs(kind: str) -> dict[str, tuple[Any, ...]]:
    """Knob name -> legal values of the CPU or GPU spaces (values that depend on no problem)."""
    space = cpu_space("sum", 1) if kind == "cpu" else gpu_space("sum", 1 << 30, 1 << 20, 1 << 20, 4)
    return {k.name: k.values for k in space.knobs}


def check_point(point: Mapping[str, Any]) -> None:
    """Raise unless ``point`` is a point of some gms CPU or GPU space.

    The strategy must be a known one; every other knob must be one of its legal values, with
    the CPU ``threads`` any int >= 1 (the legal set depends on the machine).

    Raises:
        ValueError: an unknown strategy, missing or extra knobs, or an illegal value.
    """
    if not isinstance(point.get("strategy"), str):
        raise ValueError(
            expected("gms cache", "strategy", "a strategy name", point.get("strategy"))
        )
    Strategy.parse(point["strategy"])
    knobs = _knobs("cpu" if "threads" in point else "gpu")
    if set(point) != set(knobs):
        raise ValueError(
            expected("gms cache", "point", f"the knobs {sorted(knobs)}", sorted(point))
        )
    for name, values in knobs.items():
        value = point[name]
        if name == "threads":
            legal = type(value) is int and value >= 1
        else:
            legal = name == "strategy" or any(type(value) is type(v) and value == v for v in values)
        if not legal:
            raise ValueError(expected("gms cache", name, "a legal value", repr(value)))


def check_coef(coef: Mapping[str, float]) -> None:
    """Raise unless ``coef`` names only model terms, each > 0 (as :func:`model.fit` returns).

    Raises:
        ValueError: an unknown term or a coefficient that is not > 0.
    """
    unknown = sorted(set(coef) - set(model.TERMS))
    if unknown:
        raise ValueError(expected("gms cache", "coef", "model terms only", unknown))
    bad = {name: c for name, c in coef.items() if not c > 0}
    if bad:
        raise ValueError(expected("gms cache", "coef", "> 0", bad))


def checked(cache: TuningCache) -> TuningCache:
    """``cache`` read with the gms checks (:func:`check_point`, :func:`check_coef`)."""
    return cache.with_checks(check_point, check_coef)


def features_meta(f: Features) -> dict[str, Any]:
    """The features as JSON-ready data (kept with cache entries so a model can refit)."""
    return {"features": asdict(f)}


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def features_from_meta(meta: dict[str, Any]) -> Features | None:
    """The inverse of :func:`features_meta` (None for entries written without it or corrupt).

    Every field is checked: counts are ints >= 0, the dtype, reduce and scale flag are known
    values; anything else (as a corrupt cache may hold) gives None.
    """
    raw = meta.get("features")
    if not isinstance(raw, dict) or set(raw) != {fl.name for fl in fields(Features)}:
        return None
    values = dict(raw)
    for name in ("segment_pairs", "transform_segment_rows", "aggregate_segment_rows"):
        if not isinstance(values[name], list) or not all(_count(v) for v in values[name]):
            return None
        values[name] = tuple(values[name])
    text = {"dtype": ("fp32", "bf16", "fp16", "fp64"), "reduce": ("sum", "mean", "max")}
    for name, value in values.items():
        if name in text:
            ok = value in text[name]
        elif name == "has_scale":
            ok = type(value) is bool
        elif name == "aggregate_rows":
            ok = value is None or _count(value)
        else:
            ok = isinstance(value, tuple) or _count(value)
        if not ok:
            return None
    if min(values["k"], values["m"]) < 1:
        return None
    return Features(**values)


# ---- measuring (module-level so that process pools and Ray can run it) ----


@dataclass(frozen=True, slots=True)
class MeasureTask:
    """What a worker needs to measure points of one problem.

    Attributes:
        key: the problem's signature (plans and operands are reused across tasks by it).
        problem: the indices.
        k: columns of ``x``.
        m: columns of ``y``.
        dtype: operand dtype name (``"float32"``).
        device: where to run (``"cpu"`` or ``"cuda"``).
        has_scale: whether to pass a per-pair scale.
        points: the points to measure.
        repeats: timed calls per point (after one warm-up).
    """

    key: str
    problem: GMSProblem
    k: int
    m: int
    dtype: str
    device: str
    has_scale: bool
    points: tuple[Point, ...]
    repeats: int


_PLANS: OrderedDict[tuple[str, tuple[int, int, str]], GMSPlan] = OrderedDict()
_OPERANDS: OrderedDict[tuple[Any, ...], tuple[Any, Any, Any]] = OrderedDict()


def _plan_for(name: str, problem: GMSProblem, knobs: tuple[int, int, str]) -> GMSPlan:
    """Plans of the last problems measured in this process, by (signature, knobs)."""
    key = (name, knobs)
    if key not in _PLANS:
        _PLANS[key] = plan(problem, tile_rows=knobs[0], blocks=knobs[1], schedule=knobs[2])
        while len(_PLANS) > 64:
            _PLANS.popitem(last=False)
    _PLANS.move_to_end(key)
    return _PLANS[key]


def operands(
    name: str, problem: GMSProblem, k: int, m: int, dtype: str, device: str, has_scale: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Deterministic ``x``, ``w`` and ``scale`` for timing a problem (seeded, cached by name)."""
    key = (name, k, m, dtype, device, has_scale)
    if key not in _OPERANDS:
        gen = torch.Generator().manual_seed(0)
        dt = getattr(torch, dtype)
        x = torch.randn(problem.n_in, k, generator=gen).to(device=device, dtype=dt)
        w = (torch.randn(problem.num_segments, k, m, generator=gen) / k**0.5).to(device, dt)
        c = torch.rand(problem.num_pairs, generator=gen).to(device, dt) if has_scale else None
        _OPERANDS[key] = (x, w, c)
        while len(_OPERANDS) > 4:
            _OPERANDS.popitem(last=False)
    return _OPERANDS[key]


def run_config(
    cfg: Config,
    name: str,
    problem: GMSProblem,
    x: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor | None,
) -> Callable[[], object]:
    """A call that runs one configuration (its plan built now, or reused by ``name``)."""
    pl = _plan_for(name, problem, cfg.plan_knobs)
    if pl.device != x.device:
        pl = pl.to(x.device)

    def call() -> object:
        with launch(cfg.launch):
            out = gms(x, w, pl, scale, cfg.strategy)
        if out.is_cuda:
            torch.cuda.synchronize()
        return out

    return call


def measure_task(task: MeasureTask) -> list[float]:
    """Median seconds of each point of ``task`` (the caller records them)."""
    args = (task.problem, task.k, task.m, task.dtype, task.device, task.has_scale)
    x, w, c = operands(task.key, *args)
    out = []
    for point in task.points:
        call = run_config(config_of(point), task.key, task.problem, x, w, c)
        out.append(time_call(call, repeats=task.repeats).median_s)
    return out


# ---- the tuner ----


@dataclass(frozen=True, slots=True)
class TuneResult:
    """What a tune found.

    Attributes:
        best: the fastest measured configuration.
        best_point: its point.
        best_s: its measured median seconds.
        features: the problem's features.
        space_size: points in the space.
        predicted_s: model seconds of every point (space order).
        measured: point key -> measured seconds, for every point measured (this tune or cached).
        newly_measured: how many points this call measured.
        search_s: wall seconds of the search (planning, prediction, measuring).
        coef: the model coefficients used to rank.
    """

    best: Config
    best_point: Point
    best_s: float
    features: Features
    space_size: int
    predicted_s: tuple[float, ...]
    measured: dict[str, float]
    newly_measured: int
    search_s: float
    coef: dict[str, float]


def choose_points(
    points: Sequence[Point], predicted_s: Sequence[float], budget: int
) -> list[Point]:
    """The points a pruned search measures: each strategy's best, then the best overall.

    Model errors are largest between strategies (different kernels), smallest between the knobs
    of one strategy, so every strategy gets its predicted best measured before the budget goes
    to the globally best-ranked rest.

    Args:
        points: the space.
        predicted_s: model time of each point.
        budget: how many to measure (at least one per strategy is taken if the budget allows).

    Returns:
        The chosen points, at most ``budget``.
    """
    order = sorted(range(len(points)), key=lambda i: (predicted_s[i], i))
    chosen: list[int] = []
    seen: set[str] = set()
    for i in order:
        name = points[i]["strategy"]
        if name not in seen:
            seen.add(name)
            chosen.append(i)
    chosen = sorted(chosen, key=lambda i: predicted_s[i])[:budget]
    taken = set(chosen)
    for i in order:
        if len(chosen) >= budget:
            break
        if i not in taken:
            chosen.append(i)
            taken.add(i)
    return [points[i] for i in chosen]


def tune(
    problem: GMSProblem,
    k: int,
    m: int,
    *,
    dtype: str = "float32",
    has_scale: bool = False,
    target: CPUTarget | GPUTarget | None = None,
    budget: float | int = DEFAULT_BUDGET,
    exhaustive: bool = False,
    executor: Executor | None = None,
    cache: TuningCache | None = None,
    coef: dict[str, float] | None = None,
    repeats: int = 5,
    progress: Callable[[int, int], None] | None = None,
) -> TuneResult:
    """Find a fast configuration of a problem by measuring the model's best few points.

    Args:
        problem: the indices.
        k: columns of ``x``.
        m: columns of ``y``.
        dtype: operand dtype name (``"float32"``, ``"bfloat16"``, ``"float64"``).
        has_scale: whether calls pass a per-pair scale.
        target: the hardware; ``detect()`` (the local CPU) when None.
        budget: share of the space (``0 < budget < 1``) or number of points to measure.
        exhaustive: measure every point instead.
        executor: runs the measurements; serial in this process when None. Points measured
            side by side on one machine disturb each other's timings: run a parallel executor
            only where its workers do not share cores (``RayExecutor(one_per_host=True)`` on a
            cluster: one point per host at a time).
        cache: where measurements go (and are reused from); None measures without caching.
        coef: model coefficients; the cache's fitted ones, else :data:`model.DEFAULT_COEF`.
        repeats: timed calls per point.
        progress: called with ``(done, total)`` after every batch of measurements.

    Returns:
        The :class:`TuneResult`.

    Raises:
        ValueError: ``budget`` is not positive, or the target is a GPU without CUDA here.
    """
    start = time.perf_counter()
    target = target if target is not None else detect()
    device = "cpu" if isinstance(target, CPUTarget) else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(expected("gms tune", "target", "a CPU target here (no CUDA)", target.name))
    if not (isinstance(budget, int | float)) or budget <= 0:
        raise ValueError(expected("gms tune", "budget", "a share in (0, 1) or a count", budget))

    cache = checked(cache) if cache is not None else None
    f = features(plan(problem), k, m, getattr(torch, dtype), has_scale)
    hw, key = hardware_key(target), signature(problem, k, m, getattr(torch, dtype), has_scale)
    if coef is None and cache is not None:
        coef = cache.model(hw, MODEL_NAME)
    coef = {**model.DEFAULT_COEF, **(coef or {})}
    points, configs = space_configs(f, target)
    predicted = model.predict(f, configs, target, coef).tolist()

    n = len(points) if exhaustive else (budget if budget >= 1 else math.ceil(budget * len(points)))
    chosen = list(points) if exhaustive else choose_points(points, predicted, int(n))
    entry = cache.lookup(hw, key) if cache is not None else None
    done = dict(entry.points) if entry is not None else {}
    todo = [p for p in chosen if point_key(p) not in done]
    executor = executor or SerialExecutor()
    step = max(1, executor.workers)
    measured = {point_key(p): done[point_key(p)] for p in chosen if point_key(p) in done}
    for i in range(0, len(todo), step):
        batch = todo[i : i + step]
        # workers return their times and this process records them: a Ray worker on another
        # node has no access to this machine's cache file
        tasks = [
            MeasureTask(key, problem, k, m, dtype, device, has_scale, (p,), repeats) for p in batch
        ]
        times = {
            point_key(p): seconds
            for p, (seconds,) in zip(batch, executor.map(measure_task, tasks), strict=True)
        }
        measured.update(times)
        if cache is not None:
            cache.record(hw, key, f.group, f.vector(), times, features_meta(f))
        if progress is not None:
            progress(min(i + step, len(todo)), len(todo))
    by_key = {point_key(p): p for p in points}
    best_key = min(measured, key=lambda kk: measured[kk])
    return TuneResult(
        best=config_of(by_key[best_key]),
        best_point=by_key[best_key],
        best_s=measured[best_key],
        features=f,
        space_size=len(points),
        predicted_s=tuple(predicted),
        measured=measured,
        newly_measured=len(todo),
        search_s=time.perf_counter() - start,
        coef=coef,
    )


def refit(cache: TuningCache, target: CPUTarget | GPUTarget) -> dict[str, float] | None:
    """Fit the model's coefficients to every measurement of ``target`` in the cache, store them.

    Returns:
        The coefficients, or None when the cache holds no measurements of this target.
    """
    cache = checked(cache)
    hw = hardware_key(target)
    blocks: list[np.ndarray] = []
    times: list[float] = []
    for entry in cache.entries():
        f = features_from_meta(dict(entry.meta)) if entry.hardware == hw else None
        if f is None:
            continue
        pts = [json.loads(kk) for kk in entry.points]
        blocks.append(model.term_matrix(f, [config_of(p) for p in pts], target))
        times.extend(entry.points.values())
    if not blocks:
        return None
    coef = model.fit(np.vstack(blocks), np.array(times))
    cache.store_model(hw, MODEL_NAME, coef, len(times))
    return coef
