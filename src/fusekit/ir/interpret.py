"""Execute a graph with torch, from the ops' index expressions: the reference of every part.

Each op is evaluated from its expression, never by calling the ATen op it was captured from, so
agreement with the eager module checks the IR itself. Intermediate values are *labelled tensors*:
a ``torch.Tensor`` whose dimensions are named by index variables. Then

- a read ``X[i,k]`` labels ``X``'s dimensions; an indirect read ``X[g[e],k]`` is an
  ``index_select`` (other index arithmetic uses advanced indexing over ``arange`` grids);
- ``sum_k`` of a product is one ``torch.einsum``; other reductions are ``sum/amax/amin/prod/mean``
  over the bound dimensions; elementwise functions broadcast over the union of labels;
- ``Y[d[e],m] += ...`` is an ``index_add_`` into zeros (``index_put_(accumulate=True)`` for other
  writes);
- a sum-product with a sparse (COO/CSR) operand ``A[i,k]`` substitutes ``i, k`` by the stored
  coordinates and scatters over ``i``: ``Y[crd_i[n], j] += val[n] * B[crd_k[n], j]``;
- an opaque op calls its recorded ATen target.

Every result is stored in its tensor's dtype and checked against its declared shape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import reduce as fold
from typing import TYPE_CHECKING, Any

from fusekit.errors import expected
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
    Opaque,
    OpaqueArg,
    Reduce,
    ReduceOp,
    TensorRef,
    product_factors,
)
from fusekit.ir.graph import Graph
from fusekit.ir.op import Op

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions that compute: fusekit.ir imports this module and must
# not load torch (tests/ir/test_ir_lean_import.py).

log = logging.getLogger(__name__)
_NZ = "_nz"  # label of the stored non-zeros of a sparse operand (not a legal variable name)


@dataclass(frozen=True, slots=True)
class _LT:
    """A tensor whose dimensions are labelled by index variables."""

    data: torch.Tensor
    vars: tuple[str, ...]


@dataclass(slots=True)
class _Ctx:
    values: Mapping[str, torch.Tensor]
    extents: Mapping[str, int]
    subst: dict[str, _LT] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        """Where the values live (indices and constants are made there too)."""
        import torch

        return next((v.device for v in self.values.values()), torch.device("cpu"))


def interpret(
    graph: Graph, values: Mapping[str, torch.Tensor], *, keep_all: bool = False
) -> dict[str, torch.Tensor]:
    """Run ``graph`` on ``values``.

    Args:
        graph: the graph.
        values: a tensor for every input and param (sparse COO/CSR tensors allowed).
        keep_all: return every tensor, not only the outputs.

    Returns:
        Output name to value (every tensor's value with ``keep_all``).

    Raises:
        ValueError: if a value is missing or its shape, dtype or symbolic sizes disagree with the
            graph, or an op's result does not have its declared shape.
    """
    import torch

    with torch.no_grad():
        return _interpret(graph, values, keep_all)


def _interpret(
    graph: Graph, values: Mapping[str, torch.Tensor], keep_all: bool
) -> dict[str, torch.Tensor]:
    import torch

    env: dict[str, torch.Tensor] = {}
    sizes: dict[str, int] = {}
    for name in (*graph.inputs, *graph.params):
        if name not in values:
            raise ValueError(expected("interpret", name, "given", "missing"))
        value = values[name]
        _bind(graph, name, value, sizes)
        env[name] = value
    shapes = {t.name: _resolve(graph, t.name, sizes) for t in graph.tensors}
    for op in graph.ops:
        tensor = graph.tensor(op.name)
        result = _run_op(op, env, shapes).to(getattr(torch, tensor.dtype))
        if tuple(result.shape) != shapes[op.name]:
            raise ValueError(
                expected(
                    f"interpret: op {op.name}",
                    "result",
                    f"of shape {shapes[op.name]}",
                    tuple(result.shape),
                )
            )
        env[op.name] = result
    return dict(env) if keep_all else {name: env[name] for name in graph.outputs}


def _bind(graph: Graph, name: str, value: torch.Tensor, sizes: dict[str, int]) -> None:
    tensor = graph.tensor(name)
    dtype = str(value.dtype).removeprefix("torch.")
    if dtype != tensor.dtype:
        raise ValueError(expected("interpret", name, tensor.dtype, dtype))
    if value.dim() != tensor.rank:
        raise ValueError(
            expected("interpret", name, f"of shape {tensor.shape}", tuple(value.shape))
        )
    for dim, actual in zip(tensor.shape, value.shape, strict=True):
        want = sizes.setdefault(dim, actual) if isinstance(dim, str) else dim
        if want != actual:
            raise ValueError(
                expected(
                    "interpret",
                    name,
                    f"of shape {tensor.shape} with {dim}={want}",
                    tuple(value.shape),
                )
            )


def _resolve(graph: Graph, name: str, sizes: Mapping[str, int]) -> tuple[int, ...]:
    shape = []
    for dim in graph.tensor(name).shape:
        if isinstance(dim, str) and dim not in sizes:
            raise ValueError(
                expected("interpret", f"size {dim} of {name}", "bound by an input", "unbound")
            )
        shape.append(sizes[dim] if isinstance(dim, str) else dim)
    return tuple(shape)


# -- ops ---------------------------------------------------------------------------------------
def _run_op(
    op: Op, env: dict[str, torch.Tensor], shapes: Mapping[str, tuple[int, ...]]
) -> torch.Tensor:
    import torch

    if isinstance(op.expr, Opaque):
        return _run_opaque(op.expr, env)
    ext = op.extents(shapes)
    ctx = _Ctx(env, {k: int(v) for k, v in ext.items()})
    rhs = _eval(op.expr, ctx)
    shape = shapes[op.name]
    if not op.accumulate:
        names = tuple(t.name for t in op.out.indices if isinstance(t, IVar))
        data = _align([rhs], names)[0]
        return data.expand(shape).contiguous()
    summed = [rhs.vars.index(v) for v in rhs.vars if v in op.summed_vars]
    if summed:
        rhs = _LT(rhs.data.sum(dim=summed), tuple(v for v in rhs.vars if v not in op.summed_vars))
    out = torch.zeros(shape, dtype=rhs.data.dtype, device=rhs.data.device)
    idx = [_index(t, ctx) for t in op.out.indices]
    plain = [i for i, t in enumerate(op.out.indices) if isinstance(t, IVar)]
    other = [i for i in range(len(idx)) if i not in plain]
    plain_vars = {idx[i].vars[0] for i in plain}
    if (
        len(other) == 1
        and len(plain_vars) == len(plain)
        and not set(idx[other[0]].vars) & plain_vars
    ):
        p = other[0]
        labels = (*(idx[i].vars[0] for i in plain if i < p), *idx[p].vars)
        labels += tuple(idx[i].vars[0] for i in plain if i > p)
        src = _align([rhs], labels)[0].expand([ctx.extents[v] for v in labels])
        flat = [*out.shape[:p], idx[p].data.numel(), *out.shape[p + 1 :]]
        return out.index_add_(p, idx[p].data.reshape(-1), src.reshape(flat))
    labels = _union([*idx, rhs])
    full = [ctx.extents[v] for v in labels]
    where = tuple(t.expand(full) for t in _align(idx, labels))
    return out.index_put_(where, _align([rhs], labels)[0].expand(full), accumulate=True)


def _run_opaque(expr: Opaque, env: Mapping[str, torch.Tensor]) -> torch.Tensor:
    import torch

    result = run_opaque_call(expr, env)
    out = result if expr.output is None else result[expr.output]
    if not isinstance(out, torch.Tensor):
        raise ValueError(
            expected(f"interpret: {expr.target}", "result", "a tensor", type(out).__name__)
        )
    return out


def run_opaque_call(expr: Opaque, env: Mapping[str, torch.Tensor]) -> Any:
    """Call an opaque op's ATen overload on ``env``'s values: its whole result (all outputs)."""
    return opaque_call(expr)(env)


def opaque_call(expr: Opaque) -> Callable[[Mapping[str, torch.Tensor]], Any]:
    """An opaque op's ATen overload, resolved once, as a function of the values by name."""
    import torch

    def arg(a: OpaqueArg) -> Callable[[Mapping[str, torch.Tensor]], Any]:
        if isinstance(a, TensorRef):
            name = a.name
            return lambda env: env[name]
        if isinstance(a, DTypeRef):
            dtype = getattr(torch, a.name)
            return lambda env: dtype
        if isinstance(a, tuple):
            parts = [arg(x) for x in a]
            return lambda env: [p(env) for p in parts]
        return lambda env: a

    target: Any = torch.ops
    for part in expr.target.split("."):
        target = getattr(target, part)
    args = [arg(a) for a in expr.args]
    kwargs = {k: arg(v) for k, v in expr.kwargs}

    def call(env: Mapping[str, torch.Tensor]) -> Any:
        return target(*(a(env) for a in args), **{k: v(env) for k, v in kwargs.items()})

    return call


# -- labelled tensors --------------------------------------------------------------------------
def _union(lts: list[_LT]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(v for lt in lts for v in lt.vars))


def _align(lts: list[_LT], labels: tuple[str, ...]) -> list[torch.Tensor]:
    """Permute each tensor to ``labels`` order, with size-1 dimensions for missing labels."""
    out = []
    for lt in lts:
        extra = set(lt.vars) - set(labels)
        if extra:
            raise ValueError(expected("interpret", "labels", f"within {labels}", sorted(extra)))
        order = [v for v in labels if v in lt.vars]
        data = lt.data.permute([lt.vars.index(v) for v in order]) if lt.vars else lt.data
        out.append(
            data.reshape([data.shape[order.index(v)] if v in lt.vars else 1 for v in labels])
        )
    return out


def _apply(fn: Any, lts: list[_LT]) -> _LT:
    labels = _union(lts)
    return _LT(fn(*_align(lts, labels)), labels)


def _index(term: IndexTerm, ctx: _Ctx) -> _LT:
    import torch

    if isinstance(term, IVar):
        if term.name in ctx.subst:
            return ctx.subst[term.name]
        return _LT(torch.arange(ctx.extents[term.name], device=ctx.device), (term.name,))
    if isinstance(term, IConst):
        return _LT(torch.tensor(term.value, device=ctx.device), ())
    if isinstance(term, Access):
        lt = _read(term, ctx)
        return _LT(lt.data.long(), lt.vars)
    ops = {
        "+": torch.add,
        "-": torch.sub,
        "*": torch.mul,
        "/": lambda a, b: torch.div(a, b, rounding_mode="floor"),
        "%": torch.remainder,
    }
    return _apply(ops[term.op], [_index(term.left, ctx), _index(term.right, ctx)])


def _read(acc: Access, ctx: _Ctx) -> _LT:
    import torch

    value = ctx.values[acc.tensor]
    if value.layout != torch.strided:
        log.debug("interpret: densifying sparse %s outside a sum-product", acc.tensor)
        value = value.to_dense()
    names_at = {
        d: t.name
        for d, t in enumerate(acc.indices)
        if isinstance(t, IVar) and t.name not in ctx.subst
    }
    for d, var in names_at.items():
        if value.shape[d] != ctx.extents[var]:  # a read of a prefix (a slice from 0)
            value = value.narrow(d, 0, ctx.extents[var])
    plain = list(names_at)
    names = list(names_at.values())
    if len(plain) == len(acc.indices) and len(set(names)) == len(names):
        return _LT(value, tuple(names))
    other = [i for i in range(len(acc.indices)) if i not in plain]
    if len(other) == 1 and len(set(names)) == len(names):
        p = other[0]
        idx = _index(acc.indices[p], ctx)
        if not set(idx.vars) & set(names):
            data = value.index_select(p, idx.data.reshape(-1))
            data = data.reshape(*value.shape[:p], *idx.data.shape, *value.shape[p + 1 :])
            labels = (*names[:p], *idx.vars, *names[p:])
            return _LT(data, labels)
    idx_lts = [_index(t, ctx) for t in acc.indices]
    labels = _union(idx_lts)
    return _LT(value[tuple(_align(idx_lts, labels))], labels)


# -- expressions -------------------------------------------------------------------------------
def _functions() -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    return {
        "exp": torch.exp,
        "log": torch.log,
        "log1p": torch.log1p,
        "expm1": torch.expm1,
        "tanh": torch.tanh,
        "sigmoid": torch.sigmoid,
        "relu": torch.relu,
        "gelu": F.gelu,
        "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "silu": F.silu,
        "erf": torch.erf,
        "sqrt": torch.sqrt,
        "rsqrt": torch.rsqrt,
        "abs": torch.abs,
        "neg": torch.neg,
        "recip": torch.reciprocal,
        "sin": torch.sin,
        "cos": torch.cos,
        "floor": torch.floor,
        "ceil": torch.ceil,
        "sign": torch.sign,
        "not": torch.logical_not,
        "max": torch.maximum,
        "min": torch.minimum,
        "pow": torch.pow,
        "eq": torch.eq,
        "ne": torch.ne,
        "lt": torch.lt,
        "le": torch.le,
        "gt": torch.gt,
        "ge": torch.ge,
        "and": torch.logical_and,
        "or": torch.logical_or,
        "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"),
        "mod": torch.remainder,
        "where": lambda c, a, b: torch.where(c if c.dtype == torch.bool else c != 0, a, b),
    }


def _eval(expr: Expr, ctx: _Ctx) -> _LT:
    import torch

    if isinstance(expr, Access):
        return _read(expr, ctx)
    if isinstance(expr, Const):
        return _LT(torch.tensor(expr.value, device=ctx.device), ())
    if isinstance(expr, Bin):
        fns = {"+": torch.add, "-": torch.sub, "*": torch.mul, "/": torch.div}
        return _apply(fns[expr.op], [_eval(expr.left, ctx), _eval(expr.right, ctx)])
    if isinstance(expr, Call):
        return _apply(_functions()[expr.fn], [_eval(a, ctx) for a in expr.args])
    if isinstance(expr, Reduce):
        inner = _Ctx(
            ctx.values, ctx.extents, {k: v for k, v in ctx.subst.items() if k not in expr.vars}
        )
        factors = product_factors(expr.body)
        if expr.op is ReduceOp.SUM and len(factors) >= 2:
            return _contract(factors, set(expr.vars), inner)
        return _reduce(expr, _eval(expr.body, inner), inner)
    raise ValueError(expected("interpret", "expr", "no opaque call inside an expression", expr))


def _reduce(expr: Reduce, body: _LT, ctx: _Ctx) -> _LT:
    import torch

    dims = [body.vars.index(v) for v in expr.vars if v in body.vars]
    absent = [ctx.extents[v] for v in expr.vars if v not in body.vars]
    data = body.data
    if dims:
        if expr.op is ReduceOp.SUM:
            data = data.sum(dim=dims)
        elif expr.op is ReduceOp.MEAN:
            data = data.mean(dim=dims, dtype=None if data.is_floating_point() else torch.float32)
        elif expr.op is ReduceOp.MAX:
            data = data.amax(dim=dims)
        elif expr.op is ReduceOp.MIN:
            data = data.amin(dim=dims)
        else:
            for d in sorted(dims, reverse=True):
                data = data.prod(dim=d)
    count = fold(lambda a, b: a * b, absent, 1)
    if expr.op is ReduceOp.SUM and count != 1:
        data = data * count
    elif expr.op is ReduceOp.PROD and count != 1:
        data = data**count
    return _LT(data, tuple(v for v in body.vars if v not in expr.vars))


def _contract(factors: list[Expr], reduced: set[str], ctx: _Ctx) -> _LT:
    """``sum_{reduced}`` of a product: one einsum (with a sparse operand, over its non-zeros)."""
    import torch

    for k, factor in enumerate(factors):
        if (
            isinstance(factor, Access)
            and factor.is_plain
            and ctx.values[factor.tensor].layout != torch.strided
            and not {t.name for t in factor.indices if isinstance(t, IVar)} & set(ctx.subst)
        ):
            return _contract_sparse(factor, factors[:k] + factors[k + 1 :], reduced, ctx)
    return _einsum([_eval(f, ctx) for f in factors], reduced, ctx)


def _einsum(lts: list[_LT], reduced: set[str], ctx: _Ctx) -> _LT:
    import torch

    scalars = [lt.data for lt in lts if not lt.vars]
    tensors = [lt for lt in lts if lt.vars]
    labels = _union(tensors)
    keep = tuple(v for v in labels if v not in reduced)
    letters = {
        v: chr(ord("a") + i) if i < 26 else chr(ord("A") + i - 26) for i, v in enumerate(labels)
    }
    if tensors:
        dtype = fold(torch.promote_types, [lt.data.dtype for lt in tensors])
        spec = ",".join("".join(letters[v] for v in lt.vars) for lt in tensors)
        spec += "->" + "".join(letters[v] for v in keep)
        data = torch.einsum(spec, *(lt.data.to(dtype) for lt in tensors))
    else:
        data = torch.tensor(1, device=ctx.device)
    for scalar in scalars:
        data = data * scalar
    count = fold(lambda a, b: a * b, [ctx.extents[v] for v in reduced if v not in labels], 1)
    return _LT(data * count if count != 1 else data, keep)


def _contract_sparse(sp: Access, rest: list[Expr], reduced: set[str], ctx: _Ctx) -> _LT:
    import torch

    value = ctx.values[sp.tensor]
    coo = value if value.layout == torch.sparse_coo else value.to_sparse(layout=torch.sparse_coo)
    coo = coo.coalesce()
    crd, vals = coo.indices(), coo.values()
    names = [t.name for t in sp.indices if isinstance(t, IVar)]
    inner = _Ctx(ctx.values, ctx.extents, dict(ctx.subst))
    for d, var in enumerate(names):
        inner.subst[var] = _LT(crd[d], (_NZ,))
    lts = [_LT(vals, (_NZ,)), *(_eval(f, inner) for f in rest)]
    reduced_here = (reduced - set(names)) | {_NZ}
    free_sparse = [d for d, var in enumerate(names) if var not in reduced]
    if not free_sparse:
        return _einsum(lts, reduced_here, ctx)
    product = _einsum(lts, reduced_here - {_NZ}, ctx)
    rest_vars = tuple(v for v in product.vars if v != _NZ)
    data = _align([product], (_NZ, *rest_vars))[0]
    data = data.expand(vals.shape[0], *data.shape[1:])
    shape = [ctx.extents[names[d]] for d in free_sparse] + list(data.shape[1:])
    out = torch.zeros(shape, dtype=data.dtype, device=data.device)
    out.index_put_(tuple(crd[d] for d in free_sparse), data, accumulate=True)
    return _LT(out, (*(names[d] for d in free_sparse), *rest_vars))
