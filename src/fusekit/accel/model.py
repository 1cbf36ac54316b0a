"""Latency and energy of a compound op mapped onto a multi-cluster accelerator.

The model follows COMET (arXiv 2509.00599, Sec. IV, "latency and energy models"): a mapping
partitions the first GEMM's output rows and columns over ``sr x sc`` clusters and walks row
blocks of ``tr`` rows per cluster; every op of the chain runs on each row block, GEMMs on the
systolic arrays and the rest on the SIMD unit, with explicit collectives where a reduction or a
contraction crosses the clusters that share a row block.

Per row-block step, on each cluster:

* GEMM cycles (ScaleSim form, Samajdar et al. 2020): ``folds * (2 R + C + T - 2)`` with
  ``R x C`` PEs per array, ``T`` streamed rows and ``folds = ceil(ceil(k/R) ceil(c/C) / arrays)``,
  once per column tile and contraction tile, less the ``R``-cycle weight preload of the tiles
  whose weights are still in the PEs (:func:`gemm_accesses`);
* SIMD cycles: ``sum over lane-ops of ceil(points / width) * cycles(op)``;
* collective cycles from :mod:`fusekit.accel.collectives` (on the SIMD chain's critical path:
  the next op depends on the reduced value, so they stall it);
* DRAM cycles: words moved by all clusters / DRAM words per cycle.

The binding combines the per-step work of the units (:func:`bind_latency`): a *pipeline*
overlaps DRAM, systolic arrays and SIMD unit across steps, with ramp-up and ramp-down,
``latency = sum(stage) + (steps - 1) * max(stage)``; *sharing* time-multiplexes the compute
units within a step (arrays and SIMD in series, DRAM overlapped); *parallel* (independent ops
only) overlaps them within a step; *sequential* gives ``steps * sum(stage)``. Unfused, each op
is its own pass (intermediates written to and read back from DRAM, no pipelining across ops, the
same tiling and partition); fused, the intermediates stay in the global buffer (``fused_gb``) or
the output buffer (``fused_cluster``) and only the problem inputs and outputs touch DRAM.

Energy (COMET's form): ``sum(accesses x energy per access)`` over DRAM, global, input, weight
and output buffers, plus ``MACs x mac_pj``, ``SIMD lane-ops x op_pj`` and ``byte-hops x
hop_pj_per_byte``. An access moves one word (``hw.word_bytes``); the model counts one tensor
element as one word, for bandwidth and energy alike. GEMM operands follow the weight-stationary
reuse of :func:`gemm_accesses`: weights that fit the PEs stay there across row blocks instead of
being re-read from the global buffer for every block.
"""

from __future__ import annotations

import math
from collections.abc import Mapping as TMapping
from dataclasses import dataclass, field

from fusekit.accel.collectives import (
    CollectiveCost,
    CollectiveKind,
    Group,
    collective_cost,
    group_on_mesh,
)
from fusekit.accel.mapping import BindingKind, Fusion, Mapping
from fusekit.accel.problem import Problem, Stage
from fusekit.hw import Accelerator


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


def systolic_cycles(
    rows_streamed: int, k: int, c: int, hw: Accelerator, preload: bool = True
) -> int:
    """ScaleSim cycles of a ``rows_streamed x k`` by ``k x c`` GEMM on one cluster's arrays.

    ``folds x (2 R + C + T - 2)``: ``R`` cycles to preload a fold's weights, then ``R + C + T - 2``
    to stream ``T`` rows through; ``preload=False`` leaves out the first part (weights already in
    the PEs from the previous row block).
    """
    s = hw.systolic
    folds = math.ceil(k / s.pe_rows) * math.ceil(c / s.pe_cols)
    per_array = math.ceil(folds / (s.grid_rows * s.grid_cols))
    return per_array * (s.pe_rows * preload + s.pe_rows + s.pe_cols + rows_streamed - 2)


def simd_cycles(stage: Stage, points: int, out_points: int, hw: Accelerator) -> int:
    """SIMD cycles of one stage over ``points`` iteration points on one cluster."""
    lanes = hw.simd_width
    body = sum(n * math.ceil(points / lanes) * hw.simd_cycles(op) for op, n in stage.simd_ops)
    tail = sum(
        n * math.ceil(out_points / lanes) * hw.simd_cycles(op) for op, n in stage.per_out_ops
    )
    return body + tail


def simd_energy_pj(stage: Stage, points: int, out_points: int, hw: Accelerator) -> float:
    """SIMD lane-op energy of one stage."""
    body = sum(n * points * hw.simd_energy_pj(op) for op, n in stage.simd_ops)
    return body + sum(n * out_points * hw.simd_energy_pj(op) for op, n in stage.per_out_ops)


@dataclass(frozen=True, slots=True)
class StageRates:
    """Per-stage SIMD constants: cycles per vector and energy per point, by body and output."""

    body_cycles: int
    out_cycles: int
    body_pj: float
    out_pj: float


def simd_rates(problem: Problem, hw: Accelerator) -> tuple[StageRates, ...]:
    """The SIMD constants of every stage of ``problem`` on ``hw`` (zero for GEMM stages).

    :func:`evaluate` computes them when not given; the mapper computes them once per search.
    """
    return tuple(
        StageRates(
            sum(n * hw.simd_cycles(op) for op, n in st.simd_ops),
            sum(n * hw.simd_cycles(op) for op, n in st.per_out_ops),
            sum(n * hw.simd_energy_pj(op) for op, n in st.simd_ops),
            sum(n * hw.simd_energy_pj(op) for op, n in st.per_out_ops),
        )
        for st in problem.stages
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


def _extent(problem: Problem, m: Mapping, var: str) -> int:
    """Per-cluster extent of ``var`` within one row block (the rows are ``tile_row``)."""
    if var == problem.row:
        return m.tile_row
    if var == problem.col:
        return problem.extents[var] // m.spatial_col
    return problem.extents[var]


def evaluate(
    problem: Problem,
    hw: Accelerator,
    m: Mapping,
    rates: tuple[StageRates, ...] | None = None,
) -> Breakdown:
    """Latency and energy of ``problem`` on ``hw`` under mapping ``m`` (see the module docstring).

    Args:
        problem: the compound op.
        hw: the accelerator.
        m: a valid mapping (see :func:`fusekit.accel.mapping.check_mapping`).
        rates: ``simd_rates(problem, hw)``, computed here when not given.

    Returns:
        The breakdown.
    """
    wb = hw.word_bytes
    dram, gb, ob = hw.level("dram"), hw.level("global"), hw.level("output")
    ib, wbuf = hw.level("input"), hw.level("weight")
    dram_wpc = (dram.bw_bytes_per_cycle or math.inf) / wb
    clusters = m.spatial_row * m.spatial_col
    steps = problem.extents[problem.row] // (m.spatial_row * m.tile_row)
    row_group = group_on_mesh(m.spatial_col, hw.mesh_rows, hw.mesh_cols)
    fused = m.fusion is not Fusion.UNFUSED
    # where intermediates and SIMD operands live: output buffer, or global buffer
    near = ob if m.fusion is Fusion.FUSED_CLUSTER else gb
    ops: list[OpCost] = []
    e_dram = e_global = e_buffers = e_mac = e_simd = e_network = 0.0  # pJ, by part
    lat_dram = lat_systolic = lat_simd = 0.0  # cycles per step, fused
    unfused_cycles = total_dram_words = 0.0
    sequential = m.binding is BindingKind.SEQUENTIAL
    rates = rates or simd_rates(problem, hw)
    lanes = hw.simd_width
    get = _extents(problem, m).__getitem__  # per-cluster extents within one row block
    for i, st in enumerate(problem.stages):
        out_points = math.prod(map(get, st.out_vars))  # per cluster per step
        points = out_points * math.prod(map(get, st.reduced_vars))
        writes_out = not fused or st.out in problem.outputs
        out_words = clusters * out_points * steps
        dram_words = float(out_words if writes_out else 0)
        coll: CollectiveKind | None = None
        mac_pj = simd_pj = global_pj = buffers_pj = 0.0
        if st.kind == "gemm":
            kvar, cvar = st.reduced_vars[0], _col_var(st, problem.row)
            ct = m.tile_col if i == 0 else get(cvar)  # column tile of this GEMM
            kt = m.tile_red if i == 0 else get(kvar)
            g = gemm_accesses(problem, m, st, ct, kt, steps, hw)
            stream = systolic_cycles(m.tile_row, kt, ct, hw, preload=False)
            preload = systolic_cycles(m.tile_row, kt, ct, hw) - stream
            # per step: every tile streams its rows; weights are preloaded only when (re)loaded
            tiles = steps * (get(cvar) // ct) * (get(kvar) // kt)
            cyc = (tiles * stream + g.weight_loads * preload) / steps
            for t in st.inputs:
                if not fused or t in problem.inputs:
                    dram_words += _dram_fills(problem, m, st, t, ct, kt, steps)
            to_gb = writes_out or m.fusion is Fusion.FUSED_GB  # the result leaves the cluster
            mac_pj = clusters * steps * points * hw.mac_pj
            global_pj = (
                (g.a_gb_reads + g.b_gb_reads) * gb.read_pj  # operands to the buffers
                + (dram_words - out_words * writes_out) * gb.write_pj  # staged in from DRAM
                + out_words * to_gb * gb.write_pj  # result into the GB
                + out_words * writes_out * gb.read_pj  # and out to DRAM
            )
            buffers_pj = (
                g.a_gb_reads * ib.write_pj
                + g.a_ib_reads * ib.read_pj
                + g.b_gb_reads * (wbuf.write_pj + wbuf.read_pj)
                + g.ob_updates * (ob.write_pj + ob.read_pj)
            )
            if kvar == problem.col and m.spatial_col > 1:
                coll = CollectiveKind.REDUCE_SCATTER  # partial sums over the split columns
        else:
            r = rates[i]  # = simd_cycles(st, points, out_points, hw), precomputed per stage
            cyc = -(-points // lanes) * r.body_cycles + -(-out_points // lanes) * r.out_cycles
            in_words = 0  # per cluster per step: every input point read from its level
            for t in st.inputs:
                in_words += math.prod(map(get, problem.tensors[t]))
                if not fused or t in problem.inputs:
                    dram_words += problem.sizes[t]
            lvl = near if fused else gb
            operands_pj = clusters * steps * in_words * lvl.read_pj + out_words * lvl.write_pj
            simd_pj = clusters * steps * (points * r.body_pj + out_points * r.out_pj)
            global_pj = dram_words * gb.write_pj  # DRAM <-> GB staging
            if lvl is gb:
                global_pj += operands_pj
            else:
                buffers_pj = operands_pj
            if problem.col in st.reduced_vars and m.spatial_col > 1:
                coll = CollectiveKind.ALL_REDUCE
        dram_pj = dram_words * dram.read_pj
        e_dram += dram_pj
        e_global += global_pj
        e_buffers += buffers_pj
        e_mac += mac_pj
        e_simd += simd_pj
        total_dram_words += dram_words
        op_pj = mac_pj + global_pj + buffers_pj + simd_pj + dram_pj
        ops.append(OpCost(st.out, st.kind, cyc * steps, op_pj, dram_words))
        coll_step = 0.0
        if coll is not None:
            c = _collective(st, coll, out_points * wb, row_group, hw, m, steps)
            ops.append(c)
            e_network += c.energy_pj
            coll_step = c.cycles / steps
        dram_step = dram_words / steps / dram_wpc
        if not fused:
            # one op per nest: every binding but sequential overlaps its DRAM and compute
            unfused_cycles += pipelined([dram_step, cyc + coll_step], steps, not sequential)
        elif st.kind == "gemm":  # the next op waits for a collective: it stalls the resource
            lat_dram, lat_systolic = lat_dram + dram_step, lat_systolic + cyc + coll_step
        else:
            lat_dram, lat_simd = lat_dram + dram_step, lat_simd + cyc + coll_step
    latency = (
        bind_latency(m.binding, lat_dram, lat_systolic, lat_simd, steps)
        if fused
        else unfused_cycles
    )
    parts = {
        "dram": e_dram,
        "global": e_global,
        "buffers": e_buffers,
        "mac": e_mac,
        "simd": e_simd,
        "network": e_network,
    }
    return Breakdown(
        latency_cycles=latency,
        energy_pj=sum(parts.values()),
        dram_words=total_dram_words,
        energy_by_part_pj=parts,
        ops=tuple(ops),
    )


@dataclass(frozen=True, slots=True)
class GemmAccesses:
    """On-chip accesses of one GEMM stage over every cluster and step, in words.

    Attributes:
        a_gb_reads: input words read from the global buffer (each written once to the IB).
        a_ib_reads: input words streamed from the IB into the arrays (multicast along a round).
        b_gb_reads: weight words loaded GB -> weight buffer -> PEs (a WB write and read each).
        ob_updates: partial-sum words written to (and read back from) the output buffer.
        weight_loads: weight tiles loaded into one cluster's arrays (``L_B`` below).
    """

    a_gb_reads: int
    a_ib_reads: int
    b_gb_reads: int
    ob_updates: int
    weight_loads: int


def _loads(order: tuple[str, ...], factor: dict[str, int], uses: tuple[str, ...]) -> int:
    """Tile (re)loads of a tensor: loop factors down to the innermost loop that indexes it."""
    n = count = 1
    for v in order:  # outermost first
        if factor[v] > 1:
            n *= factor[v]
            if v in uses:
                count = n
    return count


def gemm_accesses(
    problem: Problem, m: Mapping, st: Stage, ct: int, kt: int, steps: int, hw: Accelerator
) -> GemmAccesses:
    r"""Buffer accesses of a weight-stationary GEMM on every cluster's array grid.

    One tile is ``tr x kt`` inputs (A) by ``kt x ct`` weights (B). Its ``ceil(kt/R) ceil(ct/C)``
    folds go to the ``G`` arrays in ``rounds = ceil(folds / G)`` rounds. Timeloop's stationarity
    rule (:func:`fusekit.accel.nest.fills`) over the cluster's tile loops (``steps`` row blocks,
    ``n_c`` column tiles, ``n_k`` contraction tiles, in the mapping's order) gives the loads:

    .. math::

        B_{GB} = P \cdot L_B \cdot k_t c_t, \quad
        A_{GB} = P \cdot L_A \cdot t_r k_t, \quad
        A_{IB} = P \cdot T \cdot \text{rounds} \cdot t_r k_t, \quad
        O = P \cdot T \cdot t_r c_t \lceil k_t / R \rceil

    with ``P`` clusters, ``T = steps n_c n_k`` tiles per cluster and ``L`` the product of the loop
    factors down to the innermost loop indexing the tensor. The weights stay in the PEs (and A in
    the input buffer) across the loops that do not index them only when they fit there: one round
    (``L_B = T`` otherwise) and ``tr kt`` within the double-buffered IB (``L_A = T rounds``
    otherwise). Each fold's partial sums are written to the OB and read back once.
    """
    s = hw.systolic
    row = problem.row
    kvar, cvar = st.reduced_vars[0], _col_var(st, row)
    clusters = m.spatial_row * m.spatial_col
    n_c, n_k = _extent(problem, m, cvar) // ct, _extent(problem, m, kvar) // kt
    k_folds, c_folds = math.ceil(kt / s.pe_rows), math.ceil(ct / s.pe_cols)
    rounds = math.ceil(k_folds * c_folds / (s.grid_rows * s.grid_cols))
    order = m.order if st is problem.stages[0] else (row, cvar, kvar)
    factor = {row: steps, cvar: n_c, kvar: n_k}
    tiles = steps * n_c * n_k  # per cluster
    ib = hw.level("input")
    ib_words = ib.size_bytes // hw.word_bytes // (2 if ib.double_buffered else 1)
    b_loads = _loads(order, factor, (cvar, kvar)) if rounds == 1 else tiles
    a_fits = m.tile_row * kt <= ib_words
    a_loads = _loads(order, factor, (row, kvar)) if a_fits else tiles * rounds
    return GemmAccesses(
        a_gb_reads=clusters * a_loads * m.tile_row * kt,
        a_ib_reads=clusters * tiles * rounds * m.tile_row * kt,
        b_gb_reads=clusters * b_loads * kt * ct,
        ob_updates=clusters * tiles * m.tile_row * ct * k_folds,
        weight_loads=b_loads,
    )


def _col_var(st: Stage, row: str) -> str:
    """The first output variable of a GEMM stage that is not the row variable."""
    out = st.out_vars
    return out[1] if out[0] == row else out[0]


def _extents(problem: Problem, m: Mapping) -> dict[str, int]:
    """Per-cluster extent of every variable within one row block (see :func:`_extent`)."""
    ext = dict(problem.extents)
    ext[problem.row] = m.tile_row
    ext[problem.col] = ext[problem.col] // m.spatial_col
    return ext


def _points_of(problem: Problem, m: Mapping, tensor: str) -> int:
    """Per-cluster words of ``tensor`` within one row block."""
    return math.prod(_extent(problem, m, v) for v in problem.tensors[tensor])


_COLLECTIVES: dict[tuple[object, ...], CollectiveCost] = {}


def _collective(
    st: Stage,
    kind: CollectiveKind,
    n_bytes: float,
    group: Group,
    hw: Accelerator,
    m: Mapping,
    steps: int,
) -> OpCost:
    key = (kind, n_bytes, group, m.collective, hw.network)
    if len(_COLLECTIVES) > 4096:
        _COLLECTIVES.clear()
    cost = _COLLECTIVES.get(key)
    if cost is None:
        cost = collective_cost(kind, n_bytes, group, hw.network, m.collective)
        _COLLECTIVES[key] = cost
    n_groups = m.spatial_row
    energy = steps * n_groups * cost.byte_hops * hw.network.hop_pj_per_byte
    name = f"{st.out}.{kind.value}({st.reduce_op or 'sum'})"
    return OpCost(name, kind.value, steps * cost.cycles, energy, 0.0)


def _dram_fills(
    problem: Problem, m: Mapping, st: Stage, tensor: str, ct: int, kt: int, steps: int
) -> float:
    """DRAM words read for a GEMM input: Timeloop fills with the spatial loops multicast.

    Equal to :func:`fusekit.accel.nest.fills` for plain 2-D tensors (no sliding windows): the
    chip-level tile times every loop factor from the outermost loop down to the innermost loop
    that indexes the tensor (tests/accel/test_model.py checks the two agree).
    """
    row, col = problem.row, problem.col
    tvars = problem.tensors[tensor]
    tile = 1
    for v in tvars:
        tile *= problem.extents[v]
    if row in tvars:
        tile = tile // problem.extents[row] * m.tile_row * m.spatial_row
    if st is not problem.stages[0]:
        return float(tile * steps) if row in tvars else float(tile)
    kvar = st.reduced_vars[0]
    factors = {
        row: steps,
        col: problem.extents[col] // (ct * m.spatial_col),
        kvar: problem.extents[kvar] // kt,
    }
    if col in tvars:
        tile = tile // problem.extents[col] * ct * m.spatial_col
    if kvar in tvars:
        tile = tile // problem.extents[kvar] * kt
    words = tile
    reuse = 1
    for v in m.order:  # outermost first
        f = factors[v]
        if f > 1:
            reuse *= f
            if v in tvars:
                words = tile * reuse
    return float(words)
