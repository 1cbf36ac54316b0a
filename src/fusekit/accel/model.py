r"""Latency and energy of a compound op mapped onto a multi-cluster accelerator.

The model follows COMET (arXiv 2509.00599, Sec. IV, "latency and energy models"): a mapping
partitions the first GEMM's output rows and columns over ``sr x sc`` clusters and walks row
blocks of ``tr`` rows per cluster; every op of the chain runs on each row block, GEMMs on the
systolic arrays and the rest on the SIMD unit, with explicit collectives where a reduction or a
contraction crosses the clusters that share a row block.

Per op and row block, on each cluster (:func:`gemm_stage`, :func:`simd_stage`):

* unit cycles: the systolic arrays' ScaleSim cycles, the weight preload paid only for tiles
  whose weights are (re)loaded, or the SIMD lane-op cycles (:mod:`fusekit.accel.units`);
* collective cycles from :mod:`fusekit.accel.collectives` (on the op's critical path: the next
  op depends on the reduced value, so they stall its unit);
* DRAM cycles: words moved by all clusters / DRAM words per cycle.

The binding combines the per-block work of the units (:func:`bind_latency`): a *pipeline*
overlaps DRAM, systolic arrays and SIMD unit across blocks, with ramp-up and ramp-down,
``latency = sum(stage) + (steps - 1) * max(stage)``; *sharing* time-multiplexes the compute
units within a block (arrays and SIMD in series, DRAM overlapped); *parallel* (independent ops
only) overlaps them within a block; *sequential* gives ``steps * sum(stage)``. Unfused, each op
is its own pass (intermediates written to and read back from DRAM, no pipelining across ops, the
same tiling and partition); fused, the intermediates stay in the global buffer (``fused_gb``) or
the output buffer (``fused_cluster``) and only the problem inputs and outputs touch DRAM.

Energy (COMET's form): ``sum(accesses x energy per access)`` over DRAM, global, input, weight
and output buffers, plus ``MACs x mac_pj``, ``SIMD lane-ops x op_pj`` and ``byte-hops x
hop_pj_per_byte``. An access moves one word (``hw.word_bytes``); the model counts one tensor
element as one word, for bandwidth and energy alike. GEMM operands follow the weight-stationary
reuse of :func:`fusekit.accel.units.gemm_accesses`: weights that fit the PEs stay there across
row blocks instead of being re-read from the global buffer for every block.

.. math::

    E = E_{dram} + E_{global} + E_{buffers} + E_{mac} + E_{simd} + E_{network}
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from collections.abc import Mapping as TMapping
from dataclasses import dataclass, field
from typing import NamedTuple

from fusekit.accel.collectives import (
    CollectiveCost,
    CollectiveKind,
    Group,
    collective_cost,
    group_on_mesh,
)
from fusekit.accel.mapping import BindingKind, Fusion, Mapping
from fusekit.accel.problem import Problem, Stage
from fusekit.accel.units import (
    GemmAccesses,
    StageRates,
    cluster_extents,
    col_var,
    dram_fills,
    gemm_accesses,
    simd_rates,
    systolic_cycles,
)
from fusekit.hw import Accelerator, MemoryLevel


@dataclass(frozen=True, slots=True)
class OpCost:
    """One op's (or collective's) share: cycles on its resource, energy and DRAM words."""

    name: str
    kind: str
    cycles: float
    energy_pj: float
    dram_words: float


@dataclass(frozen=True, slots=True)
class Breakdown:
    """The cost of one mapping.

    Attributes:
        latency_cycles: end-to-end cycles.
        energy_pj: total energy.
        dram_words: words read from and written to DRAM.
        energy_by_part_pj: dram, global, buffers (input+weight+output), mac, simd, network.
        ops: per op and per collective, summed over steps.
    """

    latency_cycles: float
    energy_pj: float
    dram_words: float
    energy_by_part_pj: TMapping[str, float]
    ops: tuple[OpCost, ...] = field(default=())

    @property
    def edp(self) -> float:
        """Energy-delay product (pJ x cycles)."""
        return self.energy_pj * self.latency_cycles

    def explain(self) -> str:
        """A few lines for people: totals, energy by part, then each op."""
        lines = [
            f"latency {self.latency_cycles:,.0f} cycles, energy {self.energy_pj / 1e6:,.3f} uJ, "
            f"DRAM {self.dram_words:,.0f} words",
            "energy: "
            + ", ".join(f"{k} {v / 1e6:.3f} uJ" for k, v in self.energy_by_part_pj.items()),
        ]
        lines += [
            f"  {o.name:<18} {o.kind:<14} {o.cycles:>12,.0f} cycles {o.energy_pj / 1e6:>9.3f} uJ"
            for o in self.ops
        ]
        return "\n".join(lines)


# --- the recipe -------------------------------------------------------------------------------


def evaluate(
    problem: Problem,
    hw: Accelerator,
    m: Mapping,
    prepared: Prepared | None = None,
) -> Breakdown:
    """Latency and energy of ``problem`` on ``hw`` under mapping ``m`` (see the module docstring).

    Args:
        problem: the compound op.
        hw: the accelerator.
        m: a valid mapping (see :func:`fusekit.accel.mapping.check_mapping`).
        prepared: ``prepare(problem, hw)`` of this same problem and accelerator, shared by the
            mappings of a search; a fresh one when not given.

    Returns:
        The breakdown.
    """
    w = row_blocks(problem, hw, m)
    prepared = prepared or prepare(problem, hw)
    stages = [stage_cost(w, i, st, prepared) for i, st in enumerate(problem.stages)]
    latency_cycles = fused_latency(w, stages) if w.fused else unfused_latency(w, stages)
    energy_by_part_pj = energy_by_part(stages)
    dram_words = _total([s.op.dram_words for s in stages])
    ops = tuple([o for s in stages for o in (s.op, s.collective) if o is not None])
    return Breakdown(
        latency_cycles, sum(energy_by_part_pj.values()), dram_words, energy_by_part_pj, ops
    )


def _total(terms: Iterable[float]) -> float:
    """The terms added in order, from ``0.0`` (the stages' order fixes the rounding)."""
    return sum(terms, 0.0)


@dataclass(frozen=True, slots=True)
class Prepared:
    """What :func:`evaluate` keeps per problem and accelerator, for the mappings of a search.

    Attributes:
        rates: the SIMD constants of every stage (:func:`fusekit.accel.units.simd_rates`).
        stages: stage costs already computed, by stage and row-block walk (:func:`stage_cost`).
    """

    rates: tuple[StageRates, ...]
    stages: dict[tuple[object, ...], StageCost] = field(default_factory=dict)


def prepare(problem: Problem, hw: Accelerator) -> Prepared:
    """The SIMD rates of ``problem`` on ``hw`` and an empty stage memo."""
    return Prepared(simd_rates(problem, hw))


def stage_cost(w: RowBlocks, i: int, st: Stage, prepared: Prepared) -> StageCost:
    """The cost of stage ``i``, computed once per row-block walk.

    A stage depends on the mapping through its walk alone (fusion, partition, rows, collective
    model): the first GEMM is the one tiled by the mapping (``tile_col``, ``tile_red``, loop
    order), a later one takes its whole per-cluster extents. So the mappings of a search that
    differ only in the first GEMM's tiles or in the binding share every other stage.
    """
    if i == 0 and st.kind == "gemm":
        return gemm_stage(w, i, st)
    m = w.m
    key = (i, m.fusion, m.spatial_row, m.spatial_col, m.tile_row, m.collective)
    cost = prepared.stages.get(key)
    if cost is None:
        rate = prepared.rates[i]
        cost = gemm_stage(w, i, st) if st.kind == "gemm" else simd_stage(w, st, rate)
        prepared.stages[key] = cost
    return cost


class RowBlocks(NamedTuple):
    """What the stages of one mapping share: the row-block walk and where operands live.

    Attributes:
        problem: the compound op.
        hw: the accelerator.
        m: the mapping.
        steps: row blocks each cluster walks.
        clusters: clusters the op is spread over.
        fused: whether intermediates stay on chip.
        extent: per-cluster extent of every variable within one row block.
        dram: the DRAM level.
        gb: the global buffer.
        near: where fused intermediates and SIMD operands live (output or global buffer).
        dram_words_per_cycle: DRAM bandwidth in words.
        row_group: the clusters that share a row block (the collectives' group).
    """

    problem: Problem
    hw: Accelerator
    m: Mapping
    steps: int
    clusters: int
    fused: bool
    extent: dict[str, int]
    dram: MemoryLevel
    gb: MemoryLevel
    near: MemoryLevel
    dram_words_per_cycle: float
    row_group: Group


def row_blocks(problem: Problem, hw: Accelerator, m: Mapping) -> RowBlocks:
    """The row-block walk of ``m``: ``rows / (sr tr)`` blocks on each of ``sr sc`` clusters."""
    dram, gb = hw.level("dram"), hw.level("global")
    return RowBlocks(  # positional: the mapper builds one per mapping
        problem,
        hw,
        m,
        problem.extents[problem.row] // (m.spatial_row * m.tile_row),  # steps
        m.spatial_row * m.spatial_col,  # clusters
        m.fusion is not Fusion.UNFUSED,  # fused
        cluster_extents(problem, m),
        dram,
        gb,
        hw.level("output") if m.fusion is Fusion.FUSED_CLUSTER else gb,  # near
        (dram.bw_bytes_per_cycle or math.inf) / hw.word_bytes,  # DRAM words per cycle
        group_on_mesh(m.spatial_col, hw.mesh_rows, hw.mesh_cols),  # row group
    )


class EnergyParts(NamedTuple):
    """One op's energy by part (the keys of :attr:`Breakdown.energy_by_part_pj`), in pJ."""

    dram: float
    global_: float  # the global buffer
    buffers: float  # input, weight and output buffers
    mac: float
    simd: float
    network: float


#: The parts' names in :attr:`Breakdown.energy_by_part_pj`, in :class:`EnergyParts` order.
PARTS = ("dram", "global", "buffers", "mac", "simd", "network")


class StageCost(NamedTuple):
    """One op over every row block: its unit's cycles, its DRAM traffic, its energy by part.

    Attributes:
        op: the op's line of the breakdown (cycles over all blocks, energy, DRAM words).
        collective: the collective after the op, or ``None``.
        on_arrays: whether the op runs on the systolic arrays (else on the SIMD unit).
        unit_step: cycles per row block on its unit.
        stall_step: cycles per row block its unit waits for the collective.
        dram_step: DRAM cycles per row block.
        energy_pj: the op's and its collective's energy by part.
    """

    op: OpCost
    collective: OpCost | None
    on_arrays: bool
    unit_step: float
    stall_step: float
    dram_step: float
    energy_pj: EnergyParts


# --- the stages -------------------------------------------------------------------------------


def gemm_stage(w: RowBlocks, i: int, st: Stage) -> StageCost:
    """A GEMM on the systolic arrays: weight-stationary tiles, partial sums reduce-scattered.

    The first GEMM is tiled by the mapping (``tile_col x tile_red``); a later one takes its whole
    per-cluster extents as one tile.
    """
    problem, hw, m, ext = w.problem, w.hw, w.m, w.extent
    kvar, cvar = st.reduced_vars[0], col_var(st, problem.row)
    ct = m.tile_col if i == 0 else ext[cvar]  # column tile of this GEMM
    kt = m.tile_red if i == 0 else ext[kvar]  # contraction tile
    out_points = math.prod(map(ext.__getitem__, st.out_vars))  # per cluster per block
    points = out_points * math.prod(map(ext.__getitem__, st.reduced_vars))
    writes_out = not w.fused or st.out in problem.outputs  # the result goes to DRAM
    out_words = w.clusters * out_points * w.steps
    g = gemm_accesses(problem, m, st, ct, kt, w.steps, hw)
    tiles = w.steps * (ext[cvar] // ct) * (ext[kvar] // kt)  # per cluster
    unit_step = systolic_step(w, ct, kt, tiles, g.weight_loads)
    dram_words = float(out_words if writes_out else 0) + gemm_fills(w, st, ct, kt)
    to_gb = writes_out or m.fusion is Fusion.FUSED_GB  # the result leaves the cluster
    global_pj = gemm_global_pj(w, g, dram_words, out_words, writes_out, to_gb)
    buffers_pj = gemm_buffers_pj(hw, g)
    mac_pj = w.clusters * w.steps * points * hw.mac_pj
    split_k = kvar == problem.col and m.spatial_col > 1  # partial sums over the split columns
    coll = CollectiveKind.REDUCE_SCATTER if split_k else None
    energy = (global_pj, buffers_pj, mac_pj, 0.0)
    return _stage(w, st, True, unit_step, dram_words, energy, coll, out_points)


def simd_stage(w: RowBlocks, st: Stage, rate: StageRates) -> StageCost:
    """An element-wise or reduction op on the SIMD unit, all-reduced over split columns.

    Its operands are read from (and its result written to) the output buffer when fused in the
    cluster, else the global buffer; every DRAM word is staged through the global buffer.
    """
    problem, ext, lanes = w.problem, w.extent, w.hw.simd_width
    out_points = math.prod(map(ext.__getitem__, st.out_vars))  # per cluster per block
    points = out_points * math.prod(map(ext.__getitem__, st.reduced_vars))
    writes_out = not w.fused or st.out in problem.outputs  # the result goes to DRAM
    out_words = w.clusters * out_points * w.steps
    unit_step = -(-points // lanes) * rate.body_cycles + -(-out_points // lanes) * rate.out_cycles
    dram_words = float(out_words if writes_out else 0) + simd_fills(w, st)
    operand_level = w.near if w.fused else w.gb
    in_words = sum([math.prod(map(ext.__getitem__, problem.tensors[t])) for t in st.inputs])
    operands_pj = (
        w.clusters * w.steps * in_words * operand_level.read_pj + out_words * operand_level.write_pj
    )
    simd_pj = w.clusters * w.steps * (points * rate.body_pj + out_points * rate.out_pj)
    staging_pj = dram_words * w.gb.write_pj  # DRAM <-> GB
    in_gb = operand_level is w.gb
    global_pj = staging_pj + operands_pj if in_gb else staging_pj
    buffers_pj = 0.0 if in_gb else operands_pj
    split = problem.col in st.reduced_vars and w.m.spatial_col > 1  # a row reduction, split
    coll = CollectiveKind.ALL_REDUCE if split else None
    energy = (global_pj, buffers_pj, 0.0, simd_pj)
    return _stage(w, st, False, unit_step, dram_words, energy, coll, out_points)


def _stage(
    w: RowBlocks,
    st: Stage,
    on_arrays: bool,
    unit_step: float,
    dram_words: float,
    energy: tuple[float, float, float, float],
    coll: CollectiveKind | None,
    out_points: int,
) -> StageCost:
    """A stage's DRAM energy and cycles, and its collective; ``energy``: global to SIMD pJ."""
    global_pj, buffers_pj, mac_pj, simd_pj = energy
    dram_pj = dram_words * w.dram.read_pj
    op_pj = mac_pj + global_pj + buffers_pj + simd_pj + dram_pj
    op = OpCost(st.out, st.kind, unit_step * w.steps, op_pj, dram_words)
    c = None if coll is None else collective(w, st, coll, out_points * w.hw.word_bytes)
    stall_step = 0.0 if c is None else c.cycles / w.steps
    dram_step = dram_words / w.steps / w.dram_words_per_cycle
    network_pj = 0.0 if c is None else c.energy_pj
    parts = EnergyParts(dram_pj, global_pj, buffers_pj, mac_pj, simd_pj, network_pj)
    return StageCost(op, c, on_arrays, unit_step, stall_step, dram_step, parts)


# --- the terms --------------------------------------------------------------------------------


def systolic_step(w: RowBlocks, ct: int, kt: int, tiles: int, weight_loads: int) -> float:
    """Array cycles per row block: every tile streams its rows, loaded weights are preloaded."""
    stream = systolic_cycles(w.m.tile_row, kt, ct, w.hw, preload=False)
    preload = systolic_cycles(w.m.tile_row, kt, ct, w.hw) - stream
    return (tiles * stream + weight_loads * preload) / w.steps


def gemm_fills(w: RowBlocks, st: Stage, ct: int, kt: int) -> float:
    """DRAM words a GEMM reads: its inputs from DRAM (all of them unfused), Timeloop's fills."""
    problem, fused = w.problem, w.fused
    words = 0.0
    for t in st.inputs:
        if not fused or t in problem.inputs:
            words += dram_fills(problem, w.m, st, t, ct, kt, w.steps)
    return words


def simd_fills(w: RowBlocks, st: Stage) -> int:
    """DRAM words a SIMD op reads: each input from DRAM once (all of them unfused)."""
    problem, fused = w.problem, w.fused
    return sum([problem.sizes[t] for t in st.inputs if not fused or t in problem.inputs])


def gemm_global_pj(
    w: RowBlocks,
    g: GemmAccesses,
    dram_words: float,
    out_words: int,
    writes_out: bool,
    to_gb: bool,
) -> float:
    """Global buffer energy of a GEMM: operands out, DRAM staging in, the result in and out."""
    gb = w.gb
    return (
        (g.a_gb_reads + g.b_gb_reads) * gb.read_pj  # operands to the buffers
        + (dram_words - out_words * writes_out) * gb.write_pj  # staged in from DRAM
        + out_words * to_gb * gb.write_pj  # result into the GB
        + out_words * writes_out * gb.read_pj  # and out to DRAM
    )


def gemm_buffers_pj(hw: Accelerator, g: GemmAccesses) -> float:
    """Input, weight and output buffer energy of a GEMM (each weight: a WB write and read)."""
    ib, wbuf, ob = hw.level("input"), hw.level("weight"), hw.level("output")
    return (
        g.a_gb_reads * ib.write_pj
        + g.a_ib_reads * ib.read_pj
        + g.b_gb_reads * (wbuf.write_pj + wbuf.read_pj)
        + g.ob_updates * (ob.write_pj + ob.read_pj)
    )


_COLLECTIVES: dict[tuple[object, ...], CollectiveCost] = {}


def collective(w: RowBlocks, st: Stage, kind: CollectiveKind, n_bytes: float) -> OpCost:
    """One collective per row block and row group, of ``n_bytes`` per cluster (cached)."""
    m, hw = w.m, w.hw
    key = (kind, n_bytes, w.row_group, m.collective, hw.network)
    if len(_COLLECTIVES) > 4096:
        _COLLECTIVES.clear()
    cost = _COLLECTIVES.get(key)
    if cost is None:
        cost = collective_cost(kind, n_bytes, w.row_group, hw.network, m.collective)
        _COLLECTIVES[key] = cost
    n_groups = m.spatial_row
    energy = w.steps * n_groups * cost.byte_hops * hw.network.hop_pj_per_byte
    name = f"{st.out}.{kind.value}({st.reduce_op or 'sum'})"
    return OpCost(name, kind.value, w.steps * cost.cycles, energy, 0.0)


# --- energy and overlap -----------------------------------------------------------------------


def energy_by_part(stages: list[StageCost]) -> dict[str, float]:
    """Energy by part (:data:`PARTS`): each part's stage terms added in the stages' order."""
    by_part = zip(*[s.energy_pj for s in stages], strict=True)
    return dict(zip(PARTS, [_total(terms) for terms in by_part], strict=True))


def fused_latency(w: RowBlocks, stages: list[StageCost]) -> float:
    """Fused: the units' per-block work, bound by the mapping's binding (:func:`bind_latency`)."""
    dram = _total([s.dram_step for s in stages])
    systolic = _total([c for s in stages if s.on_arrays for c in (s.unit_step, s.stall_step)])
    simd = _total([c for s in stages if not s.on_arrays for c in (s.unit_step, s.stall_step)])
    return bind_latency(w.m.binding, dram, systolic, simd, w.steps)


def unfused_latency(w: RowBlocks, stages: list[StageCost]) -> float:
    """Unfused: one op per nest, each overlapping its DRAM and compute (unless sequential)."""
    overlap = w.m.binding is not BindingKind.SEQUENTIAL
    return _total(
        [pipelined([s.dram_step, s.unit_step + s.stall_step], w.steps, overlap) for s in stages]
    )


def pipelined(stages: list[float], steps: int, pipeline: bool) -> float:
    """Latency of ``steps`` steps through ``stages``: with ramp-up/down, or one after another."""
    if pipeline:
        return sum(stages) + (steps - 1) * max(stages)
    return steps * sum(stages)


def bind_latency(
    binding: BindingKind, dram: float, systolic: float, simd: float, steps: int
) -> float:
    r"""Latency of ``steps`` row blocks bound by ``binding`` (one cluster's ops of a block).

    Per block, the ops need ``dram`` cycles of DRAM traffic, ``systolic`` cycles of the arrays
    and ``simd`` cycles of the SIMD unit (collective stalls included):

    .. math::

        \text{sequential: } n (D + S + V) \qquad
        \text{pipeline: } \mathrm{pipe}(D, S, V) \qquad
        \text{sharing: } \mathrm{pipe}(D, S + V) \qquad
        \text{parallel: } \mathrm{pipe}(D, \max(S, V))

    with :math:`\mathrm{pipe}(x_1..x_j) = \sum x + (n - 1) \max x` (ramp-up and ramp-down):
    pipelined units overlap across blocks; shared units serve the children one after another
    within a block; parallel (independent) children overlap within the block.
    """
    if binding is BindingKind.PIPELINE:
        return pipelined([dram, systolic, simd], steps, True)
    if binding is BindingKind.SHARING:
        return pipelined([dram, systolic + simd], steps, True)
    if binding is BindingKind.PARALLEL:
        return pipelined([dram, max(systolic, simd)], steps, True)
    return steps * (dram + systolic + simd)
