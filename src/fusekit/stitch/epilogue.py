"""GEMM epilogues: the addend of a contraction split off, so the planner can stitch it.

A linear layer lowers to one op, its bias add inside the contraction::

    Y[i,j] = b[j] + sum_k A[i,k] * W[j,k]

Run as one ATen call (``addmm``), that writes ``Y`` once and the memory-bound op reading it
(GELU, a residual add before LayerNorm) reads it again. Split, the add is an element-wise op
that the planner may stitch into that consumer, which then reads the product instead of ``Y``::

    Y_mm[i,j] = sum_k A[i,k] * W[j,k]          (ATen mm)
    Y[i,j]    = b[j] + Y_mm[i,j]               (element-wise: fusable)

Where the plan leaves such an add alone, the runner puts the pair back into one ``addmm``
(:func:`merged_addend`), so the split never costs a pass over ``Y``.
"""

from __future__ import annotations

from dataclasses import replace

from fusekit.ir.expr import Access, Bin, Reduce, ReduceOp
from fusekit.ir.graph import Graph
from fusekit.ir.op import Op, OpKind
from fusekit.ir.tensor import Format, Tensor


def _addend_and_product(op: Op) -> tuple[Access, Reduce, bool] | None:
    """``(C, sum(A*B), C_first)`` of ``Y = C + sum_r A*B`` (either order), else ``None``."""
    expr = op.expr
    if op.accumulate or not isinstance(expr, Bin) or expr.op != "+":
        return None
    for addend, product, first in ((expr.left, expr.right, True), (expr.right, expr.left, False)):
        if (
            isinstance(addend, Access) and addend.is_plain and isinstance(product, Reduce)
            and product.op is ReduceOp.SUM and isinstance(product.body, Bin)
            and product.body.op == "*"
        ):  # fmt: skip
            return addend, product, first
    return None


def split_epilogues(graph: Graph) -> Graph:
    """``graph`` with every ``Y = C + sum_r A*B`` split into a contraction and an add.

    The product is named ``<Y>_mm`` (made unique); ``Y`` keeps its name, shape and readers.
    A graph with no such op is returned as it is.
    """
    taken = {t.name for t in graph.tensors}
    tensors, ops = list(graph.tensors), []
    for op in graph.ops:
        parts = _addend_and_product(op) if op.kind is OpKind.CONTRACTION else None
        if parts is None or not op.out.is_plain:
            ops.append(op)
            continue
        addend, product, first = parts
        name, k = f"{op.name}_mm", 1
        while name in taken:
            name, k = f"{op.name}_mm{k}", k + 1
        taken.add(name)
        out = graph.tensor(op.name)
        tensors.append(Tensor(name, out.shape, out.dtype, Format.dense(len(out.shape))))
        mm_out = Access(name, op.out.indices)
        ops.append(Op(mm_out, product, origin=op.origin))
        add = Bin("+", addend, mm_out) if first else Bin("+", mm_out, addend)
        ops.append(Op(op.out, add, origin=op.origin))
    if len(ops) == len(graph.ops):
        return graph
    return replace(graph, tensors=tuple(tensors), ops=tuple(ops))


def merged_addend(graph: Graph, gemm: str, add: str) -> Op | None:
    """The op ``Y = C + sum_r A*B`` that the contraction ``gemm`` and the add ``add`` make.

    ``None`` unless ``add`` is ``C + gemm`` (either order) reading ``gemm`` where it was written,
    ``add`` is the only reader of ``gemm``'s output and the graph does not return it.
    """
    g, a = graph.op(gemm), graph.op(add)
    if g.kind is not OpKind.CONTRACTION or g.accumulate or not g.out.is_plain:
        return None
    if graph.consumers(gemm) != (a,) or gemm in graph.outputs or a.accumulate:
        return None
    expr = a.expr
    if not isinstance(expr, Bin) or expr.op != "+":
        return None
    for mine, other, first in ((expr.left, expr.right, True), (expr.right, expr.left, False)):
        if (
            mine == Access(gemm, a.out.indices) and g.out.indices == a.out.indices
            and isinstance(other, Access) and other.is_plain and other.tensor != gemm
        ):  # fmt: skip
            both = Bin("+", g.expr, other) if first else Bin("+", other, g.expr)
            return Op(a.out, both, origin=a.origin)
    return None


def epilogue_gemm(graph: Graph, add: str) -> str | None:
    """The contraction whose epilogue ``add`` is (:func:`merged_addend` of the two), else ``None``.

    Such an add, left alone by the plan, runs inside the contraction's ATen call.
    """
    for name in graph.predecessors(add):
        if merged_addend(graph, name, add) is not None:
            return name
    return None
