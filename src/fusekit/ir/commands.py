"""`fusekit ir`: list the built-in models and show the captured graph of a model."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from fusekit.ir.dot import to_dot
from fusekit.ir.graph import Graph, format_graph
from fusekit.ir.op import format_op
from fusekit.ir.patterns import find_gms_chains
from fusekit.ir.printer import format_tensor
from fusekit.ir.tensor import Tensor

app = typer.Typer(
    help="The shared IR: capture PyTorch models into index-notation graphs and show them.",
    no_args_is_help=True,
)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON to stdout.")]


def _tensor_record(t: Tensor) -> dict[str, Any]:
    return {
        "name": t.name,
        "dtype": t.dtype,
        "shape": list(t.shape),
        "format": [level.value for level in t.format.levels],
        "nnz": None if t.stats is None else t.stats.nnz,
    }


def graph_record(graph: Graph) -> dict[str, Any]:
    """A JSON-ready description of a graph: tensors, ops with their text form, kind counts.

    Args:
        graph: the graph.

    Returns:
        A dict of plain values.
    """
    return {
        "name": graph.name,
        "inputs": [_tensor_record(graph.tensor(n)) for n in graph.inputs],
        "params": [_tensor_record(graph.tensor(n)) for n in graph.params],
        "outputs": list(graph.outputs),
        "ops": [
            {
                "name": op.name,
                "kind": op.kind.value,
                "text": format_op(op),
                "dtype": graph.tensor(op.name).dtype,
                "shape": list(graph.tensor(op.name).shape),
                "origin": op.origin,
            }
            for op in graph.ops
        ],
        "kinds": {kind.value: count for kind, count in sorted(graph.kinds().items())},
    }


@app.command("list")
def list_models(json_out: JsonFlag = False) -> None:
    """List the built-in example models."""
    from fusekit.ir.examples import EXAMPLES  # imports torch: not at CLI start-up

    examples = [factory(0) for factory in EXAMPLES.values()]
    if json_out:
        records = [
            {"name": ex.name, "description": ex.description, "opaque_on_purpose": dict(ex.opaque)}
            for ex in examples
        ]
        sys.stdout.write(json.dumps(records, indent=2) + "\n")
        return
    table = Table(title="built-in models (fusekit ir show NAME)")
    for column in ("name", "description", "opaque on purpose"):
        table.add_column(column)
    for ex in examples:
        table.add_row(Text(ex.name), Text(ex.description), Text(", ".join(ex.opaque) or "-"))
    Console().print(table)


@app.command("show")
def show(
    model: Annotated[
        str, typer.Argument(help="A built-in model (see `list`) or path/to/file.py:factory.")
    ],
    dot: Annotated[
        Path | None, typer.Option("--dot", help="Write the graph in Graphviz format here.")
    ] = None,
    text: Annotated[
        bool, typer.Option("--text", help="Print the graph's text form instead of a table.")
    ] = False,
    json_out: JsonFlag = False,
) -> None:
    """Capture MODEL and print its graph: one row per op, in index notation."""
    from fusekit.ir.capture import capture  # capture and the examples import torch
    from fusekit.ir.examples import load_model

    example = load_model(model)
    captured = capture(example.module, example.args, name=example.name)
    graph = captured.graph
    chains = find_gms_chains(graph)
    if dot is not None:
        dot.write_text(to_dot(graph))
    if json_out:
        record = {
            "model": example.name,
            "description": example.description,
            "method": captured.method,
            **graph_record(graph),
            "gms_chains": [asdict(chain) for chain in chains],
        }
        sys.stdout.write(json.dumps(record, indent=2) + "\n")
        return
    console = Console()
    if text:
        console.print(format_graph(graph), markup=False, highlight=False)
        return
    kinds = ", ".join(f"{count} {kind.value}" for kind, count in sorted(graph.kinds().items()))
    console.print(f"{example.name}: {example.description}", markup=False)
    console.print(
        f"captured with torch.{captured.method}: {len(graph.ops)} ops ({kinds})", markup=False
    )
    sources = Table(title="inputs and params")
    for column in ("role", "tensor"):
        sources.add_column(column)
    for name in graph.inputs:
        sources.add_row("input", Text(format_tensor(graph.tensor(name))))
    for name in graph.params:
        sources.add_row("param", Text(format_tensor(graph.tensor(name))))
    console.print(sources)
    table = Table(title=Text(f"ops (outputs: {', '.join(graph.outputs)})"))
    for column in ("#", "kind", "type", "op"):
        table.add_column(column, overflow="fold")
    for i, op in enumerate(graph.ops):
        t = graph.tensor(op.name)
        shape = ",".join(str(d) for d in t.shape)
        table.add_row(str(i), op.kind.value, Text(f"{t.dtype}[{shape}]"), Text(format_op(op)))
    console.print(table)
    for chain in chains:
        console.print(f"g-mm-s chain: {chain.describe()}", markup=False)
    if dot is not None:
        console.print(f"wrote {dot}", markup=False)
