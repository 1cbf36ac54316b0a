"""``fusekit stitch``: plan the fusion of a model, and time the stitched kernels."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from fusekit import options
from fusekit.console import print_json, print_table, print_text, progress
from fusekit.errors import expected
from fusekit.hw import detect
from fusekit.ir.capture import capture
from fusekit.ir.dot import to_dot
from fusekit.search import time_call

# torch, the workloads, the planner (numpy, HiGHS) and the runner (numba) are imported inside the
# commands: the CLI mounts this module at start-up.

app = typer.Typer(
    help="Fusion plans (ILP on HiGHS) and stitched kernels for chains of memory-intensive ops.",
    no_args_is_help=True,
)

ModelArg = Annotated[
    str,
    typer.Argument(
        help="A stitch workload (layernorm_bwd, masked_softmax, ..., bert), an IR example "
        "(bert, gpt_moe, gcn, rgcn) or path/to/file.py:factory."
    ),
]
FullOption = Annotated[bool, typer.Option("--full", help="Benchmark shapes instead of small ones.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
WideOption = Annotated[
    bool, typer.Option("--wide", help="Every op name, one line per row (may pass 80 columns).")
]


def load(spec: str, full: bool) -> tuple[Any, tuple[Any, ...]]:
    """The module and arguments of ``spec`` (a stitch workload, an IR example or a file)."""
    from fusekit.stitch.workloads import NAMES, load_workload

    if spec in NAMES:
        w = load_workload(spec, small=not full)
        return w.module, w.args
    from fusekit.ir.examples import EXAMPLES, load_model

    if ":" not in spec and spec not in EXAMPLES:
        raise ValueError(
            expected(
                "stitch",
                "model",
                f"a workload ({', '.join(NAMES)}), an IR example ({', '.join(EXAMPLES)}) or "
                "path/to/file.py:factory",
                repr(spec),
            )
        )
    ex = load_model(spec)
    return ex.module, ex.args


def plan_dot(plan: Any) -> str:
    """Graphviz text of the planned graph, one cluster per stitched group."""
    body = to_dot(plan.graph).rstrip().removesuffix("}")
    clusters = []
    for k, g in enumerate(plan.groups):
        if len(g.ops) < 2:
            continue
        label = f"kernel {k}: {g.layout.scheme.value if g.layout else 'alone'}"
        nodes = " ".join(f'"op:{o}";' for o in sorted(g.ops))
        clusters.append(
            f'  subgraph cluster_{k} {{ label="{label}"; style=dashed; color=blue; {nodes} }}'
        )
    return body + "\n".join(clusters) + "\n}\n"


def plan_summary(plan: Any) -> dict[str, Any]:
    """The plan as JSON-ready data."""
    return {
        "graph": plan.graph.name,
        "ops": len(plan.graph.ops),
        "kernels": plan.kernels,
        "method": plan.method,
        "objective_s": plan.objective_s,
        "bound_s": plan.bound_s,
        "greedy_s": plan.greedy_s,
        "unfused_s": plan.unfused_s,
        "predicted_speedup": plan.unfused_s / plan.objective_s,
        "solve_s": plan.solve_s,
        "candidates_s": plan.candidates_s,
        "candidates": plan.n_candidates,
        "optimal": plan.optimal,
        "timed_out": plan.timed_out,
        "cached": plan.cached,
        "groups": [
            {
                "ops": sorted(g.ops),
                "scheme": g.layout.scheme.value if g.layout else "alone",
                "predicted_s": g.cost.total_s,
                "dram_bytes": g.cost.dram_bytes,
                "why_alone": g.reason,
            }
            for g in plan.groups
        ],
    }


@app.command("plan")
def plan_command(
    model: ModelArg,
    method: Annotated[str, typer.Option(help="ilp or greedy.")] = "ilp",
    time_limit: Annotated[
        float, typer.Option(help="ILP time limit (s), > 0.", callback=options.seconds)
    ] = 5.0,
    dot: Annotated[Path | None, typer.Option("--dot", help="Write the plan as Graphviz.")] = None,
    full: FullOption = False,
    wide: WideOption = False,
    as_json: JsonOption = False,
) -> None:
    """Plan the fusion of MODEL: groups, schemes, predicted gains, objective, bound, solve time."""
    from fusekit.stitch.search import plan

    module, args = load(model, full)
    cap = capture(module, args)
    p = plan(cap.graph, detect(), method=method, time_limit_s=time_limit)
    if dot is not None:
        dot.write_text(plan_dot(p))
    summary = plan_summary(p)
    if as_json:
        print_json(summary)
        return
    rows = [
        (k, g["scheme"], len(g["ops"]), _names(g["ops"], wide), g["predicted_s"] * 1e6,
         g["dram_bytes"] / 1e6)
        for k, g in enumerate(summary["groups"])
    ]  # fmt: skip
    print_table(f"stitch plan of {p.graph.name}", ["kernel", "scheme", "ops", "names", "us",
                                                   "MB"], rows, wide=wide)  # fmt: skip
    print_text(
        f"{summary['ops']} ops -> {summary['kernels']} kernels; predicted "
        f"{p.objective_s * 1e6:.1f} us (greedy {p.greedy_s * 1e6:.1f}, every op alone "
        f"{p.unfused_s * 1e6:.1f}: x{summary['predicted_speedup']:.2f}); bound "
        f"{p.bound_s * 1e6:.1f} us; ILP {p.solve_s * 1e3:.1f} ms over {p.n_candidates} "
        f"candidates ({'optimal' if p.optimal else 'time limit'})"
        + ("; from the plan cache (those figures are the planning run's)" if p.cached else ""),
        wide=wide,
    )


def _names(ops: list[str], wide: bool, most: int = 6) -> str:
    """The op names of a group: the first ``most`` and a count of the rest, unless ``wide``."""
    if wide or len(ops) <= most:
        return ", ".join(ops)
    return f"{', '.join(ops[:most])} and {len(ops) - most} more (--wide)"


@app.command("bench")
def bench_command(
    model: ModelArg,
    repeats: Annotated[int, typer.Option(help="Timed calls.", min=1)] = 10,
    full: FullOption = False,
    as_json: JsonOption = False,
) -> None:
    """Time MODEL eager against its stitched kernels (and check they agree)."""
    import torch

    from fusekit.stitch.runner import Stitched

    module, args = load(model, full)
    with torch.no_grad(), progress(f"stitch bench {model}: planning", 4) as bar:

        def step(done: int, what: str) -> None:
            bar.update(bar.task_ids[0], completed=done, description=f"stitch bench {model}: {what}")

        stitched = Stitched(module, detect())
        _, planned = stitched.prepare(*args)
        step(1, "checking against eager")
        ref, out = module(*args), stitched(*args)
        refs = ref if isinstance(ref, tuple) else (ref,)
        outs = out if isinstance(out, tuple) else (out,)
        err = max(float((a - b).abs().max()) for a, b in zip(refs, outs, strict=True))
        step(2, "timing eager")
        eager = time_call(lambda: module(*args), repeats, warmup=2)
        step(3, "timing the stitched kernels")
        fused = time_call(lambda: stitched(*args), repeats, warmup=2)
        step(4, "done")
    data = {
        "model": model,
        "eager_s": eager.median_s,
        "fusekit_s": fused.median_s,
        "speedup": eager.median_s / fused.median_s,
        "kernels": planned.plan.kernels,
        "ops": len(planned.graph.ops),
        "max_abs_err": err,
    }
    if as_json:
        print_json(data)
        return
    print_table(
        f"stitch bench of {model}",
        ["eager ms", "fusekit ms", "speedup", "kernels", "IR ops", "max |err|"],
        [(eager.median_s * 1e3, fused.median_s * 1e3, data["speedup"], data["kernels"],
          data["ops"], err)],
    )  # fmt: skip
