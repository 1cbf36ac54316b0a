"""RGCNConv against torch_geometric's RGCNConv (same parameters, same outputs and gradients)."""

from __future__ import annotations

import pytest
import torch

from fusekit.data import entities_shaped
from fusekit.nn.rgcn import GatherReduce, RGCNConv, gather_reduce, reduce_reference
from fusekit.nn.rgcn_reference import rgcn_reference
from fusekit.nn.rgcn_rows import KeyGroups, segment_max, segment_max_reference

pyg = pytest.importorskip("torch_geometric.nn")


@pytest.fixture(scope="module")
def graph():
    return entities_shaped("aifb", seed=1, scale=0.1)


def _pair(graph, k, m, **kw):
    torch.manual_seed(0)
    ref = pyg.RGCNConv(k, m, graph.num_relations, **kw)
    ours = RGCNConv(k, m, graph.num_relations, **kw)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _close(a, b, rel=1e-5):
    scale = a.abs().max().clamp(min=1e-12)
    assert ((a - b).abs().max() / scale).item() < rel


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"num_bases": 4},
        {"num_blocks": 4},
        {"aggr": "add"},
        {"aggr": "sum", "root_weight": False, "bias": False},
    ],
    ids=["plain", "bases", "blocks", "add", "sum-noroot"],
)
def test_equals_pyg_forward_and_backward(graph, kw):
    ref, ours = _pair(graph, 16, 8, **kw)
    x = torch.randn(graph.num_nodes, 16, requires_grad=True)
    a = ref(x, graph.edge_index, graph.edge_type)
    b = ours(x, graph.edge_index, graph.edge_type)
    _close(a, b)
    params = [p for p in ref.parameters()]
    ga = torch.autograd.grad(a.square().sum(), [x, *params])
    gb = torch.autograd.grad(b.square().sum(), [x, *ours.parameters()])
    for u, v in zip(ga, gb, strict=True):
        _close(u, v, rel=1e-4)


@pytest.mark.parametrize("strategy", ["G-Mseg-S", "(GMS)seg", "transform-first"])
def test_named_strategies_agree(graph, strategy):
    ref, ours = _pair(graph, 8, 8)
    ours.strategy = strategy
    x = torch.randn(graph.num_nodes, 8)
    _close(ref(x, graph.edge_index, graph.edge_type), ours(x, graph.edge_index, graph.edge_type))


@pytest.mark.parametrize("kw", [{}, {"num_bases": 3}])
def test_featureless_equals_pyg(graph, kw):
    ref, ours = _pair(graph, graph.num_nodes, 8, **kw)
    a = ref(None, graph.edge_index, graph.edge_type)
    b = ours(None, graph.edge_index, graph.edge_type)
    _close(a, b)
    ga = torch.autograd.grad(a.square().sum(), list(ref.parameters()))
    gb = torch.autograd.grad(b.square().sum(), list(ours.parameters()))
    for u, v in zip(ga, gb, strict=True):
        _close(u, v, rel=1e-4)
    idx = torch.randperm(graph.num_nodes)
    _close(
        ref(idx, graph.edge_index, graph.edge_type), ours(idx, graph.edge_index, graph.edge_type)
    )


def test_bipartite_pair_of_features():
    torch.manual_seed(0)
    src, dst = torch.randn(30, 6), torch.randn(20, 4)
    edge_index = torch.stack([torch.randint(0, 30, (100,)), torch.randint(0, 20, (100,))])
    edge_type = torch.randint(0, 3, (100,))
    ref = pyg.RGCNConv((6, 4), 5, 3)
    ours = RGCNConv((6, 4), 5, 3)
    ours.load_state_dict(ref.state_dict())
    _close(ref((src, dst), edge_index, edge_type), ours((src, dst), edge_index, edge_type))


def test_plan_is_reused_until_indices_change(graph):
    _, ours = _pair(graph, 8, 8)
    x = torch.randn(graph.num_nodes, 8)
    ours(x, graph.edge_index, graph.edge_type)
    ours(x, graph.edge_index, graph.edge_type)
    assert len(ours._plans._entries) == 1
    edge_type = graph.edge_type.clone()
    ours(x, graph.edge_index, edge_type)
    assert len(ours._plans._entries) == 2
    edge_type[0] = (edge_type[0] + 1) % graph.num_relations  # in place: the version changes
    ref = pyg.RGCNConv(8, 8, graph.num_relations)
    ref.load_state_dict(ours.state_dict())
    _close(ref(x, graph.edge_index, edge_type), ours(x, graph.edge_index, edge_type))


def test_gather_reduce_matches_reference():
    torch.manual_seed(0)
    table = torch.randn(50, 7, requires_grad=True)
    rows, dst = torch.randint(0, 50, (300,)), torch.randint(0, 20, (300,))
    scale = torch.rand(300)
    gr = GatherReduce(rows, dst, scale, 20, 50)
    out = gather_reduce(table, gr)
    ptr, pos = gr.by_dst
    ref = reduce_reference(table, rows, scale, ptr, pos, 20)
    _close(ref, out)
    (g,) = torch.autograd.grad(out.sum(), table)
    (g_ref,) = torch.autograd.grad(ref.sum(), table)
    _close(g_ref, g)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda m, x, e, t: m(x, e, t + 100), "'edge_type' to be in \\[0, "),
        (lambda m, x, e, t: m(x, e.float(), t), "'edge_index' to be int64"),
        (lambda m, x, e, t: m(x[:, :3], e, t), "'x' to be \\[N, 8\\]"),
        (lambda m, x, e, t: m(x.double(), e, t), "'x' to be torch.float32"),
        (lambda m, x, e, t: m(x, e[:, :5], t), "'edge_type' to be a \\[5\\] tensor"),
        (lambda m, x, e, t: m(x[:10], e, t), "'edge_index' to be source nodes in"),
    ],
    ids=["type-range", "index-dtype", "x-width", "x-dtype", "type-length", "node-range"],
)
def test_bad_input_names_the_argument(graph, call, match):
    _, ours = _pair(graph, 8, 8)
    x = torch.randn(graph.num_nodes, 8)
    with pytest.raises((ValueError, TypeError), match=match):
        call(ours, x, graph.edge_index, graph.edge_type)


def test_bad_construction():
    with pytest.raises(ValueError, match="'aggr'"):
        RGCNConv(4, 4, 2, aggr="std")
    with pytest.raises(ValueError, match="'num_blocks'"):
        RGCNConv(6, 4, 2, num_blocks=4)
    with pytest.raises(ValueError, match="'num_bases'"):
        RGCNConv(4, 4, 2, num_bases=2, num_blocks=2)


@pytest.mark.parametrize("aggr", ["mean", "sum", "max", "min"])
@pytest.mark.parametrize(
    "kw",
    [{}, {"num_bases": 3}, {"num_blocks": 2}, {"flow": "target_to_source"}],
    ids=["plain", "bases", "blocks", "t2s"],
)
def test_fused_path_equals_the_reference(graph, aggr, kw):
    """The eager fused path against rgcn_reference (what TorchScript and export run)."""
    torch.manual_seed(0)
    ours = RGCNConv(8, 6, graph.num_relations, aggr=aggr, **kw).double()
    x = torch.randn(graph.num_nodes, 8, dtype=torch.float64)
    ei, et = graph.edge_index, graph.edge_type
    ref = rgcn_reference(
        x, x, ei, et, ours.weight, ours.comp, ours.root, ours.bias, aggr, ours.flow
    )
    _close(ref, ours(x, ei, et), rel=1e-12)


@pytest.mark.parametrize("aggr", ["mean", "max"])
def test_featureless_fused_path_equals_the_reference(graph, aggr):
    torch.manual_seed(0)
    ours = RGCNConv(graph.num_nodes, 6, graph.num_relations, aggr=aggr).double()
    idx = torch.randperm(graph.num_nodes)
    ei, et = graph.edge_index, graph.edge_type
    ref = rgcn_reference(idx, idx, ei, et, ours.weight, None, ours.root, ours.bias, aggr, ours.flow)
    _close(ref, ours(idx, ei, et), rel=1e-12)


def test_reference_checks_indices_naming_the_argument():
    w, x = torch.randn(2, 4, 3), torch.randn(5, 4)
    ei, et = torch.tensor([[0, 4], [1, 2]]), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="'edge_type' to be relations in \\[0, 2\\)"):
        rgcn_reference(x, x, ei, et + 1, w, None, None, None, "sum", "source_to_target")
    with pytest.raises(ValueError, match="'edge_index' to be target nodes in"):
        rgcn_reference(
            x, x, ei + torch.tensor([[0], [3]]), et, w, None, None, None, "sum", "source_to_target"
        )
    with pytest.raises(TypeError, match="'edge_index' to be int64 or int32"):
        rgcn_reference(x, x, ei.float(), et, w, None, None, None, "sum", "source_to_target")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_segment_max_matches_reference_and_its_gradient(dtype):
    torch.manual_seed(0)
    src = torch.randn(40, 5, dtype=dtype, requires_grad=True)
    rows, key = torch.randint(0, 40, (300,)), torch.randint(0, 90, (300,))
    groups = KeyGroups(rows, key)
    assert groups.num_groups == len(torch.unique(key))
    out, ref = segment_max(src, groups), segment_max_reference(src, groups)
    _close(ref, out, rel=1e-15)
    g = torch.randn_like(out)
    (ga,) = torch.autograd.grad(out, src, g)
    (gb,) = torch.autograd.grad(ref, src, g)
    _close(gb, ga, rel=1e-6)
    low = segment_max(src, groups, negate=True)
    at = groups.owner[:, None].expand(-1, 5)
    ref_min = src.new_zeros(low.shape).scatter_reduce(
        0, at, src[groups.sorted_rows], "amin", include_self=False
    )
    _close(ref_min, low, rel=1e-15)


def test_segment_max_splits_the_gradient_between_ties():
    src = torch.tensor([[1.0], [1.0], [0.5]], requires_grad=True)
    groups = KeyGroups(torch.tensor([0, 1, 2]), torch.tensor([7, 7, 7]))
    out = segment_max(src, groups)
    (g,) = torch.autograd.grad(out.sum(), src)
    assert out.tolist() == [[1.0]] and g.flatten().tolist() == [0.5, 0.5, 0.0]


def test_repr_is_pygs():
    assert repr(RGCNConv(4, 32, num_relations=8)) == "RGCNConv(4, 32, num_relations=8)"
    assert repr(RGCNConv((4, 16), 32, 2, aggr="max")) == "RGCNConv((4, 16), 32, num_relations=2)"


def test_changing_aggr_after_a_call_plans_again(graph):
    ref, ours = _pair(graph, 8, 8)
    x = torch.randn(graph.num_nodes, 8)
    _close(ref(x, graph.edge_index, graph.edge_type), ours(x, graph.edge_index, graph.edge_type))
    for aggr in ("max", "add", "mean"):
        ours.aggr = aggr
        ref_new = pyg.RGCNConv(8, 8, graph.num_relations, aggr=aggr)
        ref_new.load_state_dict(ours.state_dict())
        _close(
            ref_new(x, graph.edge_index, graph.edge_type),
            ours(x, graph.edge_index, graph.edge_type),
        )
