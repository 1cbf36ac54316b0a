"""The mapper over COMET's space against the tilings of the shared COMET runs.

For every shape of the shared GEMM-Softmax runs (``../shared/oracles/comet``, edge and cloud),
``fusekit.accel.comet.space`` searches every tiling COMET's generator allows under the shipped
constraints (read off the arch): a lower bound (the ops' ideal compute cycles, cached per
compute tile) orders them, the tree model scores them exactly in that order, and the search
stops at the first bound above the best cycles found. The script reports the best tiling
against the best shared one (the shared runs are 6 to 8 tilings that COMET's sampler drew per
shape, some rejected) and against the median of a seeded sample of 6 accepted tilings (what
COMET's shuffle-and-sample generator would have run), and three rates, each on one core:

- ``compiled_per_s_per_core``: the compiled twin of the tree model
  (:mod:`fusekit.accel.tree_model.compiled`: fit check, cycles, energy, bit-identical; checked
  here on every tiling of the sample) on a seeded sample of ``--rate-sample`` tilings, scored
  in one batch after a warm-up (its numba compile is not counted; ``compiled_build_s`` is the
  template's one-time flatten and check); ``compiled_speedup`` over the reference;
- ``exact_per_s_per_core``: the reference tree model on the same tilings;
- ``walk_per_s_per_core``: the same tilings with every leaf iteration walked (``fold=False``,
  the reference); ``fold_speedup`` is the ratio;
- ``bounds_per_s_per_core``: the lower bound over every tiling;
- ``tilings_per_s_per_core``: tilings of the space over the pruned search's CPU time (the
  search scores by the compiled twin, ``compiled=True``).

``exhaustive_s_est`` is the tiling count over the compiled rate: what scoring all of them would
take on one core. Shapes run in ``--workers`` processes, one shape per process.

Run: ``.venv/bin/python benchmarks/comet_space.py [--workers 2]`` ->
``benchmarks/results/comet_space.json``.
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing
import random
import time
from pathlib import Path
from typing import Any

from fusekit.accel.comet.space import Space, arch_constraints, label
from fusekit.accel.compat import Compat
from fusekit.report.records import Plot, Summary, run_metadata, write_results

ORACLE = Path(__file__).resolve().parents[1] / ".." / "shared" / "oracles" / "comet"

#: What ``fusekit report build`` shows of the results file.
TITLE = (
    "The mapper over COMET's tiling space (lower-bound pruning) against the tilings of the "
    "shared COMET runs, and its scoring rates on one core."
)
PLOTS = (
    Plot(title="Best tiling found: speedup over the shared runs' best and over a sample's median",
         x="M,N,K", y=["speedup_vs_best_shared", "speedup_vs_sample_median"], log_y=True,
         ref=1.0, label="speedup (cycles)"),
    Plot(title="Scoring rates per core", x="M,N,K",
         y=["compiled_per_s_per_core", "exact_per_s_per_core", "tilings_per_s_per_core",
            "bounds_per_s_per_core"],
         log_y=True, label="tilings per second per core"),
)  # fmt: skip
TABLES = (
    Summary(title="Pruned search per shape", rows=["arch", "M,N,K"],
            values=["tilings", "scored", "pruned", "best_cycles", "best_shared_cycles",
                    "speedup_vs_best_shared", "speedup_vs_sample_median",
                    "compiled_per_s_per_core", "exact_per_s_per_core", "wall_s",
                    "speedup_vs_exhaustive"]),
)  # fmt: skip


def run_shape(template: str, arch: str, dims: dict[str, int], shared: list[int],
              rate_sample: int) -> dict[str, Any]:  # fmt: skip
    """Rates and the pruned search's result for one shape, in this process (one core)."""
    space = Space(template)
    tilings = space.tilings(dims, arch_constraints(space.arch))
    picks = random.Random(1).sample(tilings, min(rate_sample, len(tilings)))
    # the template compiles from a tiling that passes the fit check: a rejected first pick
    # would leave the compile (and numba's cache load) to the timed call
    proto = next((t for t in picks + tilings if space.fits(t, dims, Compat())), picks[0])
    warm = Space(template)  # numba's compile (or its cache load) happens here, not counted
    warm.score_many([proto], dims, Compat())
    t0 = time.process_time()
    space.score_many([proto], dims, Compat())  # the template's one-time flatten and check
    build_s = time.process_time() - t0
    t0 = time.process_time()
    fast = space.score_many(picks, dims, Compat())
    compiled_rate = len(picks) / (time.process_time() - t0)
    space = Space(template)
    t0 = time.process_time()
    ref = [space.score(t, dims, Compat()) for t in picks]
    exact_rate = len(picks) / (time.process_time() - t0)
    if fast != ref:
        raise AssertionError(f"{template}: the compiled twin differs from the reference")
    space = Space(template)  # the reference walk of every leaf iteration, same tilings
    t0 = time.process_time()
    for t in picks:
        space.score(t, dims, Compat(), fold=False)
    walk_rate = len(picks) / (time.process_time() - t0)
    space = Space(template)  # a cold bound cache
    t0 = time.process_time()
    for t in tilings:
        space.lower_bound(t, dims)
    bound_rate = len(tilings) / (time.process_time() - t0)
    space = Space(template)
    t0, c0 = time.perf_counter(), time.process_time()
    res = space.search(dims, compiled=True)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    best = res.best
    m, n, k = dims["M"], dims["N"], dims["K"]
    return {
        "arch": arch, "M,N,K": f"{m},{n},{k}", "tilings": res.tilings,
        "scored": len(res.scored), "pruned": res.pruned, "rejected_of_scored": res.rejected,
        "best_tiling": label(best.tiling), "best_cycles": best.total_cycles,
        "best_energy_pj": best.total_energy_pj,
        "best_lower_bound": space.lower_bound(best.tiling, dims),
        "best_shared_cycles": min(shared) if shared else None,
        "speedup_vs_best_shared": min(shared) / best.total_cycles if shared else None,  # type: ignore[operator]
        "sample_median_cycles": res.sample_median_cycles,
        "speedup_vs_sample_median": res.sample_median_cycles / best.total_cycles,  # type: ignore[operator]
        "wall_s": wall, "cpu_s": cpu,
        "tilings_per_s_per_core": res.tilings / cpu,
        "compiled_per_s_per_core": compiled_rate, "compiled_build_s": build_s,
        "compiled_speedup": compiled_rate / exact_rate,
        "exact_per_s_per_core": exact_rate, "rate_sample": len(picks),
        "walk_per_s_per_core": walk_rate, "fold_speedup": exact_rate / walk_rate,
        "bounds_per_s_per_core": bound_rate,
        "exhaustive_s_est": res.tilings / compiled_rate,
        "speedup_vs_exhaustive": res.tilings / compiled_rate / cpu,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--oracle", type=Path, default=ORACLE)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rate-sample", type=int, default=400)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/comet_space.json"))
    args = parser.parse_args()
    with open(args.oracle / "summary.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["case"].startswith("im_")
                and (args.oracle / "cases" / r["case"]).is_dir()]  # fmt: skip
    shapes = sorted({(r["arch"], int(r["M"]), int(r["N"]), int(r["K"])) for r in rows})
    jobs = []
    for arch, m, n, k in shapes:
        same = [r for r in rows if (r["arch"], int(r["M"]), int(r["N"]), int(r["K"])) ==
                (arch, m, n, k)]  # fmt: skip
        template = str(args.oracle / "cases" / same[0]["case"])
        shared = [int(r["total_cycles"]) for r in same if r["status"] == "ok"]
        jobs.append((template, arch, {"M": m, "N": n, "K": k}, shared, args.rate_sample))
    with multiprocessing.Pool(args.workers) as pool:
        records = pool.starmap(run_shape, jobs, chunksize=1)
    for rec in records:
        print(rec, flush=True)
    path = write_results(
        args.out,
        benchmark="comet_space",
        title=TITLE,
        meta=run_metadata(),
        settings={"oracle": str(args.oracle), "workers": args.workers},
        plots=PLOTS,
        tables=TABLES,
        records=records,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
