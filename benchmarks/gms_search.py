"""Model-pruned tuning against exhaustive tuning of the gms configuration space, on the CPU.

For each of ``--problems`` varied problems (``fusekit.gms.workloads.varied``, seeds from 1000:
RGCN, conv and MoE shapes, reduces and widths) in one process:

1. **exhaustive**: every point of the CPU space measured (``tune(exhaustive=True)``), timed;
2. **model**: coefficients cross-fitted (two folds: a problem is ranked by coefficients fitted
   on the other fold's measurements only), Spearman rank correlation of predicted against
   measured times over the whole space;
3. **pruned**: ``tune(budget=...)`` for real (its own measurements, a fresh cache), timed;
4. **same-run check**: the pruned winner and the exhaustive winner re-timed side by side
   (alternating, ``--check-rounds`` rounds), so that the comparison is not the minimum of 540
   noisy samples against the minimum of 27: ``slowdown = pruned / exhaustive``.

Writes ``benchmarks/results/gms_search.json`` (one record per problem, columns defined in
``benchmarks/README.md``) and ``benchmarks/results/gms_search_measurements.json`` (every
exhaustive measurement with the problem's features: the training data of
``benchmarks/gms_select.py``).

Run: ``.venv/bin/python benchmarks/gms_search.py [--problems 36] [--budget 0.05]``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

from fusekit.gms import GMSProblem, model
from fusekit.gms import workloads as W
from fusekit.gms.candidates import config_of
from fusekit.gms.search import DEFAULT_BUDGET, operands, run_config, tune
from fusekit.hw import CPUTarget, detect
from fusekit.report.records import Plot, Summary, run_metadata, write_results
from fusekit.search import TuningCache, time_call

RESULTS = Path(__file__).parent / "results"
SEED = 1000

#: What ``fusekit report build`` shows of the two results files.
TITLE = (
    "Model-pruned tuning against exhaustive tuning of the CPU configuration space on varied "
    "problems: the pruned winner's slowdown (1 = as fast as the exhaustive winner), the "
    "model's rank correlation and the search-time ratio."
)
PLOTS = (
    Plot(title="Slowdown of the pruned winner over the exhaustive winner, per problem",
         x="problem", y="slowdown", hue="family", ref=1.0),
)  # fmt: skip
TABLES = (
    Summary(title="Per family", rows=["family"],
            values=["slowdown", "within_5pct", "spearman", "measured_share",
                    "search_time_ratio"], stats=["median", "max"]),
    Summary(title="Winning strategies (exhaustive, pruned)",
            rows=["exhaustive_best", "pruned_best"], values=["slowdown"]),
)  # fmt: skip
MEASUREMENTS_TITLE = (
    "Every point of the CPU configuration space measured on the problems of gms_search.py: the "
    "training data of gms_select.py (under 'data'); one record per problem summarises its "
    "points."
)
MEASUREMENTS_PLOTS = (
    Plot(title="Spread of the space: median point time over the best point, per problem",
         x="problem", y="median_over_best", hue="family", ref=1.0),
)  # fmt: skip
MEASUREMENTS_TABLES = (
    Summary(title="Per family", rows=["family"],
            values=["points", "median_over_best", "best_strategy"], stats=["median", "max"]),
)  # fmt: skip


def measurement_records(problems: list[dict]) -> list[dict]:
    """One record per exhaustively measured problem: its size, best and median point."""
    records = []
    for p in problems:
        f, measured = p["features"], p["measured"]
        best_point = min(measured, key=measured.get)
        best_s, median_s = measured[best_point], statistics.median(measured.values())
        records.append(
            {
                "problem": p["label"],
                "family": p["label"].split("-", 1)[0],
                "pairs": f["pairs"],
                "segments": f["segments"],
                "K": f["k"],
                "M": f["m"],
                "reduce": f["reduce"],
                "points": len(measured),
                "best_s": best_s,
                "median_s": median_s,
                "median_over_best": median_s / best_s,
                "best_strategy": json.loads(best_point)["strategy"],
            }
        )
    return records


def recheck(s: W.Sized, problem: GMSProblem, points: list[dict], rounds: int) -> list[float]:
    """Median seconds of each point, timed alternately for ``rounds`` rounds (same run)."""
    key = f"recheck-{s.label}"
    x, w, c = operands(key, problem, s.k, s.m, "float32", "cpu", s.workload.scale is not None)
    calls = [run_config(config_of(p), key, problem, x, w, c) for p in points]
    samples: list[list[float]] = [[] for _ in points]
    for r in range(rounds):
        for i in range(len(points)) if r % 2 == 0 else reversed(range(len(points))):
            samples[i].append(time_call(calls[i], repeats=5).median_s)
    return [statistics.median(v) for v in samples]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=36)
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET, help="share measured")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per point")
    parser.add_argument("--check-rounds", type=int, default=6)
    parser.add_argument("--out", type=Path, default=RESULTS / "gms_search.json")
    args = parser.parse_args()
    target = detect(refresh=True)
    if not isinstance(target, CPUTarget):
        raise SystemExit("gms_search.py tunes on the CPU")

    sized = W.varied(SEED, args.problems)
    problems = [s.workload.problem() for s in sized]
    # ---- 1. exhaustive ----
    exhaustive = []
    for i, (s, p) in enumerate(zip(sized, problems, strict=True)):
        has_scale = s.workload.scale is not None
        start = time.perf_counter()
        r = tune(
            p, s.k, s.m, has_scale=has_scale, target=target, exhaustive=True, repeats=args.repeats
        )
        exhaustive.append((r, time.perf_counter() - start))
        print(
            f"[{i + 1}/{len(sized)}] {s.label}: {r.space_size} points in "
            f"{exhaustive[-1][1]:.1f} s, best {r.best.strategy} {1e3 * r.best_s:.3f} ms",
            flush=True,
        )

    # ---- 2. cross-fitted model, rank correlation ----
    terms = [
        model.term_matrix(r.features, [config_of(json.loads(k)) for k in r.measured], target)
        for r, _ in exhaustive
    ]
    times = [np.array(list(r.measured.values())) for r, _ in exhaustive]
    folds = [i % 2 for i in range(len(sized))]
    coefs = []
    for fold in (0, 1):
        train = [i for i in range(len(sized)) if folds[i] != fold]
        coefs.append(
            model.fit(
                np.vstack([terms[i] for i in train]), np.concatenate([times[i] for i in train])
            )
        )

    records = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = TuningCache(Path(tmp) / "tuning.json")
        for i, (s, p) in enumerate(zip(sized, problems, strict=True)):
            r, exhaustive_s = exhaustive[i]
            coef = coefs[folds[i]]
            predicted = terms[i] @ np.array([coef[t] for t in model.TERMS])
            rho = float(spearmanr(predicted, times[i]).statistic)
            # ---- 3. pruned, for real ----
            start = time.perf_counter()
            pr = tune(
                p,
                s.k,
                s.m,
                has_scale=s.workload.scale is not None,
                target=target,
                budget=args.budget,
                cache=cache,
                coef=coef,
                repeats=args.repeats,
            )
            pruned_s = time.perf_counter() - start
            # ---- 4. same-run check of the two winners ----
            if pr.best_point == r.best_point:
                slowdown = 1.0
            else:
                t_pruned, t_exh = recheck(s, p, [pr.best_point, r.best_point], args.check_rounds)
                slowdown = t_pruned / t_exh
            in_table = r.measured[json.dumps(pr.best_point, sort_keys=True, separators=(",", ":"))]
            records.append(
                {
                    "study": "search",
                    "problem": s.label,
                    "family": s.workload.name.split("-")[0],
                    "pairs": s.workload.num_pairs,
                    "segments": s.workload.num_segments,
                    "K": s.k,
                    "M": s.m,
                    "reduce": s.workload.reduce,
                    "space": r.space_size,
                    "measured": pr.newly_measured,
                    "measured_share": pr.newly_measured / r.space_size,
                    "exhaustive_best": r.best.strategy.name,
                    "exhaustive_best_s": r.best_s,
                    "pruned_best": pr.best.strategy.name,
                    "pruned_best_s": pr.best_s,
                    "table_slowdown": in_table / r.best_s,
                    "slowdown": slowdown,
                    "within_5pct": slowdown <= 1.05,
                    "spearman": rho,
                    "exhaustive_search_s": exhaustive_s,
                    "pruned_search_s": pruned_s,
                    "search_time_ratio": exhaustive_s / pruned_s,
                }
            )
            print(
                f"{s.label:45s} measured {pr.newly_measured:3d}/{r.space_size} "
                f"slowdown {slowdown:.3f} spearman {rho:.2f} "
                f"search {exhaustive_s:.1f}s -> {pruned_s:.1f}s",
                flush=True,
            )

    n = len(records)
    within = sum(r["within_5pct"] for r in records)
    summary = {
        "problems": n,
        "within_5pct": within,
        "within_5pct_share": within / n,
        "max_measured_share": max(r["measured_share"] for r in records),
        "mean_spearman": statistics.mean(r["spearman"] for r in records),
        "geomean_search_time_ratio": math.exp(
            statistics.mean(math.log(r["search_time_ratio"]) for r in records)
        ),
        "coef_fold0": coefs[0],
        "coef_fold1": coefs[1],
        "coef_all": model.fit(np.vstack(terms), np.concatenate(times)),
    }
    print(json.dumps({k: v for k, v in summary.items() if not k.startswith("coef")}, indent=1))
    meta = run_metadata(target.to_dict())
    path = write_results(
        args.out,
        benchmark="gms_search",
        title=TITLE,
        meta=meta,
        settings={"summary": summary, "budget": args.budget},
        plots=PLOTS,
        tables=TABLES,
        records=records,
    )
    print(f"wrote {path}")
    data = [
        {"label": s.label, "features": asdict(r.features), "measured": r.measured}
        for s, (r, _) in zip(sized, exhaustive, strict=True)
    ]
    path = write_results(
        args.out.with_name(args.out.stem + "_measurements.json"),
        benchmark="gms_search",
        title=MEASUREMENTS_TITLE,
        meta=meta,
        plots=MEASUREMENTS_PLOTS,
        tables=MEASUREMENTS_TABLES,
        records=measurement_records(data),
        data={"problems": data},
        indent=None,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
