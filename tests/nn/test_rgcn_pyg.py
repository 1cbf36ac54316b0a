"""RGCNConv and FastRGCNConv against PyG's: full test mode (TorchScript), export, aggr, kwargs,
half precision, repr. Forward and backward compared on the same parameters."""

from __future__ import annotations

import warnings

import pytest
import torch

from fusekit.data import entities_shaped
from fusekit.nn import FastRGCNConv, RGCNConv

pyg = pytest.importorskip("torch_geometric.nn")
pyg_testing = pytest.importorskip("torch_geometric.testing")

CLASSES = [(RGCNConv, pyg.RGCNConv), (FastRGCNConv, pyg.FastRGCNConv)]
CONFS = [(None, None), (2, None), (None, 2)]  # (num_bases, num_blocks), as PyG's test


@pytest.fixture(scope="module")
def graph():
    return entities_shaped("aifb", seed=1, scale=0.05)


def _close(a, b, rel=1e-5):
    assert a.shape == b.shape
    scale = a.abs().max().clamp(min=1e-12)
    assert ((a.double() - b.double()).abs().max() / scale).item() < rel


def _pair(ours_cls, ref_cls, *args, **kw):
    torch.manual_seed(0)
    ref = ref_cls(*args, **kw)
    ours = ours_cls(*args, **kw)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _grads(out, inputs):
    return torch.autograd.grad(out.square().sum(), inputs)


def _assert_same_forward_backward(ref, ours, x, edge_index, edge_type, rel=1e-5):
    """Forward and the gradients of x (when float) and of every parameter agree."""
    leaves = []
    xs = []
    for m in (ref, ours):
        xm = x
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            xm = x.detach().clone().requires_grad_()
        xs.append(xm)
        leaves.append(([xm] if xm is not x else []) + list(m.parameters()))
    a = ref(xs[0], edge_index, edge_type)
    b = ours(xs[1], edge_index, edge_type)
    _close(a, b, rel)
    for u, v in zip(_grads(a, leaves[0]), _grads(b, leaves[1]), strict=True):
        _close(u, v, rel * 10)
    return a, b


# ---- PyG's own test, in its full mode (FULL_TEST=1 scripts the layers) ----


@pytest.mark.parametrize("conf", CONFS)
@pytest.mark.parametrize("classes", CLASSES, ids=["RGCNConv", "FastRGCNConv"])
def test_pyg_basic_in_full_test_mode(classes, conf, monkeypatch):
    """test_rgcn_conv_basic of PyG's test/nn/conv/test_rgcn_conv.py, with FULL_TEST=1."""
    monkeypatch.setenv("FULL_TEST", "1")
    assert pyg_testing.is_full_test()
    cls, _ = classes
    num_bases, num_blocks = conf
    x1, x2 = torch.randn(4, 4), torch.randn(2, 16)
    idx1, idx2 = torch.arange(4), torch.arange(2)
    edge_index = torch.tensor([[0, 1, 1, 2, 2, 3], [0, 0, 1, 0, 1, 1]])
    edge_type = torch.tensor([0, 1, 1, 0, 0, 1])

    conv = cls(4, 32, 2, num_bases, num_blocks, aggr="sum")
    assert str(conv) == f"{cls.__name__}(4, 32, num_relations=2)"
    out1 = conv(x1, edge_index, edge_type)
    assert out1.size() == (4, 32)
    if num_blocks is None:
        out2 = conv(None, edge_index, edge_type)
        assert torch.allclose(conv(idx1, edge_index, edge_type), out2, 1e-3)
        assert out2.size() == (4, 32)
    if pyg_testing.is_full_test():
        jit = torch.jit.script(conv)
        assert torch.allclose(jit(x1, edge_index, edge_type), out1, atol=1e-3)
        if num_blocks is None:
            assert torch.allclose(jit(idx1, edge_index, edge_type), out2, atol=1e-3)
            assert torch.allclose(jit(None, edge_index, edge_type), out2, atol=1e-3)

    conv = cls((4, 16), 32, 2, num_bases, num_blocks, aggr="sum")
    assert str(conv) == f"{cls.__name__}((4, 16), 32, num_relations=2)"
    out1 = conv((x1, x2), edge_index, edge_type)
    assert out1.size() == (2, 32)
    if num_blocks is None:
        out2 = conv((None, idx2), edge_index, edge_type)
        assert out2.size() == (2, 32)
        assert torch.allclose(conv((idx1, idx2), edge_index, edge_type), out2, atol=1e-3)
    if pyg_testing.is_full_test():
        jit = torch.jit.script(conv)
        assert torch.allclose(jit((x1, x2), edge_index, edge_type), out1, atol=1e-3)
        if num_blocks is None:
            assert torch.allclose(jit((None, idx2), edge_index, edge_type), out2, atol=1e-3)
            assert torch.allclose(jit((idx1, idx2), edge_index, edge_type), out2, atol=1e-3)


@pytest.mark.parametrize("conf", CONFS)
def test_pyg_equality_of_the_two_classes(conf):
    """test_rgcn_conv_equality of PyG's test, and both of ours against PyG's FastRGCNConv."""
    num_bases, num_blocks = conf
    x1 = torch.randn(4, 4)
    edge_index = torch.tensor(
        [[0, 1, 1, 2, 2, 3, 0, 1, 1, 2, 2, 3], [0, 0, 1, 0, 1, 1, 0, 0, 1, 0, 1, 1]]
    )
    edge_type = torch.tensor([0, 1, 1, 0, 0, 1, 2, 3, 3, 2, 2, 3])
    torch.manual_seed(12345)
    conv1 = RGCNConv(4, 32, 4, num_bases, num_blocks, aggr="sum")
    torch.manual_seed(12345)
    conv2 = FastRGCNConv(4, 32, 4, num_bases, num_blocks, aggr="sum")
    ref = pyg.FastRGCNConv(4, 32, 4, num_bases, num_blocks, aggr="sum")
    ref.load_state_dict(conv1.state_dict())
    inputs = [x1] + ([None, torch.arange(4)] if num_blocks is None else [])
    for x in inputs:
        out1, out2 = conv1(x, edge_index, edge_type), conv2(x, edge_index, edge_type)
        assert torch.allclose(out1, out2, atol=1e-2)
        _close(ref(x, edge_index, edge_type), out1)


# ---- TorchScript and torch.export, every aggregation ----


@pytest.mark.parametrize("conf", CONFS, ids=["plain", "bases", "blocks"])
@pytest.mark.parametrize("aggr", ["mean", "sum", "max", "min"])
def test_script_and_export_equal_pyg(graph, conf, aggr):
    num_bases, num_blocks = conf
    ref, ours = _pair(
        RGCNConv, pyg.RGCNConv, 8, 8, graph.num_relations, num_bases, num_blocks, aggr=aggr
    )
    x = torch.randn(graph.num_nodes, 8)
    ei, et = graph.edge_index, graph.edge_type
    expected = ref(x, ei, et)
    _close(expected, ours(x, ei, et))
    jit = torch.jit.script(ours)
    _close(expected, jit(x, ei, et))
    exported = torch.export.export(ours, (x, ei, et)).module()
    _close(expected, exported(x, ei, et))
    # nothing of this graph is baked in: another graph of the same sizes
    gen = torch.Generator().manual_seed(7)
    ei2 = torch.randint(0, graph.num_nodes, ei.shape, generator=gen)
    et2 = torch.randint(0, graph.num_relations, et.shape, generator=gen)
    _close(ref(x, ei2, et2), exported(x, ei2, et2))
    _close(ref(x, ei2, et2), jit(x, ei2, et2))
    # the scripted module trains like the eager one
    xg = x.clone().requires_grad_()
    (g_jit,) = torch.autograd.grad(jit(xg, ei, et).square().sum(), xg)
    (g_ref,) = torch.autograd.grad(ref(xg, ei, et).square().sum(), xg)
    _close(g_ref, g_jit, 1e-4)


@pytest.mark.parametrize("aggr", ["mean", "max"])
def test_featureless_script_and_export_equal_pyg(graph, aggr):
    ref, ours = _pair(RGCNConv, pyg.RGCNConv, graph.num_nodes, 8, graph.num_relations, aggr=aggr)
    ei, et = graph.edge_index, graph.edge_type
    idx = torch.arange(graph.num_nodes)
    expected = ref(None, ei, et)
    jit = torch.jit.script(ours)
    _close(expected, jit(None, ei, et))
    _close(expected, jit(idx, ei, et))
    exported = torch.export.export(ours, (idx, ei, et)).module()
    _close(expected, exported(idx, ei, et))


def test_save_and_load_a_scripted_layer(tmp_path, graph):
    ref, ours = _pair(RGCNConv, pyg.RGCNConv, 8, 8, graph.num_relations, num_bases=3, aggr="max")
    x = torch.randn(graph.num_nodes, 8)
    torch.jit.save(torch.jit.script(ours), tmp_path / "rgcn.pt")
    loaded = torch.jit.load(tmp_path / "rgcn.pt")
    _close(ref(x, graph.edge_index, graph.edge_type), loaded(x, graph.edge_index, graph.edge_type))


def test_exported_and_scripted_layers_check_indices():
    conv = RGCNConv(4, 3, 2)
    x = torch.randn(5, 4)
    edge_index, edge_type = torch.tensor([[0, 4], [1, 2]]), torch.tensor([0, 1])
    exported = torch.export.export(conv, (x, edge_index, edge_type)).module()
    jit = torch.jit.script(conv)
    bad_type = torch.tensor([0, 2])
    bad_node = torch.tensor([[0, 5], [1, 2]])
    with pytest.raises(RuntimeError, match="assert"):
        exported(x, edge_index, bad_type)
    with pytest.raises(RuntimeError, match="assert"):
        exported(x, bad_node, edge_type)
    with pytest.raises(Exception, match="'edge_type' to be relations in"):
        jit(x, edge_index, bad_type)
    with pytest.raises(Exception, match="'edge_index' to be source nodes in"):
        jit(x, bad_node, edge_type)


def test_compile_and_trace_record_the_reference():
    torch.manual_seed(0)
    conv = RGCNConv(8, 6, 4, aggr="min")
    x = torch.randn(30, 8)
    gen = torch.Generator().manual_seed(1)
    ei, et = torch.randint(0, 30, (2, 200), generator=gen), torch.randint(0, 4, (200,))
    ei2 = torch.randint(0, 30, (2, 200), generator=gen)
    torch._dynamo.reset()
    compiled = torch.compile(conv, backend="eager", fullgraph=True)
    _close(conv(x, ei, et), compiled(x, ei, et))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's note on the range check's bool()
        traced = torch.jit.trace(conv, (x, ei, et))
    _close(conv(x, ei2, et), traced(x, ei2, et))


# ---- aggregations ----


@pytest.mark.parametrize("conf", CONFS, ids=["plain", "bases", "blocks"])
@pytest.mark.parametrize("aggr", ["max", "min", "mean", "add"])
def test_aggr_equals_pyg_forward_and_backward(graph, conf, aggr):
    num_bases, num_blocks = conf
    ref, ours = _pair(
        RGCNConv, pyg.RGCNConv, 16, 8, graph.num_relations, num_bases, num_blocks, aggr=aggr
    )
    x = torch.randn(graph.num_nodes, 16)
    _assert_same_forward_backward(ref, ours, x, graph.edge_index, graph.edge_type)


@pytest.mark.parametrize("aggr", ["max", "min"])
@pytest.mark.parametrize("strategy", ["G-Mseg-S", "(GMS)seg", "transform-first"])
def test_extremal_aggr_through_named_strategies(graph, aggr, strategy):
    ref, ours = _pair(RGCNConv, pyg.RGCNConv, 8, 8, graph.num_relations, aggr=aggr)
    ours.strategy = strategy
    x = torch.randn(graph.num_nodes, 8)
    _assert_same_forward_backward(ref, ours, x, graph.edge_index, graph.edge_type)


@pytest.mark.parametrize("aggr", ["max", "min"])
@pytest.mark.parametrize("num_bases", [None, 3])
def test_featureless_extremal_aggr_equals_pyg(graph, aggr, num_bases):
    ref, ours = _pair(
        RGCNConv, pyg.RGCNConv, graph.num_nodes, 8, graph.num_relations, num_bases, aggr=aggr
    )
    _assert_same_forward_backward(ref, ours, None, graph.edge_index, graph.edge_type)
    perm = torch.randperm(graph.num_nodes)
    _close(
        ref(perm, graph.edge_index, graph.edge_type), ours(perm, graph.edge_index, graph.edge_type)
    )


def test_max_gradient_is_split_between_ties_as_pyg():
    """Few distinct values: many equal maxima per (target, relation); PyG splits the gradient.

    The values avoid 0: torch's ``scatter_reduce(amax, include_self=False)``, which PyG calls,
    counts its unused zero start as one more tie when the maximum is exactly 0 (so the shares
    sum to less than the incoming gradient); fusekit splits between the real ties only.
    """
    torch.manual_seed(0)
    ref, ours = _pair(RGCNConv, pyg.RGCNConv, 4, 3, 2, aggr="max")
    x = torch.randint(-2, 2, (12, 4)).float() + 0.5
    gen = torch.Generator().manual_seed(3)
    edge_index = torch.randint(0, 12, (2, 80), generator=gen)
    edge_type = torch.randint(0, 2, (80,), generator=gen)
    _assert_same_forward_backward(ref, ours, x, edge_index, edge_type)


def test_bipartite_extremal_aggr():
    torch.manual_seed(0)
    src, dst = torch.randn(30, 6), torch.randn(20, 4)
    edge_index = torch.stack([torch.randint(0, 30, (100,)), torch.randint(0, 20, (100,))])
    edge_type = torch.randint(0, 3, (100,))
    for aggr in ("max", "min"):
        ref, ours = _pair(RGCNConv, pyg.RGCNConv, (6, 4), 5, 3, aggr=aggr)
        _close(ref((src, dst), edge_index, edge_type), ours((src, dst), edge_index, edge_type))


@pytest.mark.parametrize("aggr", ["mul", "std", "softmax", ["sum", "max"], "nope"])
def test_other_aggregations_are_refused_naming_aggr(aggr):
    with pytest.raises(ValueError, match="'aggr'"):
        RGCNConv(4, 4, 2, aggr=aggr)


# ---- MessagePassing keyword arguments ----


@pytest.mark.parametrize("aggr", ["mean", "max"])
@pytest.mark.parametrize("features", [True, False], ids=["features", "featureless"])
def test_flow_target_to_source_equals_pyg(graph, aggr, features):
    k = 8 if features else graph.num_nodes
    ref, ours = _pair(
        RGCNConv, pyg.RGCNConv, k, 8, graph.num_relations, aggr=aggr, flow="target_to_source"
    )
    assert ours.flow == "target_to_source"
    x = torch.randn(graph.num_nodes, 8) if features else None
    a, b = _assert_same_forward_backward(ref, ours, x, graph.edge_index, graph.edge_type)
    forward = RGCNConv(k, 8, graph.num_relations, aggr=aggr)
    forward.load_state_dict(ours.state_dict())
    _close(b, forward(x, graph.edge_index.flip(0), graph.edge_type))  # the swapped direction
    _close(a, torch.jit.script(ours)(x, graph.edge_index, graph.edge_type))


def test_flow_target_to_source_needs_equal_sides():
    conv = RGCNConv((4, 4), 3, 2, flow="target_to_source")
    with pytest.raises(ValueError, match=r"'x'.*flow='target_to_source'"):
        conv((torch.randn(5, 4), torch.randn(6, 4)), torch.tensor([[0], [1]]), torch.tensor([0]))


def test_decomposed_layers_and_empty_aggr_kwargs_leave_the_result(graph):
    ref, ours = _pair(
        RGCNConv, pyg.RGCNConv, 8, 8, graph.num_relations, decomposed_layers=2, aggr_kwargs={}
    )
    assert ours.decomposed_layers == 2 and ours.node_dim == 0
    x = torch.randn(graph.num_nodes, 8)
    _close(ref(x, graph.edge_index, graph.edge_type), ours(x, graph.edge_index, graph.edge_type))


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        ({"flow": "sideways"}, ValueError, "'flow'"),
        ({"node_dim": 0}, TypeError, "'node_dim'"),
        ({"aggr_kwargs": {"a": 1}}, TypeError, "'aggr_kwargs'"),
        ({"unknown": 1}, TypeError, "'unknown'"),
        ({"decomposed_layers": 0}, ValueError, "'decomposed_layers'"),
    ],
)
def test_kwargs_pyg_refuses_are_refused(kw, error, match):
    with pytest.raises(Exception):  # noqa: B017  PyG refuses these as well
        pyg.RGCNConv(4, 4, 2, **kw)(torch.randn(3, 4), torch.tensor([[0], [1]]), torch.tensor([0]))
    with pytest.raises(error, match=match):
        RGCNConv(4, 4, 2, **kw)


# ---- float16 and bfloat16 ----

#: Largest error relative to the output's largest magnitude, against PyG's half-precision run:
#: PyG rounds every per-relation product to the half type, fusekit computes in float32 and
#: rounds once, so the gap is a few half-precision ulps of the largest partial sums (measured on
#: this graph: about 4e-4 for float16 and 3e-3 for bfloat16, each side against float64 too).
HALF_REL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("aggr", ["mean", "max"])
@pytest.mark.parametrize("features", [True, False], ids=["features", "featureless"])
def test_half_precision_matches_pyg(graph, dtype, aggr, features):
    k = 8 if features else graph.num_nodes
    ref, ours = _pair(RGCNConv, pyg.RGCNConv, k, 8, graph.num_relations, aggr=aggr)
    ref, ours = ref.to(dtype), ours.to(dtype)
    x = torch.randn(graph.num_nodes, 8).to(dtype) if features else None
    ei, et = graph.edge_index, graph.edge_type
    a, b = ref(x, ei, et), ours(x, ei, et)
    assert b.dtype == dtype  # PyG's RGCNConv gives float32 here (its float32 accumulator)
    _close(a.float(), b.float(), HALF_REL[dtype])
    # and against the same layer in float64, which both should approach
    exact = ours.double()(x.double() if features else None, ei, et)
    _close(exact, b.double(), HALF_REL[dtype])
    ours.to(dtype)
    params = list(ours.parameters())
    grads = torch.autograd.grad(ours(x, ei, et).float().square().sum(), params)
    assert all(g.dtype == dtype and torch.isfinite(g).all() for g in grads)
    ref_grads = torch.autograd.grad(ref(x, ei, et).float().square().sum(), list(ref.parameters()))
    for u, v in zip(ref_grads, grads, strict=True):
        _close(u.float(), v.float(), 10 * HALF_REL[dtype])


def test_half_precision_scripted_and_fast(graph):
    ref, ours = _pair(FastRGCNConv, pyg.FastRGCNConv, 8, 8, graph.num_relations)
    ref, ours = ref.half(), ours.half()
    x = torch.randn(graph.num_nodes, 8).half()
    a = ref(x, graph.edge_index, graph.edge_type)
    b = ours(x, graph.edge_index, graph.edge_type)
    c = torch.jit.script(ours)(x, graph.edge_index, graph.edge_type)
    assert a.dtype == b.dtype == c.dtype == torch.float16
    _close(a.float(), b.float(), HALF_REL[torch.float16])
    _close(b.float(), c.float(), HALF_REL[torch.float16])


def test_half_input_to_a_float_layer_is_refused_naming_x():
    with pytest.raises(TypeError, match=r"'x' to be torch\.float32"):
        RGCNConv(4, 3, 2)(torch.randn(5, 4).half(), torch.tensor([[0], [1]]), torch.tensor([0]))


# ---- FastRGCNConv ----


@pytest.mark.parametrize("conf", CONFS, ids=["plain", "bases", "blocks"])
@pytest.mark.parametrize("aggr", ["mean", "sum"])
def test_fast_equals_pyg_fast_forward_and_backward(graph, conf, aggr):
    num_bases, num_blocks = conf
    ref, ours = _pair(
        FastRGCNConv,
        pyg.FastRGCNConv,
        8,
        8,
        graph.num_relations,
        num_bases,
        num_blocks,
        aggr=aggr,
    )
    x = torch.randn(graph.num_nodes, 8)
    _assert_same_forward_backward(ref, ours, x, graph.edge_index, graph.edge_type)
    plain = RGCNConv(8, 8, graph.num_relations, num_bases, num_blocks, aggr=aggr)
    plain.load_state_dict(ours.state_dict())
    _close(plain(x, graph.edge_index, graph.edge_type), ours(x, graph.edge_index, graph.edge_type))


def test_fast_featureless_equals_pyg_fast(graph):
    ref, ours = _pair(FastRGCNConv, pyg.FastRGCNConv, graph.num_nodes, 8, graph.num_relations)
    _assert_same_forward_backward(ref, ours, None, graph.edge_index, graph.edge_type)
    idx = torch.arange(graph.num_nodes)
    _close(
        ref(idx, graph.edge_index, graph.edge_type), ours(idx, graph.edge_index, graph.edge_type)
    )


def test_fast_refuses_what_pyg_fast_refuses():
    with pytest.raises(ValueError, match="FastRGCNConv: expected 'aggr'"):
        FastRGCNConv(4, 4, 2, aggr="max")
    assert repr(FastRGCNConv((4, 16), 32, 8)) == repr(pyg.FastRGCNConv((4, 16), 32, 8))


def test_fast_is_exported_from_fusekit_nn():
    import fusekit.nn

    assert "FastRGCNConv" in fusekit.nn.__all__
    assert fusekit.nn.FastRGCNConv is FastRGCNConv


# ---- repr ----


@pytest.mark.parametrize(
    ("args", "kw"),
    [((4, 32, 8), {}), (((4, 16), 32, 2), {"aggr": "max"}), ((10, 3, 5), {"num_bases": 2})],
)
def test_repr_equals_pyg(args, kw):
    assert repr(RGCNConv(*args, **kw)) == repr(pyg.RGCNConv(*args, **kw))
