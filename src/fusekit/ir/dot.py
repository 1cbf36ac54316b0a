"""Graphviz rendering of a graph.

Tensors are ellipses (inputs and params shaded), ops are boxes labelled with their kind and text
form.
"""

from __future__ import annotations

from fusekit.ir.graph import Graph
from fusekit.ir.op import format_op

_COLORS = {
    "contraction": "#f4a261",
    "map": "#e9f5db",
    "reduce": "#a8dadc",
    "gather": "#cdb4db",
    "scatter": "#ffafcc",
    "opaque": "#bbbbbb",
}


def _quote(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return '"' + escaped + '"'


def to_dot(graph: Graph) -> str:
    """The graph in Graphviz ``dot`` syntax.

    Args:
        graph: the graph to draw.

    Returns:
        A ``digraph`` whose op nodes are ``op:<name>`` and tensor nodes ``<name>``.
    """
    lines = [f"digraph {_quote(graph.name)} {{", "  rankdir=TB;", '  node [fontname="monospace"];']
    for name in (*graph.inputs, *graph.params):
        t = graph.tensor(name)
        label = f"{name}\n{t.dtype}{list(t.shape)}"
        fill = "#fff3b0" if name in graph.inputs else "#eeeeee"
        style = f'shape=ellipse, style=filled, fillcolor="{fill}"'
        lines.append(f"  {_quote(name)} [{style}, label={_quote(label)}];")
    for op in graph.ops:
        t = graph.tensor(op.name)
        label = f"{op.kind.value}: {format_op(op)}\n{t.dtype}{list(t.shape)}"
        color = _COLORS[op.kind.value]
        style = f'shape=box, style=filled, fillcolor="{color}"'
        lines.append(f"  {_quote('op:' + op.name)} [{style}, label={_quote(label)}];")
        for src in op.inputs:
            node = src if graph.producer(src) is None else "op:" + src
            lines.append(f"  {_quote(node)} -> {_quote('op:' + op.name)};")
    for i, name in enumerate(graph.outputs):
        node = name if graph.producer(name) is None else "op:" + name
        lines.append(
            f"  {_quote('out' + str(i))} [shape=plaintext, label={_quote('output ' + name)}];"
        )
        lines.append(f"  {_quote(node)} -> {_quote('out' + str(i))};")
    lines.append("}")
    return "\n".join(lines) + "\n"
