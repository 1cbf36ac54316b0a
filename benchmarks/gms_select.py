"""The adaptive selector on held-out problems: its choice against the per-problem best, on the CPU.

Training data: ``benchmarks/results/gms_search_measurements.json`` (every point of the CPU space
measured on the problems of ``gms_search.py``, seeds from 1000). ``--train`` fits the selector
tree (``fusekit.gms.selector.train_tree``) on it and writes the shipped
``src/fusekit/gms/selector_tree.json``; the model's coefficients are fitted on the same data.

Evaluation: ``--problems`` held-out problems (``workloads.varied``, seeds from 5000: none used for
fitting). For each, in one process, the same way (one warm-up, ``--repeats`` timed calls, median):

* a reference grid: every strategy x ``tile_rows`` {16, 64, 256} x blocks per thread {1, 4} at
  all cores, static ``prange``, pad schedule (on the 36 exhaustively tuned problems of
  ``gms_search.py``, dynamic chunking or one thread beat this subspace by 8% at most, on 4
  problems: the grid leaves them out to halve the time; the selectors may still choose them);
* each fixed strategy at the default configuration (``tile_rows`` 64, 4 blocks per thread, pad,
  all cores, static), where aggregate-first falls back to pairwise for max (as a user would);
* the tree's choice and the model's choice.

The grid's fastest point, the fixed strategies and both choices are then re-timed side by side
(``--check-rounds`` alternating rounds, median of the round medians); the per-problem best is the
fastest of those, so that it is not the luckiest of ~80 single samples. Reported: each selector's
geometric-mean ratio to the best, the best single fixed strategy (best geometric mean) and its
worst problem, where the selector's speedup over it is the acceptance figure; the selection latency.

Run: ``.venv/bin/python benchmarks/gms_select.py [--train] [--problems 50]``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch

from fusekit.gms import model, plan
from fusekit.gms import workloads as W
from fusekit.gms.candidates import config_of, enumerate_candidates
from fusekit.gms.features import features
from fusekit.gms.search import features_from_meta, operands, run_config
from fusekit.gms.selector import TreeSelector, select, train_tree
from fusekit.hw import CPUTarget, detect
from fusekit.report.records import Plot, Summary, load_results, run_metadata, write_results
from fusekit.search import point_key, time_call

RESULTS = Path(__file__).parent / "results"
TREE = Path(__file__).parents[1] / "src" / "fusekit" / "gms" / "selector_tree.json"
SEED = 5000

#: What ``fusekit report build`` shows of the results file.
TITLE = (
    "The adaptive selector on held-out problems: the time of its choice (tree and model) and "
    "of each fixed strategy over the per-problem best (1 = the best)."
)
PLOTS = (
    Plot(title="Ratio to the per-problem best: the selector against the best fixed strategies",
         x="family", y=["tree_ratio", "model_ratio", "fixed (GMS)seg",
                        "fixed aggregate-first/(GMS)seg"], log_y=True, ref=1.0,
         label="time / best time, median over the problems"),
    Plot(title="Ratio of the tree's choice to the per-problem best, per problem", x="problem",
         y="tree_ratio", hue="family", ref=1.0),
)  # fmt: skip
TABLES = (
    Summary(title="Ratio to the per-problem best, per family", rows=["family"],
            values=["tree_ratio", "model_ratio", "fixed (GMS)seg", "fixed G-Mseg-S",
                    "fixed aggregate-first/(GMS)seg", "fixed transform-first/(GMS)seg"],
            stats=["median", "max"]),
    Summary(title="Choices: the best, the tree's and the model's", rows=["best", "tree"],
            values=["tree_ratio", "model_ratio"]),
)  # fmt: skip


def training_data(path: Path) -> tuple[list, int]:
    results = load_results(path)
    if results.data is None or results.meta.hardware is None:
        raise SystemExit(f"{path}: expected gms_search.py's measurements (data and hardware)")
    problems = []
    for p in results.data["problems"]:
        f = features_from_meta({"features": p["features"]})
        if f is not None:
            problems.append((f, p["measured"]))
    return problems, int(results.meta.hardware["cores"])


def fit_coef(problems: list, target: CPUTarget) -> dict[str, float]:
    import numpy as np

    terms, times = [], []
    for f, measured in problems:
        terms.append(model.term_matrix(f, [config_of(json.loads(k)) for k in measured], target))
        times.extend(measured.values())
    return model.fit(np.vstack(terms), np.array(times))


def default_point(strategy: str, cores: int) -> dict:
    return {
        "strategy": strategy,
        "tile_rows": 64,
        "blocks_per_thread": 4,
        "schedule": "pad",
        "threads": cores,
        "chunk": 0,
    }


def grid(reduce: str, cores: int) -> list[dict]:
    return [
        {
            "strategy": s.name,
            "tile_rows": t,
            "blocks_per_thread": b,
            "schedule": "pad",
            "threads": cores,
            "chunk": 0,
        }
        for s in enumerate_candidates(reduce)
        for t in (16, 64, 256)
        for b in (1, 4)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", action="store_true", help="refit and write the shipped tree")
    parser.add_argument("--problems", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--check-rounds", type=int, default=4)
    parser.add_argument("--data", type=Path, default=RESULTS / "gms_search_measurements.json")
    parser.add_argument("--out", type=Path, default=RESULTS / "gms_select.json")
    args = parser.parse_args()
    target = detect(refresh=True)
    if not isinstance(target, CPUTarget):
        raise SystemExit("gms_select.py selects for the CPU")
    problems, cores = training_data(args.data)
    coef = fit_coef(problems, target)
    if args.train:
        tree = train_tree(problems, cores)
        TREE.write_text(json.dumps(tree.to_json(), indent=1) + "\n")
        print(f"trained on {len(problems)} problems; wrote {TREE}")
    tree = TreeSelector.from_json(json.loads(TREE.read_text()))
    strategies = [s.name for s in enumerate_candidates("sum")]

    records = []
    latency = {"tree": [], "model": []}
    for i, s in enumerate(W.varied(SEED, args.problems)):
        wl = s.workload
        problem = wl.problem()
        has_scale = wl.scale is not None
        f = features(plan(problem), s.k, s.m, torch.float32, has_scale)
        chosen = {}
        for method in ("tree", "model"):
            start = time.perf_counter()
            choice = select(f, target, tree=tree, coef=coef, method=method)
            latency[method].append(time.perf_counter() - start)
            chosen[method] = choice.point
        fixed = {}
        for name in strategies:
            point = default_point(name, target.cores)
            if not config_of(point).strategy.order.allows(wl.reduce):
                point["strategy"] = config_of(point).strategy.dataflow.value
            fixed[name] = point
        pool = {
            point_key(p): p
            for p in [*grid(wl.reduce, target.cores), *fixed.values(), *chosen.values()]
        }
        key = f"select-{s.label}"
        x, w, c = operands(key, problem, s.k, s.m, "float32", "cpu", has_scale)
        calls = {k: run_config(config_of(p), key, problem, x, w, c) for k, p in pool.items()}
        times = {k: time_call(call, args.repeats).median_s for k, call in calls.items()}
        # the points compared are re-timed side by side, so that the per-problem best is not the
        # luckiest of ~150 single samples: alternating rounds, median of the round medians
        final = {min(times, key=lambda k: times[k])}
        final |= {point_key(p) for p in [*fixed.values(), *chosen.values()]}
        rounds: dict[str, list[float]] = {k: [] for k in final}
        for r in range(args.check_rounds):
            for k in sorted(final) if r % 2 == 0 else sorted(final, reverse=True):
                rounds[k].append(time_call(calls[k], args.repeats).median_s)
        times.update({k: statistics.median(v) for k, v in rounds.items()})
        best = min(times[k] for k in final)
        record = {
            "study": "select",
            "problem": s.label,
            "family": wl.name.split("-")[0],
            "pairs": wl.num_pairs,
            "K": s.k,
            "M": s.m,
            "reduce": wl.reduce,
            "best_s": best,
            "best": json.loads(min(final, key=lambda k: times[k]))["strategy"],
            "tree": chosen["tree"]["strategy"],
            "tree_ratio": times[point_key(chosen["tree"])] / best,
            "model": chosen["model"]["strategy"],
            "model_ratio": times[point_key(chosen["model"])] / best,
            **{f"fixed {n}": times[point_key(p)] / best for n, p in fixed.items()},
        }
        records.append(record)
        print(
            f"[{i + 1}/{args.problems}] {s.label:45s} best {record['best']:26s} "
            f"tree x{record['tree_ratio']:.2f} model x{record['model_ratio']:.2f}",
            flush=True,
        )

    def gmean(values: list[float]) -> float:
        return math.exp(statistics.mean(math.log(v) for v in values))

    fixed_gmean = {n: gmean([r[f"fixed {n}"] for r in records]) for n in strategies}
    best_fixed = min(fixed_gmean, key=lambda n: fixed_gmean[n])
    worst = max(records, key=lambda r: r[f"fixed {best_fixed}"])
    summary = {
        "held_out_problems": len(records),
        "training_problems": len(problems),
        "tree_gmean_ratio_to_best": gmean([r["tree_ratio"] for r in records]),
        "model_gmean_ratio_to_best": gmean([r["model_ratio"] for r in records]),
        "fixed_gmean_ratio_to_best": fixed_gmean,
        "best_fixed": best_fixed,
        "worst_problem_for_best_fixed": worst["problem"],
        "tree_speedup_over_best_fixed_there": worst[f"fixed {best_fixed}"] / worst["tree_ratio"],
        "model_speedup_over_best_fixed_there": worst[f"fixed {best_fixed}"] / worst["model_ratio"],
        "tree_select_us_median": 1e6 * statistics.median(latency["tree"]),
        "model_select_us_median": 1e6 * statistics.median(latency["model"]),
        "coef": coef,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "coef"}, indent=1))
    path = write_results(
        args.out,
        benchmark="gms_select",
        title=TITLE,
        meta=run_metadata(target.to_dict()),
        settings={"summary": summary},
        plots=PLOTS,
        tables=TABLES,
        records=records,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
