"""Tour section of ``fusekit.stitch``: fusion plans, and training through torch.compile.

ILP fusion plans of small subgraphs, checked against eager, and a few training steps through
``torch.compile(backend="fusekit")`` beside eager's.
"""

from __future__ import annotations

import torch

from fusekit.hw import detect
from fusekit.report.document import Section, Table, Text
from fusekit.report.tour import TourOptions
from fusekit.stitch.runner import Stitched
from fusekit.stitch.workloads import NAMES, load_workload

_QUICK = ("layernorm_bwd", "masked_softmax", "sibling_reductions", "bert")


class _Block(torch.nn.Module):
    """Linear -> LayerNorm -> GELU -> dropout -> Linear: a transformer MLP in miniature."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.norm, self.b = (
            torch.nn.Linear(64, 256), torch.nn.LayerNorm(256), torch.nn.Linear(256, 16)
        )  # fmt: skip
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.drop(torch.nn.functional.gelu(self.norm(self.a(x))))
        return torch.nn.functional.cross_entropy(self.b(h), y)


def _training_rows(seed: int, steps: int = 4) -> list[dict[str, object]]:
    """``steps`` AdamW steps eager and through the backend, from the same seed and batches."""
    import time

    gen = torch.Generator().manual_seed(seed)
    batches = [(torch.randn(128, 64, generator=gen), torch.randint(0, 16, (128,), generator=gen))
               for _ in range(steps)]  # fmt: skip
    losses: dict[str, list[float]] = {}
    seconds: dict[str, list[float]] = {}
    for impl in ("eager", "fusekit"):
        torch.manual_seed(seed)
        model = _Block()
        step = torch.compile(model, backend="fusekit") if impl == "fusekit" else model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        torch.manual_seed(seed + 1)  # the dropout masks: the same draws for both
        for x, y in batches:
            start = time.perf_counter()
            loss = step(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            seconds.setdefault(impl, []).append(time.perf_counter() - start)
            losses.setdefault(impl, []).append(loss.item())
    torch._dynamo.reset()
    return [
        {"step": k, "loss_eager": round(losses["eager"][k], 6),
         "loss_fusekit": round(losses["fusekit"][k], 6),
         "difference": abs(losses["eager"][k] - losses["fusekit"][k]),
         "eager_ms": round(seconds["eager"][k] * 1e3, 2),
         "fusekit_ms": round(seconds["fusekit"][k] * 1e3, 2)}
        for k in range(steps)
    ]  # fmt: skip


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
        note="Contractions run alone by their ATen call (addmm/matmul; a linear layer on MKL or "
        "oneDNN, whichever its first call times faster), layout-only groups as strided views; "
        "every other kernel is generated numba code (a Triton backend generates the same groups "
        "for GPUs). Measured speedups: benchmarks/stitch.py.",
    )  # fmt: skip
    training = _training_rows(options.seed)
    rows = tuple(
        (r["step"], r["loss_eager"], r["loss_fusekit"], f"{r['difference']:.1e}", r["eager_ms"],
         r["fusekit_ms"])
        for r in training
    )  # fmt: skip
    steps = Table(
        'torch.compile(model, backend="fusekit"): AdamW steps of a small MLP block in training',
        ("step", "loss eager", "loss fusekit", "|difference|", "eager ms", "fusekit ms"),
        rows,
        note="Linear -> LayerNorm -> GELU -> dropout -> Linear -> cross-entropy, forward and "
        "backward planned and stitched; dropout draws eager's masks from the same seed. Step 0 "
        "includes compilation (generated kernels are cached on disk). Whole HF models and their "
        "captured subgraphs against Inductor: benchmarks/stitch_models.py.",
    )
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
        blocks=(table, Text("The runner re-plans when input shapes change."), steps),
        records=tuple(records) + tuple(training),
    )
