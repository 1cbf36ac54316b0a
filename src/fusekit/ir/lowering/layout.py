"""Shape-only ops as layout maps: each output element reads one input element at affine indices.

::

    view [32,64] -> [2,16,64]     Y[i,j,k] = X[i*16 + j, k]
    permute (0, 2, 1)             Y[i,j,k] = X[i,k,j]
    expand [4,1] -> [4,8]         Y[i,j] = X[i,0]
    slice dim 1, 8:16             Y[i,j] = X[i, j + 8]
    select dim 0, 3               Y[i] = X[3, i]
    cat [X0, X1] dim 1            Y[i,j] = where(seg[j] == 0, X0[i, j % n0], X1[i, (j + c) % n1])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fusekit.ir.expr import Call, Const, Expr, IBin, IConst, IndexTerm, IVar
from fusekit.ir.lowering.base import (
    Builder,
    Out,
    Unsupported,
    V,
    access,
    bcast,
    dim_of,
    ivars,
    reshape_terms,
    rule,
    variables,
)


@rule(
    "view",
    "reshape",
    "_unsafe_view",
    "flatten",
    "unflatten",
    "unsqueeze",
    "squeeze",
    "view_as",
    "reshape_as",
)
def _reshape(b: Builder, o: Out, x: V, *args: Any) -> V:
    if x.shape == o.shape:
        return x
    out_vars = variables(len(o.shape))
    return b.emit(o.name, o.shape, o.dtype, access(x, reshape_terms(x.shape, o.shape, out_vars)))


@rule("expand", "expand_as")
def _expand(b: Builder, o: Out, x: V, *args: Any, **kwargs: Any) -> V:
    if x.shape == o.shape:
        return x
    return b.emit(o.name, o.shape, o.dtype, bcast(x, variables(len(o.shape)), o.shape))


def _permuted(b: Builder, o: Out, x: V, dims: Sequence[int]) -> V:
    if list(dims) == list(range(x.rank)):
        return x
    out_vars = variables(x.rank)
    terms: list[IndexTerm] = [IConst(0)] * x.rank
    for d, src in enumerate(dims):
        terms[dim_of(src, x.rank)] = IVar(out_vars[d])
    return b.emit(o.name, o.shape, o.dtype, access(x, terms))


@rule("permute")
def _permute(b: Builder, o: Out, x: V, dims: Sequence[int]) -> V:
    return _permuted(b, o, x, [dim_of(d, x.rank) for d in dims])


@rule("transpose", "t")
def _transpose(b: Builder, o: Out, x: V, d0: int = 0, d1: int = 1) -> V:
    dims = list(range(x.rank))
    if x.rank >= 2:
        a, c = dim_of(d0, x.rank), dim_of(d1, x.rank)
        dims[a], dims[c] = dims[c], dims[a]
    return _permuted(b, o, x, dims)


def _slice_term(var: str, start: int, step: int) -> IndexTerm:
    term: IndexTerm = IVar(var) if step == 1 else IBin("*", IVar(var), IConst(step))
    return term if start == 0 else IBin("+", term, IConst(start))


def _sliced(
    b: Builder,
    name: str,
    shape: tuple[int, ...],
    dtype: str,
    x: V,
    dim: int,
    start: int,
    step: int = 1,
) -> V:
    if shape == x.shape:
        return x
    out_vars = variables(x.rank)
    terms = ivars(out_vars)
    terms[dim] = _slice_term(out_vars[dim], start, step)
    return b.emit(name, shape, dtype, access(x, terms))


@rule("slice")
def _slice(
    b: Builder,
    o: Out,
    x: V,
    dim: int = 0,
    start: int | None = None,
    end: int | None = None,
    step: int = 1,
) -> V:
    dim = dim_of(dim, x.rank)
    size = x.shape[dim]
    first = 0 if start is None else (start + size if start < 0 else start)
    first = max(0, min(first, size))
    return _sliced(b, o.name, o.shape, o.dtype, x, dim, first, step)


@rule("narrow")
def _narrow(b: Builder, o: Out, x: V, dim: int, start: int, length: int) -> V:
    dim = dim_of(dim, x.rank)
    first = start + x.shape[dim] if start < 0 else start
    return _sliced(b, o.name, o.shape, o.dtype, x, dim, first)


@rule("select")
def _select(b: Builder, o: Out, x: V, dim: int, index: int) -> V:
    dim = dim_of(dim, x.rank)
    out_vars = variables(x.rank - 1)
    terms = ivars(out_vars)
    terms.insert(dim, IConst(index + x.shape[dim] if index < 0 else index))
    return b.emit(o.name, o.shape, o.dtype, access(x, terms))


@rule("split", "split_with_sizes", "chunk", "unsafe_split", "tensor_split")
def _split(b: Builder, o: Out, x: V, sizes: Any, dim: int = 0) -> tuple[V, ...]:
    dim = dim_of(dim, x.rank)
    pieces, offset = [], 0
    for k, (shape, dtype) in enumerate(o.metas):
        pieces.append(_sliced(b, f"{o.name}_{k}", shape, dtype, x, dim, offset))
        offset += shape[dim]
    if offset != x.shape[dim]:
        raise Unsupported(f"split pieces covering {offset} of {x.shape[dim]}")
    return tuple(pieces)


@rule("unbind")
def _unbind(b: Builder, o: Out, x: V, dim: int = 0) -> tuple[V, ...]:
    dim = dim_of(dim, x.rank)
    pieces = []
    for k, (shape, dtype) in enumerate(o.metas):
        terms = ivars(variables(x.rank - 1))
        terms.insert(dim, IConst(k))
        pieces.append(b.emit(f"{o.name}_{k}", shape, dtype, access(x, terms)))
    return tuple(pieces)


@rule("repeat")
def _repeat(b: Builder, o: Out, x: V, repeats: Sequence[int]) -> V:
    out_vars = variables(len(o.shape))
    off = len(o.shape) - x.rank
    terms: list[IndexTerm] = []
    for d, size in enumerate(x.shape):
        var = IVar(out_vars[off + d])
        terms.append(var if repeats[off + d] == 1 else IBin("%", var, IConst(size)))
    return b.emit(o.name, o.shape, o.dtype, access(x, terms))


def _piece_term(var: str, offset: int, size: int, total: int) -> IndexTerm:
    """``var - offset`` for ``var`` in ``[offset, offset + size)``, in range for every ``var``.

    ``(var + c) % size`` with ``c = -offset mod size``: equal to ``var - offset`` on the piece,
    and an index of the piece (a value ``where`` discards) everywhere else.
    """
    shift = -offset % size
    term: IndexTerm = IVar(var) if shift == 0 else IBin("+", IVar(var), IConst(shift))
    return term if size >= total and shift == 0 else IBin("%", term, IConst(size))


@rule("cat", "concat", "concatenate")
def _cat(b: Builder, o: Out, tensors: Sequence[Any], dim: int = 0) -> V:
    """``Y[..., j, ...] = X_k[..., j - offset_k, ...]`` for ``j`` in the ``k``-th piece.

    A ``where`` over a piece-number table ``seg[j]`` (a param: ``k`` at every position of the
    ``k``-th piece) picks the piece; every branch reads in range (:func:`_piece_term`). Pieces
    of one size ``n`` read ``X_k[j % n]`` and the table at ``j / n``, so that
    :func:`fusekit.ir.refine.refine_dims` splits ``j`` into (piece, offset) and every read is
    plain. Empty 1-d tensors, which ``torch.cat`` skips, are skipped.
    """
    import torch  # not at import: capture loads the rules with fusekit.ir

    d = dim_of(dim, len(o.shape))
    if not all(isinstance(x, V) for x in tensors):
        raise Unsupported("cat of a non-tensor")
    xs = [x for x in tensors if x.rank == len(o.shape) and x.shape[d] > 0]
    if not xs:
        raise Unsupported("cat of empty tensors only")
    out_vars = variables(len(o.shape))
    total = o.shape[d]
    if len(xs) == 1:
        return (
            xs[0]
            if xs[0].shape == o.shape
            else b.emit(o.name, o.shape, o.dtype, access(xs[0], ivars(out_vars)))
        )
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    sizes = [x.shape[d] for x in xs]
    j = out_vars[d]
    equal = len(set(sizes)) == 1  # Y[.., p*n + r, ..] = X_p[.., r, ..]: a split refine_dims sees
    with unset_fake_temporarily():  # a real table, also when capture runs under a fake mode
        numbers = range(len(xs)) if equal else [k for k, n in enumerate(sizes) for _ in range(n)]
        table = torch.tensor(list(numbers), dtype=torch.int32)
    seg = b.constant(f"{o.name}_piece", table)
    reads = []
    offset = 0
    for x, size in zip(xs, sizes, strict=True):
        terms = ivars(out_vars)
        terms[d] = (
            IBin("%", IVar(j), IConst(size)) if equal else _piece_term(j, offset, size, total)
        )
        reads.append(access(x, terms))
        offset += size
    piece = access(seg, [IBin("/", IVar(j), IConst(sizes[0])) if equal else IVar(j)])
    expr: Expr = reads[-1]
    for k in range(len(xs) - 2, -1, -1):
        expr = Call("where", (Call("eq", (piece, Const(k))), reads[k], expr))
    return b.emit(o.name, o.shape, o.dtype, expr)


@rule("slice_scatter")
def _slice_scatter(
    b: Builder,
    o: Out,
    x: V,
    src: V,
    dim: int = 0,
    start: int | None = None,
    end: int | None = None,
    step: int = 1,
) -> V:
    """``Y = X`` with ``Y[.., start:end, ..] = src``, as one map.

    A ``where`` over an int32 table that marks the slice (as :func:`_cat` picks its pieces);
    the source is read in range everywhere.
    """
    import torch  # not at import: capture loads the rules with fusekit.ir
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    d = dim_of(dim, x.rank)
    size = x.shape[d]
    first = 0 if start is None else (start + size if start < 0 else start)
    first = max(0, min(first, size))
    n = src.shape[d]
    if step != 1:
        raise Unsupported("slice_scatter with a step")
    if n == 0:
        return x
    if n == size:
        return src
    aligned = size % n == 0 and first % n == 0  # in blocks of n: a split refine_dims sees
    with unset_fake_temporarily():  # a real table, also when capture runs under a fake mode
        table = torch.zeros(size // n if aligned else size, dtype=torch.int32)
        table[first // n if aligned else slice(first, first + n)] = 1
    inside = b.constant(f"{o.name}_inside", table)
    out_vars = variables(x.rank)
    j = out_vars[d]
    terms = ivars(out_vars)
    terms[d] = IBin("%", IVar(j), IConst(n)) if aligned else _piece_term(j, first, n, size)
    mark = access(inside, [IBin("/", IVar(j), IConst(n)) if aligned else IVar(j)])
    expr = Call(
        "where", (Call("eq", (mark, Const(1))), access(src, terms), access(x, ivars(out_vars)))
    )
    return b.emit(o.name, o.shape, o.dtype, expr)
