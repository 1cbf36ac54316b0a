"""Measuring a call: warm up, repeat, keep the median and the spread.

The protocol every tuner uses, so that cached times are comparable::

    timing = time_call(fn, repeats=5)     # one warm-up call, then 5 timed calls
    timing.median_s, timing.q10_s, timing.q90_s

The median resists the outliers of a shared machine; quantiles come from the samples
themselves (no distribution assumed).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fusekit.errors import expected


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds per call of one measured function.

    Attributes:
        median_s: median over the timed calls.
        q10_s: 10th percentile (the minimum with fewer than 10 samples).
        q90_s: 90th percentile (the maximum with fewer than 10 samples).
        samples: how many calls were timed.
    """

    median_s: float
    q10_s: float
    q90_s: float
    samples: int


def time_call(
    fn: Callable[[], object],
    repeats: int = 5,
    warmup: int = 1,
    min_total_s: float = 0.0,
    max_total_s: float | None = None,
) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls, then at least ``repeats`` timed ones.

    Args:
        fn: the call to time (its result is dropped).
        repeats: timed calls (``>= 1``).
        warmup: untimed calls first (compilation, caches, allocator).
        min_total_s: keep timing beyond ``repeats`` until this much time was spent, so that
            microsecond calls still get a stable median.
        max_total_s: stop before ``repeats`` once this much time was spent and at least
            ``min(3, repeats)`` calls were timed (slow peers in side-by-side benchmarks).

    Returns:
        The :class:`Timing`.

    Raises:
        ValueError: ``repeats < 1`` or ``warmup < 0``.
    """
    if repeats < 1:
        raise ValueError(expected("time_call", "repeats", ">= 1", repeats))
    if warmup < 0:
        raise ValueError(expected("time_call", "warmup", ">= 0", warmup))
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    spent = 0.0
    while len(samples) < repeats or (spent < min_total_s and len(samples) < 1000):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
        spent += samples[-1]
        if max_total_s is not None and spent >= max_total_s and len(samples) >= min(3, repeats):
            break
    samples.sort()
    if len(samples) >= 10:
        q = statistics.quantiles(samples, n=10)
        q10, q90 = q[0], q[-1]
    else:
        q10, q90 = samples[0], samples[-1]
    return Timing(statistics.median(samples), q10, q90, len(samples))


def fastest(
    options: Mapping[str, Callable[[], object]],
    rounds: int = 3,
    repeats: int = 5,
    warmup: int = 1,
    min_total_s: float = 0.0,
) -> tuple[str, dict[str, float]]:
    """The option whose best round's median is least, and every option's such time (seconds).

    The rounds interleave the options (round 1 times each, then round 2 ...), so a burst of
    load on a shared machine hits all of them alike; each round is :func:`time_call` with
    ``repeats`` and ``min_total_s``, the first after ``warmup`` untimed calls.

    Raises:
        ValueError: ``options`` is empty, or ``rounds < 1``.
    """
    if not options:
        raise ValueError(expected("fastest", "options", "at least one", "none"))
    if rounds < 1:
        raise ValueError(expected("fastest", "rounds", ">= 1", rounds))
    best = {name: float("inf") for name in options}
    for r in range(rounds):
        for name, fn in options.items():
            timing = time_call(
                fn, repeats=repeats, warmup=warmup if r == 0 else 0, min_total_s=min_total_s
            )
            best[name] = min(best[name], timing.median_s)
    return min(best, key=best.__getitem__), best
