"""MoE experts side by side on the CPU: HF Mixtral's loop, torch._grouped_mm and fusekit.

Problems: Mixtral-shaped experts scaled to a laptop (8 experts top-2, hidden 1024, ffn 3584) and
fine-grained experts (64 experts top-6, hidden 1024, ffn 512), fp32, routed by
:func:`fusekit.data.tokens.moe_batch` with Zipf(1) expert popularity, tokens from 1 to 1024.
Every contender gets the same routing (experts and renormalised weights; the router's own GEMM is
the same for all and left out) and computes ``y[t] = sum_j w[t,j] SwiGLU_{e[t,j]}(x[t])``:

* ``hf loop``: transformers' ``MixtralExperts.forward`` (one_hot mask, a loop over the hit
  experts, ``F.linear`` on HF's ``[E, 2 ffn, hidden]`` / ``[E, hidden, ffn]`` weights,
  ``index_add_``): the peer a Mixtral user runs today;
* ``grouped_mm``: sort pairs by expert, gather, ``torch._grouped_mm`` (gate|up), SwiGLU,
  ``torch._grouped_mm`` (down), scale, ``index_add_``;
* ``fusekit``: ``fusekit.nn.MoE.experts`` with the gms selector (plans built per call: routing
  changes every call), and each named gms dataflow;
* ``floor``: the two expert GEMMs alone on inputs gathered and made contiguous beforehand (no
  routing, gather, activation or scatter), once with ``torch.mm`` per expert (``floor torch.mm``)
  and once with the GEMM fusekit runs (``floor segment_mm``: gms's segment GEMM, whose segments
  of at most ``SKINNY_ROWS`` (16) rows use the weight-streaming kernel); ``over_floor`` is over
  the faster.

Forward+backward (``--train-tokens``, default 4, 64, 1024): ``dx``, the expert weights'
gradients and the routing weights' gradient of ``sum(y * dy)``, through autograd for the hf loop
and the ``grouped_mm`` composition and through ``fusekit.nn.MoE``'s own backward (expert
segments; the transposed weights read as views, :func:`fusekit.gms.experts.swiglu_backward`). Every
gradient is checked against the hf loop's first. Its roofline counts the three GEMMs per
forward GEMM (``3 x`` the forward FLOPs) and, as bytes, the active experts' weights read twice
(forward, ``dx``) and their gradients written once (the other experts' gradients are zeros that
need no writing: fusekit leaves their pages untouched, the peers write them).

Roofline: with few tokens the expert weights must stream from DRAM once (bytes = active experts x
3 x hidden x ffn x 4), bound = bytes / the read bandwidth (``fusekit.hw.detect.read_bytes_per_s``:
a 256 MiB sum, nothing written, so the copy rate would understate it; measured before and after
every problem, and the best rate of the run used, since a loaded host lowers single readings);
with many tokens the GEMMs bound it (2 x pairs x 3 x hidden x ffn FLOPs over the GEMM FLOP/s of
``fusekit.hw.detect.gemm_flops_per_s``, read the same way). Each row's
``fraction_of_roofline`` is the larger bound over its time.

Run: ``.venv/bin/python benchmarks/moe.py [--quick]`` -> ``benchmarks/results/moe_cpu.json``
and ``moe_cpu.png``.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from fusekit.data.tokens import moe_batch
from fusekit.hw import CPUTarget, detect
from fusekit.hw.detect import gemm_flops_per_s, read_bytes_per_s
from fusekit.nn.moe import MoE
from fusekit.report.records import Plot, Summary, run_metadata, write_results
from fusekit.search.measure import time_call

#: What ``fusekit report build`` shows of the results file.
TITLE = (
    "fusekit's MoE experts against HF Mixtral's expert loop and a grouped_mm composition, from "
    "decode (1 token) to prefill sizes, forward and forward+backward, on the CPU; speedup is "
    "over the best peer."
)
PLOTS = tuple(
    Plot(title=f"Speedup over the best peer, {study}, {shape}", x="tokens",
         y="speedup_over_best_peer", hue="impl", where={"study": study, "shape": shape},
         kind="line", log_y=True, ref=1.0)
    for study in ("forward", "forward+backward")
    for shape in ("8x2 h1024 f3584", "64x6 h1024 f512")
)  # fmt: skip
TABLES = (
    Summary(title="Speedup over the best peer per implementation (over token counts)",
            rows=["study", "shape", "impl"], values=["speedup_over_best_peer"],
            stats=["median", "max"]),
    Summary(title="fusekit's fraction of the roofline per token count", rows=["study", "shape"],
            values=["fraction_of_roofline"], across="tokens", where={"impl": "fusekit"}),
)  # fmt: skip

STRATEGIES = ("G-Mseg-S", "(GM)seg-S", "(GMS)seg")
SHAPES = {  # name: (experts, top_k, hidden, ffn)
    "8x2 h1024 f3584": (8, 2, 1024, 3584),
    "64x6 h1024 f512": (64, 6, 1024, 512),
}
TOKENS = (1, 4, 16, 64, 256, 1024)
TRAIN_TOKENS = (4, 64, 1024)


def hf_experts(num_experts: int, hidden: int, ffn: int) -> torch.nn.Module:
    """The real ``MixtralExperts`` module of transformers, with random weights."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    cfg = MixtralConfig(hidden_size=hidden, intermediate_size=ffn, num_local_experts=num_experts)
    experts = MixtralExperts(cfg)
    with torch.no_grad():
        experts.gate_up_proj.normal_(0, hidden**-0.5)
        experts.down_proj.normal_(0, ffn**-0.5)
    return experts


def grouped(
    x: torch.Tensor, idx: torch.Tensor, wts: torch.Tensor, gu: torch.Tensor, dn: torch.Tensor
) -> torch.Tensor:
    """The ``torch._grouped_mm`` composition (weights ``[E, K, M]``)."""
    k = idx.shape[1]
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    offs = torch.cumsum(torch.bincount(flat, minlength=gu.shape[0]), 0).to(torch.int32)
    token = order // k
    h = torch._grouped_mm(x[token], gu, offs=offs)
    ffn = dn.shape[1]
    a = (F.silu(h[:, :ffn]) * h[:, ffn:]).contiguous()
    y = torch._grouped_mm(a, dn, offs=offs) * wts.reshape(-1)[order, None]
    return torch.zeros_like(x).index_add_(0, token, y)


def floor_call(
    x: torch.Tensor, idx: torch.Tensor, gu: torch.Tensor, dn: torch.Tensor, fused: bool
) -> Callable[[], object]:
    """The two GEMMs per expert on pre-gathered contiguous inputs (torch.mm or segment_mm)."""
    from fusekit.gms.segments import segment_mm

    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    ptr = torch.zeros(gu.shape[0] + 1, dtype=torch.int64)
    ptr[1:] = torch.cumsum(torch.bincount(flat, minlength=gu.shape[0]), 0)
    xs = x[order // idx.shape[1]].contiguous()
    acts = torch.randn(xs.shape[0], dn.shape[1])
    h = torch.empty(xs.shape[0], gu.shape[2])
    z = torch.empty(xs.shape[0], dn.shape[2])
    bounds = ptr.tolist()

    def call() -> None:
        if fused:
            segment_mm(xs, gu, ptr, out=h)
            segment_mm(acts, dn, ptr, out=z)
            return
        for e in range(gu.shape[0]):
            lo, hi = bounds[e], bounds[e + 1]
            if hi > lo:
                torch.mm(xs[lo:hi], gu[e], out=h[lo:hi])
                torch.mm(acts[lo:hi], dn[e], out=z[lo:hi])

    return call


def time_impls(
    impls: dict[str, Callable[[], object]], repeats: int, budget_s: float, passes: int = 3
) -> dict[str, float]:
    """Median seconds per impl over ``passes`` interleaved passes.

    Each pass times every impl in turn (a warm-up call, then up to ``repeats / passes`` calls),
    so a change of load on the shared host hits every impl alike; the result is the median of
    an impl's pass medians.
    """
    per_pass = max(1, -(-repeats // passes))
    medians: dict[str, list[float]] = {name: [] for name in impls}
    for _ in range(passes):
        for name, fn in impls.items():
            timing = time_call(fn, per_pass, max_total_s=budget_s / passes)
            medians[name].append(timing.median_s)
    return {name: statistics.median(ms) for name, ms in medians.items()}


def run_shape(shape: str, tokens: int, repeats: int, budget_s: float) -> list[dict[str, object]]:
    """Every contender on one shape and token count."""
    num_experts, top_k, hidden, ffn = SHAPES[shape]
    torch.manual_seed(0)
    batch = moe_batch(tokens, hidden, num_experts, top_k, skew=1.0, seed=tokens)
    wts, idx = batch.route()
    x = batch.x
    hf = hf_experts(num_experts, hidden, ffn)
    moe = MoE(hidden, ffn, num_experts, top_k)
    with torch.no_grad():
        moe.w_gate_up.copy_(hf.gate_up_proj.transpose(1, 2))
        moe.w_down.copy_(hf.down_proj.transpose(1, 2))
    gu, dn = moe.w_gate_up.detach(), moe.w_down.detach()
    impls: dict[str, Callable[[], object]] = {
        "hf loop": lambda: hf(x, idx, wts),
        "grouped_mm": lambda: grouped(x, idx, wts, gu, dn),
        "fusekit": lambda: moe.experts(x, idx, wts),
    }
    for strategy in STRATEGIES:
        named = MoE(hidden, ffn, num_experts, top_k, strategy=strategy)
        named.load_state_dict(moe.state_dict())
        impls[f"fusekit {strategy}"] = lambda m=named: m.experts(x, idx, wts)
    impls["floor torch.mm"] = floor_call(x, idx, gu, dn, fused=False)
    impls["floor segment_mm"] = floor_call(x, idx, gu, dn, fused=True)
    with torch.no_grad():
        expected = hf(x, idx, wts)
        for name, fn in impls.items():
            if not name.startswith("floor"):
                got = fn()
                err = float((got - expected).abs().max() / expected.abs().max())
                if not err <= 1e-4:  # NaN fails too
                    raise SystemExit(f"{shape} T={tokens}: {name} differs from hf loop ({err:.2e})")
        times = time_impls(impls, repeats, budget_s)
        path = moe.last_path
    active = int(torch.unique(idx).numel())
    pairs = tokens * top_k
    weight_bytes = active * 3 * hidden * ffn * 4
    flops = 2 * pairs * 3 * hidden * ffn
    peers = min(times["hf loop"], times["grouped_mm"])
    floor = min(times["floor torch.mm"], times["floor segment_mm"])
    rows = []
    for name, median in times.items():
        rows.append(
            {
                "study": "forward",
                "problem": f"{shape} T={tokens}",
                "shape": shape,
                "tokens": tokens,
                "impl": name,
                "median_s": median,
                "speedup_over_best_peer": peers / median,
                "over_floor": median / floor,
                "weight_bytes": weight_bytes,
                "flops": flops,
                "active_experts": active,
                "selected": path if name == "fusekit" else None,
            }
        )
    return rows


def run_training(shape: str, tokens: int, repeats: int, budget_s: float) -> list[dict[str, object]]:
    """Forward+backward of the three contenders on one shape and token count."""
    num_experts, top_k, hidden, ffn = SHAPES[shape]
    torch.manual_seed(0)
    batch = moe_batch(tokens, hidden, num_experts, top_k, skew=1.0, seed=tokens)
    wts, idx = batch.route()
    hf = hf_experts(num_experts, hidden, ffn)
    moe = MoE(hidden, ffn, num_experts, top_k)
    with torch.no_grad():
        moe.w_gate_up.copy_(hf.gate_up_proj.transpose(1, 2))
        moe.w_down.copy_(hf.down_proj.transpose(1, 2))
    gu = moe.w_gate_up.detach().clone().requires_grad_()
    dn = moe.w_down.detach().clone().requires_grad_()
    x = batch.x.clone().requires_grad_()
    w = wts.clone().requires_grad_()
    dy = torch.randn_like(x)
    leaves = {  # the gradients each contender produces: dx, d routing weights, d gate|up, d down
        "hf loop": (hf.gate_up_proj, hf.down_proj),
        "grouped_mm": (gu, dn),
        "fusekit": (moe.w_gate_up, moe.w_down),
    }
    impls: dict[str, Callable[[], object]] = {
        "hf loop": lambda: hf(x, idx, w).backward(dy),
        "grouped_mm": lambda: grouped(x, idx, w, gu, dn).backward(dy),
        "fusekit": lambda: moe.experts(x, idx, w).backward(dy),
    }

    def clear() -> None:
        for t in (x, w, *(p for ps in leaves.values() for p in ps)):
            t.grad = None

    grads = {}
    for name, fn in impls.items():
        clear()
        fn()
        gate_up, down = (p.grad for p in leaves[name])
        if name == "hf loop":  # HF stores [E, 2 ffn, hidden] and [E, hidden, ffn]
            gate_up, down = gate_up.transpose(1, 2), down.transpose(1, 2)
        grads[name] = (x.grad, w.grad, gate_up, down)
    for name in ("grouped_mm", "fusekit"):
        labels = ("dx", "dw", "dWgu", "dWd")
        for label, got, ref in zip(labels, grads[name], grads["hf loop"], strict=True):
            err = float((got - ref).abs().max() / ref.abs().max())
            if not err <= 1e-4:  # NaN fails too
                raise SystemExit(f"{shape} T={tokens} train: {name} {label} differs ({err:.2e})")

    def timed(fn: Callable[[], object]) -> Callable[[], object]:
        def call() -> object:
            clear()  # as zero_grad(set_to_none=True): each step's gradients are new tensors
            return fn()

        return call

    times = time_impls({n: timed(f) for n, f in impls.items()}, repeats, budget_s)
    active = int(torch.unique(idx).numel())
    expert_bytes = 3 * hidden * ffn * 4
    peers = min(times["hf loop"], times["grouped_mm"])
    return [
        {
            "study": "forward+backward",
            "problem": f"{shape} T={tokens}",
            "shape": shape,
            "tokens": tokens,
            "impl": name,
            "median_s": median,
            "speedup_over_best_peer": peers / median,
            "over_floor": None,
            "weight_bytes": 3 * active * expert_bytes,
            "flops": 3 * 2 * tokens * top_k * 3 * hidden * ffn,
            "active_experts": active,
            "selected": moe.last_path if name == "fusekit" else None,
        }
        for name, median in times.items()
    ]


def add_roofline(rows: list[dict[str, Any]], read_bw: float, peak_flops: float) -> None:
    """``fraction_of_roofline = max(bytes / read_bw, flops / peak) / median`` and its ``bound``."""
    for r in rows:
        stream_s, compute_s = r["weight_bytes"] / read_bw, r["flops"] / peak_flops
        r["fraction_of_roofline"] = max(stream_s, compute_s) / r["median_s"]
        r["bound"] = "bandwidth" if stream_s > compute_s else "compute"


def plot(records: list[dict[str, object]], path: Path) -> None:
    """Speedup over the faster peer against tokens: a panel per shape and study."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    studies = [s for s in ("forward", "forward+backward") if any(r["study"] == s for r in records)]
    fig, axes = plt.subplots(
        len(studies), len(SHAPES), figsize=(11, 4 * len(studies)), sharey=True, squeeze=False
    )
    for row, study in zip(axes, studies, strict=True):
        for ax, shape in zip(row, SHAPES, strict=True):
            for impl in ("hf loop", "grouped_mm", "fusekit", "floor torch.mm", "floor segment_mm"):
                pts = [
                    r
                    for r in records
                    if r["shape"] == shape and r["impl"] == impl and r["study"] == study
                ]
                if pts:
                    ax.plot(
                        [r["tokens"] for r in pts],
                        [r["speedup_over_best_peer"] for r in pts],
                        marker="o",
                        label=impl,
                    )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.axhline(1.0, color="grey", lw=0.5)
            ax.set_title(f"{shape}: {study}")
            ax.set_xlabel("tokens")
        row[0].set_ylabel("speedup over the faster peer")
        if row[0].get_legend_handles_labels()[0]:
            row[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def summary(shape: str, tokens: int, rows: list[dict[str, Any]]) -> str:
    """One line per problem: the peers' and fusekit's medians, ratios and roofline fraction."""
    by = {r["impl"]: r for r in rows}
    f = by["fusekit"]
    study = "" if f["study"] == "forward" else "fwd+bwd "
    path = f" ({f['selected']})" if f["study"] == "forward" else ""
    floor = f", {f['over_floor']:.2f} of floor" if f["over_floor"] is not None else ""
    return (
        f"{shape:18s} T={tokens:5d} {study}hf {1e3 * by['hf loop']['median_s']:8.2f} "
        f"grouped {1e3 * by['grouped_mm']['median_s']:8.2f} "
        f"fusekit {1e3 * f['median_s']:8.2f} ms{path} "
        f"x{f['speedup_over_best_peer']:.2f} over peers{floor}, "
        f"roofline {f['fraction_of_roofline']:.2f} ({f['bound']})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--budget", type=float, default=3.0, help="seconds per impl and problem")
    parser.add_argument("--quick", action="store_true", help="tokens 1, 64, 256; 3 repeats")
    parser.add_argument("--tokens", type=str, default=None, help="comma-separated token counts")
    parser.add_argument("--shapes", type=str, default=None, help="comma-separated shape names")
    parser.add_argument(
        "--train-tokens",
        type=str,
        default=None,
        help="comma-separated token counts of the forward+backward study (none: '')",
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "moe_cpu.json"
    )
    args = parser.parse_args()
    target = detect(refresh=True)
    if not isinstance(target, CPUTarget):
        raise SystemExit("moe.py measures the CPU; detect() gave no CPU target")
    read_bw = [read_bytes_per_s()]
    gemm = [target.peak_flops_per_s["fp32"]]
    tokens = (1, 64, 256) if args.quick else TOKENS
    if args.tokens:
        tokens = tuple(int(t) for t in args.tokens.split(","))
    shapes = args.shapes.split(",") if args.shapes else list(SHAPES)
    repeats = 3 if args.quick else args.repeats
    records: list[dict[str, object]] = []
    for shape in shapes:
        for t in tokens:
            rows = run_shape(shape, t, repeats, args.budget)
            read_bw.append(read_bytes_per_s())
            gemm.append(gemm_flops_per_s()[0])
            add_roofline(rows, max(read_bw), max(gemm))
            records += rows
            print(summary(shape, t, rows), flush=True)
    train_tokens = (4,) if args.quick else TRAIN_TOKENS
    if args.train_tokens is not None:
        train_tokens = tuple(int(t) for t in args.train_tokens.split(",") if t)
    for shape in shapes:
        for t in train_tokens:
            rows = run_training(shape, t, repeats, args.budget)
            add_roofline(rows, max(read_bw), max(gemm))
            records += rows
            print(summary(shape, t, rows), flush=True)
    add_roofline(records, max(read_bw), max(gemm))  # the run's best rates
    settings = {
        "threads": torch.get_num_threads(),
        "read_bw_bytes_per_s": {"used": max(read_bw), "readings": read_bw},
        "gemm_flops_per_s": {"used": max(gemm), "readings": gemm},
    }
    path = write_results(
        args.out,
        benchmark="moe",
        title=TITLE,
        meta=run_metadata(target.to_dict()),
        settings=settings,
        plots=PLOTS,
        tables=TABLES,
        records=records,
    )
    plot(records, args.out.with_suffix(".png"))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
