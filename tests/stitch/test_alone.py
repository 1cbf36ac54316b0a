"""The eager paths of ops run alone (stitch/alone.py) against the IR interpreter."""

import pytest
import torch
from torch import nn

from fusekit.ir import capture
from fusekit.ir.expr import Access, IBin, IConst, IVar
from fusekit.ir.strides import fit_strides, term_values
from fusekit.stitch.alone import AtenContraction
from fusekit.stitch.runner import reference_group


class _Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(12, 5)

    def forward(self, x):
        return self.fc(x)


class _Mm(nn.Module):
    """``mm(x, W.t())``, as AOTAutograd spells a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(5, 12))

    def forward(self, x):
        return torch.mm(x, self.w.t())


class _Addmm(nn.Module):
    """``addmm(b, x, W)``, GPT-2's Conv1D."""

    def __init__(self) -> None:
        super().__init__()
        self.w, self.b = nn.Parameter(torch.randn(12, 5)), nn.Parameter(torch.randn(5))

    def forward(self, x):
        return torch.addmm(self.b, x, self.w)


class _AddmmResidual(nn.Module):
    """``addmm(r, x, W)``: a residual added inside the GEMM's call."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(12, 5))

    def forward(self, r, x):
        return torch.addmm(r, x, self.w)


class _Bmm(nn.Module):
    def forward(self, q, k):
        return torch.bmm(q, k.transpose(1, 2))


class _Einsum(nn.Module):
    def forward(self, a, b):
        return torch.einsum("ikj,jkl->ikl", a, b)


@pytest.mark.parametrize(
    ("module", "args", "path"),
    [
        (_Linear(), (torch.randn(3, 7, 12),), "linear"),
        (_Mm(), (torch.randn(7, 12),), "gemm"),
        (_Addmm(), (torch.randn(7, 12),), "gemm"),
        (_AddmmResidual(), (torch.randn(7, 5), torch.randn(7, 12)), "gemm"),
        (_Bmm(), (torch.randn(4, 6, 8), torch.randn(4, 5, 8)), "matmul"),
        (_Einsum(), (torch.randn(3, 4, 5), torch.randn(5, 4, 6)), None),
    ],
)
def test_contraction_matches_interpreter(module, args, path):
    cap = capture(module.eval(), args)
    values = {**cap.values(*args)}
    for op in cap.graph.ops:
        if op.kind.value != "contraction":
            values.update(reference_group(cap.graph, [op.name], values))
            continue
        fast = AtenContraction(cap.graph, op.name)
        if path == "linear":
            assert fast.linear
        elif path == "matmul":
            assert fast.perm_a is not None and not fast.gemm
        elif path == "gemm":
            assert fast.gemm
        got = fast(values)[op.name]
        want = reference_group(cap.graph, [op.name], values)[op.name]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # fp32, same BLAS sums
        values[op.name] = want


def _linear_operands(bias: bool, transposed: bool):
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(33, 40, generator=gen)
    # the weight as nn.Linear keeps it, [out, in], or as GPT-2's Conv1D does, [in, out]
    w = torch.randn(40, 24, generator=gen).t() if transposed else torch.randn(24, 40, generator=gen)
    return a, w, torch.randn(24, generator=gen) if bias else None


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("transposed", [False, True])
def test_every_linear_call_equals_the_eager_one(bias, transposed):
    from fusekit.stitch.alone import LINEAR_CALLS, eager_linear, linear_signature

    a, w, b = _linear_operands(bias, transposed)
    want = torch.nn.functional.linear(a, w, b)
    torch.testing.assert_close(eager_linear(a, w, b), want, rtol=0, atol=0)
    if linear_signature(a, w, b) is None:
        pytest.skip("this torch has no oneDNN")
    for name, call in LINEAR_CALLS.items():
        torch.testing.assert_close(call(a, w, b), want, rtol=1e-5, atol=1e-5, msg=name)


def test_linear_times_each_signature_once_and_runs_its_pick(monkeypatch):
    from fusekit.stitch import alone

    a, w, b = _linear_operands(bias=True, transposed=False)
    if alone.linear_signature(a, w, b) is None:
        pytest.skip("this torch has no oneDNN")
    timed: list[set[str]] = []

    def fastest(calls, rounds, repeats, min_total_s):
        timed.append(set(calls))
        return "onednn", {}

    ran: list[str] = []

    def recorded(name, fn):
        def call(*args):
            ran.append(name)
            return fn(*args)

        return call

    calls = {name: recorded(name, fn) for name, fn in alone.LINEAR_CALLS.items()}
    monkeypatch.setattr(alone, "fastest", fastest)
    monkeypatch.setattr(alone, "LINEAR_CALLS", calls)
    monkeypatch.setattr(alone, "LINEAR_CHOICES", {})
    for _ in range(3):
        alone.linear(a, w, b)
    alone.linear(a[:20], w, b)  # another signature
    assert timed == [{"aten", "onednn"}] * 2 and ran == ["onednn"] * 4
    assert set(alone.LINEAR_CHOICES.values()) == {"onednn"} and len(alone.LINEAR_CHOICES) == 2


def test_linear_stays_on_eager_where_onednn_cannot_or_must_not_run(monkeypatch):
    from fusekit.stitch.alone import ONEDNN_ENV, linear, linear_signature

    a, w, b = _linear_operands(bias=True, transposed=False)
    if linear_signature(a, w, b) is None:
        pytest.skip("this torch has no oneDNN")
    assert linear_signature(a.double(), w.double(), b.double()) is None  # fp32 only
    assert linear_signature(a, w, b[None]) is None  # a bias that is not a vector
    w_grad = w.clone().requires_grad_()
    assert linear_signature(a, w_grad, b) is None  # its op has no derivative
    with torch.no_grad():
        assert linear_signature(a, w_grad, b) is not None
    y = linear(a, w_grad, b)
    y.sum().backward()  # autograd goes through eager's call
    torch.testing.assert_close(w_grad.grad, a.sum(0).expand(24, 40))
    monkeypatch.setenv(ONEDNN_ENV, "0")
    assert linear_signature(a, w, b) is None
    torch.testing.assert_close(linear(a, w, b), torch.nn.functional.linear(a, w, b), rtol=0, atol=0)


def test_fit_strides_transpose_and_split():
    i, j, k = IVar("i"), IVar("j"), IVar("k")
    # Y[i,j] = X[j,i] of a contiguous X[3,4]: strides (1, 4)
    assert fit_strides(Access("x", (j, i)), ("i", "j"), (4, 3), (4, 1)) == (0, (1, 4))
    # Y[i,j,k] = X[i, j*4 + k]: a view of X[2,8]
    split = IBin("+", IBin("*", j, IConst(4)), k)
    assert fit_strides(Access("x", (i, split)), ("i", "j", "k"), (2, 2, 4), (8, 1)) == (
        0,
        (8, 4, 1),
    )


def test_fit_strides_of_affine_reads_matches_every_offset():
    # affine reads are fitted from the unit points alone: the fit reproduces every offset
    import itertools

    i, j = IVar("i"), IVar("j")
    cases = [
        (Access("x", (IBin("+", i, IConst(1)), IBin("-", IConst(5), j))), (3, 4), (6, 1)),
        (Access("x", (IBin("*", IConst(2), j), i)), (3, 2), (5, 1)),
        (Access("x", (i, j)), (1, 4), (4, 1)),  # a dim of one: stride 0
    ]
    for acc, shape, src in cases:
        base, steps = fit_strides(acc, ("i", "j"), shape, src)  # type: ignore[misc]
        for y in itertools.product(*(range(n) for n in shape)):
            point = dict(zip(("i", "j"), y, strict=True))
            want = sum(term_values(t, point) * s for t, s in zip(acc.indices, src, strict=True))
            assert base + sum(a * b for a, b in zip(y, steps, strict=True)) == want
    # a product of two variables is not affine: checked over every element, not a view
    assert fit_strides(Access("x", (IBin("*", i, j),)), ("i", "j"), (3, 3), (1,)) is None


def test_fit_strides_rejects_reshape_of_transpose():
    # Y[i,k] = T[i, k/3, k%3] where T[2,4,3] has strides (12, 1, 4) (a transposed storage)
    i, k = IVar("i"), IVar("k")
    read = Access("t", (i, IBin("/", k, IConst(3)), IBin("%", k, IConst(3))))
    assert fit_strides(read, ("i", "k"), (2, 12), (12, 1, 4)) is None


@pytest.mark.parametrize(
    ("line", "shape", "out_shape", "perm"),
    [
        ("y[i] = sum_j x[i,j]", (3, 4), (3,), None),
        ("y[j] = max_i x[i,j]", (3, 4), (4,), None),
        ("y[k,i] = min_j x[i,j,k]", (3, 4, 5), (5, 3), (1, 0)),
        ("y[i,k] = mean_j x[i,j,k]", (3, 4, 5), (3, 5), None),
    ],
)
def test_aten_reduction_equals_the_interpreter(line, shape, out_shape, perm):
    from fusekit.ir import parse_graph
    from fusekit.stitch.alone import AtenReduction

    dims = lambda s: ",".join(map(str, s))  # noqa: E731
    g = parse_graph(
        f"input x: float32[{dims(shape)}]\ntensor y: float32[{dims(out_shape)}]\n{line}\noutput y\n"
    )
    fast = AtenReduction(g, "y")
    assert fast.perm == perm
    values = {"x": torch.randn(*shape)}
    want = reference_group(g, ["y"], values)["y"]
    torch.testing.assert_close(fast(values)["y"], want)


def test_aten_reduction_refuses_a_diagonal_read():
    from fusekit.ir import parse_graph
    from fusekit.stitch.alone import AtenReduction

    g = parse_graph(
        "input x: float32[3,4,4]\ntensor y: float32[3]\ny[i] = sum_j x[i,j,j]\noutput y\n"
    )
    with pytest.raises(ValueError, match="computed indices"):
        AtenReduction(g, "y")


def test_single_reduction_group_keeps_the_faster_implementation(monkeypatch):
    from fusekit.hw import load
    from fusekit.stitch.runner import PlannedGraph, TimedChoice
    from fusekit.stitch.search import plan

    class RowSum(nn.Module):
        def forward(self, x):
            return x.sum(-1)

    x = torch.randn(64, 300)
    cap = capture(RowSum(), (x,))
    jobs: list[tuple[str, int]] = []
    monkeypatch.setattr("fusekit.stitch.runner.precompile", jobs.extend)
    planned = PlannedGraph(plan(cap.graph, load("cpu-local")), cap.constants)
    (kernel,) = planned.kernels
    assert isinstance(kernel, TimedChoice) and kernel.choice is None
    # the stitched option its first call times compiles ahead, with the plan's other kernels
    assert jobs and [code for code, _ in jobs] == kernel.options["stitched"].codes
    out = planned.run({cap.graph.inputs[0]: x})
    assert kernel.choice in ("stitched", "aten") and set(kernel.medians_s) == {"stitched", "aten"}
    torch.testing.assert_close(out[cap.graph.outputs[0]], x.sum(-1))
    for fn in kernel.options.values():  # both options are right, whichever was kept
        torch.testing.assert_close(fn({cap.graph.inputs[0]: x})[cap.graph.outputs[0]], x.sum(-1))


_INDEXING = [
    # (graph text, values, kind)
    (  # an embedding
        "input w: float32[10,6]\ninput t: int64[3,4]\ntensor y: float32[3,4,6]\n"
        "y[i,j,k] = w[t[i,j],k]\noutput y\n",
        {"w": (10, 6), "t": ((3, 4), 10)},
        "index_select",
    ),
    (  # the same rows written in another order, from int32 indices
        "input w: float32[10,6]\ninput t: int32[3,4]\ntensor y: float32[6,4,3]\n"
        "y[k,j,i] = w[t[i,j],k]\noutput y\n",
        {"w": (10, 6), "t": ((3, 4), 10)},
        "index_select",
    ),
    (  # along a middle axis
        "input x: float32[2,9,5]\ninput t: int64[7]\ntensor y: float32[2,7,5]\n"
        "y[a,e,c] = x[a,t[e],c]\noutput y\n",
        {"x": (2, 9, 5), "t": ((7,), 9)},
        "index_select",
    ),
    (  # a loss's target logit
        "input x: float32[5,11]\ninput t: int64[5,1]\ntensor y: float32[5,1]\n"
        "y[i,j] = x[i,t[i,j]]\noutput y\n",
        {"x": (5, 11), "t": ((5, 1), 11)},
        "gather",
    ),
    (  # an embedding's gradient
        "input v: float32[3,4,6]\ninput t: int64[3,4]\ntensor y: float32[10,6]\n"
        "y[t[i,j],k] += v[i,j,k]\noutput y\n",
        {"v": (3, 4, 6), "t": ((3, 4), 10)},
        "index_add",
    ),
    (  # ... from a source stored in another order
        "input v: float32[6,3,4]\ninput t: int64[3,4]\ntensor y: float32[10,6]\n"
        "y[t[i,j],k] += v[k,i,j]\noutput y\n",
        {"v": (6, 3, 4), "t": ((3, 4), 10)},
        "index_add",
    ),
]


@pytest.mark.parametrize(("text", "shapes", "kind"), _INDEXING)
def test_aten_indexing_equals_the_interpreter(text, shapes, kind):
    from fusekit.ir import parse_graph
    from fusekit.stitch.alone import AtenIndexing

    g = parse_graph(text)
    fast = AtenIndexing(g, "y")
    assert fast.kind == kind
    gen = torch.Generator().manual_seed(0)
    values = {}
    for name, spec in shapes.items():
        if name == "t":
            shape, high = spec
            dtype = getattr(torch, g.tensor("t").dtype)
            values[name] = torch.randint(0, high, shape, generator=gen).to(dtype)
        else:
            values[name] = torch.randn(*spec, generator=gen)
    want = reference_group(g, ["y"], values)["y"]
    got = fast(values)["y"]
    assert got.is_contiguous()
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    "text",
    [
        # two indirect axes
        "input x: float32[4,4]\ninput t: int64[3]\ntensor y: float32[3]\n"
        "y[i] = x[t[i],t[i]]\noutput y\n",
        # an index computed from the index tensor
        "input x: float32[9,2]\ninput t: int64[3]\ntensor y: float32[3,2]\n"
        "y[i,k] = x[t[i] + 1,k]\noutput y\n",
        # a gather broadcast over a variable the read lacks
        "input x: float32[9]\ninput t: int64[3]\ntensor y: float32[3,2]\n"
        "y[i,k] = x[t[i]]\noutput y\n",
    ],
)
def test_aten_indexing_refuses_what_one_call_cannot_spell(text):
    from fusekit.ir import parse_graph
    from fusekit.stitch.alone import AtenIndexing

    with pytest.raises(ValueError, match="stitch: y"):
        AtenIndexing(parse_graph(text), "y")
