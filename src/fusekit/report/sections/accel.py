"""Tour section of ``fusekit.accel``: fused against unfused compound ops on COMET edge."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fusekit.accel import Fusion, attention, comet, evaluate, explore, gemm_layernorm, gemm_softmax
from fusekit.accel.plot import draw_pareto
from fusekit.accel.problem import Problem
from fusekit.accel.search import Scored
from fusekit.hw import Accelerator, load
from fusekit.ir import format_op
from fusekit.report.document import Figure, Section, Table, Text
from fusekit.report.tour import TourOptions

_EXAMPLES = Path(__file__).resolve().parents[2] / "accel" / "comet" / "examples"


def op_names(problem: Problem) -> dict[str, str]:
    """Each op's output tensor -> the op in index notation, e.g. ``X[m] = max_n S[m,n]``."""
    return {stage.out: format_op(stage.op) for stage in problem.stages}


def pareto_figure(
    title: str, front: tuple[Scored, ...], bests: dict[Fusion, Scored], chosen: Scored
) -> Figure:
    """The search's latency-energy plot (:func:`fusekit.accel.plot.draw_pareto`) as a figure."""
    fig = draw_pareto("", front, bests, chosen)
    return Figure.from_matplotlib(
        title,
        fig,
        caption="Filled points are mappings no other mapping beats in both latency and energy; "
        "hollow ones are the best-latency mapping of a fusion level off that front.",
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
    """The accel section: best fused vs best unfused mapping per compound op, a Pareto plot."""
    hw = load("edge")
    if not isinstance(hw, Accelerator):
        raise TypeError(f"accel tour: expected 'edge' to be an accelerator (got {hw.kind})")
    shape = (256, 256, 128)
    records = []
    figure: Figure | None = None
    breakdown_rows: tuple[tuple[object, ...], ...] = ()
    for make in (gemm_softmax, gemm_layernorm, attention):
        problem = make(*shape)
        result = explore(problem, hw, prune="latency")
        per = result.best_by_fusion
        unfused = per[Fusion.UNFUSED]["latency"]
        fused = min(  # the fastest fused mapping; of equally fast ones, the least energy
            (per[f]["latency"] for f in per if f is not Fusion.UNFUSED),
            key=lambda s: (s.latency_cycles, s.energy_pj),
        )
        records.append(
            {
                "problem": problem.name,
                "M,N,K": ",".join(map(str, shape)),
                "fused mapping": fused.mapping.label(),
                "fused cycles": fused.latency_cycles,
                "unfused cycles": unfused.latency_cycles,
                "speedup": round(unfused.latency_cycles / fused.latency_cycles, 2),
                "fused energy (uJ)": round(fused.energy_pj / 1e6, 2),
                "unfused energy (uJ)": round(unfused.energy_pj / 1e6, 2),
                "mappings": result.candidates,
            }
        )
        if make is gemm_softmax:
            whole = explore(problem, hw, prune="pareto")
            bests = {f: per_f["latency"] for f, per_f in whole.best_by_fusion.items()}
            chain = " -> ".join(op_names(problem).values())
            figure = pareto_figure(
                f"Latency and energy of GEMM-Softmax {'x'.join(map(str, shape))} mappings on "
                f"edge: {chain}",
                whole.pareto,
                bests,
                fused,
            )
            names = op_names(problem)
            b = evaluate(problem, hw, fused.mapping)
            breakdown_rows = tuple(
                (names.get(o.name, o.name), o.kind, o.cycles, round(o.energy_pj / 1e6, 3))
                for o in b.ops
            )
    if figure is None:
        raise ValueError("accel tour: expected a GEMM-Softmax Pareto front (got none)")
    return Section(
        title="Accelerator dataflows (accel)",
        summary=(
            "Compound ops on the COMET edge accelerator (2x2 clusters): the mapper searches "
            "partitions, tiles, loop orders, bindings (pipeline, sharing) and fusion levels; "
            "collectives (all-reduce of row max and sum, reduce-scatter of attention's partial "
            "outputs) are explicit. The unfused baseline is COMET's: each op its own kernel, "
            "every intermediate written to DRAM and read back, no pipelining across ops, the "
            "same tiling space. One tensor element is one 8-byte word, so the unfused "
            "intermediates are DRAM-bound: that is most of the speedup."
        ),
        blocks=(
            Table.from_records("Best fused vs best unfused (by latency)", records),
            figure,
            Table(
                "Per op and per collective: the chosen GEMM-Softmax mapping",
                ("op / collective", "kind", "cycles", "energy (uJ)"),
                breakdown_rows,
            ),
            Text("fusekit accel explore and fusekit accel eval mapping.yaml reproduce these."),
            Text(
                "The same op as COMET models it (fusekit's tree model with COMET's semantics): "
                "the best GEMM-Softmax tiling of COMET's space at decode shape 1x1024x128 on "
                "edge, as shipped in accel/comet/examples/gemm_softmax_edge; "
                "'fusekit accel comet DIR --nest' prints these."
            ),
            *comet_blocks(_EXAMPLES / "gemm_softmax_edge", "GEMM-Softmax 1x1024x128, edge"),
        ),
        records=tuple(records),
    )
