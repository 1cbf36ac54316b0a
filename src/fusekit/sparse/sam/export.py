"""Graphs out: the per-token network of a lowered statement as a SAM graph.

:func:`statement_graph` lowers one statement (:func:`fusekit.sparse.graph.lower_statement`)
and describes every primitive of the network as a SAM node, every channel as an edge, in the
network's order (so :func:`fusekit.sparse.sam.run` rebuilds the same network: the same output
and the same cycles at the same FIFO depth and latency). The graph comment lists the output
first, then the operands, with their stored formats.

Most primitives are SAM blocks. Where fusekit's lowering differs, the graph uses fusekit
extensions, which :mod:`fusekit.sparse.sam.runner` reads:

==============================  ================================================================
node / edge                     meaning
==============================  ================================================================
``type=locate``                 a dense level located by coordinate (``Locator``): inputs a ref
                                edge (or ``root=true``) and a crd edge; ``tensor``, ``mode``,
                                ``index`` as on ``fiberlookup``
``type=iterate``                a dense walk of ``index`` (extent of ``tensor``'s ``mode``)
                                when no operand scans it; its ref input only shapes the fibers
``type=alu,op=<op>``            an ALU other than ``mul``/``add`` (``max``, ``div``, ``relu``,
                                ...): one or two unlabelled val inputs in order
``reduce`` with ``op=max``      a max reduction (SAM's reduce sums)
a ``crd`` edge into ``repeat``  the repeat reads the coordinate stream as its repeat signal
                                (fusekit's lowering has no repeat-signal generator)
==============================  ================================================================

The order-1 accumulator of the lowering (``FiberAccumulator``) is SAM's ``vectorreducer``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from fusekit.errors import expected
from fusekit.sparse.formats import LevelKind, SparseTensor, from_dense, restore
from fusekit.sparse.graph import lower_statement
from fusekit.sparse.program import Program, Statement, reference
from fusekit.sparse.sam.gv import SamEdge, SamGraph, SamNode, write_gv
from fusekit.sparse.schedule import Schedule
from fusekit.sparse.sim.fiber_acc import FiberAccumulator
from fusekit.sparse.sim.primitives import (
    ALU,
    ArrayRead,
    CompressedWriter,
    Intersect,
    Locator,
    Primitive,
    Reduce,
    Repeat,
    Scanner,
    Source,
    Union,
    ValsWriter,
)

_EDGE_TYPE = {"out_crd": "crd", "out_ref": "ref", "out_ref1": "ref", "out_ref2": "ref",
              "out_val": "val"}  # fmt: skip


def sam_format(t: SparseTensor) -> str:
    """A stored tensor's SAM format: ``d``/``s`` per level, then the modes in storage order.

    Raises:
        ValueError: for a level SAM has no letter for (singleton).
    """
    letters = {LevelKind.DENSE: "d", LevelKind.COMPRESSED: "s"}
    if any(lv.kind not in letters for lv in t.levels):
        raise ValueError(expected(f"SAM format of {t.name}", "levels", "dense or compressed",
                                  [lv.kind.value for lv in t.levels]))  # fmt: skip
    return "".join(letters[lv.kind] for lv in t.levels) + "".join(map(str, t.order))


def _stored_format(st: Statement, order: tuple[str, ...], t: SparseTensor, k: int) -> str:
    """The operand's format as the lowering stores it (a dense operand in the dataflow order)."""
    if not t.is_dense:
        return sam_format(t)
    vars_ = st.operands[k].vars
    visit = sorted(range(t.rank), key=lambda d: order.index(vars_[d]))
    return "d" * t.rank + "".join(map(str, visit)) if t.rank else "none"


def statement_graph(
    st: Statement,
    order: tuple[str, ...],
    inputs: Mapping[str, SparseTensor],
) -> tuple[SamGraph, dict[str, np.ndarray]]:
    """The lowered network of one statement as a SAM graph, and its inputs, dense.

    Args:
        st: the statement.
        order: its dataflow order.
        inputs: the stored operands by name.

    Returns:
        The graph, and every operand as a dense array in its logical layout, ready for
        :func:`fusekit.sparse.sam.run`.

    Raises:
        ValueError: for a statement the lowering does not take, two operands of one tensor, or
            a level SAM has no format letter for.
    """
    names = [o.tensor for o in st.operands]
    if len(set(names)) != len(names):
        raise ValueError(expected(f"SAM graph of {st.out}", "operands", "distinct tensors", names))
    net, _ = lower_statement(st, order, dict(inputs))
    prims = [p for p in net.prims if not isinstance(p, Source)]
    ids = {id(p): len(prims) - 1 - k for k, p in enumerate(prims)}
    producer = {id(ch): (p, port) for p in net.prims for port, chs in p.outputs.items()
                for ch in chs}  # fmt: skip
    formats = {o.tensor: _stored_format(st, order, inputs[o.tensor], k)
               for k, o in enumerate(st.operands)}  # fmt: skip
    out_fmt = "s" * len(st.out_vars) + "".join(
        str(st.out_vars.index(v)) for v in order if v in st.out_vars
    )
    formats = {st.out: out_fmt, **formats}

    def tensor_of(p: Primitive) -> tuple[str, str]:
        """``(tensor, index)`` from the lowering's names: ``scan T.v``, ``repeat T.v``."""
        tensor, _, var = p.name.split(" ", 1)[1].rpartition(".")
        return tensor, var

    def mode(tensor: str, var: str) -> str:
        return str(st.operands[names.index(tensor)].vars.index(var))

    def root(p: Primitive) -> bool:
        return any(isinstance(producer[id(ch)][0], Source) for ch in p.inputs.values())

    def joined(p: Primitive, side: str) -> str:
        """The operand tensor a joiner input comes from (its scanner's tensor)."""
        return tensor_of(producer[id(p.inputs[f"in_crd{side}"])][0])[0]

    nodes: list[SamNode] = []
    for p in prims:
        a: dict[str, str] = {}
        if isinstance(p, Scanner) and p.name.startswith("iterate "):
            var = p.name.split(" ", 1)[1]
            tensor = next(o.tensor for o in st.operands if var in o.vars)
            kind, a = "iterate", {"index": var, "tensor": tensor, "mode": mode(tensor, var)}
        elif isinstance(p, Scanner):
            tensor, var = tensor_of(p)
            digits = formats[tensor][len(formats[tensor]) // 2 :]
            letter = formats[tensor][digits.index(mode(tensor, var))]
            fmt = "dense" if letter == "d" else "compressed"
            kind, a = "fiberlookup", {"index": var, "tensor": tensor, "mode": mode(tensor, var),
                                      "format": fmt, "src": "true"}  # fmt: skip
        elif isinstance(p, Locator):
            tensor, var = tensor_of(p)
            kind, a = "locate", {"index": var, "tensor": tensor, "mode": mode(tensor, var)}
        elif isinstance(p, Repeat):
            tensor, var = tensor_of(p)
            kind, a = "repeat", {"index": var, "tensor": tensor}
        elif isinstance(p, Intersect | Union):
            kind = "intersect" if isinstance(p, Intersect) else "union"
            a = {"index": p.name.split(" ", 1)[1]}
        elif isinstance(p, ArrayRead):
            kind, a = "arrayvals", {"tensor": p.name.split(" ", 1)[1]}
        elif isinstance(p, ALU) and p.name == f"alu {st.combine} 0" and st.combine in (
            "mul", "add", "sub"
        ):  # fmt: skip
            kind = "mul" if st.combine == "mul" else "add"
            a = {} if kind == "mul" else {"sub": "1" if st.combine == "sub" else "0"}
        elif isinstance(p, ALU):
            op = st.combine if p.name == f"alu {st.combine} 0" else p.name.split(" ", 1)[1]
            kind, a = "alu", {"op": op}
        elif isinstance(p, Reduce):
            kind, a = "reduce", ({} if p.op == "sum" else {"op": p.op})
        elif isinstance(p, FiberAccumulator):
            kind, a = "vectorreducer", {"accum_index": order[-1]}
        elif isinstance(p, CompressedWriter):
            var = p.name.rpartition(".")[2]
            kind, a = "fiberwrite", {"index": var, "tensor": st.out,
                                     "mode": str(st.out_vars.index(var)),
                                     "format": "compressed", "sink": "true"}  # fmt: skip
        elif isinstance(p, ValsWriter):
            kind, a = "fiberwrite", {"mode": "vals", "tensor": st.out, "sink": "true"}
        else:
            raise ValueError(expected("SAM graph", "primitive", "one the lowering makes", p.name))
        if kind in ("fiberlookup", "repeat", "locate", "iterate") and root(p):
            a["root"] = "true"
        nodes.append(SamNode(ids[id(p)], kind, a))
    edges: list[SamEdge] = []
    for q in prims:
        for port, ch in q.inputs.items():
            p, out = producer[id(ch)]
            if isinstance(p, Source):
                continue
            comment = ""
            if isinstance(q, Intersect | Union) and port[-1] in "12":
                comment = f"in-{joined(q, port[-1])}"
            elif isinstance(p, Intersect | Union) and out in ("out_ref1", "out_ref2"):
                comment = f"out-{joined(p, out[-1])}"
            edges.append(SamEdge(ids[id(p)], ids[id(q)], _EDGE_TYPE[out], comment))
    dense = {n: np.asarray(inputs[n].to_dense()) for n in names}
    return SamGraph(formats, {n.id: n for n in nodes}, tuple(edges)), dense


def write_statement_graph(
    path: Path, st: Statement, order: tuple[str, ...], inputs: Mapping[str, SparseTensor]
) -> SamGraph:
    """Write :func:`statement_graph`'s graph to ``path``; returns it."""
    graph, _ = statement_graph(st, order, inputs)
    path.write_text(write_gv(graph))
    return graph


def write_schedule_graphs(program: Program, schedule: Schedule, directory: Path) -> list[str]:
    """Write every statement of every region as ``region<k>_<statement>.gv`` in ``directory``.

    Each statement is lowered on its own over its stored operands: the program's inputs (re-stored
    as the schedule's storage orders say) and, for tensors an earlier statement writes, the
    reference values stored as CSR (2-D) or dense.

    Returns:
        One line per statement: the file written, or why the lowering does not take it.
    """
    directory.mkdir(parents=True, exist_ok=True)
    values = reference(program)
    storage = {(s, t): o for s, t, o in schedule.storage}
    lines = []
    for k, region in enumerate(schedule.regions):
        for name in region:
            st = program.producer(name)
            assert st is not None
            inputs: dict[str, SparseTensor] = {}
            for o in st.operands:
                t = program.inputs.get(o.tensor)
                if t is None:
                    v = values[o.tensor]
                    t = from_dense(o.tensor, v, "csr" if v.ndim == 2 else "dense")
                if (name, o.tensor) in storage:
                    t = restore(t, storage[(name, o.tensor)])
                inputs[o.tensor] = t
            path = directory / f"region{k}_{name}.gv"
            try:
                write_statement_graph(path, st, schedule.order_of(name), inputs)
                lines.append(f"wrote {path}")
            except ValueError as e:
                lines.append(f"skipped {name}: {e}")
    return lines
