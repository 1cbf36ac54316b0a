r"""The mapper: an op's mapping space searched and ranked by the one cost model, the tree model.

Every mapping the explorer ranks is a mapping tree (:mod:`fusekit.accel.tree`) evaluated by the
tree cost model (:mod:`fusekit.accel.tree_model`, its compiled twin for large spaces): the
space is COMET's 8-level tilings of a mapping template (:mod:`fusekit.accel.comet.space`), a
built-in op's (:mod:`fusekit.accel.comet.templates`) or any COMET run's. For each search:

* the best tiling by an objective: ``latency`` (cycles, then energy), ``energy`` (energy, then
  cycles) or ``edp`` (cycles times energy);
* the latency-energy Pareto front of every accepted tiling, when every tiling is scored (the
  lower-bound prune of a latency search scores only those that can win on cycles, so it has no
  front);
* the unfused baseline of COMET's construction at the best tiling
  (:func:`fusekit.accel.comet.fusion.unfused`: separate kernels, the intermediate through DRAM,
  the same tiling), for the compound ops, with

.. math::

    speedup = \frac{t_{unfused}}{t_{fused}}, \qquad
    energy\ ratio = \frac{E_{unfused}}{E_{fused}}.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fusekit.accel.comet.files import walk_nodes
from fusekit.accel.comet.fusion import KERNELS, Kernel, unfused
from fusekit.accel.comet.space import Scored, Space, SpaceResult
from fusekit.accel.compat import Compat

#: What the best tiling minimises.
OBJECTIVES = ("latency", "energy", "edp")


def objective_key(objective: str) -> Callable[[Scored], tuple[float, float]]:
    """The sort key of an accepted tiling under ``objective`` (ties broken by the other term).

    Raises:
        ValueError: ``objective`` is not one of :data:`OBJECTIVES`.
    """
    if objective == "latency":
        return lambda s: (float(s.total_cycles or 0), s.total_energy_pj or 0.0)
    if objective == "energy":
        return lambda s: (s.total_energy_pj or 0.0, float(s.total_cycles or 0))
    if objective == "edp":
        return lambda s: ((s.total_cycles or 0) * (s.total_energy_pj or 0.0),
                          float(s.total_cycles or 0))  # fmt: skip
    raise ValueError(f"accel explore: expected 'objective' in {OBJECTIVES} (got {objective!r})")


def pareto(scored: tuple[Scored, ...] | list[Scored]) -> tuple[Scored, ...]:
    """The accepted tilings no other beats in both cycles and energy, by cycles.

    Of tilings with equal cycles and energy, the first is kept.
    """
    ok = sorted(
        (s for s in scored if s.total_cycles is not None),
        key=lambda s: (s.total_cycles or 0, s.total_energy_pj or 0.0),
    )
    front: list[Scored] = []
    for s in ok:
        if not front or (s.total_energy_pj or 0.0) < (front[-1].total_energy_pj or 0.0):
            front.append(s)
    return tuple(front)


def op_chain(mapping_doc: Any) -> tuple[str, ...]:
    """The ops and collectives of a COMET mapping document, in tree order.

    ``("GEMM", "ROWMAX", "allreduce(max)", "SUB", ...)``: an ``Operation`` by its name, a
    ``CollectiveOperation`` by its type and reduction.
    """
    out: list[str] = []
    for node in walk_nodes(mapping_doc):
        kind = str(node.get("node_type", "")).lower()
        if kind == "operation":
            out.append(str(node.get("name", node.get("type", "?"))))
        elif kind == "collectiveoperation":
            out.append(f"{node.get('type', '?')}({node.get('reduction_op', '?')})")
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Exploration:
    """One search: the space's result, the best by the objective, the front, the baseline.

    Attributes:
        op: the built-in op searched (``None`` for a COMET run's template).
        dims: the extents.
        objective: what ``best`` minimises (:data:`OBJECTIVES`).
        result: the search (tilings scored, rejected, pruned; COMET's sampler median).
        best: the best accepted tiling by ``objective``.
        front: the latency-energy Pareto front of every accepted tiling (empty when pruned).
        unfused: the kernels of COMET's unfused baseline at ``best``'s tiling (empty for an op
            without one: ``gemm``, a chain alone, a COMET run's template).
        chain: the template's ops and collectives in order (:func:`op_chain`).
        unfused_note: why ``unfused`` is empty for an op that has a baseline (a kernel's
            tiling fails the fit check), else empty.
    """

    op: str | None
    dims: dict[str, int]
    objective: str
    result: SpaceResult
    best: Scored
    front: tuple[Scored, ...]
    unfused: tuple[Kernel, ...]
    chain: tuple[str, ...]
    unfused_note: str = ""

    @property
    def unfused_cycles(self) -> int | None:
        """The baseline's cycles: the kernels' sum (``None`` without a baseline)."""
        return sum(k.total_cycles for k in self.unfused) if self.unfused else None

    @property
    def unfused_energy_pj(self) -> float | None:
        """The baseline's energy: the kernels' sum (``None`` without a baseline)."""
        return sum(k.total_energy_pj for k in self.unfused) if self.unfused else None

    @property
    def speedup(self) -> float | None:
        """Unfused over fused cycles at the best tiling."""
        if self.unfused_cycles is None:
            return None
        return self.unfused_cycles / (self.best.total_cycles or 1)

    @property
    def energy_ratio(self) -> float | None:
        """Unfused over fused energy at the best tiling."""
        if self.unfused_energy_pj is None:
            return None
        return self.unfused_energy_pj / (self.best.total_energy_pj or 1.0)


def explore(
    space: Space,
    dims: dict[str, int],
    op: str | None = None,
    objective: str = "latency",
    fixed: dict[str, dict[int, int]] | None = None,
    workers: int = 1,
    compat: Compat | None = None,
    front: bool = True,
    compiled: bool | None = None,
) -> Exploration:
    """Search ``space`` at ``dims``; the best by ``objective``, the front, the unfused baseline.

    Args:
        space: the tiling space (``Space.builtin(op, arch_doc)`` or a COMET run's folder).
        dims: the extents (``M``, ``N``, ``K``).
        op: the built-in op of ``space`` (its unfused baseline is built when it has one).
        objective: ``latency``, ``energy`` or ``edp``.
        fixed: fixed factors (dim -> level index -> factor); the arch's by default.
        workers: processes scoring tilings.
        compat: COMET's defects to reproduce (all by default, as COMET's files evaluate).
        front: score every tiling for the Pareto front; a latency search without it stops at
            the lower bound (the same best tiling, tested).
        compiled: as :meth:`Space.search` (``None``: the compiled twin for large spaces).

    Raises:
        ValueError: an unknown objective, or no tiling passes the fit check.
    """
    key = objective_key(objective)
    compat = compat or Compat()
    prune = objective == "latency" and not front
    result = space.search(dims, fixed, compat=compat, workers=workers, prune=prune,
                          compiled=compiled)  # fmt: skip
    ok = [s for s in result.scored if s.total_cycles is not None]
    best = min(ok, key=key) if objective != "latency" else result.best
    kernels: tuple[Kernel, ...] = ()
    note = ""
    if op in KERNELS:
        try:
            kernels = tuple(unfused(op, best.tiling, dims, space.arch_doc, compat))
        except ValueError as e:  # a kernel of the baseline overflows a buffer at this tiling
            note = str(e)
    return Exploration(op, dict(dims), objective, result, best,
                       pareto(result.scored) if not prune else (), kernels,
                       op_chain(space.mapping_doc), note)  # fmt: skip
