"""Triton backend: one generated Triton kernel per fusion group (a second one for column sums).

A program owns a tile of ``ROWS`` rows (the parallel anchor dims) by ``BLOCK_Q`` columns (the
inner dims, flattened); every value is a ``[ROWS, 1]`` (per row), ``[1, BLOCK_Q]`` (per column)
or ``[ROWS, BLOCK_Q]`` block, so that reductions are ``tl.sum/max(..., axis)`` with kept dims::

    for r0 in range(pid * ROWS, n_rows, n_programs * ROWS):    # grid-stride over row tiles
        p = r0 + arange(ROWS)[:, None];  q = arange(BLOCK_Q)[None, :]
        stage 1: v_Y = f(load(X[p, q]));  acc_R = tl.sum(where(mask, g(v_Y), 0), axis=1)
        row ops on [ROWS, 1];  stage 2: ...                      # local / regional
        cacc_G = cacc_G + tl.sum(where(mask, h(v_Y), 0), axis=0) # global, phase 1
    store(part_G[pid, q], cacc_G)
    combine kernel: out_G[k] = finish(sum_pid part_G[pid, k])   # global, phase 2

The stitching schemes, as FusionStitching names them:

- **local**: one stage, the row tile in registers;
- **regional**: several stages; a row of at most ``MAX_BLOCK_Q`` elements stays in registers
  between stages (the values a later stage reads are live block variables); a longer row is
  swept in column blocks per stage and a value of an earlier stage is recomputed from its
  inputs (re-read from L2 within the program). There, a row sum of ``exp(B - max B)`` is
  swept with its max (the online max/sum rewrite, :func:`~fusekit.stitch.schemes.
  online_softmax`): a softmax or logsumexp reads its row twice instead of three times::

      for q0 in range(0, Q, BLOCK_Q):                   # stage 1: max and sum together
          new = tl.maximum(acc_M, tl.max(B, axis=1))
          v_M = tl.where(new == -inf, 0.0, new)         # an all -inf prefix adds exp(-inf) = 0
          acc_S = acc_S * tl.exp(acc_M - v_M) + tl.sum(tl.exp(B - v_M), axis=1)
          acc_M = new
      for q0 in range(0, Q, BLOCK_Q): ...               # stage 2: exp(B - M) / S

  (a row of -inf only: the sum is 0, not NaN);
- **global**: column reductions through per-program partials in global memory and a second
  kernel (two phases; no grid barrier); rows of at most ``MAX_BLOCK_Q`` elements.

The reference of every group is the IR interpreter (``runner.reference_group``); the tests run
the kernels under ``TRITON_INTERPRET=1`` on small shapes and compare.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from fusekit.errors import expected
from fusekit.ir.expr import Access, Call, IBin, IndexTerm, IVar, Reduce, walk
from fusekit.ir.graph import Graph
from fusekit.stitch.codegen.render import (
    HALF,
    Dialect,
    Renderer,
    canonical,
    identity,
    load_generated,
)
from fusekit.stitch.codegen.render import static_shape as _shape
from fusekit.stitch.schemes import Layout, Role, RowStep, Unfusable, online_softmax

#: Longest row kept whole in registers (elements); longer rows are swept in column blocks.
MAX_BLOCK_Q = 8192
#: Elements of one program's tile (rows x columns) when rows are short.
TILE = 4096


def _pow(x: str, y: str) -> str:
    return (
        f"tl.where({x} == 0.0, tl.where({y} == 0.0, 1.0, tl.where({y} > 0.0, 0.0, "
        f"float('inf'))), tl.where({x} < 0.0, tl.where(tl.floor({y}) != {y}, float('nan'), "
        f"tl.exp({y} * tl.log(-{x})) * tl.where({y} - 2.0 * tl.floor({y} * 0.5) == 1.0, -1.0, "
        f"1.0)), tl.exp({y} * tl.log({x}))))"
    )


_FUNCTIONS = {
    "exp": "tl.exp({0})", "log": "tl.log({0})", "log1p": "tl.log(1.0 + {0})",
    "expm1": "(tl.exp({0}) - 1.0)", "tanh": "(2.0 * tl.sigmoid(2.0 * {0}) - 1.0)",
    "erf": "tl.math.erf({0})", "sqrt": "tl.sqrt({0})", "abs": "tl.abs({0})", "neg": "-{0}",
    "sin": "tl.sin({0})", "cos": "tl.cos({0})", "floor": "tl.floor({0})", "ceil": "tl.ceil({0})",
    "sign": "tl.where({0} > 0, 1.0, tl.where({0} < 0, -1.0, 0.0))", "not": "~({0})",
    "sigmoid": "tl.sigmoid({0})", "silu": "{0} * tl.sigmoid({0})", "relu": "tl.maximum({0}, 0.0)",
    "rsqrt": "tl.rsqrt({0})", "recip": "1.0 / {0}",
    "gelu": "0.5 * {0} * (1.0 + tl.math.erf({0} * 0.7071067811865476))",
    "gelu_tanh": "0.5 * {0} * (2.0 * tl.sigmoid(1.5957691216057308 * ({0} + 0.044715 * {0} * {0}"
                 " * {0})))",
    "max": "tl.maximum({0}, {1})", "min": "tl.minimum({0}, {1})",
    "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})", "le": "({0} <= {1})",
    "gt": "({0} > {1})", "ge": "({0} >= {1})", "and": "({0} & {1})", "or": "({0} | {1})",
    "floordiv": "tl.floor({0} / {1})", "mod": "({0} - {1} * tl.floor({0} / {1}))",
    "where": "tl.where({0}, {1}, {2})",
    # x ** y as exp(y log|x|), signed for a negative x and an odd integer y, NaN for a negative
    # x and a fractional y, and the limits at x = 0 (libdevice's pow has no interpreter form);
    # y is broadcast to x's shape first, so that a constant exponent is a tensor too
    "pow": _pow("{0}", "tl.where({0} == {0}, {1}, {1})"),
}  # fmt: skip
_COMBINE = {"sum": "{a} + {b}", "mean": "{a} + {b}", "max": "tl.maximum({a}, {b})",
            "min": "tl.minimum({a}, {b})"}  # fmt: skip
_REDUCE = {"sum": "tl.sum", "mean": "tl.sum", "max": "tl.max", "min": "tl.min"}


def _const(value: float, dtype: str) -> str:
    if math.isinf(value):
        return f'{"-" if value < 0 else ""}float("inf")'
    return 'float("nan")' if math.isnan(value) else repr(float(value))


#: Triton's spelling of each 16-bit float
_TL_HALF = {"float16": "tl.float16", "bfloat16": "tl.bfloat16"}
DIALECT = Dialect(
    _FUNCTIONS,
    _const,
    lambda arr, off: f"{arr}[{off}]",
    lambda text, dtype: f"{text}.to(tl.float32)",
    lambda text, dtype: f"({text}).to({_TL_HALF[dtype]}).to(tl.float32)",
    lambda text, dtype: f"({text} != 0)" if dtype == "bool" else f"({text}).to(tl.{dtype})",
)


def _vars(t: IndexTerm) -> list[str]:
    if isinstance(t, IVar):
        return [t.name]
    if isinstance(t, IBin):
        return _vars(t.left) + _vars(t.right)
    return []


class _TritonRenderer(Renderer):
    """Spells reads as masked loads; earlier-stage values as live blocks or recomputed."""

    registers: bool = True
    loads: dict[str, str]

    def read(self, op: str, acc: Access, reader_stage: int | None) -> str:
        name = acc.tensor
        role = self.layout.roles.get(name)
        if role is None:
            off = self.offset(op, name, acc.indices)
            dims = {self.layout.var_dims[op].get(v) for t in acc.indices for v in _vars(t)}
            par = bool(dims & set(self.layout.par_dims))
            inner = bool(dims & set(self.layout.inner_dims))
            mask = {(True, True): "m", (True, False): "rmask", (False, True): "cmask"}.get(
                (par, inner)
            )
            masked = f", mask={mask}, other=0.0" if mask else ""
            text = f"tl.load(in_{name} + ({off}){masked})"
            dtype = self.graph.tensor(name).dtype
            return self.dialect.widen(text, dtype) if dtype in HALF else text
        if role in (Role.ROW, Role.ROW_REDUCE) or self.registers:
            return f"v_{name}"
        if reader_stage is not None and self.stage_of.get(name) == reader_stage:
            return f"v_{name}"
        # recompute; what it reads of the reader's own stage is live there (emitted before)
        return "(" + self.value(name, reader_stage) + ")"


class _Emitter:
    def __init__(self, graph: Graph, layout: Layout) -> None:
        q = layout.inner_numel
        self.registers = q <= MAX_BLOCK_Q
        if not self.registers:
            layout = online_softmax(layout)
        self.graph, self.layout = graph, layout
        self.block_q = min(MAX_BLOCK_Q, 1 << max(q - 1, 0).bit_length())
        self.rows = max(1, min(TILE // self.block_q, 1 << max(layout.rows - 1, 0).bit_length()))
        self.r = _TritonRenderer(graph, layout, DIALECT)
        self.r.registers = self.registers
        self.lines: list[str] = []
        self.cols = [op for op in layout.ops if layout.roles[op] is Role.COL_REDUCE]
        self._check()

    def _check(self) -> None:
        lay = self.layout
        for op in lay.ops:
            for n in walk(lay.exprs[op]):
                if isinstance(n, Call) and n.fn not in _FUNCTIONS:
                    raise Unfusable(f"function {n.fn} has no Triton spelling")
                if isinstance(n, Reduce) and n.op.value not in _REDUCE:
                    raise Unfusable(f"{n.op.value} reductions")
            if lay.roles[op] is Role.COL_REDUCE:
                if not self.registers:
                    raise Unfusable("column reductions over rows longer than a block")
                inner = set(lay.inner_dims)
                if any(lay.var_dims[op][v] in inner for r in self.reduces(op) for v in r.vars):
                    raise Unfusable(f"{op} also reduces inner dims")

    def emit(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)

    def reduces(self, op: str) -> list[Reduce]:
        return [n for n in walk(self.layout.exprs[op]) if isinstance(n, Reduce)]

    def guard(self, dims: set[int]) -> str:
        return "".join(f" & ({self.r.index(d)} == 0)" for d in sorted(dims))

    def count(self, op: str, red: Reduce) -> int:
        ext = self.graph.extents(op)
        return math.prod(int(ext[v]) for v in red.vars)

    def finish(self, depth: int, op: str, names: list[str]) -> None:
        for red, name in zip(self.reduces(op), names, strict=True):
            count = self.count(op, red)
            self.r.reduce_names[id(red)] = (
                f"({name} / {count}.0)" if red.op.value == "mean" else name
            )
        self.emit(depth, f"v_{op} = {self.r.value(op, None)}")

    def store(self, depth: int, op: str, full: bool) -> None:
        lay = self.layout
        if op not in lay.outputs:
            return
        covered = set(lay.out_dims_of(op))
        dims = set(range(len(lay.extents))) if full else set(lay.par_dims)
        off = self.r.offset(op, op, self.graph.op(op).out.indices)
        mask, shape = ("m", "ZT") if full else ("rmask", "ZR")
        cond = mask + self.guard(dims - covered)
        self.emit(depth, f"tl.store(out_{op} + ({off}) + {shape}, v_{op} + {shape}, mask={cond})")

    def columns(self, depth: int, q0: str) -> None:
        lay, r = self.layout, self.r
        self.emit(depth, f"q = {q0} + tl.arange(0, BLOCK_Q)[None, :]")
        self.emit(depth, f"cmask = q < {lay.inner_numel}")
        self.emit(depth, "m = rmask & cmask")
        stride = 1
        for d in reversed(lay.inner_dims):
            self.emit(depth, f"{r.index(d)} = (q // {stride}) % {lay.extents[d]}")
            stride *= lay.extents[d]

    def stage(self, depth: int, k: int, ops: tuple[str, ...]) -> None:
        lay, r = self.layout, self.r
        rows = [op for op in ops if lay.roles[op] is Role.ROW_REDUCE]
        if not self.registers:
            for op in rows:
                for j, red in enumerate(self.reduces(op)):
                    dtype = self.graph.tensor(op).dtype
                    init = r.const(identity(red.op.value), dtype)
                    self.emit(depth, f"acc_{op}_{j} = tl.full([ROWS, 1], {init}, tl.float32)")
            self.emit(depth, f"for q0 in range(0, {lay.inner_numel}, BLOCK_Q):")
            depth += 1
            self.columns(depth, "q0")
        for op in ops:
            role = lay.roles[op]
            if role is Role.FULL:
                self.emit(depth, f"v_{op} = {r.value(op, k)}")
                self.store(depth, op, full=True)
                continue
            if op in lay.online:
                continue  # swept with its max (online_step)
            axis = 1 if role is Role.ROW_REDUCE else 0
            for j, red in enumerate(self.reduces(op)):
                ident = r.const(identity(red.op.value), self.graph.tensor(op).dtype)
                body = f"tl.where({self.mask(op)}, {r.expr(op, red.body, k)}, {ident})"
                part = f"{_REDUCE[red.op.value]}({body}, axis={axis}, keep_dims=True)"
                acc = f"acc_{op}_{j}" if role is Role.ROW_REDUCE else f"cacc_{op}_{j}"
                if role is Role.ROW_REDUCE and self.registers:
                    self.emit(depth, f"{acc} = {part}")
                elif op in lay.online.values():
                    self.online_step(depth, k, op, part)
                else:
                    self.emit(depth, f"{acc} = " + _COMBINE[red.op.value].format(a=acc, b=part))
        depth -= 0 if self.registers else 1
        for op in rows:
            self.finish(depth, op, [f"acc_{op}_{j}" for j in range(len(self.reduces(op)))])
            self.store(depth, op, full=False)

    def mask(self, op: str) -> str:
        """Where a reduction of ``op`` reads: the tile, on the inner dims its output spans."""
        covered = {d for d in self.layout.var_dims[op].values() if d is not None}
        return "m" + self.guard(set(self.layout.inner_dims) - covered)

    def online_step(self, depth: int, k: int, top: str, part: str) -> None:
        """One column block of row max ``top`` and the sums swept with it (online max/sum).

        ``part`` is the block's max. The sums' bodies read ``v_<top>``, here the running max
        (0 while it is -inf: a block of -inf adds ``exp(-inf) = 0``); the previous sums are
        rescaled by ``exp(old - new)``. ``finish`` sets ``v_<top>`` to the row's max after.
        """
        lay, r = self.layout, self.r
        acc = f"acc_{top}_0"
        self.emit(depth, f"new_{top} = tl.maximum({acc}, {part})")
        self.emit(depth, f'v_{top} = tl.where(new_{top} == float("-inf"), 0.0, new_{top})')
        for op in lay.online:
            if lay.online[op] != top:
                continue
            red = self.reduces(op)[0]
            body = f"tl.where({self.mask(op)}, {r.expr(op, red.body, k)}, 0.0)"
            self.emit(depth, f"acc_{op}_0 = acc_{op}_0 * tl.exp({acc} - v_{top}) + "
                             f"tl.sum({body}, axis=1, keep_dims=True)")  # fmt: skip
        self.emit(depth, f"{acc} = new_{top}")

    def kernel(self) -> str:
        lay, r = self.layout, self.r
        ins = [f"in_{t}" for t in lay.inputs]
        outs = [f"out_{t}" for t in lay.outputs]
        parts = [f"part_{op}_{j}" for op in self.cols for j in range(len(self.reduces(op)))]
        self.emit(0, "@triton.jit")
        self.emit(0, "def kernel(")
        self.emit(1, f"{', '.join(ins + outs + parts)},  # pointers: inputs, outputs, partials")
        self.emit(1, "n_programs,  # sizes")
        self.emit(1, "ROWS: tl.constexpr, BLOCK_Q: tl.constexpr,")
        self.emit(0, "):")
        self.emit(1, "pid = tl.program_id(0)")
        self.emit(1, "rr = tl.arange(0, ROWS)[:, None]")
        self.emit(1, "ZR = tl.zeros([ROWS, 1], tl.int32)")
        self.emit(1, "ZT = tl.zeros([ROWS, BLOCK_Q], tl.int32)")
        if self.registers:
            self.emit(1, "rmask = rr < ROWS")
            self.columns(1, "0")
        for op in self.cols:
            for j, red in enumerate(self.reduces(op)):
                init = r.const(identity(red.op.value), self.graph.tensor(op).dtype)
                self.emit(1, f"cacc_{op}_{j} = tl.full([1, BLOCK_Q], {init}, tl.float32)")
        self.emit(1, f"for r0 in range(pid * ROWS, {lay.rows}, n_programs * ROWS):")
        self.emit(2, "p = r0 + rr")
        self.emit(2, f"rmask = p < {lay.rows}")
        if self.registers:
            self.emit(2, "m = rmask & cmask")
        stride = 1
        for d in reversed(lay.par_dims):
            self.emit(2, f"{r.index(d)} = (p // {stride}) % {lay.extents[d]}")
            stride *= lay.extents[d]
        k = 0
        for step in lay.steps:
            if isinstance(step, RowStep):
                self.emit(2, f"v_{step.op} = {r.value(step.op, None)}")
                self.store(2, step.op, full=False)
            else:
                self.stage(2, k, step.ops)
                k += 1
        for op in self.cols:
            size = math.prod(_shape(self.graph, op))
            off = r.offset(op, op, self.graph.op(op).out.indices)
            cond = "cmask" + self.guard(set(lay.inner_dims) - set(lay.out_dims_of(op)))
            for j in range(len(self.reduces(op))):
                self.emit(1, f"tl.store(part_{op}_{j} + pid * {size} + ({off}) + 0 * q, "
                             f"cacc_{op}_{j}, mask={cond})")  # fmt: skip
        for op in self.cols:
            self.combine(op)
        return "import triton\nimport triton.language as tl\n\n\n" + "\n".join(self.lines) + "\n"

    def combine(self, op: str) -> None:
        """Phase 2 of a column reduction: combine the per-program partials, finish, store."""
        size = math.prod(_shape(self.graph, op))
        n = len(self.reduces(op))
        parts = [f"part_{op}_{j}" for j in range(n)]
        self.emit(0, "\n\n@triton.jit")
        self.emit(0, f"def combine_{op}({', '.join(parts)}, out_{op}, n_programs, "
                     "BLOCK: tl.constexpr):")  # fmt: skip
        self.emit(1, "k = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)")
        self.emit(1, f"km = k < {size}")
        for j, red in enumerate(self.reduces(op)):
            self.emit(1, f"t{j} = tl.load(part_{op}_{j} + k, mask=km, other=0.0)")
            self.emit(1, "for c in range(1, n_programs):")
            nxt = f"tl.load(part_{op}_{j} + c * {size} + k, mask=km, other=0.0)"
            self.emit(2, f"t{j} = " + _COMBINE[red.op.value].format(a=f"t{j}", b=nxt))
        self.finish(1, op, [f"t{j}" for j in range(n)])
        self.emit(1, f"tl.store(out_{op} + k, v_{op}, mask=km)")


def generate_triton(graph: Graph, layout: Layout) -> str:
    """The Triton source of the group's kernels.

    ``kernel``, plus ``combine_<op>`` (phase 2) per column reduction.

    Raises:
        Unfusable: for what the backend does not spell (see the module docstring).
    """
    return _Emitter(graph, layout).kernel()


#: A group's run: its input values by name to its outputs by name.
GroupRun = Callable[[Mapping[str, torch.Tensor]], dict[str, torch.Tensor]]


class TritonKernel:
    """A group compiled to Triton: call it with the group's input tensors, get its outputs.

    Args:
        graph: the planned graph.
        layout: the group's :class:`Layout`.
        on_cpu: makes the group's kernel for inputs that all live on the CPU (eager computes
            such a group there, and Triton launches on GPU memory only); called at the first
            such call. Under Triton's interpreter the Triton kernel runs on them.

    Raises:
        Unfusable: if the group has no Triton spelling (the runner runs it alone).
    """

    def __init__(
        self,
        graph: Graph,
        layout: Layout,
        on_cpu: Callable[[], GroupRun] | None = None,
    ) -> None:
        emitter = _Emitter(graph, layout)
        self.source = emitter.kernel()
        self.layout = emitter.layout  # with the long-row rewrite (online max/sum) if it applied
        lay = self.layout
        self.code = canonical(self.source, (*lay.inputs, *lay.outputs, *lay.ops))  # loaded
        self.rows_per_program, self.block_q = emitter.rows, emitter.block_q
        self.cols = [(op, len(emitter.reduces(op))) for op in emitter.cols]
        self.shapes = {t: _shape(graph, t) for t in layout.outputs}
        self.dtypes = {t: graph.tensor(t).dtype for t in layout.outputs}
        self.module: Any = None
        self.interpreted = False  # whether Triton's interpreter runs the kernel (set at load)
        self._make_on_cpu = on_cpu
        self._on_cpu: GroupRun | None = None

    def programs(self, device: torch.device) -> int:
        """Programs of the launch: one per row tile; at most 4 per SM with column partials."""
        tiles = -(-self.layout.rows // self.rows_per_program)
        if not self.cols:
            return tiles
        sms = torch.cuda.get_device_properties(device).multi_processor_count if (
            device.type == "cuda") else 2  # fmt: skip
        return min(tiles, 4 * sms)

    def __call__(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Launch on ``values`` (every input of the group, on one device); return the outputs."""
        if self.module is None:
            self.module = load_generated(self.code, "t")
            self.interpreted = type(self.module.kernel).__name__ == "InterpretedFunction"
        ins = [values[t].contiguous() for t in self.layout.inputs]
        on_gpu = [x.device for x in ins if x.device.type != "cpu"]
        device = on_gpu[0] if on_gpu else ins[0].device if ins else torch.device("cuda")
        if device.type == "cpu" and not self.interpreted:
            return self._cpu_kernel()(values)
        # a CPU scalar beside CUDA tensors (eager allows it: a 0-dim operand) moves over
        ins = [x if x.device == device else x.to(device) for x in ins]
        outs = {
            t: torch.empty(self.shapes[t], dtype=getattr(torch, self.dtypes[t]), device=device)
            for t in self.layout.outputs
        }
        n = self.programs(device)
        parts = {
            op: [torch.empty(n * math.prod(self.shapes.get(op, (1,))), device=device,
                             dtype=torch.float32) for _ in range(k)]
            for op, k in self.cols
        }  # fmt: skip
        flat = [p for ps in parts.values() for p in ps]
        warps = max(1, min(16, self.rows_per_program * self.block_q // 256))
        self.module.kernel[(n,)](
            *ins, *outs.values(), *flat, n,
            ROWS=self.rows_per_program, BLOCK_Q=self.block_q, num_warps=warps,
        )  # fmt: skip
        for op, _ in self.cols:
            size = math.prod(self.shapes[op])
            block = min(1024, 1 << max(size - 1, 0).bit_length())
            getattr(self.module, f"combine_{op}")[(-(-size // block),)](
                *parts[op], outs[op], n, BLOCK=block
            )
        return outs

    def _cpu_kernel(self) -> GroupRun:
        """The kernel for inputs on the CPU, made at its first use."""
        if self._on_cpu is None:
            if self._make_on_cpu is None:
                raise ValueError(
                    expected("stitch", "a Triton group's inputs", "on a GPU", "on the CPU")
                )
            self._on_cpu = self._make_on_cpu()
        return self._on_cpu
