"""Programs from the shared IR: a captured sparse PyTorch model, or index-notation text.

The IR graph (:mod:`fusekit.ir`) already holds the ops in index notation; each op becomes one
statement when it has a form the streaming machine runs::

    Y[i,j] = sum_k A[i,k] * B[k,j]     (or  Y[i,j] += A[i,k] * B[k,j])   mul, sum
    Y[i,j] = max_k A[i,k]                                                copy, max
    Y[i,j] = relu(X[i,j])    exp, sigmoid, neg                           copy + epilogue
    Y[i,j] = relu(sum_k A[i,k] * B[k,j])                                 mul, sum, epilogue
    Y[i,j] = A[i,j] + B[i,j]   - * / and max(A, B)                       binary, union

Anything else (gathers, scatters, opaque ops, constants) raises ``ValueError`` naming the op.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fusekit.errors import expected
from fusekit.ir import Access, Bin, Call, Graph, IVar, Op, Reduce, ReduceOp, capture, parse_graph
from fusekit.sparse.formats import SparseTensor, from_dense, from_scipy, from_torch
from fusekit.sparse.program import UNARY, Operand, Program, Statement


def _operand(acc: Any, where: str) -> Operand:
    if not isinstance(acc, Access) or not all(isinstance(t, IVar) for t in acc.indices):
        raise ValueError(expected(where, "operand", "a plain access T[i,j,...]", acc))
    return Operand(acc.tensor, tuple(t.name for t in acc.indices if isinstance(t, IVar)))


def statement_of(op: Op) -> Statement:
    """The statement of one IR op.

    Raises:
        ValueError: for an op the streaming machine does not run, naming it.
    """
    where = f"sparse frontend, op {op.name}"
    if not op.out.is_plain:
        raise ValueError(expected(where, "output", "distinct index variables", op.out))
    out_vars = tuple(t.name for t in op.out.indices if isinstance(t, IVar))
    expr = op.expr
    epilogue = None
    if isinstance(expr, Call) and expr.fn in UNARY and len(expr.args) == 1:
        epilogue, expr = expr.fn, expr.args[0]
    reduce = "sum" if op.accumulate and op.summed_vars else None
    if isinstance(expr, Reduce):
        if expr.op not in (ReduceOp.SUM, ReduceOp.MAX):
            raise ValueError(expected(where, "reduction", "sum or max", expr.op.value))
        reduce, expr = expr.op.value, expr.body
    if isinstance(expr, Access):
        return Statement(op.name, out_vars, (_operand(expr, where),), "copy", reduce, epilogue)
    if isinstance(expr, Bin):
        factors: list[Any] = []

        def flatten(e: Any) -> None:
            if isinstance(e, Bin) and e.op == "*":
                flatten(e.left)
                flatten(e.right)
            else:
                factors.append(e)

        if expr.op == "*":
            flatten(expr)
            return Statement(
                op.name,
                out_vars,
                tuple(_operand(f, where) for f in factors),
                "mul",
                reduce,
                epilogue,
            )
        combine = {"+": "add", "-": "sub", "/": "div"}[expr.op]
        ops = (_operand(expr.left, where), _operand(expr.right, where))
        return Statement(op.name, out_vars, ops, combine, reduce, epilogue)
    if isinstance(expr, Call) and expr.fn == "max" and len(expr.args) == 2:
        ops = (_operand(expr.args[0], where), _operand(expr.args[1], where))
        return Statement(op.name, out_vars, ops, "max", reduce, epilogue)
    raise ValueError(
        expected(
            where, "expression", "a product, a map, a binary op or a reduction of accesses", expr
        )
    )


def from_graph(graph: Graph, values: Mapping[str, Any], name: str | None = None) -> Program:
    """A program from an IR graph and the values of its inputs and params.

    Args:
        graph: the IR graph (e.g. ``capture(model, args).graph``).
        values: a value per input and param: torch tensors (strided or sparse), SciPy matrices
            or :class:`SparseTensor`.
        name: the program's name (the graph's by default).

    Raises:
        ValueError: for an op the machine does not run, or a missing value.
    """
    statements = tuple(statement_of(op) for op in graph.ops)
    inputs: dict[str, SparseTensor] = {}
    for t in (*graph.inputs, *graph.params):
        if t not in values:
            raise ValueError(
                expected("sparse frontend", t, "a value for every input and param", "missing")
            )
        inputs[t] = _stored(t, values[t])
    return Program(name or graph.name, statements, inputs, tuple(graph.outputs))


def _stored(name: str, value: Any) -> SparseTensor:
    if isinstance(value, SparseTensor):
        return value
    import scipy.sparse as sp  # slow to load, and a program from text needs none

    if sp.issparse(value):
        return from_scipy(
            name, value, value.format if value.format in ("csr", "csc", "coo") else "csr"
        )
    if hasattr(value, "layout"):
        return from_torch(name, value)
    return from_dense(name, np.asarray(value))


def from_text(text: str, values: Mapping[str, Any]) -> Program:
    """A program from the IR's text form (``graph``, declarations, op lines, ``output``).

    Example::

        graph spmm
        param A: float32[4,4] {dense,compressed}
        input B: float32[4,2]
        tensor C: float32[4,2]
        C[i,j] = sum_k A[i,k] * B[k,j]
        output C
    """
    return from_graph(parse_graph(text), values)


def from_module(model: Any, args: tuple[Any, ...]) -> Program:
    """Capture a (sparse) PyTorch module with :func:`fusekit.ir.capture` and build its program."""
    cap = capture(model, args)
    return from_graph(cap.graph, cap.values(*args))
