"""Sparse programs: statements in index notation, built from text, from ir graphs or by hand.

A statement is one expression of the form the streaming machine runs::

    out[o...] = epilogue( reduce_{r...} combine(A[a...], B[b...], ...) )

with ``combine`` one of ``mul`` (the product of every operand: an intersection of sparse
operands), ``add``/``sub``/``max`` (a union), ``div`` (the left operand's pattern) or ``copy``
(one operand); ``reduce`` is ``sum`` or ``max`` over the variables absent from the output; the
``epilogue`` an ALU function applied to each output value. Examples::

    XW[l,n]  = sum_m X[l,m] * W1[m,n]           mul, sum over m
    H[i,n]   = relu(sum_l A[i,l] * XW[l,n])     mul, sum over l, relu
    E[i,j]   = exp(S[i,j] - M[i])               sub, exp

Index variables of different statements are unrelated until a region fuses them
(:mod:`fusekit.sparse.fusion_table`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fusekit.errors import expected
from fusekit.sparse.formats import SparseTensor

#: Element-wise ALU functions of the machine.
UNARY: Mapping[str, Any] = {
    "relu": lambda x: np.maximum(x, 0),
    "exp": np.exp,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "neg": np.negative,
}
#: Binary ALU functions; ``mul`` intersects sparse operands, the others take a union (div: left).
BINARY: Mapping[str, Any] = {
    "mul": np.multiply,
    "add": np.add,
    "sub": np.subtract,
    "div": np.divide,
    "max": np.maximum,
}
REDUCE: tuple[str, ...] = ("sum", "max")


@dataclass(frozen=True, slots=True)
class Operand:
    """A read ``tensor[vars...]`` (one distinct variable per dimension)."""

    tensor: str
    vars: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.tensor}[{','.join(self.vars)}]"


@dataclass(frozen=True, slots=True)
class Statement:
    """One expression of a sparse program.

    Attributes:
        out: the tensor written.
        out_vars: its index variables.
        operands: the tensors read.
        combine: how operand values combine (``mul``, ``add``, ``sub``, ``div``, ``max``, ``copy``).
        reduce: ``sum`` or ``max`` over the variables not in ``out_vars``; ``None`` for none.
        epilogue: a function of :data:`UNARY` applied to the result, or ``None``.
    """

    out: str
    out_vars: tuple[str, ...]
    operands: tuple[Operand, ...]
    combine: str = "mul"
    reduce: str | None = None
    epilogue: str | None = None

    def __post_init__(self) -> None:
        where = f"statement {self.out}"
        if self.combine not in (*BINARY, "copy"):
            raise ValueError(
                expected(where, "combine", "one of " + ", ".join([*BINARY, "copy"]), self.combine)
            )
        if self.combine == "copy" and len(self.operands) != 1:
            raise ValueError(
                expected(where, "operands", "one operand for copy", len(self.operands))
            )
        if self.combine not in ("mul", "copy") and len(self.operands) != 2:
            raise ValueError(
                expected(where, "operands", f"two operands for {self.combine}", len(self.operands))
            )
        if self.epilogue is not None and self.epilogue not in UNARY:
            raise ValueError(
                expected(where, "epilogue", "one of " + ", ".join(UNARY), self.epilogue)
            )
        if len(set(self.out_vars)) != len(self.out_vars):
            raise ValueError(expected(where, "out_vars", "distinct", self.out_vars))
        for op in self.operands:
            if len(set(op.vars)) != len(op.vars):
                raise ValueError(expected(where, str(op), "distinct index variables", op.vars))
        summed = [v for v in self.vars if v not in self.out_vars]
        if summed and self.reduce not in REDUCE:
            raise ValueError(expected(where, "reduce", f"sum or max over {summed}", self.reduce))
        missing = [v for v in self.out_vars if v not in self.vars]
        if missing:
            raise ValueError(expected(where, "out_vars", "each read by some operand", missing))

    @property
    def vars(self) -> tuple[str, ...]:
        """Every index variable: the output's, then the reduced ones in first-read order."""
        seen = dict.fromkeys(self.out_vars)
        for op in self.operands:
            seen.update(dict.fromkeys(op.vars))
        return tuple(seen)

    @property
    def reduce_vars(self) -> tuple[str, ...]:
        """The variables summed (or maxed) away."""
        return tuple(v for v in self.vars if v not in self.out_vars)

    def __str__(self) -> str:
        sym = (
            {"mul": " * ", "add": " + ", "sub": " - ", "div": " / ", "max": ", "}[self.combine]
            if self.combine != "copy"
            else ""
        )
        body = sym.join(map(str, self.operands))
        if self.combine == "max":
            body = f"max({body})"
        if self.reduce_vars:
            body = f"{self.reduce}_{{{','.join(self.reduce_vars)}}} {body}"
        if self.epilogue:
            body = f"{self.epilogue}({body})"
        return f"{self.out}[{','.join(self.out_vars)}] = {body}"


@dataclass(frozen=True, eq=False)
class Program:
    """Statements over named tensors.

    Attributes:
        name: a label.
        statements: in a topological order (each reads only inputs or earlier outputs).
        inputs: the stored input tensors by name.
        outputs: the tensors the program returns.
        shapes: the shape of every tensor (inputs and statement outputs).
    """

    name: str
    statements: tuple[Statement, ...]
    inputs: Mapping[str, SparseTensor]
    outputs: tuple[str, ...]
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        shapes = {n: t.shape for n, t in self.inputs.items()}
        for st in self.statements:
            where = f"program {self.name}, statement {st.out}"
            extents: dict[str, int] = {}
            for op in st.operands:
                if op.tensor not in shapes:
                    raise ValueError(
                        expected(where, op.tensor, "an input or an earlier output", "undefined")
                    )
                shape = shapes[op.tensor]
                if len(shape) != len(op.vars):
                    raise ValueError(
                        expected(where, str(op), f"{len(shape)} indices", len(op.vars))
                    )
                for v, size in zip(op.vars, shape, strict=True):
                    if extents.setdefault(v, size) != size:
                        raise ValueError(
                            expected(
                                where,
                                f"index {v}",
                                f"one extent ({extents[v]})",
                                f"{size} from {op}",
                            )
                        )
            if st.out in shapes:
                raise ValueError(
                    expected(where, st.out, "written once", "written twice or an input")
                )
            shapes[st.out] = tuple(extents[v] for v in st.out_vars)
        for name in self.outputs:
            if name not in shapes:
                raise ValueError(
                    expected(f"program {self.name}", "outputs", "defined tensors", name)
                )
        object.__setattr__(self, "shapes", shapes)

    def producer(self, tensor: str) -> Statement | None:
        """The statement writing ``tensor``, or ``None`` for an input."""
        return next((s for s in self.statements if s.out == tensor), None)

    def extents(self, st: Statement) -> dict[str, int]:
        """The extent of every index variable of ``st``."""
        out: dict[str, int] = {}
        for op in st.operands:
            out.update(zip(op.vars, self.shapes[op.tensor], strict=True))
        return out


def reference(program: Program, with_masks: bool = False) -> dict[str, np.ndarray]:
    """Evaluate a program densely (memoised per program; see :func:`_reference`)."""
    out = _reference(program)
    return {k: v for k, v in out.items() if with_masks or not k.endswith("#mask")}


@functools.lru_cache(maxsize=8)
def _reference(program: Program) -> dict[str, np.ndarray]:
    """Evaluate a program densely with numpy (the reference the simulator is checked against).

    Sparse semantics: ``mul`` is exact on dense arrays (absent = 0); a statement whose combine
    is not ``mul`` applies only on the union of its *sparse* operands' patterns (a dense operand
    is read where the sparse ones are and never widens the pattern; div: the left operand's),
    and a ``max`` reduction ranges over stored entries only.
    The pattern of every tensor is tracked as a boolean mask beside its dense values.

    Args:
        program: the program.
        with_masks: also return each tensor's pattern as ``"<name>#mask"``.

    Returns:
        Every tensor's dense value by name.
    """
    vals: dict[str, np.ndarray] = {
        n: t.to_dense().astype(np.float64) for n, t in program.inputs.items()
    }
    masks: dict[str, np.ndarray] = {}
    for n, t in program.inputs.items():
        m = np.zeros(t.shape, dtype=bool)
        coords, _ = t.coords()
        m[tuple(coords.T)] = True
        masks[n] = m
    for st in program.statements:
        allv = st.vars
        if st.combine == "mul" and st.reduce in (None, "sum"):
            vals[st.out], masks[st.out] = _einsum_statement(st, vals, masks)
            continue

        ops = [
            (_spread(allv, o.vars, vals[o.tensor]), _spread(allv, o.vars, masks[o.tensor]))
            for o in st.operands
        ]
        if st.combine == "copy":
            value, mask = ops[0]
        elif st.combine == "mul":
            value, mask = ops[0]
            for v2, m2 in ops[1:]:
                value, mask = value * v2, mask & m2
        else:
            (a, ma), (b, mb) = ops
            full_a, full_b = bool(ma.all()), bool(mb.all())
            if st.combine == "div" or (full_b and not full_a):
                mask = ma
            elif full_a and not full_b:
                mask = mb
            else:
                mask = ma | mb
            with np.errstate(divide="ignore", invalid="ignore"):
                value = np.where(mask, BINARY[st.combine](a, b), 0.0)
        full_shape = np.broadcast_shapes(*(o[0].shape for o in ops))
        value = np.broadcast_to(value, full_shape)
        mask = np.broadcast_to(mask, full_shape)
        axes = tuple(allv.index(v) for v in st.reduce_vars)
        if axes and st.reduce == "sum":
            value = np.where(mask, value, 0.0).sum(axis=axes)
            mask = np.asarray(mask.any(axis=axes))
        elif axes:
            value = np.where(mask, value, -np.inf).max(axis=axes)
            mask = np.asarray(mask.any(axis=axes))
            value = np.where(mask, value, 0.0)
        if st.epilogue:
            value = np.where(mask, UNARY[st.epilogue](value), 0.0)
        keep = [allv[k] for k in range(len(allv)) if k not in axes]
        perm = [keep.index(v) for v in st.out_vars]
        vals[st.out] = np.ascontiguousarray(np.transpose(np.where(mask, value, 0.0), perm))
        masks[st.out] = np.ascontiguousarray(np.transpose(mask, perm))
    vals.update({f"{k}#mask": m for k, m in masks.items()})
    return vals


def _spread(allv: tuple[str, ...], vs: tuple[str, ...], arr: np.ndarray) -> np.ndarray:
    """``arr`` indexed by ``vs``, transposed and broadcastable over all variables ``allv``."""
    perm = sorted(range(len(vs)), key=lambda k: allv.index(vs[k]))
    shape = [1] * len(allv)
    for v, size in zip(vs, arr.shape, strict=True):
        shape[allv.index(v)] = size
    return np.transpose(arr, perm).reshape(shape)


def _einsum_statement(
    st: Statement, vals: dict[str, np.ndarray], masks: dict[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    letters = {v: chr(ord("a") + k) for k, v in enumerate(st.vars)}
    spec = ",".join("".join(letters[v] for v in o.vars) for o in st.operands)
    spec += "->" + "".join(letters[v] for v in st.out_vars)
    # torch's einsum contracts through BLAS (numpy's is far slower here); loaded only here, as
    # torch is slow to load and the rest of sparse runs on numpy
    import torch

    value = torch.einsum(spec, *(torch.from_numpy(vals[o.tensor]) for o in st.operands)).numpy()
    ones = (torch.from_numpy(masks[o.tensor].astype(np.float32)) for o in st.operands)
    mask = torch.einsum(spec, *ones).numpy() > 0
    if st.epilogue:
        value = np.where(mask, UNARY[st.epilogue](value), 0.0)
    return np.where(mask, value, 0.0), mask
