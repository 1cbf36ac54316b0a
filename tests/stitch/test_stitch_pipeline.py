import logging

import pytest
import torch

from fusekit.hw import CPUTarget, detect
from fusekit.ir import capture
from fusekit.ir.text import parse_graph
from fusekit.stitch.classify import OpClass, classify_graph, dominant_ops
from fusekit.stitch.codegen.cpu import CpuKernel
from fusekit.stitch.model import estimate, tensor_bytes
from fusekit.stitch.runner import PlannedGraph, Stitched, _merged_epilogues, reference_group
from fusekit.stitch.schemes import Role, Scheme, Unfusable, analyze
from fusekit.stitch.search import plan
from fusekit.stitch.workloads import NAMES, load_workload


@pytest.fixture(scope="module")
def target() -> CPUTarget:
    return detect()


def _graph(name: str):
    w = load_workload(name, small=True)
    return w, capture(w.module, w.args)


def test_classify_layernorm_backward():
    _, cap = _graph("layernorm_bwd")
    classes = classify_graph(cap.graph)
    assert classes["mean1"] is OpClass.ROW_REDUCE
    assert classes["sum1"] is OpClass.COL_REDUCE
    assert classes["unsqueeze"] is OpClass.LAYOUT
    assert OpClass.BROADCAST in classes.values()
    assert {"mean1", "mean2", "sum1", "sum2"} <= set(dominant_ops(cap.graph))


def test_classify_gemm_in_attention():
    _, cap = _graph("attention_core")
    assert classify_graph(cap.graph)["bmm"] is OpClass.GEMM


def test_layernorm_is_regional_three_stages():
    _, cap = _graph("layernorm_fwd")
    lay = analyze(cap.graph, [op.name for op in cap.graph.ops])
    assert lay.scheme is Scheme.REGIONAL
    assert sum(1 for s in lay.steps if hasattr(s, "ops")) == 3
    # x - mean, read by the variance and the output stages, is one subtraction: recomputed
    assert lay.buffered == frozenset()
    assert lay.roles["layer_norm_mean"] is Role.ROW_REDUCE


def test_an_expensive_value_read_by_a_later_stage_is_buffered():
    g = parse_graph(
        """
        input x: float32[64,128]
        tensor e: float32[64,128]
        tensor s: float32[64]
        tensor y: float32[64,128]
        e[i,j] = exp(x[i,j])
        s[i] = sum_j e[i,j]
        y[i,j] = e[i,j] / s[i]
        output y
        """
    )
    lay = analyze(g, [op.name for op in g.ops])
    assert lay.buffered == {"e"}


def test_sibling_reductions_share_one_global_kernel():
    _, cap = _graph("sibling_reductions")
    lay = analyze(cap.graph, [op.name for op in cap.graph.ops])
    assert lay.scheme is Scheme.GLOBAL
    assert {lay.roles[o] for o in lay.ops} == {Role.ROW_REDUCE, Role.COL_REDUCE}


def test_contraction_is_unfusable():
    _, cap = _graph("attention_core")
    with pytest.raises(Unfusable, match="contraction"):
        analyze(cap.graph, ["bmm", "mul"])


def test_cost_model_by_hand():
    w, cap = _graph("bias_gelu")
    g = cap.graph
    target = CPUTarget(
        name="t",
        description="",
        source="test",
        peak_flops_per_s={"fp32": 1e12},
        mem_bw_bytes_per_s=1e10,
        mem_bytes=1 << 34,
        launch_overhead_s=1e-6,
        cores=2,
        threads=2,
        l1d_bytes=32768,
        l2_bytes=1 << 20,
        l3_bytes=0,
        simd_width_bits=256,
    )
    lay = analyze(g, ["add", "gelu"])
    cost = estimate(g, ["add", "gelu"], target, lay)
    n, c = w.args[0].shape
    # reads x [n, c] and b [c], writes gelu [n, c], 4 bytes each; no buffers
    assert cost.dram_bytes == 4 * (2 * n * c + c)
    assert cost.memory_s == pytest.approx(cost.dram_bytes / 1e10)
    # add: 1 node, gelu: 8 (transcendental), per element
    assert cost.flops == 9 * n * c
    assert cost.total_s == pytest.approx(max(cost.memory_s, cost.compute_s) + 1e-6)
    assert tensor_bytes(g, "gelu") == 4 * n * c


@pytest.mark.parametrize("name", NAMES)
def test_planned_workload_matches_eager(name, target):
    w = load_workload(name, small=True)
    stitched = Stitched(w.module, target)
    cap, planned = stitched.prepare(*w.args)
    p = planned.plan
    assert p.objective_s <= p.greedy_s + 1e-12
    assert p.objective_s <= p.unfused_s + 1e-12
    assert p.bound_s <= p.objective_s + 1e-12
    with torch.no_grad():
        out, ref = stitched(*w.args), w.module(*w.args)
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    for a, b in zip(outs, refs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)  # fp32, reassociated sums
    values = {**cap.values(*w.args)}
    env = dict(values)
    merged = _merged_epilogues(p.graph, p.groups)
    kernels = iter(planned.kernels)
    for group in p.groups:
        if isinstance(merged.get(next(iter(group.ops))), str):
            # a GEMM that runs with its epilogue add, in the add's kernel
            env.update(reference_group(p.graph, group.ops, env))
            continue
        kernel = next(kernels)
        got = kernel(env)
        want = reference_group(p.graph, group.ops, env)
        for k, v in want.items():
            torch.testing.assert_close(got[k], v, rtol=1e-4, atol=1e-4)
        if isinstance(kernel, CpuKernel):  # the other variant: threads (prange) or serial
            other = CpuKernel(p.graph, kernel.layout, serial=not kernel.serial)(env)
            for k, v in want.items():
                torch.testing.assert_close(other[k], v, rtol=1e-4, atol=1e-4)
        env.update(got)
    assert next(kernels, None) is None


def test_unfusable_ops_run_alone(target):
    _, cap = _graph("attention_core")
    p = plan(cap.graph, target)
    alone = [g for g in p.groups if g.layout is None]
    assert {o for g in alone for o in g.ops} == {"bmm", "bmm_1"}
    assert all(g.reason for g in alone)


def test_time_limit_returns_a_plan_with_a_warning(target, caplog):
    _, cap = _graph("bert")
    with caplog.at_level(logging.WARNING):
        p = plan(cap.graph, target, time_limit_s=1e-9)
    assert p.timed_out
    assert "time limit" in caplog.text
    assert p.objective_s == pytest.approx(p.greedy_s)
    assert p.graph.find_quotient_cycle([g.ops for g in p.groups]) is None


def test_greedy_method(target):
    _, cap = _graph("layernorm_bwd")
    p = plan(cap.graph, target, method="greedy")
    assert p.method == "greedy"
    with pytest.raises(ValueError, match="method"):
        plan(cap.graph, target, method="nope")


def test_shape_change_replans_or_raises(target):
    w = load_workload("masked_softmax", small=True)
    stitched = Stitched(w.module, target)
    s, mask = w.args
    s2, mask2 = torch.randn(1, 2, 8, 8), torch.zeros(1, 1, 1, 8)
    torch.testing.assert_close(stitched(s2, mask2), w.module(s2, mask2), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(stitched(s, mask), w.module(s, mask), rtol=1e-4, atol=1e-5)
    assert len(stitched.compiled) == 2
    cap, planned = stitched.prepare(s, mask)
    assert isinstance(planned, PlannedGraph)
    with pytest.raises(ValueError, match="plan again"):
        planned.run(cap.values(s2, mask2))


def test_kernel_inputs_non_contiguous_or_foreign(target):
    """Kernels read raw memory: strided inputs are copied, wrong dtypes raise."""
    w = load_workload("bias_gelu", small=True)
    x, b = w.args
    stitched = Stitched(w.module, target)
    xt = x.t().contiguous().t()  # same values, column-major strides
    with torch.no_grad():
        torch.testing.assert_close(stitched(xt, b), w.module(x, b), rtol=1e-4, atol=1e-4)
    cap, planned = stitched.prepare(x, b)
    (kernel,) = [k for k in planned.kernels if isinstance(k, CpuKernel)]
    values = {**cap.values(x, b)}
    values[kernel.layout.inputs[0]] = values[kernel.layout.inputs[0]].double()
    with pytest.raises(ValueError, match="float32 CPU tensor"):
        kernel(values)


def test_ops_that_share_no_loops_are_not_one_kernel():
    # two unrelated elementwise ops side by side would iterate the product of their spaces
    class Apart(torch.nn.Module):
        def forward(self, a, b):
            return a.exp() * 2.0, b.sin() + 1.0

    cap = capture(Apart(), (torch.randn(64, 32), torch.randn(16, 8)))
    ops = [op.name for op in cap.graph.ops]
    with pytest.raises(Unfusable, match="share no loops"):
        analyze(cap.graph, ops)


def test_a_chain_that_ends_in_views_is_still_one_kernel():
    # a SwiGLU backward as AOTAutograd hands it over: the chain's result is reshaped and
    # transposed for the next GEMM; the views must not keep the chain from fusing
    class Chain(torch.nn.Module):
        def forward(self, g, up, x):
            s = torch.sigmoid(x)
            out = (g * up) * s * (x * (1 - s) + 1)
            return out.view(-1, out.shape[-1]).t()

    args = tuple(torch.randn(2, 8, 16) for _ in range(3))
    cap = capture(Chain(), args)
    p = plan(cap.graph, detect())
    computed = [g for g in p.groups if any(not p.graph.op(o).is_layout for o in g.ops)]
    assert len(computed) == 1, p.describe()


def test_a_view_and_its_transpose_both_returned_are_views_not_copies():
    from fusekit.stitch.alone import LayoutViews

    class Both(torch.nn.Module):
        def forward(self, x):
            v = (x * 2.0).view(-1, x.shape[-1])
            return v, v.t()

    x = torch.randn(2, 8, 16)
    cap = capture(Both(), (x,))
    planned = PlannedGraph(plan(cap.graph, detect()), cap.constants)
    assert any(isinstance(k, LayoutViews) for k in planned.kernels)
    out = planned.run(cap.values(x))
    v, vt = (out[n] for n in cap.graph.outputs)
    torch.testing.assert_close(vt, (x * 2.0).view(-1, 16).t())
    assert vt.data_ptr() == v.data_ptr() and not vt.is_contiguous()  # one buffer, no copy


def test_views_returned_through_a_view_that_is_not():
    from fusekit.stitch.alone import LayoutViews

    class Chain(torch.nn.Module):
        def forward(self, x):
            u = (x * 2.0).view(-1, 16)  # not returned: folded into the reads below
            v = u.view(4, 4, 16)
            return v, v.permute(2, 0, 1)

    x = torch.randn(2, 8, 16)
    cap = capture(Chain(), (x,))
    planned = PlannedGraph(plan(cap.graph, detect()), cap.constants)
    assert any(isinstance(k, LayoutViews) for k in planned.kernels)
    out = planned.run(cap.values(x))
    v, p = (out[n] for n in cap.graph.outputs)
    torch.testing.assert_close(v, (x * 2.0).view(4, 4, 16))
    torch.testing.assert_close(p, (x * 2.0).view(4, 4, 16).permute(2, 0, 1))


def test_a_chain_before_a_reshaped_column_sum_is_one_kernel_and_views_stay_views():
    # GELU's backward and its bias gradient as AOTAutograd hands them over: the elementwise
    # chain on [B, S, H], reshaped to [B*S, H] (returned, and transposed for the weight's GEMM)
    # and summed over rows. With the rows split back into [B, S] (refine_dims) the column sum
    # stitches across the reshape: one kernel; the reshape and transpose must stay views
    # rather than copies inside it
    from fusekit.stitch.alone import LayoutViews

    class GeluBackward(torch.nn.Module):
        def forward(self, g, x):
            cdf = 0.5 * (torch.erf(x * 0.7071067811865476) + 1)
            pdf = torch.exp(x * x * -0.5) * 0.3989422804014327
            d = (g * (cdf + x * pdf)).view(-1, x.shape[-1])
            return d, d.t(), d.sum(0)

    args = (torch.randn(4, 64, 256), torch.randn(4, 64, 256))  # large enough to be memory-bound
    cap = capture(GeluBackward(), args)
    p = plan(cap.graph, detect())
    computed = [g for g in p.groups if any(not p.graph.op(o).is_layout for o in g.ops)]
    assert len(computed) == 1, p.describe()  # the chain and the column sum over its split rows
    planned = PlannedGraph(p, cap.constants)
    assert any(isinstance(k, LayoutViews) for k in planned.kernels), p.describe()
    out = planned.run(cap.values(*args))
    d, dt, db = (out[n] for n in cap.graph.outputs)
    want = GeluBackward()(*args)
    for got, ref in zip((d, dt, db), want, strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert dt.data_ptr() == d.data_ptr()  # the transpose is a view of the chain's output


def test_graph_keeps_each_ops_extents():
    _, cap = _graph("layernorm_bwd")
    g = cap.graph
    for op in g.ops:
        assert dict(g.extents(op.name)) == op.extents(dict(g.shapes))


def test_a_rotary_embedding_with_its_cat_is_one_kernel():
    # q * cos + rotate_half(q) * sin, rotate_half = cat(-q2, q1): the cat reads its pieces at
    # computed indices; -q2 is cheap, so it is recomputed there rather than a kernel boundary
    class Rotary(torch.nn.Module):
        def forward(self, q, cos, sin):
            q1, q2 = q[..., :32], q[..., 32:]
            return q * cos + torch.cat((-q2, q1), dim=-1) * sin

    args = (torch.randn(2, 4, 16, 64), torch.randn(16, 64), torch.randn(16, 64))
    cap = capture(Rotary(), args)
    p = plan(cap.graph, detect())
    computed = [g for g in p.groups if any(not p.graph.op(o).is_layout for o in g.ops)]
    assert len(computed) == 1, p.describe()
    assert "neg" in computed[0].layout.folded
    out = PlannedGraph(p, cap.constants).run(cap.values(*args))
    torch.testing.assert_close(out[cap.graph.outputs[0]], Rotary()(*args), rtol=1e-5, atol=1e-5)


def test_intermediates_are_dropped_after_their_last_reader(target):
    """The run keeps only live values, as eager's reference counting does: when the last
    kernel runs, every other intermediate is gone but the graph's outputs and what it reads."""
    w = load_workload("bert", small=True)
    stitched = Stitched(w.module, target)
    _, planned = stitched.prepare(*w.args)
    graph = planned.graph
    fixed = {*planned.constants, *graph.inputs, *graph.outputs}
    seen: list[set[str]] = []

    def watched(kernel):
        def run(env):
            seen.append(set(env) - fixed)
            return kernel(env)

        return run

    planned.kernels = [watched(k) for k in planned.kernels]
    with torch.no_grad():
        torch.testing.assert_close(stitched(*w.args), w.module(*w.args), rtol=1e-4, atol=1e-4)
    last = planned.plan.groups[-1].ops
    read_last = {t for o in last for t in graph.op(o).inputs}
    produced = set().union(*seen)
    assert len(produced) > 10  # a plan with many intermediates
    assert seen[-1] <= read_last, seen[-1] - read_last


def test_transposed_views_of_a_reshaped_input_stay_views():
    """A SwiGLU backward as AOTAutograd hands it over: a flat input read as ``[B, S, H]``, and
    each result returned flat and transposed for the weight gradients. The kernel writes each
    result once; the transposes are views of it, never copies made in the kernel."""
    from fusekit.stitch.alone import LayoutViews

    class SwiGluBackward(torch.nn.Module):
        def forward(self, g, up, gate):
            g = g.view(2, 8, 24)
            d_act = (g * up).view(16, 24)
            s = torch.sigmoid(gate)
            d_gate = (g * gate * s * (gate * (1 - s) + 1)).view(16, 24)
            return d_act, d_act.t(), d_gate, d_gate.t()

    gen = torch.Generator().manual_seed(0)
    args = (torch.randn(16, 24, generator=gen), *(torch.randn(2, 8, 24, generator=gen)
                                                  for _ in range(2)))  # fmt: skip
    cap = capture(SwiGluBackward(), args)
    planned = PlannedGraph(plan(cap.graph, detect()), cap.constants)
    kernels = [k for k in planned.kernels if isinstance(k, CpuKernel)]
    assert len(kernels) == 1
    written = {name for name, *_ in kernels[0]._outs}
    assert len(written) == 2, written  # the two results, no transposed copy
    out = planned.run(cap.values(*args))
    want = SwiGluBackward()(*args)
    for name, w in zip(cap.graph.outputs, want, strict=True):
        torch.testing.assert_close(out[name], w)
    flat, transposed = out[cap.graph.outputs[0]], out[cap.graph.outputs[1]]
    assert transposed.data_ptr() == flat.data_ptr() and not transposed.is_contiguous()
    assert sum(isinstance(k, LayoutViews) for k in planned.kernels) >= 2


def test_a_column_reduction_read_through_a_folded_view_is_unfusable():
    # y reads s through the unsqueeze v, which folds into y: s would be read before it is summed
    g = parse_graph(
        """
        input x: float32[8,4]
        tensor s: float32[4]
        tensor v: float32[4,1]
        tensor y: float32[4,1]
        s[j] = sum_i x[i,j]
        v[a,b] = s[a]
        y[a,b] = v[a,b] * 2.0
        output y
        """
    )
    with pytest.raises(Unfusable, match="column reduction s is read inside the group"):
        analyze(g, ["s", "v", "y"])


def test_a_cast_is_elementwise_not_a_view():
    class Cast(torch.nn.Module):
        def forward(self, x):
            return x.t().to(torch.bfloat16), x.t()

    cap = capture(Cast(), (torch.randn(8, 4),))
    classes = classify_graph(cap.graph)
    casts = [n for n in classes if cap.graph.tensor(n).dtype == "bfloat16"]
    assert casts and all(classes[n] is OpClass.ELEMENTWISE for n in casts)
    assert OpClass.LAYOUT in classes.values()
