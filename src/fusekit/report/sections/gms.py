"""Tour section of ``fusekit.gms``: every strategy on a small RGCN-shaped problem against ATen."""

from __future__ import annotations

from fusekit.gms.commands import explain_records, run_records
from fusekit.report.charts import bar_chart
from fusekit.report.document import Section, Table, Text
from fusekit.report.tour import TourOptions

#: Half the default synthetic graph: ~14,500 triples, 29,000 pairs over 90 relation segments.
_SCALE = 0.5
_WIDTH = 16


def build(options: TourOptions) -> Section:
    """The gms section: the plan of a synthetic RGCN layer and each strategy's median time."""
    records = run_records(
        "rgcn",
        _WIDTH,
        _WIDTH,
        _SCALE,
        options.seed,
        "named",
        repeats=5 if options.quick else 21,
    )
    first = records[0]
    rows = tuple(
        (
            r["impl"],
            round(1e3 * r["median_s"], 3),
            round(r["speedup_vs_aten"], 2),
            r["max_abs_error"],
        )
        for r in records
    )
    table = Table(
        "Median time per implementation",
        ("implementation", "median ms", "speedup vs ATen", "max |error| vs reference"),
        rows,
        note=(
            "ATen: index_select, then torch._grouped_mm or one mm per segment, then index_add_ "
            "and the mean division, on the same segment-sorted indices; speedup is the faster "
            "ATen variant's median over each row's. Timings on a shared machine are noisy."
        ),
    )
    chart = bar_chart(
        "Speedup over the ATen composition",
        [r for r in records if not str(r["impl"]).startswith("aten")],
        x="impl",
        y="speedup_vs_aten",
        ref=1.0,
    )
    explained, why = explain_records("rgcn", _WIDTH, _WIDTH, _SCALE, options.seed, True, None)
    selection = Table(
        "Each strategy at its predicted-best configuration: model against measurement",
        ("strategy", "predicted ms", "measured ms", "where the time goes (model)"),
        tuple(
            (
                r["strategy"],
                round(1e3 * r["predicted_s"], 3),
                round(1e3 * r["measured_s"], 3),
                r["explain"],
            )
            for r in explained
        ),
        note=why,
    )
    return Section(
        title="gms: gather-matmul-scatter",
        summary=(
            "Y[d_e] (+)= c_e * X[g_e] @ W[s_e] for RGCN, sparse convolution and Mixture-of-"
            "Experts. A plan sorts the pairs by segment once and tiles them; the four dataflows "
            "(G-Mseg-S, (GM)seg-S, G-(MS)seg, (GMS)seg) and the transform-first and "
            "aggregate-first orders run as compiled CPU kernels (numba) behind "
            "torch.ops.fusekit.gms, with autograd."
        ),
        blocks=(
            Text(
                f"Problem: {first['workload']} with {first['pairs']} pairs (each triple in both "
                f"directions), 90 relation segments, K = M = {_WIDTH}, mean reduce, fp32. "
                "`fusekit gms run --shape rgcn|conv|moe` prints the same table; "
                "benchmarks/gms_kernels.py runs the real AIFB, MUTAG, LiDAR and MoE problems."
            ),
            table,
            chart,
            Text(
                "Choosing without measuring: the performance model (fusekit/gms/model.py) "
                "predicts every configuration of the space; `fusekit gms explain` prints this "
                "table, `fusekit gms tune` measures the model's best few and caches them, and "
                "benchmarks/gms_search.py and gms_select.py measure how good both choices are."
            ),
            selection,
        ),
        records=tuple(records),
    )
