"""Ops of the IR: one output tensor defined by an index-notation expression.

An op assigns every element of its output, e.g.::

    Y[i,j] = sum_k A[i,k] * B[k,j]                  contraction
    Y[i,j] = exp(S[i,j] - M[i])                     map
    M[i] = max_j S[i,j]                             reduce
    Y[e,k] = X[g[e],k]                              gather (an indirect read)
    Y[d[e],m] += X[e,m]                             scatter (an indirect write)
    Y = opaque aten.topk.default(X, 4)[1]           opaque (only shapes are known)

Semantics. ``=`` writes each output element once: the left side holds distinct index variables,
and every variable free on the right appears on the left (a variable missing on the right
broadcasts). ``+=`` starts the output at zero and adds the right side for every value of every
index variable; variables absent from the left are therefore summed, and two iterations that
reach the same element (an indirect or affine write) both add to it. ``sum_k``, ``max_k``,
``min_k``, ``prod_k`` and ``mean_k`` bind ``k`` over the term that follows them. An index term is
a variable, an int, ``+ - * / %`` of terms (``/`` is floor division) or an access into an integer
tensor (``g[e]``); a variable's extent comes from the dimensions it indexes directly. The result
is stored in the output tensor's dtype, so a cast is a map whose output dtype differs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from fusekit.errors import expected
from fusekit.ir.tensor import Dim, check_tensor_name


class OpKind(StrEnum):
    """What an op does, derived from its expression."""

    CONTRACTION = "contraction"
    MAP = "map"
    REDUCE = "reduce"
    GATHER = "gather"
    SCATTER = "scatter"
    OPAQUE = "opaque"


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


def _is_contraction(body: Expr, reduced: set[str]) -> bool:
    reads = [f for f in product_factors(body) if isinstance(f, Access)]
    if len(reads) < 2:
        return False
    return any(sum(var in free_vars(a) for a in reads) >= 2 for var in reduced)


@dataclass(frozen=True, slots=True)
class Op:
    """One op: ``out = expr`` or ``out += expr`` in index notation.

    Attributes:
        out: the written tensor and its index terms (no indices for an opaque op).
        expr: the right side.
        accumulate: ``+=`` (start from zero, add every iteration) rather than ``=``.
        origin: where the op came from (the ATen target and source line); not part of the text
            form and ignored by ``==``.
    """

    out: Access
    expr: Expr
    accumulate: bool = False
    origin: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        where = f"op {self.out.tensor}"
        if isinstance(self.expr, Opaque):
            if self.out.indices or self.accumulate:
                raise ValueError(
                    expected(where, "out", "a bare name '=' for an opaque op", self.out)
                )
        elif any(isinstance(node, Opaque) for node in walk(self.expr)):
            raise ValueError(expected(where, "expr", "an opaque call only at the top", self.expr))
        if not self.accumulate:
            names = [t.name for t in self.out.indices if isinstance(t, IVar)]
            if not self.out.is_plain:
                raise ValueError(
                    expected(
                        where, "out", "distinct index variables (use '+=' to scatter)", self.out
                    )
                )
            missing = free_vars(self.expr) - set(names)
            if missing:
                raise ValueError(
                    expected(
                        where, "right side", "free only in the left's variables", sorted(missing)
                    )
                )
        if self.out.tensor in self.inputs:
            raise ValueError(expected(where, "expr", "free of reads of its own output", self.out))

    @property
    def name(self) -> str:
        """The op's name: the name of the tensor it writes."""
        return self.out.tensor

    @property
    def inputs(self) -> tuple[str, ...]:
        """The tensors the op reads, in first-read order (index tensors included)."""
        seen: dict[str, None] = {}
        for term in self.out.indices:
            for acc in term_accesses(term):
                seen[acc.tensor] = None
        if isinstance(self.expr, Opaque):
            for arg in (*self.expr.args, *(v for _, v in self.expr.kwargs)):
                seen.update(dict.fromkeys(_opaque_tensors(arg)))
        else:
            seen.update(dict.fromkeys(acc.tensor for acc in accesses(self.expr)))
        return tuple(seen)

    @property
    def out_vars(self) -> set[str]:
        """The index variables of the left side."""
        return set().union(*(term_vars(t) for t in self.out.indices))

    @property
    def summed_vars(self) -> set[str]:
        """Variables an ``+=`` sums implicitly: free on the right, absent on the left."""
        return free_vars(self.expr) - self.out_vars if self.accumulate else set()

    @property
    def kind(self) -> OpKind:
        """The op's kind: opaque, scatter, gather, contraction, reduce or map, in that priority."""
        if isinstance(self.expr, Opaque):
            return OpKind.OPAQUE
        if any(_term_has_access(t) for t in self.out.indices):
            return OpKind.SCATTER
        if any(isinstance(node, Access) and node.is_indirect for node in walk(self.expr)):
            return OpKind.GATHER
        reduces = [n for n in walk(self.expr) if isinstance(n, Reduce)]
        summed = self.summed_vars
        if (summed and _is_contraction(self.expr, summed)) or any(
            r.op is ReduceOp.SUM and _is_contraction(r.body, set(r.vars)) for r in reduces
        ):
            return OpKind.CONTRACTION
        if summed or reduces or (self.accumulate and not self.out.is_plain):
            return OpKind.REDUCE
        return OpKind.MAP

    @property
    def is_layout(self) -> bool:
        """Whether the op only moves elements: ``Y[...] = X[affine indices]`` with no arithmetic."""
        return (
            not self.accumulate
            and isinstance(self.expr, Access)
            and not self.expr.is_indirect
            and self.kind is OpKind.MAP
        )

    def extents(self, shapes: Mapping[str, tuple[Dim, ...]]) -> dict[str, Dim]:
        """Infer the extent of every index variable.

        A variable indexing an output dimension directly takes that dimension's size, and every
        read it indexes directly must be at least that long (a read of a prefix, as a slice
        does). A variable absent from the output's direct indices takes the size of the
        dimensions it indexes directly, which must all agree.

        Args:
            shapes: the shape of every tensor the op reads or writes.

        Returns:
            Variable name to extent.

        Raises:
            ValueError: if an access has the wrong number of indices, a read is shorter than its
                variable's extent, extents disagree, or a variable never indexes a dimension
                directly.
        """
        if isinstance(self.expr, Opaque):
            return {}
        where = f"op {self.name}"
        found: dict[str, tuple[Dim, str]] = {}
        reads = [*term_accesses_of(self.out), *accesses(self.expr)]
        for acc in reads:
            if acc.tensor not in shapes:
                raise ValueError(expected(where, acc.tensor, "a declared tensor", "undeclared"))
            if len(acc.indices) != len(shapes[acc.tensor]):
                raise ValueError(
                    expected(
                        where,
                        acc.tensor,
                        f"indexed by {len(shapes[acc.tensor])} terms",
                        len(acc.indices),
                    )
                )
        outer = {t.name for t in self.out.indices if isinstance(t, IVar)}
        for acc in reads:
            for dim, term in enumerate(acc.indices):
                if not isinstance(term, IVar):
                    continue
                size = shapes[acc.tensor][dim]
                seen = found.setdefault(term.name, (size, f"{acc.tensor}[{dim}]"))
                prefix = (
                    term.name in outer
                    and acc is not self.out
                    and isinstance(size, int)
                    and isinstance(seen[0], int)
                    and size >= seen[0]
                )
                if seen[0] != size and not prefix:
                    raise ValueError(
                        expected(
                            where,
                            f"index {term.name}",
                            "one extent" if term.name not in outer else "within the read",
                            f"{seen[0]} from {seen[1]} and {size} from {acc.tensor}[{dim}]",
                        )
                    )
        used = self.out_vars | free_vars(self.expr)
        for node in walk(self.expr):
            if isinstance(node, Reduce):
                used |= set(node.vars)
        unknown = sorted(used - set(found))
        if unknown:
            raise ValueError(
                expected(where, f"index {unknown[0]}", "used directly as some index", "no extent")
            )
        return {var: extent for var, (extent, _) in found.items()}

    def __str__(self) -> str:
        from fusekit.ir.text import format_op

        return format_op(self)


def term_accesses_of(acc: Access) -> Iterator[Access]:
    """Yield ``acc`` and the index tensors its terms read."""
    yield acc
    for term in acc.indices:
        yield from term_accesses(term)


def _opaque_tensors(arg: OpaqueArg) -> Iterator[str]:
    if isinstance(arg, TensorRef):
        yield arg.name
    elif isinstance(arg, tuple):
        for item in arg:
            yield from _opaque_tensors(item)
