"""The mapper's lower bound: :func:`fusekit.accel.model.evaluate` less what a loop order may save.

The bound is the cost model with the terms that depend on the loop order, the binding or the
collective model dropped or replaced by their least value:

    latency >= bind(DRAM cycles of the compulsory traffic of the fusion level,
                    systolic cycles of the mapping's GEMM tiles, SIMD cycles of its row block)
    energy  >= MACs e_MAC + SIMD lane-ops e_op + compulsory DRAM words (e_DRAM + e_GB)
               + GEMM operands loaded once per distinct tile + SIMD operands at their level

with the compulsory traffic the problem inputs and outputs (plus every intermediate written and
read back once when unfused); per op and summed when unfused. Each kept term is at most its
counterpart in ``evaluate``, and the latency grows with each term, hence the bound. One bound
serves every loop order, binding and collective model of a (fusion, partition, tiles) point.
"""

from __future__ import annotations

import math
from itertools import chain
from typing import NamedTuple

from fusekit.accel.mapping import Mapping
from fusekit.accel.model import (
    RowBlocks,
    bind_latency,
    pipelined,
    row_blocks,
    systolic_step,
)
from fusekit.accel.problem import Problem, Stage
from fusekit.accel.units import StageRates, cluster_words, col_var, simd_rates
from fusekit.hw import Accelerator


class StageBound(NamedTuple):
    """One op's least cost: its unit's cycles per row block, its DRAM words, its energy terms."""

    on_arrays: bool
    unit_step: float
    dram_words: int
    energy_terms_pj: tuple[float, ...]


def lower_bound(
    problem: Problem,
    hw: Accelerator,
    m: Mapping,
    rates: tuple[StageRates, ...] | None = None,
) -> tuple[float, float]:
    """``(latency_cycles, energy_pj)`` that no evaluation of ``m`` can beat (module docstring).

    It keeps every term of :func:`fusekit.accel.model.evaluate` that does not depend on the loop
    order, the binding or the collective model, and drops the others (collectives, DRAM re-fetches,
    re-loads of operand tiles that a loop order may avoid), so that one bound serves every mapping
    with the same fusion level, binding, partition and tiles.
    """
    w = row_blocks(problem, hw, m)
    rates = rates or simd_rates(problem, hw)
    stages = [
        gemm_bound(w, i, st) if st.kind == "gemm" else simd_bound(w, st, rates[i])
        for i, st in enumerate(problem.stages)
    ]
    latency_cycles = fused_bound(w, stages) if w.fused else unfused_bound(w, stages)
    mac_pj = problem.macs * hw.mac_pj
    energy_pj = sum(chain.from_iterable(s.energy_terms_pj for s in stages), mac_pj)
    return latency_cycles, energy_pj


def _compulsory_words(w: RowBlocks, st: Stage) -> int:
    """DRAM words an op moves in any mapping: the problem's inputs and outputs (all, unfused)."""
    problem, fused = w.problem, w.fused
    words = sum(problem.size(t) for t in st.inputs if t in problem.inputs or not fused)
    return words + (problem.size(st.out) if st.out in problem.outputs or not fused else 0)


def _dram_pj(w: RowBlocks) -> float:
    """Energy of one word between DRAM and the global buffer, the cheaper direction each."""
    dram, gb = w.dram, w.gb
    return min(dram.read_pj, dram.write_pj) + min(gb.read_pj, gb.write_pj)


def gemm_bound(w: RowBlocks, i: int, st: Stage) -> StageBound:
    """A GEMM whose operand tiles are each loaded once (per row block if they do not fit)."""
    problem, hw, m, ext = w.problem, w.hw, w.m, w.extent
    s = hw.systolic
    ib, wb, ob = hw.level("input"), hw.level("weight"), hw.level("output")
    kvar, cvar = st.reduced_vars[0], col_var(st, problem.row)
    ct = m.tile_col if i == 0 else ext[cvar]
    kt = m.tile_red if i == 0 else ext[kvar]
    n_c, n_k = ext[cvar] // ct, ext[kvar] // kt
    k_folds, c_folds = math.ceil(kt / s.pe_rows), math.ceil(ct / s.pe_cols)
    rounds = math.ceil(k_folds * c_folds / (s.grid_rows * s.grid_cols))
    tiles = w.clusters * w.steps * n_c * n_k
    # fewest loads in any loop order: each distinct tile once, when it stays resident
    weight_loads = n_c * n_k if rounds == 1 else w.steps * n_c * n_k  # per cluster
    b_loads = w.clusters * weight_loads
    unit_step = systolic_step(w, ct, kt, w.steps * n_c * n_k, weight_loads)
    ib_words = ib.size_bytes // hw.word_bytes // (2 if ib.double_buffered else 1)
    a_fits = m.tile_row * kt <= ib_words
    a_loads = w.clusters * w.steps * n_k if a_fits else tiles * rounds
    a_gb, b_gb = a_loads * m.tile_row * kt, b_loads * kt * ct
    words = _compulsory_words(w, st)
    energy_terms_pj = (
        (a_gb + b_gb) * w.gb.read_pj + a_gb * ib.write_pj,  # operands to the buffers
        tiles * rounds * m.tile_row * kt * ib.read_pj,  # inputs into the arrays
        b_gb * (wb.write_pj + wb.read_pj),  # weights through the weight buffer
        tiles * m.tile_row * ct * k_folds * (ob.write_pj + ob.read_pj),  # partial sums
        words * _dram_pj(w),
    )
    return StageBound(True, unit_step, words, energy_terms_pj)


def simd_bound(w: RowBlocks, st: Stage, rate: StageRates) -> StageBound:
    """A SIMD op: its lane-ops and operands as in the model, its compulsory DRAM words."""
    problem, m, ext, lanes = w.problem, w.m, w.extent, w.hw.simd_width
    points = math.prod(ext[v] for v in st.vars)
    out_points = math.prod(ext[v] for v in st.out_vars)
    unit_step = -(-points // lanes) * rate.body_cycles
    unit_step += -(-out_points // lanes) * rate.out_cycles
    blocks = w.clusters * w.steps
    in_words = blocks * sum(cluster_words(problem, m, t) for t in st.inputs)
    level = w.near if w.fused else w.gb
    words = _compulsory_words(w, st)
    energy_terms_pj = (
        blocks * (points * rate.body_pj + out_points * rate.out_pj),  # lane-ops
        in_words * level.read_pj + blocks * out_points * level.write_pj,  # operands
        words * _dram_pj(w),
    )
    return StageBound(False, unit_step, words, energy_terms_pj)


def fused_bound(w: RowBlocks, stages: list[StageBound]) -> float:
    """The binding over the compulsory DRAM cycles and each unit's cycles per row block."""
    dram_step = sum(s.dram_words for s in stages) / w.steps / w.dram_words_per_cycle
    systolic = sum((s.unit_step for s in stages if s.on_arrays), 0.0)
    simd = sum((s.unit_step for s in stages if not s.on_arrays), 0.0)
    return bind_latency(w.m.binding, dram_step, systolic, simd, w.steps)


def unfused_bound(w: RowBlocks, stages: list[StageBound]) -> float:
    """Each op its own pass, its compulsory DRAM cycles overlapped with its unit's."""
    return sum(
        (
            pipelined([s.dram_words / w.steps / w.dram_words_per_cycle, s.unit_step], w.steps, True)
            for s in stages
        ),
        0.0,
    )
