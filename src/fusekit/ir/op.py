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
reach the same element (an indirect or affine write) both add to it. A variable's extent comes
from the dimensions it indexes directly. The result is stored in the output tensor's dtype, so a
cast is a map whose output dtype differs. The expression language (index terms, reductions,
functions) is :mod:`fusekit.ir.expr`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from fusekit.errors import expected
from fusekit.ir.expr import (
    Access,
    Expr,
    IVar,
    Opaque,
    Reduce,
    ReduceOp,
    accesses,
    free_vars,
    opaque_tensors,
    product_factors,
    term_accesses,
    term_accesses_of,
    term_vars,
    walk,
)
from fusekit.ir.printer import format_access, format_expr
from fusekit.ir.tensor import Dim


class OpKind(StrEnum):
    """What an op does, derived from its expression."""

    CONTRACTION = "contraction"
    MAP = "map"
    REDUCE = "reduce"
    GATHER = "gather"
    SCATTER = "scatter"
    OPAQUE = "opaque"


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
    # derived on first use (an op is immutable); not part of equality or the text form
    _kind: OpKind | None = field(default=None, init=False, repr=False, compare=False)
    _inputs: tuple[str, ...] | None = field(default=None, init=False, repr=False, compare=False)
    _reads: tuple[Access, ...] | None = field(default=None, init=False, repr=False, compare=False)

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
        if self._inputs is None:
            object.__setattr__(self, "_inputs", self._find_inputs())
        assert self._inputs is not None
        return self._inputs

    @property
    def reads(self) -> tuple[Access, ...]:
        """The value reads of the right side (not its index tensors), in :func:`walk` order."""
        if self._reads is None:
            found = tuple(n for n in walk(self.expr) if isinstance(n, Access))
            object.__setattr__(self, "_reads", found)
        assert self._reads is not None
        return self._reads

    def _find_inputs(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for term in self.out.indices:
            for acc in term_accesses(term):
                seen[acc.tensor] = None
        if isinstance(self.expr, Opaque):
            for arg in (*self.expr.args, *(v for _, v in self.expr.kwargs)):
                seen.update(dict.fromkeys(opaque_tensors(arg)))
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
        if self._kind is None:
            object.__setattr__(self, "_kind", self._find_kind())
        assert self._kind is not None
        return self._kind

    def _find_kind(self) -> OpKind:
        if isinstance(self.expr, Opaque):
            return OpKind.OPAQUE
        if self.out.is_indirect:
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
        return format_op(self)


def format_op(op: Op) -> str:
    """Print an op in the text form :func:`fusekit.ir.text.parse_op` reads back to an equal op."""
    return f"{format_access(op.out)} {'+=' if op.accumulate else '='} {format_expr(op.expr)}"
