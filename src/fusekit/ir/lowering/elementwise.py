"""Elementwise ops, fills, casts and dropout (eval): maps over the broadcast output."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fusekit.ir.expr import Bin, Call, Const, Expr, ValueOp
from fusekit.ir.lowering.base import (
    Builder,
    Out,
    Rule,
    Unsupported,
    V,
    access,
    ivars,
    operand,
    rule,
    variables,
)


# -- elementwise -------------------------------------------------------------------------------
def _map(b: Builder, o: Out, fn: Callable[..., Expr], *xs: Any) -> V:
    out_vars = variables(len(o.shape))
    return b.emit(o.name, o.shape, o.dtype, fn(*(operand(x, out_vars, o.shape) for x in xs)))


_UNARY = {
    "exp": "exp",
    "log": "log",
    "log1p": "log1p",
    "expm1": "expm1",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
    "relu": "relu",
    "silu": "silu",
    "erf": "erf",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "abs": "abs",
    "neg": "neg",
    "reciprocal": "recip",
    "sin": "sin",
    "cos": "cos",
    "floor": "floor",
    "ceil": "ceil",
    "sign": "sign",
    "logical_not": "not",
    "bitwise_not": "not",
}
_BINARY = {
    "maximum": "max",
    "minimum": "min",
    "eq": "eq",
    "ne": "ne",
    "lt": "lt",
    "le": "le",
    "gt": "gt",
    "ge": "ge",
    "logical_and": "and",
    "logical_or": "or",
    "bitwise_and": "and",
    "bitwise_or": "or",
    "remainder": "mod",
    "floor_divide": "floordiv",
    "pow": "pow",
}


def _unary(fn: str) -> Rule:
    def lower(b: Builder, o: Out, x: V) -> V:
        if fn == "not" and x.dtype != "bool":
            raise Unsupported("bitwise_not of a non-bool tensor")
        return _map(b, o, lambda e: Call(fn, (e,)), x)

    return lower


def _binary(fn: str) -> Rule:
    def lower(b: Builder, o: Out, x: Any, y: Any) -> V:
        if o.packet.startswith("bitwise_") and o.dtype != "bool":  # "and"/"or" are logical
            raise Unsupported(f"{o.packet} of a non-bool tensor")
        return _map(b, o, lambda e, f: Call(fn, (e, f)), x, y)

    return lower


for _aten, _fn in _UNARY.items():
    rule(_aten)(_unary(_fn))
for _aten, _fn in _BINARY.items():
    rule(_aten)(_binary(_fn))


@rule("gelu")
def _gelu(b: Builder, o: Out, x: V, approximate: str = "none") -> V:
    fn = "gelu_tanh" if approximate == "tanh" else "gelu"
    return _map(b, o, lambda e: Call(fn, (e,)), x)


def _scaled(e: Expr, alpha: Any) -> Expr:
    return e if alpha == 1 else Bin("*", Const(alpha), e)


@rule("add", "sub")
def _add_sub(b: Builder, o: Out, x: Any, y: Any, alpha: Any = 1) -> V:
    op: ValueOp = "+" if o.packet == "add" else "-"
    return _map(b, o, lambda e, f: Bin(op, e, _scaled(f, alpha)), x, y)


@rule("fma")
def _fma(b: Builder, o: Out, x: Any, y: Any, z: Any) -> V:
    # prims.fma (torch's Adam/AdamW decompositions): x * y + z
    return _map(b, o, lambda e, f, g: Bin("+", Bin("*", e, f), g), x, y, z)


@rule("rsub")
def _rsub(b: Builder, o: Out, x: Any, y: Any, alpha: Any = 1) -> V:
    return _map(b, o, lambda e, f: Bin("-", f, _scaled(e, alpha)), x, y)


@rule("mul")
def _mul(b: Builder, o: Out, x: Any, y: Any) -> V:
    return _map(b, o, lambda e, f: Bin("*", e, f), x, y)


@rule("div")
def _div(b: Builder, o: Out, x: Any, y: Any, rounding_mode: str | None = None) -> V:
    if rounding_mode not in (None, "floor"):
        raise Unsupported(f"div with rounding_mode={rounding_mode!r}")
    if rounding_mode == "floor":
        return _map(b, o, lambda e, f: Call("floordiv", (e, f)), x, y)
    return _map(b, o, lambda e, f: Bin("/", e, f), x, y)


@rule("clamp", "clamp_min", "clamp_max")
def _clamp(b: Builder, o: Out, x: V, lo: Any = None, hi: Any = None) -> V:
    if o.packet == "clamp_max":
        lo, hi = None, lo

    def fn(e: Expr, *bounds: Expr) -> Expr:
        k = 0
        if lo is not None:
            e, k = Call("max", (e, bounds[0])), 1
        return e if hi is None else Call("min", (e, bounds[k]))

    return _map(b, o, fn, x, *(v for v in (lo, hi) if v is not None))


@rule("where")
def _where(b: Builder, o: Out, cond: V, x: Any, y: Any) -> V:
    return _map(b, o, lambda c, e, f: Call("where", (c, e, f)), cond, x, y)


@rule("masked_fill")
def _masked_fill(b: Builder, o: Out, x: V, mask: V, value: Any) -> V:
    return _map(b, o, lambda e, c, f: Call("where", (c, f, e)), x, mask, value)


@rule(
    "zeros",
    "ones",
    "full",
    "zeros_like",
    "ones_like",
    "full_like",
    "new_zeros",
    "new_ones",
    "new_full",
    "scalar_tensor",
)
def _fill(b: Builder, o: Out, *args: Any, **kwargs: Any) -> V:
    packet = o.packet
    if "full" in packet or packet == "scalar_tensor":
        value = kwargs.get("fill_value", args[-1] if packet != "scalar_tensor" else args[0])
    else:
        value = 1 if "ones" in packet else 0
    if isinstance(value, bool):
        value = int(value)
    out = b.emit(o.name, o.shape, o.dtype, Const(value))
    if value == 0:
        b.zeros.add(out.name)
    return out


@rule("dropout", "feature_dropout", "alpha_dropout")
def _dropout(b: Builder, o: Out, x: V, p: float, train: bool) -> V:
    if train and p > 0:
        raise ValueError("dropout in training mode is random; call model.eval() before capture")
    return x


@rule("copy")
def _copy_into(b: Builder, o: Out, dst: V, src: Any, non_blocking: bool = False) -> V:
    # functional copy (an optimizer writing its parameters back): src broadcast to dst's shape,
    # in dst's dtype
    return _map(b, o, lambda d, e: e, dst, src)


@rule("clone", "contiguous", "alias", "detach", "lift_fresh_copy", "to", "_to_copy", "type_as")
def _copy(b: Builder, o: Out, x: V, *args: Any, **kwargs: Any) -> V:
    if o.dtype == x.dtype and o.shape == x.shape:
        return x
    return b.emit(o.name, o.shape, o.dtype, access(x, ivars(variables(x.rank))))
