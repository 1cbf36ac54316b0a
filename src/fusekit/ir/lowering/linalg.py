"""Contractions.

Linear, matmul/mm/bmm (dense, or with a sparse COO/CSR left operand), einsum, and scaled
dot-product attention split into its pieces.

::

    linear     Y[i,j,k] = sum_l X[i,j,l] * W[k,l] + b[k]
    bmm        Y[i,j,k] = sum_l A[i,j,l] * B[i,l,k]
    sdpa       s = sum_e q*k * scale;  p = softmax_t s;  Y[..,l,f] = sum_t p[..,l,t] * v[..,t,f]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fusekit.ir.expr import Access, Bin, Call, Const, Expr, IndexTerm, IVar, Reduce, ReduceOp
from fusekit.ir.lowering.base import Builder, Out, Unsupported, V, access, bcast, rule, variables
from fusekit.ir.lowering.reduce import softmax


def _batch_terms(
    shape: Sequence[int], out_vars: Sequence[str], out_shape: Sequence[int]
) -> list[IndexTerm]:
    """Index terms of leading (batch) dims, broadcast right-aligned to the output's batch dims."""
    view = V("_", tuple(shape), "float32")
    return list(bcast(view, out_vars, out_shape).indices)


def matmul_expr(a: V, c: V, out_shape: Sequence[int]) -> Expr:
    """``sum_k a[..., m, k] * c[..., k, n]`` with torch.matmul's 1-D and broadcasting rules."""
    out_vars = variables(len(out_shape))
    (k,) = variables(1, avoid=out_vars)
    if a.rank == 1 and c.rank == 1:
        a_terms: list[IndexTerm] = [IVar(k)]
        c_terms: list[IndexTerm] = [IVar(k)]
    elif c.rank == 1:
        batch = out_vars[:-1]
        a_terms = [*_batch_terms(a.shape[:-2], batch, out_shape[:-1]), IVar(out_vars[-1]), IVar(k)]
        c_terms = [IVar(k)]
    elif a.rank == 1:
        batch = out_vars[:-1]
        a_terms = [IVar(k)]
        c_terms = [*_batch_terms(c.shape[:-2], batch, out_shape[:-1]), IVar(k), IVar(out_vars[-1])]
    else:
        batch, m, n = out_vars[:-2], out_vars[-2], out_vars[-1]
        a_terms = [*_batch_terms(a.shape[:-2], batch, out_shape[:-2]), IVar(m), IVar(k)]
        c_terms = [*_batch_terms(c.shape[:-2], batch, out_shape[:-2]), IVar(k), IVar(n)]
    return Reduce(ReduceOp.SUM, (k,), Bin("*", access(a, a_terms), access(c, c_terms)))


@rule("matmul", "mm", "bmm", "_sparse_mm", "dot", "mv", "vdot")
def _matmul(b: Builder, o: Out, a: V, c: V, *args: Any) -> V:
    return b.emit(o.name, o.shape, o.dtype, matmul_expr(a, c, o.shape))


@rule("linear")
def _linear(b: Builder, o: Out, x: V, w: V, bias: V | None = None) -> V:
    out_vars = variables(len(o.shape))
    (k,) = variables(1, avoid=out_vars)
    x_terms = [IVar(v) for v in out_vars[:-1]] + [IVar(k)]
    expr: Expr = Reduce(
        ReduceOp.SUM, (k,), Bin("*", access(x, x_terms), access(w, [IVar(out_vars[-1]), IVar(k)]))
    )
    if bias is not None:
        expr = Bin("+", expr, bcast(bias, out_vars, o.shape))
    return b.emit(o.name, o.shape, o.dtype, expr)


@rule("addmm", "baddbmm", "addmv", "addbmm")
def _addmm(b: Builder, o: Out, bias: V, a: V, c: V, beta: Any = 1, alpha: Any = 1) -> V:
    if o.packet == "addbmm":
        raise Unsupported("addbmm (a sum over the batch)")
    out_vars = variables(len(o.shape))
    prod = matmul_expr(a, c, o.shape)
    term: Expr = bcast(bias, out_vars, o.shape)
    if beta != 1:
        term = Bin("*", Const(beta), term)
    if alpha != 1:
        prod = Bin("*", Const(alpha), prod)
    return b.emit(o.name, o.shape, o.dtype, Bin("+", term, prod) if beta != 0 else prod)


@rule("einsum")
def _einsum(b: Builder, o: Out, equation: str, tensors: Sequence[V], path: Any = None) -> V:
    spec = equation.replace(" ", "")
    if "." in spec:
        raise Unsupported("einsum with '...'")
    lhs, _, rhs = spec.partition("->")
    inputs = lhs.split(",")
    if "->" not in spec:
        letters = "".join(inputs)
        rhs = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    if len(set(rhs)) != len(rhs) or len(inputs) != len(tensors):
        raise Unsupported(f"einsum {equation!r}")
    reads = [
        Access(t.name, tuple(IVar(c) for c in sub)) for t, sub in zip(tensors, inputs, strict=True)
    ]
    body: Expr = reads[0]
    for read in reads[1:]:
        body = Bin("*", body, read)
    summed = tuple(dict.fromkeys(c for c in "".join(inputs) if c not in rhs))
    expr = Reduce(ReduceOp.SUM, summed, body) if summed else body
    return b.emit(o.name, o.shape, o.dtype, expr, [IVar(c) for c in rhs])


@rule("scaled_dot_product_attention")
def _sdpa(
    b: Builder,
    o: Out,
    q: V,
    k: V,
    v: V,
    attn_mask: V | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> V:
    import torch  # not at import: capture loads the rules with fusekit.ir

    if dropout_p > 0:
        raise ValueError("attention dropout is random; call model.eval() before capture")
    if enable_gqa:
        raise Unsupported("grouped-query attention")
    batch = o.shape[:-2]
    length, source = q.shape[-2], k.shape[-2]
    s_shape = (*batch, length, source)
    out_vars = variables(len(s_shape))
    (e,) = variables(1, avoid=out_vars)
    l_var, t_var = IVar(out_vars[-2]), IVar(out_vars[-1])
    q_read = access(q, [*_batch_terms(q.shape[:-2], out_vars[:-2], batch), l_var, IVar(e)])
    k_read = access(k, [*_batch_terms(k.shape[:-2], out_vars[:-2], batch), t_var, IVar(e)])
    factor = scale if scale is not None else 1.0 / float(q.shape[-1]) ** 0.5
    expr: Expr = Reduce(ReduceOp.SUM, (e,), Bin("*", Bin("*", q_read, k_read), Const(factor)))
    if is_causal:
        causal = torch.ones(length, source, dtype=torch.bool).tril()
        mask = b.constant(f"{o.name}_causal", causal)
        expr = Call("where", (bcast(mask, out_vars, s_shape), expr, Const(float("-inf"))))
    if attn_mask is not None:
        read = bcast(attn_mask, out_vars, s_shape)
        if attn_mask.dtype == "bool":
            expr = Call("where", (read, expr, Const(float("-inf"))))
        else:
            expr = Bin("+", expr, read)
    scores = b.emit(f"{o.name}_scores", s_shape, o.dtype, expr)
    probs = softmax(b, f"{o.name}_probs", scores, -1, o.dtype)
    f_vars = variables(len(o.shape))
    (t,) = variables(1, avoid=f_vars)
    p_read = access(probs, [*(IVar(x) for x in f_vars[:-1]), IVar(t)])
    v_terms: list[IndexTerm] = [
        *_batch_terms(v.shape[:-2], f_vars[:-2], batch),
        IVar(t),
        IVar(f_vars[-1]),
    ]
    out = Reduce(ReduceOp.SUM, (t,), Bin("*", p_read, access(v, v_terms)))
    return b.emit(o.name, o.shape, o.dtype, out)
