"""Unfused, per-layer and fully fused sparse models on the streaming dataflow machine (FuseFlow).

For each model the explorer enumerates schedules (region cuts x dataflow orders x storage
orders), ranks them with the estimator, simulates the three best estimates of every cut and
checks each simulated output against the numpy reference. Reported per model and cut: the best
simulated schedule's cycles, ops and memory bytes, its speedup over the best unfused schedule,
and where the best simulated schedule sits in the estimator's ranking.

Models (the FuseFlow study):
* GCN and GraphSAGE, 2 layers, hidden 16, on Cora, CiteSeer and Cora-ML (``fusekit.data``);
* a sparse autoencoder, batch 32, 784 -> 128 -> 784, 90%-sparse input;
* GPT-style attention with a BigBird mask (1024 tokens, head dim 64; 2 random blocks per block
  row, a window of one block each side, 2 global blocks), blocks of 16, 32 and 64. Reduced
  form: ONE head is simulated; the 12 heads are independent and identical in cost (one mask),
  so ``cycles_12_heads`` is 12 x the one-head cycles on one machine (ratios are unchanged).

Also: a parallelisation sweep (factor P at the outermost level of every region's root, ideal
memory and the default memory), the FIFO-depth sweep of fused attention (a forked score stream
needs a FIFO that holds a softmax row, else the scores are recomputed) and the simulator's wall
time on the Cora GCN.

Run: ``.venv/bin/python benchmarks/sparse.py`` -> ``benchmarks/results/sparse.json`` and
``sparse_cuts.png``, ``sparse_parallel.png``. Every column is defined in ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from fusekit.report.records import Plot, Summary, run_metadata, write_results
from fusekit.sparse.machine import Machine
from fusekit.sparse.schedule import CUTS
from fusekit.sparse.search import explore
from fusekit.sparse.simulate import simulate
from fusekit.sparse.workloads import Workload, autoencoder, bigbird, gcn, graphsage

HEADS = 12

#: What ``fusekit report build`` shows of the results file.
TITLE = (
    "Sparse models (GCN, GraphSAGE, a sparse autoencoder, BigBird attention) compiled to "
    "streaming dataflow graphs and simulated: unfused, per-layer (partial) and full fusion, "
    "parallelisation and FIFO depth; cycles of the simulated machine."
)
PLOTS = (
    Plot(title="Best schedule per region cut: speedup over the best unfused", x="workload",
         y="speedup_vs_unfused", hue="cut", where={"study": "cuts"}, log_y=True, ref=1.0),
    Plot(title="Parallelisation: speedup over factor 1", x="factor", y="speedup_vs_factor_1",
         hue=["workload", "cut", "memory_model"], where={"study": "parallel"}, kind="line",
         ref=1.0),
    Plot(title="FIFO depth: cycles of full fusion", x="fifo_depth", y="cycles",
         hue="workload", where={"study": "fifo"}, kind="line", log_y=True),
)  # fmt: skip
TABLES = (
    Summary(title="Speedup over the best unfused schedule per cut", rows=["workload"],
            values=["speedup_vs_unfused"], across="cut", where={"study": "cuts"}),
    Summary(title="Operations over unfused per cut (recomputation)", rows=["workload"],
            values=["ops_vs_unfused"], across="cut", where={"study": "cuts"}),
    Summary(title="Speedup over factor 1 per parallelisation factor",
            rows=["workload", "cut", "memory_model"], values=["speedup_vs_factor_1"],
            across="factor", where={"study": "parallel"}),
)  # fmt: skip
#: FuseFlow's published ranges, for comparison only (not used by any model).
PAPER = {
    "partial_gnn_speedup": "1.5-3.9x",
    "full_gnn_ops_ratio": "8-19x",
    "bigbird_full_speedup": "about 2.5-2.7x",
}


def workloads(quick: bool) -> list[Workload]:
    graphs = ("cora",) if quick else ("cora", "citeseer", "cora_ml")
    out = [make(g) for g in graphs for make in (gcn, graphsage)]
    out.append(autoencoder())
    blocks = (32,) if quick else (16, 32, 64)
    out += [bigbird(tokens=256 if quick else 1024, block=b, heads=HEADS) for b in blocks]
    return out


def cut_records(w: Workload, machine: Machine) -> tuple[list[dict], object]:
    start = time.perf_counter()
    ex = explore(w, machine, top=3)
    wall_s = time.perf_counter() - start
    unfused = ex.best("unfused").result
    simulated = ex.simulated
    all_equal = all(q.correct for q in simulated)
    rank = ex.estimator_rank_of_best()
    records = []
    for cut in CUTS:
        p = ex.best(cut)
        r = p.result
        heads = HEADS if w.name.startswith("bigbird") else 1
        records.append(
            {
                "study": "cuts",
                "workload": w.name,
                "cut": cut,
                "schedule": p.schedule.label(),
                "cycles": r.cycles,
                "cycles_12_heads": r.cycles * heads if heads > 1 else None,
                "ops": r.flops,
                "memory_bytes": r.memory_bytes,
                "speedup_vs_unfused": unfused.cycles / r.cycles,
                "ops_vs_unfused": r.flops / unfused.flops,
                "estimate_cycles": p.estimate.cycles,
                "equals_reference": p.correct,
                "all_simulated_equal_reference": all_equal,
                "estimator_rank_of_best": rank,
                "candidates": ex.candidates,
                "simulated": len(simulated),
                "explore_wall_s": wall_s,
                "notes": w.notes,
            }
        )
        print(
            f"{w.name:22} {cut:8} {r.cycles:14,.0f} cycles  x{unfused.cycles / r.cycles:5.2f}  "
            f"ops x{r.flops / unfused.flops:5.2f}  {p.correct}"
        )
    return records, ex


def parallel_records(w: Workload, ex, cut: str) -> list[dict]:  # type: ignore[no-untyped-def]
    out = []
    best = ex.best(cut).schedule
    for memory in (False, True):
        machine = Machine() if memory else Machine(memory=None)
        base = None
        for factor in (1, 2, 4, 8, 16):
            s = dataclasses.replace(best, par=(0, factor) if factor > 1 else None)
            r = simulate(w.program, s, machine)
            base = base or r.cycles
            out.append(
                {
                    "study": "parallel",
                    "workload": w.name,
                    "cut": cut,
                    "memory_model": memory,
                    "factor": factor,
                    "level": 0,
                    "cycles": r.cycles,
                    "speedup_vs_factor_1": base / r.cycles,
                }
            )
    return out


def fifo_records(w: Workload, ex) -> list[dict]:  # type: ignore[no-untyped-def]
    best = ex.best("full").schedule
    out = []
    for depth in (64, 256, 1024, 4096):
        r = simulate(w.program, best, Machine(fifo_depth=depth))
        out.append(
            {
                "study": "fifo",
                "workload": w.name,
                "cut": "full",
                "fifo_depth": depth,
                "cycles": r.cycles,
                "ops": r.flops,
            }
        )
    return out


def sim_time_records(w: Workload, ex) -> list[dict]:  # type: ignore[no-untyped-def]
    start_cpu, start = time.process_time(), time.perf_counter()
    for cut in CUTS:
        simulate(w.program, ex.best(cut).schedule)
    return [
        {
            "study": "sim_time",
            "workload": w.name,
            "schedules": "best unfused, partial, full",
            "wall_s": time.perf_counter() - start,
            "cpu_s": time.process_time() - start_cpu,
        }
    ]


def plots(records: list[dict], folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cuts = [r for r in records if r["study"] == "cuts"]
    names = list(dict.fromkeys(r["workload"] for r in cuts))
    fig, ax = plt.subplots(figsize=(11, 3.8))
    for k, cut in enumerate(CUTS):
        ys = [
            next(r["speedup_vs_unfused"] for r in cuts if r["workload"] == n and r["cut"] == cut)
            for n in names
        ]
        ax.bar([i + (k - 1) * 0.27 for i in range(len(names))], ys, 0.27, label=cut)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_ylabel("speedup over best unfused")
    ax.axhline(1, color="k", lw=0.6)
    ax.legend()
    fig.savefig(folder / "sparse_cuts.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    par = [r for r in records if r["study"] == "parallel"]
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for name, mem in dict.fromkeys((r["workload"], r["memory_model"]) for r in par):
        rows = [r for r in par if r["workload"] == name and r["memory_model"] == mem]
        ax.plot(
            [r["factor"] for r in rows],
            [r["speedup_vs_factor_1"] for r in rows],
            marker="o",
            label=f"{name} ({'memory' if mem else 'ideal memory'})",
        )
    ax.plot([1, 16], [1, 16], "k--", lw=0.6, label="P x")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("parallel factor P (outermost level)")
    ax.set_ylabel("speedup")
    ax.legend(fontsize=7)
    fig.savefig(folder / "sparse_parallel.png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Cora only, one small BigBird")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "sparse.json"
    )
    args = parser.parse_args()
    machine = Machine()
    records: list[dict] = []
    explored = {}
    for w in workloads(args.quick):
        rows, ex = cut_records(w, machine)
        records += rows
        explored[w.name] = (w, ex)
    w, ex = explored["gcn-cora"]
    records += sim_time_records(w, ex)
    records += parallel_records(w, ex, "partial")
    records += parallel_records(*explored["autoencoder-b32"], "full")
    big = [name for name in explored if name.startswith("bigbird")][-1]
    records += parallel_records(*explored[big], "full")
    records += fifo_records(*explored[big])
    path = write_results(
        args.out,
        benchmark="sparse",
        title=TITLE,
        meta=run_metadata(),
        settings={"machine_model": dataclasses.asdict(machine), "paper_ranges": PAPER},
        plots=PLOTS,
        tables=TABLES,
        records=records,
    )
    plots(records, args.out.parent)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
