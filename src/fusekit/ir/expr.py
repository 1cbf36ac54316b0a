"""Expressions of the IR: index terms and the right-hand sides of ops, with their walkers.

An index term is a variable, an int, ``+ - * / %`` of terms (``/`` is floor division) or an
access into an integer tensor (``g[e]``). A value expression reads tensors at index terms
(``X[g[e],k]``), combines them with ``+ - * /`` (``/`` is true division) and the functions of
:data:`FUNCTIONS`, and reduces with ``sum_k``, ``max_k``, ``min_k``, ``prod_k`` and ``mean_k``,
which bind ``k`` over the term that follows them; an :class:`Opaque` call stands for an ATen op
the IR does not describe. :mod:`fusekit.ir.op` puts an expression on the right of an op.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from fusekit.errors import expected
from fusekit.ir.tensor import check_tensor_name


class ReduceOp(StrEnum):
    """How a reduction combines the values of its bound variables."""

    SUM = "sum"
    MAX = "max"
    MIN = "min"
    PROD = "prod"
    MEAN = "mean"


#: Elementwise functions of the expression language and their number of arguments.
FUNCTIONS: Mapping[str, int] = {
    **dict.fromkeys(
        (
            "exp log log1p expm1 tanh sigmoid relu gelu gelu_tanh silu erf sqrt rsqrt abs neg "
            "recip sin cos floor ceil sign not"
        ).split(),
        1,
    ),
    **dict.fromkeys("max min pow eq ne lt le gt ge and or floordiv mod".split(), 2),
    "where": 3,
}

_VAR = re.compile(r"[A-Za-z][A-Za-z0-9]*\Z")
IndexOp = Literal["+", "-", "*", "/", "%"]
ValueOp = Literal["+", "-", "*", "/"]


def _check_var(name: str) -> None:
    if not isinstance(name, str) or not _VAR.match(name):
        raise ValueError(expected("ir", "index variable", "letters and digits", repr(name)))


@dataclass(frozen=True, slots=True)
class IVar:
    """An index variable used as an index term, e.g. ``i``."""

    name: str

    def __post_init__(self) -> None:
        _check_var(self.name)


@dataclass(frozen=True, slots=True)
class IConst:
    """A constant index, e.g. ``0`` for a broadcast dimension of size one."""

    value: int

    def __post_init__(self) -> None:
        if not isinstance(self.value, int) or isinstance(self.value, bool):
            raise ValueError(expected("ir", "index constant", "an int", repr(self.value)))


@dataclass(frozen=True, slots=True)
class IBin:
    """Integer arithmetic on index terms: ``+ - * / %`` (``/`` is floor division)."""

    op: IndexOp
    left: IndexTerm
    right: IndexTerm

    def __post_init__(self) -> None:
        if self.op not in ("+", "-", "*", "/", "%"):
            raise ValueError(expected("ir", "index operator", "one of + - * / %", self.op))


@dataclass(frozen=True, slots=True)
class Access:
    """A read (or, on the left side, a write) of a tensor at index terms: ``X[g[e],k]``."""

    tensor: str
    indices: tuple[IndexTerm, ...] = ()

    def __post_init__(self) -> None:
        check_tensor_name(self.tensor, "Access")
        object.__setattr__(self, "indices", tuple(self.indices))

    @property
    def is_plain(self) -> bool:
        """Whether every index is a variable, each used once (no arithmetic, no indirection)."""
        names = [t.name for t in self.indices if isinstance(t, IVar)]
        return len(names) == len(self.indices) and len(set(names)) == len(names)

    @property
    def is_indirect(self) -> bool:
        """Whether some index term reads another tensor (``X[g[e],k]``)."""
        return any(_term_has_access(t) for t in self.indices)


IndexTerm = IVar | IConst | IBin | Access


@dataclass(frozen=True, slots=True)
class Const:
    """A number."""

    value: int | float

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, int | float):
            raise ValueError(expected("ir", "constant", "an int or a float", repr(self.value)))


@dataclass(frozen=True, slots=True)
class Bin:
    """Elementwise arithmetic: ``+ - * /`` (``/`` is true division)."""

    op: ValueOp
    left: Expr
    right: Expr

    def __post_init__(self) -> None:
        if self.op not in ("+", "-", "*", "/"):
            raise ValueError(expected("ir", "operator", "one of + - * /", self.op))


@dataclass(frozen=True, slots=True)
class Call:
    """An elementwise function from :data:`FUNCTIONS`: ``exp(x)``, ``where(c, a, b)``."""

    fn: str
    args: tuple[Expr, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))
        arity = FUNCTIONS.get(self.fn)
        if arity is None:
            raise ValueError(expected("ir", "function", "one of " + ", ".join(FUNCTIONS), self.fn))
        if arity != len(self.args):
            raise ValueError(expected("ir", self.fn, f"called with {arity} args", len(self.args)))


@dataclass(frozen=True, slots=True)
class Reduce:
    """A reduction binding ``vars`` over ``body``: ``max_j S[i,j]``."""

    op: ReduceOp
    vars: tuple[str, ...]
    body: Expr

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", ReduceOp(self.op))
        object.__setattr__(self, "vars", tuple(self.vars))
        if not self.vars or len(set(self.vars)) != len(self.vars):
            raise ValueError(expected("ir", "reduction vars", "distinct and non-empty", self.vars))
        for var in self.vars:
            _check_var(var)


@dataclass(frozen=True, slots=True)
class TensorRef:
    """A tensor passed whole to an opaque op."""

    name: str


@dataclass(frozen=True, slots=True)
class DTypeRef:
    """A dtype passed to an opaque op (printed ``torch.float32``)."""

    name: str


OpaqueArg = TensorRef | DTypeRef | int | float | bool | str | None | tuple["OpaqueArg", ...]


@dataclass(frozen=True, slots=True)
class Opaque:
    """A named op the IR does not describe: only its inputs, output shape and target are kept.

    Attributes:
        target: the ATen overload, e.g. ``"aten.topk.default"``.
        args: positional arguments (tensors by reference, literals as they are).
        kwargs: keyword arguments, as sorted ``(name, value)`` pairs.
        output: which element of a tuple result the op's output is; ``None`` for a tensor result.
    """

    target: str
    args: tuple[OpaqueArg, ...] = ()
    kwargs: tuple[tuple[str, OpaqueArg], ...] = ()
    output: int | None = None


Expr = Access | Const | Bin | Call | Reduce | Opaque


def term_accesses(term: IndexTerm) -> Iterator[Access]:
    """Yield the tensor accesses inside an index term, outermost first."""
    if isinstance(term, Access):
        yield term
        for t in term.indices:
            yield from term_accesses(t)
    elif isinstance(term, IBin):
        yield from term_accesses(term.left)
        yield from term_accesses(term.right)


def _term_has_access(term: IndexTerm) -> bool:
    return next(term_accesses(term), None) is not None


def term_vars(term: IndexTerm) -> set[str]:
    """The index variables an index term depends on (including inside indirect accesses)."""
    if isinstance(term, IVar):
        return {term.name}
    if isinstance(term, IBin):
        return term_vars(term.left) | term_vars(term.right)
    if isinstance(term, Access):
        return set().union(*(term_vars(t) for t in term.indices))
    return set()


def children(expr: Expr) -> tuple[Expr, ...]:
    """The value sub-expressions of ``expr`` (not its index terms)."""
    if isinstance(expr, Bin):
        return (expr.left, expr.right)
    if isinstance(expr, Call):
        return expr.args
    if isinstance(expr, Reduce):
        return (expr.body,)
    return ()


def walk(expr: Expr) -> Iterator[Expr]:
    """Yield ``expr`` and every value sub-expression, parents first."""
    yield expr
    for child in children(expr):
        yield from walk(child)


def accesses(expr: Expr) -> Iterator[Access]:
    """Yield every tensor access of ``expr``: value reads and the index tensors they use."""
    for node in walk(expr):
        if isinstance(node, Access):
            yield from term_accesses(node)


def free_vars(expr: Expr) -> set[str]:
    """The index variables ``expr`` depends on that no reduction inside it binds."""
    if isinstance(expr, Access):
        return set().union(*(term_vars(t) for t in expr.indices))
    if isinstance(expr, Reduce):
        return free_vars(expr.body) - set(expr.vars)
    return set().union(*(free_vars(c) for c in children(expr)))


def product_factors(expr: Expr) -> list[Expr]:
    """The factors of a tree of ``*`` (``[expr]`` when ``expr`` is not a product)."""
    if isinstance(expr, Bin) and expr.op == "*":
        return product_factors(expr.left) + product_factors(expr.right)
    return [expr]


def term_accesses_of(acc: Access) -> Iterator[Access]:
    """Yield ``acc`` and the index tensors its terms read."""
    yield acc
    for term in acc.indices:
        yield from term_accesses(term)


def opaque_tensors(arg: OpaqueArg) -> Iterator[str]:
    """Yield the names of the tensors an opaque op's argument passes (inside tuples too)."""
    if isinstance(arg, TensorRef):
        yield arg.name
    elif isinstance(arg, tuple):
        for item in arg:
            yield from opaque_tensors(item)
