"""``torch.compile(model, backend="fusekit")``: stitch the graphs dynamo hands over.

::

    compiled = torch.compile(model, backend="fusekit")   # registered at install (entry point)
    loss = compiled(x).sum(); loss.backward()              # forward and backward stitched

The pipeline per graph dynamo captures::

    dynamo --FX graph--> AOTAutograd (functionalise, decompose, split forward / backward)
           --ATen graph--> capture_graph --> plan (ILP) --> PlannedGraph (stitched kernels)

AOTAutograd hands the forward and the backward graph to the same :class:`GraphCompiler`. Its
decompositions are torch's core ATen set plus LayerNorm, so that normalisations and their
backward arrive as the elementwise ops and reductions the planner groups. A graph compiled with
static shapes is planned once; a graph with symbolic sizes is planned per shape signature at its
first call with those shapes (re-traced to a static ATen graph by ``make_fx``). A graph the
capture cannot take (an op with a data-dependent size, a non-tensor output, ...) runs as eager,
with one log line at INFO naming why.

Options (``torch.compile(model, backend="fusekit", options={...})``):

    target        a preset name or a :class:`~fusekit.hw.Target`; default: the measured device
                  of the inputs (``detect()`` / ``detect_gpu()``)
    method        ``"ilp"`` (default) or ``"greedy"``
    time_limit_s  the ILP's time limit per graph (default 5)
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fusekit.errors import FusekitError, expected
from fusekit.hw.cpu_gpu import CPUTarget, GPUTarget
from fusekit.hw.detect import real_tensors
from fusekit.ir.capture import Capture, capture_graph
from fusekit.ir.fold import fold_constants
from fusekit.stitch.codegen.compiling import warm
from fusekit.stitch.runner import PlannedGraph, on_device
from fusekit.stitch.search import Plan, plan

log = logging.getLogger(__name__)

#: The options :func:`fusekit_backend` takes.
OPTIONS = frozenset({"target", "method", "time_limit_s"})


@functools.cache
def decompositions() -> dict[Any, Callable[..., Any]]:
    """Torch's core ATen decompositions plus LayerNorm's and GroupNorm's, less attention's.

    Attention stays one ATen call forward and backward (a contraction, run as eager runs it):
    its decomposed forward saves other tensors than the fused backward reads. Made once (about
    0.3 s): AOTAutograd asks for it at every graph dynamo compiles, and reads it only.
    """
    from torch._decomp import core_aten_decompositions, get_decompositions

    aten = torch.ops.aten
    table = {
        op: fn
        for op, fn in core_aten_decompositions().items()  # type: ignore[no-untyped-call]
        if "scaled_dot_product" not in str(op)
    }
    norms = [aten.native_layer_norm, aten.native_layer_norm_backward]
    norms += [aten.native_group_norm, aten.native_group_norm_backward]
    table.update(get_decompositions(norms))
    return table


def fusekit_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    options: dict[str, Any] | None = None,
) -> Callable[..., Any]:
    """The ``"fusekit"`` backend of ``torch.compile`` (module docstring).

    Args:
        gm: the FX graph dynamo captured.
        example_inputs: its example inputs.
        options: ``torch.compile``'s ``options`` (the module docstring lists them).

    Raises:
        ValueError: an unknown option.
    """
    from torch._dynamo.backends.common import aot_autograd

    options = dict(options or {})
    unknown = set(options) - OPTIONS
    if unknown:
        raise ValueError(
            expected(
                "torch.compile(backend='fusekit')",
                "options",
                f"keys among {sorted(OPTIONS)}",
                sorted(unknown),
            )
        )
    compiler = GraphCompiler(**options)
    on_cpu = all(x.device.type == "cpu" for x in example_inputs if isinstance(x, torch.Tensor))
    if compiler.target is not None or on_cpu:  # a wrong target is the caller's error
        target = compiler.target_for(torch.device("cpu"))  # measured before the workers start
        if on_cpu:  # the forward and backward graphs plan for it without reading it again
            compiler.target = target
    if on_cpu:
        warm()  # the kernel compile workers start while AOTAutograd traces and the ILP plans
    aot = aot_autograd(fw_compiler=compiler, bw_compiler=compiler, decompositions=decompositions,
                       keep_inference_input_mutations=True)  # fmt: skip
    return aot(gm, example_inputs)


@dataclass
class GraphCompiler:
    """Compiles one ATen graph (forward, backward or inference) into stitched kernels."""

    target: str | CPUTarget | GPUTarget | None = None
    method: str = "ilp"
    time_limit_s: float = 5.0
    compiled: list[StitchedGraph] = field(default_factory=list)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        """The compiled graph: planned now for static shapes, at each new shape otherwise."""
        graph = StitchedGraph(gm, self)
        self.compiled.append(graph)
        if not graph.symbolic(example_inputs):
            graph.prepare(example_inputs, static=True)
        return graph

    def target_for(self, device: torch.device) -> CPUTarget | GPUTarget:
        """The target to plan for: the option, else the measured device."""
        from fusekit.hw import detect, load

        if self.target is not None:
            target = load(self.target) if isinstance(self.target, str) else self.target
            if not isinstance(target, CPUTarget | GPUTarget):
                raise FusekitError(expected("fusekit backend", "target", "a CPU or GPU", target))
            return target
        if device.type == "cuda":
            from fusekit.hw.detect_gpu import detect_gpu

            return detect_gpu(device.index or 0)
        return detect()


@dataclass
class _Planned:
    """One shape signature's plan: the graph's outputs in order, ``None`` where it has none."""

    run: Callable[[list[Any]], list[Any]]
    plan: Plan | None  # None: the graph runs as eager
    reason: str = ""
    compiled: PlannedGraph | None = None


def _without_copies(
    gm: torch.fx.GraphModule,
) -> tuple[torch.fx.GraphModule, list[tuple[int, torch.fx.Node]]]:
    """``gm`` with its trailing ``copy_`` into inputs turned into outputs, and those copies.

    With ``keep_inference_input_mutations``, AOTAutograd ends an inference graph that mutates
    its inputs (an optimizer step) with ``aten.copy_(input, new value)``. The new values
    become extra outputs (after the graph's own), so that the planner sees them, and the
    caller writes them back: ``[(placeholder position, node of the new value)]``. A ``copy_``
    read afterwards, or one followed by another reader of its input, is left as it is (the
    capture then refuses the graph, which runs as eager).
    """
    nodes = list(gm.graph.nodes)
    position = {n: i for i, n in enumerate(n for n in nodes if n.op == "placeholder")}
    order = {n: i for i, n in enumerate(nodes)}
    copies = [
        n for n in nodes
        if n.op == "call_function" and n.target is torch.ops.aten.copy_.default
        and n.args[0] in position and not n.users
        and all(order[u] <= order[n] for u in n.args[0].users)
        and isinstance(n.args[1], torch.fx.Node)
    ]  # fmt: skip
    if not copies:
        return gm, []
    gm = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    by_name = {n.name: n for n in gm.graph.nodes}
    output = next(n for n in gm.graph.nodes if n.op == "output")
    out = output.args[0]
    outs = list(out) if isinstance(out, list | tuple) else [out]
    pairs = []
    for c in copies:
        node = by_name[c.name]
        src = node.args[1]
        assert isinstance(src, torch.fx.Node)
        pairs.append((position[c.args[0]], src))
        gm.graph.erase_node(node)
        outs.append(src)
    output.args = (tuple(outs),)
    gm.recompile()
    return gm, pairs


def _strides(cap: Capture) -> dict[str, tuple[int, ...]]:
    """The strides the traced graph gave each tensor of the captured one, where it still has it.

    A hint only (kernels pick their variant by the strides they are called with), recorded by
    the capture under the IR's names (an opaque op's outputs too, which FX names by the
    ``getitem`` nodes that read them).
    """
    names = {t.name: len(t.shape) for t in cap.graph.tensors}
    return {n: st for n, st in cap.strides.items() if names.get(n) == len(st)}


def _merged(values: list[Any], slots: Sequence[tuple[bool, Any]]) -> list[Any]:
    """The graph's returns: ``values`` (its tensor outputs) merged into ``slots``.

    ``slots``: per return, ``(True, name)`` where a tensor output goes, in order, else
    ``(False, constant)`` (an int or ``None``).
    """
    it = iter(values)
    return [next(it) if t else x for t, x in slots]


class StitchedGraph:
    """An ATen graph with a plan per shape signature; called with AOTAutograd's boxed inputs."""

    def __init__(self, gm: torch.fx.GraphModule, compiler: GraphCompiler) -> None:
        self.gm, self.compiler = gm, compiler
        self.plans: dict[tuple[Any, ...], _Planned] = {}
        self._static: _Planned | None = None
        self._boxed_call = True  # AOTAutograd passes the inputs as one list

    @staticmethod
    def symbolic(inputs: Sequence[Any]) -> bool:
        """Whether any input is a symbolic size or has one."""
        return any(
            isinstance(x, torch.SymInt)
            or (isinstance(x, torch.Tensor) and not all(isinstance(d, int) for d in x.shape))
            for x in inputs
        )

    def prepare(self, inputs: Sequence[Any], static: bool = False) -> _Planned:
        """Capture and plan for these inputs' shapes; an eager fallback if capture fails."""
        gm = self.gm
        try:
            if not static:  # a static ATen graph for these sizes
                from torch.fx.experimental.proxy_tensor import make_fx

                gm = make_fx(self.gm, tracing_mode="fake")(*inputs)  # runs nothing: no RNG drawn
            planned = self._plan(gm, inputs)
        except (FusekitError, ValueError, NotImplementedError, RuntimeError) as e:
            log.info("fusekit backend: %s runs as eager: %s", self.gm.__class__.__name__, e)
            planned = _Planned(run=self._eager, plan=None, reason=str(e).splitlines()[0])
        if static:
            self._static = planned
        return planned

    def _plan(self, gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> _Planned:
        gm, copies = _without_copies(gm)
        output = next(n for n in gm.graph.nodes if n.op == "output")
        outs = (
            list(output.args[0]) if isinstance(output.args[0], list | tuple) else [output.args[0]]
        )
        nodes = [o for o in outs if isinstance(o, torch.fx.Node)]
        if len(nodes) < len(outs):  # None (gradients no input needs) or sizes saved as ints
            if any(not isinstance(o, int | None) for o in outs if not isinstance(o, torch.fx.Node)):
                raise FusekitError("fusekit backend: a graph output is not a tensor, int or None")
            gm = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))  # the eager path keeps gm's
            output = next(n for n in gm.graph.nodes if n.op == "output")
            output.args = (tuple(n for n in output.args[0] if isinstance(n, torch.fx.Node)),)
            gm.recompile()
        device = next((x.device for x in inputs if isinstance(x, torch.Tensor)), None)
        device = device or torch.device("cpu")
        with real_tensors():  # folded once on real values (AOTAutograd compiles under fake)
            cap = on_device(fold_constants(capture_graph(gm, inputs, name="aot")), device)
        target = self.compiler.target_for(device)
        p = plan(cap.graph, target, method=self.compiler.method,
                 time_limit_s=self.compiler.time_limit_s)  # fmt: skip
        backend = "triton" if device.type == "cuda" else "cpu"
        names = cap.graph.outputs
        tensor = [isinstance(o, torch.fx.Node) for o in outs]
        user = [o for o in outs[: len(outs) - len(copies)] if isinstance(o, torch.fx.Node)]
        copied = [(names[len(user) + j], k) for j, (k, _) in enumerate(copies)]
        placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        graph_inputs = set(cap.graph.inputs)
        writes: dict[str, str] = {}
        for out, k in copied:  # written in place when a kernel computes it last
            if placeholders[k] in graph_inputs and out not in names[: len(user)]:
                writes.setdefault(out, placeholders[k])
        planned = PlannedGraph(p, cap.constants, backend, strides=_strides(cap),
                               writes=writes)  # fmt: skip
        n_user = len(outs) - len(copies)
        # what a call does, worked out once (a call costs microseconds per line of Python):
        # the graph's inputs by argument position, each returned slot a graph output by name
        # or an int/None returned as is
        positions = [k for k, a in enumerate(inputs) if isinstance(a, torch.Tensor)]
        given = cap.graph.inputs
        by_position = len(positions) == len(given)
        values = iter(names)
        slots = [
            (True, next(values)) if t else (False, o) for t, o in zip(tensor, outs, strict=True)
        ]
        slots = slots[:n_user]

        def general(args: list[Any]) -> list[Any]:
            # dynamo's guards hold shapes and dtypes to this signature's: no check
            if by_position:
                bound = dict(zip(given, [args[k] for k in positions], strict=True))
            else:
                bound = cap.values(*(a for a in args if isinstance(a, torch.Tensor)))
            got = planned.run(bound, check=False)
            for out, k in copied:  # AOTAutograd's copy_ of a mutated input, unless done
                if got[out] is not args[k]:
                    args[k].copy_(got[out])
            return [got[x] if t else x for t, x in slots]

        def first(args: list[Any]) -> list[Any]:
            # the first call settles the plan's choices and chains its steps; from the next
            # on, a plan that is one chain runs straight from the argument list
            out = general(args)
            direct = None
            if by_position and not copied:
                direct = planned.direct({g: positions[j] for j, g in enumerate(given)})
            if direct is None:
                result.run = general
            elif all(t for t, _ in slots):
                result.run = direct
            else:
                result.run = lambda args: _merged(direct(args), slots)
            return out

        result = _Planned(run=first, plan=p, compiled=planned)
        return result

    def _eager(self, args: list[Any]) -> list[Any]:
        out = self.gm(*args)
        return list(out) if isinstance(out, list | tuple) else [out]

    def __str__(self) -> str:
        """The plan of every shape signature, or why the graph runs as eager."""
        planned = [p for p in (self._static, *self.plans.values()) if p is not None]
        return "\n".join(
            p.plan.describe() if p.plan is not None else f"eager: {p.reason}" for p in planned
        )

    def __call__(self, args: list[Any]) -> list[Any]:
        """Run on AOTAutograd's boxed inputs; the graph's outputs in order."""
        if self._static is not None:
            planned = self._static
        else:
            key = tuple(
                (tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else a
                for a in args
            )
            planned = self.plans.get(key) or self.plans.setdefault(key, self.prepare(args))
        out = planned.run(args)
        args.clear()  # boxed calling convention: the inputs may be freed
        return out
