"""Consecutive CPU kernels of a plan run by one launch, with no Python between them.

A :class:`~fusekit.stitch.codegen.cpu.CpuKernel` call costs microseconds of Python around its
kernel (checks, a variant lookup, allocations, the argument array, the launch): a plan of
twenty small kernels pays more for that than for its memory traffic. Inductor's wrapper makes
the same calls from one Python function into C++. A :class:`Chain` takes a run of the plan's
CPU kernels (and the groups of layout ops between them, :class:`~fusekit.stitch.alone.
LayoutViews`, which are views and launch nothing) and, per stride signature of its inputs,
works out once what every call would (a :class:`Program`):

- each kernel's compiled variant, as its call would pick it, and the strides of its outputs;
- where each tensor lives: an input of the chain, a view of one (an offset into it), a new
  tensor (what is read after the chain), or a slot of an arena that the chain keeps between
  calls (what dies inside it; slots whose lifetimes, first write to last read, do not overlap
  share bytes, as Inductor's wrapper reuses buffers);
- one ``argv`` array per kernel, end to end, with the addresses left to fill.

A call then allocates the tensors read after the chain, fills the addresses and runs every
kernel by one call of :func:`~fusekit.stitch.codegen.launch.launch_chain`. A plan that is one
chain is called straight from dynamo's argument list (:meth:`Chain.caller`): a region of a few
small ops costs tens of microseconds of Python a call, as much as its kernels. A signature whose
calls some kernel would not make as planned (an input it copies first, a group of layout ops
that is not a view) runs the kernels one by one, as the reference does: :meth:`Chain.each`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fusekit.stitch.alone import LayoutViews
from fusekit.stitch.codegen.cpu import CpuKernel, empty_strided_cpu, reinterpret_tensor

#: Byte alignment of every arena slot (a cache line, and AVX-512's vector).
ALIGN = 64

#: :mod:`fusekit.stitch.codegen.launch`, imported at the first call (importing it starts
#: numba's pool: not before a plan has set ``OMP_WAIT_POLICY``)
_launch: Any = None


def _launch_module() -> Any:
    global _launch
    if _launch is None:
        from fusekit.stitch.codegen import launch

        _launch = launch
    return _launch


Strides = tuple[int, ...]


@dataclass(frozen=True)
class Placed:
    """Where a tensor of the chain lives, with its own shape and strides.

    ``root``: an input of the chain, a new tensor or an arena slot, by name; ``offset``: the
    tensor's offset into it, in elements.
    """

    root: str
    offset: int
    shape: tuple[int, ...]
    strides: Strides


@dataclass
class Program:
    """What a chain's call does for one stride signature of its inputs (see the module).

    ``owned``: the new tensors of a call (name, shape, strides, dtype). ``outs``: per return
    of the chain, in order, whether it is (a view of) an owned tensor, else of an input, that
    tensor's index, and the view (offset, shape, strides), ``None`` for the tensor itself.
    ``template``: every kernel's ``argv`` end to end with its addresses left 0. ``plan``:
    :func:`~fusekit.stitch.codegen.launch.launch_chain`'s argument after the table of base
    addresses (the chain's inputs, the owned tensors, the arena) and ``argv``: where each
    address goes, its base (an index into the table) and byte offset, the kernels' chunk and
    finish entry points, chunk counts and ``argv`` starts. ``free``: call states not in use.
    """

    owned: list[tuple[str, tuple[int, ...], Strides, torch.dtype]]
    outs: list[tuple[bool, int, tuple[int, tuple[int, ...], Strides] | None]]
    arena_bytes: int
    template: np.ndarray
    plan: np.ndarray
    n_inputs: int
    free: list[_State] = field(default_factory=list)

    def run(self, ext: Sequence[torch.Tensor], launch_chain: Any) -> list[torch.Tensor]:
        """One call on the chain's inputs ``ext``: the chain's returns, in order."""
        owned = [empty_strided_cpu(shape, step, dtype) for _, shape, step, dtype in self.owned]
        try:
            state = self.free.pop()
        except IndexError:  # the first call, or others run this program now
            state = self.state()
        state.table[: self.n_inputs + len(owned)] = [*map(_data_ptr, ext), *map(_data_ptr, owned)]
        launch_chain(state.table, state.argv, self.plan)
        self.free.append(state)
        return [
            (owned[i] if of_owned else ext[i])
            if view is None
            else reinterpret_tensor(owned[i] if of_owned else ext[i], view[1], view[2], view[0])
            for of_owned, i, view in self.outs
        ]

    def state(self) -> _State:
        """A new call state: its own arena, address table and ``argv``."""
        arena = torch.empty(self.arena_bytes, dtype=torch.uint8) if self.arena_bytes else None
        table = np.zeros(self.n_inputs + len(self.owned) + 1, dtype=np.int64)
        table[-1] = arena.data_ptr() if arena is not None else 0
        return _State(table, self.template.copy(), arena)


@dataclass
class _State:
    """What one running call of a :class:`Program` holds alone.

    ``table``: the base addresses (the arena's last, filled once); ``argv``: the kernels'
    arguments, which :func:`~fusekit.stitch.codegen.launch.launch_chain` fills in place (the
    state keeps it alive while the kernels read it); ``arena``: the bytes of the chain's
    intermediates. Concurrent calls of a program each take a state of their own.
    """

    table: np.ndarray
    argv: np.ndarray
    arena: torch.Tensor | None


_data_ptr = torch.Tensor.data_ptr
_stride = torch.Tensor.stride


class Chain:
    """Run ``kernels`` (consecutive in a plan) by one launch; see the module docstring.

    Args:
        kernels: CPU kernels (writing no input in place) and groups of layout ops, in plan order.
        after: the tensors read after the chain (later kernels, the graph's outputs): the call
            returns those of them the chain computes.
    """

    def __init__(self, kernels: Sequence[CpuKernel | LayoutViews], after: set[str]) -> None:
        self.kernels = list(kernels)
        produced: set[str] = set()
        inputs: list[str] = []
        for k in self.kernels:
            for t in _reads(k):
                if t not in produced and t not in inputs:
                    inputs.append(t)
            produced.update(_writes(k))
        self.inputs = inputs
        self.returns = [t for t in sorted(produced) if t in after]
        #: every kernel runs on the calling thread: programs need not follow the thread count
        self.serial = all(k.serial for k in self.kernels if isinstance(k, CpuKernel))
        self.programs: dict[tuple[Any, ...], Program | None] = {}

    def __call__(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The chain's outputs read after it, by one launch where its program allows."""
        launch = _launch or _launch_module()
        ext = [values[t] for t in self.inputs]
        if not all(x.is_cpu for x in ext):
            return self.each(values)  # the kernels raise their error
        return dict(zip(self.returns, self._returns(ext, launch), strict=True))

    def each(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The reference: every kernel called in turn."""
        env = dict(values)
        for k in self.kernels:
            env.update(k(env))
        return {t: env[t] for t in self.returns}

    def program(self, ext: Sequence[torch.Tensor], launch: Any) -> Program | None:
        """The program for inputs ``ext`` (made at its signature's first call), or ``None``."""
        given: tuple[Strides, ...] = tuple(map(_stride, ext))
        key = (0 if self.serial else launch.threads(), *given)  # chunks follow threads
        try:
            return self.programs[key]
        except KeyError:
            program = self.programs[key] = self._program(given)
            return program

    def _returns(self, ext: Sequence[torch.Tensor], launch: Any) -> list[torch.Tensor]:
        """The chain's returns, in order, for inputs ``ext``.

        By its program; kernel by kernel where a kernel would copy an input first.
        """
        program = self.program(ext, launch)
        if program is None:
            out = self.each(dict(zip(self.inputs, ext, strict=True)))
            return [out[t] for t in self.returns]
        return program.run(ext, launch.launch_chain)

    def caller(
        self, sources: Sequence[int | torch.Tensor], outputs: Sequence[str | int]
    ) -> Callable[[Sequence[torch.Tensor]], list[torch.Tensor]]:
        """The chain as a function of an argument list: for a graph that is this chain alone.

        Args:
            sources: per input of the chain, its position in the argument list, or a tensor
                (a constant of the plan).
            outputs: what the call gives back, in order: a return of the chain by name, or
                an argument (its position) as it is.

        The call skips what the caller's guards already hold (every argument a CPU tensor of
        the planned shape and dtype, as dynamo's do) and the dictionaries of :meth:`__call__`.
        """
        launch = _launch_module()
        pick = [
            (False, self.returns.index(t)) if isinstance(t, str) else (True, t) for t in outputs
        ]
        same = pick == [(False, i) for i in range(len(self.returns))]
        positions = [s for s in sources if isinstance(s, int)]
        fixed = None if len(positions) == len(sources) else list(sources)

        def call(args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
            if fixed is None:
                ext = [args[k] for k in positions]
            else:
                ext = [args[s] if isinstance(s, int) else s for s in fixed]
            got = self._returns(ext, launch)
            return got if same else [args[i] if given else got[i] for given, i in pick]

        return call

    def _program(self, given: Sequence[Strides]) -> Program | None:
        """The program for inputs of strides ``given``, or ``None`` (run :meth:`each`)."""
        placed = {t: Placed(t, 0, (), st) for t, st in zip(self.inputs, given, strict=True)}
        buffers: dict[str, tuple[tuple[int, ...], Strides, torch.dtype, int]] = {}  # by root
        last: dict[str, int] = {}
        launches: list[tuple[int, CpuKernel, Any, list[str], list[str]]] = []
        parts: list[tuple[str, int, int]] = []  # (slot, bytes, kernel index)
        for i, k in enumerate(self.kernels):
            if isinstance(k, LayoutViews):
                fitted = k.fit(tuple(placed[a.tensor].strides for a, _, _ in k.reads.values()))
                if fitted is None:
                    return None
                for name, (acc, _, shape) in k.reads.items():
                    src, (base, step) = placed[acc.tensor], fitted[name]
                    placed[name] = Placed(src.root, src.offset + base, shape, step)
                continue
            ins = list(k.layout.inputs)
            variant = k.compiled_variant(tuple(placed[t].strides for t in ins))
            if variant is None:
                return None
            for t in ins:
                last[placed[t].root] = i
            outs = []
            for t, shape, step, dtype in variant.outs:
                placed[t] = Placed(t, 0, shape, step)
                buffers[t] = (shape, step, dtype, i)
                last[t] = i
                outs.append(t)
            for t, (j, shape, (base, step)) in variant.views.items():
                src = placed[ins[j]]
                placed[t] = Placed(src.root, src.offset + base, shape, step)
            for j, (size, part_dtype) in enumerate(variant.part_specs):
                parts.append((f"{i}/part{j}", k.chunks() * size * part_dtype.itemsize, i))
            launches.append((i, k, variant, ins, outs))
        escaping = {placed[t].root for t in self.returns} - set(self.inputs)
        slots = {t: (_nbytes(shape, dtype), (b[3], last[t]))
                 for t, b in buffers.items() if t not in escaping
                 for shape, dtype in [(b[0], b[2])]}  # fmt: skip
        slots.update({name: (size, (i, i)) for name, size, i in parts})
        offsets, arena_bytes = _arena(slots)
        owned = [(t, *buffers[t][:3]) for t in sorted(escaping)]
        table = {**{t: n for n, t in enumerate(self.inputs)},
                 **{t: len(self.inputs) + n for n, (t, *_) in enumerate(owned)}}  # fmt: skip
        arena_index = len(table)

        def address(root: str, offset_bytes: int) -> tuple[int, int]:
            if root in table:
                return table[root], offset_bytes
            return arena_index, offsets[root] + offset_bytes

        template: list[int] = []
        pos: list[int] = []
        bases: list[int] = []
        off: list[int] = []
        starts: list[int] = []
        chunk_fns: list[int] = []
        finish_fns: list[int] = []
        n_chunks: list[int] = []
        for i, k, variant, ins, outs in launches:
            starts.append(len(template))
            assert variant.fn is not None
            chunk_fns.append(variant.fn[0])
            finish_fns.append(variant.fn[1])
            n_chunks.append(k.chunks())
            for t in [*ins, *outs]:
                where = placed[t]
                base, extra = address(where.root, where.offset * _itemsize(k, t))
                pos.append(len(template))
                bases.append(base)
                off.append(extra)
                template.append(0)
            for j in range(len(variant.part_specs)):
                base, extra = address(f"{i}/part{j}", 0)
                pos.append(len(template))
                bases.append(base)
                off.append(extra)
                template.append(0)
            template.extend([*k._trips, k.chunks()])
        index = {t: n for n, (t, *_) in enumerate(owned)}
        inputs = {t: n for n, t in enumerate(self.inputs)}
        returns: list[tuple[bool, int, tuple[int, tuple[int, ...], Strides] | None]] = []
        for t in self.returns:
            where = placed[t]
            of_owned = where.root in index
            n = index[where.root] if of_owned else inputs[where.root]
            view = None if where.root == t else (where.offset, where.shape, where.strides)
            returns.append((of_owned, n, view))
        launch = _launch_module()
        return Program(
            owned=owned, outs=returns, arena_bytes=arena_bytes,
            template=np.array(template, dtype=np.int64), n_inputs=len(inputs),
            plan=launch.chain_plan(pos, bases, off, chunk_fns, finish_fns, n_chunks, starts),
        )  # fmt: skip


def _arena(slots: Mapping[str, tuple[int, tuple[int, int]]]) -> tuple[dict[str, int], int]:
    """Byte offsets of ``slots`` (``{name: (bytes, (first, last kernel))}``) in one arena.

    Slots live from the kernel that writes them to the last that reads them (both included: a
    kernel's outputs never share bytes with its inputs); a slot takes the lowest aligned
    offset free of every placed slot whose life overlaps its own, in order of first write.
    """
    offsets: dict[str, int] = {}
    placed: list[tuple[int, int, int, int]] = []  # (start, end, first, last)
    for name, (size, (first, last)) in sorted(slots.items(), key=lambda s: (s[1][1], s[0])):
        size = -(-max(size, 1) // ALIGN) * ALIGN
        busy = sorted((s, e) for s, e, f, la in placed if f <= last and first <= la)
        at = 0
        for s, e in busy:
            if at + size <= s:
                break
            at = max(at, e)
        offsets[name] = at
        placed.append((at, at + size, first, last))
    return offsets, max((e for _, e, _, _ in placed), default=0)


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def _itemsize(k: CpuKernel, t: str) -> int:
    return int(getattr(torch, k.graph.tensor(t).dtype).itemsize)


def _reads(k: CpuKernel | LayoutViews) -> list[str]:
    if isinstance(k, LayoutViews):
        return [acc.tensor for acc, _, _ in k.reads.values()]
    return list(k.layout.inputs)


def _writes(k: CpuKernel | LayoutViews) -> list[str]:
    if isinstance(k, LayoutViews):
        return list(k.reads)
    return list(k.layout.outputs)
