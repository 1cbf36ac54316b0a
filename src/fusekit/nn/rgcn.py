r"""``RGCNConv``: PyG's relational graph convolution, run as one fused g-mm-s.

.. math::

    x'_i = \Theta_{\mathrm{root}}\, x_i + b
         + \sum_{r \in \mathcal{R}} \Theta_r \bigoplus_{j \in \mathcal{N}_r(i)} x_j,
    \qquad \bigoplus \in \{\text{sum}, \text{mean}, \text{max}, \text{min}\} \text{ per relation}

(Schlichtkrull et al., ESWC 2018; the form, parameter names and keyword arguments of
``torch_geometric.nn.RGCNConv``). PyG loops over the relations, one masked propagate each; here
the sum and mean are one :func:`fusekit.gms.gms` call: gather ``g = src``, segment
``s = relation``, scatter ``d = dst``, per-pair scale ``c = 1 / |N_r(i)|`` (mean) or none, sum
reduce (``Theta_r`` is linear, so ``Theta_r sum_j c x_j = sum_j c Theta_r x_j``). Regularisers
map onto the same call:

* basis decomposition: ``Theta_r = sum_b comp[r, b] V_b``, formed first (``[R, in, out]``, as
  PyG does), then one g-mm-s;
* block-diagonal: ``x`` viewed as ``[N * nb, in / nb]``, pairs ``(g nb + b, r nb + b, d nb + b)``,
  weights ``[R nb, in / nb, out / nb]``: still one g-mm-s, with ``nb`` times the pairs;
* featureless nodes (``x`` None or a node-index tensor): ``Theta_r x_j`` is row ``x_j`` of
  ``weight[r]``, so the layer is a scaled gather-reduce of weight rows (no GEMM).

``max`` and ``min`` do not commute with ``Theta_r``: the raw rows are reduced first per
(target, relation) key that occurs (:func:`~fusekit.nn.rgcn_rows.segment_max`; ``min`` as
``-max(-x)``), then one g-mm-s with ``g = key``, ``s = r``, ``d = i`` sums ``H_{i,r} Theta_r``.

Eager calls run these fused kernels. Under ``torch.jit.script``, ``torch.jit.trace``,
``torch.compile`` and ``torch.export``, the layer runs
:func:`~fusekit.nn.rgcn_reference.rgcn_reference` instead: the same maths in plain torch ops,
which those tools can record, and whose index checks become runtime assertions.

Parameters are named and shaped as PyG's (``weight``, ``comp``, ``root``, ``bias``), so a PyG
``state_dict`` loads as it is and outputs match PyG's. This module keeps real (not postponed)
annotations: TorchScript reads them.
"""

from typing import Any

import torch
from torch import Tensor, nn

from fusekit.errors import expected
from fusekit.gms import GMSProblem
from fusekit.gms.selector import Constraints
from fusekit.nn.engine import IndexCache, Prepared, needs_grad, prepare
from fusekit.nn.rgcn_reference import AGGRS, compute_dtype, relation_weight, rgcn_reference
from fusekit.nn.rgcn_rows import GatherReduce as GatherReduce
from fusekit.nn.rgcn_rows import KeyGroups, segment_max
from fusekit.nn.rgcn_rows import gather_reduce as gather_reduce
from fusekit.nn.rgcn_rows import reduce_reference as reduce_reference

#: PyG's ``MessagePassing`` flows; ``"target_to_source"`` swaps the rows of ``edge_index``.
FLOWS: tuple[str, ...] = ("source_to_target", "target_to_source")
#: The ``MessagePassing`` keywords RGCNConv takes (``node_dim`` is fixed to 0, as in PyG).
MESSAGE_PASSING_KWARGS: tuple[str, ...] = ("flow", "aggr_kwargs", "decomposed_layers")


class RGCNConv(nn.Module):
    """Relational graph convolution (drop-in for ``torch_geometric.nn.RGCNConv``).

    Args:
        in_channels: input features, or ``(source, target)`` features for bipartite graphs; the
            number of nodes when the input is featureless (``x`` None or node indices).
        out_channels: output features.
        num_relations: relations ``R``.
        num_bases: basis decomposition with this many bases (exclusive with ``num_blocks``).
        num_blocks: block-diagonal decomposition with this many blocks.
        aggr: per relation, ``"mean"`` (PyG's default), ``"add"``/``"sum"``, ``"max"`` or
            ``"min"``.
        root_weight: add ``x_i @ root``.
        is_sorted: accepted for compatibility (the plan sorts once per graph anyway).
        bias: add a learned bias.
        strategy: ``"auto"`` (the gms selector, with ``Constraints(training=True)`` under
            autograd: :data:`fusekit.gms.selector.TRAINING`) or a gms strategy name.
        **kwargs: PyG's ``MessagePassing`` keywords: ``flow`` (``"target_to_source"`` swaps
            the edge direction), ``decomposed_layers`` (a memory knob of PyG's propagate; the
            result does not depend on it) and an empty ``aggr_kwargs``.

    Raises:
        ValueError: a size, ``aggr``, ``flow`` or decomposition is not valid.
        TypeError: ``node_dim`` (fixed to 0, as PyG's RGCNConv fixes it), a non-empty
            ``aggr_kwargs`` or an unknown keyword.

    The plan of a graph is kept while the same ``edge_index`` and ``edge_type`` tensors (and
    node indices, when featureless) come back with the same contents
    (:class:`~fusekit.nn.engine.IndexCache`: their version counters and a
    :func:`~fusekit.nn.engine.fingerprint`, one pass over the indices): editing them in place,
    even through ``.data`` or a numpy array sharing the memory, plans again. Index ranges are
    checked when a plan is built, so a call that reuses a plan does O(1) checks.

    float16 and bfloat16 layers compute in float32 and return the input's dtype (PyG's
    RGCNConv returns float32 there, from its float32 accumulator; its FastRGCNConv the input's
    dtype).
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
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if num_bases is not None and num_blocks is not None:
            raise ValueError(
                expected("RGCNConv", "num_bases", "None when num_blocks is set", num_bases)
            )
        if not isinstance(aggr, str) or aggr not in AGGRS:
            raise ValueError(
                expected("RGCNConv", "aggr", " or ".join(map(repr, AGGRS)), repr(aggr))
            )
        self.flow, self.decomposed_layers = _message_passing_kwargs(kwargs)
        self.node_dim = 0
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
        x: Tensor | tuple[Tensor | None, Tensor] | None,
        edge_index: Tensor,
        edge_type: Tensor | None = None,
    ) -> Tensor:
        """``[N_dst, out_channels]`` (see the module docstring for the formula).

        Args:
            x: ``[N, in]`` float features; or ``None`` / ``[N]`` int64 node indices for
                featureless nodes; or a ``(source, target)`` pair of either.
            edge_index: ``[2, E]`` int64, row 0 sources, row 1 targets (the other way round
                with ``flow="target_to_source"``).
            edge_type: ``[E]`` int64 relations in ``[0, num_relations)`` (required: sparse
                adjacency inputs are not supported).

        Raises:
            ValueError: a shape or an index out of range, naming the argument.
            TypeError: a dtype, naming the argument.
        """
        if torch.jit.is_scripting() or _recorded():  # type: ignore[attr-defined]
            return self._forward_reference(x, edge_index, edge_type)
        return self._forward_fused(x, edge_index, edge_type)

    def _forward_reference(
        self,
        x: Tensor | tuple[Tensor | None, Tensor] | None,
        edge_index: Tensor,
        edge_type: Tensor | None,
    ) -> Tensor:
        """The plain-torch path that TorchScript compiles and torch.export records."""
        x_l: Tensor | None = None
        x_r: Tensor | None = None
        if isinstance(x, tuple):
            x_l = x[0]
            x_r = x[1]
        else:
            x_l = x
        if x_l is None:
            x_l = torch.arange(self.in_channels_l, device=self.weight.device)
        if x_r is None:
            x_r = x_l
        if edge_type is None:
            raise ValueError("RGCNConv: expected 'edge_type' to be a [E] tensor (got None)")
        if torch.is_floating_point(x_l) and x_l.dtype != self.weight.dtype:
            raise TypeError(
                f"RGCNConv: expected 'x' to be {self.weight.dtype} like the weights "
                f"(got {x_l.dtype})"
            )
        return rgcn_reference(
            x_l,
            x_r,
            edge_index,
            edge_type,
            self.weight,
            self.comp,
            self.root,
            self.bias,
            self.aggr,
            self.flow,
        )

    @torch.jit.unused
    def _forward_fused(
        self,
        x: Tensor | tuple[Tensor | None, Tensor] | None,
        edge_index: Tensor,
        edge_type: Tensor | None,
    ) -> Tensor:
        """The eager path: cached plans, fused kernels."""
        x_l, x_r = x if isinstance(x, tuple) else (x, x)
        featureless = x_l is None or not torch.is_floating_point(x_l)
        # the plan cache's key: no tensor when every node is its own index
        x_key = x_l
        if x_l is None:
            x_l = torch.arange(self.in_channels_l, device=self.weight.device)
        if x_r is None:
            x_r = x_l
        edge_type = self._check(x_l, x_r, edge_index, edge_type, featureless)
        if featureless and self.num_blocks is not None:
            raise ValueError(
                expected("RGCNConv", "x", "float features with num_blocks", "node indices")
            )
        dtype = self.weight.dtype if featureless else x_l.dtype
        ct = compute_dtype(dtype)
        out = self._relational(x_l, x_r, edge_index, edge_type, featureless, x_key, ct)
        if self.root is not None:
            root = self.root.to(ct)
            out = out + (root[x_r] if not torch.is_floating_point(x_r) else x_r.to(ct) @ root)
        if self.bias is not None:
            out = out + self.bias.to(ct)
        return out.to(dtype)

    def _relational(
        self,
        x_l: Tensor,
        x_r: Tensor,
        edge_index: Tensor,
        edge_type: Tensor,
        featureless: bool,
        x_key: Tensor | None,
        ct: torch.dtype,
    ) -> Tensor:
        """``sum_r Theta_r (+)_{j in N_r(i)} x_j``, in ``ct``."""
        comp = None if self.comp is None else self.comp.to(ct)
        weight = relation_weight(self.weight.to(ct), comp)
        n_src, n_dst = int(x_l.shape[0]), int(x_r.shape[0])
        device = str(x_l.device)
        extra = (n_src, n_dst, featureless, ct, device, self.flow, self.aggr, self.strategy)
        src, dst = _directed(edge_index, self.flow)
        extremal = self.aggr in ("max", "min")
        if featureless:
            table = weight.reshape(self.num_relations * self.in_channels_l, self.out_channels)
            groups, gr = self._plans.get(
                (edge_index, edge_type, x_key),
                extra,
                lambda: self._featureless_plan(x_l, src, dst, edge_type, n_src, n_dst, ct),
            )
            if groups is not None:
                table = segment_max(table, groups, negate=self.aggr == "min")
            return gather_reduce(table, gr)
        blocks = self.num_blocks or 1
        k_in = self.in_channels_l // blocks
        x_c = x_l.to(ct)
        training = self.strategy == "auto" and needs_grad(x_c, weight)
        prepared: Prepared
        prepared, scale, groups = self._plans.get(
            (edge_index, edge_type),
            (*extra, training),
            lambda: self._prepare(src, dst, edge_type, n_src, n_dst, blocks, x_c, training),
        )
        if extremal:
            x_c = segment_max(x_c, groups, negate=self.aggr == "min")
        rows = int(x_c.shape[0])
        w = weight.reshape(self.num_relations * blocks, k_in, self.out_channels // blocks)
        out: Tensor = prepared(x_c.contiguous().view(rows * blocks, k_in), w.contiguous(), scale)
        return out.view(n_dst, self.out_channels)

    def _prepare(
        self,
        src: Tensor,
        dst: Tensor,
        edge_type: Tensor,
        n_src: int,
        n_dst: int,
        blocks: int,
        x: Tensor,
        training: bool,
    ) -> tuple[Prepared, Tensor | None, KeyGroups | None]:
        """The plan of a graph: its g-mm-s problem (over the keys that occur, for max/min)."""
        _check_ranges(src, dst, edge_type, n_src, n_dst, self.num_relations)
        relations = self.num_relations
        groups: KeyGroups | None = None
        scale: Tensor | None = None
        if self.aggr in ("max", "min"):
            groups = KeyGroups(src, dst.long() * relations + edge_type.long())
            n_in = groups.num_groups
            gather = torch.arange(n_in, device=src.device)
            rel, dst = groups.keys % relations, groups.keys // relations
        else:
            n_in, gather, rel = n_src, src, edge_type
            if self.aggr == "mean":
                scale = _mean_scale(dst, edge_type, n_dst, relations, x.dtype)
        if blocks > 1:
            b = torch.arange(blocks, device=src.device)
            gather = (gather[:, None] * blocks + b).flatten()
            dst = (dst[:, None] * blocks + b).flatten()
            rel = (rel[:, None] * blocks + b).flatten()
            scale = scale.repeat_interleave(blocks) if scale is not None else None
        problem = GMSProblem.create(
            gather, rel, dst, n_dst * blocks, n_in=n_in * blocks, num_segments=relations * blocks
        )
        prepared = prepare(
            problem,
            self.in_channels_l // blocks,
            self.out_channels // blocks,
            x.dtype,
            has_scale=scale is not None,
            device=x.device,
            strategy=self.strategy,
            constraints=Constraints(training=training),
        )
        return prepared, scale, groups

    def _featureless_plan(
        self,
        x_l: Tensor,
        src: Tensor,
        dst: Tensor,
        edge_type: Tensor,
        n_src: int,
        n_dst: int,
        dtype: torch.dtype,
    ) -> tuple[KeyGroups | None, GatherReduce]:
        """Rows ``r * N + x_j`` of the ``[R N, out]`` weight table, and how they reduce."""
        _check_ranges(src, dst, edge_type, n_src, n_dst, self.num_relations)
        width, relations = self.in_channels_l, self.num_relations
        if x_l.numel() and (int(x_l.min()) < 0 or int(x_l.max()) >= width):
            raise ValueError(
                expected("RGCNConv", "x", f"node indices in [0, {width})", "values outside")
            )
        src, dst = src.long(), dst.long()
        rows = edge_type.long() * width + x_l.long()[src]
        if self.aggr in ("max", "min"):
            # per (target, relation) key first, then the sum over the relations
            groups = KeyGroups(rows, dst * relations + edge_type.long())
            u = groups.num_groups
            keys = torch.arange(u, device=rows.device)
            return groups, GatherReduce(keys, groups.keys // relations, None, n_dst, u)
        scale = (
            _mean_scale(dst, edge_type, n_dst, relations, dtype) if self.aggr == "mean" else None
        )
        return None, GatherReduce(rows, dst, scale, n_dst, relations * width)

    def _check(
        self,
        x_l: Tensor,
        x_r: Tensor,
        edge_index: Tensor,
        edge_type: Tensor | None,
        featureless: bool,
    ) -> Tensor:
        """Shapes and dtypes (O(1)), returning ``edge_type``; index ranges: when planning."""
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
        if self.flow == "target_to_source" and x_l.shape[0] != x_r.shape[0]:
            raise ValueError(
                expected(
                    "RGCNConv",
                    "x",
                    "as many source as target nodes with flow='target_to_source'",
                    f"{x_l.shape[0]} and {x_r.shape[0]}",
                )
            )
        return edge_type

    @staticmethod
    def _check_target(x_r: Tensor, root: Tensor) -> None:
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

    def __repr__(self) -> str:
        """As PyG prints it: ``RGCNConv(4, 32, num_relations=8)``."""
        return (
            f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, "
            f"num_relations={self.num_relations})"
        )


@torch.jit.unused
def _recorded() -> bool:
    """Whether torch.jit.trace, torch.compile or torch.export is recording this call."""
    tracing: bool = torch.jit.is_tracing()  # type: ignore[attr-defined, no-untyped-call]
    return tracing or torch.compiler.is_compiling()


def _message_passing_kwargs(kwargs: dict[str, Any]) -> tuple[str, int]:
    """``(flow, decomposed_layers)`` from PyG's ``MessagePassing`` keywords, checked."""
    if "node_dim" in kwargs:
        raise TypeError(
            expected(
                "RGCNConv",
                "node_dim",
                "left unset (RGCNConv fixes node_dim=0, as PyG's does)",
                kwargs["node_dim"],
            )
        )
    unknown = sorted(set(kwargs) - set(MESSAGE_PASSING_KWARGS))
    if unknown:
        raise TypeError(
            expected(
                "RGCNConv",
                unknown[0],
                "one of the MessagePassing keywords " + ", ".join(MESSAGE_PASSING_KWARGS),
                "an unexpected keyword argument",
            )
        )
    flow = kwargs.get("flow", FLOWS[0])
    if flow not in FLOWS:
        raise ValueError(expected("RGCNConv", "flow", " or ".join(map(repr, FLOWS)), repr(flow)))
    if kwargs.get("aggr_kwargs"):
        raise TypeError(
            expected(
                "RGCNConv",
                "aggr_kwargs",
                "None or empty (sum, mean, max and min take no arguments)",
                kwargs["aggr_kwargs"],
            )
        )
    layers = kwargs.get("decomposed_layers", 1)
    if not _positive(layers):
        raise ValueError(expected("RGCNConv", "decomposed_layers", "a positive int", layers))
    return flow, layers


def _directed(edge_index: Tensor, flow: str) -> tuple[Tensor, Tensor]:
    """``(source row, target row)`` of ``edge_index`` for PyG's ``flow``."""
    if flow == "target_to_source":
        return edge_index[1], edge_index[0]
    return edge_index[0], edge_index[1]


def _check_ranges(
    src: Tensor, dst: Tensor, edge_type: Tensor, n_src: int, n_dst: int, relations: int
) -> None:
    """Relations in ``[0, R)``, sources in ``[0, N_src)``, targets in ``[0, N_dst)``."""
    for arg, t, n, what in (
        ("edge_type", edge_type, relations, ""),
        ("edge_index", src, n_src, "source nodes "),
        ("edge_index", dst, n_dst, "target nodes "),
    ):
        if t.numel():
            lo, hi = int(t.min()), int(t.max())
            if lo < 0 or hi >= n:
                raise ValueError(
                    expected("RGCNConv", arg, f"{what}in [0, {n})", f"values in [{lo}, {hi}]")
                )


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _shape(t: Any) -> str:
    return f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def _mean_scale(
    dst: Tensor, edge_type: Tensor, n_dst: int, relations: int, dtype: torch.dtype
) -> Tensor:
    """``c_e = 1 / |N_{r_e}(d_e)|``: PyG's per-relation mean as a per-edge factor."""
    key = dst.long() * relations + edge_type.long()
    count = torch.bincount(key, minlength=n_dst * relations)
    return (1.0 / count[key].to(torch.float64)).to(dtype)
