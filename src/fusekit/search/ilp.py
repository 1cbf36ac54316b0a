r"""The ILP helper: weighted set partitioning with lazy constraints, solved by HiGHS.

.. math::

    \min \sum_c w_c x_c \quad \text{s.t.} \quad \sum_{c \ni i} x_c = 1 \;\; \forall i,
    \qquad x_c \in \{0, 1\}

plus *lazy* cuts: after each solve a callback inspects the chosen sets and returns groups of
candidates that must not all be chosen together; each becomes
:math:`\sum_{c \in C} x_c \le |C| - 1` and the model is solved again (the fusion planners use
this for "no cycle between chosen groups", which has too many constraints to write up front).
A warm start (a feasible choice) is handed to HiGHS and is also the answer when the time limit
ends the loop before a solution passes every lazy check.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import highspy
import numpy as np

from fusekit.errors import expected

log = logging.getLogger(__name__)

#: A lazy check: chosen candidate indices -> candidate groups that may not all be chosen.
LazyCheck = Callable[[list[int]], list[list[int]]]


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """The answer of :func:`solve_partition`.

    Attributes:
        chosen: indices of the chosen candidates.
        objective: their total weight.
        bound: the best lower bound HiGHS proved (equal to ``objective`` when optimal).
        solve_s: wall time of the whole loop.
        rounds: solves run (one plus one per round of lazy cuts).
        cuts: lazy cuts added.
        optimal: whether ``chosen`` is proven optimal and passed every lazy check.
        timed_out: whether the time limit ended the search (``chosen`` is the incumbent).
    """

    chosen: tuple[int, ...]
    objective: float
    bound: float
    solve_s: float
    rounds: int
    cuts: int
    optimal: bool
    timed_out: bool


def solve_partition(
    weights: Sequence[float],
    sets: Sequence[Collection[int]],
    n_items: int,
    *,
    lazy: LazyCheck | None = None,
    warm_start: Sequence[int] | None = None,
    time_limit_s: float = 10.0,
) -> PartitionResult:
    """Choose sets covering every item exactly once at least total weight.

    Args:
        weights: one weight per candidate set.
        sets: the items (``0 <= item < n_items``) each candidate covers.
        n_items: number of items.
        lazy: optional lazy check (see :data:`LazyCheck`).
        warm_start: a feasible choice (candidate indices), used as the MIP start and as the
            answer on time-out.
        time_limit_s: wall-time budget of the whole loop.

    Returns:
        The :class:`PartitionResult`.

    Raises:
        ValueError: on mismatched lengths, an item out of range, an item no set covers, or
            a warm start that is not a partition.
    """
    if len(weights) != len(sets):
        raise ValueError(
            expected("solve_partition", "weights", f"{len(sets)} values", len(weights))
        )
    covered = [0] * n_items
    for s in sets:
        for item in s:
            if not 0 <= item < n_items:
                raise ValueError(
                    expected("solve_partition", "sets", f"items in [0, {n_items})", item)
                )
            covered[item] += 1
    if 0 in covered:
        raise ValueError(
            expected("solve_partition", "sets", "covering every item", covered.index(0))
        )
    if warm_start is not None:
        counts = [0] * n_items
        for c in warm_start:
            for item in sets[c]:
                counts[item] += 1
        if any(k != 1 for k in counts):
            raise ValueError(
                expected("solve_partition", "warm_start", "a partition", list(warm_start))
            )
    start = time.perf_counter()
    h = quiet_highs()
    h.setOptionValue("mip_rel_gap", 1e-9)
    n = len(sets)
    for w in weights:
        h.addCol(float(w), 0.0, 1.0, 0, np.array([], dtype=np.int32), np.array([]))
    h.changeColsIntegrality(
        n, np.arange(n, dtype=np.int32), np.array([highspy.HighsVarType.kInteger] * n)
    )
    by_item: list[list[int]] = [[] for _ in range(n_items)]
    for c, s in enumerate(sets):
        for item in s:
            by_item[item].append(c)
    for members in by_item:
        idx = np.array(members, dtype=np.int32)
        h.addRow(1.0, 1.0, len(members), idx, np.ones(len(members)))
    best = list(warm_start) if warm_start is not None else None
    rounds = cuts = 0
    bound = -np.inf
    while True:
        left = time_limit_s - (time.perf_counter() - start)
        if left <= 0:
            break
        h.setOptionValue("time_limit", max(left, 1e-3))
        if best is not None:
            sol = highspy.HighsSolution()
            sol.col_value = [1.0 if c in set(best) else 0.0 for c in range(n)]
            sol.value_valid = True
            h.setSolution(sol)
        h.run()
        rounds += 1
        status = h.getModelStatus()
        values = h.getSolution().col_value
        chosen = [c for c in range(n) if values[c] > 0.5] if len(values) == n else []
        bound = max(bound, float(h.getInfo().mip_dual_bound))
        if not _is_partition(chosen, sets, n_items):
            break
        violated = lazy(chosen) if lazy is not None else []
        objective = float(sum(weights[c] for c in chosen))
        if not violated and (best is None or objective < sum(weights[c] for c in best) - 1e-12):
            best = chosen
        if status != highspy.HighsModelStatus.kOptimal:
            break
        if not violated:
            return PartitionResult(
                tuple(chosen), objective, min(bound, objective), time.perf_counter() - start,
                rounds, cuts, True, False,
            )  # fmt: skip
        for group in violated:
            idx = np.array(sorted(set(group)), dtype=np.int32)
            h.addRow(-np.inf, float(len(idx) - 1), len(idx), idx, np.ones(len(idx)))
            cuts += 1
    if best is None:
        raise TimeoutError(f"solve_partition: no feasible answer within {time_limit_s} s")
    log.warning(
        "solve_partition: stopped after %d rounds (%d cuts) at the time limit of %.3g s; "
        "returning the best solution passing the lazy checks",
        rounds, cuts, time_limit_s,
    )  # fmt: skip
    objective = float(sum(weights[c] for c in best))
    return PartitionResult(
        tuple(best), objective, float(min(bound, objective)), time.perf_counter() - start,
        rounds, cuts, False, True,
    )  # fmt: skip


_BANNER_LOCK = threading.Lock()
_banner_shown = False


def quiet_highs() -> Any:
    """A ``highspy.Highs`` that prints nothing, on stdout or stderr.

    HiGHS prints its banner ("Running HiGHS ...") from C on the process's stdout when the first
    solver of a process is constructed, before any option can be set; that would break every
    ``--json`` output. The first construction therefore runs with file descriptor 1 pointed at
    the null device (C's buffer flushed before it is restored); then ``output_flag`` and
    ``log_to_console`` are switched off.
    """
    global _banner_shown
    with _BANNER_LOCK:
        if _banner_shown:
            h = highspy.Highs()  # type: ignore[no-untyped-call]
        else:
            h = _construct_silently(highspy.Highs)
            _banner_shown = True
    h.setOptionValue("output_flag", False)
    h.setOptionValue("log_to_console", False)
    return h


def _construct_silently(make: Callable[[], Any]) -> Any:
    """``make()`` with the C-level stdout discarded (plain ``make()`` where fds are unusable)."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):
        return make()
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        made = make()
        try:
            ctypes.CDLL(None).fflush(None)
        except (OSError, AttributeError):  # no C library handle (not a POSIX libc)
            pass
        return made
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


def _is_partition(chosen: list[int], sets: Sequence[Collection[int]], n_items: int) -> bool:
    counts = [0] * n_items
    for c in chosen:
        for item in sets[c]:
            counts[item] += 1
    return all(k == 1 for k in counts)
