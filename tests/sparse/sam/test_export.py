"""Graphs out: a lowered statement written as a SAM graph reads back to the same network."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from fusekit.sparse.formats import from_dense, from_scipy
from fusekit.sparse.graph import run_statement
from fusekit.sparse.program import Operand, Statement
from fusekit.sparse.sam import parse_gv, read_gv, run, write_gv
from fusekit.sparse.sam.export import statement_graph, write_statement_graph

A = sp.random(12, 10, density=0.3, random_state=1, format="csr")
A2 = sp.random(12, 10, density=0.3, random_state=2, format="csr")
B = np.random.default_rng(0).standard_normal((10, 4))
INPUTS = {
    "A": from_scipy("A", A, "csr"),
    "A2": from_scipy("A2", A2, "csr"),
    "Ad": from_scipy("Ad", A, "dcsr"),
    "B": from_dense("B", B),
}
Ad, A2d = A.toarray(), A2.toarray()


def operand(text: str) -> Operand:
    name, _, idx = text.rstrip(")").partition("(")
    return Operand(name, tuple(idx.split(",")))


def st(
    combine: str,
    out_vars: str,
    a: str,
    b: str,
    reduce: str | None = None,
    epilogue: str | None = None,
) -> Statement:
    return Statement("C", tuple(out_vars), (operand(a), operand(b)), combine, reduce, epilogue)


CASES = [
    (st("mul", "ij", "A(i,k)", "B(k,j)", "sum"), "ikj", Ad @ B),  # accumulator
    (st("mul", "ij", "A(i,k)", "B(k,j)", "sum"), "ijk", Ad @ B),  # reducer, dense locate
    (st("mul", "ij", "A(i,k)", "A2(j,k)", "sum"), "ijk", Ad @ A2d.T),  # intersect, repeat
    (st("add", "ik", "A(i,k)", "A2(i,k)", None, "relu"), "ik", np.maximum(Ad + A2d, 0)),
    (st("sub", "ik", "A(i,k)", "A2(i,k)"), "ik", Ad - A2d),
]


@pytest.mark.parametrize(("statement", "order", "want"), CASES)
def test_written_graph_runs_the_same(statement: Statement, order: str, want: np.ndarray) -> None:
    base = run_statement(statement, tuple(order), INPUTS, depth=8)
    graph, dense = statement_graph(statement, tuple(order), INPUTS)
    back = parse_gv(write_gv(graph))
    assert back == graph
    res = run(back, dense, depth=8)
    assert res.cycles == base.cycles
    np.testing.assert_allclose(res.output, want, atol=1e-12)


def test_dcsr_and_file(tmp_path: Path) -> None:
    statement = st("mul", "ij", "Ad(i,k)", "B(k,j)", "sum")
    path = tmp_path / "c.gv"
    graph = write_statement_graph(path, statement, ("i", "k", "j"), INPUTS)
    assert graph.formats == {"C": "ss01", "Ad": "ss01", "B": "dd01"}
    assert read_gv(path) == graph
    _, dense = statement_graph(statement, ("i", "k", "j"), INPUTS)
    res = run(path, dense, depth=8)
    base = run_statement(statement, ("i", "k", "j"), INPUTS, depth=8)
    assert res.cycles == base.cycles
    np.testing.assert_allclose(res.output, Ad @ B, atol=1e-12)


def test_schedule_graphs_read_back(tmp_path: Path) -> None:
    """A two-statement region: each written graph runs to the lowering's cycles and output."""
    from fusekit.sparse.program import Program, reference
    from fusekit.sparse.sam.export import write_schedule_graphs
    from fusekit.sparse.schedule import Schedule

    h = Statement("H", ("i", "j"), (operand("A(i,k)"), operand("B(k,j)")), "mul", "sum", "relu")
    y = Statement("Y", ("i", "j"), (operand("H(i,j)"), operand("A2(i,j)")), "add")
    inputs = {"A": INPUTS["A"], "B": INPUTS["B"], "A2": from_scipy("A2", A2[:, :4], "csr")}
    program = Program("p", (h, y), inputs, ("Y",))
    orders = {"H": ("i", "k", "j"), "Y": ("i", "j")}
    schedule = Schedule("full", (("H", "Y"),), tuple(orders.items()))
    lines = write_schedule_graphs(program, schedule, tmp_path / "gv")
    assert lines == [f"wrote {tmp_path / 'gv' / 'region0_H.gv'}",
                     f"wrote {tmp_path / 'gv' / 'region0_Y.gv'}"]  # fmt: skip
    values = reference(program)
    stored = {**inputs, "H": from_dense("H", values["H"], "csr")}
    want = {"H": values["H"], "Y": values["H"] + A2[:, :4].toarray()}  # H stored as CSR
    for statement in (h, y):
        path = tmp_path / "gv" / f"region0_{statement.out}.gv"
        _, dense = statement_graph(statement, orders[statement.out], stored)
        res = run(path, dense, depth=8)
        base = run_statement(statement, orders[statement.out], stored, depth=8)
        assert res.cycles == base.cycles
        np.testing.assert_allclose(res.output, want[statement.out], atol=1e-12)
