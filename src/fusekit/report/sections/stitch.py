"""Tour section of ``fusekit.stitch``: ILP fusion plans of small subgraphs, checked vs eager."""

from __future__ import annotations

import torch

from fusekit.hw import detect
from fusekit.report.document import Section, Table, Text
from fusekit.report.tour import TourOptions
from fusekit.stitch.runner import Stitched
from fusekit.stitch.workloads import NAMES, load_workload

_QUICK = ("layernorm_bwd", "masked_softmax", "sibling_reductions", "bert")


def build(options: TourOptions) -> Section:
    """Plan and run a few small subgraphs and the BERT layer; report plans and agreement."""
    target = detect()
    records = []
    for name in _QUICK if options.quick else NAMES:
        w = load_workload(name, small=True, seed=options.seed)
        with torch.no_grad():
            stitched = Stitched(w.module, target)
            _, planned = stitched.prepare(*w.args)
            out, ref = stitched(*w.args), w.module(*w.args)
        outs = out if isinstance(out, tuple) else (out,)
        refs = ref if isinstance(ref, tuple) else (ref,)
        p = planned.plan
        records.append(
            {
                "workload": name,
                "ir_ops": len(p.graph.ops),
                "kernels": p.kernels,
                "schemes": ", ".join(
                    sorted({g.layout.scheme.value for g in p.groups if g.layout is not None})
                ),
                "predicted_us": round(p.objective_s * 1e6, 2),
                "greedy_us": round(p.greedy_s * 1e6, 2),
                "unfused_us": round(p.unfused_s * 1e6, 2),
                "ilp_ms": round(p.solve_s * 1e3, 2),
                "max_abs_error": max(
                    float((a - b).abs().max()) for a, b in zip(outs, refs, strict=True)
                ),
            }
        )
    table = Table(
        "ILP fusion plans (small shapes, this machine's CPU model)",
        ("workload", "IR ops", "kernels", "schemes", "predicted us", "greedy us",
         "every op alone us", "ILP ms", "max |fusekit - eager|"),
        tuple(
            (r["workload"], r["ir_ops"], r["kernels"], r["schemes"], r["predicted_us"],
             r["greedy_us"], r["unfused_us"], r["ilp_ms"], f"{r['max_abs_error']:.1e}")
            for r in records
        ),
        note="Contractions run alone by their ATen call (addmm/matmul), layout-only groups as "
        "strided views; every other kernel is generated numba code (a Triton backend generates "
        "the same groups for GPUs). Measured speedups: benchmarks/stitch.py.",
    )  # fmt: skip
    return Section(
        title="Stitched kernels (stitch)",
        summary=(
            "FusionStitching on the shared IR: ops are classified (elementwise, broadcast, row "
            "and column reductions, GEMM, layout), candidate groups grow from dominant ops, and "
            "an ILP on HiGHS (greedy warm start, lazy cycle cuts) picks the groups. Each group "
            "becomes one kernel whose stages share values in registers (local), row buffers "
            "(regional) or per-thread partials combined after the rows (global: column "
            "reductions beside row reductions in one pass)."
        ),
        blocks=(table, Text("The runner re-plans when input shapes change.")),
        records=tuple(records),
    )
