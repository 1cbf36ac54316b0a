r"""RGCN in plain torch ops: the reference, and the path TorchScript and torch.export record.

.. math::

    h_{i,r} = \bigoplus_{j \in \mathcal{N}_r(i)} x_j \quad (\oplus \in \{\text{sum}, \text{mean},
    \text{max}, \text{min}\},\ h_{i,r} = 0 \text{ when } \mathcal{N}_r(i) = \emptyset), \qquad
    x'_i = \Theta_{\mathrm{root}}\, x_i + b + \sum_r h_{i,r}\, \Theta_r

PyG's semantics (its relation loop: aggregate the raw ``x_j`` per relation, then transform), in
the aggregate-first order: one scatter of the ``E`` source rows by key ``i R + r`` into
``H[N_dst R, K]``, then one GEMM ``H.view(N_dst, R K) @ W.view(R K, M)`` (an einsum over the
blocks with ``num_blocks``). Featureless inputs gather rows of ``weight[r]`` instead of ``x`` and
sum ``H`` over ``r``. Memory ``O(N_dst R K)``; no index-dependent shapes, no host syncs except
the range checks, which torch.export records as runtime assertions (:func:`check_range`).

Nothing here may use ``from __future__ import annotations``: TorchScript reads these
annotations at runtime.
"""

import torch
from torch import Tensor

#: The reduces of PyG's ``aggr`` that RGCNConv implements ("add" is "sum").
AGGRS: tuple[str, ...] = ("mean", "add", "sum", "max", "min")


@torch.jit.unused
def _check_range_python(t: Tensor, bound: int, where: str, arg: str, what: str) -> None:
    """The eager check, or a runtime assertion when torch.export/compile traces it."""
    if torch.compiler.is_compiling():
        # `.item()` gives an unbacked symbol: torch._check turns it into `_assert_scalar`
        bad = ((t < 0) | (t >= bound)).sum().item()
        torch._check(  # type: ignore[no-untyped-call]
            bad == 0, lambda: f"{where}: expected '{arg}' to be {what} in [0, {bound})"
        )
        return
    if t.numel() and not 0 <= int(t.min()) <= int(t.max()) < bound:
        raise ValueError(
            f"{where}: expected '{arg}' to be {what} in [0, {bound}) "
            f"(got values in [{int(t.min())}, {int(t.max())}])"
        )


def check_range(t: Tensor, bound: int, where: str, arg: str, what: str) -> None:
    """Raise ``ValueError`` unless every value of ``t`` lies in ``[0, bound)``.

    Eager: the house message with the range seen. Under torch.export: a runtime assertion in the
    exported graph. Under TorchScript: a ``ValueError`` raised by the interpreter.
    """
    if torch.jit.is_scripting():  # type: ignore[attr-defined]
        if bool(((t < 0) | (t >= bound)).any()):
            raise ValueError(f"{where}: expected '{arg}' to be {what} in [0, {bound})")
    else:
        _check_range_python(t, bound, where, arg, what)


def _check_graph(edge_index: Tensor, edge_type: Tensor) -> None:
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(
            f"RGCNConv: expected 'edge_index' to be a [2, E] tensor (got shape {edge_index.shape})"
        )
    if edge_index.dtype != torch.int64 and edge_index.dtype != torch.int32:
        raise TypeError(
            f"RGCNConv: expected 'edge_index' to be int64 or int32 (got {edge_index.dtype})"
        )
    if edge_type.dtype != torch.int64 and edge_type.dtype != torch.int32:
        raise TypeError(
            f"RGCNConv: expected 'edge_type' to be int64 or int32 (got {edge_type.dtype})"
        )
    if edge_type.dim() != 1 or edge_type.size(0) != edge_index.size(1):
        raise ValueError(
            f"RGCNConv: expected 'edge_type' to be a [{edge_index.size(1)}] tensor "
            f"(got shape {edge_type.shape})"
        )


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float16 and bfloat16 are computed in float32 (their result is cast back); others as-is."""
    if dtype == torch.float16 or dtype == torch.bfloat16:
        return torch.float32
    return dtype


def relation_weight(weight: Tensor, comp: Tensor | None) -> Tensor:
    """``Theta_r``: ``weight`` itself, or ``comp @ V`` (``[R, K, M]``) with basis decomposition."""
    if comp is None:
        return weight
    bases, k, m = weight.size(0), weight.size(1), weight.size(2)
    return (comp @ weight.reshape(bases, k * m)).view(comp.size(0), k, m)


def scatter_by_key(values: Tensor, key: Tensor, n_keys: int, aggr: str) -> Tensor:
    """``H[u] = reduce_{e: key[e] = u} values[e]`` (``[n_keys, C]``; rows without pairs are 0).

    ``mean`` divides the sum by the count; ``max``/``min`` are ``scatter_reduce`` without the
    zero start (PyG's ``scatter``), so their gradient is split evenly between ties.
    """
    width = values.size(1)
    out = values.new_zeros(n_keys, width)
    if aggr == "max" or aggr == "min":
        at = key.view(-1, 1).expand(-1, width)
        return out.scatter_reduce_(0, at, values, "a" + aggr, include_self=False)
    out = out.index_add_(0, key, values)
    if aggr == "mean":
        count = values.new_zeros(n_keys).index_add_(0, key, values.new_ones(key.size(0)))
        out = out / count.clamp(min=1.0).view(-1, 1)
    return out


def rgcn_reference(
    x_l: Tensor,
    x_r: Tensor,
    edge_index: Tensor,
    edge_type: Tensor,
    weight: Tensor,
    comp: Tensor | None,
    root: Tensor | None,
    bias: Tensor | None,
    aggr: str,
    flow: str,
) -> Tensor:
    """``x'`` of the module docstring in plain torch ops (differentiable, scriptable, exportable).

    Args:
        x_l: ``[N_src, K]`` source features, or ``[N_src]`` node indices (featureless).
        x_r: ``[N_dst, K_root]`` target features or ``[N_dst]`` node indices (read by ``root``;
            ``x_l`` itself when the graph is not bipartite).
        edge_index: ``[2, E]`` int64/int32; row 0 sources, row 1 targets
            (swapped by ``flow="target_to_source"``).
        edge_type: ``[E]`` relations in ``[0, R)``.
        weight: ``[R, K, M]``, ``[B, K, M]`` bases (with ``comp``), or ``[R, nb, K/nb, M/nb]``.
        comp: ``[R, B]`` basis coefficients, or None.
        root: ``[K_root, M]`` or None.
        bias: ``[M]`` or None.
        aggr: ``"sum"``, ``"add"``, ``"mean"``, ``"max"`` or ``"min"`` (per relation).
        flow: ``"source_to_target"`` or ``"target_to_source"``.

    Returns:
        ``[N_dst, M]`` in the dtype of ``x_l`` (of ``weight`` when featureless); float16 and
        bfloat16 computed in float32.

    Raises:
        ValueError: a shape or an index out of range.
        TypeError: an index dtype.
    """
    _check_graph(edge_index, edge_type)
    featureless = not torch.is_floating_point(x_l)
    dtype = weight.dtype if featureless else x_l.dtype
    ct = compute_dtype(dtype)
    w = relation_weight(weight.to(ct), None if comp is None else comp.to(ct))
    relations = w.size(0)
    src, dst = edge_index[0], edge_index[1]
    if flow == "target_to_source":
        src, dst = dst, src
    n_src, n_dst = x_l.size(0), x_r.size(0)
    if flow == "target_to_source" and n_src != n_dst:
        raise ValueError(
            "RGCNConv: expected 'x' to have as many source as target nodes with "
            f"flow='target_to_source' (got {n_src} and {n_dst})"
        )
    check_range(edge_type, relations, "RGCNConv", "edge_type", "relations")
    check_range(src, n_src, "RGCNConv", "edge_index", "source nodes")
    check_range(dst, n_dst, "RGCNConv", "edge_index", "target nodes")
    key = dst.long() * relations + edge_type.long()
    if featureless:
        if w.dim() != 3:
            raise ValueError(
                "RGCNConv: expected 'x' to be float features with num_blocks (got node indices)"
            )
        n_table = w.size(1)
        check_range(x_l, n_table, "RGCNConv", "x", "node indices")
        rows = edge_type.long() * n_table + x_l.long()[src.long()]
        values = w.reshape(relations * n_table, w.size(2))[rows]
        h = scatter_by_key(values, key, n_dst * relations, aggr)
        out = h.view(n_dst, relations, -1).sum(1)
    else:
        h = scatter_by_key(x_l.to(ct)[src.long()], key, n_dst * relations, aggr)
        if w.dim() == 4:
            blocks, k_b, m_b = w.size(1), w.size(2), w.size(3)
            hb = h.view(n_dst, relations, blocks, k_b)
            out = torch.einsum("nrbk,rbkm->nbm", hb, w).reshape(n_dst, blocks * m_b)
        else:
            out = h.view(n_dst, relations * w.size(1)) @ w.reshape(-1, w.size(2))
    if root is not None:
        if torch.is_floating_point(x_r):
            out = out + x_r.to(ct) @ root.to(ct)
        else:
            check_range(x_r, root.size(0), "RGCNConv", "x", "target node indices")
            out = out + root.to(ct)[x_r.long()]
    if bias is not None:
        out = out + bias.to(ct)
    return out.to(dtype)
