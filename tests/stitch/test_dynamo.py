"""``torch.compile(model, backend="fusekit")`` against eager: forward, backward, new shapes,
graph breaks, and the options it refuses."""

import pytest
import torch

import fusekit.stitch.dynamo as dynamo


class Block(torch.nn.Module):
    """Linear -> LayerNorm -> GELU -> dropout -> Linear -> dropout -> cross-entropy, with an
    optional graph break; the dropouts draw from torch's generator in training."""

    def __init__(self, graph_break: bool = False) -> None:
        super().__init__()
        self.a = torch.nn.Linear(32, 64)
        self.norm = torch.nn.LayerNorm(64)
        self.b = torch.nn.Linear(64, 8)
        self.drop = torch.nn.Dropout(0.2)
        self.graph_break = graph_break

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.drop(torch.nn.functional.gelu(self.norm(self.a(x))))
        if self.graph_break:
            torch._dynamo.graph_break()
        return torch.nn.functional.cross_entropy(self.drop(self.b(h)), y)


@pytest.fixture
def compiled_graphs(monkeypatch):
    """Every StitchedGraph the backend makes in the test."""
    made = []
    real = dynamo.GraphCompiler.__call__

    def record(self, gm, example_inputs):
        graph = real(self, gm, example_inputs)
        made.append(graph)
        return graph

    monkeypatch.setattr(dynamo.GraphCompiler, "__call__", record)
    torch._dynamo.reset()
    yield made
    torch._dynamo.reset()


def _loss_and_grads(fn, module, *args):
    """``(loss, parameter gradients)`` through the backend, then the same eagerly.

    ``fn(*args)`` returns a scalar loss of ``module``'s parameters.
    """
    got = torch.compile(fn, backend="fusekit")(*args)
    got.backward()
    got_grads = [p.grad.clone() for p in module.parameters()]
    module.zero_grad()
    want = fn(*args)
    want.backward()
    return (got, got_grads), (want, [p.grad for p in module.parameters()])


def test_the_backend_is_registered_by_the_entry_point():
    assert "fusekit" in torch._dynamo.list_backends()


def test_unknown_options_are_refused():
    torch._dynamo.reset()
    f = torch.compile(torch.nn.Linear(2, 2), backend="fusekit", options={"mode": "max"})
    with pytest.raises(Exception, match="'mode'"):
        f(torch.randn(3, 2))


@pytest.mark.parametrize(
    "graph_break",
    [False, pytest.param(True, marks=pytest.mark.slow)],  # two graphs: twice the compiling
    ids=["one graph", "graph break"],
)
def test_training_equals_eager_forward_and_backward(compiled_graphs, graph_break):
    torch.manual_seed(0)
    model = Block(graph_break)
    compiled = torch.compile(model, backend="fusekit")
    for rows in (16, 24):  # a new size: dynamo recompiles with symbolic sizes, planned per shape
        x, y = torch.randn(rows, 32), torch.randint(0, 8, (rows,))
        torch.manual_seed(rows)  # the same dropout masks as eager: torch's RNG order
        loss = compiled(x, y)
        loss.backward()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        torch.manual_seed(rows)
        want_loss = model(x, y)
        want_loss.backward()
        torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-6)
        for g, w in zip(got, (p.grad for p in model.parameters()), strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
        model.zero_grad()
    planned = [p for g in compiled_graphs for p in [g._static, *g.plans.values()] if p]
    assert planned and all(p.plan is not None for p in planned), [p.reason for p in planned]
    assert any(p.plan.kernels < len(p.plan.graph.ops) for p in planned)  # something fused


def test_inference_under_no_grad(compiled_graphs):
    torch.manual_seed(0)
    model = Block().eval()
    x, y = torch.randn(16, 32), torch.randint(0, 8, (16,))
    with torch.no_grad():
        got = torch.compile(model, backend="fusekit")(x, y)
        torch.testing.assert_close(got, model(x, y), rtol=1e-5, atol=1e-6)
    assert compiled_graphs and compiled_graphs[0]._static.plan is not None


@pytest.mark.slow
def test_gpt2_training_losses_equal_eager():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256,
                                     n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0)  # fmt: skip
    tokens = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(0))

    def losses(compile_it: bool) -> list[float]:
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(config).train()
        step = torch.compile(model, backend="fusekit") if compile_it else model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        out = []
        for _ in range(20):
            loss = step(tokens, labels=tokens).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(loss.item())
        return out

    torch._dynamo.reset()
    want = losses(False)
    got = losses(True)
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-4, (got, want)


def test_the_explicit_entry_point_prints_its_plan():
    import fusekit.stitch

    torch.manual_seed(0)
    model = torch.nn.LayerNorm(64).eval()
    x = torch.randn(8, 64)
    stitched = fusekit.stitch.compile(model, (x,))
    with torch.no_grad():
        torch.testing.assert_close(stitched(x), model(x))
    text = str(stitched)
    assert "kernels" in text and "regional" in text


def test_attention_is_one_aten_call_forward_and_backward(compiled_graphs):
    from fusekit.stitch.runner import OpaqueCall

    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 32, 16, requires_grad=True) for _ in range(3))
    want = Attention()(q, k, v)
    want.square().sum().backward()
    want_grads = [t.grad for t in (q, k, v)]
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    got = torch.compile(Attention(), backend="fusekit")(q, k, v)
    got.square().sum().backward()
    torch.testing.assert_close(got, want)
    for t, w in zip((q, k, v), want_grads, strict=True):
        torch.testing.assert_close(t.grad, w)
    # the forward's two outputs and the backward's three gradients: one call each
    for graph in compiled_graphs:
        (kernel,) = graph._static.compiled.kernels
        assert isinstance(kernel, OpaqueCall)


def test_layer_norm_forward_is_one_stitched_kernel(compiled_graphs):
    """LayerNorm decomposes to ``var_mean`` and elementwise ops: none is left opaque, and the
    two row reductions and the normalisation run as one kernel."""
    from fusekit.ir import OpKind

    torch.manual_seed(0)
    model = torch.nn.LayerNorm(64).eval()
    x = torch.randn(32, 64)
    with torch.no_grad():
        got = torch.compile(model, backend="fusekit")(x)
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-6)
    (graph,) = compiled_graphs
    plan = graph._static.plan
    assert not [op.name for op in plan.graph.ops if op.kind is OpKind.OPAQUE]
    assert plan.kernels == 1, plan.describe()


def test_an_unknown_target_is_an_error_not_a_silent_fallback():
    torch._dynamo.reset()
    f = torch.compile(torch.nn.Linear(2, 2), backend="fusekit", options={"target": "tpu-v9"})
    with pytest.raises(Exception, match="tpu-v9"):
        f(torch.randn(3, 2))


def test_a_conv_whose_input_needs_no_gradient_trains(compiled_graphs):
    # a ViT's patch embedding: convolution_backward with output_mask [False, True, True]
    # returns no input gradient; its weight and bias gradients are outputs 1 and 2
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 4, stride=4)
    x = torch.randn(2, 3, 16, 16)
    (_, got), (_, want) = _loss_and_grads(lambda x: conv(x).square().sum(), conv, x)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert all(g._static is not None and g._static.plan is not None for g in compiled_graphs)


def test_an_adamw_step_is_one_kernel_per_parameter(compiled_graphs):
    # torch's AdamW decomposes to fma, lerp-like maps and a copy back into each parameter: no
    # op left opaque; each parameter's moments and update are one memory-bound kernel
    from fusekit.ir import OpKind

    torch.manual_seed(0)
    make = lambda: torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32))  # noqa: E731
    models = [make(), make()]
    models[1].load_state_dict(models[0].state_dict())
    optims = [torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1) for m in models]
    steps = [optims[0].step, torch.compile(optims[1].step, backend="fusekit")]
    for i in range(3):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(i))
        for model, opt, step in zip(models, optims, steps, strict=True):
            model(x).square().mean().backward()
            step()
            opt.zero_grad()
    for want, got in zip(models[0].parameters(), models[1].parameters(), strict=True):
        # Adam divides by sqrt(v): float32 rounding of a tiny v shows at 1e-5 after three steps
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    plans = [g._static.plan for g in compiled_graphs if g._static is not None]
    (plan,) = [p for p in plans if p is not None and len(p.graph.ops) > 20]
    assert not [op.name for op in plan.graph.ops if op.kind is OpKind.OPAQUE]
    assert plan.kernels == len(list(models[1].parameters())), plan.describe()


def test_group_norm_trains_decomposed(compiled_graphs):
    from fusekit.ir import OpKind

    torch.manual_seed(0)
    norm = torch.nn.GroupNorm(4, 16)
    x = torch.randn(2, 16, 8, 8, requires_grad=True)
    got = torch.compile(norm, backend="fusekit")(x)
    got.square().sum().backward()
    grads = [x.grad.clone(), *(p.grad.clone() for p in norm.parameters())]
    x.grad = None
    norm.zero_grad()
    want = norm(x)
    want.square().sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g, w in zip(grads, [x.grad, *(p.grad for p in norm.parameters())], strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    ops = [op for g in compiled_graphs for op in g._static.plan.graph.ops]
    assert "native_group_norm" not in " ".join(
        str(op.expr) for op in ops if op.kind is OpKind.OPAQUE
    )


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_with_label_smoothing_trains_decomposed(compiled_graphs, smoothing):
    # log_softmax, the target's log-probability and the smoothing term (the mean of every
    # log-probability) with an ignored target: stitched, forward and backward, equal to eager
    from fusekit.ir import OpKind

    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50)

    def loss(x, y):
        return torch.nn.functional.cross_entropy(head(x), y, label_smoothing=smoothing,
                                                 ignore_index=3)  # fmt: skip

    x, y = torch.randn(12, 16), torch.randint(0, 50, (12,))
    y[2] = 3  # ignored: no loss, no gradient
    (got, grads), (want, want_grads) = _loss_and_grads(loss, head, x, y)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for g, w in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    plans = [p.plan for g in compiled_graphs for p in [g._static, *g.plans.values()] if p]
    opaque = " ".join(str(op.expr) for p in plans for op in p.graph.ops if op.kind is OpKind.OPAQUE)
    assert "cross_entropy" not in opaque and "log_softmax" not in opaque, opaque
    assert all(p is not None for p in plans) and any(p.kernels < len(p.graph.ops) for p in plans)


def test_gradcheck_in_float64(compiled_graphs):
    """``torch.autograd.gradcheck`` through the backend: float64 kernels, forward and backward,
    are exact enough for finite differences (GELU, sigmoid, log, LayerNorm and softmax)."""
    f = torch.nn.functional

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = f.gelu(x) * torch.sigmoid(x) + torch.log(x.abs() + 1.0) * w
        return torch.softmax(f.layer_norm(y, (y.shape[-1],)), -1)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(torch.compile(fn, backend="fusekit"), (x, w))
    planned = [p for c in compiled_graphs for p in (c._static, *c.plans.values()) if p]
    assert len(planned) == 2 and all(p.plan is not None and p.plan.kernels for p in planned)


def test_a_kernel_expecting_strided_inputs_compiles_that_variant_ahead(
    compiled_graphs, monkeypatch
):
    # an input dynamo sees transposed is read in place by a variant of its kernel: generated
    # with the plan and handed to the compile workers, not compiled at the first call
    import fusekit.stitch.runner as runner
    from fusekit.stitch.codegen.cpu import CpuKernel

    jobs: list[str] = []
    real = runner.precompile

    def record(js: list[tuple[str, int]]) -> int:
        jobs.extend(code for code, _ in js)
        return real(js)

    monkeypatch.setattr(runner, "precompile", record)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * 2.0, dim=-1)

    x = torch.randn(6, 5, 32, generator=torch.Generator().manual_seed(0)).transpose(0, 1)
    got = torch.compile(fn, backend="fusekit")(x)
    torch.testing.assert_close(got, fn(x))
    (graph,) = compiled_graphs
    (kernel,) = [k for k in graph._static.compiled.kernels if isinstance(k, CpuKernel)]
    key = (x.stride(),)
    assert key in kernel._variants and kernel._variants[key].code in jobs
    assert len(kernel._variants) == 2  # the call found the variant made with the plan


def _mutate_scale_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.mul_(2.0).add_(y)
    return x * 3.0


def _mutate_flipped(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.copy_(x.flip(-1) + y)  # reads x at other elements than it writes
    return y * 2.0


def _mutate_centred(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.sub_(x.mean(-1, keepdim=True)).mul_(y)  # a reduction over what it overwrites
    return x + 1.0


@pytest.mark.parametrize(
    ("fn", "in_place"),
    [(_mutate_scale_add, True), (_mutate_flipped, None), (_mutate_centred, False)],
    ids=["elementwise", "flipped", "reduced"],
)
def test_input_mutations_are_written_in_place_only_where_safe(compiled_graphs, fn, in_place):
    # AOTAutograd keeps an inference graph's input mutations as copy_ at its end; a kernel
    # that reads the input only at the element it writes writes it there, others copy after
    from fusekit.stitch.codegen.cpu import CpuKernel

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 48, generator=g), torch.randn(16, 48, generator=g)
    want_x, got_x = x.clone(), x.clone()
    compiled = torch.compile(fn, backend="fusekit")
    with torch.no_grad():
        want = fn(want_x, y)
        ptr = got_x.data_ptr()
        got = compiled(got_x, y)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_x, want_x)
    assert got_x.data_ptr() == ptr
    kernels = [k for graph in compiled_graphs for k in graph._static.compiled.kernels
               if isinstance(k, CpuKernel)]  # fmt: skip
    if in_place is not None:  # the flip may run apart (then its add writes x in place)
        assert any(k.into for k in kernels) is in_place
    with torch.no_grad():  # a second call, on the tensor it wrote
        torch.testing.assert_close(compiled(got_x, y), fn(want_x, y))
    torch.testing.assert_close(got_x, want_x)


def test_an_adamw_step_updates_parameters_and_moments_in_place(compiled_graphs):
    from fusekit.stitch.codegen.cpu import CpuKernel

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(64, 48)), torch.nn.Parameter(torch.randn(48))]
    want = [p.detach().clone().requires_grad_() for p in params]
    opts = [torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1) for ps in (params, want)]
    step = torch.compile(opts[0].step, backend="fusekit")
    for i in range(3):
        g = torch.Generator().manual_seed(i)
        for p, q in zip(params, want, strict=True):
            p.grad = torch.randn(p.shape, generator=g)
            q.grad = p.grad.clone()
        step()
        opts[1].step()
    for p, q in zip(params, want, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
        for key, value in opts[1].state[q].items():
            torch.testing.assert_close(opts[0].state[p][key], value, rtol=1e-4, atol=1e-5)
    kernels = [k for graph in compiled_graphs for k in graph._static.compiled.kernels
               if isinstance(k, CpuKernel)]  # fmt: skip
    written = {t for k in kernels for t in k.into.values()}
    # each parameter, its two moments and its step count: 4 inputs per parameter
    assert len(written) == 4 * len(params)


def test_a_write_in_place_waits_for_the_readers_of_the_inputs_views():
    # a transposed view of x read after x's new value is computed must see the old x: the
    # views of a written input count as its readers
    from torch.fx.experimental.proxy_tensor import make_fx

    from fusekit.ir.capture import capture_graph
    from fusekit.stitch.runner import _may_alias

    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.t().reshape(-1) + y, x * 2.0

    x, y = torch.randn(6, 4), torch.randn(24)
    graph = capture_graph(make_fx(fn)(x, y), [x, y]).graph
    (name, _) = graph.inputs
    aliases = _may_alias(graph, name)
    views = {op.name for op in graph.ops if graph.moves_only(op.name)}
    assert views and views <= aliases
    computed = {op.name for op in graph.ops if op.name not in views}  # the add and the mul
    assert computed and not computed & aliases

    def mutate(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        old = x.t().reshape(-1) + y
        x.mul_(2.0)
        return old

    want_x, got_x = x.clone(), x.clone()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(mutate, backend="fusekit")(got_x, y),
                                   mutate(want_x, y))  # fmt: skip
    torch.testing.assert_close(got_x, want_x)


def _count_general_runs(monkeypatch) -> list[int]:
    """A list that grows by one at each call through ``PlannedGraph.run`` (the general path)."""
    from fusekit.stitch.runner import PlannedGraph

    calls: list[int] = []
    real = PlannedGraph.run

    def counted(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(PlannedGraph, "run", counted)
    return calls


def test_a_graph_of_one_chain_runs_straight_from_its_arguments(compiled_graphs, monkeypatch):
    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.view(-1), torch.nn.functional.silu(x) * y, (x * y).sum(-1)

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)
    compiled = torch.compile(f, backend="fusekit")
    calls = _count_general_runs(monkeypatch)
    with torch.no_grad():
        for k in range(4):  # new values each call: nothing is cached across calls
            got, want = compiled(x + k, y - k), f(x + k, y - k)
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    (graph,) = compiled_graphs
    (step,) = graph._static.compiled.steps
    assert type(step[0]).__name__ == "Chain"
    assert len(calls) == 1  # the first call settles the plan and chains it; then straight


def test_a_backward_of_one_chain_returns_none_for_inputs_without_gradient(
    compiled_graphs, monkeypatch
):
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * w).sum()

    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, generator=g)
    compiled = torch.compile(f, backend="fusekit")
    calls = _count_general_runs(monkeypatch)
    for _ in range(4):
        w = torch.randn(16, generator=g, requires_grad=True)
        want_w = w.detach().clone().requires_grad_()
        compiled(x, w).backward()
        f(x, want_w).backward()
        torch.testing.assert_close(w.grad, want_w.grad, rtol=1e-5, atol=1e-6)
    assert len(compiled_graphs) == 2  # forward and backward
    assert len(calls) == 2  # the first of each; then straight


class _EmbedAndLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.head = torch.nn.Linear(16, 50)

    def forward(self, tokens, labels):
        logits = self.head(self.emb(tokens))
        return torch.nn.functional.cross_entropy(logits.view(-1, 50), labels.view(-1))


def test_embeddings_and_losses_run_by_aten_not_the_interpreter(compiled_graphs):
    # forward and backward through the backend: the embedding, the target logit and the
    # embedding's gradient are each one ATen call (stitch.alone.AtenIndexing), none interpreted
    torch.manual_seed(0)
    model = _EmbedAndLoss()
    tokens, labels = torch.randint(0, 50, (4, 8)), torch.randint(0, 50, (4, 8))
    (loss, got), (want, want_grads) = _loss_and_grads(model, model, tokens, labels)
    torch.testing.assert_close(loss, want)
    for g, w in zip(got, want_grads, strict=True):
        torch.testing.assert_close(g, w)
    planned = [p.compiled for g in compiled_graphs for p in [g._static, *g.plans.values()] if p]
    kinds = [type(k).__name__ for pg in planned if pg is not None for k in pg.kernels]
    assert kinds.count("AtenIndexing") >= 3 and "_Alone" not in kinds
