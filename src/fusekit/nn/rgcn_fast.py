"""``FastRGCNConv``: PyG's ``FastRGCNConv`` signature on fusekit's fused RGCN.

PyG's ``FastRGCNConv`` trades memory for speed against its ``RGCNConv``: one batched matmul over
all edges (``x_j @ Theta_{r_j}``, ``[E, in, out]`` weights gathered) instead of a loop over the
relations. fusekit's :class:`~fusekit.nn.rgcn.RGCNConv` already runs every relation in one
g-mm-s and picks the dataflow per graph, so this class is the same layer under PyG's other
name, with what PyG's class accepts: the aggregations ``"add"``, ``"sum"`` and ``"mean"``.

One deliberate difference: with node indices as input (featureless, ``x`` not None), PyG's
``FastRGCNConv`` reads weight rows at the *edge's* source index, ignoring the values of ``x``;
this class reads them at ``x[source]``, as both ``RGCNConv`` classes do. The two agree for
``x = None`` and ``x = arange(N)``.
"""

from typing import Any

from fusekit.errors import expected
from fusekit.nn.rgcn import RGCNConv

#: The aggregations PyG's FastRGCNConv accepts.
FAST_AGGRS: tuple[str, ...] = ("add", "sum", "mean")


class FastRGCNConv(RGCNConv):
    """Drop-in for ``torch_geometric.nn.FastRGCNConv`` (see :class:`RGCNConv` for the args).

    Raises:
        ValueError: ``aggr`` is not ``"add"``, ``"sum"`` or ``"mean"`` (PyG asserts this in its
            forward), or any argument :class:`RGCNConv` refuses.
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
        if aggr not in FAST_AGGRS:
            raise ValueError(
                expected("FastRGCNConv", "aggr", " or ".join(map(repr, FAST_AGGRS)), repr(aggr))
            )
        super().__init__(
            in_channels,
            out_channels,
            num_relations,
            num_bases,
            num_blocks,
            aggr,
            root_weight,
            is_sorted,
            bias,
            strategy,
            **kwargs,
        )
