"""Reductions and the composite ops built on them (softmax, layer/RMS norm, variance, var_mean).

::

    sum dim 1          Y[i] = sum_j X[i,j]
    softmax dim -1     mx[i] = max_j x[i,j]; e[i,j] = exp(x[i,j] - mx[i]);
                       z[i] = sum_j e[i,j]; y[i,j] = e[i,j] / z[i]
    layer_norm         m[i] = mean_j x[i,j]; c[i,j] = x[i,j] - m[i];
                       v[i] = mean_j c[i,j] * c[i,j];
                       y[i,j] = c[i,j] * rsqrt(v[i] + eps) * w[j] + b[j]
    rms_norm           ms[i] = mean_j x[i,j] * x[i,j]; y[i,j] = x[i,j] * rsqrt(ms[i] + eps) * w[j]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fusekit.ir.expr import Access, Bin, Call, Const, Expr, IConst, IVar, Reduce, ReduceOp
from fusekit.ir.lowering.base import (
    Builder,
    Out,
    V,
    access,
    bcast,
    dim_of,
    dims_of,
    ivars,
    product,
    rule,
    variables,
)


def split_vars(rank: int, dims: Sequence[int]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Variables for a reduction over ``dims`` of a rank-``rank`` input: (kept, reduced)."""
    kept = variables(rank - len(dims))
    return kept, variables(len(dims), avoid=kept)


def input_terms(
    rank: int, dims: Sequence[int], kept: Sequence[str], red: Sequence[str]
) -> list[IVar]:
    """The input's index terms: reduced dims get ``red``, the others ``kept`` in order."""
    k = r = 0
    terms = []
    for d in range(rank):
        if d in dims:
            terms.append(IVar(red[r]))
            r += 1
        else:
            terms.append(IVar(kept[k]))
            k += 1
    return terms


def out_terms(
    rank: int, dims: Sequence[int], kept: Sequence[str], red: Sequence[str], keepdim: bool
) -> list[IVar] | None:
    """Output terms under ``keepdim``: ``kept``, plus fresh size-1 variables at reduced dims."""
    if not keepdim:
        return None
    ones = list(variables(len(dims), avoid=(*kept, *red)))
    kept_iter = iter(kept)
    return [IVar(ones.pop(0) if d in dims else next(kept_iter)) for d in range(rank)]


def reduction(
    b: Builder,
    name: str,
    shape: tuple[int, ...],
    dtype: str,
    x: V,
    dims: Sequence[int],
    op: ReduceOp,
    keepdim: bool = False,
) -> V:
    """Emit ``name[kept] = op_{red} x[...]``."""
    kept, red = split_vars(x.rank, dims)
    expr = Reduce(op, red, access(x, input_terms(x.rank, dims, kept, red)))
    return b.emit(name, shape, dtype, expr, out_terms(x.rank, dims, kept, red, keepdim))


def _reduce_rule(op: ReduceOp) -> Any:
    def lower(b: Builder, o: Out, x: V, dim: Any = None, keepdim: bool = False, **kw: Any) -> Any:
        if isinstance(dim, V):  # max.other / min.other: elementwise
            fn = "max" if op is ReduceOp.MAX else "min"
            out_vars = variables(len(o.shape))
            args = (bcast(x, out_vars, o.shape), bcast(dim, out_vars, o.shape))
            return b.emit(o.name, o.shape, o.dtype, Call(fn, args))
        dims = dims_of(dim, x.rank)
        values = reduction(b, o.name, o.shape, o.dtype, x, dims, op, keepdim)
        if len(o.metas) == 2 and isinstance(dim, int):  # (values, indices)
            return values, b.opaque(1)
        return values

    return lower


rule("sum")(_reduce_rule(ReduceOp.SUM))
rule("mean")(_reduce_rule(ReduceOp.MEAN))
rule("amax", "max")(_reduce_rule(ReduceOp.MAX))
rule("amin", "min")(_reduce_rule(ReduceOp.MIN))
rule("prod")(_reduce_rule(ReduceOp.PROD))


def _variance(
    x: V, dims: Sequence[int], kept: Sequence[str], red: Sequence[str], mean: Access, corr: float
) -> Expr:
    """``sum_red (x - mean)^2 / (n - corr)``, reading the row's mean at ``mean``."""
    centred = Bin("-", access(x, input_terms(x.rank, dims, kept, red)), mean)
    count = product([x.shape[d] for d in dims]) - corr
    return Bin("/", Reduce(ReduceOp.SUM, tuple(red), Bin("*", centred, centred)), Const(count))


@rule("var", "std")
def _var(
    b: Builder,
    o: Out,
    x: V,
    dim: Any = None,
    unbiased: bool = True,
    keepdim: bool = False,
    correction: float | None = None,
) -> V:
    dims = dims_of(dim, x.rank)
    kept, red = split_vars(x.rank, dims)
    corr = correction if correction is not None else (1 if unbiased else 0)
    m_shape = tuple(s for d, s in enumerate(x.shape) if d not in dims)
    mean = reduction(b, f"{o.name}_mean", m_shape, o.dtype, x, dims, ReduceOp.MEAN)
    expr = _variance(x, dims, kept, red, access(mean, ivars(kept)), corr)
    if o.packet == "std":
        expr = Call("sqrt", (expr,))
    return b.emit(o.name, o.shape, o.dtype, expr, out_terms(x.rank, dims, kept, red, keepdim))


def _mean_terms(rank: int, dims: Sequence[int], kept: Sequence[str], keepdim: bool) -> list[Any]:
    """How a reduced value is read at a row ``kept``: size-1 dims (``keepdim``) read index 0."""
    if not keepdim:
        return list(ivars(kept))
    it = iter(kept)
    return [IConst(0) if d in dims else IVar(next(it)) for d in range(rank)]


@rule("var_mean")
def _var_mean(
    b: Builder,
    o: Out,
    x: V,
    dim: Any = None,
    unbiased: bool = True,
    keepdim: bool = False,
    correction: float | None = None,
) -> tuple[V, V]:
    """``(var, mean)``: the decomposition of layer norm (the mean is shared, not recomputed).

    ::

        m[i] = mean_j x[i,j];  v[i] = sum_j (x[i,j] - m[i])^2 / (n - correction)
    """
    dims = dims_of(dim, x.rank)
    kept, red = split_vars(x.rank, dims)
    corr = correction if correction is not None else (1 if unbiased else 0)
    (v_shape, v_dtype), (m_shape, m_dtype) = o.metas
    mean = reduction(b, f"{o.name}_mean", m_shape, m_dtype, x, dims, ReduceOp.MEAN, keepdim)
    at_mean = Access(mean.name, tuple(_mean_terms(x.rank, dims, kept, keepdim)))
    expr = _variance(x, dims, kept, red, at_mean, corr)
    var = b.emit(o.name, v_shape, v_dtype, expr, out_terms(x.rank, dims, kept, red, keepdim))
    return var, mean


def softmax(b: Builder, name: str, x: V, dim: int, dtype: str, log: bool = False) -> V:
    """Emit softmax (or log-softmax) of ``x`` over ``dim`` as max, exp, sum and divide."""
    dim = dim_of(dim, x.rank)
    kept, (r,) = split_vars(x.rank, [dim])
    full = ivars(variables(x.rank))
    row_terms = [t for d, t in enumerate(full) if d != dim]
    at_r = input_terms(x.rank, [dim], kept, [r])
    row_shape = tuple(s for d, s in enumerate(x.shape) if d != dim)
    mx = reduction(b, f"{name}_max", row_shape, dtype, x, [dim], ReduceOp.MAX)
    if log:
        shifted = Call("exp", (Bin("-", access(x, at_r), access(mx, ivars(kept))),))
        z = b.emit(f"{name}_sum", row_shape, dtype, Reduce(ReduceOp.SUM, (r,), shifted))
        centred = Bin("-", access(x, full), access(mx, row_terms))
        return b.emit(name, x.shape, dtype, Bin("-", centred, Call("log", (access(z, row_terms),))))
    e_expr = Call("exp", (Bin("-", access(x, full), access(mx, row_terms)),))
    e = b.emit(f"{name}_exp", x.shape, dtype, e_expr)
    z = reduction(b, f"{name}_sum", row_shape, dtype, e, [dim], ReduceOp.SUM)
    return b.emit(name, x.shape, dtype, Bin("/", access(e, full), access(z, row_terms)))


@rule("softmax", "_softmax", "log_softmax", "_log_softmax")
def _softmax(b: Builder, o: Out, x: V, dim: int, *args: Any, **kwargs: Any) -> V:
    if o.dtype != x.dtype:
        x = b.emit(f"{o.name}_in", x.shape, o.dtype, access(x, ivars(variables(x.rank))))
    return softmax(b, o.name, x, dim, o.dtype, log="log" in o.packet)


def _affine_tail(
    expr: Expr, weight: V | None, bias: V | None, names: Sequence[str], shape: tuple[int, ...]
) -> Expr:
    if weight is not None:
        expr = Bin("*", expr, bcast(weight, names, shape))
    if bias is not None:
        expr = Bin("+", expr, bcast(bias, names, shape))
    return expr


@rule("layer_norm")
def _layer_norm(
    b: Builder,
    o: Out,
    x: V,
    normalized_shape: Sequence[int],
    weight: V | None = None,
    bias: V | None = None,
    eps: float = 1e-5,
    *args: Any,
) -> V:
    dims = list(range(x.rank - len(normalized_shape), x.rank))
    kept, red = split_vars(x.rank, dims)
    full = ivars(variables(x.rank))
    rows = full[: len(kept)]
    row_shape = x.shape[: len(kept)]
    mean = reduction(b, f"{o.name}_mean", row_shape, o.dtype, x, dims, ReduceOp.MEAN)
    centred = b.emit(
        f"{o.name}_cent", x.shape, o.dtype, Bin("-", access(x, full), access(mean, rows))
    )
    at_red = access(centred, input_terms(x.rank, dims, kept, red))
    var = b.emit(
        f"{o.name}_var", row_shape, o.dtype, Reduce(ReduceOp.MEAN, red, Bin("*", at_red, at_red))
    )
    scale = Call("rsqrt", (Bin("+", access(var, rows), Const(float(eps))),))
    expr = _affine_tail(
        Bin("*", access(centred, full), scale), weight, bias, variables(x.rank), x.shape
    )
    return b.emit(o.name, o.shape, o.dtype, expr)


@rule("rms_norm")
def _rms_norm(
    b: Builder,
    o: Out,
    x: V,
    normalized_shape: Sequence[int],
    weight: V | None = None,
    eps: float | None = None,
) -> V:
    import torch  # not at import: capture loads the rules with fusekit.ir

    if eps is None:
        eps = float(torch.finfo(getattr(torch, x.dtype)).eps)
    dims = list(range(x.rank - len(normalized_shape), x.rank))
    kept, red = split_vars(x.rank, dims)
    full = ivars(variables(x.rank))
    rows = full[: len(kept)]
    at_red = access(x, input_terms(x.rank, dims, kept, red))
    ms = b.emit(
        f"{o.name}_ms",
        x.shape[: len(kept)],
        o.dtype,
        Reduce(ReduceOp.MEAN, red, Bin("*", at_red, at_red)),
    )
    scale = Call("rsqrt", (Bin("+", access(ms, rows), Const(float(eps))),))
    expr = _affine_tail(
        Bin("*", Access(x.name, tuple(full)), scale), weight, None, variables(x.rank), x.shape
    )
    return b.emit(o.name, o.shape, o.dtype, expr)
