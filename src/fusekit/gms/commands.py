"""``fusekit gms``: run the g-mm-s strategies on a synthetic RGCN, conv or MoE problem.

Imported when the CLI starts, so torch, numba and the gms modules that import them (kernels,
plans, workloads, the tuner and the selector) are imported inside the commands.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterable
from typing import Annotated, Any

import typer

from fusekit import options
from fusekit.console import console, err_console, print_json, print_table, print_text, progress
from fusekit.errors import FusekitError, expected
from fusekit.gms.labels import LEGEND, point_label, strategy_label
from fusekit.hw import detect
from fusekit.search import LocalExecutor, RayExecutor, SerialExecutor, TuningCache, point_key
from fusekit.search.measure import time_call

app = typer.Typer(
    help="Gather-matmul-scatter engine: plans, strategies and their timings.",
    no_args_is_help=True,
)

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
ShapeOption = Annotated[str, typer.Option("--shape", help="Problem family: rgcn, conv or moe.")]
ScaleOption = Annotated[
    float,
    typer.Option(
        "--scale", help="Multiply the default problem size (at most 100).", callback=options.scale
    ),
]
SeedOption = Annotated[
    int,
    typer.Option("--seed", help="Seed of the synthetic indices.", min=0, max=options.MAX_SEED),
]
WideOption = Annotated[
    bool, typer.Option("--wide", help="Full names, one line per row (may pass 80 columns).")
]
#: Largest --k and --m.
MAX_WIDTH = 65_536


@app.command("plan")
def plan_(
    shape: ShapeOption = "rgcn",
    scale: ScaleOption = 1.0,
    seed: SeedOption = 0,
    as_json: JsonOption = False,
) -> None:
    """Plan a synthetic problem and show its sizes, tiles and order sub-problems."""
    from fusekit.gms import plan
    from fusekit.gms import workloads as W

    wl = W.make(shape, seed, scale)
    start = time.perf_counter()
    pl = plan(wl.problem())
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
    k: Annotated[int, typer.Option("--k", help="Input width K.", min=1, max=MAX_WIDTH)] = 16,
    m: Annotated[int, typer.Option("--m", help="Output width M.", min=1, max=MAX_WIDTH)] = 16,
    scale: ScaleOption = 1.0,
    seed: SeedOption = 0,
    strategy: Annotated[
        str, typer.Option(help="'named' (the six), 'all' (every order x dataflow) or one name.")
    ] = "named",
    repeats: Annotated[int, typer.Option(help="Timed calls per strategy.", min=1)] = 7,
    wide: WideOption = False,
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
            (
                strategy_label(r["impl"], wide),
                1e3 * r["median_s"],
                r["speedup_vs_aten"],
                r["max_abs_error"],
            )
            for r in records
        ],
        wide=wide,
    )
    _legend(wide, (r["impl"] for r in records))


def _legend(wide: bool, names: Iterable[str]) -> None:
    """The abbreviations' legend, under a table that shortened a strategy name."""
    if not wide and any(strategy_label(n) != n for n in names):
        console.print(LEGEND, markup=False, highlight=False)


def run_records(
    shape: str, k: int, m: int, scale: float, seed: int, strategy: str, repeats: int
) -> list[dict[str, Any]]:
    """The rows ``fusekit gms run`` prints: one per implementation.

    Raises:
        ValueError: unknown shape or strategy, or a non-positive width or repeat count.
    """
    import torch

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
            impls[name] = functools.partial(
                gms_aten,
                x,
                w,
                pl.gather,
                pl.scatter,
                ends,
                wl.n_out,
                scale_sorted,
                grouped,
                row_scale,
            )
    for s in chosen:
        impls[s.name] = functools.partial(gms, x, w, pl, wl.scale, s)

    times = {}
    # the first call of a strategy compiles its numba kernels (cached on disk afterwards)
    with progress(f"timing {len(impls)} implementations", len(impls)) as bar:
        for done, (name, fn) in enumerate(impls.items(), 1):
            times[name] = time_call(fn, repeats).median_s
            bar.update(bar.task_ids[0], completed=done)
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


# ---- tuning and explaining (issue 4) ----

CacheOption = Annotated[
    str | None,
    typer.Option("--cache", help="Tuning cache file (default ~/.cache/fusekit/tuning.json)."),
]
KOption = Annotated[int, typer.Option("--k", help="Input width K.", min=1, max=MAX_WIDTH)]
MOption = Annotated[int, typer.Option("--m", help="Output width M.", min=1, max=MAX_WIDTH)]


def _problem(shape: str, seed: int, scale: float) -> tuple[Any, Any]:
    from fusekit.gms import workloads as W

    wl = W.make(shape, seed, scale)
    return wl, wl.problem()


def _executor(name: str, workers: int | None, address: str | None) -> Any:
    """The executor of ``gms tune``: never two timings at once on one host's cores."""
    if workers is not None and workers < 1:
        raise ValueError(expected("gms tune", "--workers", "an int >= 1", workers))
    if name == "serial":
        return SerialExecutor()
    if name == "local":
        if workers is not None and workers > 1:
            raise FusekitError(
                expected(
                    "gms tune",
                    "--workers",
                    "1 with --executor local (points timed side by side on one host share its "
                    "cores and disturb each other's timings; use --executor ray on a cluster)",
                    workers,
                )
            )
        return LocalExecutor(1)
    if name == "ray":
        return RayExecutor(workers, address, one_per_host=True)
    raise ValueError(expected("gms tune", "executor", "serial, local or ray", repr(name)))


@app.command()
def tune(
    shape: ShapeOption = "rgcn",
    k: KOption = 32,
    m: MOption = 32,
    scale: ScaleOption = 0.25,
    seed: SeedOption = 0,
    budget: Annotated[
        float,
        typer.Option(
            help="Share of the space (< 1) or number of points to measure.",
            callback=options.finite(0.0, None, low_open=True, integer_from=1.0),
        ),
    ] = 0.05,
    exhaustive: Annotated[bool, typer.Option(help="Measure every point instead.")] = False,
    executor: Annotated[
        str,
        typer.Option(
            help="serial, local (one worker process) or ray (one point per Ray host at a time). "
            "Points are never timed side by side on one host: more workers than hosts is refused."
        ),
    ] = "serial",
    workers: Annotated[
        int | None,
        typer.Option(help="Points timed at once: at most the Ray cluster's hosts.", min=1),
    ] = None,
    address: Annotated[
        str | None,
        typer.Option(help="Ray cluster address ('auto': the running one); default a private one."),
    ] = None,
    repeats: Annotated[int, typer.Option(help="Timed calls per point.", min=1)] = 5,
    cache: CacheOption = None,
    wide: WideOption = False,
    as_json: JsonOption = False,
) -> None:
    """Measure the model's best configurations of a problem; cache them; refit the model."""
    from fusekit.gms.search import checked, refit, space_configs
    from fusekit.gms.search import tune as run_tune

    ex = _executor(executor, workers, address)  # refuses before anything is measured
    wl, problem = _problem(shape, seed, scale)
    target = detect()
    store = checked(TuningCache(cache))
    with progress(f"tuning {wl.name} ({wl.num_pairs} pairs)", None) as bar:

        def advance(done: int, total: int) -> None:
            bar.update(bar.task_ids[0], completed=done, total=total)

        with ex:
            result = run_tune(
                problem,
                k,
                m,
                has_scale=wl.scale is not None,
                target=target,
                budget=budget,
                exhaustive=exhaustive,
                executor=ex,
                cache=store,
                repeats=repeats,
                progress=advance,
            )
    coef = refit(store, target)
    points, _ = space_configs(result.features, target)
    predicted = dict(zip((point_key(p) for p in points), result.predicted_s, strict=True))
    by_key = {point_key(p): p for p in points}  # the knobs in the space's order
    rows = sorted(result.measured.items(), key=lambda kv: kv[1])
    if as_json:
        print_json(
            {
                "workload": wl.name,
                "space": result.space_size,
                "measured": result.measured,
                "newly_measured": result.newly_measured,
                "best": result.best_point,
                "best_s": result.best_s,
                "search_s": result.search_s,
                "coef": coef,
                "cache": str(store.path),
            }
        )
        return
    print_table(
        f"gms tune {wl.name} (K={k}, M={m}): {len(rows)} of {result.space_size} points measured "
        f"({result.newly_measured} new) in {result.search_s:.1f} s",
        ("rank", "strategy", "configuration", "predicted ms", "measured ms"),
        [
            (
                i + 1,
                strategy_label(by_key.get(key, json.loads(key)).get("strategy", "-"), wide),
                point_label(by_key.get(key, json.loads(key)), wide),
                1e3 * predicted.get(key, float("nan")),
                1e3 * t,
            )
            for i, (key, t) in enumerate(rows[:10])
        ],
        wide=wide,
    )
    _legend(wide, (json.loads(key).get("strategy", "") for key, _ in rows[:10]))
    best = result.best_point
    print_text(
        f"best: {strategy_label(best.get('strategy', '-'), wide)} {point_label(best, wide)} "
        f"({1e3 * result.best_s:.3f} ms); cache {store.path}; "
        "model refitted on the cache's measurements",
        wide=wide,
    )


@app.command()
def explain(
    shape: ShapeOption = "rgcn",
    k: KOption = 32,
    m: MOption = 32,
    scale: ScaleOption = 0.25,
    seed: SeedOption = 0,
    measure: Annotated[
        bool, typer.Option(help="Also time each strategy's predicted-best configuration.")
    ] = True,
    cache: CacheOption = None,
    wide: WideOption = False,
    as_json: JsonOption = False,
) -> None:
    """Each strategy's predicted (and measured) time for a problem, and why the winner wins."""
    with progress("explain: timing each strategy", None) as bar:

        def advance(done: int, total: int) -> None:
            bar.update(bar.task_ids[0], completed=done, total=total)

        records, why = explain_records(shape, k, m, scale, seed, measure, cache, advance)
    if as_json:
        print_json({"strategies": records, "why": why})
        return
    print_table(
        f"gms explain {shape} (K={k}, M={m}): each strategy at its predicted-best configuration",
        ("strategy", "predicted ms", "measured ms", "where the time goes (model)", "config"),
        [
            (
                strategy_label(r["strategy"], wide),
                1e3 * r["predicted_s"],
                1e3 * r["measured_s"] if r["measured_s"] is not None else "-",
                r["explain"],
                r["config"],
            )
            for r in records
        ],
        wide=wide,
    )
    _legend(wide, (r["strategy"] for r in records))
    print_text(why, wide=wide)


def explain_records(
    shape: str,
    k: int,
    m: int,
    scale: float,
    seed: int,
    measure: bool,
    cache: str | None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[dict[str, Any]], str]:
    """The rows ``fusekit gms explain`` prints, and its sentence on why the winner wins.

    ``progress(done, total)`` is called after each strategy.
    """
    import torch

    from fusekit.gms import model, plan
    from fusekit.gms.features import features, signature
    from fusekit.gms.search import (
        MODEL_NAME,
        checked,
        hardware_key,
        operands,
        run_config,
        space_configs,
    )
    from fusekit.gms.selector import select

    wl, problem = _problem(shape, seed, scale)
    target = detect()
    store = checked(TuningCache(cache))
    has_scale = wl.scale is not None
    f = features(plan(problem), k, m, torch.float32, has_scale)
    coef = store.model(hardware_key(target), MODEL_NAME)
    points, configs = space_configs(f, target)
    predicted = model.predict(f, configs, target, coef)
    best: dict[str, int] = {}
    for i, p in enumerate(points):
        if p["strategy"] not in best or predicted[i] < predicted[best[p["strategy"]]]:
            best[p["strategy"]] = i
    key = signature(problem, k, m, torch.float32, has_scale)
    x, w, c = operands(key, problem, k, m, "float32", "cpu", has_scale)
    records = []
    for name, i in sorted(best.items(), key=lambda kv: predicted[kv[1]]):
        breakdown = model.estimate(f, configs[i], target, coef)
        measured = None
        if measure:
            measured = time_call(run_config(configs[i], key, problem, x, w, c), 5).median_s
        records.append(
            {
                "strategy": name,
                "predicted_s": float(predicted[i]),
                "measured_s": measured,
                "explain": breakdown.explain(),
                "terms_s": breakdown.contributions_s(),
                "config": _short(points[i]),
            }
        )
        if progress is not None:
            progress(len(records), len(best))
    choice = select(f, target, key=key, cache=store, coef=coef)
    return records, _why(records, choice.config.strategy.name, choice.source, f)


def _short(point: dict[str, Any]) -> str:
    """A point's knobs in a few characters: ``tile 64, blk/thr 4, pad, 2 thr, static``."""
    if "threads" in point:
        chunk = "dynamic" if point["chunk"] else "static"
        return (
            f"tile {point['tile_rows']}, blk/thr {point['blocks_per_thread']}, "
            f"{point['schedule']}, {point['threads']} thr, {chunk}"
        )
    return ", ".join(f"{k} {v}" for k, v in point.items() if k != "strategy")


def _why(records: list[dict[str, Any]], chosen: str, source: str, f: Any) -> str:
    """One paragraph: what was chosen and by what, and the terms that separate the top two."""
    first, second = records[0], records[1] if len(records) > 1 else None
    lines = [f"selected: {chosen} (by the {source})."]
    if second is not None:
        gap = {
            t: second["terms_s"].get(t, 0.0) - first["terms_s"].get(t, 0.0)
            for t in set(first["terms_s"]) | set(second["terms_s"])
        }
        top = sorted(gap.items(), key=lambda kv: -abs(kv[1]))[:2]
        parts = ", ".join(f"{t} {1e3 * v:+.3f} ms" for t, v in top)
        lines.append(
            f"model: {first['strategy']} beats {second['strategy']} by "
            f"{1e3 * (second['predicted_s'] - first['predicted_s']):.3f} ms ({parts} for the "
            f"runner-up); GEMM rows: pairwise {f.pairs}, transform-first {f.transform_rows}, "
            f"aggregate-first {f.aggregate_rows}."
        )
    measured = [r for r in records if r["measured_s"] is not None]
    if measured:
        fastest = min(measured, key=lambda r: r["measured_s"])
        lines.append(
            f"measured: {fastest['strategy']} is fastest ({1e3 * fastest['measured_s']:.3f} ms)."
        )
    return " ".join(lines)
