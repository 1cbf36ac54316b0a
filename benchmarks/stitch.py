"""Stitched kernels against eager PyTorch and torch.compile on the memory-intensive subgraphs (CPU).

For every workload of :mod:`fusekit.stitch.workloads` (nine subgraphs and the BERT encoder
layer), in one process and with the same thread count for all three:

    eager       the module as written (ATen kernels)
    compile     torch.compile(module), default mode (inductor C++/OpenMP), warmed before timing
    fusekit     stitch.compile: capture, ILP plan, generated numba kernels (contractions alone)

Each is checked against eager, then timed with ``time_call`` (median, q10, q90); passes over
the three are interleaved so that machine noise hits all of them alike. Kernel counts: eager
counts the non-view ATen ops one call dispatches, compile the kernels inductor generated, fusekit
the kernels of its plan. Bytes moved are the cost model's DRAM bytes of the plan and of every op
alone, and eager's estimated bytes (every dispatched ATen kernel reads its tensor arguments and
writes its outputs once): ``byte_ratio_eager_over_fused`` bounds fusekit's speedup over eager on a
memory-bound workload. ``roofline_fraction`` is the plan's roofline time (per kernel, the larger
of DRAM bytes over the measured streaming bandwidth and FLOPs over peak) over fusekit's measured
time; ``achieved_bw_fraction`` the plan's bytes per second over the streaming bandwidth.
Writes ``benchmarks/results/stitch_cpu.json`` and a plot beside it.

Run alone, at real-time priority: ``chrt -f 50 python benchmarks/stitch.py``. The script sets
``OMP_WAIT_POLICY=PASSIVE`` (unless set) before torch loads: fusekit alternates numba's and
torch's OpenMP pools, and a pool spinning after its region starves the other on a small machine
(an 8 ms scheduler quantum per switch on 2 cores). It applies to all three contenders alike and is
recorded in the JSON.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import math
import statistics
from pathlib import Path
from typing import Any

import numba
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from fusekit.hw import CPUTarget, detect
from fusekit.report.records import Plot, Summary, run_metadata, write_results
from fusekit.search import time_call
from fusekit.stitch.runner import Stitched, TimedChoice
from fusekit.stitch.workloads import NAMES, load_workload

#: What ``fusekit report build`` shows of the results file.
TITLE = (
    "Stitched kernels from the ILP fusion plan against eager PyTorch and torch.compile on "
    "memory-bound subgraphs and a BERT layer, on the CPU; plus the plan's modelled bytes and "
    "roofline."
)
PLOTS = (
    Plot(title="Speedup of fusekit's stitched kernels", x="workload",
         y=["speedup_vs_eager", "speedup_vs_compile"], log_y=True, ref=1.0, label="speedup"),
)  # fmt: skip
TABLES = (
    Summary(title="Per subgraph", rows=["workload"],
            values=["description", "speedup_vs_eager", "speedup_vs_compile", "kernels_eager",
                    "kernels_compile", "kernels_fusekit", "byte_ratio_eager_over_fused",
                    "roofline_fraction", "max_err_fusekit"]),
)  # fmt: skip

_VIEWS = {"view", "_unsafe_view", "reshape", "transpose", "t", "permute", "expand", "unsqueeze",
          "squeeze", "slice", "select", "alias", "detach", "as_strided", "split"}  # fmt: skip


def _tensor_bytes(tree: Any) -> int:
    return sum(
        x.numel() * x.element_size() for x in tree_leaves(tree) if isinstance(x, torch.Tensor)
    )


class _CountOps(TorchDispatchMode):
    """Counts eager's kernels (non-view ATen ops) and the bytes they move.

    Each kernel reads its tensor arguments once and writes its outputs once (the eager DRAM
    bytes estimate).
    """

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ not in _VIEWS:
            self.count += 1
            self.bytes += _tensor_bytes(list(args) + list((kwargs or {}).values()))
            self.bytes += _tensor_bytes(out)
        return out


def _tuple(x: Any) -> tuple[torch.Tensor, ...]:
    return x if isinstance(x, tuple) else (x,)


def _max_err(a: Any, b: Any) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(_tuple(a), _tuple(b), strict=True))


def run_workload(name: str, target: CPUTarget, repeats: int, small: bool) -> dict[str, Any]:
    import torch._inductor.metrics as inductor_metrics

    w = load_workload(name, small=small)
    with torch.no_grad():
        eager_out = w.module(*w.args)
        counter = _CountOps()
        with counter:
            w.module(*w.args)
        torch._dynamo.reset()
        inductor_metrics.reset()
        compiled = torch.compile(w.module)
        compiled_out = compiled(*w.args)
        compiled(*w.args)
        compile_kernels = inductor_metrics.generated_kernel_count
        stitched = Stitched(w.module, target)
        _, planned = stitched.prepare(*w.args)
        fusekit_out = stitched(*w.args)
        fns = {
            "eager": lambda: w.module(*w.args),
            "compile": lambda: compiled(*w.args),
            "fusekit": lambda: stitched(*w.args),
        }
        samples: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(3):  # interleaved passes
            for impl, fn in fns.items():
                t = time_call(fn, repeats=repeats, warmup=2, min_total_s=0.2)
                samples[impl].append(t.median_s)
    plan = planned.plan
    median = {k: statistics.median(v) for k, v in samples.items()}
    fused_bytes = sum(g.cost.dram_bytes for g in plan.groups)
    from fusekit.stitch.candidates import enumerate_candidates

    unfused_bytes = sum(
        c.cost.dram_bytes for c in enumerate_candidates(plan.graph, target) if len(c.ops) == 1
    )
    bw = target.mem_bw_bytes_per_s
    # the roofline bound of the plan: every kernel at streaming bandwidth or peak FLOP/s
    roofline_s = sum(max(g.cost.dram_bytes / bw, g.cost.flops / target.peak("fp32"))
                     for g in plan.groups)  # fmt: skip
    return {
        "workload": name,
        "description": w.description,
        "eager_s": median["eager"],
        "compile_s": median["compile"],
        "fusekit_s": median["fusekit"],
        **{f"pass_medians_s.{k}": v for k, v in samples.items()},
        "speedup_vs_eager": median["eager"] / median["fusekit"],
        "speedup_vs_compile": median["compile"] / median["fusekit"],
        "kernels_eager": counter.count,
        "kernels_compile": compile_kernels,
        "kernels_fusekit": plan.kernels,
        "ir_ops": len(plan.graph.ops),
        "bytes_fusekit_model": fused_bytes,
        "bytes_unfused_model": unfused_bytes,
        "bytes_eager_est": counter.bytes,
        "byte_ratio_eager_over_fused": counter.bytes / fused_bytes,
        "roofline_s": roofline_s,
        "roofline_fraction": roofline_s / median["fusekit"],
        "achieved_bw_fraction": fused_bytes / median["fusekit"] / bw,
        "plan_objective_s": plan.objective_s,
        "plan_greedy_s": plan.greedy_s,
        "plan_bound_s": plan.bound_s,
        "plan_solve_s": plan.solve_s,
        "max_err_fusekit": _max_err(fusekit_out, eager_out),
        "max_err_compile": _max_err(compiled_out, eager_out),
        "schemes": sorted({g.layout.scheme.value for g in plan.groups if g.layout is not None}),
        # single-reduction groups timed against their ATen call on the first run (TimedChoice)
        "timed_choices": [k.choice for k in planned.kernels if isinstance(k, TimedChoice)],
    }


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _plot(path: Path, records: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["workload"] for r in records]
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.38
    xs = range(len(names))
    ax.bar([x - width / 2 for x in xs], [r["speedup_vs_eager"] for r in records], width,
           label="fusekit / eager")  # fmt: skip
    ax.bar([x + width / 2 for x in xs], [r["speedup_vs_compile"] for r in records], width,
           label="fusekit / torch.compile")  # fmt: skip
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(list(xs), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("speedup (median time ratio)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per pass (3 passes)")
    parser.add_argument("--threads", type=int, default=2, help="torch and numba threads")
    parser.add_argument("--small", action="store_true", help="test shapes (a smoke run)")
    parser.add_argument("--only", nargs="*", default=None, help="workload names")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "stitch_cpu.json"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    numba.set_num_threads(args.threads)
    target = detect(refresh=True)
    records = []
    for name in args.only or NAMES:
        r = run_workload(name, target, args.repeats, args.small)
        records.append(r)
        print(
            f"{name:22s} eager {r['eager_s'] * 1e3:8.3f} ms  compile {r['compile_s'] * 1e3:8.3f} "
            f"ms  fusekit {r['fusekit_s'] * 1e3:8.3f} ms  x{r['speedup_vs_eager']:.2f} eager  "
            f"x{r['speedup_vs_compile']:.2f} compile  kernels {r['kernels_eager']}/"
            f"{r['kernels_compile']}/{r['kernels_fusekit']}  bytes eager/fused "
            f"x{r['byte_ratio_eager_over_fused']:.2f}  roofline {r['roofline_fraction']:.2f}",
            flush=True,
        )
    subgraphs = [r for r in records if r["workload"] != "bert"]
    summary = {}
    if subgraphs:
        summary = {
            "geomean_speedup_vs_eager": _geomean([r["speedup_vs_eager"] for r in subgraphs]),
            "geomean_speedup_vs_compile": _geomean([r["speedup_vs_compile"] for r in subgraphs]),
            "geomean_byte_ratio_eager_over_fused": _geomean(
                [r["byte_ratio_eager_over_fused"] for r in subgraphs]
            ),
            "subgraphs": len(subgraphs),
        }
        print(
            f"geomean over {len(subgraphs)} subgraphs: x{summary['geomean_speedup_vs_eager']:.2f} "
            f"eager, x{summary['geomean_speedup_vs_compile']:.2f} torch.compile; eager/fused "
            f"bytes x{summary['geomean_byte_ratio_eager_over_fused']:.2f}"
        )
    out = write_results(
        args.out,
        benchmark="stitch",
        title=TITLE,
        meta=run_metadata(target.to_dict()),
        settings={
            "threads": args.threads,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "numba": numba.__version__,
            "small": args.small,
            "summary": summary,
        },
        plots=PLOTS,
        tables=TABLES,
        records=records,
    )
    _plot(out.with_suffix(".png"), records)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
