"""The mapper over COMET's space against the tilings of the shared COMET runs.

For every shape of the shared GEMM-Softmax runs (``../shared/oracles/comet``, edge and cloud),
``fusekit.accel.comet.space`` scores every tiling COMET's generator allows under the shipped
constraints (read off the arch) with the tree model, exactly as COMET evaluates it. The script
reports the best tiling against the best shared one (the shared runs are 6 to 8 tilings that
COMET's sampler drew per shape, some rejected) and against the median of a seeded sample of 6
accepted tilings (what COMET's shuffle-and-sample generator would have run), and the scoring rate.

Run: ``.venv/bin/python benchmarks/comet_space.py [--workers 2]`` ->
``benchmarks/results/comet_space.json``.
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing
import time
from pathlib import Path

from fusekit.accel.comet.space import Scored, Space, arch_constraints, label
from fusekit.accel.compat import Compat
from fusekit.report.records import run_metadata, write_results

ORACLE = Path(__file__).resolve().parents[1] / ".." / "shared" / "oracles" / "comet"
_SPACE: Space | None = None
_DIMS: dict[str, int] = {}


def _init(template: str, dims: dict[str, int]) -> None:
    global _SPACE, _DIMS
    _SPACE, _DIMS = Space(template), dims


def _score(tiling: dict[str, tuple[int, ...]]) -> Scored:
    assert _SPACE is not None
    return _SPACE.score(tiling, _DIMS, Compat())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--oracle", type=Path, default=ORACLE)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/comet_space.json"))
    args = parser.parse_args()
    with open(args.oracle / "summary.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["case"].startswith("im_")
                and (args.oracle / "cases" / r["case"]).is_dir()]  # fmt: skip
    shapes = sorted({(r["arch"], int(r["M"]), int(r["N"]), int(r["K"])) for r in rows})
    records = []
    for arch, m, n, k in shapes:
        same = [r for r in rows if (r["arch"], int(r["M"]), int(r["N"]), int(r["K"])) ==
                (arch, m, n, k)]  # fmt: skip
        template = str(args.oracle / "cases" / same[0]["case"])
        dims = {"M": m, "N": n, "K": k}
        space = Space(template)
        tilings = space.tilings(dims, arch_constraints(space.arch))
        t0 = time.perf_counter()
        with multiprocessing.Pool(args.workers, _init, (template, dims)) as pool:
            scored = pool.map(_score, tilings, chunksize=16)
        wall = time.perf_counter() - t0
        ok = [s for s in scored if s.total_cycles is not None]
        best = min(ok, key=lambda s: (s.total_cycles, s.total_energy_pj))
        import random
        import statistics

        picks = random.Random(0).sample(ok, min(6, len(ok)))
        median = statistics.median(s.total_cycles for s in picks)  # type: ignore[type-var]
        shared = [int(r["total_cycles"]) for r in same if r["status"] == "ok"]
        rec = {
            "arch": arch, "M,N,K": f"{m},{n},{k}", "tilings": len(tilings),
            "rejected": len(tilings) - len(ok), "best_tiling": label(best.tiling),
            "best_cycles": best.total_cycles, "best_energy_pj": best.total_energy_pj,
            "best_shared_cycles": min(shared) if shared else None,
            "speedup_vs_best_shared": min(shared) / best.total_cycles if shared else None,  # type: ignore[operator]
            "sample_median_cycles": median,
            "speedup_vs_sample_median": median / best.total_cycles,  # type: ignore[operator]
            "wall_s": wall, "workers": args.workers,
            "tilings_per_s_per_core": len(tilings) / wall / args.workers,
        }  # fmt: skip
        records.append(rec)
        print(rec, flush=True)
    path = write_results(args.out, records, {**run_metadata(), "oracle": str(args.oracle)})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
