"""A small TACO index-notation evaluator (numpy einsum) for the SAM graph tests.

Handles ``out(idx) = term (+|- term)*`` where a term is a product of tensors ``T(i,j)`` and
scalars ``b`` (order-0 tensors, written without parentheses); indices on the right-hand side
only are summed within their term.
"""

from __future__ import annotations

import re

import numpy as np

_TENSOR = re.compile(r"\s*([A-Za-z_]\w*)\s*(?:\(([^)]*)\))?\s*")


def parse(expr: str) -> tuple[str, str, list[tuple[int, list[tuple[str, str]]]]]:
    """``(out, out_indices, [(sign, [(tensor, indices), ...]), ...])``."""
    lhs, rhs = expr.split("=")
    m = _TENSOR.fullmatch(lhs)
    assert m is not None, lhs
    out, out_idx = m.group(1), (m.group(2) or "").replace(",", "").replace(" ", "")
    terms = []
    for sign, body in re.findall(r"([+-]?)\s*([^+-]+)", rhs):
        factors = []
        for f in body.split("*"):
            fm = _TENSOR.fullmatch(f)
            assert fm is not None, f
            factors.append((fm.group(1), (fm.group(2) or "").replace(",", "").replace(" ", "")))
        terms.append((-1 if sign == "-" else 1, factors))
    return out, out_idx, terms


def evaluate(expr: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The expression's value on dense ``inputs`` (0-d arrays for scalars)."""
    _, out_idx, terms = parse(expr)
    total: np.ndarray | None = None
    for sign, factors in terms:
        spec = ",".join(idx for _, idx in factors) + "->" + out_idx
        val = sign * np.einsum(spec, *(np.asarray(inputs[t], dtype=np.float64) for t, _ in factors))
        total = val if total is None else total + val
    assert total is not None
    return np.asarray(total)


def extents(expr: str, size: int, small: int) -> dict[str, int]:
    """An extent per index variable: ``size`` for matrices and vectors, ``small`` in 3-D terms."""
    _, _, terms = parse(expr)
    dims: dict[str, int] = {}
    for _, factors in terms:
        for _, idx in factors:
            for v in idx:
                dims.setdefault(v, size)
    big = max((len(idx) for _, fs in terms for _, idx in fs), default=0)
    if big >= 3:
        dims = {v: small for v in dims}
    return dims
