"""Tour section of ``fusekit.accel``: fused against unfused compound ops on COMET edge."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fusekit.accel import comet
from fusekit.accel.comet.run import arch_document
from fusekit.accel.comet.space import Space, label
from fusekit.accel.comet.templates import formulas
from fusekit.accel.mapper import Exploration, explore
from fusekit.accel.plot import draw_pareto
from fusekit.report.document import Figure, Section, Table, Text
from fusekit.report.tour import TourOptions

_EXAMPLES = Path(__file__).resolve().parents[2] / "accel" / "comet" / "examples"
#: The fused-against-unfused table's shape, and the (smaller) shape whose every tiling is
#: scored for the Pareto plot; both scored by the reference tree model (no numba compile).
SHAPE = {"M": 256, "N": 256, "K": 128}
FRONT_SHAPE = {"M": 64, "N": 256, "K": 128}


def pareto_figure(title: str, ex: Exploration) -> Figure:
    """The search's latency-energy plot (:func:`fusekit.accel.plot.draw_pareto`) as a figure."""
    fig = draw_pareto("", ex)
    return Figure.from_matplotlib(
        title,
        fig,
        caption="Grey: every tiling COMET's fit check accepts; orange: those no other beats in "
        "both cycles and energy; the star is the fastest, the hollow circle the unfused "
        "baseline (separate kernels, the intermediate through DRAM) at the star's tiling.",
    )


def _loops(rec: dict[str, Any]) -> str:
    """``A: N2 x N2 (DRAM->GB)`` per tensor; factors of 1 left out."""
    parts = []
    for lp in rec.get("loops", []):
        facs = " x ".join(f"{d}{v}" for f in lp["factors"] for d, v in f.items()) or "-"
        parts.append(f"{lp['tensor']}: {facs} ({lp['from']}->{lp['to']})")
    return "; ".join(parts)


def comet_blocks(case: Path, title: str) -> tuple[Table, ...]:
    """What an architect reads of one COMET-format mapping, evaluated by the tree model.

    The loop nest (per node: type, loops per tensor with levels, cycles), the reads and writes
    per level and tensor (tiles moved per instance, summed over the nest), and COMET's per-unit
    cycle table.
    """
    out: dict[str, Any] = comet.evaluate(case)
    nest = [
        ("  " * int(r["depth"]) + str(r["node"]), r["type"], _loops(r), r.get("cycles"))
        for r in out["nest"]
    ]
    moved: dict[tuple[str, str], list[int]] = {}
    for r in out["nest"]:
        for a in r.get("accesses", []):
            if a["role"] == "compute":
                continue
            row = moved.setdefault((a["level"], a["tensor"]), [0, 0, 0, 0])
            k = 2 if a["write"] else 0
            row[k] += a["count"]
            row[k + 1] += a["bytes"]
    units = [(u, c.get("CS", 0), c.get("OS", 0), c.get("TMW", 0), c["total"])
             for u, c in out["cycles"].items()]  # fmt: skip
    return (
        Table(
            f"Loop nest: {title}",
            ("node", "type", "loops (tensor: factors, levels)", "cycles"),
            tuple(nest),
        ),
        Table(
            f"Reads and writes per level: {title}",
            ("level", "tensor", "reads (tiles)", "read bytes", "writes (tiles)", "write bytes"),
            tuple((lv, t, *v) for (lv, t), v in sorted(moved.items())),
            note="per instance of the level, over all iterations; 'fusekit accel comet DIR "
            "--json' gives them per node",
        ),
        Table(
            f"Cycles per unit (COMET's table: CS ramps, OS exposed, TMW compute): {title}",
            ("unit", "CS", "OS", "TMW", "total"),
            tuple(units),
            note=f"total {out['total_cycles']:,} cycles, {out['total_energy_pj'] / 1e6:,.3f} uJ",
        ),
    )


def build(options: TourOptions) -> Section:
    """The accel section: best fused tiling against COMET's unfused baseline per op, a plot."""
    arch = arch_document("edge")
    shape = ",".join(str(v) for v in SHAPE.values())
    records = []
    for op in ("gemm_softmax", "gemm_layernorm", "attention"):
        ex = explore(Space.builtin(op, arch), SHAPE, op, front=False, compiled=False)
        records.append(
            {
                "op": op,
                "M,N,K": shape,
                "best fused tiling": label(ex.best.tiling),
                "fused cycles": ex.best.total_cycles,
                "unfused cycles": ex.unfused_cycles,
                "speedup": round(ex.speedup or 0.0, 2),
                "fused energy (uJ)": round((ex.best.total_energy_pj or 0) / 1e6, 3),
                "unfused energy (uJ)": round((ex.unfused_energy_pj or 0) / 1e6, 3),
                "energy ratio": round(ex.energy_ratio or 0.0, 2),
                "tilings": ex.result.tilings,
                "scored": ex.result.tilings - ex.result.pruned,
            }
        )
    whole = explore(Space.builtin("gemm_softmax", arch), FRONT_SHAPE, "gemm_softmax",
                    compiled=False)  # fmt: skip
    front_shape = "x".join(str(v) for v in FRONT_SHAPE.values())
    figure = pareto_figure(
        f"Latency and energy of every GEMM-Softmax {front_shape} tiling on edge "
        f"({whole.result.tilings} tilings, {whole.result.rejected} rejected by the fit check)",
        whole,
    )
    return Section(
        title="Accelerator dataflows (accel)",
        summary=(
            "Compound ops on the COMET edge accelerator (2x2 global buffers, 2x2 cores under "
            "each), one cost model: every mapping is a mapping tree (tiles at eight levels, op "
            "leaves, explicit all-reduces of the row max and sum) scored by the tree model, the "
            "same that reproduces the COMET binary's own runs. The mapper searches COMET's "
            "tiling space and stops at a lower bound (the ops' ideal compute cycles). The "
            "unfused baseline is COMET's construction: separate kernels, the intermediate "
            "written to DRAM and read back, the same tiling; attention's third kernel "
            "(O = H V) gets its own best tiling, which is why its unfused run can be faster."
        ),
        blocks=(
            Table(
                "The ops of GEMM-Softmax in tree order (attention adds O = H V and its reduction)",
                ("op", "unit", "in index notation"),
                tuple(formulas("gemm_softmax")),
            ),
            Table.from_records(
                "Best fused tiling against the unfused baseline (by latency, COMET's mode)",
                records,
            ),
            figure,
            Text(
                "fusekit accel explore OP -M 256 -N 256 -K 128 reproduces the table; "
                "--plot FILE draws the figure."
            ),
            Text(
                "What an architect reads of one mapping: the best GEMM-Softmax tiling of "
                "COMET's space at decode shape 1x1024x128 on edge, as shipped in "
                "accel/comet/examples/gemm_softmax_edge; "
                "'fusekit accel eval DIR --nest' prints these."
            ),
            *comet_blocks(_EXAMPLES / "gemm_softmax_edge", "GEMM-Softmax 1x1024x128, edge"),
        ),
        records=tuple(records),
    )
