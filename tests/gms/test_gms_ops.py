import pytest
import torch

import fusekit.gms.ops  # noqa: F401  (registers torch.ops.fusekit.*)
from fusekit.gms import GMSPlan, GMSProblem, gms, plan

# torch's own modules, imported by compile and opcheck, use the deprecated torch.jit.script_method
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")


def problem(reduce="sum"):
    gen = torch.Generator().manual_seed(0)
    g = torch.randint(0, 12, (80,), generator=gen)
    s = torch.randint(0, 4, (80,), generator=gen)
    d = torch.randint(0, 10, (80,), generator=gen)
    pl = plan(GMSProblem.create(g, s, d, 10, reduce=reduce), tile_rows=16, blocks=2)
    x = torch.randn(12, 8, generator=gen)
    w = torch.randn(4, 8, 16, generator=gen)
    c = torch.rand(80, generator=gen)
    return pl, x, w, c


class Layer(torch.nn.Module):
    """What an nn module on gms looks like: the plan a buffer, the weights a parameter."""

    def __init__(self, pl: GMSPlan, w: torch.Tensor, strategy: str):
        super().__init__()
        self.register_buffer("plan", pl.packed)
        self.weight = torch.nn.Parameter(w.clone())
        self.n_out = pl.n_out
        self.strategy = strategy

    def forward(self, x, c):
        y = torch.ops.fusekit.gms(x, self.weight, c, self.plan, self.n_out, self.strategy)
        return torch.relu(y) + 1


@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_opcheck(reduce):
    pl, x, w, c = problem(reduce)
    args = (x.requires_grad_(), w.requires_grad_(), c.requires_grad_(), pl.packed, pl.n_out, "auto")
    torch.library.opcheck(torch.ops.fusekit.gms.default, args)


@pytest.mark.parametrize("strategy", ["(GMS)seg", "G-Mseg-S", "transform-first/(GM)seg-S"])
def test_compiles_without_graph_breaks_forward_and_backward(strategy):
    pl, x, w, c = problem()
    layer = Layer(pl, w, strategy)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    eager, traced = layer(x1, c), compiled(x2, c)
    torch.testing.assert_close(traced, eager)
    eager.sum().backward()
    grad_eager = layer.weight.grad.clone()
    layer.weight.grad = None
    traced.sum().backward()
    torch.testing.assert_close(layer.weight.grad, grad_eager)
    torch.testing.assert_close(x2.grad, x1.grad)


def test_compiles_with_inductor():
    pl, x, w, c = problem()
    layer = Layer(pl, w, "auto")
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(layer, fullgraph=True)(x, c), layer(x, c))


def test_exports():
    pl, x, w, c = problem()
    layer = Layer(pl, w, "(GMS)seg")
    exported = torch.export.export(layer, (x, c))
    assert any("fusekit.gms" in str(node.target) for node in exported.graph.nodes)
    torch.testing.assert_close(exported.module()(x, c), layer(x, c))


def test_the_verb_is_the_op():
    pl, x, w, c = problem("mean")
    torch.testing.assert_close(
        gms(x, w, pl, c, "(GM)seg-S"),
        torch.ops.fusekit.gms(x, w, c, pl.packed, pl.n_out, "(GM)seg-S"),
    )


def test_op_checks_the_plan_and_n_out():
    pl, x, w, c = problem()
    with pytest.raises(ValueError, match=r"'n_out' to be 10 \(the plan's\) \(got 11\)"):
        torch.ops.fusekit.gms(x, w, c, pl.packed, 11, "auto")
    with pytest.raises(ValueError, match=r"'plan' to be GMSPlan.packed"):
        torch.ops.fusekit.gms(x, w, c, torch.arange(5), 10, "auto")
