"""Constant folding: small values a graph computes from its params alone, computed once.

An optimizer step computes the weight of each ``lerp`` from a ``full`` (``where(|w| >= 0.5,
w - 1, w)``), a model its masks and scales from literals: ops that read no input, only params
or nothing. Each would be one more kernel per call. :func:`fold_constants` evaluates them once
by the reference interpreter and makes the values params::

    C = {op : not opaque, not returned, numel(op) <= max_numel, inputs all in params or C}
    F = {op in C : read by an op outside C}                  (the folded values, now params)

Opaque ops (ATen calls: random draws among them) are never folded, and neither are large
values: a kernel computing a mask from its indices reads no memory, the mask as a param would
be read on every call.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from fusekit.ir.expr import Opaque
from fusekit.ir.graph import Graph

if TYPE_CHECKING:
    from fusekit.ir.capture import Capture

#: Largest value (elements) folded into a param.
FOLD_MAX_NUMEL = 4096


def constant_ops(graph: Graph, max_numel: int = FOLD_MAX_NUMEL) -> list[str]:
    """The ops :func:`fold_constants` evaluates (``C`` of the module docstring), in order."""
    known = set(graph.params)
    returned = set(graph.outputs)  # a returned value stays computed: a fresh tensor per call
    out = []
    for op in graph.ops:
        if isinstance(op.expr, Opaque) or op.name in returned:
            continue
        if not all(t in known for t in op.inputs):
            continue
        try:
            size = graph.tensor(op.name).numel()
        except ValueError:  # a symbolic size
            continue
        if size <= max_numel:
            known.add(op.name)
            out.append(op.name)
    return out


def fold_constants(cap: Capture, max_numel: int = FOLD_MAX_NUMEL) -> Capture:
    """``cap`` with its constant ops (module docstring) evaluated and made params."""
    from fusekit.ir.interpret import interpret

    graph = cap.graph
    folded = constant_ops(graph, max_numel)
    if not folded:
        return cap
    sub = graph.subgraph(folded, f"{graph.name}_constants")
    values = interpret(sub, {p: cap.constants[p] for p in (*sub.inputs, *sub.params)})
    gone = set(folded)
    ops = tuple(op for op in graph.ops if op.name not in gone)
    kept = {t for op in ops for t in op.inputs} | set(graph.outputs)
    params = tuple(p for p in (*graph.params, *sub.outputs) if p in kept)
    dropped = gone - set(params)
    tensors = tuple(t for t in graph.tensors if t.name not in dropped)
    new = Graph(tensors, ops, graph.inputs, params, graph.outputs, graph.name)
    constants = {p: cap.constants[p] if p in cap.constants else values[p] for p in params}
    return dataclasses.replace(cap, graph=new, constants=constants)
