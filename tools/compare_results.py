"""Compare the speedups of two sets of benchmark results, record by record.

A benchmark run writes ratios measured side by side in one process (fusekit over a peer, over
ATen, over a floor); those ratios, not absolute times, are what a change must keep. Given the
results folders of runs before and after a change (each holding ``<name>.json`` files of the same
scripts), this prints, per file and ratio column, the after/before quotient of every record found
in both, and exits 1 when one falls below ``1 - tolerance``::

    python tools/compare_results.py --before before/ --after after/ [--tolerance 0.10] [--out F]

Several folders per side (``--before a b --after c d``) give medians per record: runs on a shared
machine are noisy, so repeating both sides in one sitting and comparing medians is the fair test.
``--times`` compares fusekit's own ``median_s`` instead (column ``speed``, before over after, so
larger is faster): the ratios' peer denominators move with the machine's noise, fusekit's own
time moves only with fusekit.
Records are matched by every field that is neither a measurement nor a ratio. ``--out`` writes
the rows as a results file (``fusekit report build`` renders it): one record per file, record
and ratio column, with the label of the record, ``before``, ``after`` and ``after_over_before``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fusekit.report.records import Plot, Summary, run_metadata, write_results

#: Ratio columns: the larger the better (fusekit's speed over a reference).
RATIOS = ("speedup", "speedup_over_pyg", "speedup_over_best_aten", "speedup_over_best_peer")
#: ``impl`` prefixes of the references a benchmark times beside fusekit: their ratios say nothing
#: about a change to fusekit (only about the machine's noise), so they are left out by default.
PEERS = ("aten", "floor", "pyg", "hf ", "spconv", "torch", "grouped_mm")
#: Columns that are measurements (they differ run to run), never part of a record's key.
MEASURED = frozenset(
    {
        "median_s", "q10_s", "q90_s", "flops_per_s", "bytes_per_s", "fraction_of_roofline",
        "over_floor", "plan_s", "ceiling_speedup", "gemm_flops_per_s", "fraction_of_peak",
        "spconv_wrong_rows", "choice", "selected", "bound", *RATIOS,
    }
)  # fmt: skip


def record_key(record: Mapping[str, Any]) -> str:
    """The identity of a record: its non-measured fields, in a canonical JSON string."""
    return json.dumps({k: v for k, v in record.items() if k not in MEASURED}, sort_keys=True)


#: The column ``--times`` reads: a duration, so after/before is inverted into a speed.
TIME = "median_s"


def ratios(
    folders: Iterable[Path],
    name: str,
    peers: tuple[str, ...] = PEERS,
    columns: tuple[str, ...] = RATIOS,
) -> dict[tuple[str, str], float]:
    """Median per (record key, column) of ``name`` over ``folders``, peers' rows left out."""
    seen: dict[tuple[str, str], list[float]] = {}
    for folder in folders:
        path = folder / name
        if not path.exists():
            continue
        for record in json.loads(path.read_text())["records"]:
            if str(record.get("impl", "")).startswith(peers):
                continue
            for column in columns:
                value = record.get(column)
                if isinstance(value, int | float) and value > 0:
                    seen.setdefault((record_key(record), column), []).append(float(value))
    return {key: statistics.median(values) for key, values in seen.items()}


def label(record: Mapping[str, Any]) -> str:
    """A record's identity in one line: its key fields' values, sizes left out."""
    return " ".join(str(v) for k, v in record.items() if k not in ("pairs", "segments"))


def compare(
    before: list[Path],
    after: list[Path],
    tolerance: float,
    peers: tuple[str, ...] = PEERS,
    times: bool = False,
) -> list[dict[str, Any]]:
    """One row per record and ratio present on both sides: before, after and their quotient.

    With ``times``, the column is fusekit's ``median_s`` and the quotient is
    ``before / after`` (a speed: above 1 is faster after the change).
    """
    names = sorted({p.name for folder in before for p in folder.glob("*.json")})
    columns = (TIME,) if times else RATIOS
    rows = []
    for name in names:
        old = ratios(before, name, peers, columns)
        new = ratios(after, name, peers, columns)
        for key in sorted(old.keys() & new.keys()):
            quotient = old[key] / new[key] if times else new[key] / old[key]
            rows.append(
                {
                    "file": name,
                    "record": label(json.loads(key[0])),
                    "ratio": "speed" if times else key[1],
                    "before": old[key],
                    "after": new[key],
                    "after_over_before": quotient,
                    "ok": quotient >= 1 - tolerance,
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Print the comparison; exit 1 if some ratio dropped by more than the tolerance."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", nargs="+", type=Path, required=True)
    parser.add_argument("--after", nargs="+", type=Path, required=True)
    parser.add_argument("--tolerance", type=float, default=0.10)
    parser.add_argument("--peers", action="store_true", help="keep the peers' rows too")
    parser.add_argument(
        "--times", action="store_true", help="compare fusekit's own median_s, not the ratios"
    )
    parser.add_argument("--out", type=Path, help="write the rows here as a results file")
    args = parser.parse_args(argv)
    rows = compare(args.before, args.after, args.tolerance, () if args.peers else PEERS, args.times)
    for row in rows:
        flag = "" if row["ok"] else "  <-- below tolerance"
        print(
            f"{row['file']:<22} {row['record'][:70]:<70} {row['ratio']:<24} "
            f"{row['before']:7.2f} -> {row['after']:7.2f}  x{row['after_over_before']:.2f}{flag}"
        )
    quotients = [row["after_over_before"] for row in rows]
    if quotients:
        print(
            f"{len(rows)} ratios; after/before median x{statistics.median(quotients):.3f}, "
            f"geometric mean x{statistics.geometric_mean(quotients):.3f}, "
            f"{sum(not row['ok'] for row in rows)} below {1 - args.tolerance:.2f}"
        )
    if args.out:
        write_results(
            args.out,
            benchmark="compare_results",
            title=(
                "Speed of fusekit after a change over before it (median_s before / after)"
                if args.times
                else "Speedups of benchmark runs after a change over the same runs before it"
            )
            + " (medians per record over the runs of each side).",
            meta=run_metadata(),
            settings={
                "before": [str(p) for p in args.before],
                "after": [str(p) for p in args.after],
                "tolerance": args.tolerance,
                "compared": TIME if args.times else "ratios",
            },
            plots=[
                Plot(title="After over before: median per results file", x="file",
                     y="after_over_before", ref=1.0)
            ],
            tables=[
                Summary(title="After over before per results file", rows=["file"],
                        values=["after_over_before", "ok"])
            ],
            records=rows,
        )  # fmt: skip
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
