"""CPU backend: one numba kernel per fusion group, generated from the group's :class:`Layout`.

The generated kernel (one per group, compiled once and cached on disk by its source hash) is a
chunk of rows and a finish, run by the shared launchers of :mod:`.launch` (one thread loop
compiled once for every kernel: numba's ``parallel=True`` pipeline would cost each kernel
about a second more to compile)::

    def chunk(c, argv):                           # launch: for c in prange(n_chunks)
        rows(c, n_chunks, E2, in_X, out_Y, part_G)  # argv unpacked: trip counts, arrays

    def rows(c, n_chunks, E2, in_X, ...):         # compiled noalias (.noalias)
        buf_Y = np.empty(Q)                       # regional: row buffers, reused per row
        col_G[:] = identity                       # global: this chunk's partials
        for p in rows of chunk c:
            a0, a1 = p // E1, p % E1              # parallel anchor indices
            acc_R = identity                      # stage 1
            for a2 in range(E2):
                v_Y = f(in_X[...], ...)           #   local: values in registers
                buf_Y[q] = v_Y; out_Y[...] = v_Y
                acc_R += g(v_Y); col_G[a2] += h(v_Y)
            v_R = acc_R                           # row ops, then stage 2 ...
        part_G[c, :] = col_G

    def finish(c, argv):                          # after every chunk
        out_G[k] = combine_c part_G[c, k]

Every group also has a reference: the same ops run by :func:`fusekit.ir.interpret` (see
:func:`fusekit.stitch.runner.reference_group`), and the tests compare the two.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
import torch

from fusekit.errors import expected
from fusekit.ir.expr import Access, Call, Reduce, walk
from fusekit.ir.graph import Graph
from fusekit.ir.strides import fit_strides
from fusekit.stitch.alone import plain_vars
from fusekit.stitch.codegen.approx import prelude
from fusekit.stitch.codegen.compiling import compile_module
from fusekit.stitch.codegen.render import (
    HALF,
    Dialect,
    Renderer,
    canonical,
    compute_dtype,
    digit_splits,
    identity,
    recomputed,
    static_shape,
    strides,
)
from fusekit.stitch.schemes import Layout, Role, RowStep, Stage


def _torch_empty(shape: tuple[int, ...], step: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_strided(shape, step, dtype=dtype)


def _torch_view(
    x: torch.Tensor, shape: tuple[int, ...], step: tuple[int, ...], offset: int
) -> torch.Tensor:
    return torch.as_strided(x, shape, step, x.storage_offset() + offset)


#: a new CPU tensor ``(shape, strides, dtype)``, and a view of a tensor's storage ``(x, shape,
#: strides, offset past x's)``: what Inductor's wrappers call, half the Python of
#: ``torch.empty_strided`` and ``torch.as_strided``
empty_strided_cpu: Callable[..., torch.Tensor] = _torch_empty
reinterpret_tensor: Callable[..., torch.Tensor] = _torch_view
try:
    from torch._C._dynamo.guards import (  # type: ignore[attr-defined]
        _empty_strided_cpu,
        _reinterpret_tensor,
    )

    empty_strided_cpu, reinterpret_tensor = _empty_strided_cpu, _reinterpret_tensor
except ImportError:  # pragma: no cover - older or trimmed torch builds
    pass


_FUNCTIONS = {
    "exp": "fexp({0})", "log": "flog({0})", "log1p": "math.log1p({0})",
    "expm1": "math.expm1({0})", "tanh": "ftanh({0})", "erf": "ferf({0})",
    "sqrt": "math.sqrt({0})", "abs": "abs({0})", "neg": "-{0}", "sin": "math.sin({0})",
    "cos": "math.cos({0})", "floor": "np.floor({0})", "ceil": "np.ceil({0})",
    "sign": "np.sign({0})", "not": "not {0}",
    "sigmoid": "ONE / (ONE + fexp(-{0}))", "silu": "{0} / (ONE + fexp(-{0}))",
    "relu": "fmax({0}, ZERO)", "rsqrt": "ONE / math.sqrt({0})", "recip": "ONE / {0}",
    "gelu": "HALF * {0} * (ONE + ferf({0} * RSQRT2))",
    "gelu_tanh": "HALF * {0} * (ONE + ftanh(SQRT2PI * ({0} + GELU_C * {0} * {0} * {0})))",
    "max": "fmax({0}, {1})", "min": "fmin({0}, {1})", "pow": "{0} ** {1}",
    "eq": "{0} == {1}", "ne": "{0} != {1}", "lt": "{0} < {1}", "le": "{0} <= {1}",
    "gt": "{0} > {1}", "ge": "{0} >= {1}", "and": "{0} and {1}", "or": "{0} or {1}",
    "floordiv": "np.floor({0} / {1})", "mod": "{0} % {1}", "where": "{1} if {0} else {2}",
    # both branches evaluated, then one chosen: a vector select, not a branch per element
    "select": "sel({0}, {1}, {2})",
}  # fmt: skip

#: float64 ops: libm and exact literals, not the float32 approximations and constants above
_FLOAT64 = {
    "exp": "math.exp({0})", "log": "math.log({0})", "erf": "math.erf({0})",
    "tanh": "math.tanh({0})", "sigmoid": "1.0 / (1.0 + math.exp(-{0}))",
    "silu": "{0} / (1.0 + math.exp(-{0}))",
    "gelu": "0.5 * {0} * (1.0 + math.erf({0} * 0.7071067811865476))",
    "gelu_tanh": "0.5 * {0} * (1.0 + math.tanh(0.7978845608028654 * ({0} + 0.044715 * {0} * {0} "
                 "* {0})))",
}  # fmt: skip

_PRELUDE = """import math
import numba
import numpy as np
from llvmlite import ir as llvm_ir
from numba.extending import intrinsic

import fusekit.stitch.codegen.noalias  # numba.njit(noalias=...)

ONE = np.float32(1.0)
ZERO = np.float32(0.0)
HALF = np.float32(0.5)
RSQRT2 = np.float32(0.7071067811865476)
SQRT2PI = np.float32(0.7978845608028654)
GELU_C = np.float32(0.044715)


@intrinsic
def as_ptr(typingctx, addr):
    # an integer address as a void pointer (for numba.carray)
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], llvm_ir.IntType(8).as_pointer())

    return numba.types.voidptr(numba.types.intp), codegen


@intrinsic
def bits_to_f32(typingctx, x):
    # reinterpret an int32 as a float32 (one LLVM bitcast, vectorisable)
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llvm_ir.FloatType())

    return numba.float32(numba.int32), codegen


@intrinsic
def u32_as_f32(typingctx, x):
    # the low 32 bits of an integer reinterpreted as a float32 (one LLVM bitcast)
    if not isinstance(x, numba.types.Integer):
        return None

    def codegen(context, builder, signature, args):
        bits = args[0]
        if x.bitwidth > 32:
            bits = builder.trunc(bits, llvm_ir.IntType(32))
        elif x.bitwidth < 32:
            bits = builder.zext(bits, llvm_ir.IntType(32))
        return builder.bitcast(bits, llvm_ir.FloatType())

    return numba.float32(x), codegen


@intrinsic
def f32_as_u32(typingctx, x):
    # a float32's bits as a uint32 (one LLVM bitcast)
    if x != numba.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llvm_ir.IntType(32))

    return numba.uint32(x), codegen


# 16-bit floats travel as their uint16 bits (numba has no float16 or bfloat16 on the CPU) and are
# computed in float32. Conversions as torch rounds: to nearest, ties to even; NaN stays NaN.
@numba.njit(inline="always")
def bf16_load(h):
    return u32_as_f32(np.int64(h) << 16)


@numba.njit(inline="always")
def bf16_bits(x):
    u = np.int64(f32_as_u32(np.float32(x)))
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return np.uint16(0x7FC0 if (u & 0x7FFFFFFF) > 0x7F800000 else r)


@numba.njit(inline="always")
def bf16_round(x):
    return bf16_load(bf16_bits(x))


@numba.njit(inline="always")
def f16_load(h):
    # exponent and mantissa shifted into place, then scaled by 2**112 (subnormals included);
    # an infinity or NaN keeps an all-ones exponent; the sign bit last
    b = np.int64(h)
    f = u32_as_f32((b & 0x7FFF) << 13) * np.float32(5.192296858534828e33)
    u = np.int64(f32_as_u32(f))
    if f >= np.float32(65536.0):
        u |= 0x7F800000
    return u32_as_f32(u | ((b & 0x8000) << 16))


@numba.njit(inline="always")
def f16_bits(x):
    u = np.int64(f32_as_u32(np.float32(x)))
    sign = u & 0x80000000
    a = u ^ sign
    if a >= 0x47800000:  # past the largest float16: infinity, or NaN
        o = 0x7E00 if a > 0x7F800000 else 0x7C00
    elif a < 0x38800000:  # a float16 subnormal (or zero): the float adder rounds it
        o = np.int64(f32_as_u32(u32_as_f32(a) + np.float32(0.5))) - 0x3F000000
    else:  # rebias the exponent, round the 13 dropped bits to nearest even
        o = (a - 0x38000000 + 0xFFF + ((a >> 13) & 1)) >> 13
    return np.uint16(o | (sign >> 16))


@numba.njit(inline="always")
def f16_round(x):
    return f16_load(f16_bits(x))


def _extremum(name, cmp):
    # floats: llvm.maximum / llvm.minimum marked nnan, i.e. one vmaxps/vminps: no select of a
    # loaded value, which the x86 backend turns into a masked store (vmaskmovps, microcoded on
    # AMD) in a vectorised column update. NaN: x86's rule, the second operand when either is NaN
    # (an update fmax(acc, v) takes a NaN v; a later one drops it). Integers: a select
    def typer(typingctx, a, b):
        ty = typingctx.unify_types(a, b)
        if not isinstance(ty, (numba.types.Float, numba.types.Integer)):
            return None

        def codegen(context, builder, signature, args):
            x = context.cast(builder, args[0], a, ty)
            y = context.cast(builder, args[1], b, ty)
            if isinstance(ty, numba.types.Float):
                lty = context.get_value_type(ty)
                fnty = llvm_ir.FunctionType(lty, [lty, lty])
                fn = builder.module.declare_intrinsic(name, [lty], fnty)
                return builder.call(fn, [x, y], fastmath=("nnan",))
            if ty.signed:
                c = builder.icmp_signed(cmp, x, y)
            else:
                c = builder.icmp_unsigned(cmp, x, y)
            return builder.select(c, x, y)

        return ty(a, b), codegen

    return intrinsic(typer)


fmax = _extremum("llvm.maximum", ">")
fmin = _extremum("llvm.minimum", "<")


@numba.njit(inline="always")
def sel(c, a, b):
    # its arguments are evaluated before the call: LLVM sees a select, which vectorises
    return a if c else b


@numba.njit(inline="always", fastmath=True)
def ftanh(x):
    e = fexp(np.float32(-2.0) * abs(x))
    return math.copysign((ONE - e) / (ONE + e), x)


""" + prelude()

#: numba math flags: reassociation (vectorised reductions) and contraction; NaN and inf kept
#: (masks use -inf).
FASTMATH = {"reassoc", "contract", "arcp", "nsz"}


#: functions spelled as a polynomial approximation (``fexp``, ``ferf``, ``ftanh``, ``flog``):
#: twenty-odd dependent vector operations per element
APPROXIMATED = frozenset({"exp", "erf", "log", "tanh", "sigmoid", "silu", "gelu", "gelu_tanh"})
#: vector iterations LLVM interleaves in the loops of a group that evaluates one of them
INTERLEAVE = 4
#: AVX2 lanes of a float32 vector
_LANES = 8


def interleave_count(graph: Graph, layout: Layout) -> int:
    """How many vector iterations LLVM's loop vectoriser interleaves in the group's loops.

    0 (its cost model) unless an op evaluates an approximated function (:data:`APPROXIMATED`;
    not a float64 op, which calls libm: :data:`_FLOAT64`) and the innermost loop runs
    at least ``2 * INTERLEAVE * 8`` iterations; then :data:`INTERLEAVE`. The cost model keeps
    one chain of ~25 dependent operations (60 cycles of latency) per loop iteration for such a
    body, and the out-of-order window of a small core (Zen 1: a 36-entry FP scheduler) overlaps
    only about two of them: the loop runs at twice its throughput bound, whether the data is in
    L1 or in DRAM. Four independent chains per iteration fill the pipes. A short row is left
    alone: its elements would all run in the scalar remainder (the vector body steps
    ``INTERLEAVE * 8`` elements).
    """
    if not layout.inner_dims:
        return 0
    if layout.extents[layout.inner_dims[-1]] < 2 * INTERLEAVE * _LANES:
        return 0
    heavy = any(
        isinstance(n, Call) and n.fn in APPROXIMATED
        for op in layout.ops
        if graph.tensor(op).dtype != "float64"
        for n in walk(layout.exprs[op])
    )
    return INTERLEAVE if heavy else 0


#: the prelude's name stem of each 16-bit float's conversions
_HALF_NAME = {"float16": "f16", "bfloat16": "bf16"}


def _narrow(value: str, dtype: str) -> str:
    """A float32 value spelled as what an array of ``dtype`` stores (16-bit floats: bits)."""
    return f"{_HALF_NAME[dtype]}_bits({value})" if dtype in HALF else value


def _const(value: float, dtype: str) -> str:
    if math.isinf(value):
        return f"np.{dtype}({'-' if value < 0 else ''}np.inf)"
    if math.isnan(value):
        return f"np.{dtype}(np.nan)"
    return f"np.{dtype}({value!r})"


def _at(arr: str, off: str) -> str:
    """``arr[off]`` with an unsigned offset (no wraparound select, so vector loads).

    numba wraps a signed index around (``i < 0: i += n``), a select per element that LLVM cannot
    remove when it cannot prove ``i >= 0`` (any offset over the chunk's rows); it then loads lane
    by lane instead of one vector load.
    """
    return f"{arr}[np.uint64({off})]"


def _widen(text: str, dtype: str) -> str:
    return f"{_HALF_NAME[dtype]}_load({text})"


def _round_to(text: str, dtype: str) -> str:
    return f"{_HALF_NAME[dtype]}_round({text})"


def _convert(text: str, dtype: str) -> str:
    """``text`` converted to ``dtype`` (numba's ``np.int64(x)`` truncates toward zero)."""
    return f"({text} != 0)" if dtype == "bool" else f"np.{dtype}({text})"


def storage_dtype(dtype: str) -> str:
    """The numpy dtype a kernel views a tensor of ``dtype`` as (16-bit floats: their bits)."""
    return "uint16" if dtype in HALF else dtype


DIALECT = Dialect(_FUNCTIONS, _const, _at, _widen, _round_to, _convert, _FLOAT64)
#: At most this many loop-invariant ``where`` conditions version the innermost loop (2**n
#: copies of it).
MAX_VERSIONED = 2
_COMBINE = {"sum": "{a} + {b}", "mean": "{a} + {b}", "prod": "{a} * {b}",
            "max": "fmax({a}, {b})", "min": "fmin({a}, {b})"}  # fmt: skip


class _Emitter:
    def __init__(
        self,
        graph: Graph,
        layout: Layout,
        given: Mapping[str, tuple[int, ...]] | None = None,
        alias: Mapping[str, str] | None = None,
    ) -> None:
        self.graph, self.layout = graph, layout
        self.r = Renderer(
            graph, layout, DIALECT, digits=digit_splits(graph, layout), given=dict(given or {})
        )
        self.lines: list[str] = []
        self.partials: list[tuple[str, int, str, str]] = []  # (name, size, op, dtype)
        #: outputs written into the memory of an input the kernel reads (output -> input): the
        #: same array, stored at the end of the element's body, after every read of it
        self.alias = dict(alias or {})
        self.deferred: list[str] | None = None
        self.row_deferred: list[str] | None = None
        self.unsafe: set[str] = set()  # aliased outputs stored elsewhere than a body's end

    def emit(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)

    def extents_of(self, op: str, vars_: tuple[str, ...]) -> int:
        ext = self.graph.extents(op)
        n = 1
        for v in vars_:
            n *= int(ext[v])
        return n

    def guard(self, op: str, dims: set[int]) -> str:
        conds = [f"{self.r.index(d)} == 0" for d in sorted(dims)]
        return " and ".join(conds)

    def store(self, depth: int, op: str, value: str, in_stage: bool = False) -> None:
        if op not in self.layout.outputs:
            return
        o = self.graph.op(op)
        covered = set(self.layout.out_dims_of(op))
        dims = set(range(len(self.layout.extents))) if in_stage else set(self.layout.par_dims)
        cond = self.guard(op, dims - covered)
        off = self.r.offset(op, op, o.out.indices)
        text = f"{_at(f'out_{op}', off)} = {_narrow(value, self.graph.tensor(op).dtype)}"
        if op in self.alias:
            later = self.deferred if in_stage else self.row_deferred
            if later is None or cond:  # not stored once per element of a body or row
                self.unsafe.add(op)
            else:
                later.append(text)
                return
        if cond:
            self.emit(depth, f"if {cond}:")
            depth += 1
        self.emit(depth, text)

    def reduces(self, op: str) -> list[Reduce]:
        return [n for n in walk(self.layout.exprs[op]) if isinstance(n, Reduce)]

    def stage(self, depth: int, k: int, ops: tuple[str, ...]) -> None:
        lay, r = self.layout, self.r
        for op in ops:
            if lay.roles[op] is Role.ROW_REDUCE:
                dtype = self.graph.tensor(op).dtype
                for j, red in enumerate(self.reduces(op)):
                    name = f"acc_{op}_{j}"
                    r.reduce_names[id(red)] = name
                    self.emit(depth, f"{name} = {r.const(identity(red.op.value), dtype)}")
        inner = depth
        # the trip count is an argument, not a literal: LLVM fully unrolls a short literal
        # loop into a chain of scalar adds instead of vectorising its reduction
        for d in lay.inner_dims[:-1]:
            self.emit(inner, f"for {r.index(d)} in range(n_{r.index(d)}):")
            inner += 1
        if not lay.inner_dims:
            self.body(inner, k, ops)
        else:
            last = lay.inner_dims[-1]
            i = r.index(last)
            if last in r.digits:  # two digits: i / c is loop-invariant, i % c contiguous
                high = lay.extents[last] // r.digits[last]
                self.emit(inner, f"for {i}_hi in range({high}):")
                inner += 1
            self.versions(inner, k, ops, self.invariant_conditions(k, ops, last), {})
        for op in ops:
            if lay.roles[op] is Role.ROW_REDUCE:
                self.finish_reduce(depth, op, (f"acc_{op}_" + "{}").format)
                self.store(depth, op, f"v_{op}")

    def invariant_conditions(self, k: int, ops: tuple[str, ...], last: int) -> list[str]:
        """The ``where`` conditions of a stage that the innermost loop does not change.

        A ``cat`` (or ``slice_scatter``) reads a piece table at the piece index; over the
        innermost loop that is one piece, so the loop is spelled once per value of each such
        condition (at most :data:`MAX_VERSIONED`) and each version loads only its piece.
        """
        r, lay = self.r, self.layout
        r.seen = []
        for op in ops:
            if lay.roles[op] is Role.FULL:
                r.expr(op, lay.exprs[op], k)
            else:
                for red in self.reduces(op):
                    r.expr(op, red.body, k)
        seen, r.seen = r.seen, None
        i = r.index(last)
        varying = re.compile(rf"\b({i}|{i}_lo|q)\b|\b(v|buf|acc|col|part)_")
        return [c for c in dict.fromkeys(seen) if not varying.search(c)][:MAX_VERSIONED]

    def versions(
        self, depth: int, k: int, ops: tuple[str, ...], conds: list[str], fixed: dict[str, bool]
    ) -> None:
        """The innermost loop under each value of ``conds`` (nested ``if``/``else``)."""
        if conds:
            self.emit(depth, f"if {conds[0]}:")
            self.versions(depth + 1, k, ops, conds[1:], {**fixed, conds[0]: True})
            self.emit(depth, "else:")
            self.versions(depth + 1, k, ops, conds[1:], {**fixed, conds[0]: False})
            return
        lay, r = self.layout, self.r
        last = lay.inner_dims[-1]
        i = r.index(last)
        if last in r.digits:
            high = lay.extents[last] // r.digits[last]
            self.emit(depth, f"for {i}_lo in range(n_{i} // {high}):")
            self.emit(depth + 1, f"{i} = {i}_hi * {r.digits[last]} + {i}_lo")
        else:
            self.emit(depth, f"for {i} in range(n_{i}):")
        r.fixed = fixed
        self.body(depth + 1, k, ops)
        r.fixed = {}

    def body(self, inner: int, k: int, ops: tuple[str, ...]) -> None:
        """One element of a stage: its full ops, reduction updates and stores."""
        lay, r = self.layout, self.r
        reads_buffer = any(
            t in lay.buffered and r.stage_of.get(t, k) < k for op in ops for t in _reads(lay, op)
        )
        if reads_buffer or any(op in lay.buffered for op in ops):
            pairs = zip(lay.inner_dims, _inner_strides(lay), strict=True)
            q = " + ".join(f"{r.index(d)} * {s}" for d, s in pairs)
            self.emit(inner, f"q = {q or '0'}")
        self.deferred = [] if self.alias else None
        self.body_ops(inner, k, ops)
        for text in self.deferred or []:  # stores into an input's memory: after its reads
            self.emit(inner, text)
        self.deferred = None

    def body_ops(self, inner: int, k: int, ops: tuple[str, ...]) -> None:
        lay, r = self.layout, self.r
        for op in ops:
            role = lay.roles[op]
            if role is Role.FULL:
                self.emit(inner, f"v_{op} = {r.value(op, k)}")
                if op in lay.buffered:
                    self.emit(inner, f"{_at(f'buf_{op}', 'q')} = v_{op}")
                self.store(inner, op, f"v_{op}", in_stage=True)
                continue
            covered = {d for d in lay.var_dims[op].values() if d is not None}
            cond = self.guard(op, set(lay.inner_dims) - covered)
            body_depth = inner
            if cond:
                self.emit(inner, f"if {cond}:")
                body_depth += 1
            for j, red in enumerate(self.reduces(op)):
                body = r.expr(op, red.body, k)
                if role is Role.ROW_REDUCE:
                    acc = f"acc_{op}_{j}"
                    self.emit(
                        body_depth, f"{acc} = " + _COMBINE[red.op.value].format(a=acc, b=body)
                    )
                else:
                    part = f"part_{op}_{j}"
                    off = r.offset(op, op, self.graph.op(op).out.indices)
                    slot = _at(f"col_{part}", off)
                    self.emit(
                        body_depth, f"{slot} = " + _COMBINE[red.op.value].format(a=slot, b=body)
                    )

    def finish_reduce(self, depth: int, op: str, acc: Callable[[int], str]) -> None:
        dtype = self.graph.tensor(op).dtype
        for j, red in enumerate(self.reduces(op)):
            name = acc(j)
            if red.op.value == "mean":
                count = self.extents_of(op, red.vars)
                name = f"({name} / {self.r.const(float(count), dtype)})"
            self.r.reduce_names[id(red)] = name
        self.emit(depth, f"v_{op} = {self.r.value(op, None)}")

    def next_row(self, depth: int) -> None:
        """Count the parallel anchor indices up by one row (innermost first, with carries)."""
        dims = list(reversed(self.layout.par_dims))
        for j, d in enumerate(dims):
            a = self.r.index(d)
            self.emit(depth, f"{a} += 1")
            if j + 1 < len(dims):
                self.emit(depth, f"if {a} == {self.layout.extents[d]}:")
                depth += 1
                self.emit(depth, f"{a} = 0")

    def kernel(self) -> tuple[str, list[str], list[str]]:
        lay, r = self.layout, self.r
        ins = [f"in_{t}" for t in lay.inputs]
        outs = [f"out_{t}" for t in lay.outputs]
        cols = [op for op in lay.ops if lay.roles[op] is Role.COL_REDUCE]
        for op in cols:
            size = math.prod(static_shape(self.graph, op))
            for j, red in enumerate(self.reduces(op)):
                self.partials.append(
                    (
                        f"part_{op}_{j}",
                        size,
                        red.op.value,
                        compute_dtype(self.graph.tensor(op).dtype),
                    )
                )
        trips = [f"n_{r.index(d)}" for d in lay.inner_dims]
        # tensors arrive as data addresses (torch's .numpy() and from_numpy cost microseconds a
        # call), with the partials' addresses, the trip counts and the chunk count, in one int64
        # array ``argv``; the kernel views them as flat arrays of their static sizes
        addrs = [f"p_{a}" for a in ins + outs]
        names = addrs + [f"p_{p[0]}" for p in self.partials] + [*trips, "n_chunks"]
        flags = "{" + ", ".join(map(repr, sorted(FASTMATH))) + "}"
        # in the source (so in its hash, the cache key) as it changes the machine code
        self.emit(0, f"# LLVM: -force-vector-interleave={interleave_count(self.graph, lay)}")
        # compiled at import for the launcher's one signature (launch.CHUNK); error_model=
        # "numpy": a float division by zero gives inf/nan (as in torch), with no exception
        # branch in the loop to stop its vectorisation
        options = f"nogil=True, cache=True, fastmath={flags}, error_model='numpy'"
        # called through their C entry points only (launch.address): no Python wrapper to
        # generate (a tenth of a kernel's compile time)
        jit = f"@numba.njit(CHUNK, {options}, no_cpython_wrapper=True)"
        self.emit(0, "CHUNK = numba.void(numba.int64, numba.int64)")
        # the rows of a chunk, a function of the arrays themselves (distinct allocations, an
        # output written in place spelled as its input): compiled with noalias (see .noalias),
        # its loops run vector code with no run-time overlap checks; chunk(c, argv) below
        # unpacks argv and calls it
        written = [a for a in ins + outs if not (a.startswith("out_") and a[4:] in self.alias)]
        arrays = [*written, *(p[0] for p in self.partials)]
        params = ", ".join(["c", "n_chunks", *trips, *arrays])
        self.emit(0, "")
        self.emit(0, "")
        rows = f"{options}, noalias=True, no_cpython_wrapper=True, no_cfunc_wrapper=True"
        self.emit(0, f"@numba.njit({rows})")
        self.emit(0, f"def rows({params}):")
        for t, source in self.alias.items():
            if f"out_{t}" in outs:
                self.emit(1, f"out_{t} = in_{source}")
        self.emit(1, f"per = ({lay.rows} + n_chunks - 1) // n_chunks")
        for op in sorted(lay.buffered):
            self.emit(
                1,
                f"buf_{op} = np.empty({lay.inner_numel}, "
                f"np.{compute_dtype(self.graph.tensor(op).dtype)})",
            )
        for name, size, red_op, dtype in self.partials:
            # a chunk-local accumulator: LLVM vectorises the row loop that updates it (it cannot
            # prove that the shared partials array does not alias the inputs)
            self.emit(1, f"col_{name} = np.empty({size}, np.{dtype})")
            self.emit(1, f"for j in range({size}):")
            self.emit(2, f"col_{name}[j] = {r.const(identity(red_op), dtype)}")
        # the anchor indices of the chunk's first row by division, then counted up per row
        # (a division per row costs as much as a short row's loads)
        single = len(lay.par_dims) == 1
        if not single:
            stride = 1
            for d in reversed(lay.par_dims):
                self.emit(1, f"{r.index(d)} = (c * per // {stride}) % {lay.extents[d]}")
                stride *= lay.extents[d]
        self.emit(1, f"for p in range(c * per, min({lay.rows}, (c + 1) * per)):")
        if single:
            self.emit(2, f"{r.index(lay.par_dims[0])} = p")
        k = 0
        self.row_deferred = [] if self.alias else None
        for step in lay.steps:
            if isinstance(step, RowStep):
                self.emit(2, f"v_{step.op} = {r.value(step.op, None)}")
                self.store(2, step.op, f"v_{step.op}")
            else:
                self.stage(2, k, step.ops)
                k += 1
        for text in self.row_deferred or []:  # stores into an input's memory: after its reads
            self.emit(2, text)
        self.row_deferred = None
        if not any(isinstance(s, Stage) and s.ops for s in lay.steps) and not lay.steps:
            self.emit(2, "pass")
        if len(lay.par_dims) > 1:
            self.next_row(2)
        for name, size, _, _ in self.partials:
            self.emit(1, f"for j in range({size}):")
            self.emit(2, f"{name}[c * {size} + j] = col_{name}[j]")
        self.emit(0, "")
        self.emit(0, "")
        self.emit(0, jit)
        self.emit(0, "def chunk(c, argv):")
        self.arguments(names, written)
        self.emit(1, f"rows({params})")
        # after every chunk: the column reductions' partials combined (phase 2)
        self.emit(0, "")
        self.emit(0, "")
        self.emit(0, jit)
        self.emit(0, "def finish(c, argv):")
        if not cols:
            self.emit(1, "pass")
        else:
            self.arguments(names, [f"out_{op}" for op in cols])
        for op in cols:
            size = math.prod(static_shape(self.graph, op))
            self.emit(1, f"for k in range({size}):")
            for j, red in enumerate(self.reduces(op)):
                part = f"part_{op}_{j}"
                self.emit(2, f"t{j} = {part}[k]")
                self.emit(2, "for c in range(1, n_chunks):")
                self.emit(
                    3,
                    f"t{j} = "
                    + _COMBINE[red.op.value].format(a=f"t{j}", b=f"{part}[c * {size} + k]"),
                )
            self.finish_reduce(2, op, lambda j: f"t{j}")
            self.emit(2, f"out_{op}[k] = {_narrow(f'v_{op}', self.graph.tensor(op).dtype)}")
        return _PRELUDE + "\n\n" + "\n".join(self.lines) + "\n", ins, outs

    def arguments(self, names: list[str], arrays: list[str]) -> None:
        """Unpack ``argv`` (in the order of ``names``) at the top of a function.

        The trip counts and the chunk count as scalars; the ``arrays`` (tensors by data
        address) and every partial viewed as flat arrays of their sizes.
        """
        lay = self.layout
        self.emit(1, f"args = numba.carray(as_ptr(argv), {len(names)}, np.int64)")
        for i, name in enumerate(names):
            if not name.startswith("p_"):
                self.emit(1, f"{name} = args[{i}]")
        tensors = dict(zip([f"in_{t}" for t in lay.inputs] + [f"out_{t}" for t in lay.outputs],
                           (*lay.inputs, *lay.outputs), strict=True))  # fmt: skip
        for a in arrays:
            t = tensors[a]
            if a.startswith("out_") and t in self.alias:  # the input's array itself
                self.emit(1, f"{a} = in_{self.alias[t]}")
                continue
            size = math.prod(static_shape(self.graph, t))
            if t in self.r.given:  # the elements a strided input spans
                shape = static_shape(self.graph, t)
                size = 1 + sum((n - 1) * st for n, st in zip(shape, self.r.given[t], strict=True))
            dtype = storage_dtype(self.graph.tensor(t).dtype)
            self.emit(1, f"{a} = numba.carray(as_ptr(args[{names.index('p_' + a)}]), {size}, "
                         f"np.{dtype})")  # fmt: skip
        for name, size, _, dtype in self.partials:
            i = names.index(f"p_{name}")
            self.emit(1, f"{name} = numba.carray(as_ptr(args[{i}]), n_chunks * {size}, "
                         f"np.{dtype})")  # fmt: skip


def _reads(lay: Layout, op: str) -> list[str]:
    """The tensors ``op``'s value reads, through the group's ops it recomputes.

    A group op that is not buffered is spelled again where it is read (``Renderer.read``), so
    what it reads is read there too: a row buffer among them needs the stage's ``q``.
    """
    out: list[str] = []
    stack, seen = [op], {op}
    while stack:
        for n in walk(lay.exprs[stack.pop()]):
            if isinstance(n, Access):
                out.append(n.tensor)
                t = n.tensor
                if recomputed(lay, t) and t not in seen:
                    seen.add(t)
                    stack.append(t)
    return out


def _inner_strides(lay: Layout) -> list[int]:
    out, acc = [], 1
    for d in reversed(lay.inner_dims):
        out.append(acc)
        acc *= lay.extents[d]
    return out[::-1]


def generate_cpu(graph: Graph, layout: Layout) -> str:
    """The numba source of the group's kernel (a module defining ``kernel``)."""
    return _Emitter(graph, layout).kernel()[0]


#: groups that move at most this many bytes run serially: waking the sleeping OpenMP pool and
#: joining it costs about as long as streaming them
SERIAL_MAX_BYTES = 256 * 1024


def compile_source(source: str, interleave: int = 0) -> tuple[int, int]:
    """Load a generated module (compiling its ``chunk`` and ``finish``): their C addresses.

    Memoised by source hash (the module, so the compiled code, stays loaded); numba's cache on
    disk spares the compilation on a later run. ``interleave``: LLVM's
    ``-force-vector-interleave`` during the compilation. The first call also loads the
    launchers (:mod:`.launch`) that run them.
    """
    global _launch, _launch_serial, _threads
    from fusekit.stitch.codegen import launch

    _launch, _launch_serial, _threads = launch.launch, launch.launch_serial, launch.threads
    module = compile_module(source, interleave)
    return launch.address(module.chunk), launch.address(module.finish)


#: :func:`.launch.launch` and :func:`.launch.launch_serial`, bound by :func:`compile_source`
_launch: Callable[..., None] | None = None
_launch_serial: Callable[..., None] | None = None
#: numba's thread count (:func:`.launch.threads`), bound with them
_threads: Callable[[], int] = numba.get_num_threads


#: stride signatures of its inputs one kernel compiles a variant for; inputs of further ones are
#: copied to contiguous memory (each variant costs a numba compilation)
MAX_VARIANTS = 4


@dataclass
class _Variant:
    """The kernel compiled for one stride signature of its inputs."""

    source: str
    code: str  # ``source`` with canonical names (render.canonical): what is compiled
    views: dict[str, tuple[int, tuple[int, ...], tuple[int, tuple[int, ...]]]]
    outs: list[tuple[str, tuple[int, ...], tuple[int, ...], torch.dtype]]  # name, shape, strides
    part_specs: list[tuple[int, np.dtype[Any]]]
    fn: tuple[int, int] | None = None  # addresses of chunk and finish


class CpuKernel:
    """A compiled group: call it with the group's input tensors, get its outputs.

    The kernel reads each input with the strides it has: a transposed or sliced input (the
    gradients of attention, a rotary embedding's halves) is not copied first. The source for
    contiguous inputs is :attr:`source`; another stride signature compiles a variant at its
    first call (at most :data:`MAX_VARIANTS`).

    Args:
        graph: the planned graph.
        layout: the group's :class:`Layout`.
        serial: run the serial variant (no thread pool); by default when the group moves at
            most :data:`SERIAL_MAX_BYTES` or has one row.
    """

    def __init__(self, graph: Graph, layout: Layout, serial: bool | None = None) -> None:
        self.graph, self.layout = graph, layout
        shapes = {t: static_shape(graph, t) for t in (*layout.inputs, *layout.outputs)}
        moved = sum(
            math.prod(shapes[t]) * getattr(torch, graph.tensor(t).dtype).itemsize
            for t in (*layout.inputs, *layout.outputs)
        )
        self.serial = moved <= SERIAL_MAX_BYTES or layout.rows == 1 if serial is None else serial
        # what a call needs, precomputed: a call costs microseconds of Python around the kernel
        self._rows = layout.rows
        self._ins = [(t, getattr(torch, graph.tensor(t).dtype)) for t in layout.inputs]
        self.interleave = interleave_count(graph, layout)
        self._trips = [layout.extents[d] for d in layout.inner_dims]
        self._contiguous = tuple(tuple(strides(shapes[t])) for t in layout.inputs)
        self._variants: dict[tuple[tuple[int, ...], ...], _Variant] = {}
        default = self._default = self._variant(self._contiguous)
        self.source, self._views, self._outs = default.source, default.views, default.outs
        self.code = default.code
        #: outputs written into inputs' memory (:meth:`write_into`), and the variant doing so
        self.into: dict[str, str] = {}
        self._inplace: _Variant | None = None

    def write_into(self, pairs: Mapping[str, str]) -> dict[str, str]:
        """Write outputs into the memory of graph inputs: ``{output: input}``; those accepted.

        For an input the caller updates in place with the output (an optimizer's parameters
        and moments, AOTAutograd's ``copy_`` of a mutated input): the kernel writes it where it
        is, instead of a new tensor copied over after. The caller guarantees that nothing
        reads the input after this kernel. An output is accepted when it is written whole,
        contiguous, of the input's shape and dtype, and either the kernel does not read that
        input, or it is an elementwise group (:func:`_elementwise`) that reads the input only
        at the element it writes: stored at the end of the element's body (or row), after
        every read. Inputs of the planned strides only; other calls write a new
        tensor.
        """
        graph, layout = self.graph, self.layout
        accepted = {
            o: t for o, t in pairs.items()
            if o in self._outs_names() and t in graph.inputs and list(pairs.values()).count(t) == 1
            and graph.tensor(o).shape == graph.tensor(t).shape
            and graph.tensor(o).dtype == graph.tensor(t).dtype
        }  # fmt: skip
        read = {o: t for o, t in accepted.items() if t in layout.inputs}
        if read and not _elementwise(layout):
            accepted = {o: t for o, t in accepted.items() if o not in read}
            read = {}
        while read:  # drop the outputs the kernel cannot write in place, spell the rest
            emitter = _Emitter(graph, self._written_layout(self._views), alias=read)
            source, _, _ = emitter.kernel()
            bad = emitter.unsafe | _misread(source, read)
            if not bad:
                names = (*layout.inputs, *layout.outputs, *layout.ops)
                self._inplace = dataclasses.replace(
                    self._default, source=source, code=canonical(source, names), fn=None
                )
                break
            accepted = {o: t for o, t in accepted.items() if o not in bad}
            read = {o: t for o, t in read.items() if o not in bad}
        self.into = accepted
        return dict(accepted)

    def _writable(
        self, into: Mapping[str, str], values: Mapping[str, torch.Tensor], ins: list[torch.Tensor]
    ) -> bool:
        """Whether every output of ``into`` can be written into its input as given.

        The input must have the output's planned shape, dtype and strides, and one the kernel
        reads must be passed as itself (not a contiguous copy).
        """
        given = dict(zip(self.layout.inputs, ins, strict=True))
        for t, shape, step, dtype in self._outs:
            if t in into:
                x = values[into[t]]
                if not _fits(x, shape, step, dtype) or given.get(into[t], x) is not x:
                    return False
        return True

    def _outs_names(self) -> set[str]:
        return {t for t, *_ in self._outs}

    def _written_layout(self, views: Mapping[str, Any]) -> Layout:
        """The layout less the outputs returned as views of inputs (not written)."""
        if not views:
            return self.layout
        outs = tuple(t for t in self.layout.outputs if t not in views)
        return dataclasses.replace(self.layout, outputs=outs)

    @property
    def codes(self) -> list[str]:
        """Every variant's code generated so far (what :func:`.compiling.precompile` takes)."""
        extra = [self._inplace] if self._inplace is not None else []
        return [v.code for v in (*self._variants.values(), *extra)]

    def _variant(self, key: tuple[tuple[int, ...], ...]) -> _Variant:
        """The kernel for inputs of strides ``key`` (generated, not yet compiled)."""
        hit = self._variants.get(key)
        if hit is not None:
            return hit
        graph, layout = self.graph, self.layout
        given = dict(zip(layout.inputs, key, strict=True))
        views = input_views(graph, layout, given)
        layout = self._written_layout(views)  # views of inputs it reads are not written
        plain = dict(zip(layout.inputs, self._contiguous, strict=True))
        emitter = _Emitter(graph, layout, {t: s for t, s in given.items() if s != plain[t]})
        source, _, _ = emitter.kernel()
        outs = [
            (t, shape, tuple(strides(shape)), getattr(torch, graph.tensor(t).dtype))
            for t in layout.outputs
            for shape in [static_shape(graph, t)]
        ]
        parts = [(size, np.dtype(dtype)) for _, size, _, dtype in emitter.partials]
        names = (*layout.inputs, *layout.outputs, *layout.ops)
        variant = _Variant(source, canonical(source, names), views, outs, parts)
        self._variants[key] = variant
        return variant

    def expect(self, strides: Mapping[str, tuple[int, ...]]) -> str | None:
        """The code of the variant for inputs of these ``strides`` when it is not the default.

        Generated now, so that it compiles ahead with the others (:func:`.compiling.precompile`)
        rather than at the first call that meets such inputs; ``None`` when the expected strides
        are the contiguous ones, unknown, or not read in place (copied then).
        """
        pairs = zip(self.layout.inputs, self._contiguous, strict=True)
        key = tuple(strides.get(t, plain) for t, plain in pairs)
        variant = None if key == self._contiguous else self._variant_for(key)
        return None if variant is None else variant.code

    def _variant_for(self, key: tuple[tuple[int, ...], ...]) -> _Variant | None:
        """The variant for inputs of strides ``key``, or ``None`` (such inputs are copied).

        Made before, or generated now when there is room for one more (:data:`MAX_VARIANTS`)
        and each input is read in place (:func:`_readable_strides`).
        """
        variant = self._variants.get(key)
        if variant is not None:
            return variant
        shapes = [static_shape(self.graph, t) for t in self.layout.inputs]
        if len(self._variants) >= MAX_VARIANTS or not all(
            _readable_strides(n, st) for n, st in zip(shapes, key, strict=True)
        ):
            return None
        return self._variant(key)

    def compiled_variant(self, key: tuple[tuple[int, ...], ...]) -> _Variant | None:
        """The compiled variant a call on inputs of strides ``key`` runs.

        As :meth:`__call__` picks it; ``None`` where such a call copies its inputs first or
        writes in place.
        """
        variant = None if self.into else self._variant_for(key)
        if variant is None:
            return None
        if variant.fn is None:
            variant.fn = compile_source(variant.code, self.interleave)
        return variant

    def chunks(self) -> int:
        """The chunks a call splits the rows into: one per thread of numba's pool."""
        return 1 if self.serial else max(1, min(self._rows, _threads()))

    def __call__(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Run the kernel on ``values`` (every input of the group) and return its outputs."""
        ins = [_checked_cpu(values[t], t, dtype) for t, dtype in self._ins]
        key = tuple(x.stride() for x in ins)
        variant = self._variant_for(key)
        if variant is None:  # copies in contiguous memory
            ins = [x.contiguous() for x in ins]
            variant = self._default
        into = self.into if self.into and variant is self._default else {}
        if into and not self._writable(into, values, ins):
            into = {}
        if into and self._inplace is not None:
            variant = self._inplace
        if variant.fn is None:  # numba compiles (or loads its cache) at the first call
            variant.fn = compile_source(variant.code, self.interleave)
        chunk, finish = variant.fn
        # the kernel takes data addresses; outputs allocated by torch in their shapes (the
        # tensors outlive the call), or the inputs written in place
        out = {
            t: values[into[t]] if t in into else empty_strided_cpu(shape, step, dtype)
            for t, shape, step, dtype in variant.outs
        }
        chunks = self.chunks()
        parts = [np.empty(chunks * size, dtype) for size, dtype in variant.part_specs]
        argv = np.array(
            [*(x.data_ptr() for x in ins), *(o.data_ptr() for o in out.values()),
             *(p.ctypes.data for p in parts), *self._trips, chunks],
            dtype=np.int64,
        )  # fmt: skip
        run = _launch_serial if self.serial else _launch
        run(chunk, finish, argv, chunks)  # type: ignore[misc]
        for t, (k, shape, (base, step)) in variant.views.items():
            x = ins[k]
            out[t] = torch.as_strided(x, shape, step, x.storage_offset() + base)
        return out


def _fits(x: torch.Tensor, shape: tuple[int, ...], step: tuple[int, ...], dtype: Any) -> bool:
    """Whether the kernel can write an output of this shape, strides and dtype into ``x``."""
    return x.is_cpu and x.dtype is dtype and tuple(x.shape) == shape and x.stride() == step


def _elementwise(layout: Layout) -> bool:
    """Row ops and at most one stage of full ops: no reductions, no row buffers.

    Each element of such a group is computed in one iteration (a full op's of its stage's
    innermost loop, a row op's of its row) from values of the same element or its row.
    """
    stages = [s for s in layout.steps if isinstance(s, Stage)]
    return (
        len(stages) <= 1
        and not layout.buffered
        and all(role in (Role.FULL, Role.ROW) for role in layout.roles.values())
    )


def _misread(source: str, alias: Mapping[str, str]) -> set[str]:
    """The aliased outputs whose input ``source`` reads elsewhere than at the element written.

    The emitter spells an array's element as ``arr[np.uint64(offset)]``; in an elementwise
    group each output element is stored from the values of its own iteration, after them. A
    read of the input at any other offset (a shifted or transposed read, a gather) could see
    an element already overwritten.
    """
    bad = set()
    for out, t in alias.items():
        stores = set(re.findall(rf"\bout_{re.escape(out)}(\[[^\]\n]*\])", source))
        reads = set(re.findall(rf"\bin_{re.escape(t)}(\[[^\]\n]*\])", source))
        if len(stores) != 1 or not reads <= stores:
            bad.add(out)
    return bad


def _readable_strides(shape: tuple[int, ...], step: tuple[int, ...]) -> bool:
    """Whether a kernel reads an input of ``shape`` and strides ``step`` in place.

    Rows contiguous, non-negative strides, not empty.
    A transpose of leading dims (attention's gradients) or a slice of the last one keeps each
    row contiguous, and the vector loop streams it; an input whose last dim is strided (a
    transpose of the last two) would be gathered element by element, slower than torch's
    blocked copy followed by a contiguous kernel.
    """
    if len(step) != len(shape) or math.prod(shape) == 0 or min(step, default=0) < 0:
        return False
    plain = tuple(strides(shape))
    return not (shape and shape[-1] > 1 and step[-1] != 1 and step != plain)


def input_views(
    graph: Graph, layout: Layout, given: Mapping[str, tuple[int, ...]] | None = None
) -> dict[str, tuple[int, tuple[int, ...], tuple[int, tuple[int, ...]]]]:
    """Outputs of a group that are strided views of one of its inputs.

    A returned reshape of an input (a SwiGLU's ``view`` of a GEMM output, saved for the
    backward) would be written by the kernel as a copy of what it reads; it is returned as a
    view of the input instead, as eager returns one. ``given``: the inputs' strides (default
    contiguous). ``{output: (input index, shape, (offset from the input's, strides))}``.
    """
    out = {}
    for t in layout.outputs:
        expr = layout.exprs.get(t)
        if not graph.moves_only(t) or not isinstance(expr, Access) or expr.tensor in layout.exprs:
            continue
        out_vars = plain_vars(graph.op(t).out)
        shape = static_shape(graph, t)
        if out_vars is None or expr.tensor not in layout.inputs:
            continue
        src = (given or {}).get(expr.tensor) or tuple(strides(static_shape(graph, expr.tensor)))
        fit = fit_strides(expr, out_vars, shape, src)
        if fit is not None:
            out[t] = (layout.inputs.index(expr.tensor), shape, fit)
    return out


def _checked_cpu(t: torch.Tensor, name: str, dtype: torch.dtype) -> torch.Tensor:
    """``t`` when it is a CPU tensor of ``dtype`` (the kernel reads its memory).

    Raises:
        ValueError: for a tensor off the CPU or of another dtype than planned.
    """
    if not t.is_cpu or t.dtype is not dtype:
        got = f"{str(t.dtype).removeprefix('torch.')} on {t.device}"
        want = str(dtype).removeprefix("torch.")
        raise ValueError(expected("stitch", name, f"a {want} CPU tensor", got))
    return t
