r"""What one cluster's units do with one tile: the terms :mod:`fusekit.accel.model` adds up.

* Systolic arrays (ScaleSim form, Samajdar et al. 2020): ``folds * (2 R + C + T - 2)`` cycles
  with ``R x C`` PEs per array, ``T`` streamed rows and ``folds = ceil(ceil(k/R) ceil(c/C) /
  arrays)``; the ``R``-cycle weight preload is paid only when a tile's weights are (re)loaded.
* SIMD unit: ``sum over lane-ops of ceil(points / width) * cycles(op)`` cycles and ``points x
  op_pj`` energy; :func:`simd_rates` folds the per-op constants of a stage once per search.
* GEMM operands (:func:`gemm_accesses`): weight-stationary reuse, the weights kept in the PEs
  (and the inputs in the input buffer) across the loops that do not index them when they fit.
* DRAM fills of a GEMM input (:func:`dram_fills`): Timeloop's count, the spatial loops multicast.

Extents are per cluster within one row block (:func:`cluster_extents`): ``tile_row`` rows and the
cluster's share of the split columns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fusekit.accel.mapping import Mapping
from fusekit.accel.problem import Problem, Stage
from fusekit.hw import Accelerator


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

    :func:`fusekit.accel.model.evaluate` computes them when not given; the mapper computes them
    once per search.
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


def col_var(st: Stage, row: str) -> str:
    """The first output variable of a GEMM stage that is not the row variable."""
    out = st.out_vars
    return out[1] if out[0] == row else out[0]


def cluster_extent(problem: Problem, m: Mapping, var: str) -> int:
    """Per-cluster extent of ``var`` within one row block (the rows are ``tile_row``)."""
    if var == problem.row:
        return m.tile_row
    if var == problem.col:
        return problem.extents[var] // m.spatial_col
    return problem.extents[var]


def cluster_extents(problem: Problem, m: Mapping) -> dict[str, int]:
    """Per-cluster extent of every variable within one row block (see :func:`cluster_extent`)."""
    ext = dict(problem.extents)
    ext[problem.row] = m.tile_row
    ext[problem.col] = ext[problem.col] // m.spatial_col
    return ext


def cluster_words(problem: Problem, m: Mapping, tensor: str) -> int:
    """Per-cluster words of ``tensor`` within one row block."""
    return math.prod(cluster_extent(problem, m, v) for v in problem.tensors[tensor])


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
    kvar, cvar = st.reduced_vars[0], col_var(st, row)
    clusters = m.spatial_row * m.spatial_col
    n_c, n_k = cluster_extent(problem, m, cvar) // ct, cluster_extent(problem, m, kvar) // kt
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


def dram_fills(
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
