"""Indirect reads and writes.

Gathers: embedding, index_select, gather, advanced indexing. Scatters: index_add, scatter_add,
index_put with accumulate.

::

    embedding       Y[i,j,k] = W[ids[i,j],k]
    index_select    Y[e,k] = X[idx[e],k]
    index_add       T[idx[e],k] += src[e,k];  Y[i,k] = X[i,k] + T[i,k]
    scatter_add     T[idx[i,j],j] += src[i,j];  Y = X + T

A scatter onto a tensor known to be zero (``zeros``, ``new_zeros``, ``zeros_like``) writes the
result directly, without the final add.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fusekit.ir.expr import Access, Bin, Const, Expr, IndexTerm, IVar
from fusekit.ir.lowering.base import (
    Builder,
    Out,
    Unsupported,
    V,
    access,
    bcast,
    dim_of,
    ivars,
    rule,
    variables,
)


def _onto(b: Builder, o: Out, x: V, terms: Sequence[IndexTerm], src: Expr) -> V:
    """``x`` plus the scatter ``T[terms] += src``; the scatter alone when ``x`` is zero."""
    if x.name in b.zeros:
        return b.emit(o.name, o.shape, o.dtype, src, terms, accumulate=True)
    scattered = b.emit(f"{o.name}_scatter", o.shape, o.dtype, src, terms, accumulate=True)
    full = ivars(variables(len(o.shape)))
    return b.emit(o.name, o.shape, o.dtype, Bin("+", access(x, full), access(scattered, full)))


@rule("embedding")
def _embedding(b: Builder, o: Out, weight: V, indices: V, *args: Any) -> V:
    out_vars = variables(len(o.shape))
    ids = Access(indices.name, tuple(IVar(v) for v in out_vars[:-1]))
    return b.emit(o.name, o.shape, o.dtype, access(weight, [ids, IVar(out_vars[-1])]))


@rule("index_select")
def _index_select(b: Builder, o: Out, x: V, dim: int, index: V) -> V:
    dim = dim_of(dim, x.rank)
    out_vars = variables(len(o.shape))
    terms = ivars(out_vars)
    terms[dim] = Access(index.name, (IVar(out_vars[dim]),) if index.rank else ())
    return b.emit(o.name, o.shape, o.dtype, access(x, terms))


@rule("gather")
def _gather(b: Builder, o: Out, x: V, dim: int, index: V, sparse_grad: bool = False) -> V:
    dim = dim_of(dim, x.rank)
    if any(index.shape[d] != x.shape[d] for d in range(x.rank) if d != dim):
        raise Unsupported("gather with an index smaller than the input outside 'dim'")
    out_vars = variables(len(o.shape))
    terms = ivars(out_vars)
    terms[dim] = Access(index.name, tuple(ivars(out_vars)))
    return b.emit(o.name, o.shape, o.dtype, access(x, terms))


@rule("scatter_add")
def _scatter_add(b: Builder, o: Out, x: V, dim: int, index: V, src: V) -> V:
    dim = dim_of(dim, x.rank)
    if src.shape != index.shape or any(
        index.shape[d] != x.shape[d] for d in range(x.rank) if d != dim
    ):
        raise Unsupported("scatter_add with an index smaller than 'src' or 'self'")
    loop = variables(index.rank)
    terms = ivars(loop)
    terms[dim] = Access(index.name, tuple(ivars(loop)))
    return _onto(b, o, x, terms, access(src, ivars(loop)))


@rule("index_add")
def _index_add(b: Builder, o: Out, x: V, dim: int, index: V, source: V, alpha: Any = 1) -> V:
    dim = dim_of(dim, x.rank)
    loop = variables(source.rank)
    terms = ivars(loop)
    terms[dim] = Access(index.name, (IVar(loop[dim]),) if index.rank else ())
    src: Expr = access(source, ivars(loop))
    if alpha != 1:
        src = Bin("*", Const(alpha), src)
    return _onto(b, o, x, terms, src)


def _advanced(
    x: V, indices: Sequence[V | None], result_shape: Sequence[int]
) -> tuple[list[IndexTerm], tuple[str, ...]]:
    """Terms reading ``x[indices]`` (index tensors adjacent) for a result's variables."""
    given = [d for d, t in enumerate(indices) if t is not None]
    if not given or given != list(range(given[0], given[-1] + 1)):
        raise Unsupported("advanced indexing with non-adjacent index tensors")
    if any(t is not None and t.dtype == "bool" for t in indices):
        raise Unsupported("indexing with a boolean mask (a data-dependent shape)")
    first, last = given[0], given[-1]
    out_vars = variables(len(result_shape))
    n_batch = len(result_shape) - (x.rank - (last - first + 1))
    batch_vars = out_vars[first : first + n_batch]
    batch_shape = tuple(result_shape[first : first + n_batch])
    terms: list[IndexTerm] = [IVar(v) for v in out_vars[:first]]
    for d in given:
        t = indices[d]
        if t is not None:
            terms.append(bcast(t, batch_vars, batch_shape))
    terms += [IVar(v) for v in out_vars[first + n_batch :]]
    return terms, out_vars


@rule("index")
def _index(b: Builder, o: Out, x: V, indices: Sequence[V | None]) -> V:
    terms, _ = _advanced(x, indices, o.shape)
    return b.emit(o.name, o.shape, o.dtype, access(x, terms))


@rule("index_put")
def _index_put(
    b: Builder, o: Out, x: V, indices: Sequence[V | None], values: V, accumulate: bool = False
) -> V:
    if not accumulate:
        raise Unsupported("index_put without accumulate (last write wins)")
    given = [t for t in indices if t is not None]
    batch: tuple[int, ...] = ()
    for t in given:
        batch = _broadcast(batch, t.shape)
    first = next(d for d, t in enumerate(indices) if t is not None)
    result = (*x.shape[:first], *batch, *x.shape[len(indices) :])
    terms, out_vars = _advanced(x, indices, result)
    return _onto(b, o, x, terms, bcast(values, out_vars, result))


def _broadcast(a: tuple[int, ...], c: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(a), len(c))
    a, c = (1,) * (n - len(a)) + a, (1,) * (n - len(c)) + c
    return tuple(max(p, q) for p, q in zip(a, c, strict=True))
