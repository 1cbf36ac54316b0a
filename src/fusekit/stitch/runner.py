"""Run a planned graph: each stitched group as its generated kernel, every other op alone.

::

    stitched = stitch.compile(model, args)      # capture, plan, generate, compile
    y = stitched(*args)                          # same outputs as model(*args)

An op that runs alone runs as eager would run it (:mod:`fusekit.stitch.alone`): a contraction
(GEMM, BMM, linear) by its ATen call (``addmm``/``matmul``/``einsum``), a group of layout ops
(transpose, view, reshape) as strided views of its source, a gather or scatter-add along one
axis by its ``index_select``/``gather``/``index_add_``, an opaque op by its ATen call; any other
op alone (one no kernel could take) by the IR interpreter on its one-op subgraph. A stitched
group of one reduction keeps whichever of its kernel and eager's ATen call the first run times
faster (:class:`TimedChoice`). The reference of a whole group is :func:`reference_group` (the
interpreter on the group's subgraph). Shapes are specialised at capture: :class:`Stitched`
re-captures and re-plans for new input shapes (one plan per shape signature); a
:class:`PlannedGraph` given other shapes raises a ``ValueError`` naming the input.

Chains. The first call runs the kernels one by one (:meth:`PlannedGraph.run_each`, the
reference); from the second, each run of consecutive CPU kernels runs as one
:class:`~fusekit.stitch.chain.Chain`: one launch, no Python between its kernels.

Thread pools. The CPU kernels run on numba's OpenMP pool, the ops alone on torch's (a second
libgomp): a pool that spins after its parallel region starves the other on a small machine.
A :class:`PlannedGraph` therefore sets ``OMP_WAIT_POLICY=PASSIVE`` when it is unset, before its
kernels compile (:func:`fusekit.threads.prefer_passive_wait`): numba's pool starts with it; if
torch's pool had already started without it, a warning says to set it before importing torch.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

import torch

from fusekit.errors import expected, require
from fusekit.hw.cpu_gpu import CPUTarget, GPUTarget
from fusekit.hw.detect import detect
from fusekit.ir.capture import Capture, capture
from fusekit.ir.expr import Opaque
from fusekit.ir.graph import Graph
from fusekit.ir.interpret import interpret, opaque_call
from fusekit.ir.op import Op, OpKind
from fusekit.search.measure import fastest
from fusekit.stitch.alone import AtenContraction, AtenIndexing, AtenReduction, LayoutViews
from fusekit.stitch.candidates import Candidate
from fusekit.stitch.chain import Chain
from fusekit.stitch.classify import OpClass, classify, layout_only
from fusekit.stitch.codegen.compiling import precompile
from fusekit.stitch.codegen.cpu import CpuKernel
from fusekit.stitch.codegen.triton import TritonKernel
from fusekit.stitch.epilogue import merged_addend
from fusekit.stitch.schemes import Unfusable
from fusekit.stitch.search import Plan, plan
from fusekit.threads import prefer_passive_wait

log = logging.getLogger(__name__)


def reference_group(
    graph: Graph, ops: Sequence[str] | frozenset[str], values: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The plain-PyTorch reference of one group: the interpreter on its subgraph."""
    sub = graph.subgraph(ops)
    return interpret(sub, {n: values[n] for n in (*sub.inputs, *sub.params)})


class _Alone:
    """An IR op (or unstitched group) run by the interpreter (opaque ops: :class:`OpaqueCall`)."""

    def __init__(self, graph: Graph, group: Candidate) -> None:
        self.sub = graph.subgraph(group.ops)
        self.reads = (*self.sub.inputs, *self.sub.params)

    def __call__(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return interpret(self.sub, {n: values[n] for n in self.reads})


class OpaqueCall:
    """Opaque ops run by their ATen call, as eager runs them, never through the interpreter.

    Capture makes one opaque op per element of a tuple result (``native_layer_norm``'s three,
    the attention backward's three gradients): given all of them (``names``), the call runs
    once for every one.
    """

    def __init__(self, graph: Graph, names: Sequence[str]) -> None:
        exprs = {name: graph.op(name).expr for name in names}
        first = next(iter(exprs.values()))
        assert isinstance(first, Opaque)
        self.call = opaque_call(dataclasses.replace(first, output=None))
        self.outputs = {name: e.output for name, e in exprs.items() if isinstance(e, Opaque)}

    def __call__(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every sibling's output from one call."""
        result = self.call(values)
        return {name: result if k is None else result[k] for name, k in self.outputs.items()}


def _call_key(graph: Graph, group: Candidate) -> Opaque | None:
    """The shared call of a group that is one element of a tuple-returning opaque op."""
    if group.layout is not None or len(group.ops) != 1:
        return None
    expr = graph.op(next(iter(group.ops))).expr
    if not isinstance(expr, Opaque) or expr.output is None:
        return None
    return dataclasses.replace(expr, output=None)


Kernel = Callable[..., dict[str, Any]]


def _kernels(
    graph: Graph, groups: Sequence[Candidate], backend: str
) -> tuple[list[Kernel], list[set[str]]]:
    """One kernel per group, in plan order, and the tensors each kernel reads.

    Siblings of one opaque call share one kernel. A contraction whose only reader is an add
    the plan left alone (a split epilogue, :mod:`fusekit.stitch.epilogue`) runs with that add
    as one ATen call, at the add's place.
    """
    merged = _merged_epilogues(graph, groups)
    siblings: dict[Opaque, list[str]] = {}
    for group in groups:
        key = _call_key(graph, group)
        if key is not None:
            siblings.setdefault(key, []).append(next(iter(group.ops)))
    kernels: list[Kernel] = []
    reads: list[set[str]] = []
    done: set[Opaque] = set()
    for group in groups:
        ins = {t for o in group.ops for t in graph.op(o).inputs} - group.ops
        alone = next(iter(group.ops)) if len(group.ops) == 1 else None
        if alone in merged:
            gemm_or_call = merged[alone]
            if isinstance(gemm_or_call, str):  # the contraction: runs with its add (which reads
                continue  # what it reads)
            call, op = gemm_or_call
            kernels.append(call)
            reads.append(set(op.inputs))
            continue
        key = _call_key(graph, group)
        if key is not None and len(siblings[key]) > 1:
            if key not in done:  # the first sibling in plan order runs the call for all
                done.add(key)
                kernels.append(OpaqueCall(graph, siblings[key]))
                reads.append(ins)
            continue
        kernels.append(_kernel(graph, group, backend))
        reads.append(ins)
    return kernels, reads


def _compiled_cpu(kernel: Kernel) -> CpuKernel | None:
    """The CPU kernel that ``kernel``'s first call compiles, if any.

    Itself, or the stitched option a :class:`TimedChoice` times; a group of layout ops compiles
    its fallback only when its views do not fit.
    """
    if isinstance(kernel, TimedChoice):
        kernel = kernel.options.get("stitched")  # type: ignore[assignment]
    return kernel if isinstance(kernel, CpuKernel) else None


def _chainable(kernel: Kernel) -> CpuKernel | LayoutViews | None:
    """What of ``kernel`` a :class:`Chain` can run, else ``None``.

    A CPU kernel writing no input in place (a :class:`TimedChoice` that kept its stitched
    one), or a group of layout ops.
    """
    if isinstance(kernel, TimedChoice) and kernel.choice == "stitched":
        kernel = kernel.options["stitched"]
    if isinstance(kernel, CpuKernel) and not kernel.into:
        return kernel
    if isinstance(kernel, LayoutViews) and isinstance(kernel.fallback, CpuKernel):
        return kernel
    return None


def _last_reads(reads: Sequence[set[str]], keep: Collection[str]) -> list[tuple[str, ...]]:
    """Per kernel, the tensors no later kernel reads (dropped after it runs), less ``keep``.

    Freeing each intermediate after its last reader, as eager's reference counting does, keeps
    the working set small: a plan that held every intermediate to the end would touch fresh
    pages for each one on every call.
    """
    out: list[list[str]] = [[] for _ in reads]
    for name, k in _last_reader(reads).items():
        if name not in keep:
            out[k].append(name)
    return [tuple(sorted(names)) for names in out]


def _last_reader(reads: Sequence[set[str]]) -> dict[str, int]:
    """The index of the last kernel reading each tensor."""
    return {name: k for k, names in enumerate(reads) for name in names}


def _may_alias(graph: Graph, tensor: str) -> set[str]:
    """``tensor`` and every tensor that may be a view of it.

    What a chain of layout ops or opaque ATen calls makes of it: a layout op may run as a view
    of its input (:class:`LayoutViews`, a returned reshape), and an opaque call may return one.
    """
    out, stack = {tensor}, [tensor]
    while stack:
        for op in graph.consumers(stack.pop()):
            if (op.name not in out
                    and (graph.moves_only(op.name) or isinstance(op.expr, Opaque))):  # fmt: skip
                out.add(op.name)
                stack.append(op.name)
    return out


def _merged_epilogues(
    graph: Graph, groups: Sequence[Candidate]
) -> dict[str, str | tuple[AtenContraction, Op]]:
    """Contraction/add pairs that each run alone: ``{gemm: add, add: (its call, merged op)}``."""
    alone = {next(iter(g.ops)) for g in groups if len(g.ops) == 1}
    merged: dict[str, str | tuple[AtenContraction, Op]] = {}
    for name in alone:
        if classify(graph, name) is not OpClass.GEMM or len(graph.consumers(name)) != 1:
            continue
        (reader,) = graph.consumers(name)
        if reader.name not in alone:
            continue
        both = merged_addend(graph, name, reader.name)
        if both is not None:
            try:
                call = AtenContraction(graph, reader.name, both)
            except ValueError:
                continue
            merged[name], merged[reader.name] = reader.name, (call, both)
    return merged


#: When :class:`TimedChoice` chooses: rounds, each timing every implementation ``TUNE_REPEATS``
#: times; an implementation's time is its best round's median.
TUNE_ROUNDS = 3
TUNE_REPEATS = 5


class TimedChoice:
    """A group with two equivalent implementations; the first call times both, then keeps one.

    Used for a group of a single reduction: it moves the same DRAM bytes as a stitched kernel or
    as eager's ATen call, so the cost model cannot tell them apart, while the code can differ a
    lot (ATen's inner-axis sum over 32-wide rows is slow; its one call over 64 long rows has
    less fixed cost than ours). ``choice`` records the pick (``None`` until the first call) and
    ``medians_s`` the times it was made on.
    """

    def __init__(self, options: Mapping[str, Callable[..., dict[str, Any]]]) -> None:
        self.options = dict(options)
        self.choice: str | None = None
        self.medians_s: dict[str, float] = {}

    def __call__(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The kept implementation's outputs (the first call times every one, then keeps one)."""
        if self.choice is None:
            self.choice, self.medians_s = fastest(
                {name: partial(fn, values) for name, fn in self.options.items()},
                rounds=TUNE_ROUNDS, repeats=TUNE_REPEATS,
            )  # fmt: skip
        return self.options[self.choice](values)


def _kernel(graph: Graph, group: Candidate, backend: str) -> Callable[..., dict[str, Any]]:
    name = next(iter(group.ops)) if len(group.ops) == 1 else None  # a group of one op
    if group.layout is None:
        if name is not None and isinstance(graph.op(name).expr, Opaque):
            return OpaqueCall(graph, [name])
        if name is not None and classify(graph, name) is OpClass.GEMM:
            try:
                return AtenContraction(graph, name)
            except ValueError:
                pass
        if name is not None and graph.op(name).kind in (OpKind.GATHER, OpKind.SCATTER):
            try:
                return AtenIndexing(graph, name)
            except ValueError:
                pass
        return _Alone(graph, group)
    kernel: Callable[..., dict[str, Any]]
    if backend == "cpu":
        kernel = CpuKernel(graph, group.layout)
    elif backend == "triton":
        require("triton", "stitch's GPU backend", "gpu")
        try:
            kernel = TritonKernel(graph, group.layout, on_cpu=partial(_on_cpu, graph, group))
        except Unfusable as e:
            log.info("stitch: %s runs unstitched on the Triton backend: %s", sorted(group.ops), e)
            return _Alone(graph, group)
    else:
        raise ValueError(expected("stitch", "backend", "'cpu' or 'triton'", backend))
    if layout_only(graph, group.ops):
        try:
            return LayoutViews(graph, group.layout, kernel)
        except ValueError:
            pass
    if name is not None:
        try:
            return TimedChoice({"stitched": kernel, "aten": AtenReduction(graph, name)})
        except ValueError:
            pass
    return kernel


def _on_cpu(graph: Graph, group: Candidate) -> Callable[..., dict[str, Any]]:
    """A Triton group's kernel for inputs on the CPU: compiled for it, or run alone."""
    assert group.layout is not None
    try:
        return CpuKernel(graph, group.layout)
    except Unfusable:
        return _Alone(graph, group)


def on_device(cap: Capture, device: torch.device) -> Capture:
    """``cap`` with every param on ``device`` (capture makes constants of literals on the CPU)."""
    if all(v.device == device for v in cap.constants.values()):
        return cap
    return dataclasses.replace(cap, constants={k: v.to(device) for k, v in cap.constants.items()})


class PlannedGraph:
    """A graph with its plan, compiled: call it with a value for every input.

    Args:
        plan: the plan.
        constants: values of the graph's params.
        backend: ``"cpu"`` (numba; the only backend so far).
        strides: the strides its tensors are expected to have (an FX graph's ``meta["val"]``):
            a CPU kernel whose inputs are expected strided compiles that variant ahead too.
        writes: outputs the caller copies into inputs after the run, ``{output: input}`` (an
            optimizer's updates of its parameters): a CPU kernel computing such an output
            after the input's last other reader writes it there (:meth:`CpuKernel.write_into`),
            and the run returns the input itself for it.
    """

    def __init__(
        self,
        plan: Plan,
        constants: Mapping[str, torch.Tensor],
        backend: str = "cpu",
        strides: Mapping[str, tuple[int, ...]] | None = None,
        writes: Mapping[str, str] | None = None,
    ) -> None:
        self.plan = plan
        self.graph = plan.graph
        self.constants = dict(constants)
        if prefer_passive_wait():  # before the kernels compile, which starts numba's pool
            log.warning(
                "stitch: torch was imported without OMP_WAIT_POLICY; its spinning OpenMP "
                "threads slow the stitched kernels on small machines: set "
                "OMP_WAIT_POLICY=PASSIVE before importing torch"
            )
        self.kernels, reads = _kernels(self.graph, plan.groups, backend)
        # every kernel numba's cache lacks, compiled ahead in worker processes (one per core)
        if writes:
            self._write_in_place(writes, reads)
        cpu = [k for k in map(_compiled_cpu, self.kernels) if k is not None]
        for k in cpu if strides else []:
            k.expect(strides or {})
        precompile([(code, k.interleave) for k in cpu for code in k.codes])
        kept = {*self.graph.outputs, *self.constants, *(writes or {}).values()}
        self._drops = _last_reads(reads, kept)
        self._reads = reads
        self._dtypes = {n: getattr(torch, self.graph.tensor(n).dtype) for n in self.graph.inputs}
        #: the steps of a call from the second on: runs of CPU kernels as one :class:`Chain`
        #: each (made after the first call, which settles every :class:`TimedChoice`)
        self.steps: list[tuple[Kernel, tuple[str, ...]]] | None = None

    def _write_in_place(self, writes: Mapping[str, str], reads: list[set[str]]) -> None:
        """Hand each kernel the ``writes`` it may do in place.

        A write into input ``t`` is offered to the kernel computing it when no later kernel
        reads ``t``, and neither it nor a later kernel reads what may share its memory
        (:func:`_may_alias`: a view of it; a kernel's arrays must not overlap).
        """
        last_reader = _last_reader(reads)
        views = {t: max((last_reader.get(a, -1) for a in _may_alias(self.graph, t) - {t}),
                        default=-1)
                 for t in writes.values()}  # fmt: skip
        for i, kernel in enumerate(self.kernels):
            if isinstance(kernel, CpuKernel):  # it may read t itself, none of t's views
                pairs = {o: t for o, t in writes.items()
                         if views[t] < i and last_reader.get(t, -1) <= i}  # fmt: skip
                if pairs:
                    kernel.write_into(pairs)

    def check(self, values: Mapping[str, torch.Tensor]) -> None:
        """Raise a ``ValueError`` for a missing input or one whose shape or dtype differs."""
        for name in self.graph.inputs:
            if name not in values:
                raise ValueError(expected("stitch", name, "given", "missing"))
            t = self.graph.tensor(name)
            got = values[name]
            if got.shape != t.shape or got.dtype is not self._dtypes[name]:
                dtype = str(got.dtype).removeprefix("torch.")
                raise ValueError(
                    expected("stitch", name, f"{t.dtype}{list(t.shape)} as planned",
                             f"{dtype}{list(got.shape)}; plan again for new shapes")
                )  # fmt: skip

    def run(
        self, values: Mapping[str, torch.Tensor], check: bool = True
    ) -> dict[str, torch.Tensor]:
        """Run every kernel in plan order; return the graph's outputs by name.

        ``check=False``: the caller guarantees the planned shapes and dtypes (dynamo's guards
        do), so :meth:`check`, microseconds per input, is skipped.
        """
        if check:
            self.check(values)
        steps = self.steps
        out = self._run_steps(values, steps or zip(self.kernels, self._drops, strict=True))
        if steps is None:
            self.steps = self._chained()
        return out

    def run_each(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The reference of :meth:`run`: every kernel called in turn, no :class:`Chain`."""
        self.check(values)
        return self._run_steps(values, zip(self.kernels, self._drops, strict=True))

    def direct(
        self, positions: Mapping[str, int]
    ) -> Callable[[Sequence[torch.Tensor]], list[torch.Tensor]] | None:
        """The plan as a function of an argument list, where it is one :class:`Chain`.

        ``positions``: each graph input's position in the list. The function returns the
        graph's outputs in order and checks nothing (the caller's guards hold the planned
        shapes, dtypes and device). ``None`` before the first call (which chains the steps)
        or when the steps are more than one chain, or an output is neither the chain's nor
        an input.
        """
        if self.steps is None or len(self.steps) != 1:
            return None
        chain = self.steps[0][0]
        if not isinstance(chain, Chain):
            return None
        outputs: list[str | int] = []
        for t in self.graph.outputs:
            if t in chain.returns:
                outputs.append(t)
            elif t in positions:
                outputs.append(positions[t])
            else:
                return None
        sources: list[int | torch.Tensor] = []
        for t in chain.inputs:
            if t in positions:
                sources.append(positions[t])
            elif t in self.constants:
                sources.append(self.constants[t])
            else:
                return None
        return chain.caller(sources, outputs)

    def _run_steps(
        self, values: Mapping[str, torch.Tensor], steps: Iterable[tuple[Kernel, tuple[str, ...]]]
    ) -> dict[str, torch.Tensor]:
        env: dict[str, torch.Tensor] = {**self.constants, **values}
        for kernel, drops in steps:
            env.update(kernel(env))
            for name in drops:  # its last reader has run
                env.pop(name, None)
        return {name: env[name] for name in self.graph.outputs}

    def _chained(self) -> list[tuple[Kernel, tuple[str, ...]]]:
        """The steps of a call, chained.

        Each run of chainable kernels (:func:`_chainable`) holding a CPU kernel is one
        :class:`Chain` (one kernel too: a chain's call costs less Python than the kernel's);
        every other kernel runs alone.
        """
        steps: list[tuple[Kernel, tuple[str, ...]]] = []
        run: list[tuple[CpuKernel | LayoutViews, tuple[str, ...]]] = []

        def flush(end: int) -> None:
            if any(isinstance(k, CpuKernel) for k, _ in run):
                after = {t for names in self._reads[end:] for t in names} | set(self.graph.outputs)
                drops = tuple(sorted({d for _, names in run for d in names}))
                steps.append((Chain([k for k, _ in run], after), drops))
            else:
                steps.extend(run)
            run.clear()

        for i, (kernel, drops) in enumerate(zip(self.kernels, self._drops, strict=True)):
            chainable = _chainable(kernel)
            if chainable is None:
                flush(i)
                steps.append((kernel, drops))
            else:
                run.append((chainable, drops))
        flush(len(self.kernels))
        return steps


class Stitched:
    """A module compiled by stitch; re-plans when input shapes change.

    Args:
        model: the module (eval mode).
        target: the CPU or GPU to plan for.
        backend: ``"cpu"``.
        method: ``"ilp"`` or ``"greedy"``.
        time_limit_s: ILP time limit.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        target: CPUTarget | GPUTarget,
        backend: str = "cpu",
        method: str = "ilp",
        time_limit_s: float = 5.0,
    ) -> None:
        self.model, self.target, self.backend = model, target, backend
        self.method, self.time_limit_s = method, time_limit_s
        self.compiled: dict[tuple[Any, ...], tuple[Capture, PlannedGraph]] = {}

    def prepare(self, *args: Any) -> tuple[Capture, PlannedGraph]:
        """Capture and plan for the shapes of ``args`` (memoised per shape signature)."""
        key = tuple((a.shape, a.dtype) if hasattr(a, "shape") else repr(a) for a in args)
        if key not in self.compiled:
            device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
            cap = capture(self.model, args)
            cap = cap if device is None else on_device(cap, device)
            p = plan(cap.graph, self.target, method=self.method, time_limit_s=self.time_limit_s)
            self.compiled[key] = (cap, PlannedGraph(p, cap.constants, self.backend))
        return self.compiled[key]

    def __str__(self) -> str:
        """The plan of every shape signature compiled so far."""
        if not self.compiled:
            return f"Stitched({type(self.model).__name__}): not planned yet (call it once)"
        return "\n".join(planned.plan.describe() for _, planned in self.compiled.values())

    def __call__(self, *args: Any) -> Any:
        """The model's outputs (one tensor, or a tuple as the graph returns several)."""
        cap, planned = self.prepare(*args)
        out = planned.run(cap.values(*args))
        outs = tuple(out[name] for name in cap.graph.outputs)
        return outs[0] if len(outs) == 1 else outs


def compile(
    model: torch.nn.Module,
    args: Sequence[Any],
    target: CPUTarget | GPUTarget | None = None,
    *,
    backend: str = "cpu",
    method: str = "ilp",
    time_limit_s: float = 5.0,
) -> Stitched:
    """Capture ``model`` on ``args``, plan its fusion and compile the kernels.

    Args:
        model: the module, in eval mode.
        args: example arguments (the first plan is made for their shapes).
        target: the target to plan for; the detected local CPU by default.
        backend: ``"cpu"`` (numba).
        method: ``"ilp"`` or ``"greedy"``.
        time_limit_s: ILP time limit.

    Returns:
        A callable :class:`Stitched`.
    """
    if target is None:
        target = detect()
    stitched = Stitched(model, target, backend, method, time_limit_s)
    stitched.prepare(*args)
    return stitched
