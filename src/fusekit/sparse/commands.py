"""``fusekit sparse``: simulate a sparse model under a schedule, or explore its schedules."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from fusekit.console import console, print_json, print_table, print_text, progress
from fusekit.sparse.machine import Machine, MemoryModel
from fusekit.sparse.sam.replay_cli import sam_replay
from fusekit.sparse.schedule import CUTS

# The sparse machinery, scipy and matplotlib load numpy: the commands import them when they run,
# as the CLI mounts this module at start-up.

app = typer.Typer(
    help="Sparse models (GCN, GraphSAGE, sparse autoencoder, BigBird attention) on a streaming "
    "dataflow machine: fusion tables, streaming graphs, a cycle simulator and a schedule explorer.",
    no_args_is_help=True,
)

WorkloadArg = Annotated[
    str,
    typer.Argument(
        help="gcn-<graph>, graphsage-<graph> (graph: cora, citeseer, cora_ml), autoencoder, "
        "bigbird-b<block> (16, 32, 64), or path/to/file.py:factory returning a Workload, a "
        "Program or a sparse torch module with its arguments (module, args)."
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
ParLevelOption = Annotated[
    int,
    typer.Option(
        help="Level of the region root to parallelise (below the fewest index variables of "
        "any statement).",
        min=0,
    ),
]
ParFactorOption = Annotated[int, typer.Option(help="Lanes at that level (1: none).", min=1)]
FifoOption = Annotated[int, typer.Option(help="Tokens per FIFO.", min=1)]


def _machine(fifo_depth: int, memory: bool) -> Any:
    return Machine(fifo_depth=fifo_depth, memory=MemoryModel() if memory else None)


def _par(w: Any, level: int, factor: int) -> tuple[int, int] | None:
    """``(level, factor)``, checked against the workload: every region root has that level."""
    levels = min(len(w.program.extents(st)) for st in w.program.statements)
    if level >= levels:
        raise typer.BadParameter(
            f"expected a level in [0, {levels}) for {w.name} (got {level})",
            param_hint="'--par-level'",
        )
    return (level, factor) if factor > 1 else None


def _advance(bar: Any) -> Any:
    """A ``progress(done, total)`` callback that moves ``bar``'s task."""

    def advance(done: int, total: int) -> None:
        bar.update(bar.task_ids[0], completed=done, total=total)

    return advance


@app.command()
def simulate(
    workload: WorkloadArg = "gcn-cora",
    cut: Annotated[str, typer.Option(help="unfused, partial or full.")] = "partial",
    par_level: ParLevelOption = 0,
    par_factor: ParFactorOption = 1,
    fifo_depth: FifoOption = 4096,
    memory: Annotated[bool, typer.Option(help="Model memory bandwidth and latency.")] = True,
    table: Annotated[bool, typer.Option(help="Print each region's fusion table.")] = False,
    quick: Annotated[bool, typer.Option(help="Smaller BigBird (256 tokens).")] = False,
    gv: Annotated[
        Path | None,
        typer.Option(
            help="Write each region's statements, lowered to the per-token machine, as SAM "
            "graphs (region<k>_<statement>.gv) into this folder."
        ),
    ] = None,
    json: JsonOption = False,
) -> None:
    """Simulate the best-estimated schedule of one cut; print cycles per region and primitive."""
    from fusekit.sparse.fusion_table import fusion_table
    from fusekit.sparse.search import explore
    from fusekit.sparse.workloads import load_workload

    w = load_workload(workload, quick=quick)
    par = _par(w, par_level, par_factor)
    start = time.perf_counter()
    with progress(f"simulating {w.name}", None) as bar:
        ex = explore(
            w, _machine(fifo_depth, memory), cuts=(cut,), top=1, par=par, progress=_advance(bar)
        )
    best = ex.best(cut)
    wall_s = time.perf_counter() - start
    assert best.result is not None
    r = best.result
    written: list[str] = []
    if gv is not None:
        from fusekit.sparse.sam.export import write_schedule_graphs

        written = write_schedule_graphs(w.program, best.schedule, gv)
    regions: list[dict[str, Any]] = [
        {
            "statements": list(g.statements),
            "cycles": g.cycles,
            "compute_cycles": g.compute_cycles,
            "memory_cycles": g.memory_cycles,
            "fill_cycles": g.fill_cycles,
            "flops": g.flops,
        }
        for g in r.regions
    ]
    if json:
        print_json(
            {
                "workload": w.name,
                "schedule": best.schedule.label(),
                "cycles": r.cycles,
                "flops": r.flops,
                "memory_bytes": r.memory_bytes,
                "correct": best.correct,
                "estimate_cycles": best.estimate.cycles,
                "regions": regions,
                "wall_s": wall_s,
                "notes": w.notes,
                **({"gv": written} if gv is not None else {}),
            }
        )
        return
    print_table(
        f"{w.name}, {best.schedule.label()}: {r.cycles:,.0f} cycles, {r.flops:,.0f} ops, "
        f"outputs {'equal' if best.correct else 'DIFFER from'} the reference ({wall_s:.1f} s)",
        ("region", "cycles", "compute", "memory", "fill", "ops"),
        [
            (
                ",".join(g["statements"]),
                g["cycles"],
                g["compute_cycles"],
                g["memory_cycles"],
                g["fill_cycles"],
                g["flops"],
            )
            for g in regions
        ],
    )
    for k, g in enumerate(r.regions):
        busiest = sorted(g.prims, key=lambda p: -p.busy_cycles)[:8]
        print_table(
            f"Busiest primitives of region {k} ({','.join(g.statements)})",
            ("statement", "primitive", "kind", "tokens", "busy cycles"),
            [(p.statement, p.name, p.kind, p.tokens, p.busy_cycles) for p in busiest],
        )
        if table:
            print(fusion_table(w.program, best.schedule, k).format(width=console.width))
    for line in written:
        print(line)
    if w.notes:
        print_text(w.notes)


@app.command()
def explore(
    workload: WorkloadArg = "gcn-cora",
    top: Annotated[
        int, typer.Option(help="Schedules simulated per cut (best estimates).", min=1)
    ] = 3,
    par_level: ParLevelOption = 0,
    par_factor: ParFactorOption = 1,
    fifo_depth: FifoOption = 4096,
    memory: Annotated[bool, typer.Option(help="Model memory bandwidth and latency.")] = True,
    plot: Annotated[
        Path | None, typer.Option(help="Write a plot (PNG) of the explored schedules.")
    ] = None,
    quick: Annotated[bool, typer.Option(help="Smaller BigBird (256 tokens).")] = False,
    json: JsonOption = False,
) -> None:
    """Enumerate schedules, rank them with the estimator, simulate the best of each cut."""
    from fusekit.sparse.search import explore as run_explore
    from fusekit.sparse.workloads import load_workload

    w = load_workload(workload, quick=quick)
    par = _par(w, par_level, par_factor)
    start = time.perf_counter()
    with progress(f"exploring {w.name}", None) as bar:
        ex = run_explore(w, _machine(fifo_depth, memory), top=top, par=par, progress=_advance(bar))
    wall_s = time.perf_counter() - start
    sims = ex.simulated
    if plot is not None:
        plot_exploration(plot, ex)
    rows = [
        {
            "schedule": p.schedule.label(),
            "cut": p.schedule.cut,
            "cycles": p.result.cycles,
            "estimate_cycles": p.estimate.cycles,
            "flops": p.result.flops,
            "correct": p.correct,
        }
        for p in sims
        if p.result is not None
    ]
    if json:
        print_json(
            {
                "workload": w.name,
                "candidates": ex.candidates,
                "simulated": rows,
                "estimator_rank_of_best": ex.estimator_rank_of_best(),
                "wall_s": wall_s,
                "notes": w.notes,
            }
        )
        return
    print_table(
        f"{w.name}: {ex.candidates} schedules, {len(sims)} simulated ({wall_s:.1f} s); the best "
        f"simulated is #{ex.estimator_rank_of_best()} by estimate",
        ("schedule", "cycles", "estimate", "ops", "correct"),
        [
            (r["schedule"], r["cycles"], r["estimate_cycles"], r["flops"], r["correct"])
            for r in rows
        ],
    )
    unfused = ex.best("unfused").result
    best = {c: ex.best(c).result for c in CUTS}
    if unfused is not None and all(r is not None for r in best.values()):
        print_table(
            "Best per cut",
            ("cut", "cycles", "speedup vs unfused", "ops vs unfused"),
            [
                (
                    c,
                    r.cycles,
                    unfused.cycles / r.cycles,
                    r.flops / unfused.flops,
                )
                for c, r in best.items()
                if r is not None
            ],
        )
    if w.notes:
        print_text(w.notes)


def plot_exploration(path: Path, ex: Any) -> None:
    """Simulated cycles of the explored schedules by cut, against the estimator's cycles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    best = [ex.best(c).result.cycles for c in CUTS]
    a.bar(CUTS, best, color=("#888", "#4a7", "#47a"))
    a.set_ylabel("cycles (best schedule)")
    a.set_title(ex.workload)
    for c, marker in zip(CUTS, "os^", strict=True):
        pts = [p for p in ex.simulated if p.schedule.cut == c]
        b.scatter(
            [p.estimate.cycles for p in pts], [p.result.cycles for p in pts], marker=marker, label=c
        )
    b.set_xscale("log")
    b.set_yscale("log")
    b.set_xlabel("estimated cycles")
    b.set_ylabel("simulated cycles")
    b.legend()
    b.grid(alpha=0.3)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _load_input(spec: str) -> tuple[str, Any]:
    """``NAME=FILE`` -> (name, dense array): ``.npy`` as saved, ``.npz`` a scipy.sparse matrix."""
    import numpy as np

    name, eq, file = spec.partition("=")
    if not eq or not name or not file:
        raise ValueError(f"sparse sam: expected '--input' to be NAME=FILE (got {spec!r})")
    path = Path(file)
    if path.suffix == ".npz":
        import scipy.sparse

        try:
            return name, scipy.sparse.load_npz(path).toarray()
        except ValueError as e:
            raise ValueError(f"{path}: expected a scipy.sparse matrix (save_npz): {e}") from e
    if path.suffix != ".npy":
        raise ValueError(f"sparse sam: expected {path} to be a .npy or .npz file")
    return name, np.load(path, allow_pickle=False)


@app.command()
def sam(
    graph: Annotated[Path, typer.Argument(help="A SAM dataflow graph (.gv), as SAM prints it.")],
    input: Annotated[
        list[str] | None,
        typer.Option(
            "--input",
            help="NAME=FILE per input tensor: .npy (dense, logical layout; 0-d for a scalar) or "
            ".npz (a scipy.sparse matrix written by scipy.sparse.save_npz).",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Write the output, dense, as .npz (numpy.savez, key 'output')."),
    ] = None,
    fifo_depth: Annotated[int, typer.Option(help="Tokens per FIFO (0: unbounded).", min=0)] = 0,
    json: JsonOption = False,
) -> None:
    """Run a SAM graph on the per-token machine; print cycles and tokens per block."""
    import numpy as np

    from fusekit.sparse.sam.runner import run as run_sam

    inputs = dict(_load_input(spec) for spec in input or [])
    with progress(f"running {graph.name}", None):
        result = run_sam(graph, inputs, depth=fifo_depth or None)
    if out is not None:
        np.savez(out, output=result.output)
    if json:
        print_json(
            {
                "graph": str(graph),
                "cycles": result.cycles,
                "output_shape": list(result.output.shape),
                "tokens": result.tokens,
            }
        )
        return
    print_table(
        f"{graph}: {result.cycles:,} cycles, output shape {result.output.shape}"
        + (f", written to {out}" if out is not None else ""),
        ("block", "tokens"),
        sorted(result.tokens.items()),
    )


app.command("sam-replay")(sam_replay)
