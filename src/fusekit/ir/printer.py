"""Printing of index terms, expressions and tensor declarations in the IR's text form.

The grammar is :mod:`fusekit.ir.text`'s, which parses what this prints: parentheses appear only
where precedence needs them, so ``parse_expr(format_expr(e)) == e``. Ops and graphs print with
:func:`fusekit.ir.op.format_op` and :func:`fusekit.ir.graph.format_graph`, built on these.
"""

from __future__ import annotations

from fusekit.ir.expr import (
    Access,
    Bin,
    Call,
    Const,
    DTypeRef,
    Expr,
    IConst,
    IndexTerm,
    IVar,
    OpaqueArg,
    Reduce,
    TensorRef,
)
from fusekit.ir.tensor import Tensor

_ADD, _MUL, _UNARY, _ATOM = 1, 2, 3, 4


def _fmt_number(value: int | float) -> str:
    return str(value) if isinstance(value, int) else repr(value)


def _fmt_term(term: IndexTerm) -> tuple[str, int]:
    if isinstance(term, IVar):
        return term.name, _ATOM
    if isinstance(term, IConst):
        return str(term.value), _ATOM if term.value >= 0 else _UNARY
    if isinstance(term, Access):
        return f"{term.tensor}[{','.join(format_term(t) for t in term.indices)}]", _ATOM
    level = _ADD if term.op in "+-" else _MUL
    left, ll = _fmt_term(term.left)
    right, rl = _fmt_term(term.right)
    left = left if ll >= level else f"({left})"
    right = right if rl > level else f"({right})"
    return f"{left} {term.op} {right}" if level == _ADD else f"{left}{term.op}{right}", level


def format_term(term: IndexTerm) -> str:
    """Print an index term (``i*16 + j``, ``g[e]``)."""
    return _fmt_term(term)[0]


def format_access(acc: Access) -> str:
    """Print a tensor access (``X[g[e],k]``; a 0-d tensor bare: ``Y``)."""
    if not acc.indices:
        return acc.tensor
    return f"{acc.tensor}[{','.join(format_term(t) for t in acc.indices)}]"


def _wrap(expr: Expr, ctx: str) -> str:
    text, level = _fmt_expr(expr)
    if isinstance(expr, Reduce):
        return f"({text})" if ctx in ("mul_l", "mul_r", "neg") else text
    need = {"add_l": _ADD, "add_r": _MUL, "mul_l": _MUL, "mul_r": _UNARY, "neg": _UNARY}
    if ctx == "neg" and isinstance(expr, Const) and level == _ATOM:
        return f"({text})"
    return text if level >= need.get(ctx, 0) else f"({text})"


def _fmt_expr(expr: Expr) -> tuple[str, int]:
    if isinstance(expr, Access):
        return format_access(expr), _ATOM
    if isinstance(expr, Const):
        text = _fmt_number(expr.value)
        return text, _UNARY if text.startswith("-") else _ATOM
    if isinstance(expr, Call):
        if expr.fn == "neg":
            return "-" + _wrap(expr.args[0], "neg"), _UNARY
        return f"{expr.fn}({', '.join(_wrap(a, 'arg') for a in expr.args)})", _ATOM
    if isinstance(expr, Bin):
        side = "add" if expr.op in "+-" else "mul"
        left, right = _wrap(expr.left, side + "_l"), _wrap(expr.right, side + "_r")
        return f"{left} {expr.op} {right}", _ADD if side == "add" else _MUL
    if isinstance(expr, Reduce):
        names = expr.vars[0] if len(expr.vars) == 1 else "{" + ",".join(expr.vars) + "}"
        body, level = _fmt_expr(expr.body)
        if level < _MUL and not isinstance(expr.body, Reduce):
            body = f"({body})"
        return f"{expr.op.value}_{names} {body}", 0
    args = [_fmt_literal(a) for a in expr.args]
    args += [f"{k}={_fmt_literal(v)}" for k, v in expr.kwargs]
    tail = "" if expr.output is None else f"[{expr.output}]"
    return f"opaque {expr.target}({', '.join(args)}){tail}", 0


def _fmt_literal(arg: OpaqueArg) -> str:
    if isinstance(arg, TensorRef):
        return arg.name
    if isinstance(arg, DTypeRef):
        return f"torch.{arg.name}"
    if isinstance(arg, tuple):
        return "[" + ", ".join(_fmt_literal(a) for a in arg) + "]"
    if isinstance(arg, bool) or arg is None:
        return str(arg)
    if isinstance(arg, str):
        return repr(arg)
    return _fmt_number(arg)


def format_expr(expr: Expr) -> str:
    """Print a right-hand side."""
    return _fmt_expr(expr)[0]


def format_tensor(tensor: Tensor) -> str:
    """Print a declaration body: ``x: float32[2,16] {dense,compressed} nnz=7``."""
    text = f"{tensor.name}: {tensor.dtype}[{','.join(str(d) for d in tensor.shape)}]"
    if not tensor.format.is_dense or tensor.format.order is not None:
        text += " {" + ",".join(level.value for level in tensor.format.levels) + "}"
        if tensor.format.order is not None:
            text += "(" + ",".join(str(o) for o in tensor.format.order) + ")"
    if tensor.stats is not None and tensor.stats.nnz is not None:
        text += f" nnz={tensor.stats.nnz}"
    if tensor.stats is not None and tensor.stats.segment_sizes is not None:
        text += " segments=[" + ",".join(str(s) for s in tensor.stats.segment_sizes) + "]"
    return text
