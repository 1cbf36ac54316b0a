"""Tour section of ``fusekit.ir``.

Capture every built-in model, check it against eager PyTorch, and show ops in the text form.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from fusekit.ir import OpKind, capture, find_gms_chains, format_op
from fusekit.ir.examples import EXAMPLES
from fusekit.report.document import Section, Table, Text
from fusekit.report.tour import TourOptions

#: Kinds in the order the table lists them.
_KINDS = ("contraction", "map", "reduce", "gather", "scatter", "opaque")


def _max_abs_error(eager: Any, captured: tuple[Any, ...]) -> float:
    expected = [x for x in tree_leaves(eager) if isinstance(x, torch.Tensor)]
    return max(float((e - c).abs().max()) for e, c in zip(expected, captured, strict=True))


def build(options: TourOptions) -> Section:
    """The IR section: one row per built-in model, sample ops, and the g-mm-s chains found."""
    records: list[dict[str, Any]] = []
    samples: list[tuple[str, str, str]] = []
    chain_lines: list[str] = []
    for name, factory in EXAMPLES.items():
        example = factory(options.seed)
        start = time.perf_counter()
        captured = capture(example.module, example.args, name=name)
        capture_s = time.perf_counter() - start
        graph = captured.graph
        with torch.no_grad():
            error = _max_abs_error(example.module(*example.args), captured.run(*example.args))
        kinds = graph.kinds()
        chains = find_gms_chains(graph)
        opaque = [op.expr.target for op in graph.ops if op.kind is OpKind.OPAQUE]  # type: ignore[union-attr]
        records.append(
            {
                "model": name,
                "ops": len(graph.ops),
                **{kind: kinds.get(OpKind(kind), 0) for kind in _KINDS},
                "opaque targets": ", ".join(sorted(set(opaque))) or "-",
                "gms_chains": len(chains),
                "max_abs_error": error,
                "capture_s": round(capture_s, 3),
            }
        )
        shown: set[str] = set()
        for op in graph.ops:
            sparse = any(graph.tensor(t).is_sparse for t in op.inputs)
            label = f"{op.kind.value} (sparse operand)" if sparse else op.kind.value
            if label not in shown:
                shown.add(label)
                samples.append((name, label, format_op(op)))
        chain_lines += [f"{name}: {chain.describe()}" for chain in chains]

    models = Table(
        "Built-in models captured into the IR",
        ("model", "ops", "ops by kind", "opaque ops", "g-mm-s chains", "max |IR - eager|"),
        tuple(
            (
                r["model"],
                r["ops"],
                ", ".join(f"{r[k]} {k}" for k in _KINDS if r[k]),
                r["opaque targets"],
                r["gms_chains"],
                f"{r['max_abs_error']:.1e}",
            )
            for r in records
        ),
        note="Opaque on purpose: aten.topk (expert-choice routing is a selection). The error "
        "compares the interpreter, which evaluates each op from its index expression, with the "
        "module run eagerly.",
    )
    sample_table = Table(
        "The first op of each kind, in the text form",
        ("model", "kind", "op"),
        tuple(samples),
    )
    chains_text = Text(
        "Gather -> matmul -> scatter chains found by the matcher:\n" + "\n".join(chain_lines)
    )
    return Section(
        title="IR: the shared tensor-expression graph",
        summary=(
            "Every part starts from the same graph: torch.export captures a model, each ATen op "
            "becomes index-notation ops (softmax and layer norm split into their reductions and "
            "maps; reshapes become affine index maps; index_select and index_add become indirect "
            "reads and writes), and the interpreter re-runs the graph from those expressions."
        ),
        blocks=(models, sample_table, chains_text),
        records=tuple(records),
    )
