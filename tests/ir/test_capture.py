import pytest
import torch
from torch import nn

from fusekit.ir import CaptureError, OpKind, capture, format_graph, format_op, parse_graph, parse_op
from fusekit.ir.examples import EXAMPLES, load_example, normalized_adjacency

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")


@pytest.fixture(scope="module")
def captured():
    out = {}
    for name in EXAMPLES:
        example = load_example(name)
        out[name] = (example, capture(example.module, example.args))
    return out


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_builtin_model_has_no_opaque_op_except_documented_ones(captured, name):
    example, cap = captured[name]
    opaque = {op.expr.target for op in cap.graph.ops if op.kind is OpKind.OPAQUE}
    assert opaque == set(example.opaque)


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_interpreter_reproduces_the_module(captured, name):
    example, cap = captured[name]
    with torch.no_grad():
        expected = example.module(*example.args)
    (got,) = cap.run(*example.args)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_text_form_round_trips_on_every_op(captured, name):
    _, cap = captured[name]
    for op in cap.graph.ops:
        text = format_op(op)
        assert parse_op(text) == op, text
        assert format_op(parse_op(text)) == text
    assert parse_graph(format_graph(cap.graph)) == cap.graph


def test_gcn_keeps_the_sparse_adjacency_with_its_format_and_nnz(captured):
    example, cap = captured["gcn"]
    adj = cap.graph.tensor("adj")
    assert adj.format.levels == ("dense", "compressed")
    assert adj.stats.nnz == example.args[1].values().numel()
    sparse_ops = [op for op in cap.graph.ops if "adj" in op.inputs]
    assert [op.kind for op in sparse_ops] == [OpKind.CONTRACTION, OpKind.CONTRACTION]


def test_gcn_captures_with_a_coo_adjacency():
    example = load_example("gcn")
    x = example.args[0]
    adj = normalized_adjacency(64, 160, seed=0, layout=torch.sparse_coo)
    cap = capture(example.module, (x, adj))
    assert cap.graph.tensor("adj").format.levels == ("compressed", "singleton")
    with torch.no_grad():
        torch.testing.assert_close(cap.run(x, adj)[0], example.module(x, adj))


def test_fx_fallback_gives_the_same_ops_as_export():
    example = load_example("bert")
    by_export = capture(example.module, example.args, method="export")
    by_fx = capture(example.module, example.args, method="fx")
    assert by_fx.method == "fx" and by_export.method == "export"
    assert [op.kind for op in by_fx.graph.ops] == [op.kind for op in by_export.graph.ops]
    with torch.no_grad():
        torch.testing.assert_close(by_fx.run(*example.args)[0], example.module(*example.args))


class Branchy(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1


def test_data_dependent_control_flow_names_the_line_and_op():
    where = r"data-dependent .* test_capture.py:\d+ in forward: `if x.sum\(\) > 0:`"
    with pytest.raises(CaptureError, match=where + r": aten\.item\.default"):
        capture(Branchy(), (torch.randn(3),))
    with pytest.raises(CaptureError, match=r"torch.fx cannot trace Branchy at test_capture.py:\d+"):
        capture(Branchy(), (torch.randn(3),), method="fx")


def test_dropout_in_training_mode_is_refused():
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5)).train()
    with pytest.raises(CaptureError, match=r"aten.dropout.default at .*model.eval\(\)"):
        capture(model, (torch.randn(2, 3),))


class SparseAdd(nn.Module):
    def forward(self, adj, x):
        return x + adj


def test_sparse_operand_outside_a_matmul_is_refused_with_the_op():
    adj = torch.eye(3).to_sparse()
    with pytest.raises(CaptureError, match=r"aten.add.Tensor at test_capture.py:\d+ .* sparse"):
        capture(SparseAdd(), (adj, torch.randn(3, 3)))


class MutatesInput(nn.Module):
    def forward(self, x):
        x.add_(1)
        return x * 2


class InPlaceOnFresh(nn.Module):
    def forward(self, x):
        y = x * 2
        y.add_(1)
        y.relu_()
        return y + x


def test_in_place_ops_on_fresh_tensors_are_functional_and_on_inputs_refused():
    with pytest.raises(CaptureError, match="mutates"):
        capture(MutatesInput(), (torch.randn(3),))
    x = torch.randn(4)
    cap = capture(InPlaceOnFresh(), (x,))
    torch.testing.assert_close(cap.run(x)[0], InPlaceOnFresh()(x.clone()))


class Cumulative(nn.Module):
    def forward(self, x):
        return torch.cumsum(x * 2, dim=1).relu()


def test_unknown_ops_become_opaque_and_keep_shapes():
    x = torch.randn(3, 5)
    cap = capture(Cumulative(), (x,))
    (opaque,) = [op for op in cap.graph.ops if op.kind is OpKind.OPAQUE]
    assert str(opaque) == "cumsum = opaque aten.cumsum.default(mul, 1)"
    assert cap.graph.tensor("cumsum").shape == (3, 5)
    torch.testing.assert_close(cap.run(x)[0], Cumulative()(x))


class Positions(nn.Module):
    def forward(self, x):
        return x * torch.arange(x.shape[1], device=x.device)


def test_factory_ops_keep_their_device():
    # a model on a GPU makes its positions there: the captured op must too, whatever device
    # the graph later runs on (dropping the argument made them on the CPU)
    x = torch.randn(2, 5)
    cap = capture(Positions(), (x,))
    (opaque,) = [op for op in cap.graph.ops if op.kind is OpKind.OPAQUE]
    assert str(opaque) == "arange = opaque aten.arange.default(5, device='cpu')"
    moved = parse_graph(format_graph(cap.graph).replace("'cpu'", "'meta'"))
    from fusekit.ir.interpret import interpret

    assert interpret(moved, {"x": x.to("meta")})["mul"].device.type == "meta"


def test_multiple_outputs_and_argument_checks():
    model = nn.Linear(3, 2)
    cap = capture(model, (torch.randn(4, 3),), name="lin")
    assert cap.graph.name == "lin" and cap.graph.params == ("p_weight", "p_bias")
    with pytest.raises(ValueError, match="'args' to be 1 tensors"):
        cap.run(torch.randn(4, 3), torch.randn(1))
    with pytest.raises(ValueError, match="'method'"):
        capture(model, (torch.randn(4, 3),), method="jit")
    two = capture(Fn2(), (torch.randn(2),))
    assert len(two.run(torch.ones(2))) == 2


class Fn2(nn.Module):
    def forward(self, x):
        return x + 1, x.exp()


class MaskSelect(nn.Module):
    def forward(self, x):
        return x[x > 0]


def test_data_dependent_shapes_are_refused_with_the_op():
    with pytest.raises(CaptureError, match=r"aten.index.Tensor at test_capture.py:\d+ .*static"):
        capture(MaskSelect(), (torch.randn(5),))


class WithConstants(nn.Module):
    def forward(self, x, k: int, unused=None, pair=(None,)):
        return x * k + pair[0]


@pytest.mark.parametrize("method", ["export", "fx"])
def test_non_tensor_arguments_are_specialised(method):
    args = (torch.randn(3), 2, None, (torch.ones(3),))
    cap = capture(WithConstants(), args, method=method)
    assert len(cap.graph.inputs) == 2
    assert str(cap.graph.ops[0]).endswith("[i] * 2")
    torch.testing.assert_close(cap.run(*args)[0], WithConstants()(*args))


class SparseRight(nn.Module):
    def forward(self, x, adj):
        return x @ adj


def test_a_sparse_right_operand_is_refused():
    adj = torch.eye(3).to_sparse()
    with pytest.raises(CaptureError, match="left operand of a 2-D matmul"):
        capture(SparseRight(), (torch.randn(2, 3), adj))


def test_an_aten_capture_records_the_traced_strides_under_ir_names():
    from torch.fx.experimental.proxy_tensor import make_fx

    from fusekit.ir.capture import capture_graph

    def fn(x):
        values, indices = torch.sort(x.t(), dim=0)  # a tuple result, kept opaque
        return values.t() + 1, indices

    x = torch.randn(3, 5)
    gm = make_fx(fn)(x)
    cap = capture_graph(gm, [x])
    indices = cap.graph.outputs[1]
    # FX names it by the getitem node that reads it; the IR by the opaque op's output
    assert indices not in {n.name for n in gm.graph.nodes}
    assert cap.strides[indices] == fn(x)[1].stride() == (1, 5)  # sort keeps x.t()'s layout
    assert cap.strides[cap.graph.inputs[0]] == (5, 1)
    assert all(len(cap.strides[n]) == len(cap.graph.tensor(n).shape) for n in cap.strides)
