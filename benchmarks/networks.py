"""Whole networks on gms, through the entry points their users already use, against the peers.

Three parts, each timed side by side in this process (medians over interleaved passes):

* ``backbone``: the 3-D detection backbone of SECOND / CenterPoint (OpenPCDet's
  ``VoxelBackBone8x``: a 4 -> 16 SubM input block, then four stages of one strided
  ``SparseConv3d`` and two ``SubMConv3d`` blocks at 16, 32, 64, 64 channels, then a
  ``(3, 1, 1)`` / stride ``(2, 1, 1)`` convolution to 128, each followed by BatchNorm1d
  (eps 1e-3, momentum 0.01) and ReLU) built with spconv and converted by
  ``fusekit.nn.from_spconv`` (same state_dict), on the two shipped LiDAR scans and a
  160k-voxel LiDAR-like scan. ``forward``: inference with every kernel map built (a fresh tensor
  per call, as in a detector's step). ``forward+backward``: spconv 2.3.8's CPU backward asks for
  a CUDA stream and cannot run on a CPU-only torch, so the peer of that study is spconv's own
  algorithm in plain torch (``index_select`` -> ``mm`` -> ``index_add_`` per offset: fusekit
  layers run with ``strategy="reference"``). spconv's CPU kernels race with more than one
  thread, so outputs are checked against spconv run on one thread; spconv is timed with all.
* ``hf``: small-but-realistic Hugging Face MoE language models (two decoder layers at the expert
  widths of Mixtral (scaled to hidden 1024), Qwen3-MoE 30B-A3B and OLMoE 1B-7B, random
  weights), one model per family whose experts run through each registered experts
  implementation in turn (``model.set_experts_implementation``): ``fusekit`` against HF's
  ``grouped_mm``, ``batched_mm`` and ``eager``. ``prefill``: one forward of 512 tokens with
  the last position's logits, as ``generate()`` runs it (``logits_to_keep=1``); ``decode``: 64
  greedy steps of one token with the KV cache after a 32-token prompt (seconds per token).
  Forward hooks time the experts modules inside the model (``experts_s``) and count what the
  routing made them do: the hit experts' weight bytes and the GEMM FLOPs. Their roofline
  (``experts_roofline_s``: the larger of bytes over the machine's read bandwidth and FLOPs over
  its GEMM rate, both measured at the start of the part) gives ``ceiling_over_best_peer``: the
  best peer's time over the same time with its experts at that roofline, the most any experts
  implementation can gain on this model (Amdahl's law: attention, norms and the LM head are
  the model's own).
* ``rgcn``: PyG's two-layer entity-classification RGCN (featureless first layer, 30 bases,
  hidden 16, Adam 0.01, weight decay 5e-4) trained on AIFB and MUTAG with PyG's and fusekit's
  ``RGCNConv`` from the same initial parameters, until the training loss stops falling
  (``--epochs`` at most): seconds per epoch and test accuracy.

Every fusekit output is checked against the peer's before timing.

Run: ``.venv/bin/python benchmarks/networks.py [--quick] [--parts backbone,hf,rgcn]``
-> ``benchmarks/results/networks_cpu.json`` and ``networks_cpu.png``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from fusekit.data import entities, lidar_like, lidar_scan
from fusekit.data.voxels import VoxelScan
from fusekit.hw import detect
from fusekit.report.records import Plot, Summary, run_metadata, shown, write_results
from fusekit.search.measure import time_call
from peers import import_spconv

TITLE = (
    "Whole networks: a SECOND/CenterPoint sparse backbone converted from spconv, Hugging Face "
    "MoE models with the 'fusekit' experts implementation, and RGCN training, against the "
    "peers, on the CPU."
)
PLOTS = (
    Plot(title="Speedup of fusekit over the best peer, per network and study", x="problem",
         y="speedup_over_best_peer", hue="study", where={"impl": "fusekit"}, ref=1.0),
)  # fmt: skip
TABLES = (
    Summary(title="Speedup of fusekit over the best peer", rows=["problem"],
            values=["speedup_over_best_peer"], across="study", where={"impl": "fusekit"}),
    Summary(title="HF MoE: fusekit's speedup and the ceiling of any experts implementation",
            rows=["problem", "study"], values=["speedup_over_best_peer", "ceiling_over_best_peer",
                                               "ceiling_bare_gemm_over_best_peer"],
            where={"impl": "fusekit", "part": "hf"}),
    Summary(title="Median seconds (per call; decode: per token; train: per epoch)",
            rows=["problem", "study"], values=["median_s"], across="impl"),
)  # fmt: skip


def time_impls(
    impls: dict[str, Callable[[], object]], repeats: int, budget_s: float, passes: int = 3
) -> dict[str, float]:
    """Median seconds per impl: the median of its medians over interleaved passes."""
    per_pass = max(1, -(-repeats // passes))
    medians: dict[str, list[float]] = {name: [] for name in impls}
    for _ in range(passes):
        for name, fn in impls.items():
            medians[name].append(time_call(fn, per_pass, max_total_s=budget_s / passes).median_s)
    return {name: statistics.median(ms) for name, ms in medians.items()}


def rows_of(
    part: str, problem: str, study: str, times: dict[str, float], **extra: object
) -> list[dict[str, object]]:
    """One record per impl, with ``speedup_over_best_peer`` (the fastest non-fusekit impl)."""
    best_peer = min(t for name, t in times.items() if name != "fusekit")
    return [
        {
            "part": part,
            "problem": problem,
            "study": study,
            "impl": name,
            "median_s": t,
            "speedup_over_best_peer": best_peer / t,
            **extra,
        }
        for name, t in times.items()
    ]


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """``max |got - want| / max |want|`` (NaN compares as a failure)."""
    scale = float(want.abs().max()) or 1.0
    return float((got.float() - want.float()).abs().max()) / scale


def check(name: str, err: float, tol: float) -> None:
    """Stop the benchmark when an output differs: a fast wrong answer is no result."""
    if not err <= tol:
        raise SystemExit(f"{name}: fusekit differs from the peer ({err:.2e} > {tol:.0e})")


# ---------------------------------------------------------------- backbone (spconv -> fusekit)


def trained_looking(net: torch.nn.Module) -> torch.nn.Module:
    """BatchNorm statistics and affine terms away from the identity, so eval mode tests them."""
    torch.manual_seed(0)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
    return net


def backbone_scans(quick: bool) -> list[VoxelScan]:
    """The shipped real scans, and a 160k-voxel LiDAR-like scan (not with ``quick``)."""
    scans = [lidar_scan(name) for name in ("251370668", "251371071")]
    return scans[:1] if quick else [*scans, lidar_like(160_000)]


def by_coordinate(tensor: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A sparse tensor's ``(indices, features)`` sorted by ``(b, z, y, x)``.

    spconv's CPU build lists a strided convolution's outputs in the order it finds them,
    fusekit in coordinate order: the sets and the features per voxel are what must agree.
    """
    idx = tensor.indices.long()
    key = idx[:, 0]
    for axis, size in enumerate(tensor.spatial_shape, start=1):
        key = key * int(size) + idx[:, axis]
    order = torch.argsort(key)
    return idx[order], tensor.features[order]


def padded_shape(scan: VoxelScan) -> list[int]:
    """The grid with OpenPCDet's extra z cell, and at least 41 z cells (KITTI's grid)."""
    z, y, x = scan.spatial_shape
    return [max(z, 40) + 1, y, x]


@contextmanager
def threads(n: int) -> Iterator[None]:
    """Run a block on ``n`` torch threads."""
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


@dataclass(frozen=True, slots=True)
class Backbones:
    """One backbone four ways: spconv's, and converted for inference, training and reference."""

    spconv: Any  # the spconv.pytorch package
    net: torch.nn.Module  # built with spconv's layers, eval mode
    ours: torch.nn.Module  # from_spconv(net), eval mode
    trained: torch.nn.Module  # from_spconv(net), training mode
    reference: torch.nn.Module  # from_spconv(net, strategy="reference"), training mode


def backbones() -> Backbones:
    """VoxelBackBone8x built with spconv and converted by ``fusekit.nn.from_spconv``."""
    from fusekit.nn import from_spconv, voxel_backbone_8x

    spconv = import_spconv()
    net = trained_looking(voxel_backbone_8x(4, layers=spconv)).eval()
    return Backbones(
        spconv,
        net,
        from_spconv(net).eval(),
        from_spconv(net).train(),
        from_spconv(net, strategy="reference").train(),
    )


def backbone_part(quick: bool, repeats: int, budget_s: float) -> list[dict[str, object]]:
    """VoxelBackBone8x forward (maps built) and forward+backward, spconv against fusekit."""
    nets = backbones()
    rows: list[dict[str, object]] = []
    for scan in backbone_scans(quick):
        rows += backbone_scan(nets, scan, repeats, budget_s)
    return rows


def backbone_scan(
    nets: Backbones, scan: VoxelScan, repeats: int, budget_s: float
) -> list[dict[str, object]]:
    """Both studies on one scan, outputs and gradients checked first."""
    from fusekit.nn import SparseTensor

    torch.manual_seed(1)
    coords, feats, shape = scan.coords.int(), torch.randn(scan.num_voxels, 4), padded_shape(scan)

    def spconv_forward() -> Any:
        x = nets.spconv.SparseConvTensor(feats, coords, shape, scan.batch_size)
        with torch.no_grad():
            return nets.net(x)

    def fusekit_forward() -> Any:
        with torch.no_grad():
            return nets.ours(SparseTensor(feats, coords, shape, scan.batch_size))

    def train_step(model: torch.nn.Module) -> Callable[[], object]:
        def step() -> object:
            model.zero_grad(set_to_none=True)
            x = SparseTensor(feats.clone().requires_grad_(), coords, shape, scan.batch_size)
            out = model(x).features
            out.square().mean().backward()
            return out

        return step

    with threads(1):  # spconv's CPU kernels race on several threads: its one-thread answer
        want = by_coordinate(spconv_forward())
    got = by_coordinate(fusekit_forward())
    if not torch.equal(got[0], want[0]):
        raise SystemExit(f"backbone {scan.name}: fusekit's output voxels differ from spconv's")
    check(f"backbone {scan.name}", relative_error(got[1], want[1]), 1e-5)
    problem = f"VoxelBackBone8x {scan.name} ({scan.num_voxels:,} voxels)"
    times = time_impls({"spconv": spconv_forward, "fusekit": fusekit_forward}, repeats, budget_s)
    rows = rows_of("backbone", problem, "forward, maps built", times, voxels=scan.num_voxels,
                   out_voxels=int(got[0].shape[0]))  # fmt: skip
    for model in (nets.reference, nets.trained):
        model.load_state_dict(nets.ours.state_dict())
        train_step(model)()
    grads = [
        relative_error(b.grad, a.grad)
        for a, b in zip(nets.reference.parameters(), nets.trained.parameters(), strict=True)
        if a.grad is not None and b.grad is not None
    ]
    check(f"backbone {scan.name} gradients", max(grads), 1e-4)
    steps = {"torch per-offset (spconv's algorithm)": train_step(nets.reference),
             "fusekit": train_step(nets.trained)}  # fmt: skip
    times = time_impls(steps, repeats, budget_s)
    rows += rows_of("backbone", problem, "forward+backward", times, voxels=scan.num_voxels)
    print(summary(rows[:2]), "\n" + summary(rows[2:]), flush=True)
    return rows


# ---------------------------------------------------------------- hf (experts implementations)


@dataclass(frozen=True, slots=True)
class Family:
    """A small-but-realistic MoE language model: a family's expert widths, two layers."""

    name: str
    config: str  # transformers config class
    model: str  # transformers causal-LM class
    settings: dict[str, Any]


FAMILIES = (
    Family("Mixtral", "MixtralConfig", "MixtralForCausalLM", dict(
        hidden_size=1024, intermediate_size=3584, num_local_experts=8, num_experts_per_tok=2,
        num_attention_heads=16, num_key_value_heads=4)),
    Family("Qwen3-MoE", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        hidden_size=2048, moe_intermediate_size=768, intermediate_size=6144, num_experts=128,
        num_experts_per_tok=8, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        norm_topk_prob=True)),
    Family("OLMoE", "OlmoeConfig", "OlmoeForCausalLM", dict(
        hidden_size=2048, intermediate_size=1024, num_experts=64, num_experts_per_tok=8,
        num_attention_heads=16, num_key_value_heads=16)),
)  # fmt: skip
IMPLEMENTATIONS = ("fusekit", "grouped_mm", "batched_mm", "eager")


def hf_model(family: Family, quick: bool) -> torch.nn.Module:
    """A random-weight model of ``family`` with two decoder layers and a 32k vocabulary."""
    import transformers

    import fusekit.nn.hf  # noqa: F401  (registers the "fusekit" experts implementation)

    settings = dict(family.settings)
    if quick:  # an eighth of the experts' width: the plumbing, not the speed
        for key in ("intermediate_size", "moe_intermediate_size"):
            if key in settings:
                settings[key] = max(64, settings[key] // 8 // 64 * 64)
    config = getattr(transformers, family.config)(
        num_hidden_layers=2, vocab_size=32_000, max_position_embeddings=4096, **settings
    )
    torch.manual_seed(0)
    return getattr(transformers, family.model)(config).eval()  # type: ignore[no-any-return]


@dataclass
class ExpertsClock:
    """What a model's experts modules did over the calls since :meth:`reset` (forward hooks).

    ``seconds``: wall time inside them. ``weight_bytes``: the weights of the experts the
    routing hit, per call (what the experts must read at least once). ``flops``: ``2 x pairs x``
    the per-expert weight elements (the two expert GEMMs).
    """

    seconds: float = 0.0
    weight_bytes: float = 0.0
    flops: float = 0.0
    _start: float = 0.0
    #: per experts call: the module and its tokens per expert (for :func:`bare_gemm_s`)
    calls: list[tuple[torch.nn.Module, torch.Tensor]] = field(default_factory=list)

    def reset(self) -> None:
        """Zero the counts."""
        self.seconds = self.weight_bytes = self.flops = 0.0
        self.calls = []

    def attach(self, model: torch.nn.Module) -> None:
        """Hook every HF experts module of ``model``."""
        from fusekit.nn.hf import is_hf_experts

        for module in model.modules():
            if is_hf_experts(module):
                per_expert = sum(  # weight bytes of one expert
                    p[0].numel() * p.element_size()
                    for name, p in module.named_parameters(recurse=False)
                    if name.endswith("_proj")
                )
                module.register_forward_pre_hook(self._enter)
                module.register_forward_hook(partial(self._leave, per_expert=per_expert))

    def _enter(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        self._start = time.perf_counter()

    def _leave(
        self, module: torch.nn.Module, args: tuple[Any, ...], out: object, per_expert: int
    ) -> None:
        self.seconds += time.perf_counter() - self._start
        experts = args[1]  # (hidden_states, top_k_index, top_k_weights)
        elements = per_expert / module.down_proj.element_size()
        self.weight_bytes += int(torch.unique(experts).numel()) * per_expert
        self.flops += 2.0 * experts.numel() * elements
        self.calls.append(
            (module, torch.bincount(experts.reshape(-1), minlength=module.gate_up_proj.shape[0]))
        )


def bare_gemm_s(calls: list[tuple[torch.nn.Module, torch.Tensor]], repeats: int = 3) -> float:
    """Seconds ATen's ``torch.mm`` takes for the experts' GEMMs of ``calls``, and nothing else.

    Per call and hit expert ``e`` with ``n_e`` tokens: ``[n_e, H] x gate_up_proj[e]^T`` and
    ``[n_e, F] x down_proj[e]^T``, on the model's own weights as they lie (what HF's
    implementations multiply), the activations random: no routing, gather, activation, scaling
    or scatter. The median of ``repeats`` passes after a warm-up pass. An experts
    implementation built on ATen's GEMMs cannot take less (:func:`experts_ceiling` of it).
    """
    work = []
    for module, counts in calls:
        up, down = module.gate_up_proj.detach(), module.down_proj.detach()
        for e in torch.nonzero(counts).flatten().tolist():
            n = int(counts[e])
            work.append((torch.randn(n, up.shape[2], dtype=up.dtype), up[e].t(),
                         torch.randn(n, down.shape[2], dtype=down.dtype), down[e].t()))  # fmt: skip

    def once() -> None:
        for x, w1, h, w2 in work:
            torch.mm(x, w1)
            torch.mm(h, w2)

    return time_call(once, repeats=repeats).median_s


def experts_ceiling(peer: dict[str, float], bound_s: float) -> float:
    """The best peer's seconds over them with its experts at the roofline (Amdahl's ceiling).

    ``peer``: the best peer's ``median_s`` and ``experts_s``; ``bound_s``: the experts' roofline
    time, ``max(weight_bytes / read bandwidth, flops / GEMM rate)``. No experts implementation
    can make the model faster than this by its experts alone.
    """
    return peer["median_s"] / (peer["median_s"] - peer["experts_s"] + bound_s)


def hf_part(quick: bool, repeats: int, budget_s: float) -> list[dict[str, object]]:
    """Prefill of 512 tokens and 64 decode steps, per family and experts implementation."""
    from fusekit.hw.detect import gemm_flops_per_s, read_bytes_per_s

    rates = (read_bytes_per_s(), gemm_flops_per_s()[0])
    rows: list[dict[str, object]] = []
    for family in FAMILIES:
        rows += hf_family(family, quick, repeats, budget_s, rates)
    return rows


def hf_family(
    family: Family,
    quick: bool,
    repeats: int,
    budget_s: float,
    rates: tuple[float, float],
) -> list[dict[str, object]]:
    """Both studies of one family, every usable experts implementation on the same model.

    ``rates``: the machine's read bandwidth and GEMM FLOP/s, for :func:`experts_ceiling`.
    """
    model = hf_model(family, quick)
    clock = ExpertsClock()
    clock.attach(model)
    prefill_tokens, prompt_tokens, steps = (64, 8, 8) if quick else (512, 32, 64)
    torch.manual_seed(0)
    prompt = torch.randint(0, 32_000, (1, prefill_tokens))
    short = prompt[:, :prompt_tokens]

    def prefill(name: str, keep: int = 1) -> Callable[[], torch.Tensor]:
        """One forward of the prompt; ``keep=1``: the last position's logits, as generate() asks."""

        def run() -> torch.Tensor:
            model.set_experts_implementation(name)
            with torch.no_grad():
                return model(prompt, logits_to_keep=keep).logits  # type: ignore[no-any-return]

        return run

    def decode(name: str) -> tuple[float, ExpertsClock]:
        """Seconds of ``steps`` greedy steps with the KV cache (the prompt's prefill untimed)."""
        model.set_experts_implementation(name)
        with torch.no_grad():
            out = model(short, use_cache=True)
            cache, token = out.cache, out.logits[:, -1:].argmax(-1)
            clock.reset()
            start = time.perf_counter()
            for _ in range(steps):
                out = model(token, cache=cache, use_cache=True)
                cache, token = out.cache, out.logits[:, -1:].argmax(-1)
            return time.perf_counter() - start, replace(clock)

    check(f"{family.name} prefill", relative_error(prefill("fusekit", 0)(), prefill("eager", 0)()),
          1e-4)  # fmt: skip
    impls = [name for name in IMPLEMENTATIONS if usable(model, name, prompt)]
    problem = f"{family.name} 2 layers"
    experts: dict[str, list[float]] = {name: [] for name in impls}
    bound = [0.0]

    def timed_prefill(name: str) -> Callable[[], object]:
        run = prefill(name)

        def call() -> object:
            clock.reset()
            out = run()
            experts[name].append(clock.seconds)
            bound[0] = max(clock.weight_bytes / rates[0], clock.flops / rates[1])
            return out

        return call

    times = time_impls({name: timed_prefill(name) for name in impls}, repeats, budget_s)
    rows = rows_of("hf", problem, "prefill", times, tokens=prefill_tokens)
    add_experts(rows, {name: statistics.median(ts) for name, ts in experts.items()}, bound[0],
                bare_gemm_s(clock.calls))  # fmt: skip
    print(summary(rows), flush=True)
    runs: dict[str, list[tuple[float, ExpertsClock]]] = {name: [] for name in impls}
    for _ in range(max(1, repeats // 2)):  # interleaved, one warm-up call each first
        for name in impls:
            runs[name].append(decode(name))
    per_token, experts_per_token = {}, {}
    for name, results in runs.items():
        kept = results[1:] or results
        per_token[name] = statistics.median(t for t, _ in kept) / steps
        experts_per_token[name] = statistics.median(c.seconds for _, c in kept) / steps
    last = runs[impls[0]][-1][1]
    decode_bound = max(last.weight_bytes / rates[0], last.flops / rates[1]) / steps
    decode_rows = rows_of("hf", problem, "decode", per_token, tokens=steps)
    add_experts(decode_rows, experts_per_token, decode_bound, bare_gemm_s(last.calls) / steps)
    print(summary(decode_rows), flush=True)
    return rows + decode_rows


def add_experts(
    rows: list[dict[str, object]], experts_s: dict[str, float], bound_s: float, bare_s: float
) -> None:
    """Each row's seconds in the experts; fusekit's row gets the roofline and the ceilings.

    ``experts_roofline_s``: the experts' bound (:class:`ExpertsClock`); ``ceiling_over_best_peer``:
    :func:`experts_ceiling` of the best peer (the speedup the acceptance's ratio cannot exceed).
    ``experts_bare_gemm_s``: :func:`bare_gemm_s`; ``ceiling_bare_gemm_over_best_peer``: the
    ceiling with the experts reduced to ATen's bare GEMMs.
    """
    for row in rows:
        row["experts_s"] = experts_s[str(row["impl"])]
    peers = [r for r in rows if r["impl"] != "fusekit"]
    if not peers:
        return
    best = min(peers, key=lambda r: float(r["median_s"]))  # type: ignore[arg-type]
    for row in rows:
        if row["impl"] == "fusekit":
            row["experts_roofline_s"] = bound_s
            peer = {"median_s": float(best["median_s"]), "experts_s": float(best["experts_s"])}  # type: ignore[arg-type]
            row["ceiling_over_best_peer"] = experts_ceiling(peer, bound_s)
            row["experts_bare_gemm_s"] = bare_s
            row["ceiling_bare_gemm_over_best_peer"] = experts_ceiling(peer, bare_s)


def usable(model: torch.nn.Module, name: str, prompt: torch.Tensor) -> bool:
    """Whether the experts implementation ``name`` runs the prefill on this machine."""
    try:
        model.set_experts_implementation(name)
        with torch.no_grad():
            model(prompt)
    except (RuntimeError, NotImplementedError) as e:  # e.g. out of memory, or no CPU kernel
        print(f"  {name}: left out ({type(e).__name__}: {str(e)[:90]})", flush=True)
        return False
    return True


# ---------------------------------------------------------------- rgcn (training)


def rgcn_part(quick: bool, max_epochs: int) -> list[dict[str, object]]:
    """PyG's entity-classification RGCN trained with PyG's and fusekit's layers."""
    from torch_geometric.nn import RGCNConv as PygRGCNConv

    from fusekit.nn import RGCNConv

    rows: list[dict[str, object]] = []
    for graph in ("aifb",) if quick else ("aifb", "mutag"):
        g = entities(graph)
        results = {}
        init = None
        for impl, conv in (("pyg", PygRGCNConv), ("fusekit", RGCNConv)):
            torch.manual_seed(12345)
            net = torch.nn.ModuleList([
                conv(g.num_nodes, 16, g.num_relations, num_bases=30),
                conv(16, g.num_classes, g.num_relations, num_bases=30),
            ])  # fmt: skip
            init = init or {k: v.clone() for k, v in net.state_dict().items()}
            net.load_state_dict(init)
            results[impl] = train(net, g, 5 if quick else max_epochs)
        for impl, r in results.items():
            rows.append({
                "part": "rgcn", "problem": f"RGCN 2 layers {graph}", "study": "train",
                "impl": impl, "median_s": r["epoch_s"],
                "speedup_over_best_peer": results["pyg"]["epoch_s"] / r["epoch_s"],
                "epochs": r["epochs"], "test_accuracy": r["test_accuracy"],
                "final_loss": r["final_loss"],
            })  # fmt: skip
        print(summary(rows[-2:]), flush=True)
    return rows


def train(net: torch.nn.ModuleList, g: Any, max_epochs: int) -> dict[str, float]:
    """Adam until the loss has not improved by 1e-4 for 10 epochs: per-epoch time, accuracy."""
    opt = torch.optim.Adam(net.parameters(), lr=0.01, weight_decay=0.0005)
    times, best, stale, epochs = [], float("inf"), 0, 0
    loss = torch.zeros(())
    for epochs in range(1, max_epochs + 1):  # noqa: B007
        start = time.perf_counter()
        net.train()
        opt.zero_grad()
        h = torch.relu(net[0](None, g.edge_index, g.edge_type))
        loss = torch.nn.functional.cross_entropy(
            net[1](h, g.edge_index, g.edge_type)[g.train_idx], g.train_y
        )
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
        value = loss.item()
        stale = 0 if value < best - 1e-4 else stale + 1
        best = min(best, value)
        if stale >= 10:
            break
    with torch.no_grad():
        net.eval()
        h = torch.relu(net[0](None, g.edge_index, g.edge_type))
        pred = net[1](h, g.edge_index, g.edge_type).argmax(-1)
    return {
        "epoch_s": statistics.median(times),
        "epochs": epochs,
        "test_accuracy": float((pred[g.test_idx] == g.test_y).float().mean()),
        "final_loss": loss.item(),
    }


# ---------------------------------------------------------------- output


def summary(rows: list[dict[str, object]]) -> str:
    """One line per record set: problem, study, each impl's median and fusekit's speedup."""
    head = f"{rows[0]['problem']} / {rows[0]['study']}:"
    cells = [f"{r['impl']} {1e3 * float(r['median_s']):.2f} ms" for r in rows]  # type: ignore[arg-type]
    mine = [r for r in rows if r["impl"] == "fusekit"]
    speed = f"  fusekit x{float(mine[0]['speedup_over_best_peer']):.2f}" if mine else ""  # type: ignore[arg-type]
    if mine and "ceiling_over_best_peer" in mine[0]:
        speed += f" (ceiling x{float(mine[0]['ceiling_over_best_peer']):.2f})"  # type: ignore[arg-type]
    return f"{head} {', '.join(cells)}{speed}"


def plot(records: list[dict[str, object]], path: Path) -> None:
    """Speedup of fusekit over the best peer, one bar per network and study."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = [r for r in records if r["impl"] == "fusekit"]
    labels = [f"{r['problem']}\n{r['study']}" for r in mine]
    values = [float(r["speedup_over_best_peer"]) for r in mine]  # type: ignore[arg-type]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(mine)), 4.5))
    bars = ax.bar(range(len(mine)), values, color="#3b6ea5")
    ax.bar_label(bars, fmt="%.2fx", fontsize=8)
    ax.axhline(1.0, color="#888", lw=1, ls="--")
    ax.set_yscale("log")  # RGCN's tenfold sits beside ratios near one
    ax.set_xticks(range(len(mine)), labels, rotation=35, ha="right", fontsize=7)
    ax.set_ylabel("speedup over the best peer")
    ax.set_title("fusekit on whole networks (CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="backbone,hf,rgcn")
    parser.add_argument("--quick", action="store_true", help="one scan, narrow experts, AIFB")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--budget", type=float, default=20.0, help="seconds per impl and problem")
    parser.add_argument("--epochs", type=int, default=200, help="most RGCN training epochs")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "networks_cpu.json"
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    target = detect(refresh=True)
    records: list[dict[str, object]] = []
    if "backbone" in parts:
        records += backbone_part(args.quick, args.repeats, args.budget)
    if "hf" in parts:
        records += hf_part(args.quick, args.repeats, args.budget)
    if "rgcn" in parts:
        records += rgcn_part(args.quick, args.epochs)
    path = write_results(
        args.out,
        benchmark="networks",
        title=TITLE,
        meta=run_metadata(target.to_dict()),
        settings={
            "threads": torch.get_num_threads(),
            "parts": sorted(parts),
            "quick": args.quick,
        },
        plots=shown(PLOTS, records),
        tables=shown(TABLES, records),
        records=records,
    )
    plot(records, args.out.with_suffix(".png"))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
