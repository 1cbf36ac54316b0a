r"""``RGCNConv``: PyG's relational graph convolution, run as one fused g-mm-s.

.. math::

    x'_i = \Theta_{\mathrm{root}}\, x_i + b
         + \sum_{r \in \mathcal{R}} \sum_{j \in \mathcal{N}_r(i)} c_{i,r}\, \Theta_r\, x_j,
    \qquad c_{i,r} = 1 / |\mathcal{N}_r(i)| \ (\text{mean}) \text{ or } 1 \ (\text{add, sum})

(Schlichtkrull et al., ESWC 2018; the form and parameter names of
``torch_geometric.nn.RGCNConv``). PyG loops over the relations, one masked propagate each; here
the whole sum is one :func:`fusekit.gms.gms` call: gather ``g = src``, segment ``s = relation``,
scatter ``d = dst``, per-pair scale ``c = c_{d,s}``, sum reduce. Regularisers map onto the same
call:

* basis decomposition: ``Theta_r = sum_b comp[r, b] V_b``, formed first (``[R, in, out]``, as
  PyG does), then one g-mm-s;
* block-diagonal: ``x`` viewed as ``[N * nb, in / nb]``, pairs ``(g nb + b, r nb + b, d nb + b)``,
  weights ``[R nb, in / nb, out / nb]``: still one g-mm-s, with ``nb`` times the pairs;
* featureless nodes (``x`` None or a node-index tensor): ``Theta_r x_j`` is row ``x_j`` of
  ``weight[r]``, so the layer is a scaled gather-reduce of weight rows (no GEMM).

Parameters are named and shaped as PyG's (``weight``, ``comp``, ``root``, ``bias``), so a PyG
``state_dict`` loads as it is and outputs match PyG's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fusekit.errors import expected
from fusekit.gms import GMSProblem
from fusekit.gms.segments import reduce_rows
from fusekit.gms.selector import Constraints
from fusekit.nn.engine import IndexCache, Prepared, needs_grad, prepare

if TYPE_CHECKING:
    from collections.abc import Sequence

AGGRS: tuple[str, ...] = ("mean", "add", "sum")


class RGCNConv(nn.Module):
    """Relational graph convolution (drop-in for ``torch_geometric.nn.RGCNConv``).

    Args:
        in_channels: input features, or ``(source, target)`` features for bipartite graphs; the
            number of nodes when the input is featureless (``x`` None or node indices).
        out_channels: output features.
        num_relations: relations ``R``.
        num_bases: basis decomposition with this many bases (exclusive with ``num_blocks``).
        num_blocks: block-diagonal decomposition with this many blocks.
        aggr: ``"mean"`` (per relation, as PyG), ``"add"`` or ``"sum"``.
        root_weight: add ``x_i @ root``.
        is_sorted: accepted for compatibility (the plan sorts once per graph anyway).
        bias: add a learned bias.
        strategy: ``"auto"`` (the gms selector, with ``Constraints(training=True)`` under
            autograd: :data:`fusekit.gms.selector.TRAINING`) or a gms strategy name.

    The plan of a graph is kept while the same ``edge_index`` and ``edge_type`` tensors (and
    node indices, when featureless) come back with the same contents
    (:class:`~fusekit.nn.engine.IndexCache`: their version counters and a
    :func:`~fusekit.nn.engine.fingerprint`, one pass over the indices): editing them in place,
    even through ``.data`` or a numpy array sharing the memory, plans again.
    """

    def __init__(
        self,
        in_channels: int | tuple[int, int],
        out_channels: int,
        num_relations: int,
        num_bases: int | None = None,
        num_blocks: int | None = None,
        aggr: str = "mean",
        root_weight: bool = True,
        is_sorted: bool = False,
        bias: bool = True,
        strategy: str = "auto",
    ) -> None:
        super().__init__()
        if num_bases is not None and num_blocks is not None:
            raise ValueError(
                expected("RGCNConv", "num_bases", "None when num_blocks is set", num_bases)
            )
        if aggr not in AGGRS:
            raise ValueError(
                expected("RGCNConv", "aggr", " or ".join(map(repr, AGGRS)), repr(aggr))
            )
        pair = (
            (in_channels, in_channels)
            if not isinstance(in_channels, tuple | list)
            else tuple(in_channels)
        )
        if len(pair) != 2 or not all(_positive(n) for n in pair):
            raise ValueError(
                expected("RGCNConv", "in_channels", "a positive int or a pair of them", in_channels)
            )
        for name, value in (
            ("out_channels", out_channels),
            ("num_relations", num_relations),
            ("num_bases", 1 if num_bases is None else num_bases),
            ("num_blocks", 1 if num_blocks is None else num_blocks),
        ):
            if not _positive(value):
                raise ValueError(expected("RGCNConv", name, "a positive int", value))
        self.in_channels = in_channels
        self.in_channels_l, in_r = int(pair[0]), int(pair[1])
        self.out_channels = out_channels
        self.num_relations = num_relations
        self.num_bases = num_bases
        self.num_blocks = num_blocks
        self.aggr = aggr
        self.is_sorted = is_sorted
        self.strategy = strategy
        if num_bases is not None:
            self.weight = nn.Parameter(torch.empty(num_bases, self.in_channels_l, out_channels))
            self.comp = nn.Parameter(torch.empty(num_relations, num_bases))
        elif num_blocks is not None:
            if self.in_channels_l % num_blocks or out_channels % num_blocks:
                raise ValueError(
                    expected(
                        "RGCNConv",
                        "num_blocks",
                        f"a divisor of in_channels {self.in_channels_l} and "
                        f"out_channels {out_channels}",
                        num_blocks,
                    )
                )
            self.weight = nn.Parameter(
                torch.empty(
                    num_relations,
                    num_blocks,
                    self.in_channels_l // num_blocks,
                    out_channels // num_blocks,
                )
            )
            self.register_parameter("comp", None)
        else:
            self.weight = nn.Parameter(torch.empty(num_relations, self.in_channels_l, out_channels))
            self.register_parameter("comp", None)
        if root_weight:
            self.root = nn.Parameter(torch.empty(in_r, out_channels))
        else:
            self.register_parameter("root", None)
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self._plans = IndexCache()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Glorot weights (PyG's ``glorot``: uniform in ``±sqrt(6 / (rows + cols))``), zero bias."""
        for p in (self.weight, self.comp, self.root):
            if p is not None:
                bound = (6.0 / (p.size(-2) + p.size(-1))) ** 0.5
                nn.init.uniform_(p, -bound, bound)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(
        self,
        x: torch.Tensor | tuple[torch.Tensor | None, torch.Tensor] | None,
        edge_index: torch.Tensor,
        edge_type: torch.Tensor,
    ) -> torch.Tensor:
        """``[N_dst, out_channels]`` (see the module docstring for the formula).

        Args:
            x: ``[N, in]`` float features; or ``None`` / ``[N]`` int64 node indices for
                featureless nodes; or a ``(source, target)`` pair of either.
            edge_index: ``[2, E]`` int64, row 0 sources, row 1 targets.
            edge_type: ``[E]`` int64 relations in ``[0, num_relations)``.
        """
        x_l, x_r = x if isinstance(x, tuple) else (x, x)
        featureless = x_l is None or not torch.is_floating_point(x_l)
        device = self.weight.device
        # the plan cache's key: no tensor when every node is its own index
        x_key = x_l
        if x_l is None:
            x_l = torch.arange(self.in_channels_l, device=device)
        if x_r is None:
            x_r = x_l
        n_src, n_dst = int(x_l.shape[0]), int(x_r.shape[0])
        self._check(x_l, x_r, edge_index, edge_type, featureless)
        if featureless and self.num_blocks is not None:
            raise ValueError(
                expected("RGCNConv", "x", "float features with num_blocks", "node indices")
            )
        out = self._relational(x_l, edge_index, edge_type, n_src, n_dst, featureless, x_key)
        if self.root is not None:
            out = out + (self.root[x_r] if not torch.is_floating_point(x_r) else x_r @ self.root)
        if self.bias is not None:
            out = out + self.bias
        return out

    def _relational(
        self,
        x_l: torch.Tensor,
        edge_index: torch.Tensor,
        edge_type: torch.Tensor,
        n_src: int,
        n_dst: int,
        featureless: bool,
        x_key: torch.Tensor | None,
    ) -> torch.Tensor:
        weight: torch.Tensor = self.weight
        if self.num_bases is not None:
            weight = (self.comp @ weight.view(self.num_bases, -1)).view(
                self.num_relations, self.in_channels_l, self.out_channels
            )
        extra = (n_src, n_dst, featureless, x_l.dtype, str(x_l.device))
        if featureless:
            gr = self._plans.get(
                (edge_index, edge_type, x_key),
                extra,
                lambda: _featureless_pairs(
                    x_l,
                    edge_index,
                    edge_type,
                    n_dst,
                    self.num_relations,
                    self.in_channels_l,
                    self.aggr,
                ),
            )
            table = weight.reshape(self.num_relations * self.in_channels_l, self.out_channels)
            return gather_reduce(table, gr)
        blocks = self.num_blocks or 1
        k_in = self.in_channels_l // blocks
        m_out = self.out_channels // blocks
        prepared: Prepared
        scale: torch.Tensor | None
        training = self.strategy == "auto" and needs_grad(x_l, weight)
        prepared, scale = self._plans.get(
            (edge_index, edge_type),
            (*extra, training),
            lambda: self._prepare(
                edge_index, edge_type, n_src, n_dst, blocks, k_in, m_out, x_l, training
            ),
        )
        x_blocks = x_l.contiguous().view(n_src * blocks, k_in)
        w = weight.reshape(self.num_relations * blocks, k_in, m_out)
        return prepared(x_blocks, w.contiguous(), scale).view(n_dst, self.out_channels)

    def _prepare(
        self,
        edge_index: torch.Tensor,
        edge_type: torch.Tensor,
        n_src: int,
        n_dst: int,
        blocks: int,
        k_in: int,
        m_out: int,
        x: torch.Tensor,
        training: bool,
    ) -> tuple[Prepared, torch.Tensor | None]:
        src, dst = edge_index[0], edge_index[1]
        scale = (
            _mean_scale(dst, edge_type, n_dst, self.num_relations, x.dtype)
            if (self.aggr == "mean")
            else None
        )
        if blocks > 1:
            b = torch.arange(blocks, device=src.device)
            src = (src[:, None] * blocks + b).flatten()
            dst_b = (dst[:, None] * blocks + b).flatten()
            rel = (edge_type[:, None] * blocks + b).flatten()
            scale = scale.repeat_interleave(blocks) if scale is not None else None
        else:
            dst_b, rel = dst, edge_type
        problem = GMSProblem.create(
            src,
            rel,
            dst_b,
            n_dst * blocks,
            n_in=n_src * blocks,
            num_segments=self.num_relations * blocks,
        )
        prepared = prepare(
            problem,
            k_in,
            m_out,
            x.dtype,
            has_scale=scale is not None,
            device=x.device,
            strategy=self.strategy,
            constraints=Constraints(training=training),
        )
        return prepared, scale

    def _check(
        self,
        x_l: torch.Tensor,
        x_r: torch.Tensor,
        edge_index: torch.Tensor,
        edge_type: torch.Tensor,
        featureless: bool,
    ) -> None:
        if (
            not isinstance(edge_index, torch.Tensor)
            or edge_index.dim() != 2
            or (edge_index.shape[0] != 2)
        ):
            raise ValueError(
                expected("RGCNConv", "edge_index", "a [2, E] tensor", _shape(edge_index))
            )
        if not isinstance(edge_type, torch.Tensor) or edge_type.shape != edge_index.shape[1:]:
            raise ValueError(
                expected(
                    "RGCNConv", "edge_type", f"a [{edge_index.shape[1]}] tensor", _shape(edge_type)
                )
            )
        for name, t in (("edge_index", edge_index), ("edge_type", edge_type)):
            if t.dtype not in (torch.int64, torch.int32):
                raise TypeError(expected("RGCNConv", name, "int64 or int32", t.dtype))
        if edge_type.numel():
            lo, hi = int(edge_type.min()), int(edge_type.max())
            if lo < 0 or hi >= self.num_relations:
                raise ValueError(
                    expected(
                        "RGCNConv",
                        "edge_type",
                        f"in [0, {self.num_relations})",
                        f"values in [{lo}, {hi}]",
                    )
                )
        if featureless:
            if x_l.dtype not in (torch.int64, torch.int32):
                raise TypeError(
                    expected("RGCNConv", "x", "float features or int64 node indices", x_l.dtype)
                )
            if x_l.dim() != 1:
                raise ValueError(expected("RGCNConv", "x", "[N] node indices", _shape(x_l)))
        elif x_l.dim() != 2 or x_l.shape[1] != self.in_channels_l:
            raise ValueError(expected("RGCNConv", "x", f"[N, {self.in_channels_l}]", _shape(x_l)))
        elif x_l.dtype != self.weight.dtype:
            raise TypeError(
                expected("RGCNConv", "x", f"{self.weight.dtype} like the weights", x_l.dtype)
            )
        if self.root is not None and x_r is not x_l:
            self._check_target(x_r, self.root)
        if edge_index.numel():
            for row, n, side in ((0, x_l.shape[0], "source"), (1, x_r.shape[0], "target")):
                lo, hi = int(edge_index[row].min()), int(edge_index[row].max())
                if lo < 0 or hi >= n:
                    raise ValueError(
                        expected(
                            "RGCNConv",
                            "edge_index",
                            f"{side} nodes in [0, {n})",
                            f"values in [{lo}, {hi}]",
                        )
                    )

    @staticmethod
    def _check_target(x_r: torch.Tensor, root: torch.Tensor) -> None:
        """The target side of a pair, which ``root`` reads: ``[N, in]`` rows or node indices."""
        in_r = root.shape[0]
        if torch.is_floating_point(x_r):
            if x_r.dim() != 2 or x_r.shape[1] != in_r or x_r.dtype != root.dtype:
                raise ValueError(
                    expected(
                        "RGCNConv",
                        "x",
                        f"a target side [N, {in_r}] of {root.dtype}",
                        f"{_shape(x_r)} of {x_r.dtype}",
                    )
                )
            return
        got = f"{_shape(x_r)} of {x_r.dtype}"
        ok = x_r.dtype in (torch.int64, torch.int32) and x_r.dim() == 1
        if ok and x_r.numel():
            lo, hi = int(x_r.min()), int(x_r.max())
            ok, got = 0 <= lo <= hi < in_r, f"values in [{lo}, {hi}]"
        if not ok:
            raise ValueError(
                expected("RGCNConv", "x", f"target node indices [N] int64 in [0, {in_r})", got)
            )

    def extra_repr(self) -> str:
        """As PyG prints it, plus the aggregation."""
        return (
            f"{self.in_channels}, {self.out_channels}, num_relations={self.num_relations}, "
            f"aggr={self.aggr!r}"
        )


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _shape(t: Any) -> str:
    return f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def _mean_scale(
    dst: torch.Tensor, edge_type: torch.Tensor, n_dst: int, relations: int, dtype: torch.dtype
) -> torch.Tensor:
    """``c_e = 1 / |N_{r_e}(d_e)|``: PyG's per-relation mean as a per-edge factor."""
    key = dst.long() * relations + edge_type.long()
    count = torch.bincount(key, minlength=n_dst * relations)
    return (1.0 / count[key].to(torch.float64)).to(dtype)


class GatherReduce:
    """The indices of ``out[i] = sum_{p: dst[p] = i} scale[p] * table[rows[p]]``, both ways.

    Attributes:
        rows: ``[E]`` table row of each pair.
        dst: ``[E]`` output row of each pair.
        scale: ``[E]`` factor of each pair, or None.
        n_out: output rows.
        n_table: table rows.
        by_dst: (ptr, positions) CSR of pairs by output row (the forward).
        by_row: (ptr, positions) CSR of pairs by table row (the gradient of the table).
    """

    def __init__(
        self,
        rows: torch.Tensor,
        dst: torch.Tensor,
        scale: torch.Tensor | None,
        n_out: int,
        n_table: int,
    ) -> None:
        e = rows.shape[0] if isinstance(rows, torch.Tensor) and rows.dim() == 1 else -1
        for name, t, bound in (("rows", rows, n_table), ("dst", dst, n_out)):
            if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.shape[0] != e:
                raise ValueError(expected("GatherReduce", name, "[E] like 'rows'", _shape(t)))
            if t.dtype not in (torch.int64, torch.int32):
                raise TypeError(expected("GatherReduce", name, "int64 or int32", t.dtype))
            if e and not 0 <= int(t.min()) <= int(t.max()) < bound:
                raise ValueError(
                    expected(
                        "GatherReduce",
                        name,
                        f"in [0, {bound})",
                        f"values in [{int(t.min())}, {int(t.max())}]",
                    )
                )
        if scale is not None and (not isinstance(scale, torch.Tensor) or scale.shape != (e,)):
            raise ValueError(expected("GatherReduce", "scale", f"[{e}] or None", _shape(scale)))
        self.rows, self.dst, self.scale = rows.long(), dst.long(), scale
        self.n_out, self.n_table = n_out, n_table
        self.by_dst = _csr(self.dst, n_out)
        self.by_row = _csr(self.rows, n_table)


def _csr(key: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.argsort(key, stable=True)
    ptr = torch.zeros(n + 1, dtype=torch.int64, device=key.device)
    ptr[1:] = torch.cumsum(torch.bincount(key, minlength=n), 0)
    return ptr, pos


def _featureless_pairs(
    x_l: torch.Tensor,
    edge_index: torch.Tensor,
    edge_type: torch.Tensor,
    n_dst: int,
    relations: int,
    table_width: int,
    aggr: str,
) -> GatherReduce:
    src, dst = edge_index[0].long(), edge_index[1].long()
    if x_l.numel() and (int(x_l.min()) < 0 or int(x_l.max()) >= table_width):
        raise ValueError(
            expected("RGCNConv", "x", f"node indices in [0, {table_width})", "values outside")
        )
    rows = edge_type.long() * table_width + x_l.long()[src]
    scale = _mean_scale(dst, edge_type, n_dst, relations, torch.float32) if aggr == "mean" else None
    return GatherReduce(rows, dst, scale, n_dst, relations * table_width)


def gather_reduce(table: torch.Tensor, gr: GatherReduce) -> torch.Tensor:
    """``out[i] = sum_{p: dst[p] = i} scale[p] * table[rows[p]]``, differentiable in ``table``."""
    if gr.n_table != table.shape[0]:
        raise ValueError(expected("gather_reduce", "table", f"{gr.n_table} rows", table.shape[0]))
    if gr.scale is not None and gr.scale.dtype != table.dtype:
        gr.scale = gr.scale.to(table.dtype)
    out: torch.Tensor = _GatherReduce.apply(table, gr)  # type: ignore[no-untyped-call]
    return out


class _GatherReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, table: torch.Tensor, gr: GatherReduce) -> torch.Tensor:
        ctx.gr = gr
        return _reduce(table.contiguous(), gr.rows, gr.scale, gr.by_dst)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Sequence[torch.Tensor | None]:
        gr: GatherReduce = ctx.gr
        return _reduce(grad.contiguous(), gr.dst, gr.scale, gr.by_row), None


def _reduce(
    src: torch.Tensor,
    src_index: torch.Tensor,
    scale: torch.Tensor | None,
    csr: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """``out[i] = sum over the CSR positions p of row i of scale[p] * src[src_index[p]]``."""
    ptr, pos = csr
    return reduce_rows(
        src, ptr, n_pairs=int(src_index.shape[0]), src_index=src_index, scale=scale, pos=pos
    )


def reduce_reference(
    src: torch.Tensor,
    src_index: torch.Tensor,
    scale: torch.Tensor | None,
    ptr: torch.Tensor,
    pos: torch.Tensor,
    n_out: int,
) -> torch.Tensor:
    """The plain-torch reference of :func:`_reduce` (``index_add_``)."""
    rows = torch.repeat_interleave(torch.arange(n_out, device=src.device), ptr[1:] - ptr[:-1])
    values = src[src_index[pos]]
    if scale is not None:
        values = values * scale[pos, None].to(src.dtype)
    out = torch.zeros(n_out, src.shape[1], dtype=src.dtype, device=src.device)
    return out.index_add_(0, rows, values)
