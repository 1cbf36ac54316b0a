"""Op classification for fusion planning: what each op does to memory and iteration spaces.

FusionStitching (arXiv 1911.11576, section 3) plans over memory-intensive ops and treats the
compute-intensive ones as boundaries. The classes, read from an op's index expression::

    elementwise   Y[i,j] = f(A[i,j], B[i,j])           every read covers the output's variables
    broadcast     Y[i,j] = A[i,j] - m[i]               some read misses an output variable
    row_reduce    m[i]   = sum_j A[i,j]                reduces the innermost variables of its input
    col_reduce    c[j]   = sum_i A[i,j]                reduces an outer variable, keeps inner ones
    gemm          Y[b,i,j] = sum_k A[b,i,k] * B[b,k,j] contraction (fine-grained GEMM/BMM)
    layout        Y[i,j] = A[j,i]                      moves elements, no arithmetic
    opaque        gather, scatter, opaque              never fused

*Dominant* ops seed the fusion groups: reductions, and expensive elementwise ops (exp, erf,
tanh, division, ...) whose result is broadcast or reduced by a consumer.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from fusekit.ir.expr import Access, Call, IVar, Reduce, walk
from fusekit.ir.graph import Graph
from fusekit.ir.op import Op, OpKind

#: Functions whose cost makes the op worth keeping in registers (not recomputing).
EXPENSIVE = frozenset({"exp", "log", "log1p", "expm1", "tanh", "sigmoid", "gelu", "gelu_tanh",
                       "silu", "erf", "sqrt", "rsqrt", "pow", "recip"})  # fmt: skip


class OpClass(StrEnum):
    """The stitch classes of an op."""

    ELEMENTWISE = "elementwise"
    BROADCAST = "broadcast"
    ROW_REDUCE = "row_reduce"
    COL_REDUCE = "col_reduce"
    GEMM = "gemm"
    LAYOUT = "layout"
    OPAQUE = "opaque"


#: Classes a fused (stitched) kernel may contain.
FUSABLE = frozenset(
    {
        OpClass.ELEMENTWISE,
        OpClass.BROADCAST,
        OpClass.ROW_REDUCE,
        OpClass.COL_REDUCE,
        OpClass.LAYOUT,
    }
)


def _reduce_class(op: Op) -> OpClass:
    """Row reduction when the reduced variables index the innermost dims of every read."""
    reduces = [n for n in walk(op.expr) if isinstance(n, Reduce)]
    bound = {v for r in reduces for v in r.vars} | op.summed_vars
    for node in walk(op.expr):
        if not isinstance(node, Access) or not node.indices:
            continue
        names = [t.name if isinstance(t, IVar) else "" for t in node.indices]
        inner = [n for n in names if n in bound]
        if inner and set(names[-len(inner) :]) != set(inner):
            return OpClass.COL_REDUCE
    return OpClass.ROW_REDUCE


def classify(graph: Graph, name: str) -> OpClass:
    """The :class:`OpClass` of op ``name``.

    Args:
        graph: the op's graph (a plain read of another dtype is a cast: elementwise, not layout).
        name: the op.

    Returns:
        Its class (see the module docstring).
    """
    op = graph.op(name)
    kind = op.kind
    if kind in (OpKind.OPAQUE, OpKind.GATHER, OpKind.SCATTER):
        return OpClass.OPAQUE
    if kind is OpKind.CONTRACTION:
        return OpClass.GEMM
    if kind is OpKind.REDUCE:
        return OpClass.OPAQUE if op.accumulate else _reduce_class(op)
    if graph.moves_only(name):
        return OpClass.LAYOUT
    out = op.out_vars
    for node in walk(op.expr):
        if isinstance(node, Access) and {t.name for t in node.indices if isinstance(t, IVar)} < out:
            return OpClass.BROADCAST
    return OpClass.ELEMENTWISE


def layout_only(graph: Graph, ops: Iterable[str]) -> bool:
    """Whether every op of ``ops`` only moves elements (a group that runs as strided views)."""
    return all(classify(graph, o) is OpClass.LAYOUT for o in ops)


def classify_graph(graph: Graph) -> dict[str, OpClass]:
    """The class of every op of ``graph``, by op name."""
    return {op.name: classify(graph, op.name) for op in graph.ops}


def dominant_ops(graph: Graph) -> list[str]:
    """Seeds of candidate groups, in topological order.

    Dominant: reductions (row or column), expensive elementwise ops whose output some consumer
    broadcasts or reduces, and the last fusable op of a chain (an op no fusable op reads, so that
    a chain without reductions, such as bias + GELU, still gets a seed), also where views follow
    it (the last computed op: a group across a reshape may not be one kernel, the chain before
    it is).
    """
    classes = classify_graph(graph)
    seeds = []
    for op in graph.ops:
        cls = classes[op.name]
        if cls in (OpClass.ROW_REDUCE, OpClass.COL_REDUCE):
            seeds.append(op.name)
        elif cls in (OpClass.ELEMENTWISE, OpClass.BROADCAST) and any(
            isinstance(n, Call) and n.fn in EXPENSIVE for n in walk(op.expr)
        ):
            consumers = graph.successors(op.name)
            if any(classes[c] not in (OpClass.ELEMENTWISE, OpClass.LAYOUT) for c in consumers):
                seeds.append(op.name)
                continue
        if cls not in FUSABLE:
            continue
        last = not any(classes[c] in FUSABLE for c in graph.successors(op.name))
        last_computed = cls is not OpClass.LAYOUT and not any(
            classes[c] in FUSABLE for c in _through_layout(graph, classes, op.name)
        )
        if last or last_computed:
            seeds.append(op.name)
    return seeds


def _through_layout(graph: Graph, classes: dict[str, OpClass], name: str) -> list[str]:
    """The ops that consume ``name``, looking through layout ops (views of it) to their readers."""
    found: list[str] = []
    stack = list(graph.successors(name))
    while stack:
        c = stack.pop()
        if classes[c] is OpClass.LAYOUT:
            stack.extend(graph.successors(c))
        else:
            found.append(c)
    return found
