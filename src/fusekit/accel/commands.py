"""``fusekit accel``: explore the mappings of a compound op, or evaluate one mapping."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.progress import TaskID

from fusekit.accel.mapping import Fusion, Mapping, from_tree, load_mapping_file, to_tree
from fusekit.accel.mapping import tree_to_dict as mapping_to_dict
from fusekit.accel.model import Breakdown, evaluate
from fusekit.accel.plot import draw_pareto
from fusekit.accel.problem import KINDS, Problem, load_problem, problem_from_dict
from fusekit.accel.search import OBJECTIVES, Scored, SearchResult
from fusekit.accel.search import explore as run_explore
from fusekit.console import print_json, print_table, progress
from fusekit.errors import ConfigError
from fusekit.files import load_yaml_mapping
from fusekit.hw import Accelerator, load
from fusekit.hw.cpu_gpu import plain
from fusekit.search import LocalExecutor

app = typer.Typer(
    help="Compound ops (GEMM-Softmax, GEMM-LayerNorm, attention) on multi-cluster accelerators: "
    "latency, energy, collectives and a mapping explorer.",
    no_args_is_help=True,
)

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
#: Largest -M, -N, -K (2**24: cycle and energy totals stay exact in float64).
MAX_EXTENT = 2**24


def _breakdown_rows(b: Breakdown) -> list[tuple[Any, ...]]:
    return [(o.name, o.kind, o.cycles, o.energy_pj / 1e6, o.dram_words) for o in b.ops]


def _breakdown_json(b: Breakdown) -> dict[str, Any]:
    return {
        "latency_cycles": b.latency_cycles,
        "energy_pj": b.energy_pj,
        "dram_words": b.dram_words,
        "energy_by_part_pj": dict(b.energy_by_part_pj),
        "ops": [
            {
                "name": o.name,
                "kind": o.kind,
                "cycles": o.cycles,
                "energy_pj": o.energy_pj,
                "dram_words": o.dram_words,
            }
            for o in b.ops
        ],
    }


def _pareto_plot(path: Path, result: SearchResult, best: Scored, title: str) -> None:
    import matplotlib.pyplot as plt  # matplotlib loads only when a plot is asked for

    bests = {f: per["latency"] for f, per in result.best_by_fusion.items()}
    fig = draw_pareto(title, result.pareto, bests, best)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


@app.command()
def explore(
    problem: Annotated[
        str, typer.Argument(help="gemm, gemm_softmax, gemm_layernorm, attention, or a YAML file.")
    ] = "gemm_softmax",
    hw: Annotated[str, typer.Option(help="Accelerator preset or YAML file.")] = "edge",
    m: Annotated[int, typer.Option("-M", help="Rows (queries).", min=1, max=MAX_EXTENT)] = 256,
    n: Annotated[int, typer.Option("-N", help="Columns (keys).", min=1, max=MAX_EXTENT)] = 256,
    k: Annotated[
        int, typer.Option("-K", help="Contraction (head dim).", min=1, max=MAX_EXTENT)
    ] = 128,
    objective: Annotated[str, typer.Option(help="latency, energy or edp.")] = "latency",
    workers: Annotated[int, typer.Option(help="Worker processes.", min=1)] = 1,
    top: Annotated[int, typer.Option(help="Rows of the Pareto table.", min=1)] = 10,
    plot: Annotated[Path | None, typer.Option(help="Write the Pareto plot (PNG) here.")] = None,
    space: Annotated[
        str, typer.Option(help="fusekit (flat knobs) or comet (COMET's 8-level tilings).")
    ] = "fusekit",
    template: Annotated[
        Path | None,
        typer.Option(
            help="--space comet: a COMET run folder to tile (default: the op's built-in "
            "template on the --hw preset's comet_arch)."
        ),
    ] = None,
    constraints: Annotated[
        Path | None,
        typer.Option(help="--space comet: COMET constraints YAML (default: read off the arch)."),
    ] = None,
    write_mapping: Annotated[
        Path | None,
        typer.Option(
            help="Write the best mapping: with --space comet a folder of COMET's four files + "
            "fusekit.yaml + tree.yaml; else one YAML file (problem, accelerator, mapping) that "
            "`accel eval` reads."
        ),
    ] = None,
    json: JsonOption = False,
) -> None:
    """Search the mapping space; print the Pareto front and the best mapping's breakdown."""
    if space == "comet":
        _explore_comet(problem, template, hw, m, n, k, constraints, write_mapping, workers, json)
        return
    if space != "fusekit":
        raise ValueError(f"accel explore: expected '--space' fusekit or comet (got {space})")
    if objective not in OBJECTIVES:
        raise ValueError(f"accel explore: expected '--objective' in {OBJECTIVES} (got {objective})")
    spec = KINDS[problem](m, n, k) if problem in KINDS else load_problem(problem)
    target = load(hw)
    if not isinstance(target, Accelerator):
        raise ValueError(f"accel explore: expected '--hw' to be an accelerator (got {target.kind})")
    with LocalExecutor(workers) as ex, progress("accel explore", total=1) as bar:
        result = run_explore(
            spec,
            target,
            ex,
            on_chunk=lambda d, t: bar.update(TaskID(0), completed=d, total=t),
        )
    best = result.best[objective]
    breakdown = evaluate(spec, target, best.mapping)
    if write_mapping is not None:
        _write_flat(write_mapping, problem, m, n, k, hw, spec, best.mapping)
    by_fusion = {
        f.value: {"latency_cycles": s["latency"].latency_cycles, "energy_pj": s["energy"].energy_pj}
        for f, s in result.best_by_fusion.items()
    }
    if plot is not None:
        ops = " -> ".join(
            f"{st.out}={'+'.join(o for o, _ in st.simd_ops) or st.kind}" for st in spec.stages
        )
        _pareto_plot(plot, result, best, f"{spec.name} on {target.name}: {ops}")
    if json:
        print_json(
            {
                "problem": spec.name,
                "extents": dict(spec.extents),
                "hw": target.name,
                "candidates": result.candidates,
                "evaluated": result.evaluated,
                "wall_s": result.wall_s,
                "best": {"mapping": best.mapping.label(), **_breakdown_json(breakdown)},
                "best_by_fusion": by_fusion,
                "pareto": [
                    {
                        "mapping": s.mapping.label(),
                        "latency_cycles": s.latency_cycles,
                        "energy_pj": s.energy_pj,
                    }
                    for s in result.pareto
                ],
            }
        )
        return
    print_table(
        f"Pareto front: {spec.name} {dict(spec.extents)} on {target.name} "
        f"({result.candidates} mappings, {result.evaluated} evaluated, {result.wall_s:.2f} s)",
        ("mapping", "latency (cycles)", "energy (uJ)"),
        [(s.mapping.label(), s.latency_cycles, s.energy_pj / 1e6) for s in result.pareto[:top]],
    )
    unfused = result.best_by_fusion.get(Fusion.UNFUSED)
    rows = [
        (f.value, s["latency"].latency_cycles, s["energy"].energy_pj / 1e6,
         unfused["latency"].latency_cycles / s["latency"].latency_cycles if unfused else "-")
        for f, s in result.best_by_fusion.items()
    ]  # fmt: skip
    print_table(
        "Best per fusion level (unfused: intermediates through DRAM, no pipelining across ops, "
        "same tiling)",
        ("fusion", "best latency", "best energy (uJ)", "speedup vs unfused"),
        rows,
    )
    print_table(
        f"Breakdown of the best by {objective}: {best.mapping.label()}",
        ("op / collective", "kind", "cycles", "energy (uJ)", "DRAM words"),
        _breakdown_rows(breakdown),
    )


def _write_flat(
    path: Path, problem: str, m: int, n: int, k: int, hw: str, spec: Problem, mapping: Mapping
) -> None:
    """One mapping as ``accel eval`` reads it: the problem, the accelerator, the tree."""
    prob = {"kind": problem, "M": m, "N": n, "K": k} if problem in KINDS else None
    doc = {"problem": prob or load_yaml_mapping(problem), "accelerator": hw,
           "mapping": mapping_to_dict(to_tree(spec, mapping))}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {spec.name} on {hw}: {mapping.label()}\n"
                    + yaml.safe_dump(doc, sort_keys=False))  # fmt: skip


def _explore_comet(
    problem: str,
    template: Path | None,
    hw: str,
    m: int,
    n: int,
    k: int,
    constraints: Path | None,
    write_mapping: Path | None,
    workers: int,
    json: bool,
) -> None:
    """COMET's 8-level tilings of a run template, every one scored by the tree model."""
    # the tree model imports numpy: loaded when COMET's space is asked for, not at CLI start
    from fusekit.accel.comet.space import Space, label, read_constraints

    target = load(hw)
    arch = (
        plain(target.comet_arch) if isinstance(target, Accelerator) and target.comet_arch else None
    )
    if template is not None:
        sp = Space(template, arch)
    elif arch is None:
        raise ValueError(f"accel explore: expected '--hw' with a comet_arch (got {hw})")
    else:
        sp = Space.builtin(problem, arch)
    fixed = read_constraints(constraints) if constraints is not None else None
    dims = {"M": m, "N": n, "K": k}
    with progress("accel explore: scoring COMET tilings", None):
        result = sp.search(dims, fixed, workers=workers)
    best = result.best
    ok = [s for s in result.scored if s.total_cycles is not None]
    if write_mapping is not None:
        sp.write(write_mapping, best.tiling, dims, hw)
    record = {
        "space": "comet",
        "hw": hw,
        "extents": dims,
        "tilings": result.tilings,
        "rejected": result.rejected,
        "pruned": result.pruned,
        "best": {"tiling": label(best.tiling), "total_cycles": best.total_cycles,
                 "total_energy_pj": best.total_energy_pj},
        "sample_median_cycles": result.sample_median_cycles,
        "sample_size": result.sample_size,
        "speedup_vs_sample_median": result.sample_median_cycles / (best.total_cycles or 1),
    }  # fmt: skip
    if json:
        print_json(record)
        return
    print_table(
        f"COMET space on {hw}: {dims} ({record['tilings']} tilings, {record['rejected']} "
        f"rejected, {record['pruned']} pruned by the lower bound)",
        ("tiling (DRAMt.DRAMsx.DRAMsy.GBt.GBsx.GBsy.Coret.Compute)", "cycles", "energy (uJ)"),
        [(label(s.tiling), s.total_cycles, (s.total_energy_pj or 0) / 1e6)
         for s in sorted(ok, key=lambda s: s.total_cycles or 0)[:10]],
    )  # fmt: skip
    print_table(
        "Best against COMET's sampler (median of a seeded sample of accepted tilings)",
        ("best cycles", "sample median", "speedup"),
        [(best.total_cycles, record["sample_median_cycles"], record["speedup_vs_sample_median"])],
    )


@app.command("eval")
def eval_(
    mapping: Annotated[Path, typer.Argument(help="YAML with problem, accelerator and mapping.")],
    json: JsonOption = False,
) -> None:
    """Evaluate one mapping tree: latency and energy per op and per collective."""
    data, tree = load_mapping_file(mapping)
    spec = problem_from_dict(data["problem"], f"{mapping}: problem")
    target = load(data.get("accelerator", "edge"))
    if not isinstance(target, Accelerator):
        raise ConfigError(str(mapping), "accelerator", f"expected an accelerator ({target.kind})")
    flat = from_tree(spec, tree, target)
    b = evaluate(spec, target, flat)
    if json:
        print_json({"mapping": flat.label(), **_breakdown_json(b)})
        return
    print_table(
        f"{spec.name} on {target.name}: {flat.label()} -- {b.latency_cycles:,.0f} cycles, "
        f"{b.energy_pj / 1e6:,.3f} uJ",
        ("op / collective", "kind", "cycles", "energy (uJ)", "DRAM words"),
        _breakdown_rows(b),
    )
    print_table("Energy by part", ("part", "energy (uJ)"),
                [(k, v / 1e6) for k, v in b.energy_by_part_pj.items()])  # fmt: skip


@app.command("comet")
def comet(
    case_dir: Annotated[
        Path, typer.Argument(help="Folder with COMET's arch, problem, mapping, constants YAML.")
    ],
    native: Annotated[
        bool, typer.Option("--native", help="Generalised model: COMET's defects switched off.")
    ] = False,
    hw: Annotated[
        str | None,
        typer.Option(help="Accelerator preset whose comet_arch replaces the run's arch.yaml."),
    ] = None,
    nest: Annotated[
        bool, typer.Option("--nest", help="Also print the loop nest with per-node accesses.")
    ] = False,
    json: JsonOption = False,
) -> None:
    """Evaluate a COMET run from its own four input files, as the COMET binary does.

    A tiling that COMET's fit check rejects, or a malformed file, exits with status 2 and one
    line naming the file, the node or every overflowing level.
    """
    # the tree model imports numpy: loaded when a COMET run is asked for, not at CLI start
    from fusekit.accel.comet.run import evaluate as evaluate_run

    out = evaluate_run(case_dir, compat=not native, hw=hw)
    if json:
        print_json(out)
        return
    print_table(
        f"{case_dir}: {out['total_cycles']:,} cycles (COMET's per-unit table)",
        ("unit", "CS", "OS", "TMW", "total"),
        [(u, r.get("CS", "-"), r.get("OS", "-"), r.get("TMW", "-"), r["total"])
         for u, r in out["cycles"].items()],
    )  # fmt: skip
    print_table(
        "Compute units: utilisation (ideal compute cycles / root cycles)",
        ("unit", "utilisation"),
        [(u, f"{v:.2f}") for u, v in out["utilisation"].items()],
    )
    print_table(
        f"Energy by level: {out['total_energy_pj']:,.2f} pJ",
        ("level", "energy (pJ)"),
        list(out["energy_pj"].items()),
    )
    if nest:
        rows = []
        for r in out["nest"]:
            pad = " " * r["depth"] + "#" + r["node"].rsplit("::", 1)[-1]
            if "loops" in r:
                loops = "; ".join(
                    f"{lp['tensor']}({lp['tag']}) {lp['from']}->{lp['to']} "
                    + " x ".join(str(f) for f in lp["factors"] if f)
                    for lp in r["loops"]
                )
                acc = ", ".join(f"{a['level']}:{a['tensor']} {a['count']}x{a['tile_elems']}"
                                for a in r["accesses"] if a["role"] != "compute")  # fmt: skip
                rows.append((f"{pad} {r['type']}", loops, acc, r["cycles"]))
            else:
                what = r.get("op") or r.get("tensor") or ""
                rows.append((f"{pad} {r['type']}", what, "", r.get("cycles", "")))
        print_table("Loop nest (loops per tensor; accesses: level:tensor tiles x elements)",
                    ("node", "loops", "accesses", "cycles"), rows)  # fmt: skip
