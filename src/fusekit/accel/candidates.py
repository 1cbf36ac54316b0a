"""The mapping space of a compound op: partitions, tiles, loop orders, fusion levels.

Candidates are every combination of

* a spatial partition ``rows x cols`` of the clusters whose product divides the mesh,
* power-of-two tiles (row block, GEMM column tile, contraction tile) that divide the extents,
  at least ``min_tile`` (or the whole extent when it is smaller),
* a loop order of the first GEMM (all six unfused; the two with the row loop outermost fused),
* a fusion level (unfused, fused at the global buffer, fused in the cluster),
* a binding of the ops of a row block (fused: pipeline, sharing, and parallel where the ops are
  independent; unfused, where each nest holds one op, sharing and parallel equal pipeline and are
  left out) and a collective cost model,

kept when :func:`fusekit.accel.mapping.check_mapping` accepts them (tiles fit their buffers,
spatial factors fit the mesh, ...).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from fusekit.accel.mapping import (
    BindingKind,
    Fusion,
    Mapping,
    MappingError,
    check_mapping,
    required_collectives,
)
from fusekit.accel.problem import Problem
from fusekit.hw import Accelerator


def pow2_divisors(n: int, least: int = 1) -> list[int]:
    """Powers of two dividing ``n`` and at least ``least`` (``[n]``'s largest if none are)."""
    out = [d for d in (2**i for i in range(n.bit_length())) if n % d == 0 and d >= least]
    return out or [max(d for d in (2**i for i in range(n.bit_length())) if n % d == 0)]


def partitions(hw: Accelerator) -> list[tuple[int, int]]:
    """``(rows, cols)`` cluster partitions whose product divides the cluster count."""
    n = hw.n_clusters
    return [(r, c) for r in range(1, n + 1) for c in range(1, n + 1) if n % (r * c) == 0]


def enumerate_mappings(
    problem: Problem,
    hw: Accelerator,
    fusions: Sequence[Fusion] = tuple(Fusion),
    bindings: Sequence[BindingKind] = (
        BindingKind.PIPELINE,
        BindingKind.SHARING,
        BindingKind.PARALLEL,
    ),
    collectives: Sequence[str] = ("mesh", "ring", "tree"),
    min_tile: int = 8,
) -> Iterator[Mapping]:
    """Yield every valid mapping of the space (see the module docstring).

    Args:
        problem: the compound op.
        hw: the accelerator.
        fusions: fusion levels to include.
        bindings: bindings to include where legal (``sequential`` never beats ``pipeline`` in
            this model).
        collectives: collective cost models to include.
        min_tile: smallest tile considered.

    Yields:
        Valid mappings, each once.
    """
    row, col = problem.row, problem.col
    red = problem.stages[0].reduced_vars[0]
    er, ec, ek = problem.extents[row], problem.extents[col], problem.extents[red]
    orders = list(itertools.permutations((row, col, red)))
    unfused_bindings = [b for b in bindings if b in (BindingKind.PIPELINE, BindingKind.SEQUENTIAL)]
    need = required_collectives(problem)
    for sr, sc in partitions(hw):
        if er % sr or ec % sc:
            continue
        models = collectives if sc > 1 else collectives[:1]  # no collective to choose
        fused_bindings = [
            b
            for b in bindings
            if b is not BindingKind.PARALLEL or (problem.independent() and not (sc > 1 and need))
        ]
        for tr in pow2_divisors(er // sr, min_tile):
            for tc in pow2_divisors(ec // sc, min_tile):
                for tk in pow2_divisors(ek, min_tile):
                    for fusion in fusions:
                        fused = fusion is not Fusion.UNFUSED
                        for order in orders:
                            if fused and order[0] != row:
                                continue
                            for binding in fused_bindings if fused else unfused_bindings:
                                for model in models:
                                    m = Mapping(fusion, sr, sc, tr, tc, tk, order, binding, model)
                                    try:
                                        check_mapping(problem, hw, m)
                                    except MappingError:
                                        continue
                                    yield m
