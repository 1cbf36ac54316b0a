"""``fusekit accel``: explore the mappings of a compound op, or evaluate one mapping."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fusekit.console import print_json, print_table, progress

if TYPE_CHECKING:
    from fusekit.accel.mapper import Exploration

app = typer.Typer(
    help="Compound ops (GEMM-Softmax, GEMM-LayerNorm, attention) on multi-cluster accelerators: "
    "COMET's mapping space searched and every mapping evaluated by one tree cost model "
    "(cycles per unit, energy per level, collectives).",
    no_args_is_help=True,
)

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
#: Largest -M, -N, -K (2**24: cycle and energy totals stay exact in float64).
MAX_EXTENT = 2**24


#: The ops ``explore`` knows (COMET templates fusekit writes; ``softmax`` and ``layernorm`` alone
#: are the second kernels of an unfused baseline).
OPS = ("gemm", "gemm_softmax", "gemm_layernorm", "attention", "softmax", "layernorm")


@app.command()
def explore(
    problem: Annotated[
        str,
        typer.Argument(help=f"Built-in op: {', '.join(OPS)} (ignored with --template)."),
    ] = "gemm_softmax",
    hw: Annotated[
        str | None,
        typer.Option(
            help="Accelerator preset or file with a comet_arch (edge, cloud), or a COMET "
            "arch.yaml (default: edge; with --template, the run's arch.yaml)."
        ),
    ] = None,
    m: Annotated[int, typer.Option("-M", help="Rows (queries).", min=1, max=MAX_EXTENT)] = 256,
    n: Annotated[int, typer.Option("-N", help="Columns (keys).", min=1, max=MAX_EXTENT)] = 256,
    k: Annotated[
        int, typer.Option("-K", help="Contraction (head dim).", min=1, max=MAX_EXTENT)
    ] = 128,
    objective: Annotated[str, typer.Option(help="latency, energy or edp.")] = "latency",
    workers: Annotated[int, typer.Option(help="Worker processes.", min=1)] = 1,
    top: Annotated[int, typer.Option(help="Rows of the tilings and Pareto tables.", min=1)] = 10,
    plot: Annotated[
        Path | None, typer.Option(help="Write the latency-energy plot (PNG) here.")
    ] = None,
    prune: Annotated[
        bool,
        typer.Option(
            help="A latency search stops at the lower bound (same best; no Pareto front). "
            "--plot, an energy or edp objective, or --no-prune score every tiling."
        ),
    ] = True,
    space: Annotated[
        str, typer.Option(help="comet: COMET's 8-level tilings (the one space).")
    ] = "comet",
    template: Annotated[
        Path | None,
        typer.Option(
            help="A COMET run folder to tile, on its own arch.yaml unless --hw is given "
            "(default: the op's built-in template)."
        ),
    ] = None,
    constraints: Annotated[
        Path | None,
        typer.Option(help="COMET constraints YAML (default: read off the arch)."),
    ] = None,
    write_mapping: Annotated[
        Path | None,
        typer.Option(
            help="Write the best mapping: a folder of COMET's four files + fusekit.yaml + "
            "tree.yaml (`accel eval DIR` or `accel eval DIR/tree.yaml` reads it)."
        ),
    ] = None,
    native: Annotated[
        bool, typer.Option("--native", help="Generalised model: COMET's defects switched off.")
    ] = False,
    json: JsonOption = False,
) -> None:
    """Search COMET's tilings of an op; the best, the Pareto front, fused against unfused.

    Every tiling is a mapping tree scored by the tree cost model, the same that evaluates
    COMET's own files (`accel comet`); the unfused baseline is COMET's construction (separate
    kernels, the intermediate through DRAM, the same tiling).
    """
    # the tree model imports numpy: loaded when a search is asked for, not at CLI start
    from fusekit.accel.comet.run import CometInputError, arch_document
    from fusekit.accel.comet.space import (
        COMPILED_MIN_TILINGS,
        Space,
        arch_constraints,
        read_constraints,
    )
    from fusekit.accel.compat import Compat
    from fusekit.accel.mapper import OBJECTIVES
    from fusekit.accel.mapper import explore as run_explore

    if space != "comet":
        raise ValueError(
            f"accel explore: expected '--space' comet (got {space}); the flat knob space and "
            "its model were retired: every mapping is a tree scored by the tree model"
        )
    if objective not in OBJECTIVES:
        raise ValueError(f"accel explore: expected '--objective' in {OBJECTIVES} (got {objective})")
    if template is None and problem not in OPS:
        raise ValueError(
            f"accel explore: expected a built-in op in {OPS} or --template RUN_DIR (got {problem})"
        )
    hw_name = hw if hw is not None else ("edge" if template is None else f"{template}/arch.yaml")

    def arch_of(name: str) -> dict[str, Any]:
        try:
            return arch_document(name)
        except CometInputError:
            raise
        except ValueError as e:
            raise ValueError(f"accel explore: '--hw': {e}") from None

    if template is not None:  # the run's own arch.yaml unless --hw is given
        sp = Space(template, arch_of(hw) if hw is not None else None)
    else:
        sp = Space.builtin(problem, arch_of(hw_name))
    fixed = read_constraints(constraints) if constraints is not None else None
    dims = {"M": m, "N": n, "K": k}
    compat = Compat.native() if native else Compat()
    front = plot is not None or objective != "latency" or not prune
    count = sp.count(dims, fixed if fixed is not None else arch_constraints(sp.arch))
    note = "" if count < COMPILED_MIN_TILINGS else " (a first run also compiles the scorer: ~2 min)"
    with progress(f"accel explore: scoring COMET tilings{note}", None):
        ex = run_explore(sp, dims, None if template else problem, objective, fixed, workers,
                         compat, front=front)  # fmt: skip
    if write_mapping is not None:
        sp.write(write_mapping, ex.best.tiling, dims, hw_name)
    name = problem if template is None else str(template)
    if plot is not None:
        _pareto_plot(plot, ex, f"{name} {m}x{n}x{k} on {hw_name}: COMET's tilings, tree model")
    from fusekit.accel.tree_model.stages import analyse

    detail = analyse(sp.inputs(ex.best.tiling, dims), compat=compat)
    record = _explore_json(ex, name, hw_name, detail)
    if json:
        print_json(record)
        return
    _explore_tables(ex, name, hw_name, top, detail)


def _pareto_plot(path: Path, ex: Exploration, title: str) -> None:
    import matplotlib.pyplot as plt  # matplotlib loads only when a plot is asked for

    from fusekit.accel.plot import draw_pareto

    fig = draw_pareto(title, ex)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _scored_json(s: Any) -> dict[str, Any]:
    from fusekit.accel.comet.space import label

    return {"tiling": label(s.tiling), "total_cycles": s.total_cycles,
            "total_energy_pj": s.total_energy_pj}  # fmt: skip


def _explore_json(ex: Exploration, name: str, hw: str, detail: Any) -> dict[str, Any]:
    """The search as ``--json`` prints it."""
    r = ex.result
    unfused = None
    if ex.unfused:
        unfused = {
            "kernels": [{"kernel": kn.name, "dims": kn.dims, "total_cycles": kn.total_cycles,
                         "total_energy_pj": kn.total_energy_pj} for kn in ex.unfused],
            "total_cycles": ex.unfused_cycles, "total_energy_pj": ex.unfused_energy_pj,
            "speedup": ex.speedup, "energy_ratio": ex.energy_ratio,
        }  # fmt: skip
    return {
        "space": "comet", "problem": name, "hw": hw, "extents": ex.dims,
        "objective": ex.objective, "chain": list(ex.chain),
        "tilings": r.tilings, "rejected": r.rejected, "pruned": r.pruned,
        "best": {**_scored_json(ex.best), "cycles": detail["cycles"],
                 "energy_pj": detail["energy_pj"]},
        "pareto": [_scored_json(s) for s in ex.front],
        "unfused": unfused, "unfused_note": ex.unfused_note or None,
        "sample_median_cycles": r.sample_median_cycles, "sample_size": r.sample_size,
        "speedup_vs_sample_median": r.sample_median_cycles / (ex.best.total_cycles or 1),
    }  # fmt: skip


def _explore_tables(ex: Exploration, name: str, hw: str, top: int, detail: Any) -> None:
    """The search as tables: best tilings, front, fused against unfused, the best's units."""
    from fusekit.accel.comet.space import label
    from fusekit.accel.mapper import objective_key

    r = ex.result
    ok = sorted((s for s in r.scored if s.total_cycles is not None),
                key=objective_key(ex.objective))  # fmt: skip
    print_table(
        f"{name} {ex.dims} on {hw}, by {ex.objective}: {r.tilings} tilings, {r.rejected} "
        f"rejected, {r.pruned} pruned by the lower bound",
        ("tiling (DRAMt.DRAMsx.DRAMsy.GBt.GBsx.GBsy.Coret.Compute)", "cycles", "energy (uJ)"),
        [(label(s.tiling), s.total_cycles, (s.total_energy_pj or 0) / 1e6) for s in ok[:top]],
    )
    if ex.front:
        print_table(
            f"Pareto front (cycles against energy, {len(ex.front)} tilings)",
            ("tiling", "cycles", "energy (uJ)"),
            [(label(s.tiling), s.total_cycles, (s.total_energy_pj or 0) / 1e6)
             for s in ex.front[:top]],
        )  # fmt: skip
    if ex.unfused:
        rows: list[tuple[Any, ...]] = [
            (f"unfused: {kn.name}", kn.total_cycles, kn.total_energy_pj / 1e6, "")
            for kn in ex.unfused
        ]
        rows.append(("unfused (sum)", ex.unfused_cycles, (ex.unfused_energy_pj or 0) / 1e6, ""))
        rows.append(("fused (best)", ex.best.total_cycles, (ex.best.total_energy_pj or 0) / 1e6,
                     f"{ex.speedup:.2f}x cycles, {ex.energy_ratio:.2f}x energy"))  # fmt: skip
        print_table(
            "Fused against unfused (COMET's construction: separate kernels, the intermediate "
            "through DRAM, the same tiling)",
            ("kernel", "cycles", "energy (uJ)", "unfused / fused"),
            rows,
        )
    elif ex.unfused_note:
        print(f"no unfused baseline: {ex.unfused_note}")
    print_table(
        "Best against COMET's sampler (median of a seeded sample of accepted tilings)",
        ("best cycles", "sample median", "speedup"),
        [(ex.best.total_cycles, r.sample_median_cycles,
          r.sample_median_cycles / (ex.best.total_cycles or 1))],
    )  # fmt: skip
    _unit_tables(f"the best, {label(ex.best.tiling)}", detail)


def _unit_tables(what: str, out: Any) -> None:
    """COMET's per-unit cycle table, the compute units' utilisation, the energy per level."""
    print_table(
        f"{what}: {out['total_cycles']:,} cycles (COMET's per-unit table)",
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
        typer.Option(
            help="Accelerator preset (its comet_arch) or a COMET arch.yaml to use instead of "
            "the run's arch.yaml."
        ),
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
    _unit_tables(str(case_dir), out)
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


app.command(
    "eval",
    help="Evaluate one mapping: fusekit's tree form (the tree.yaml `explore --write-mapping` "
    "writes) or a COMET run folder, by the tree model; the same as `accel comet`.",
)(comet)
