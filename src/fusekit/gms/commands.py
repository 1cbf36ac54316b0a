"""``fusekit gms``: run the g-mm-s strategies on a synthetic RGCN, conv or MoE problem.

Imported when the CLI starts, so torch, numba and the kernels are imported inside the commands.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Annotated, Any

import typer

from fusekit.console import err_console, print_json, print_table

app = typer.Typer(
    help="Gather-matmul-scatter engine: plans, strategies and their timings.",
    no_args_is_help=True,
)

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
ShapeOption = Annotated[str, typer.Option("--shape", help="Problem family: rgcn, conv or moe.")]
ScaleOption = Annotated[float, typer.Option("--scale", help="Multiply the default problem size.")]
SeedOption = Annotated[int, typer.Option("--seed", help="Seed of the synthetic indices.")]


def _median_s(fn: Callable[[], object], repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


@app.command("plan")
def plan_(
    shape: ShapeOption = "rgcn",
    scale: ScaleOption = 1.0,
    seed: SeedOption = 0,
    as_json: JsonOption = False,
) -> None:
    """Plan a synthetic problem and show its sizes, tiles and order sub-problems."""
    from fusekit.gms import GMSProblem, plan
    from fusekit.gms import workloads as W

    wl = W.make(shape, seed, scale)
    start = time.perf_counter()
    pl = plan(
        GMSProblem.create(
            wl.gather,
            wl.segment,
            wl.scatter,
            wl.n_out,
            num_segments=wl.num_segments,
            reduce=wl.reduce,
        )
    )
    plan_s = time.perf_counter() - start
    row = {
        "workload": wl.name,
        "pairs": pl.num_pairs,
        "segments": pl.num_segments,
        "n_in": pl.n_in,
        "n_out": pl.n_out,
        "reduce": pl.reduce,
        "tiles": pl.num_tiles,
        "blocks": pl.num_blocks,
        "tile_rows": pl.tile_rows,
        "transform_first_rows": pl.transform.plan.num_pairs if pl.transform else None,
        "aggregate_first_rows": pl.aggregate.plan.num_pairs if pl.aggregate else None,
        "plan_s": plan_s,
    }
    if as_json:
        print_json(row)
    else:
        print_table(f"gms plan of {wl.name}", ("field", "value"), list(row.items()))


@app.command()
def run(
    shape: ShapeOption = "rgcn",
    k: Annotated[int, typer.Option("--k", help="Input width K.")] = 16,
    m: Annotated[int, typer.Option("--m", help="Output width M.")] = 16,
    scale: ScaleOption = 1.0,
    seed: SeedOption = 0,
    strategy: Annotated[
        str, typer.Option(help="'named' (the six), 'all' (every order x dataflow) or one name.")
    ] = "named",
    repeats: Annotated[int, typer.Option(help="Timed calls per strategy.")] = 7,
    as_json: JsonOption = False,
) -> None:
    """Time the strategies on a synthetic problem against the reference and ATen compositions."""
    records = run_records(shape, k, m, scale, seed, strategy, repeats)
    if as_json:
        print_json(records)
        return
    print_table(
        f"gms {shape} (K={k}, M={m}): median of {repeats} calls",
        ("impl", "median ms", "speedup vs ATen", "max |err| vs reference"),
        [
            (r["impl"], 1e3 * r["median_s"], r["speedup_vs_aten"], r["max_abs_error"])
            for r in records
        ],
    )


def run_records(
    shape: str, k: int, m: int, scale: float, seed: int, strategy: str, repeats: int
) -> list[dict[str, Any]]:
    """The rows ``fusekit gms run`` prints: one per implementation.

    Raises:
        ValueError: unknown shape or strategy, or a non-positive width or repeat count.
    """
    import torch

    from fusekit.errors import expected
    from fusekit.gms import GMSProblem, Strategy, enumerate_candidates, gms, plan
    from fusekit.gms import workloads as W
    from fusekit.gms.kernels.cpu.g_mseg_s import grouped_mm_supported
    from fusekit.gms.kernels.reference import gms_aten, gms_reference

    for name, value in (("k", k), ("m", m), ("repeats", repeats)):
        if value <= 0:
            raise ValueError(expected("gms", name, "> 0", value))
    wl = W.make(shape, seed, scale)
    problem = GMSProblem.create(
        wl.gather, wl.segment, wl.scatter, wl.n_out, num_segments=wl.num_segments, reduce=wl.reduce
    )
    if strategy in ("named", "all"):
        chosen = enumerate_candidates(wl.reduce, named_only=strategy == "named")
    else:
        chosen = [Strategy.parse(strategy)]
    with err_console.status(f"planning {wl.name} ({wl.num_pairs} pairs)..."):
        pl = plan(problem)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(wl.n_in, k, generator=gen)
    w = torch.randn(wl.num_segments, k, m, generator=gen) / k**0.5
    expected_y = gms_reference(
        x, w, wl.gather, wl.segment, wl.scatter, wl.n_out, wl.scale, wl.reduce
    )

    impls: dict[str, Callable[[], torch.Tensor]] = {}
    if wl.reduce != "max":
        ends = pl.segment_ptr[1:].to(torch.int32)
        scale_sorted = wl.scale[pl.order] if wl.scale is not None else None
        degree = torch.bincount(wl.scatter, minlength=wl.n_out).clamp(min=1).to(x.dtype)
        row_scale = 1.0 / degree if wl.reduce == "mean" else None
        for grouped in (False, True):
            if grouped and not grouped_mm_supported(x, w):
                continue
            name = "aten _grouped_mm" if grouped else "aten per-segment mm"
            impls[name] = lambda g=grouped: gms_aten(
                x, w, pl.gather, pl.scatter, ends, wl.n_out, scale_sorted, g, row_scale
            )
    for s in chosen:
        impls[s.name] = lambda s=s: gms(x, w, pl, wl.scale, s)

    times = {}
    with err_console.status("timing (the first run compiles the numba kernels)..."):
        for name, fn in impls.items():
            times[name] = _median_s(fn, repeats)
    aten = [t for n, t in times.items() if n.startswith("aten")]
    records = []
    for name, fn in impls.items():
        error = float((fn() - expected_y).abs().max()) if expected_y.numel() else 0.0
        records.append(
            {
                "workload": wl.name,
                "pairs": wl.num_pairs,
                "K": k,
                "M": m,
                "impl": name,
                "median_s": times[name],
                "speedup_vs_aten": min(aten) / times[name] if aten else float("nan"),
                "max_abs_error": error,
            }
        )
    return records
