"""Roofline figures of this machine, and how far ATen's gather/scatter falls below them.

Measures, in one process and side by side:

* ``fusekit.hw.detect()`` (fresh): streaming copy bandwidth and fp32 GEMM FLOP/s;
* plain torch ops a user would time: ``copy_``, ``torch.mm`` at several sizes;
* ``index_select`` (gather rows) and ``index_add_`` (scatter-add rows) on random indices, the
  memory-bound steps that gms fuses — their bytes/s as a fraction of the streaming bandwidth.

Run: ``.venv/bin/python benchmarks/hw_roofline.py`` → ``benchmarks/results/hw_roofline.json``.
Every column is defined in ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from fusekit.hw import detect
from fusekit.report.records import Plot, Summary, run_metadata, write_results

#: What ``fusekit report build`` shows of the results file.
TITLE = (
    "This machine's roofline: a fresh hw.detect(), streaming copy_ and torch.mm against it, and "
    "how far ATen's index_select and index_add_ fall below the streaming bound."
)
TIMED = {"study": ["stream", "gemm", "gather", "scatter"]}
PLOTS = (
    Plot(title="Fraction of the detected bound (bandwidth, or fp32 peak for mm)", x="size",
         y="fraction_of_bound", hue="op", where=TIMED, ref=1.0),
)  # fmt: skip
TABLES = (
    Summary(title="Rates and fraction of the bound", rows=["study", "op", "size"],
            values=["median_s", "bytes_per_s", "flops_per_s", "fraction_of_bound"]),
)  # fmt: skip


def time_s(repeats: int, fn: Callable[..., object], *args: object) -> tuple[float, float, float]:
    """(median, q10, q90) of ``repeats`` timed calls of ``fn(*args)`` after one warm-up call."""
    fn(*args)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        samples.append(time.perf_counter() - start)
    q = statistics.quantiles(samples, n=10) if len(samples) >= 2 else samples * 9
    return statistics.median(samples), q[0], q[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "hw_roofline.json"
    )
    args = parser.parse_args()

    target = detect(refresh=True)
    bw, peak = target.mem_bw_bytes_per_s, target.peak("fp32")
    records = [
        {"study": "detect", "op": "detect.copy", "size": "256 MiB", "bytes_per_s": bw},
        {"study": "detect", "op": "detect.gemm", "size": "auto", "flops_per_s": peak},
    ]

    for mib in (64, 256):
        src = torch.ones(mib * 2**20 // 4)
        dst = torch.empty_like(src)
        median, q10, q90 = time_s(args.repeats, dst.copy_, src)
        nbytes = 2 * src.numel() * 4
        records.append(
            {
                "study": "stream",
                "op": "copy_",
                "size": f"{mib} MiB",
                "median_s": median,
                "q10_s": q10,
                "q90_s": q90,
                "bytes_per_s": nbytes / median,
                "fraction_of_bound": nbytes / median / bw,
            }
        )

    for n in (256, 512, 1024, 2048):
        a, b = torch.randn(n, n), torch.randn(n, n)
        median, q10, q90 = time_s(args.repeats, torch.mm, a, b)
        records.append(
            {
                "study": "gemm",
                "op": "mm fp32",
                "size": f"{n}^3",
                "median_s": median,
                "q10_s": q10,
                "q90_s": q90,
                "flops_per_s": 2 * n**3 / median,
                "fraction_of_bound": 2 * n**3 / median / peak,
            }
        )

    generator = torch.Generator().manual_seed(0)
    for k in (16, 64, 256):
        n_rows, n_pairs = 100_000, 500_000
        x = torch.randn(n_rows, k)
        index = torch.randint(0, n_rows, (n_pairs,), generator=generator)
        rows = torch.randn(n_pairs, k)
        out = torch.zeros(n_rows, k)
        # bytes that must move: the gathered rows read + written, plus the index
        gather_bytes = 2 * n_pairs * k * 4 + n_pairs * 8
        median, q10, q90 = time_s(args.repeats, x.index_select, 0, index)
        records.append(
            {
                "study": "gather",
                "op": "index_select",
                "size": f"{n_pairs}x{k}",
                "median_s": median,
                "q10_s": q10,
                "q90_s": q90,
                "bytes_per_s": gather_bytes / median,
                "fraction_of_bound": gather_bytes / median / bw,
            }
        )
        # scatter-add: read each source row, read-modify-write a destination row, the index
        scatter_bytes = 3 * n_pairs * k * 4 + n_pairs * 8
        median, q10, q90 = time_s(args.repeats, out.index_add_, 0, index, rows)
        records.append(
            {
                "study": "scatter",
                "op": "index_add_",
                "size": f"{n_pairs}x{k}",
                "median_s": median,
                "q10_s": q10,
                "q90_s": q90,
                "bytes_per_s": scatter_bytes / median,
                "fraction_of_bound": scatter_bytes / median / bw,
            }
        )

    path = write_results(
        args.out,
        benchmark="hw_roofline",
        title=TITLE,
        meta=run_metadata(target.to_dict()),
        plots=PLOTS,
        tables=TABLES,
        records=records,
    )
    for r in records:
        frac = r.get("fraction_of_bound")
        rate = r.get("bytes_per_s") or r.get("flops_per_s")
        unit = "B/s" if "bytes_per_s" in r else "FLOP/s"
        tail = f"  {frac:6.1%} of bound" if frac is not None else ""
        print(f"{r['op']:>14} {r['size']:>12}  {rate:10.3e} {unit}{tail}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
