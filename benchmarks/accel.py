"""Fused against unfused compound ops on the COMET accelerators, and the mapper's throughput.

For GEMM-Softmax, GEMM-LayerNorm and self-attention at the issue's shapes, on ``edge`` and
``cloud``, the mapper searches every fusion level and binding and reports the best fused mapping
(at the global buffer or in the cluster) against the best unfused one. The unfused baseline is
COMET's: every op runs as its own kernel, its intermediates written to DRAM and read back by the
next op; ops run one after another (no pipelining across ops; within an op, tiles are
double-buffered as in the fused case) and the same space of tilings and partitions is searched
for it. Latency speedup compares the best-latency mappings; the energy ratio compares the
best-energy mappings.

Where the speedup comes from: ``unfused_compute_cycles`` is the unfused latency with DRAM made
free (each op's array, SIMD and collective cycles, ops still one after another), so

    speedup = dram_factor x overlap_factor,
    dram_factor = unfused_cycles / unfused_compute_cycles      (intermediates' DRAM stalls)
    overlap_factor = unfused_compute_cycles / fused_cycles     (arrays and SIMD unit overlapped)

``speedup_2byte_elements`` repeats the search as if an element took 2 bytes (four per 8-byte
DRAM word: four times the DRAM bandwidth in elements), to show how much of the speedup the
intermediates' DRAM traffic makes.

Throughput: the cost model alone over every valid GEMM-Softmax mapping (one process), and each
search's candidates per second per worker (enumeration, validation, pruning and evaluation).

Run: ``.venv/bin/python benchmarks/accel.py`` -> ``benchmarks/results/accel.json``.
Every column is defined in ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from fusekit.accel.candidates import enumerate_mappings
from fusekit.accel.mapping import Fusion
from fusekit.accel.model import evaluate, prepare
from fusekit.accel.problem import Problem, attention, gemm_layernorm, gemm_softmax
from fusekit.accel.search import CHUNK_SIZE, Scored, explore
from fusekit.hw import Accelerator, load
from fusekit.report.records import Cell, Plot, Summary, run_metadata, write_results
from fusekit.search import LocalExecutor

CASES = {
    "edge": [(256, 256, 128), (1024, 1024, 256), (1, 1024, 128)],
    "cloud": [(256, 256, 512), (2048, 2048, 256), (1, 4096, 512), (1024, 1024, 512)],
}
PROBLEMS = {"gemm_softmax": gemm_softmax, "gemm_layernorm": gemm_layernorm, "attention": attention}
#: The published "up to" speedups over unfused (COMET abstract), for comparison only.
COMET_UP_TO = {"gemm_softmax": 1.42, "gemm_layernorm": 3.46, "attention": 1.82}

#: What ``fusekit report build`` shows of the results file.
TITLE = (
    "Best fused against best unfused mapping of GEMM-Softmax, GEMM-LayerNorm and attention on "
    "the COMET edge and cloud accelerators (modelled latency and energy), and the mapper's "
    "throughput."
)
FUSED: dict[str, Cell] = {"study": "fused_vs_unfused"}
PLOTS = (
    Plot(title="Latency speedup of fused over unfused (best-latency mappings)", x="M,N,K",
         y="speedup", hue="problem", where=FUSED, ref=1.0),
    Plot(title="Energy ratio unfused / fused (best-energy mappings)", x="M,N,K",
         y="energy_ratio", hue="problem", where=FUSED, ref=1.0),
)  # fmt: skip
TABLES = (
    Summary(title="Latency speedup per shape and op", rows=["hw", "M,N,K"], values=["speedup"],
            across="problem", where=FUSED),
    Summary(title="Where the speedup comes from, per op (speedup = dram_factor x overlap_factor)",
            rows=["problem"], values=["speedup", "dram_factor", "overlap_factor",
                                      "speedup_2byte_elements", "energy_ratio", "comet_up_to"],
            where=FUSED),
    Summary(title="Cost-model throughput", rows=["hw", "problem", "M,N,K"],
            values=["mappings", "evaluated_per_s_per_core", "evaluated_per_wall_s"],
            where={"study": "throughput"}),
)  # fmt: skip


def model_throughput(
    hw: Accelerator, shape: tuple[int, int, int], repeats: int
) -> dict[str, object]:
    """Cost-model evaluations per second on one core over every valid mapping.

    The mappings are evaluated as the mapper evaluates them: in chunks of ``CHUNK_SIZE``, each with
    a fresh :func:`fusekit.accel.model.prepare` (SIMD rates and the memo of stages shared by
    the chunk's mappings). Per core means per CPU-second of this process
    (``time.process_time``), which time spent waiting for a core shared with other work does
    not inflate; the wall-clock figure is kept beside it.
    """
    problem = gemm_softmax(*shape)
    mappings = list(enumerate_mappings(problem, hw))
    chunks = [mappings[i : i + CHUNK_SIZE] for i in range(0, len(mappings), CHUNK_SIZE)]
    best_cpu = best_wall = float("inf")
    for _ in range(repeats):
        cpu, wall = time.process_time(), time.perf_counter()
        for chunk in chunks:
            prepared = prepare(problem, hw)
            for m in chunk:
                evaluate(problem, hw, m, prepared)
        best_cpu = min(best_cpu, time.process_time() - cpu)
        best_wall = min(best_wall, time.perf_counter() - wall)
    return {
        "study": "throughput",
        "hw": hw.name,
        "problem": "gemm_softmax",
        "M,N,K": ",".join(map(str, shape)),
        "mappings": len(mappings),
        "cpu_s": best_cpu,
        "wall_s": best_wall,
        "evaluated_per_s_per_core": len(mappings) / best_cpu,
        "evaluated_per_wall_s": len(mappings) / best_wall,
    }


def with_dram_bandwidth(hw: Accelerator, factor: float) -> Accelerator:
    """``hw`` with ``factor`` times the DRAM bandwidth (``factor`` elements per DRAM word)."""
    levels = tuple(
        dataclasses.replace(lv, bw_bytes_per_cycle=lv.bw_bytes_per_cycle * factor)
        if lv.name == "dram" and lv.bw_bytes_per_cycle
        else lv
        for lv in hw.levels
    )
    return dataclasses.replace(hw, levels=levels)


def best_speedup(problem: Problem, hw: Accelerator, ex: LocalExecutor) -> float:
    """Best unfused latency over best fused latency (latency-pruned search)."""
    per = explore(problem, hw, ex, prune="latency").best_by_fusion
    fused = min(per[f]["latency"].latency_cycles for f in per if f is not Fusion.UNFUSED)
    return per[Fusion.UNFUSED]["latency"].latency_cycles / fused


def compute_cycles(problem: Problem, hw: Accelerator, s: Scored) -> float:
    """Cycles of ``s`` on the arrays, SIMD unit and network alone (DRAM free), ops in series."""
    return sum(o.cycles for o in evaluate(problem, hw, s.mapping).ops)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "accel.json"
    )
    args = parser.parse_args()

    records = []
    edge = load("edge")
    assert isinstance(edge, Accelerator)
    records.append(model_throughput(edge, (1024, 1024, 256), args.repeats))
    print(
        f"model: {records[0]['evaluated_per_s_per_core']:,.0f} mappings per CPU-second, "
        f"{records[0]['evaluated_per_wall_s']:,.0f} per wall-clock second"
    )
    with LocalExecutor(args.workers) as ex:
        for hw_name, shapes in CASES.items():
            hw = load(hw_name)
            assert isinstance(hw, Accelerator)
            for shape in shapes:
                for name, make in PROBLEMS.items():
                    problem = make(*shape)
                    r = explore(problem, hw, ex, prune="pareto")
                    per = r.best_by_fusion
                    unfused = per[Fusion.UNFUSED]
                    fused_levels = [per[f] for f in per if f is not Fusion.UNFUSED]
                    fused_lat = min(
                        (p["latency"] for p in fused_levels), key=lambda s: s.score("latency")
                    )
                    fused_e = min(
                        (p["energy"] for p in fused_levels), key=lambda s: s.score("energy")
                    )
                    unfused_compute = compute_cycles(problem, hw, unfused["latency"])
                    rec = {
                        "study": "fused_vs_unfused",
                        "hw": hw_name,
                        "problem": name,
                        "M,N,K": ",".join(map(str, shape)),
                        "fused_cycles": fused_lat.latency_cycles,
                        "unfused_cycles": unfused["latency"].latency_cycles,
                        "speedup": unfused["latency"].latency_cycles / fused_lat.latency_cycles,
                        "comet_up_to": COMET_UP_TO[name],
                        "unfused_compute_cycles": unfused_compute,
                        "dram_factor": unfused["latency"].latency_cycles / unfused_compute,
                        "overlap_factor": unfused_compute / fused_lat.latency_cycles,
                        "speedup_2byte_elements": best_speedup(
                            problem, with_dram_bandwidth(hw, 4), ex
                        ),
                        "fused_energy_pj": fused_e.energy_pj,
                        "unfused_energy_pj": unfused["energy"].energy_pj,
                        "energy_ratio": unfused["energy"].energy_pj / fused_e.energy_pj,
                        "fused_mapping": fused_lat.mapping.label(),
                        "unfused_mapping": unfused["latency"].mapping.label(),
                        "candidates": r.candidates,
                        "evaluated": r.evaluated,
                        "pruned_fraction": 1 - r.evaluated / r.candidates,
                        "wall_s": r.wall_s,
                        "candidates_per_s_per_core": r.candidates / r.wall_s / r.workers,
                    }
                    records.append(rec)
                    print(
                        f"{hw_name:>5} {name:>14} {rec['M,N,K']:>14}  speedup "
                        f"{rec['speedup']:5.2f}x (COMET up to {rec['comet_up_to']}x; DRAM "
                        f"{rec['dram_factor']:.2f} x overlap {rec['overlap_factor']:.2f}; "
                        f"2-byte elements {rec['speedup_2byte_elements']:.2f}x)  "
                        f"energy {rec['energy_ratio']:5.2f}x  {r.candidates:>6} mappings, "
                        f"{rec['pruned_fraction']:.0%} pruned, "
                        f"{rec['candidates_per_s_per_core']:>6,.0f}/s/core  {rec['fused_mapping']}"
                    )
    settings = {
        "baseline": (
            "unfused (COMET's baseline): each op its own kernel, intermediates written to DRAM "
            "and read back, no pipelining across ops; the best of the same tiling and partition "
            "space; speedup = best-latency unfused / best-latency fused"
        ),
        "element": "one tensor element = one 8-byte word (bandwidth and energy per access)",
    }
    path = write_results(
        args.out,
        benchmark="accel",
        title=TITLE,
        meta=run_metadata({"edge": edge.to_dict(), "cloud": load("cloud").to_dict()}),
        settings=settings,
        plots=PLOTS,
        tables=TABLES,
        records=records,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
