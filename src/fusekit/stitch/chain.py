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
kernel by one call of :func:`~fusekit.stitch.codegen.launch.launch_chain`. A signature whose
calls some kernel would not make as planned (an input it copies first, a group of layout ops
that is not a view) runs the kernels one by one, as the reference does: :meth:`Chain.each`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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

    ``template``: every kernel's ``argv`` end to end with its addresses left 0 (a call fills
    a copy). ``arrays``: :func:`~fusekit.stitch.codegen.launch.launch_chain`'s arguments after
    the table of base addresses (the chain's inputs, the ``owned`` tensors, the arena) and the
    copy: where each address goes, its base (an index into the table) and byte offset, the
    kernels' chunk and finish entry points, chunk counts and ``argv`` starts.
    """

    owned: list[tuple[str, tuple[int, ...], Strides, torch.dtype]]  # new tensors, by root
    returned: list[tuple[str, int]]  # returned owned tensors: (name, index in owned)
    views: list[tuple[str, bool, int, int, tuple[int, ...], Strides]]  # (name, of an owned
    # tensor (else of an input), its index, offset, shape, strides)
    arena_bytes: int
    template: np.ndarray
    arrays: tuple[np.ndarray, ...]
    arena: torch.Tensor | None
    lock: threading.Lock


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
        self.programs: dict[tuple[Any, ...], Program | None] = {}

    def __call__(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The chain's outputs read after it, by one launch where its program allows."""
        launch = _launch or _launch_module()
        ext = [values[t] for t in self.inputs]
        key = (launch.threads(), *[x.stride() for x in ext])  # chunk counts follow threads
        if key in self.programs:
            program = self.programs[key]
        else:
            program = self.programs[key] = self._program([x.stride() for x in ext])
        if program is None:
            return self.each(values)
        for x in ext:
            if not x.is_cpu:
                return self.each(values)  # the kernels raise their error
        return self._run(program, ext, launch.launch_chain)

    def each(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The reference: every kernel called in turn."""
        env = dict(values)
        for k in self.kernels:
            env.update(k(env))
        return {t: env[t] for t in self.returns}

    def _run(self, p: Program, ext: list[torch.Tensor], run: Any) -> dict[str, torch.Tensor]:
        owned = [empty_strided_cpu(shape, step, dtype) for _, shape, step, dtype in p.owned]
        ptrs = [x.data_ptr() for x in ext]
        ptrs += [o.data_ptr() for o in owned]
        lock = p.lock
        if lock.acquire(blocking=False):
            try:
                ptrs.append(p.arena.data_ptr() if p.arena is not None else 0)
                run(np.array(ptrs, dtype=np.int64), p.template.copy(), *p.arrays)
            finally:
                lock.release()
        else:  # another thread runs this program: a fresh arena for this call
            arena = torch.empty(p.arena_bytes, dtype=torch.uint8)
            ptrs.append(arena.data_ptr())
            run(np.array(ptrs, dtype=np.int64), p.template.copy(), *p.arrays)
        out = {name: owned[i] for name, i in p.returned}
        for name, from_owned, i, offset, shape, step in p.views:
            out[name] = reinterpret_tensor(owned[i] if from_owned else ext[i], shape, step, offset)
        return out

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
        views = []
        for t in self.returns:
            where = placed[t]
            if where.root != t:
                of_owned = where.root in index
                n = index[where.root] if of_owned else inputs[where.root]
                views.append((t, of_owned, n, where.offset, where.shape, where.strides))
        returned = [(t, index[t]) for t in self.returns if placed[t].root == t]
        lists = (pos, bases, off, chunk_fns, finish_fns, n_chunks, starts)
        arrays = tuple(np.array(xs, dtype=np.int64) for xs in lists)
        return Program(
            owned=owned, returned=returned, views=views, arena_bytes=arena_bytes,
            template=np.array(template, dtype=np.int64), arrays=arrays,
            arena=torch.empty(arena_bytes, dtype=torch.uint8) if arena_bytes else None,
            lock=threading.Lock(),
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
