"""COMET's named defects: the effect of switching each one off on the shared COMET runs.

For every completed run in ``../shared/oracles/comet`` (COMET's own inputs), the front end
evaluates the run as the COMET binary does (``Compat()``, checked equal to its outputs by
tests/accel/test_comet.py), then with one deviation of :data:`fusekit.accel.comet.DEVIATIONS`
switched off at a time, then with all of them off (the native model), and records the change of
total cycles and energy and of the largest per-unit cycle entry. Rejected runs are evaluated
for the fit check only (the ``full_double_buffer`` deviation changes what is rejected).

Run: ``.venv/bin/python benchmarks/comet_compat.py`` -> ``benchmarks/results/comet_compat.json``
and the table printed (the one in ``benchmarks/README.md``).
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path
from typing import Any

from fusekit.accel.comet.run import DEVIATIONS, CometFitError, Compat, MeshShapeError, evaluate
from fusekit.accel.tree_model.report import Report
from fusekit.report.records import Plot, Summary, run_metadata, write_results

ORACLE = Path(__file__).resolve().parents[1] / ".." / "shared" / "oracles" / "comet"

#: What ``fusekit report build`` shows of the results file.
TITLE = (
    "COMET's named defects: the change of total cycles and energy on the shared COMET runs "
    "when each deviation is switched off (ratio to COMET's result; 1 = unchanged)."
)
PLOTS = (
    Plot(title="Largest ratio to COMET's result per deviation switched off", x="deviation_off",
         y=["cycles_ratio", "energy_ratio"], stat="max", log_y=True, ref=1.0,
         label="ratio to COMET's result, max over the runs"),
)  # fmt: skip
TABLES = (
    Summary(title="Ratio to COMET's result per deviation switched off, over the shared runs",
            rows=["deviation_off"], values=["cycles_ratio", "energy_ratio"],
            stats=["min", "median", "max"]),
    Summary(title="Run status: COMET's against the deviation switched off",
            rows=["comet_status", "status"], values=["deviation_off", "case"]),
)  # fmt: skip


def _evaluate(case: Path, compat: Compat) -> Report | str:
    try:
        return evaluate(case, compat=compat)
    except CometFitError:
        return "rejected"
    except MeshShapeError:
        return "mesh error"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--oracle", type=Path, default=ORACLE)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/comet_compat.json"))
    args = parser.parse_args()
    with open(args.oracle / "summary.csv") as f:
        cases = [
            r["case"] for r in csv.DictReader(f) if (args.oracle / "cases" / r["case"]).is_dir()
        ]
    variants = {"comet": Compat(), **{n: Compat().without(n) for n in DEVIATIONS},
                "native": Compat.native()}  # fmt: skip
    records: list[dict[str, Any]] = []
    for case in cases:
        path = args.oracle / "cases" / case
        base = _evaluate(path, variants["comet"])
        for name, compat in variants.items():
            out = base if name == "comet" else _evaluate(path, compat)
            rec: dict[str, Any] = {"case": case, "deviation_off": name}
            if isinstance(out, str) or isinstance(base, str):
                rec["status"] = out if isinstance(out, str) else "ok"
                rec["comet_status"] = base if isinstance(base, str) else "ok"
            else:
                rec.update(
                    status="ok",
                    comet_status="ok",
                    total_cycles=out["total_cycles"],
                    total_energy_pj=out["total_energy_pj"],
                    cycles_ratio=out["total_cycles"] / base["total_cycles"],
                    energy_ratio=out["total_energy_pj"] / base["total_energy_pj"],
                    units_changed=sum(
                        1 for u, r in out["cycles"].items() if r != base["cycles"].get(u)
                    ),
                )
            records.append(rec)
    print(
        "| deviation switched off | runs changed (of completed) "
        "| total cycles: median / max change | energy: max change | status changes |"
    )
    print("|---|---|---|---|---|")
    for name in [*DEVIATIONS, "native"]:
        rows = [r for r in records if r["deviation_off"] == name]
        ok = [r for r in rows if r["status"] == "ok" and r["comet_status"] == "ok"]
        changed = [r for r in ok if r["cycles_ratio"] != 1 or r["units_changed"]]
        dc = [abs(r["cycles_ratio"] - 1) * 100 for r in ok]
        de = [abs(r["energy_ratio"] - 1) * 100 for r in ok]
        status = [f"{r['case']}: {r['comet_status']} -> {r['status']}" for r in rows
                  if r["status"] != r["comet_status"]]  # fmt: skip
        print(
            f"| `{name}` | {len(changed)} of {len(ok)} | "
            f"{statistics.median(dc):.2f}% / {max(dc):.2f}% | {max(de):.2f}% | "
            f"{'; '.join(status) or '-'} |"
        )
    path = write_results(
        args.out,
        benchmark="comet_compat",
        title=TITLE,
        meta=run_metadata(),
        settings={"oracle": str(args.oracle), "deviations": DEVIATIONS},
        plots=PLOTS,
        tables=TABLES,
        records=records,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
