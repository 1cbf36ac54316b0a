"""The lowering toolkit: builder, value handles, rule registry and index-expression helpers.

Rules are keyed by the ATen overload packet (``"linear"``, ``"softmax"``); the walker in
:mod:`fusekit.ir.capture` calls them with the node's arguments, tensors replaced by :class:`V`
handles. Composite ops split into the pieces the planners reason about::

    softmax     mx = max_j x;  e = exp(x - mx);  z = sum_j e;  y = e / z
    layer_norm  m = mean x;  c = x - m;  v = mean c*c;  y = c * rsqrt(v + eps) * w + b
    index_add   t[idx[e], ...] += src[e, ...];  y = self + alpha * t   (no add onto zeros)

Shape-only ops (view, reshape, permute, expand, slice, select, split, ...) become layout maps
whose index terms are affine in the output's variables (``X[i/16, i%16, j]``). A rule that meets
a form it does not describe raises :class:`Unsupported`; the walker then keeps the op opaque.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import reduce as fold
from typing import Any

from fusekit.ir.expr import Access, Const, Expr, IBin, IConst, IndexTerm, IVar
from fusekit.ir.op import Op
from fusekit.ir.tensor import RESERVED_NAMES, Format, Tensor, TensorStats

POOL = "ijklmnopqrstuvwxyzabcdefgh"


class Unsupported(Exception):
    """A known op in a form the IR does not describe; the op is kept opaque."""


@dataclass(frozen=True, slots=True)
class V:
    """A tensor value during lowering: its IR name, static shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def rank(self) -> int:
        """The number of dimensions."""
        return len(self.shape)


@dataclass(frozen=True, slots=True)
class Out:
    """The node being lowered: its ATen packet, its name and one (shape, dtype) per output."""

    packet: str
    name: str
    metas: tuple[tuple[tuple[int, ...], str], ...]

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the first output."""
        return self.metas[0][0]

    @property
    def dtype(self) -> str:
        """Dtype of the first output."""
        return self.metas[0][1]


@dataclass
class Builder:
    """Collects the tensors and ops of the graph being built."""

    tensors: dict[str, Tensor] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)
    constants: dict[str, Any] = field(default_factory=dict)
    zeros: set[str] = field(default_factory=set)
    origin: str = ""
    opaque_output: Callable[[int], V] | None = None

    def fresh(self, base: str) -> str:
        """A tensor name derived from ``base`` that is legal and not taken."""
        name = "".join(c if c.isalnum() or c == "_" else "_" for c in base) or "t"
        if name[0].isdigit():
            name = "t" + name
        for prefix in ("sum_", "max_", "min_", "prod_", "mean_"):
            if name.startswith(prefix):
                name = prefix[:-1] + name[len(prefix) :]
        if name in RESERVED_NAMES:
            name += "_"
        candidate, k = name, 1
        while candidate in self.tensors:
            candidate, k = f"{name}_{k}", k + 1
        return candidate

    def declare(
        self,
        name: str,
        shape: Sequence[int],
        dtype: str,
        fmt: Format | None = None,
        nnz: int | None = None,
    ) -> V:
        """Declare a tensor (an input, a param or an op's output)."""
        stats = None if nnz is None else TensorStats(nnz=nnz)
        self.tensors[name] = Tensor(
            name, tuple(shape), dtype, fmt or Format.dense(len(shape)), stats
        )
        return V(name, tuple(shape), dtype)

    def constant(self, name: str, value: Any) -> V:
        """Declare a param whose value (a ``torch.Tensor``) is made during capture."""
        name = self.fresh(name)
        self.constants[name] = value
        return self.declare(name, tuple(value.shape), str(value.dtype).removeprefix("torch."))

    def opaque(self, output: int) -> V:
        """Keep output ``output`` of the node being lowered as an opaque op."""
        if self.opaque_output is None:
            raise Unsupported("no node to keep opaque")
        return self.opaque_output(output)

    def emit(
        self,
        name: str,
        shape: Sequence[int],
        dtype: str,
        expr: Expr,
        out: Sequence[IndexTerm] | None = None,
        accumulate: bool = False,
    ) -> V:
        """Declare ``name`` and add the op writing it (``out`` defaults to the first variables)."""
        name = self.fresh(name)
        terms = tuple(out) if out is not None else tuple(IVar(v) for v in POOL[: len(shape)])
        self.ops.append(Op(Access(name, terms), expr, accumulate, origin=self.origin))
        return self.declare(name, shape, dtype)


Rule = Callable[..., Any]
RULES: dict[str, Rule] = {}


def rule(*names: str) -> Callable[[Rule], Rule]:
    """Register a lowering rule for the given ATen packet names."""

    def register(fn: Rule) -> Rule:
        for name in names:
            RULES[name] = fn
        return fn

    return register


# -- expression helpers ------------------------------------------------------------------------
def variables(n: int, avoid: Sequence[str] = ()) -> tuple[str, ...]:
    """``n`` variable names from the pool, skipping ``avoid``."""
    names = tuple(c for c in POOL if c not in avoid)[:n]
    if len(names) < n:
        raise Unsupported(f"more than {len(POOL)} index variables")
    return names


def bcast(v: V, out_vars: Sequence[str], out_shape: Sequence[int]) -> Access:
    """Read ``v`` broadcast (numpy rules, aligned right) to an output's variables."""
    off = len(out_shape) - v.rank
    terms: list[IndexTerm] = []
    for d, size in enumerate(v.shape):
        broadcast = size == 1 and out_shape[off + d] != 1
        terms.append(IConst(0) if broadcast else IVar(out_vars[off + d]))
    return Access(v.name, tuple(terms))


def operand(x: Any, out_vars: Sequence[str], out_shape: Sequence[int]) -> Expr:
    """A tensor operand broadcast to the output, or a number as a constant."""
    if isinstance(x, V):
        return bcast(x, out_vars, out_shape)
    if isinstance(x, bool):
        return Const(int(x))
    if isinstance(x, int | float):
        return Const(x)
    raise Unsupported(f"operand {x!r}")


def dim_of(d: int, rank: int) -> int:
    """Normalise a possibly negative dimension."""
    return d + rank if d < 0 else d


def dims_of(dim: int | Sequence[int] | None, rank: int) -> list[int]:
    """Normalise a reduction's ``dim`` argument; ``None`` or ``[]`` means every dimension."""
    if dim is None or (isinstance(dim, Sequence) and len(dim) == 0):
        return list(range(rank))
    if isinstance(dim, int):
        return [dim_of(dim, rank)]
    return sorted(dim_of(d, rank) for d in dim)


def product(values: Sequence[int]) -> int:
    """The product of ``values`` (1 when empty)."""
    return fold(lambda a, b: a * b, values, 1)


def affine(terms: Sequence[tuple[str, int]]) -> IndexTerm:
    """``sum(var * stride)``, dropping strides of one: ``i*16 + j``."""
    out: IndexTerm | None = None
    for var, stride in terms:
        term: IndexTerm = IVar(var) if stride == 1 else IBin("*", IVar(var), IConst(stride))
        out = term if out is None else IBin("+", out, term)
    return out if out is not None else IConst(0)


def reshape_terms(
    in_shape: Sequence[int], out_shape: Sequence[int], out_vars: Sequence[str]
) -> list[IndexTerm]:
    """Index terms reading an input of ``in_shape`` for each element of a reshaped output.

    Dimensions are matched in groups of equal products; inside a group the flat offset is affine
    in the output variables, and each input index is ``flat / stride % size``.
    """
    if product(in_shape) != product(out_shape):
        raise Unsupported(f"reshape {tuple(in_shape)} -> {tuple(out_shape)}")
    terms: list[IndexTerm] = []
    i = j = 0
    while i < len(in_shape) or j < len(out_shape):
        if i < len(in_shape) and in_shape[i] == 1:
            terms.append(IConst(0))
            i += 1
            continue
        if j < len(out_shape) and out_shape[j] == 1:
            j += 1
            continue
        gi, gj = [i], [j]
        pi, pj = in_shape[i], out_shape[j]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj:
                gi.append(i)
                pi *= in_shape[i]
                i += 1
            else:
                gj.append(j)
                pj *= out_shape[j]
                j += 1
        flat = affine(
            [(out_vars[d], product(out_shape[d + 1 : gj[-1] + 1])) for d in gj if out_shape[d] != 1]
        )
        for k, d in enumerate(gi):
            if in_shape[d] == 1:
                terms.append(IConst(0))
                continue
            stride = product(in_shape[d + 1 : gi[-1] + 1])
            term = flat if stride == 1 else IBin("/", flat, IConst(stride))
            terms.append(term if k == 0 else IBin("%", term, IConst(in_shape[d])))
    return terms


def access(v: V, terms: Sequence[IndexTerm]) -> Access:
    """``v[terms]``."""
    return Access(v.name, tuple(terms))


def ivars(names: Sequence[str]) -> list[IndexTerm]:
    """Variables as index terms."""
    return [IVar(n) for n in names]
