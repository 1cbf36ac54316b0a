"""Fused against unfused on COMET's own runs: our ratios next to COMET's and the paper's.

The unfused baseline is the one the shared runs construct (``../shared/oracles/comet``, README
"Authored cases"): two separate kernels, a GEMM run writing C to DRAM and a Softmax (or
LayerNorm) run reading it back, with the same tiling constants as the fused run; the baseline's
cycles and energy are the sums of the two runs. For every such pair (the ``du_`` rows of the
summary), this script evaluates the three runs with the tree model as COMET does (``comet``
columns: equal to the binary's outputs) and with COMET's defects off (``native`` columns), and
prints COMET's own ratio from the summary next to them, and the paper's up-to speedups.

A second study (``study: templates``) builds the same comparison without the oracle's files,
for every op fusekit writes a COMET template for, attention included: for each shape of the
shared runs the mapper's best fused tiling (``fusekit.accel.mapper.explore``), against the unfused
kernels of COMET's construction at that tiling (:mod:`fusekit.accel.comet.fusion`: GEMM, then
Softmax or LayerNorm alone; attention adds ``O = H V`` at its own best tiling). The templates
give the oracle's runs exactly (tests/accel/test_comet.py).

Run: ``.venv/bin/python benchmarks/comet_fusion.py`` -> ``benchmarks/results/comet_fusion.json``.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

from fusekit.accel.comet.fusion import KERNELS
from fusekit.accel.comet.run import CometFitError, arch_document, evaluate
from fusekit.accel.comet.space import Space, label
from fusekit.accel.mapper import explore
from fusekit.report.records import Cell, Plot, Summary, run_metadata, write_results

ORACLE = Path(__file__).resolve().parents[1] / ".." / "shared" / "oracles" / "comet"
PAPER_UP_TO = {"gemm_softmax": 1.42, "gemm_layernorm": 3.46}  # COMET paper, latency speedups

#: What ``fusekit report build`` shows of the results file.
TITLE = (
    "Fused against unfused on COMET's own runs: unfused / fused cycles and energy by fusekit's "
    "tree model in COMET's mode and native mode, beside the COMET binary's own ratios and the "
    "paper's up-to speedups."
)
ORACLE_RUNS: dict[str, Cell] = {"study": "oracle"}
TEMPLATES: dict[str, Cell] = {"study": "templates"}
PLOTS = (
    Plot(title="Unfused / fused cycles (COMET mode), best of the shared runs per shape",
         x="M,N,K", y="comet_cycles_ratio", hue="op", stat="max", ref=1.0, where=ORACLE_RUNS),
    Plot(title="Unfused / fused energy (COMET mode), best of the shared runs per shape",
         x="M,N,K", y="comet_energy_ratio", hue="op", stat="max", ref=1.0, where=ORACLE_RUNS),
    Plot(title="Templates: unfused / fused cycles at the mapper's best fused tiling",
         x="M,N,K", y="cycles_ratio", hue="op", ref=1.0, where=TEMPLATES),
    Plot(title="Templates: unfused / fused energy at the mapper's best fused tiling",
         x="M,N,K", y="energy_ratio", hue="op", ref=1.0, where=TEMPLATES),
)  # fmt: skip
TABLES = (
    Summary(title="Unfused / fused per shape and op: ours (COMET mode, native) and the binary's",
            rows=["arch", "M,N,K", "op"],
            values=["comet_cycles_ratio", "comet_binary_cycles_ratio", "native_cycles_ratio",
                    "comet_energy_ratio", "comet_binary_energy_ratio", "native_energy_ratio",
                    "paper_up_to"], stats=["max"], where=ORACLE_RUNS),
    Summary(title="Templates: fused and unfused (COMET's construction) per shape and op",
            rows=["arch", "M,N,K", "op"],
            values=["fused_cycles", "unfused_cycles", "cycles_ratio", "energy_ratio"],
            stats=["max"], where=TEMPLATES),
)  # fmt: skip


def templates(shapes: list[tuple[str, str]]) -> list[dict[str, object]]:
    """The templates study (module docstring): one record per shape and op, COMET mode."""
    out: list[dict[str, object]] = []
    for arch, mnk in shapes:
        doc = arch_document(arch)
        m, n, k = map(int, mnk.split(","))
        dims = {"M": m, "N": n, "K": k}
        for op in KERNELS:
            try:
                ex = explore(Space.builtin(op, doc), dims, op, front=False)
            except ValueError as e:  # no tiling fits
                print(f"{arch} {mnk} {op}: {e}")
                continue
            if not ex.unfused:  # a kernel of the baseline does not fit
                print(f"{arch} {mnk} {op}: {ex.unfused_note}")
                continue
            best = ex.best
            out.append({
                "study": "templates", "arch": arch, "M,N,K": mnk, "op": op,
                "tiling": label(best.tiling), "fused_cycles": best.total_cycles,
                "fused_energy_pj": best.total_energy_pj, "unfused_cycles": ex.unfused_cycles,
                "unfused_energy_pj": ex.unfused_energy_pj,
                "kernels": " + ".join(f"{x.name} {x.total_cycles:,}" for x in ex.unfused),
                "cycles_ratio": ex.speedup,
                "energy_ratio": ex.energy_ratio,
            })  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--oracle", type=Path, default=ORACLE)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/comet_fusion.json"))
    args = parser.parse_args()
    with open(args.oracle / "summary.csv") as f:
        every = list(csv.DictReader(f))
    rows = [r for r in every if r["case"].startswith("du_")]
    records = []
    for r in rows:
        parts = [p.strip() for p in r["components"].split("+")]
        rec: dict[str, object] = {"study": "oracle", "case": r["case"], "arch": r["arch"],
                                  "op": r["op"],
                                  "M,N,K": f"{r['M']},{r['N']},{r['K']}"}  # fmt: skip
        for mode, compat in (("comet", True), ("native", False)):
            try:
                fused = evaluate(args.oracle / "cases" / r["fused_case"], compat=compat)
                unf = [evaluate(args.oracle / "cases" / p, compat=compat) for p in parts]
            except CometFitError:  # native: a double-buffered level holds half
                rec[f"{mode}_cycles_ratio"] = rec[f"{mode}_energy_ratio"] = None
                continue
            cyc = sum(u["total_cycles"] for u in unf)
            pj = sum(u["total_energy_pj"] for u in unf)
            rec[f"{mode}_cycles_ratio"] = cyc / fused["total_cycles"]
            rec[f"{mode}_energy_ratio"] = pj / fused["total_energy_pj"]
        rec["comet_binary_cycles_ratio"] = float(r["unfused_over_fused_cycles"])
        rec["comet_binary_energy_ratio"] = float(r["unfused_over_fused_energy"])
        rec["paper_up_to"] = PAPER_UP_TO[r["op"]]
        records.append(rec)
    print(
        "| op | arch | runs | cycles ratio: ours (comet) / COMET binary / native, max | "
        "energy ratio: ours (comet) / COMET binary / native, max | paper up to |"
    )
    print("|---|---|---|---|---|---|")
    for op in PAPER_UP_TO:
        for arch in ("edge", "cloud"):
            sel = [x for x in records if x["op"] == op and x["arch"] == arch]
            if not sel:
                continue

            def mx(key: str, sel: list[dict[str, object]] = sel) -> str:
                vals = [float(x[key]) for x in sel if x[key] is not None]  # type: ignore[arg-type]
                return f"{max(vals):.3f}" if vals else "-"

            print(f"| {op} | {arch} | {len(sel)} | {mx('comet_cycles_ratio')} / "
                  f"{mx('comet_binary_cycles_ratio')} / {mx('native_cycles_ratio')} | "
                  f"{mx('comet_energy_ratio')} / {mx('comet_binary_energy_ratio')} / "
                  f"{mx('native_energy_ratio')} | {PAPER_UP_TO[op]}x |")  # fmt: skip
    med = statistics.median(float(x["comet_cycles_ratio"]) for x in records)  # type: ignore[arg-type]
    print(f"median unfused/fused cycles (comet mode): {med:.4f}")
    shapes = {(r["arch"], f"{r['M']},{r['N']},{r['K']}") for r in every
              if r["case"].startswith(("im_", "du_"))}  # fmt: skip
    templ = templates(sorted(shapes))
    print(
        "| arch | M,N,K | op | fused cycles | unfused cycles (kernels) | cycles ratio | "
        "energy ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    for t in templ:
        print(
            f"| {t['arch']} | {t['M,N,K']} | {t['op']} | {t['fused_cycles']:,} | "
            f"{t['unfused_cycles']:,} ({t['kernels']}) | {t['cycles_ratio']:.3f} | "
            f"{t['energy_ratio']:.3f} |"
        )
    records += templ
    path = write_results(
        args.out,
        benchmark="comet_fusion",
        title=TITLE,
        meta=run_metadata(),
        settings={"oracle": str(args.oracle)},
        plots=PLOTS,
        tables=TABLES,
        records=records,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
