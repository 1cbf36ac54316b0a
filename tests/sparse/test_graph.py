"""The fast simulator against the per-token reference machine, statement by statement."""

import contextlib
import itertools
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import assume, given, settings
from hypothesis import strategies as st_

from fusekit.sparse.formats import SparseTensor, from_coords, from_dense, from_scipy
from fusekit.sparse.graph import run_statement
from fusekit.sparse.machine import Machine
from fusekit.sparse.program import Operand, Program, Statement, reference
from fusekit.sparse.simulate import _stored_value, simulate_region
from fusekit.sparse.streams import check_order
from fusekit.sparse.workloads import autoencoder, bigbird, gcn, graphsage

RNG = np.random.default_rng(0)
A = sp.random(12, 10, density=0.3, random_state=1, format="csr")
A2 = sp.random(12, 10, density=0.3, random_state=2, format="csr")
B = RNG.standard_normal((10, 4))
INPUTS = {
    "A": from_scipy("A", A, "csr"),
    "A2": from_scipy("A2", A2, "csr"),
    "B": from_dense("B", B),
    "Bt": from_dense("Bt", B.T.copy()),
}
SPMM = Statement(
    "C", ("i", "j"), (Operand("A", ("i", "k")), Operand("B", ("k", "j"))), "mul", "sum"
)
SDDMM = Statement(
    "C", ("i", "j"), (Operand("A", ("i", "k")), Operand("A2", ("j", "k"))), "mul", "sum"
)
ADD = Statement(
    "C", ("i", "k"), (Operand("A", ("i", "k")), Operand("A2", ("i", "k"))), "add", None, "relu"
)
CASES = [
    (SPMM, ("i", "k", "j")),  # Gustavson: sparse accumulator
    (SPMM, ("i", "j", "k")),  # inner product: reducer
    (SDDMM, ("i", "j", "k")),  # intersection of two compressed levels
    (ADD, ("i", "k")),  # union, then an epilogue
]


def _with_empty_rows(inputs: dict[str, SparseTensor], rows: tuple[int, ...]) -> dict[str, Any]:
    """The inputs with the given rows of every sparse matrix emptied (stored, not dropped)."""
    out: dict[str, Any] = {}
    for name, t in inputs.items():
        if t.is_dense or t.rank != 2:
            out[name] = t
            continue
        a = t.to_dense()
        a[[r for r in rows if r < a.shape[0]], :] = 0
        out[name] = from_scipy(name, sp.csr_matrix(a), t.format)
    return out


def assert_counts_equal(
    st: Statement, order: tuple[str, ...], inputs: dict[str, SparseTensor]
) -> tuple[Any, Any, SparseTensor]:
    """Run ``st`` on both machines: every primitive's tokens equal, cycles within 10%.

    Returns the per-token run, the fast simulator's region and its output.
    """
    program = Program("t", (st,), inputs, (st.out,))
    tokens = run_statement(st, order, inputs, depth=8)
    values = dict(inputs)
    fast = simulate_region(program, (st,), {st.out: order}, values, Machine(memory=None))
    prims = {p.name: p for p in fast.prims}
    counted = {name: prims[name].tokens if name in prims else None for name in tokens.tokens}
    assert counted == tokens.tokens, f"{st} in order {order}"
    # the lowering has no coordinate dropper: it streams a 0 for an empty intersection
    assert all(p.kind == "dropper" for name, p in prims.items() if name not in tokens.tokens)
    # cycles: the analytic model (busiest primitive + fill) against the cycle-by-cycle engine;
    # below 60 cycles the pipeline fill dominates, and the model is within 6 cycles of it
    assert abs(fast.cycles - tokens.cycles) <= max(0.1 * tokens.cycles, 6), (st, order)
    return tokens, fast, values[st.out]


@pytest.mark.parametrize("empty", [(), (2, 5, 9)], ids=["as-is", "3-empty-rows"])
@pytest.mark.parametrize(("st", "order"), CASES)
def test_fast_simulator_matches_reference_machine(
    st: Statement, order: tuple[str, ...], empty: tuple[int, ...]
) -> None:
    inputs = _with_empty_rows(INPUTS, empty)
    tokens, fast, out = assert_counts_equal(st, order, inputs)
    # functional: the same values, equal to the numpy reference
    program = Program("t", (st,), inputs, ("C",))
    np.testing.assert_allclose(out.to_dense(), reference(program)["C"], atol=1e-12)
    stored, streamed = out.values, np.array(tokens.values)
    # without a coordinate dropper the machine streams a 0 for every empty intersection
    np.testing.assert_allclose(
        np.sort(streamed[streamed != 0]), np.sort(stored[stored != 0]), atol=1e-12
    )
    # busy cycles: one firing per token sent or taken (the accumulator drains while it reads)
    for p in fast.prims:
        if p.name in tokens.firings:
            assert p.busy_cycles == pytest.approx(tokens.firings[p.name], rel=0.1), p.name
    assert fast.cycles == pytest.approx(tokens.cycles, rel=0.1)


def test_union_joins_a_dense_level_of_a_sparse_operand() -> None:
    # A keeps rows 0 and 2 (DCSR: compressed rows), A2 every row but 1 (CSR: a dense row
    # level); a located row level would lose A2's row 3, and A's absent rows would reach it
    # as N. Both machines join the dense level instead, and equal the reference.
    a = np.zeros((4, 5))
    a[0, [1, 3]], a[2, 0] = 1.0, 2.0
    a2 = np.zeros((4, 5))
    a2[0, 3], a2[2, 0], a2[2, 4], a2[3, 2] = 3.0, 4.0, 5.0, 6.0
    inputs = {
        "A": from_scipy("A", sp.csr_matrix(a), "dcsr"),
        "A2": from_scipy("A2", sp.csr_matrix(a2), "csr"),
    }
    st = Statement("C", ("i", "k"), (Operand("A", ("i", "k")), Operand("A2", ("i", "k"))), "add")
    tokens, _, out = assert_counts_equal(st, ("i", "k"), inputs)
    np.testing.assert_allclose(out.to_dense(), a + a2)
    assert sorted(tokens.values) == sorted((a + a2)[(a + a2) != 0].tolist())
    # 3-D: A's k level dense under a compressed j, B's compressed; j=0 is A's alone
    shape = (1, 2, 2)
    a3 = np.array([[[0.5, -0.7], [0.0, 0.0]]])
    b3 = np.array([[[0.0, 0.0], [2.0, 0.0]]])
    inputs3 = {
        n: from_coords(n, shape, np.argwhere(x != 0), x[x != 0], (0, 1, 2))
        for n, x in (("A", a3), ("B", b3))
    }
    st3 = Statement(
        "C", ("i", "j", "k"), (Operand("A", ("i", "j", "k")), Operand("B", ("i", "j", "k"))), "add"
    )
    _, _, out3 = assert_counts_equal(st3, ("i", "j", "k"), inputs3)
    np.testing.assert_allclose(out3.to_dense(), a3 + b3)


# -- every program of tests/sparse, with empty fibers ---------------------------------------------
def _lowerable_orders(st: Statement, inputs: dict[str, SparseTensor]) -> list[tuple[str, ...]]:
    """The orders of ``st`` both machines take (the lowering's limits; see graph.py)."""
    tensors = {o.tensor: _stored_value(inputs[o.tensor]) for o in st.operands}
    if len(st.operands) > 2 or len(st.reduce_vars) > 1:
        return []
    out = []
    for order in itertools.permutations(st.vars):
        try:
            check_order(st, order, tensors)
        except ValueError:
            continue
        if not st.reduce_vars or st.reduce_vars[0] in order[-2:]:
            out.append(order)
    return out


def _run_program(program: Program) -> int:
    """Every statement of ``program`` on both machines, in every order they take; the count."""
    values: dict[str, SparseTensor] = dict(program.inputs)
    compared = 0
    for st in program.statements:
        inputs = {o.tensor: values[o.tensor] for o in st.operands}
        orders = _lowerable_orders(st, inputs)
        for order in orders:
            assert_counts_equal(st, order, inputs)
            compared += 1
        one = Program("t", (st,), inputs, (st.out,))
        order = orders[0] if orders else st.vars
        with contextlib.suppress(ValueError):  # an order the fast simulator refuses
            values_st = dict(inputs)
            simulate_region(one, (st,), {st.out: order}, values_st, Machine(memory=None))
            values[st.out] = values_st[st.out]
            continue
        values[st.out] = from_dense(st.out, reference(program)[st.out])
    return compared


def _shrunk(program: Program, seed: int) -> Program:
    """``program``'s statements over small random inputs of the same formats, a third of the
    rows of every sparse matrix empty (sizes map consistently: one small size per size)."""
    rng = np.random.default_rng(seed)
    sizes = sorted({n for t in program.inputs.values() for n in t.shape}, reverse=True)
    small = dict(zip(sizes, (9, 7, 5, 4, 3, 6, 8, 2), strict=False))
    inputs: dict[str, SparseTensor] = {}
    for name, t in program.inputs.items():
        shape = tuple(small[n] for n in t.shape)
        if t.is_dense:
            inputs[name] = from_dense(name, rng.standard_normal(shape))
            continue
        a = sp.random(*shape, density=0.4, random_state=rng).toarray()
        a[rng.choice(shape[0], size=shape[0] // 3, replace=False)] = 0
        inputs[name] = from_scipy(name, sp.csr_matrix(a), t.format)
    return Program(program.name, program.statements, inputs, program.outputs)


def _bigbird_small() -> Program:
    """BigBird attention over 4x4 blocks of 4 tokens, block row 3 and block column 2 empty."""
    p = bigbird(tokens=16, block=4, head_dim=4).program
    mask = np.kron(
        np.array([[1, 1, 0, 1], [1, 0, 0, 1], [0, 1, 0, 1], [0, 0, 0, 0]]), np.ones((4, 4))
    )
    m = from_scipy("M", sp.csr_matrix(mask), "bcsr", block=4)
    return Program(p.name, p.statements, {**p.inputs, "M": m}, p.outputs)


def _tiny_gcn() -> Program:
    import torch

    from fusekit.sparse.frontend import from_module

    class TinyGCN(torch.nn.Module):  # tests/sparse/test_frontend.py's model
        def __init__(self, adj: torch.Tensor) -> None:
            super().__init__()
            self.register_buffer("adj", adj)
            self.l1 = torch.nn.Linear(8, 4, bias=False)
            self.l2 = torch.nn.Linear(4, 3, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(torch.sparse.mm(self.adj, self.l1(x)))
            return torch.sparse.mm(self.adj, self.l2(h))

    torch.manual_seed(0)
    dense = (torch.rand(10, 10) < 0.3).float() * torch.rand(10, 10)
    dense[[1, 4, 7]] = 0  # isolated nodes: empty rows
    return from_module(TinyGCN(dense.to_sparse_csr()).eval(), (torch.randn(10, 8),))


def _spmm_text() -> Program:
    from fusekit.sparse.frontend import from_text

    text = """graph spmm
param A: float32[4,4] {dense,compressed}
input B: float32[4,2]
tensor C: float32[4,2]
C[i,j] = relu(sum_k A[i,k] * B[k,j])
output C"""  # tests/sparse/test_frontend.py's program
    a = sp.random(4, 4, density=0.5, random_state=0, format="csr")
    return from_text(text, {"A": a, "B": np.arange(8.0).reshape(4, 2) - 3})


PROGRAMS = {
    "gcn": lambda: _shrunk(gcn("cora").program, 0),
    "graphsage": lambda: _shrunk(graphsage("cora").program, 1),
    "autoencoder": lambda: _shrunk(autoencoder().program, 2),
    "bigbird": _bigbird_small,
    "tiny-gcn": _tiny_gcn,
    "spmm-text": lambda: _shrunk(_spmm_text(), 3),
    "dense-mm": lambda: _shrunk(
        Program(
            "mm",
            (SPMM,),
            {"A": from_dense("A", np.ones((2, 3))), "B": from_dense("B", np.ones((3, 4)))},
            ("C",),
        ),
        4,
    ),
}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_every_program_counts_as_the_reference_machine(name: str) -> None:
    assert _run_program(PROGRAMS[name]()) > 0


# -- random statements, property-based ------------------------------------------------------------
FORMS = ("spmm", "sddmm", "union", "elementwise", "row-reduce", "union-3d", "contract-3d")


@st_.composite
def _statements(draw: st_.DrawFn) -> tuple[Statement, dict[str, SparseTensor]]:
    """A statement of one of :data:`FORMS` over small random inputs with empty fibers."""
    form = draw(st_.sampled_from(FORMS))
    rng = np.random.default_rng(draw(st_.integers(0, 2**16)))
    m, k, n = (draw(st_.integers(1, 7)) for _ in range(3))

    def matrix(name: str, shape: tuple[int, int], fmt: str | None = None) -> SparseTensor:
        density = draw(st_.sampled_from((0.0, 0.15, 0.4, 1.0)))
        fmt = fmt or draw(st_.sampled_from(("csr", "csc", "dcsr", "dense")))
        a = sp.random(*shape, density=density, random_state=rng).toarray()
        empty = draw(st_.lists(st_.integers(0, shape[0] - 1), max_size=2))
        a[empty] = 0
        return from_dense(name, a) if fmt == "dense" else from_scipy(name, sp.csr_matrix(a), fmt)

    def csf(name: str, shape: tuple[int, ...]) -> SparseTensor:
        density = draw(st_.sampled_from((0.1, 0.3, 0.6)))
        a = (rng.random(shape) < density) * rng.standard_normal(shape)
        coords = np.argwhere(a != 0)
        return from_coords(name, shape, coords, a[tuple(coords.T)], tuple(range(len(shape))))

    def op(t: str, *v: str) -> Operand:
        return Operand(t, v)

    if form == "spmm":
        ins = {"A": matrix("A", (m, k)), "B": matrix("B", (k, n))}
        s = Statement("C", ("i", "j"), (op("A", "i", "k"), op("B", "k", "j")), "mul", "sum")
    elif form == "sddmm":
        ins = {"A": matrix("A", (m, k)), "A2": matrix("A2", (n, k))}
        s = Statement("C", ("i", "j"), (op("A", "i", "k"), op("A2", "j", "k")), "mul", "sum")
    elif form in ("union", "elementwise"):
        fmt = draw(st_.sampled_from(("csr", "csc", "dcsr")))
        ins = {"A": matrix("A", (m, k), fmt), "A2": matrix("A2", (m, k), fmt)}
        combine = draw(st_.sampled_from(("add", "sub", "max") if form == "union" else ("mul",)))
        epilogue = draw(st_.sampled_from((None, "relu")))
        ops = (op("A", "i", "k"), op("A2", "i", "k"))
        s = Statement("C", ("i", "k"), ops, combine, None, epilogue)
    elif form == "row-reduce":
        ins = {"A": matrix("A", (m, k))}
        reduce = draw(st_.sampled_from(("sum", "max")))
        s = Statement("C", ("i",), (op("A", "i", "k"),), "copy", reduce)
    elif form == "union-3d":  # a unioner's absent side reaches the next level's scanner as N
        shape = (m, k, n)
        ins = {"A": csf("A", shape), "B": csf("B", shape)}
        ops = (op("A", "i", "j", "k"), op("B", "i", "j", "k"))
        s = Statement("C", ("i", "j", "k"), ops, draw(st_.sampled_from(("add", "max"))))
    else:  # empty fibers two levels up: their stops run down every deeper stream
        ins = {"A": csf("A", (m, k, n)), "B": from_dense("B", rng.standard_normal(n))}
        s = Statement("C", ("i", "j"), (op("A", "i", "j", "k"), op("B", "k")), "mul", "sum")
    return s, ins


@settings(max_examples=200, deadline=None)
@given(_statements(), st_.data())
def test_random_statements_count_as_the_reference_machine(
    case: tuple[Statement, dict[str, SparseTensor]], data: st_.DataObject
) -> None:
    statement, inputs = case
    orders = _lowerable_orders(statement, inputs)
    assume(orders)
    order = data.draw(st_.sampled_from(orders))
    assert_counts_equal(statement, order, inputs)


def test_small_fifos_cost_cycles_on_the_reference_machine() -> None:
    def cycles(depth: int) -> int:
        return run_statement(SPMM, ("i", "k", "j"), INPUTS, depth=depth).cycles

    # FIFO depth 1 stalls but never deadlocks: a repeat holds its reference in a register
    assert cycles(1) > cycles(2) > cycles(3) > cycles(4) == cycles(8)
