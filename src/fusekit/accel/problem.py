"""Compound-operation problems: a chain of IR contraction, map and reduce ops with index extents.

A problem is written in the IR's index notation (see :mod:`fusekit.ir.op`) plus the extent of
every index variable. GEMM-Softmax, for instance, splits the softmax as COMET does (GEMM ->
row-max -> sub -> exp -> row-sum -> div)::

    S[m,n] += A[m,k] * B[k,n]          GEMM on the systolic arrays
    X[m] = max_n S[m,n]                SIMD row_max
    E[m,n] = exp(S[m,n] - X[m])        SIMD add (sub) + exp
    Z[m] = sum_n E[m,n]                SIMD row_sum
    Y[m,n] = E[m,n] / Z[m]             SIMD div

The first op's first two output variables are the problem's *row* and *column* variables: the
mapping partitions them over clusters, and a row-reduction over the column variable needs a
collective when the columns are split. YAML form (``load_problem``)::

    name: my_chain
    dims: {m: 256, n: 256, k: 128}
    ops: ["S[m,n] += A[m,k] * B[k,n]", "Y[m,n] = exp(S[m,n])"]

or a built-in kind: ``{kind: gemm_softmax, M: 256, N: 256, K: 128}``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fusekit.errors import ConfigError, expected
from fusekit.files import clip, load_yaml, short, top_mapping
from fusekit.ir import (
    Access,
    Bin,
    Call,
    Const,
    Expr,
    IVar,
    Op,
    OpKind,
    Reduce,
    ReduceOp,
    format_op,
    parse_op,
)
from fusekit.ir.expr import walk

StageKind = Literal["gemm", "simd"]

#: SIMD lane-ops of the IR's elementwise functions (``rsqrt`` = sqrt then div).
_CALL_OPS: Mapping[str, tuple[str, ...]] = {
    "exp": ("exp",),
    "sqrt": ("sqrt",),
    "rsqrt": ("sqrt", "div"),
    "recip": ("div",),
    "max": ("max",),
    "min": ("max",),
    "neg": ("mul",),
    "abs": ("max",),
    "relu": ("max",),
}
_BIN_OPS: Mapping[str, str] = {"+": "add", "-": "add", "*": "mul", "/": "div"}


@dataclass(frozen=True, slots=True)
class Stage:
    """One op of the chain, classified for the accelerator.

    Attributes:
        op: the IR op.
        kind: ``gemm`` (a contraction of two tensors, on the systolic arrays) or ``simd``.
        out: the tensor written.
        inputs: the tensors read.
        out_vars: the output's index variables, in order.
        reduced_vars: variables summed or reduced over.
        simd_ops: ``(op, count)`` SIMD lane-ops per point of the iteration space (``row_max`` /
            ``row_sum`` for reductions); empty for a GEMM.
        per_out_ops: ``(op, count)`` SIMD lane-ops per output element (``mean``'s scaling).
    """

    op: Op
    kind: StageKind
    out: str
    inputs: tuple[str, ...]
    out_vars: tuple[str, ...]
    reduced_vars: tuple[str, ...]
    simd_ops: tuple[tuple[str, int], ...]
    per_out_ops: tuple[tuple[str, int], ...]
    reduce_op: str

    @property
    def vars(self) -> tuple[str, ...]:
        """The iteration space: output variables, then reduced ones."""
        return (*self.out_vars, *self.reduced_vars)


@dataclass(frozen=True, slots=True)
class Problem:
    """A chain of ops with the extent of every index variable.

    Attributes:
        name: a label, e.g. ``"gemm_softmax"``.
        extents: index variable -> size.
        stages: the ops in execution order.
        tensors: tensor -> its index variables.
        row: the row variable (partitioned over clusters, the fused row block).
        col: the column variable (partitioned over clusters; reductions over it need collectives).
        inputs: tensors read but never written (they start in DRAM).
        sizes: tensor -> elements.
        outputs: tensors written and never read by a later op (they end in DRAM); the last op's
            always is one.
    """

    name: str
    extents: Mapping[str, int]
    stages: tuple[Stage, ...]
    tensors: Mapping[str, tuple[str, ...]]
    row: str
    col: str
    inputs: tuple[str, ...]
    sizes: Mapping[str, int]
    outputs: tuple[str, ...]

    @property
    def output(self) -> str:
        """The last stage's tensor: it ends in DRAM."""
        return self.stages[-1].out

    @property
    def intermediates(self) -> tuple[str, ...]:
        """Tensors written by one stage and read by a later one."""
        return tuple(s.out for s in self.stages if s.out not in self.outputs)

    def independent(self) -> bool:
        """Whether no op reads another op's result (all of them may run at once)."""
        return not any(t not in self.inputs for s in self.stages for t in s.inputs)

    def size(self, tensor: str) -> int:
        """Elements of ``tensor``."""
        return self.sizes[tensor]

    @property
    def macs(self) -> int:
        """MACs of every GEMM stage."""
        return sum(
            math.prod(self.extents[v] for v in s.vars) for s in self.stages if s.kind == "gemm"
        )

    def describe(self) -> str:
        """The ops in index notation, one per line, then the extents."""
        dims = ", ".join(f"{v}={n}" for v, n in self.extents.items())
        return "\n".join([*(format_op(s.op) for s in self.stages), dims])


def _simd_ops(expr: Expr) -> list[str]:
    """SIMD lane-ops of one evaluation of ``expr`` (reductions excluded)."""
    if isinstance(expr, Access | Const):
        return []
    if isinstance(expr, Bin):
        return [_BIN_OPS[expr.op], *_simd_ops(expr.left), *_simd_ops(expr.right)]
    if isinstance(expr, Call):
        if expr.fn not in _CALL_OPS:
            raise ValueError(
                expected("accel", "function", "one of " + ", ".join(_CALL_OPS), expr.fn)
            )
        inner = [op for arg in expr.args for op in _simd_ops(arg)]
        return [*_CALL_OPS[expr.fn], *inner]
    if isinstance(expr, Reduce):
        raise ValueError(expected("accel", "op", "one reduction, at the top", expr))
    raise ValueError(expected("accel", "expression", "arithmetic on tensor reads", expr))


def _count(ops: Sequence[str]) -> tuple[tuple[str, int], ...]:
    counts: dict[str, int] = {}
    for op in ops:
        counts[op] = counts.get(op, 0) + 1
    return tuple(counts.items())


def _classify(op: Op) -> Stage:
    where = f"accel: op {op.name}"
    if not op.out.is_plain or any(not a.is_plain for a in _reads(op.expr)):
        raise ValueError(f"{where}: expected plain index variables (got {op})")
    out_vars = tuple(t.name for t in op.out.indices if isinstance(t, IVar))
    reads = list(dict.fromkeys(a.tensor for a in _reads(op.expr)))
    kind = op.kind
    if kind is OpKind.CONTRACTION:
        body = op.expr.body if isinstance(op.expr, Reduce) else op.expr
        reduced = tuple(op.expr.vars) if isinstance(op.expr, Reduce) else tuple(op.summed_vars)
        if not (isinstance(body, Bin) and body.op == "*" and len(reads) == 2):
            raise ValueError(f"{where}: expected a product of two distinct tensors (got {op})")
        return Stage(op, "gemm", op.name, tuple(reads), out_vars, reduced, (), (), "sum")
    if kind is OpKind.REDUCE:
        if not isinstance(op.expr, Reduce) or op.accumulate:
            raise ValueError(f"{where}: expected 'Y[i] = max_j X[i,j]' form (got {op})")
        r = op.expr
        if r.op not in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MEAN):
            raise ValueError(expected(where, "reduction", "sum, mean or max", r.op.value))
        tree = "row_max" if r.op is ReduceOp.MAX else "row_sum"
        per_out = (("mul", 1),) if r.op is ReduceOp.MEAN else ()
        ops = [*_simd_ops(r.body), tree]
        return Stage(
            op, "simd", op.name, tuple(reads), out_vars, tuple(r.vars), _count(ops), per_out,
            "max" if r.op is ReduceOp.MAX else "sum",
        )  # fmt: skip
    if kind is OpKind.MAP:
        return Stage(
            op, "simd", op.name, tuple(reads), out_vars, (), _count(_simd_ops(op.expr)), (), ""
        )
    raise ValueError(expected(where, "kind", "contraction, map or reduce", kind.value))


def _reads(expr: Expr) -> list[Access]:
    return [node for node in walk(expr) if isinstance(node, Access)]


def make_problem(name: str, ops: Sequence[str | Op], extents: Mapping[str, int]) -> Problem:
    """Build a problem from ops in index notation and the extent of every variable.

    Args:
        name: a label.
        ops: IR ops (or their text form) in execution order; every input is either written by
            an earlier op or a problem input.
        extents: size of every index variable used.

    Returns:
        The validated problem.

    Raises:
        ValueError: an op of another kind, an unknown variable, a non-positive extent, a tensor
            indexed two ways, or a first op with fewer than two output variables.
    """
    if not ops:
        raise ValueError(expected("accel", "ops", "at least one op", "[]"))
    parsed = [parse_op(o) if isinstance(o, str) else o for o in ops]
    stages = tuple(_classify(o) for o in parsed)
    tensors: dict[str, tuple[str, ...]] = {}
    for stage in stages:
        accesses = [stage.op.out, *_reads(stage.op.expr)]
        for acc in accesses:
            vs = tuple(t.name for t in acc.indices if isinstance(t, IVar))
            if tensors.setdefault(acc.tensor, vs) != vs:
                raise ValueError(
                    expected("accel", acc.tensor, f"indexed as {tensors[acc.tensor]}", vs)
                )
            for v in vs:
                n = extents.get(v)
                if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                    raise ValueError(expected("accel", f"extent of {v!r}", "an int >= 1", n))
    written: set[str] = set()
    for stage in stages:
        if stage.out in written:
            raise ValueError(expected("accel", stage.out, "written once", "written twice"))
        written.add(stage.out)
    first = stages[0].out_vars
    if len(first) < 2:
        raise ValueError(
            expected("accel", "first op", "two output variables (rows, columns)", first)
        )
    used = {v for vs in tensors.values() for v in vs}
    inputs = dict.fromkeys(t for s in stages for t in s.inputs if t not in written)
    return Problem(
        name=name,
        extents={v: int(extents[v]) for v in extents if v in used},
        stages=stages,
        tensors=tensors,
        row=first[0],
        col=first[1],
        inputs=tuple(inputs),
        sizes={t: math.prod(int(extents[v]) for v in vs) for t, vs in tensors.items()},
        outputs=tuple(s.out for s in stages if not any(s.out in later.inputs for later in stages)),
    )


def gemm(M: int, N: int, K: int) -> Problem:
    """``S[m,n] += A[m,k] * B[k,n]``."""
    return make_problem("gemm", ["S[m,n] += A[m,k] * B[k,n]"], {"m": M, "n": N, "k": K})


_SOFTMAX = [
    "X[m] = max_n S[m,n]",
    "E[m,n] = exp(S[m,n] - X[m])",
    "Z[m] = sum_n E[m,n]",
    "Y[m,n] = E[m,n] / Z[m]",
]


def gemm_softmax(M: int, N: int, K: int) -> Problem:
    """GEMM then a row softmax: GEMM -> row-max -> sub, exp -> row-sum -> div."""
    ops = ["S[m,n] += A[m,k] * B[k,n]", *_SOFTMAX]
    return make_problem("gemm_softmax", ops, {"m": M, "n": N, "k": K})


def gemm_layernorm(M: int, N: int, K: int) -> Problem:
    """GEMM then a row LayerNorm (no affine): mean, centre, variance, rsqrt, scale."""
    ops = [
        "S[m,n] += A[m,k] * B[k,n]",
        "U[m] = mean_n S[m,n]",
        "D[m,n] = S[m,n] - U[m]",
        "Q[m] = mean_n D[m,n] * D[m,n]",
        "R[m] = rsqrt(Q[m] + 0.00001)",
        "Y[m,n] = D[m,n] * R[m]",
    ]
    return make_problem("gemm_layernorm", ops, {"m": M, "n": N, "k": K})


def attention(M: int, N: int, K: int) -> Problem:
    """Self-attention of one head: ``softmax(Q K^T) V`` with M queries, N keys, head dim K."""
    ops = [
        "S[m,n] = sum_k Q[m,k] * K[n,k]",
        "X[m] = max_n S[m,n]",
        "E[m,n] = exp(S[m,n] - X[m])",
        "Z[m] = sum_n E[m,n]",
        "P[m,n] = E[m,n] / Z[m]",
        "O[m,d] += P[m,n] * V[n,d]",
    ]
    return make_problem("attention", ops, {"m": M, "n": N, "k": K, "d": K})


#: Built-in compound operations by name.
KINDS = {
    "gemm": gemm,
    "gemm_softmax": gemm_softmax,
    "gemm_layernorm": gemm_layernorm,
    "attention": attention,
}


class _KindSchema(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["gemm", "gemm_softmax", "gemm_layernorm", "attention"]
    M: int = Field(gt=0)
    N: int = Field(gt=0)
    K: int = Field(gt=0)


class _ChainSchema(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = "chain"
    dims: dict[str, int] = Field(min_length=1)
    ops: list[str] = Field(min_length=1)


def problem_from_dict(data: Any, source: str = "<problem>") -> Problem:
    """Build a problem from its YAML/dict form (see the module docstring).

    Raises:
        ConfigError: one line naming ``source``, the field and the problem.
    """
    data = top_mapping(data, source)
    try:
        if "kind" in data:
            k = _KindSchema.model_validate(data)
            return KINDS[k.kind](k.M, k.N, k.K)
        c = _ChainSchema.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        path = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            raise ConfigError(source, path, "unknown field") from None
        raise ConfigError(source, path, f"{err['msg']} (got {short(err.get('input'))})") from None
    try:
        return make_problem(c.name, c.ops, c.dims)
    except ValueError as e:
        raise ConfigError(source, "ops", clip(str(e))) from None


def load_problem(path: str | Path) -> Problem:
    """Read a problem YAML file (see :func:`problem_from_dict`).

    Raises:
        ConfigError: one line naming the file: unreadable, not UTF-8, not valid YAML, a bound of
            :func:`fusekit.files.load_yaml` broken, or a field missing, unknown or invalid.
    """
    return problem_from_dict(load_yaml(path), str(path))
