"""Pattern matchers over captured graphs.

A gather-matmul-scatter (g-mm-s) chain computes, for pairs ``e``::

    Y[d[e],m] += X[g[e],k] * W[s[e],k,m]

In a captured graph it shows up as a gather of rows of an activation ``X`` (``index_select``,
``embedding``, advanced indexing), one or more contractions with weights (``bmm`` with a batch of
per-expert weights, or weights gathered per pair by a relation or expert index ``s``), maps in
between (activations, scaling, reshapes), and a scatter into ``Y`` (``index_add``,
``scatter_add``, ``index_put(accumulate=True)``). :func:`find_gms_chains` finds them: for each
scatter and each gather of a non-parameter tensor upstream of it, the ops on the paths between
the two must be maps and contractions, at least one a contraction.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusekit.ir.expr import Access, Opaque, term_accesses, walk
from fusekit.ir.graph import Graph
from fusekit.ir.op import Op, OpKind
from fusekit.ir.tensor import Dim


@dataclass(frozen=True, slots=True)
class Weight:
    """A weight read by a chain's contraction.

    Attributes:
        tensor: the param (or, when no param is found, the tensor the contraction reads).
        shape: its shape.
        index: the index tensor selecting a weight per pair (``s`` in ``W[s[e],k,m]``), if any.
    """

    tensor: str
    shape: tuple[Dim, ...]
    index: str | None = None


@dataclass(frozen=True, slots=True)
class GmsChain:
    """One gather -> matmul -> scatter chain.

    Attributes:
        gather: the op gathering rows of ``source``.
        source: the gathered tensor ``X``.
        source_shape: its shape.
        gather_index: the index tensor ``g``.
        pairs: the number of gathered rows (elements of ``g``).
        matmuls: the contraction ops, in topological order.
        weights: the weights of those contractions.
        scales: other tensors the chain's maps read (a per-pair scale ``c[e]``, a gate).
        scatter: the scatter op.
        scatter_index: the index tensor ``d``.
        target_shape: the shape of the scattered output ``Y``.
        ops: every op of the chain, in topological order.
    """

    gather: str
    source: str
    source_shape: tuple[Dim, ...]
    gather_index: str
    pairs: Dim
    matmuls: tuple[str, ...]
    weights: tuple[Weight, ...]
    scales: tuple[str, ...]
    scatter: str
    scatter_index: str
    target_shape: tuple[Dim, ...]
    ops: tuple[str, ...]

    def describe(self) -> str:
        """One line: ``x[64,16] --g[256]--> bmm(W[4,16,16] by s) --d--> [64,16]``."""
        weights = ", ".join(
            f"{w.tensor}{list(w.shape)}" + (f" by {w.index}" if w.index else "")
            for w in self.weights
        )
        return (
            f"{self.source}{list(self.source_shape)} --{self.gather_index}[{self.pairs}]--> "
            f"{len(self.matmuls)} matmul(s) with {weights} --{self.scatter_index}--> "
            f"{self.scatter}{list(self.target_shape)}"
        )


def _indirect(op: Op) -> tuple[str, str] | None:
    """(gathered tensor, index tensor) of the first indirect read of ``op``."""
    if isinstance(op.expr, Opaque):
        return None
    for node in walk(op.expr):
        if isinstance(node, Access) and node.is_indirect:
            index = next(a for t in node.indices for a in term_accesses(t))
            return node.tensor, index.tensor
    return None


def _weight(graph: Graph, tensor: str) -> Weight:
    """Follow layout ops back from a contraction operand to a param or a gathered param."""
    current = tensor
    while (op := graph.producer(current)) is not None:
        if op.kind is OpKind.GATHER:
            found = _indirect(op)
            if found is not None and found[0] in graph.params:
                return Weight(found[0], graph.tensor(found[0]).shape, found[1])
            break
        if not graph.moves_only(op.name) or len(op.inputs) != 1:
            break
        current = op.inputs[0]
    if current in graph.params:
        return Weight(current, graph.tensor(current).shape)
    return Weight(tensor, graph.tensor(tensor).shape)


def find_gms_chains(graph: Graph) -> list[GmsChain]:
    """Find the gather -> matmul -> scatter chains of ``graph``.

    Args:
        graph: a captured or hand-built graph.

    Returns:
        One chain per (scatter, gather of a non-parameter tensor) pair joined by maps and at
        least one contraction, in the order of the scatters.
    """
    chains = []
    for scatter in graph.ops:
        if scatter.kind is not OpKind.SCATTER:
            continue
        upstream = graph.ancestors([scatter.name])
        for gather in graph.ops:
            found = _indirect(gather) if gather.name in upstream else None
            if found is None or found[0] in graph.params or gather.kind is not OpKind.GATHER:
                continue
            between = graph.descendants([gather.name]) & upstream
            kinds = {graph.op(n).kind for n in between}
            if OpKind.CONTRACTION not in kinds or kinds - {OpKind.MAP, OpKind.CONTRACTION}:
                continue
            chain = between | {gather.name, scatter.name}
            order = [n for n in graph.topological_order() if n in chain]
            matmuls = [n for n in order if graph.op(n).kind is OpKind.CONTRACTION]
            weights = tuple(
                _weight(graph, side)
                for n in matmuls
                for side in graph.op(n).inputs
                if side not in chain
            )
            scales = tuple(
                dict.fromkeys(
                    side
                    for n in order
                    if graph.op(n).kind is OpKind.MAP
                    for side in graph.op(n).inputs
                    if side not in chain
                )
            )
            d_index = next(a.tensor for t in scatter.out.indices for a in term_accesses(t))
            g_shape = graph.tensor(found[1]).shape
            pairs: Dim = _numel(g_shape)
            chains.append(
                GmsChain(
                    gather=gather.name,
                    source=found[0],
                    source_shape=graph.tensor(found[0]).shape,
                    gather_index=found[1],
                    pairs=pairs,
                    matmuls=tuple(matmuls),
                    weights=weights,
                    scales=scales,
                    scatter=scatter.name,
                    scatter_index=d_index,
                    target_shape=graph.tensor(scatter.name).shape,
                    ops=tuple(order),
                )
            )
    return chains


def _numel(shape: tuple[Dim, ...]) -> Dim:
    if all(isinstance(d, int) for d in shape):
        total = 1
        for d in shape:
            total *= int(d)
        return total
    return "*".join(str(d) for d in shape)
