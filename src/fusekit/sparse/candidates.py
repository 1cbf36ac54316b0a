"""The schedule space of a sparse program: cuts x dataflow orders x storage orders x parallelism.

* **Region cuts**: ``unfused`` (every statement alone), ``partial`` (one region per layer),
  ``full`` (one region).
* **Dataflow orders**: per statement, every permutation of its index variables that visits each
  sparse operand's levels in storage order; inside a region a producer's order must start with
  the variables its consumer binds and emit its output in the order the consumer reads it
  (:func:`fusekit.sparse.fusion_table.fusion_legal`). Together they are the topological orders of
  the region's unified variables that every tensor's storage order allows.
* **Storage orders**: a stored sparse matrix may be re-stored transposed (CSR ↔ CSC) and a
  block tensor ``M[I,J,ii,jj]`` row-split (levels ``I, ii, J, jj``), per statement.
* **Parallelism**: ``(level, factor)`` on every region's root.
* **Block size**: the block of block-sparse operands (a property of the workload's data).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from fusekit.sparse.formats import SparseTensor
from fusekit.sparse.fusion_table import bound_prefix, fusion_legal
from fusekit.sparse.program import Program, Statement, reference
from fusekit.sparse.schedule import CUTS, Schedule
from fusekit.sparse.workloads import Workload


@dataclass(frozen=True, eq=False)
class Patterns:
    """Which tensors are sparse, and the mode order each is stored in (inputs as given).

    Intermediates are sparse when the reference evaluation leaves some entry unset; their mode
    order is the order their producer emits.
    """

    sparse: frozenset[str]
    masks: dict[str, np.ndarray]

    @classmethod
    def of(cls, program: Program) -> Patterns:
        """Patterns from a reference evaluation of ``program``."""
        vals = reference(program, with_masks=True)
        masks = {k.removesuffix("#mask"): v for k, v in vals.items() if k.endswith("#mask")}
        sparse = {n for n, t in program.inputs.items() if not t.is_dense}
        sparse |= {st.out for st in program.statements if not masks[st.out].all()}
        return cls(frozenset(sparse), masks)


def regions_of(workload: Workload, cut: str) -> tuple[tuple[str, ...], ...]:
    """The regions of a cut."""
    names = tuple(st.out for st in workload.program.statements)
    if cut == "unfused":
        return tuple((n,) for n in names)
    if cut == "partial":
        return workload.layers
    if cut == "full":
        return (names,)
    raise ValueError(f"sparse: expected 'cut' to be one of {', '.join(CUTS)} (got {cut!r})")


def storage_choices(t: SparseTensor) -> list[tuple[int, ...]]:
    """Mode orders a stored sparse tensor may be re-stored in: as given, transposed, row-split."""
    if t.is_dense:
        return [t.order]
    if t.rank == 2:
        return [t.order, t.order[::-1]]
    if t.rank == 4:
        return [t.order, (0, 2, 1, 3)]
    return [t.order]


def _storage_ok(
    st: Statement, order: tuple[str, ...], tensor_vars: dict[str, tuple[int, ...]]
) -> bool:
    for o in st.operands:
        levels = tensor_vars.get(o.tensor)
        if levels is None:
            continue
        by_dim = [o.vars[d] for d in levels]
        ranks = [order.index(v) for v in by_dim]
        if ranks != sorted(ranks):
            return False
    return True


def region_options(
    program: Program,
    region: tuple[str, ...],
    patterns: Patterns,
    stored_order: dict[str, tuple[int, ...]],
    limit: int = 400,
) -> list[tuple[dict[str, tuple[str, ...]], tuple[tuple[str, str, tuple[int, ...]], ...]]]:
    """Every legal ``(orders, storage)`` of one region, up to ``limit``.

    Args:
        program: the program.
        region: the region's statements.
        patterns: sparsity of every tensor.
        stored_order: the mode order of every sparse tensor stored before the region.
        limit: stop after this many.
    """
    sts = [st for st in program.statements if st.out in region]
    consumers = {
        st.out: [(c, o.vars) for c in sts for o in c.operands if o.tensor == st.out] for st in sts
    }
    out: list[tuple[dict[str, tuple[str, ...]], tuple[tuple[str, str, tuple[int, ...]], ...]]] = []

    def options(
        st: Statement, chosen: dict[str, tuple[str, ...]]
    ) -> Iterator[tuple[tuple[str, ...], tuple[tuple[str, str, tuple[int, ...]], ...]]]:
        stored = [
            o.tensor for o in st.operands if o.tensor in patterns.sparse and o.tensor not in region
        ]
        stored = list(dict.fromkeys(stored))
        choices = [
            storage_choices(program.inputs[t]) if t in program.inputs else [stored_order[t]]
            for t in stored
        ]
        for combo in itertools.product(*choices):
            tensor_vars = dict(zip(stored, combo, strict=True))
            restore = tuple(
                (st.out, t, m)
                for t, m in tensor_vars.items()
                if t in program.inputs and m != program.inputs[t].order
            )
            for order in itertools.permutations(st.vars):
                if not _storage_ok(st, order, tensor_vars):
                    continue
                cons = consumers[st.out]
                if any(not fusion_legal(chosen[c.out], a, st, order) for c, a in cons):
                    continue
                if len({len(bound_prefix(chosen[c.out], a, st.out_vars)) for c, a in cons}) > 1:
                    continue
                yield order, restore

    def dfs(
        k: int,
        chosen: dict[str, tuple[str, ...]],
        restore: tuple[tuple[str, str, tuple[int, ...]], ...],
    ) -> None:
        if len(out) >= limit:
            return
        if k < 0:
            out.append((dict(chosen), restore))
            return
        st = sts[k]
        for order, extra in options(st, chosen):
            chosen[st.out] = order
            dfs(k - 1, chosen, restore + extra)
            del chosen[st.out]

    dfs(len(sts) - 1, {}, ())
    return out


def emitted_order(st: Statement, order: tuple[str, ...]) -> tuple[int, ...]:
    """The mode order a statement's output is stored in: its output variables as emitted."""
    return tuple(st.out_vars.index(v) for v in order if v in st.out_vars)


#: Re-stored inputs: ``(statement, tensor, mode order)``.
Storage = tuple[tuple[str, str, tuple[int, ...]], ...]

#: Scores one region's option: ``(region, orders, storage, stored mode orders) -> cycles``.
RankRegion = Callable[
    [tuple[str, ...], dict[str, tuple[str, ...]], Storage, dict[str, tuple[int, ...]]],
    float,
]


def enumerate_schedules(
    workload: Workload,
    cuts: tuple[str, ...] = CUTS,
    par: tuple[int, int] | None = None,
    rank_region: RankRegion | None = None,
    per_region: int = 3,
    limit: int = 400,
) -> list[Schedule]:
    """Enumerate schedules of a workload, cut by cut.

    A multi-region cut combines, region after region, the ``per_region`` best options of each
    region under ``rank_region`` (a function ``(region, orders, storage) -> score``, lower is
    better; the estimator); with no ranking, the first ``per_region`` options.

    Returns:
        The schedules, at most ``limit`` per cut.
    """
    program = workload.program
    patterns = Patterns.of(program)
    schedules: list[Schedule] = []
    for cut in cuts:
        regions = regions_of(workload, cut)
        partial: list[
            tuple[
                dict[str, tuple[str, ...]],
                tuple[tuple[str, str, tuple[int, ...]], ...],
                dict[str, tuple[int, ...]],
            ]
        ] = [({}, (), {n: t.order for n, t in program.inputs.items()})]
        cache: dict[tuple[object, ...], list[tuple[dict[str, tuple[str, ...]], Storage]]] = {}
        for region in regions:
            grown = []
            for orders, storage, stored in partial:
                key = (region, tuple(sorted(stored.items())))
                if key not in cache:
                    cache[key] = region_options(program, region, patterns, stored, limit)
                opts = cache[key]
                if rank_region is not None and len(regions) > 1:
                    opts = sorted(
                        opts,
                        key=lambda o: rank_region(
                            region, {**orders, **o[0]}, storage + o[1], stored
                        ),
                    )
                    opts = opts[:per_region]
                elif len(regions) > 1:
                    opts = opts[:per_region]
                for o, s in opts:
                    new_stored = dict(stored)
                    for name in region:
                        st = program.producer(name)
                        assert st is not None
                        new_stored[name] = emitted_order(st, o[name])
                    grown.append(({**orders, **o}, storage + s, new_stored))
            partial = grown[:limit]
        block = _block(program)
        for orders, storage, _ in partial:
            sched_orders = tuple((st.out, orders[st.out]) for st in program.statements)
            schedules.append(Schedule(cut, regions, sched_orders, storage, par, block))
    return schedules


def _block(program: Program) -> int | None:
    for t in program.inputs.values():
        if t.format == "bcsr":
            return int(t.shape[2])
    return None
