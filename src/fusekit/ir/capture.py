"""Capture a PyTorch module into a :class:`~fusekit.ir.graph.Graph`.

The pipeline::

    trace    torch.export.export(model, args): ATen's "training IR", not decomposed, so linear,
             layer_norm, softmax and sdpa arrive whole (sparse COO/CSR inputs and buffers are
             supported). If export fails for another reason than data-dependent control flow,
             fall back to torch.fx.symbolic_trace followed by make_fx(pre_dispatch=True), which
             records the same ATen level.
    walk     every node through a lowering rule (fusekit.ir.lowering) into IR ops; in-place ops
             rebind the mutated value; an op without a rule, or in a form its rule does not
             describe, becomes an opaque op that keeps its shapes and its ATen target.
    prune    drop ops no output depends on.

Shapes are specialised to the example inputs. Data-dependent Python control flow, dropout in
training mode, mutation of inputs or buffers, and sparse tensors anywhere but as the left
operand of a matmul raise :class:`CaptureError` naming the op and the source line.
"""

from __future__ import annotations

import logging
import operator
import os
import re
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import reduce as fold
from typing import TYPE_CHECKING, Any, Literal

from fusekit.errors import FusekitError, expected
from fusekit.ir.expr import Access, DTypeRef, Opaque, OpaqueArg, TensorRef
from fusekit.ir.graph import Graph
from fusekit.ir.interpret import interpret
from fusekit.ir.lowering import RULES, Builder, Out, Unsupported, V
from fusekit.ir.op import Op
from fusekit.ir.tensor import Format

if TYPE_CHECKING:
    import torch
    from torch import fx

# torch is imported inside the functions that trace: fusekit.ir imports this module and must not
# load torch (tests/ir/test_ir_lean_import.py).

log = logging.getLogger(__name__)

#: ATen ops whose operands may be sparse (the left operand of a matmul).
SPARSE_OK = frozenset({"matmul", "mm", "_sparse_mm"})
#: Nodes that only assert and produce nothing the graph uses.
_SKIPPED = frozenset(
    {"_assert_tensor_metadata", "_assert_scalar", "_assert_async", "sym_constrain_range_for_size"}
)
#: Keyword arguments an opaque op is captured without: defaults that only say how memory is
#: laid out or copied. ``device`` is kept: a factory op (``arange``) or a copy (``_to_copy``)
#: must place its result where eager does, whatever device the capture ran on.
_DROPPED_KWARGS = frozenset({"layout", "pin_memory", "memory_format", "non_blocking"})
_VIEWS = frozenset(
    {
        "view",
        "reshape",
        "_unsafe_view",
        "permute",
        "transpose",
        "t",
        "expand",
        "slice",
        "select",
        "unsqueeze",
        "squeeze",
        "flatten",
        "unflatten",
        "narrow",
        "alias",
        "as_strided",
        "split",
        "chunk",
        "unbind",
        "split_with_sizes",
    }
)


class CaptureError(FusekitError, ValueError):
    """A module cannot be captured: the message names the op and the source line."""


@dataclass(frozen=True, slots=True)
class Capture:
    """A captured module: its graph and the values of its params.

    Attributes:
        graph: the IR graph; ``graph.inputs`` are the module's tensor arguments, flattened.
        constants: the value of every param (weights, buffers, constants made at capture).
        method: ``"export"``, ``"fx"`` (the tracer that produced the graph) or ``"aten"`` (an
            ATen graph given as it is, :func:`capture_graph`).
        strides: the strides the traced graph's values had, by tensor name, where it recorded
            them (a hint: a tensor at run time may have others).
    """

    graph: Graph
    constants: Mapping[str, torch.Tensor]
    method: str
    strides: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def values(self, *args: Any) -> dict[str, torch.Tensor]:
        """Bind the module's arguments and the params to the graph's names.

        Raises:
            ValueError: if the number of tensor arguments differs from the graph's inputs.
        """
        import torch

        inputs = self.graph.inputs
        if len(args) == len(inputs) and all(isinstance(a, torch.Tensor) for a in args):
            # every argument a tensor: no argument tree to flatten (a dozen microseconds a call)
            return {**dict(zip(inputs, args, strict=True)), **self.constants}
        from torch.utils._pytree import tree_leaves

        leaves = [x for x in tree_leaves(args) if isinstance(x, torch.Tensor)]
        if len(leaves) != len(self.graph.inputs):
            raise ValueError(
                expected("Capture", "args", f"{len(self.graph.inputs)} tensors", len(leaves))
            )
        return {**dict(zip(self.graph.inputs, leaves, strict=True)), **self.constants}

    def run(self, *args: Any) -> tuple[torch.Tensor, ...]:
        """Interpret the graph on the module's arguments.

        Returns:
            The module's outputs, flattened to a tuple.
        """
        out = interpret(self.graph, self.values(*args))
        return tuple(out[name] for name in self.graph.outputs)


def capture(
    model: torch.nn.Module,
    args: Sequence[Any],
    *,
    method: Literal["auto", "export", "fx"] = "auto",
    name: str | None = None,
) -> Capture:
    """Capture ``model`` called on ``args`` into an IR graph.

    Args:
        model: the module (put it in ``eval()`` mode: dropout must not be random).
        args: example arguments; shapes are specialised to them.
        method: ``"export"`` (torch.export only), ``"fx"`` (symbolic tracing only) or ``"auto"``
            (export, falling back to fx tracing).
        name: the graph's name; the module's class name by default.

    Returns:
        The graph and the values of its params.

    Raises:
        CaptureError: for data-dependent control flow, dropout in training mode, mutation of
            inputs or buffers, a sparse operand outside a matmul, or a failure of both tracers.
    """
    import torch

    name = name or type(model).__name__
    args = tuple(args)
    if method in ("auto", "export"):
        try:
            ep = torch.export.export(model, args)
        except Exception as e:
            dependent = _data_dependent(e)
            if dependent is not None or method == "export":
                raise CaptureError(
                    dependent or f"capture: torch.export failed: {_first_line(e)}"
                ) from e
            log.info("torch.export failed (%s); falling back to torch.fx", _first_line(e))
            try:
                return _from_fx(model, args, name)
            except CaptureError as fx_error:
                raise CaptureError(
                    f"capture: torch.export failed ({_first_line(e)}) and so did torch.fx: "
                    f"{str(fx_error).removeprefix('capture: ')}"
                ) from e
        return _from_export(ep, args, name)
    if method != "fx":
        raise ValueError(expected("capture", "method", "'auto', 'export' or 'fx'", method))
    return _from_fx(model, args, name)


def capture_graph(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, name: str = "graph"
) -> Capture:
    """Capture an ATen-level FX graph, such as AOTAutograd hands a compiler.

    Every placeholder is an input, bound to the example input at its position; ``get_attr``
    nodes are params. The graph's outputs must all be tensors.

    Raises:
        CaptureError: as :func:`capture` (symbolic sizes, unsupported nodes, ...).
    """
    inputs = iter(example_inputs)

    def source(node: fx.Node) -> tuple[str, Any]:
        if node.op == "placeholder":
            return "input", next(inputs, None)
        return "param", fold(getattr, str(node.target).split("."), gm)

    strides: dict[str, tuple[int, ...]] = {}
    graph, constants = _walk(gm.graph, source, name, strides)
    return Capture(graph, constants, "aten", strides)


# -- tracers -----------------------------------------------------------------------------------
def _from_export(ep: Any, args: tuple[Any, ...], name: str) -> Capture:
    import torch
    from torch.export.graph_signature import InputKind, OutputKind, TensorArgument
    from torch.utils._pytree import tree_leaves

    for spec in ep.graph_signature.output_specs:
        if spec.kind != OutputKind.USER_OUTPUT:
            raise CaptureError(
                f"capture: the model mutates {spec.target or spec.arg.name!r} "
                f"({spec.kind.name.lower()}); capture a model without side effects"
            )
    user = iter(x for x in tree_leaves(args) if isinstance(x, torch.Tensor))
    sources: dict[str, tuple[str, Any]] = {}
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            is_tensor = isinstance(spec.arg, TensorArgument)
            value = next(user, None) if is_tensor else getattr(spec.arg, "value", None)
            sources[spec.arg.name] = ("input", value)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            table = ep.state_dict if spec.target in ep.state_dict else ep.constants
            sources[spec.arg.name] = ("param", table[spec.target])
        else:
            raise CaptureError(f"capture: unsupported input {spec.arg.name!r} ({spec.kind.name})")
    graph, constants = _walk(ep.graph_module.graph, lambda node: sources[node.name], name)
    return Capture(graph, constants, "export")


def _from_fx(model: torch.nn.Module, args: tuple[Any, ...], name: str) -> Capture:
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils._pytree import tree_leaves

    try:
        gm = torch.fx.symbolic_trace(model)
    except Exception as e:
        raise CaptureError(
            f"capture: torch.fx cannot trace {name} at {_user_frame(e)}: {_first_line(e)}"
        ) from e
    try:
        traced = make_fx(gm, pre_dispatch=True)(*args)
    except Exception as e:
        raise CaptureError(f"capture: tracing {name} to ATen failed: {_first_line(e)}") from e
    leaves = iter(tree_leaves(args))  # make_fx makes one placeholder per leaf

    def source(node: fx.Node) -> tuple[str, Any]:
        if node.op == "placeholder":
            return "input", next(leaves, None)
        return "param", fold(getattr, str(node.target).split("."), traced)

    graph, constants = _walk(traced.graph, source, name)
    return Capture(graph, constants, "fx")


# -- the walk ----------------------------------------------------------------------------------
def _walk(
    graph: fx.Graph,
    source: Callable[[fx.Node], tuple[str, Any]],
    name: str,
    strides: dict[str, tuple[int, ...]] | None = None,
) -> tuple[Graph, dict[str, torch.Tensor]]:
    """The graph and its params.

    ``strides``, when given, receives each tensor's traced strides (the ``val`` of its node;
    an input's from its example value).
    """
    import torch

    b = Builder()
    env: dict[fx.Node, Any] = {}
    inputs: list[str] = []
    params: list[str] = []
    outputs: list[str] = []
    for node in graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            role, value = source(node)
            if value is None or isinstance(value, bool | int | float | str):
                env[node] = value  # a non-tensor argument, specialised by the tracer
                continue
            if not isinstance(value, torch.Tensor):
                raise CaptureError(expected("capture", node.name, "a tensor", type(value).__name__))
            fmt, nnz = _format(value)
            v = b.declare(b.fresh(node.name), tuple(value.shape), _dtype(value.dtype), fmt, nnz)
            (inputs if role == "input" else params).append(v.name)
            if role == "param":
                b.constants[v.name] = value
            env[node] = v
            if strides is not None:
                _note_strides(strides, v, value)
        elif node.op == "call_function":
            env[node] = _lower(b, node, env)
            if strides is not None:
                _note_strides(strides, env[node], node.meta.get("val"))
        elif node.op == "output":
            for out in _flatten(node.args[0]):
                value = env.get(out) if hasattr(out, "op") else out
                if not isinstance(value, V):
                    raise CaptureError(
                        expected("capture", "outputs", "tensors", type(out).__name__)
                    )
                outputs.append(value.name)
        else:
            raise CaptureError(
                f"capture: unexpected {node.op} node {node.name!r} in the ATen graph"
            )
    params += [c for c in b.constants if c not in params]
    return _prune(b, inputs, params, outputs, name)


def _note_strides(strides: dict[str, tuple[int, ...]], value: Any, val: Any) -> None:
    """Record the strides of a node's ``val`` under the names of what it lowered to.

    ``val``: a traced value or a tuple of them; ``value``: a tensor, or a tuple of tensors
    and ``None``. A name recorded before (an op the lowering reused) keeps its strides.
    """
    import torch

    pairs = (
        zip(value, val, strict=False)
        if isinstance(value, tuple) and isinstance(val, list | tuple)
        else [(value, val)]
    )
    for v, t in pairs:
        if isinstance(v, V) and isinstance(t, torch.Tensor) and v.name not in strides:
            try:
                strides[v.name] = tuple(int(s) for s in t.stride())
            except (TypeError, RuntimeError):  # symbolic, or a layout without strides
                continue


def _lower(b: Builder, node: fx.Node, env: dict[fx.Node, Any]) -> Any:
    import torch
    from torch.fx.node import map_arg

    if node.target is operator.getitem:
        return env[node.args[0]][node.args[1]]  # type: ignore[index]
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        raise CaptureError(f"capture: unsupported call {target!r} at {_where(node)}")
    packet = target._overloadpacket.__name__
    if packet in _SKIPPED:
        return None
    base = packet[:-1] if packet.endswith("_") and not packet.endswith("__") else packet
    args = map_arg(node.args, lambda n: env[n])
    kwargs = map_arg(node.kwargs, lambda n: env[n])
    val = node.meta.get("val")
    vals = list(val) if isinstance(val, list | tuple) else [val]
    for v in vals:
        dynamic = [d for d in getattr(v, "shape", ()) if not isinstance(d, int)]
        if dynamic:
            raise CaptureError(
                f"capture: {target} at {_where(node)}: its output size {dynamic[0]} depends on "
                "tensor values; fusekit captures static shapes"
            )
    metas = tuple(
        (tuple(int(s) for s in v.shape), _dtype(v.dtype))
        if isinstance(v, torch.Tensor)
        else ((), "")
        for v in vals
    )
    out = Out(base, b.fresh(node.name.replace(packet, base, 1)), metas)
    b.origin = f"{target} ({_where(node)})"
    tensors = [a for a in _flatten((args, kwargs)) if isinstance(a, V)]
    sparse = [a.name for a in tensors if b.tensors[a.name].is_sparse]
    left_2d = bool(sparse) and sparse == [tensors[0].name] and tensors[0].rank == 2
    if sparse and (base not in SPARSE_OK or not left_2d or len(tensors) != 2):
        raise CaptureError(
            f"capture: {target} at {_where(node)}: sparse operand {sparse[0]!r} is "
            "supported only as the left operand of a 2-D matmul"
        )

    def keep_opaque(k: int) -> V:
        return _opaque(b, str(target), args, kwargs, out, k, isinstance(val, list | tuple))

    b.opaque_output = keep_opaque
    rule = RULES.get(base)
    try:
        if rule is None:
            raise Unsupported("no lowering rule")
        result = rule(b, out, *args, **kwargs)
    except (Unsupported, TypeError) as e:  # TypeError: an overload the rule does not take
        log.info("capture: keeping %s opaque: %s", target, e)
        # one entry per output position (None where it is no tensor: convolution_backward's
        # output_mask), so that getitem k finds output k
        outs = tuple(keep_opaque(k) if metas[k][1] else None for k in range(len(metas)))
        result = outs if isinstance(val, list | tuple) else outs[0]
    except ValueError as e:
        raise CaptureError(f"capture: {target} at {_where(node)}: {e}") from e
    if base != packet:  # in place: later reads of the mutated node see the result
        mutated = node.args[0]
        producer = getattr(mutated, "target", None)
        if getattr(mutated, "op", "") in ("placeholder", "get_attr"):
            raise CaptureError(f"capture: {target} at {_where(node)} mutates an input or buffer")
        if (
            isinstance(producer, torch._ops.OpOverload)
            and producer._overloadpacket.__name__ in _VIEWS
        ):
            raise CaptureError(f"capture: {target} at {_where(node)} mutates a view")
        env[mutated] = result  # type: ignore[index]
    return result


def _opaque(
    b: Builder, target: str, args: Any, kwargs: Mapping[str, Any], out: Any, k: int, is_tuple: bool
) -> V:
    shape, dtype = out.metas[k]
    if not dtype:
        raise CaptureError(f"capture: {target}: output {k} is not a tensor")
    oargs = tuple(_literal(a, target) for a in args)
    okw = tuple(
        sorted(
            (key, _literal(v, target)) for key, v in kwargs.items() if key not in _DROPPED_KWARGS
        )
    )
    name = b.fresh(out.name if k == 0 else f"{out.name}_{k}")
    b.ops.append(
        Op(Access(name), Opaque(target, oargs, okw, k if is_tuple else None), origin=b.origin)
    )
    return b.declare(name, shape, dtype)


def _literal(arg: Any, target: str) -> OpaqueArg:
    import torch

    if isinstance(arg, V):
        return TensorRef(arg.name)
    if isinstance(arg, list | tuple):
        return tuple(_literal(a, target) for a in arg)
    if isinstance(arg, torch.dtype):
        return DTypeRef(_dtype(arg))
    if isinstance(arg, torch.device):
        return str(arg)
    if arg is None or isinstance(arg, bool | int | float | str):
        return arg
    raise CaptureError(f"capture: {target}: argument {arg!r} cannot be kept in an opaque op")


def _prune(
    b: Builder, inputs: list[str], params: list[str], outputs: list[str], name: str
) -> tuple[Graph, dict[str, torch.Tensor]]:
    producers = {op.name: op for op in b.ops}
    live: set[str] = set()
    stack = list(outputs)
    while stack:
        tensor = stack.pop()
        if tensor in live:
            continue
        live.add(tensor)
        if tensor in producers:
            stack.extend(producers[tensor].inputs)
    ops = tuple(op for op in b.ops if op.name in live)
    kept_params = [p for p in params if p in live]
    names = [*inputs, *kept_params, *(op.name for op in ops)]
    graph = Graph(
        tuple(b.tensors[n] for n in names),
        ops,
        tuple(inputs),
        tuple(kept_params),
        tuple(outputs),
        name,
    )
    return graph, {p: b.constants[p] for p in kept_params}


# -- helpers -----------------------------------------------------------------------------------
def _dtype(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _format(value: torch.Tensor) -> tuple[Format, int | None]:
    import torch

    if value.layout == torch.sparse_coo:
        return Format.coo(value.dim()), int(value._nnz())
    if value.layout == torch.sparse_csr:
        return Format.csr(), int(value.values().numel())
    if value.layout == torch.sparse_csc:
        return Format.csc(), int(value.values().numel())
    if value.layout != torch.strided:
        raise CaptureError(
            expected("capture", "tensor layout", "strided, COO, CSR or CSC", value.layout)
        )
    return Format.dense(value.dim()), None


def _flatten(tree: Any) -> list[Any]:
    if isinstance(tree, list | tuple):
        return [leaf for item in tree for leaf in _flatten(item)]
    if isinstance(tree, dict):
        return _flatten(list(tree.values()))
    return [tree]


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


def _where(node: fx.Node) -> str:
    """``file.py:12 in forward: code`` from a node's stack trace (``?`` when unknown)."""
    frames = _FRAME.findall(node.meta.get("stack_trace") or "")
    if not frames:
        return f"node {node.name}"
    path, line, func, code = frames[-1]
    return f"{os.path.basename(path)}:{line} in {func}: `{code.strip()}`"


def _user_frame(e: BaseException) -> str:
    """The innermost traceback frame outside torch, as ``file.py:12 in forward: code``."""
    import torch

    root = os.path.dirname(torch.__file__)
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith(root)]
    if not frames:
        return "an unknown line"
    f = frames[-1]
    return f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}: `{(f.line or '').strip()}`"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _data_dependent(e: BaseException) -> str | None:
    """A one-line message if ``e`` is torch.export meeting data-dependent control flow."""
    text = str(e)
    if "data-dependent" not in text and "GuardOnDataDependent" not in type(e).__name__:
        return None
    frames = _FRAME.findall(text.split("The following call raised this error:")[-1])
    where = _user_frame(e)
    if frames:
        path, line, func, code = frames[0]
        where = f"{os.path.basename(path)}:{line} in {func}: `{code.strip()}`"
    partial = str(getattr(e, "partial_fx_graph", "") or "")
    ops = re.findall(r"torch\.ops\.(aten\.\w+\.\w+)", partial + text)
    op = ops[-1] if ops else "an op"
    return (
        f"capture: data-dependent Python control flow at {where}: {op} turns a tensor value "
        "into a Python value that decides the trace; use torch.where or torch.cond"
    )
