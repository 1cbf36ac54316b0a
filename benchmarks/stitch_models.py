"""Captured memory-bound subgraphs and whole HF models: eager, torch.compile and fusekit (CPU).

Three contenders: eager, ``torch.compile`` (Inductor) and ``torch.compile(backend="fusekit")``.

Models (random weights, float32, small but realistic: 4 layers, hidden 512 or 384): Llama-style
(RMSNorm, SwiGLU, rotary), GPT-2, BERT (masked LM), T5 (encoder-decoder, relative position bias)
and ViT (image classification). Dropout is off, so that every contender's output can be checked
against eager's: fusekit draws its masks in torch's order, as eager does, but Inductor draws
them from its own generator.

Parts:

* ``subgraphs``: each model's forward and backward graphs as AOTAutograd hands them to a backend
  (the decompositions of :func:`fusekit.stitch.dynamo.decompositions`), cut at every
  contraction, attention, embedding or other heavy ATen call into maximal connected regions of
  the rest: the memory-bound subgraphs, captured, not written by hand. Regions that repeat
  (one per layer) are timed once (``count`` says how often the model runs it); regions of fewer
  than two non-view ops are left out. Each region is an FX GraphModule on the values the model
  computed, timed eager, ``torch.compile`` (Inductor) and ``torch.compile(backend="fusekit")``,
  both checked against eager first.
* ``models``: each whole model's forward (eval, ``no_grad``) and training step (forward with the
  loss, backward), the same three ways; ``compile_s`` is the first call's seconds. Two more
  contenders show where the time goes: ``fusekit_mkl`` is the same compiled model with every
  GEMM on eager's MKL call (``FUSEKIT_ONEDNN=0``: stitching alone), and, on the forwards,
  ``compile_freezing`` is Inductor with ``freezing=True`` (weights folded as constants and
  packed for oneDNN, an inference-only mode that is off by default).
* ``optimizer``: one ``torch.optim.AdamW`` step over every parameter of the model, eager
  (torch's foreach implementation), ``torch.compile(opt.step)`` and
  ``torch.compile(opt.step, backend="fusekit")``, each on its own copy of equal parameters and
  gradients, checked against eager after three steps; with the fraction of the streaming
  roofline (7 float32 arrays per element at the measured bandwidth).

Times are medians over rounds in which the three contenders alternate call by call (at least
``3 * --repeats`` rounds and 0.3 s of each one's calls), so that a shared host's drift reaches
all three alike. Writes
``benchmarks/results/stitch_models_cpu.json`` and a plot beside it.

Run: ``.venv/bin/python benchmarks/stitch_models.py [--quick] [--families gpt2,bert]``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import math
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx

from fusekit.report.records import Plot, Summary, run_metadata, write_results

TITLE = (
    "Memory-bound subgraphs captured from the forward and backward of five HF model families, "
    "and the whole models: eager, torch.compile (Inductor) and torch.compile(backend='fusekit') "
    "on the CPU."
)
PLOTS = (
    Plot(title="Captured subgraphs: fusekit over torch.compile", x="problem",
         y="speedup_vs_compile", hue="family", where={"part": "subgraphs"}, log_y=True, ref=1.0),
    Plot(title="Whole models: fusekit over torch.compile", x="problem", y="speedup_vs_compile",
         hue="family", where={"part": "models"}, log_y=True, ref=1.0),
    Plot(title="AdamW step over each model's parameters: fusekit over torch.compile",
         x="problem", y="speedup_vs_compile", hue="family", where={"part": "optimizer"},
         log_y=True, ref=1.0),
)  # fmt: skip
TABLES = (
    Summary(title="Subgraphs: speedup over torch.compile and eager", rows=["family"],
            values=["speedup_vs_compile", "speedup_vs_eager"], where={"part": "subgraphs"}),
    Summary(title="Whole models", rows=["family", "problem"],
            values=["eager_s", "compile_s_median", "fusekit_s", "speedup_vs_compile",
                    "compile_first_s", "fusekit_first_s"], where={"part": "models"}),
    Summary(title="Whole forwards: fusekit's GEMM choice, and Inductor with freezing",
            rows=["family"], values=["compile_s_median", "compile_freezing_s", "fusekit_s",
                                     "fusekit_mkl_s", "speedup_vs_compile",
                                     "speedup_vs_compile_freezing", "speedup_vs_fusekit_mkl"],
            where={"part": "models", "study": "forward"}),
    Summary(title="AdamW step", rows=["family"],
            values=["eager_s", "compile_s_median", "fusekit_s", "speedup_vs_compile",
                    "roofline_fraction", "roofline_fraction_compile", "fusekit_first_s",
                    "compile_first_s"], where={"part": "optimizer"}),
)  # fmt: skip

#: ATen calls that cut a graph into memory-bound regions (they run as ATen in every contender).
HEAVY = frozenset({
    "mm", "bmm", "addmm", "baddbmm", "matmul", "convolution", "convolution_backward",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward", "embedding",
    "embedding_dense_backward", "index_put", "gather", "scatter", "scatter_add", "index",
    "_unsafe_index_put", "nll_loss_forward", "nll_loss_backward", "arange", "iota", "rand",
    "bernoulli", "native_dropout", "full", "scalar_tensor", "empty", "zeros",
})  # fmt: skip
#: Ops that move no data (they do not count towards a region's size).
VIEWS = frozenset({"view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand",
                   "unsqueeze", "squeeze", "slice", "select", "alias", "detach", "split",
                   "as_strided", "clone"})  # fmt: skip


@dataclass(frozen=True)
class Family:
    """A model family: its name, a builder of the model, and a builder of one batch."""

    name: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[], dict[str, torch.Tensor]]


def families(quick: bool) -> list[Family]:
    """The five model families (``quick``: 2 layers, shorter sequences)."""
    import transformers as tf

    layers, seq, batch = (2, 64, 2) if quick else (4, 128, 4)
    gen = torch.Generator().manual_seed(0)

    def tokens(vocab: int) -> torch.Tensor:
        return torch.randint(0, vocab, (batch, seq), generator=gen)

    return [
        Family("llama", lambda: tf.LlamaForCausalLM(tf.LlamaConfig(
            hidden_size=512, intermediate_size=1376, num_hidden_layers=layers,
            num_attention_heads=8, num_key_value_heads=8, vocab_size=8000,
            max_position_embeddings=512)),
            lambda: {"input_ids": (t := tokens(8000)), "labels": t}),
        Family("gpt2", lambda: tf.GPT2LMHeadModel(tf.GPT2Config(
            n_embd=512, n_layer=layers, n_head=8, vocab_size=8000, n_positions=512,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
            lambda: {"input_ids": (t := tokens(8000)), "labels": t}),
        Family("bert", lambda: tf.BertForMaskedLM(tf.BertConfig(
            hidden_size=512, num_hidden_layers=layers, num_attention_heads=8,
            intermediate_size=2048, vocab_size=8000, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0)),
            lambda: {"input_ids": (t := tokens(8000)), "labels": t}),
        Family("t5", lambda: tf.T5ForConditionalGeneration(tf.T5Config(
            d_model=512, d_ff=2048, d_kv=64, num_layers=layers, num_decoder_layers=layers,
            num_heads=8, vocab_size=8000, dropout_rate=0.0, decoder_start_token_id=0,
            pad_token_id=0)),
            lambda: {"input_ids": tokens(8000), "labels": tokens(8000)}),
        Family("vit", lambda: tf.ViTForImageClassification(tf.ViTConfig(
            hidden_size=384, num_hidden_layers=layers, num_attention_heads=6,
            intermediate_size=1536, image_size=64 if quick else 96, patch_size=8,
            num_labels=10, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
            lambda: {"pixel_values": torch.randn(batch * 2, 3, 64 if quick else 96,
                                                 64 if quick else 96, generator=gen),
                     "labels": torch.randint(0, 10, (batch * 2,), generator=gen)}),
    ]  # fmt: skip


# ---------------------------------------------------------------- capture of the ATen graphs


def aten_graphs(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> list[tuple[str, Any]]:
    """The forward and backward ATen graphs of one training step, with every node's value."""
    from torch._dynamo.backends.common import aot_autograd

    from fusekit.stitch.dynamo import decompositions

    graphs: list[tuple[str, Any]] = []

    def recorder(kind: str) -> Callable[..., Any]:
        def compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
            def run(args: list[Any]) -> Any:  # boxed: AOTAutograd passes one list
                if not any(g is gm for _, (g, _v) in graphs):
                    values: dict[torch.fx.Node, Any] = {}

                    class Recording(torch.fx.Interpreter):
                        def run_node(self, n: torch.fx.Node) -> Any:
                            values[n] = out = super().run_node(n)
                            return out

                    out = Recording(gm).run(*args)
                    graphs.append((kind, (gm, values)))
                    return out
                return gm(*args)

            run._boxed_call = True  # type: ignore[attr-defined]
            return run

        return compiler

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=recorder("forward"), bw_compiler=recorder("backward"),
                           decompositions=decompositions)  # fmt: skip
    compiled = torch.compile(model, backend=backend)
    compiled(**inputs).loss.backward()
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    return graphs


def _packet(node: torch.fx.Node) -> str:
    target = node.target
    name = getattr(getattr(target, "_overloadpacket", None), "__name__", "")
    return str(name)


def regions(gm: torch.fx.GraphModule) -> list[list[torch.fx.Node]]:
    """Maximal connected sets of light (not heavy, tensor-valued) call nodes, in graph order."""
    import operator

    light = [
        n for n in gm.graph.nodes
        if n.op == "call_function" and n.target is not operator.getitem
        and _packet(n) not in HEAVY and isinstance(n.meta.get("val"), torch.Tensor)
    ]  # fmt: skip
    parent = {n: n for n in light}

    def find(n: torch.fx.Node) -> torch.fx.Node:
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for n in light:
        for m in n.all_input_nodes:
            if m in parent:
                parent[find(m)] = find(n)
    groups: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for n in light:
        groups.setdefault(find(n), []).append(n)
    return [g for g in groups.values() if sum(_packet(n) not in VIEWS for n in g) >= 2]


def region_module(
    nodes: list[torch.fx.Node], values: dict[torch.fx.Node, Any]
) -> tuple[torch.fx.GraphModule, list[torch.Tensor], str]:
    """A region as a GraphModule, its example inputs, and a key that names its structure."""
    inside = set(nodes)
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    inputs: list[torch.Tensor] = []

    def arg(m: torch.fx.Node) -> torch.fx.Node:
        if m not in env:
            env[m] = graph.placeholder(f"in{len(inputs)}")
            inputs.append(values[m])
        return env[m]

    for n in nodes:
        env[n] = graph.node_copy(n, arg)
    outs = [n for n in nodes if any(u not in inside for u in n.users)]
    graph.output(tuple(env[n] for n in outs))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    key = gm.code + repr([(tuple(x.shape), x.dtype) for x in inputs])
    return gm, inputs, key


# ---------------------------------------------------------------- timing


#: The device the models run on (``--device``).
DEVICE = torch.device("cpu")
#: Most rounds of :func:`time_alternating` (microsecond regions reach ``min_total_s`` late).
MAX_ROUNDS = 3000
#: Seconds of calls each contender gets at least (as three passes of 0.1 s gave before).
TIMED_S = 0.3


def synced(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` followed by a device synchronisation on CUDA (host timers then time the work)."""
    if DEVICE.type != "cuda":
        return fn

    def run() -> Any:
        out = fn()
        torch.cuda.synchronize()
        return out

    return run


def time_alternating(
    fns: dict[str, Callable[[], Any]], rounds: int, min_total_s: float = 0.0
) -> dict[str, float]:
    """Median seconds per contender over rounds of one call each, the contenders in turn.

    A shared host's speed drifts within a tenth of a second; calls that alternate one by one
    expose every contender to the same drift, where passes of many calls each let it land on
    one. At least ``rounds`` rounds, more until every contender has run ``min_total_s``
    (at most :data:`MAX_ROUNDS`); one untimed call each first. Each round starts with the
    next contender, so that none always runs after the same one.
    """
    fns = {k: synced(fn) for k, fn in fns.items()}
    names = list(fns)
    for fn in fns.values():
        fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    totals = dict.fromkeys(fns, 0.0)
    r = 0
    while r < rounds or (r < MAX_ROUNDS and min(totals.values()) < min_total_s):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            fns[name]()
            took = time.perf_counter() - start
            samples[name].append(took)
            totals[name] += took
        r += 1
    return {k: statistics.median(v) for k, v in samples.items()}


def first_call_s(fn: Callable[[], Any]) -> float:
    """Seconds of the first call (compilation included)."""
    start = time.perf_counter()
    synced(fn)()
    return time.perf_counter() - start


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, list | tuple):
        return [t for item in x for t in _tensors(item)]
    return []


def relative_error(got: Any, want: Any) -> float:
    """Largest ``|got - want|`` over the largest finite ``|want|``.

    Equal values (the infinities of a mask, NaN where both are NaN) count as no error.
    """
    errs = []
    for g, w in zip(_tensors(got), _tensors(want), strict=True):
        if not (w.numel() and w.is_floating_point()):
            continue
        g, w = g.double(), w.double()
        same = (g == w) | (g.isnan() & w.isnan())
        diff = torch.where(same, 0.0, (g - w).abs())
        scale = torch.where(w.isfinite(), w.abs(), 0.0).max().clamp_min(1e-30)
        errs.append(float(diff.max() / scale))
    return max(errs, default=0.0)


def subgraph_part(family: Family, repeats: int, limit: int) -> list[dict[str, Any]]:
    """Every distinct memory-bound region of one model's forward and backward."""
    torch.manual_seed(0)
    model = family.build().to(DEVICE).train()
    graphs = aten_graphs(model, {k: v.to(DEVICE) for k, v in family.inputs().items()})
    seen: dict[str, dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    for kind, (gm, values) in graphs:
        for nodes in regions(gm):
            region, inputs, key = region_module(nodes, values)
            if key in seen:
                seen[key]["count"] += 1
                continue
            if sum(r["graph"] == kind for r in rows) >= limit:
                continue
            ops = [_packet(n) for n in nodes if _packet(n) not in VIEWS]
            name = f"{family.name} {kind} {sum(r['graph'] == kind for r in rows)}"
            row: dict[str, Any] = {"part": "subgraphs", "family": family.name, "problem": name,
                                   "graph": kind, "ops": len(ops), "op_names": " ".join(ops),
                                   "count": 1}  # fmt: skip
            seen[key] = row
            try:
                row.update(time_region(region, inputs, repeats))
            except Exception as e:
                traceback.print_exc()
                row["error"] = repr(e)[:300]
            rows.append(row)
            print(f"  {name} ({len(ops)} ops): "
                  + (f"vs compile x{row['speedup_vs_compile']:.2f}, vs eager "
                     f"x{row['speedup_vs_eager']:.2f}" if "error" not in row
                     else row["error"][:100]), flush=True)  # fmt: skip
    return rows


def compare(
    fns: dict[str, Callable[[], Any]],
    want: Any,
    repeats: int,
    extra: dict[str, Callable[[], Any]] | None = None,
) -> dict[str, Any]:
    """Eager, compile and fusekit: first-call seconds, errors against ``want``, medians.

    The medians: :func:`time_alternating` over at least ``3 * repeats`` rounds and 0.3 s of
    each contender's calls. ``extra`` contenders alternate with them; each adds ``<name>_s``,
    ``speedup_vs_<name>`` (fusekit over it) and ``max_rel_err_<name>``.
    """
    extra = extra or {}
    first = {k: first_call_s(fns[k]) for k in ("compile", "fusekit")}
    errors = {k: relative_error(fn(), want) for k, fn in {**fns, **extra}.items() if k != "eager"}
    times = time_alternating({**fns, **extra}, 3 * repeats, TIMED_S)
    row = _timed_row(first, errors, times)
    for k in extra:
        row |= {f"{k}_s": times[k], f"speedup_vs_{k}": times[k] / times["fusekit"],
                f"max_rel_err_{k}": errors[k]}  # fmt: skip
    return row


def _timed_row(
    first: dict[str, float], errors: dict[str, float], times: dict[str, float]
) -> dict[str, Any]:
    """A result row's columns from first-call seconds, errors and medians of the contenders."""
    return {
        "eager_s": times["eager"], "compile_s_median": times["compile"],
        "fusekit_s": times["fusekit"],
        "speedup_vs_compile": times["compile"] / times["fusekit"],
        "speedup_vs_eager": times["eager"] / times["fusekit"],
        "compile_first_s": first["compile"], "fusekit_first_s": first["fusekit"],
        "max_rel_err_fusekit": errors["fusekit"], "max_rel_err_compile": errors["compile"],
    }  # fmt: skip


def time_region(gm: torch.fx.GraphModule, inputs: list[torch.Tensor], repeats: int) -> dict:
    """One region three ways: errors against eager, medians, speedups, first-call seconds."""
    with torch.no_grad():
        want = gm(*inputs)
        torch._dynamo.reset()
        inductor = torch.compile(gm)
        fusekit = torch.compile(gm, backend="fusekit")
        fns = {"eager": lambda: gm(*inputs), "compile": lambda: inductor(*inputs),
               "fusekit": lambda: fusekit(*inputs)}  # fmt: skip
        return compare(fns, want, repeats)


def model_part(family: Family, repeats: int) -> list[dict[str, Any]]:
    """The whole model's forward and training step three ways."""
    rows = []
    for study in ("forward", "training step"):
        torch.manual_seed(0)
        model = family.build().to(DEVICE)
        inputs = {k: v.to(DEVICE) for k, v in family.inputs().items()}
        training = study == "training step"
        model.train(training)

        def step(m: Callable[..., Any], model: Any = model, inputs: Any = inputs,
                 training: bool = training) -> Callable[[], Any]:  # fmt: skip
            def run() -> Any:
                if training:
                    loss = m(**inputs).loss
                    loss.backward()
                    model.zero_grad(set_to_none=True)
                    return loss.detach()
                with torch.no_grad():
                    return m(**inputs).logits

            return run

        torch._dynamo.reset()
        fusekit = step(torch.compile(model, backend="fusekit"))
        fns = {"eager": step(model), "compile": step(torch.compile(model)), "fusekit": fusekit}
        extra = {"fusekit_mkl": with_env(ONEDNN_ENV, "0", fusekit)}
        if not training and DEVICE.type == "cpu":
            extra["compile_freezing"] = frozen(step(torch.compile(model)))
        want = fns["eager"]()
        row = {"part": "models", "family": family.name, "study": study,
               "problem": f"{family.name} {study}",
               **compare(fns, want, repeats, extra)}  # fmt: skip
        print(
            f"  {row['problem']}: eager {row['eager_s'] * 1e3:.1f} ms, compile "
            f"{row['compile_s_median'] * 1e3:.1f} ms, fusekit {row['fusekit_s'] * 1e3:.1f} ms "
            f"(MKL GEMMs {row['fusekit_mkl_s'] * 1e3:.1f} ms); first call "
            f"{row['compile_first_s']:.1f} s / {row['fusekit_first_s']:.1f} s",
            flush=True,
        )
        rows.append(row)
    return rows


#: What turns fusekit's oneDNN linear layers off (:mod:`fusekit.stitch.alone`).
ONEDNN_ENV = "FUSEKIT_ONEDNN"


def with_env(name: str, value: str, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` called with environment variable ``name`` set to ``value`` (then restored)."""

    def run() -> Any:
        before = os.environ.get(name)
        os.environ[name] = value
        try:
            return fn()
        finally:
            if before is None:
                del os.environ[name]
            else:
                os.environ[name] = before

    return run


def frozen(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` under Inductor's ``freezing=True`` (its first call compiles with it)."""
    import torch._inductor.config as inductor_config

    def run() -> Any:
        with inductor_config.patch(freezing=True):
            return fn()

    return run


#: Arrays one AdamW update streams per parameter element: parameter, gradient and both moments
#: read; parameter and moments written.
ADAMW_ARRAYS = 7


def optimizer_part(family: Family, repeats: int) -> list[dict[str, Any]]:
    """One AdamW step over every parameter of the model, three ways, from equal states.

    Each contender steps its own copy of the parameters (same values, same gradients); after
    three steps its parameters are compared with eager's. ``roofline_fraction``: the step's
    streaming bytes (:data:`ADAMW_ARRAYS` float32 arrays per element) at the measured bandwidth
    over fusekit's median.
    """
    from fusekit.hw import detect
    from fusekit.hw.detect_gpu import detect_gpu

    torch.manual_seed(0)
    base = family.build().to(DEVICE)
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    grads = [torch.randn(p.shape, generator=gen, device=DEVICE) * 1e-2 for p in base.parameters()]
    states = {}
    for name in ("eager", "compile", "fusekit"):
        params = [torch.nn.Parameter(p.detach().clone()) for p in base.parameters()]
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
        backend = {"compile": "inductor", "fusekit": "fusekit"}.get(name)
        step = opt.step if backend is None else torch.compile(opt.step, backend=backend)
        states[name] = (params, step)
    torch._dynamo.reset()
    fns = {name: step for name, (_, step) in states.items()}
    first = {k: first_call_s(fns[k]) for k in ("compile", "fusekit")}
    fns["eager"]()
    for _ in range(2):
        for fn in fns.values():
            fn()
    want = [p.detach() for p in states["eager"][0]]
    errors = {k: relative_error([p.detach() for p in states[k][0]], want)
              for k in ("compile", "fusekit")}  # fmt: skip
    times = time_alternating(fns, 3 * repeats, TIMED_S)
    elements = sum(p.numel() for p in base.parameters())
    bw = (detect() if DEVICE.type == "cpu" else detect_gpu()).mem_bw_bytes_per_s
    row = {
        "part": "optimizer", "family": family.name, "problem": f"{family.name} AdamW step",
        "parameters": len(grads), "elements": elements, **_timed_row(first, errors, times),
        "roofline_fraction": ADAMW_ARRAYS * 4 * elements / bw / times["fusekit"],
        "roofline_fraction_compile": ADAMW_ARRAYS * 4 * elements / bw / times["compile"],
    }  # fmt: skip
    print(f"  {row['problem']} ({len(grads)} parameters): eager {times['eager'] * 1e3:.1f} ms, "
          f"compile {times['compile'] * 1e3:.1f} ms, fusekit {times['fusekit'] * 1e3:.1f} ms "
          f"(roofline {row['roofline_fraction']:.2f}); first call {first['compile']:.1f} s / "
          f"{first['fusekit']:.1f} s", flush=True)  # fmt: skip
    return [row]


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def _finite(record: dict[str, Any]) -> dict[str, Any]:
    """A record with non-finite numbers (a NaN output's error) named in ``error`` instead."""
    bad = [k for k, v in record.items() if isinstance(v, float) and not math.isfinite(v)]
    if not bad:
        return record
    kept = {k: v for k, v in record.items() if k not in bad}
    return {**kept, "error": f"{', '.join(bad)}: not finite (NaN or inf in the output)"}


def write(path: Path, records: list[dict[str, Any]], settings: dict[str, Any]) -> None:
    """The results file, with the summary numbers over the subgraphs timed so far."""
    records = [_finite(r) for r in records]
    timed = [r for r in records if r["part"] == "subgraphs" and "speedup_vs_compile" in r
             and "error" not in r]  # fmt: skip
    settings = {**settings, "subgraphs": len(timed)}
    if timed:  # a run of the whole models only has no summary over subgraphs
        settings["geomean_vs_compile"] = _geomean([r["speedup_vs_compile"] for r in timed])
        settings["min_vs_compile"] = min(r["speedup_vs_compile"] for r in timed)
        settings["geomean_vs_eager"] = _geomean([r["speedup_vs_eager"] for r in timed])
    print({k: v for k, v in settings.items() if k != "families"}, flush=True)
    parts = {r["part"] for r in records if "speedup_vs_compile" in r}
    write_results(path, benchmark="stitch_models", title=TITLE, meta=run_metadata(),
                  records=records, settings=settings,
                  plots=tuple(p for p in PLOTS if p.where["part"] in parts),
                  tables=tuple(t for t in TABLES if t.where["part"] in parts))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default="llama,gpt2,bert,t5,vit")
    parser.add_argument("--parts", default="subgraphs,models,optimizer")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--limit",
        type=int,
        default=5,
        help="distinct regions per model and graph (forward, backward)",
    )
    parser.add_argument("--quick", action="store_true", help="2 layers, short sequences")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results"
                        / "stitch_models_cpu.json")  # fmt: skip
    args = parser.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    torch.set_num_threads(os.cpu_count() or 1)
    wanted = args.families.split(",")
    records: list[dict[str, Any]] = []
    for family in (f for f in families(args.quick) if f.name in wanted):
        print(f"== {family.name}", flush=True)
        if "subgraphs" in args.parts:
            try:
                records += subgraph_part(family, args.repeats, args.limit)
            except Exception as e:  # a family that does not build or capture: named, not fatal
                traceback.print_exc()
                records.append({"part": "subgraphs", "family": family.name, "error": repr(e)[:300]})
        if "models" in args.parts:
            try:
                records += model_part(family, args.repeats)
            except Exception as e:
                traceback.print_exc()
                records.append({"part": "models", "family": family.name, "error": repr(e)[:300]})
        if "optimizer" in args.parts:
            try:
                records += optimizer_part(family, args.repeats)
            except Exception as e:
                traceback.print_exc()
                records.append({"part": "optimizer", "family": family.name,
                                "error": repr(e)[:300]})  # fmt: skip
        write(args.out, records, {"families": wanted, "repeats": args.repeats,
                                  "quick": args.quick, "device": str(DEVICE)})  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
