r"""Sparse 3-D convolution on gms: ``SubMConv3d`` and ``SparseConv3d``, drop-in for spconv 2.x.

For output voxel ``o`` and the kernel map's pairs ``(i, k, o)`` (:mod:`fusekit.gms.kmap`):

.. math::

    y_o = b + \sum_{(i, k, o)} W_k^\top x_i, \qquad
    W_k[c_{in}, c_{out}] = \text{weight}[c_{out}, k_z, k_y, k_x, c_{in}], \; k = 9 k_z + 3 k_y + k_x

which is one g-mm-s problem (gather ``i``, segment ``k``, scatter ``o``, sum) run by
:func:`fusekit.gms.gms`, differentiable in ``x``, ``weight`` and ``bias``. The weight keeps
spconv's ``[out, 3, 3, 3, in]`` layout, so an spconv layer's ``state_dict`` loads as it is.

Per kernel map, once: the map's first pass (numba on the CPU: every pair found and counted), its
features from those counts, the gms selector's choice of strategy and configuration for the
layer's widths and dtype, and the second pass writing the pairs straight into the plan with the
choice's knobs (:mod:`fusekit.gms.kmap`). Layers that share an ``indice_key`` share the map (as
in spconv), and repeated forwards on the same :class:`SparseTensor` do no planning. A cached map
is used only while its indices hold what they held when it was built: every use compares their
:func:`fusekit.nn.engine.fingerprint` (one pass over the ``[N, 4]`` indices, small beside a
forward), so an in-place edit, even one the version counter misses (through
``.data`` or a numpy array sharing the memory), builds and checks the map again.

Grids are checked before any kernel runs (:mod:`fusekit.gms.kmap.grid`): integer sizes (6.7 is
refused, not truncated), ``batch_size >= 1``, and ``B Z Y X < 2^63`` so that voxel keys fit int64.

When to prefer which: ``SubMConv3d`` keeps the active set (outputs = inputs); ``SparseConv3d``
with stride 2 halves the resolution and creates outputs wherever a kernel window reaches one
input (its output coordinates come sorted by ``(b, z, y, x)``; spconv's order differs, the
features per coordinate are equal).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from fusekit.errors import expected
from fusekit.gms import GMSPlan
from fusekit.gms import kmap as km
from fusekit.gms.api import gms
from fusekit.gms.candidates import Config, Dataflow, Order, Strategy
from fusekit.gms.dispatch import mark_mirrored
from fusekit.gms.features import Features
from fusekit.gms.kmap.grid import MAX_AXIS, check_grid
from fusekit.gms.launch import launch
from fusekit.gms.selector import Constraints, select
from fusekit.gms.target import target_for
from fusekit.nn.engine import fingerprint, needs_grad

#: What a kernel map runs: pairwise only. It has one pair per (offset, input) and per
#: (offset, output), so the other orders run as many GEMM rows as pairwise plus a reduce pass.
KERNEL_MAP = Constraints(orders=frozenset({Order.PAIRWISE}))


@dataclass(eq=False)
class ConvMap:
    """A kernel map with its gms plans and choices, per (widths, dtype, device).

    On the CPU the map starts as pass 1 of the numba builder (:class:`fusekit.gms.kmap.Hits`):
    the first :meth:`plan_for` selects the configuration from its counts and writes the pairs
    straight into that configuration's packed plan; the :class:`~fusekit.gms.kmap.KernelMap`
    is then views of that plan. Later widths plan from the map (:func:`kmap.plan_kernel_map`).

    Attributes:
        indices: the input coordinates it was built from.
        hits: pass 1 of the map, until the first plan writes it (``None`` after, or off CPU).
        subm: a submanifold map (outputs = inputs, offsets ``k`` and ``26 - k`` mirror each
            other), so a layer's input gradient may run on its forward plan
            (:func:`fusekit.gms.dispatch.mark_mirrored`).
        plans: ``(K, M, dtype, device, constraints) -> (plan, config)``.
        fingerprint: :func:`fusekit.nn.engine.fingerprint` of ``indices`` when the map was
            built (set for maps cached under an ``indice_key``): a map whose indices no longer
            match it is built again.
    """

    indices: torch.Tensor
    hits: km.Hits | None = None
    subm: bool = False
    built: km.KernelMap | None = None
    fingerprint: tuple[Any, ...] | None = None
    plans: dict[tuple[int, int, torch.dtype, str, Constraints], tuple[GMSPlan, Config]] = field(
        default_factory=dict
    )

    @property
    def kmap(self) -> km.KernelMap:
        """The pairs (written by pass 2 now if no plan has been made yet)."""
        if self.built is None:
            if self.hits is None:
                raise ValueError(expected("ConvMap", "hits", "pass 1 or a built map", None))
            self.built, self.hits = self.hits.kernel_map(), None
        return self.built

    def plan_for(
        self,
        k: int,
        m: int,
        dtype: torch.dtype,
        device: torch.device,
        constraints: Constraints = KERNEL_MAP,
    ) -> tuple[GMSPlan, Config]:
        """The plan and configuration for operands of widths ``k``, ``m`` (cached).

        Args:
            k: input channels.
            m: output channels.
            dtype: the features' dtype.
            device: where the features live.
            constraints: what the selector may answer (:func:`constraints_for` a layer).
        """
        key = (k, m, dtype, str(device), constraints)
        if key in self.plans:
            return self.plans[key]
        if self.hits is not None and device.type == "cpu":
            cfg = choose(self.hits.features(k, m, dtype), device, constraints)
            self.built, plan = self.hits.plan(*cfg.plan_knobs)
            self.hits = None
        else:
            cfg = choose(km.features_of(self.kmap, k, m, dtype), device, constraints)
            plan = km.plan_kernel_map(self.kmap, *cfg.plan_knobs)
            plan = plan.to(device) if device.type != "cpu" else plan
        if self.subm:  # offsets k and 26 - k mirror each other: dX runs on this plan
            mark_mirrored(plan)
        self.plans[key] = (plan, cfg)
        return plan, cfg


def constraints_for(strategy: str, training: bool) -> Constraints:
    """What a layer with ``strategy`` may run: pairwise, a named dataflow alone, or training's.

    Under training (``"auto"`` only) the selector answers its training strategy.

    Args:
        strategy: ``"auto"`` or a gms dataflow name.
        training: whether autograd records the call.
    """
    if strategy == "auto":
        return Constraints(orders=KERNEL_MAP.orders, training=training)
    dataflow = Strategy.parse(strategy).dataflow
    return Constraints(orders=KERNEL_MAP.orders, dataflows=frozenset({dataflow}))


def choose(
    features: Features, device: torch.device, constraints: Constraints = KERNEL_MAP
) -> Config:
    """The gms selector's configuration for a map's features on ``device``'s measured target.

    ``select(features, target_for(device), constraints)``: the best configuration the layer may
    run (where the shipped tree answers another order or dataflow, the leaf's knobs run with the
    allowed strategy: :meth:`~fusekit.gms.selector.Constraints.run_as`).
    """
    return select(features, target_for(device), constraints).config


@dataclass(eq=False)
class SparseTensor:
    """Features on voxels, spconv's ``SparseConvTensor`` in plain data.

    Attributes:
        features: ``[N, C]`` float32/float64/bfloat16.
        indices: ``[N, 4]`` int32 distinct voxels ``(b, z, y, x)``.
        spatial_shape: ``(Z, Y, X)``, ints in ``[1, 2^31]``.
        batch_size: batches, an int in ``[1, 2^31]``; ``B Z Y X < 2^63``
            (:func:`fusekit.gms.kmap.grid.check_grid`).
        maps: kernel maps by ``indice_key``, shared with the tensors that layers return; each
            is used while the indices keep the contents it was built on (a content check).
    """

    features: torch.Tensor
    indices: torch.Tensor
    spatial_shape: tuple[int, int, int]
    batch_size: int
    maps: dict[str, ConvMap] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.features, torch.Tensor):
            raise TypeError(
                expected("SparseTensor", "features", "a torch.Tensor", type(self.features))
            )
        if self.features.dtype not in (torch.float32, torch.float64, torch.bfloat16):
            raise TypeError(
                expected(
                    "SparseTensor",
                    "features",
                    "float32, float64 or bfloat16",
                    str(self.features.dtype).split(".")[-1],
                )
            )
        if self.features.dim() != 2:
            raise ValueError(
                expected("SparseTensor", "features", "[N, C]", tuple(self.features.shape))
            )
        self.spatial_shape, self.batch_size = check_grid(
            self.spatial_shape, self.batch_size, "SparseTensor"
        )
        km.check_indices(self.indices, self.spatial_shape, self.batch_size)
        if self.indices.shape[0] != self.features.shape[0]:
            raise ValueError(
                expected(
                    "SparseTensor",
                    "features",
                    f"{self.indices.shape[0]} rows (one per row of 'indices')",
                    f"{self.features.shape[0]} rows",
                )
            )
        if self.indices.device != self.features.device:
            raise ValueError(
                expected(
                    "SparseTensor",
                    "indices",
                    f"on {self.features.device} like 'features'",
                    self.indices.device,
                )
            )

    @classmethod
    def _trusted(
        cls,
        features: torch.Tensor,
        indices: torch.Tensor,
        spatial_shape: tuple[int, int, int],
        batch_size: int,
        maps: dict[str, ConvMap],
    ) -> SparseTensor:
        """A layer's output, whose voxels the kernel map already validated (no O(N) checks)."""
        out = object.__new__(cls)
        out.features, out.indices, out.spatial_shape = features, indices, spatial_shape
        out.batch_size, out.maps = batch_size, maps
        return out

    def replace_feature(self, features: torch.Tensor) -> SparseTensor:
        """The same voxels (and cached maps) with other features."""
        return SparseTensor(features, self.indices, self.spatial_shape, self.batch_size, self.maps)

    @classmethod
    def from_spconv(cls, tensor: Any) -> SparseTensor:
        """From spconv's ``SparseConvTensor`` (features, indices, shape and batch size)."""
        shape = tuple(tensor.spatial_shape)
        return cls(tensor.features, tensor.indices, shape, tensor.batch_size)

    def to_spconv(self) -> Any:
        """To spconv's ``SparseConvTensor`` (needs spconv; indices as int32)."""
        import spconv.pytorch as spconv  # optional: the peer this layer replaces

        return spconv.SparseConvTensor(
            self.features, self.indices.int(), list(self.spatial_shape), self.batch_size
        )


def conv_reference(
    features: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    kmap: km.KernelMap,
) -> torch.Tensor:
    """The layers' maths in plain torch, differentiable (spconv's native CPU algorithm).

    Per offset ``k``: ``y[o] += x[i] @ W_k`` with ``index_select``, ``mm`` and ``index_add``.
    """
    out_channels = weight.shape[0]
    w = weight.reshape(out_channels, 27, -1)
    y = features.new_zeros(kmap.n_out, out_channels)
    ptr = kmap.offset_ptr.tolist()
    for k in range(27):
        lo, hi = ptr[k], ptr[k + 1]
        rows = features.index_select(0, kmap.gather[lo:hi])
        y = y.index_add(0, kmap.scatter[lo:hi], rows @ w[:, k].T)
    return y + bias if bias is not None else y


def _triple(name: str, value: int | tuple[int, ...], low: int) -> tuple[int, int, int]:
    if not isinstance(value, int | tuple | list):
        raise ValueError(expected("sparse conv", name, f"an int in [{low}, {MAX_AXIS}]", value))
    values = (value,) * 3 if isinstance(value, int) else tuple(value)
    if len(values) != 3 or any(
        isinstance(v, bool) or not isinstance(v, int) or not low <= v <= MAX_AXIS for v in values
    ):
        raise ValueError(
            expected("sparse conv", name, f"an int in [{low}, {MAX_AXIS}] or 3 of them", value)
        )
    return values


class _SparseConv(torch.nn.Module):
    """What the two layers share: spconv's parameters, the map cache and the gms call."""

    subm: bool = False

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int, int] = 3,
        stride: int | tuple[int, int, int] = 1,
        padding: int | tuple[int, int, int] = 0,
        dilation: int | tuple[int, int, int] = 1,
        bias: bool = True,
        indice_key: str | None = None,
        strategy: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        dataflows = [d.value for d in Dataflow]
        if strategy != "auto" and strategy not in dataflows:
            raise ValueError(
                expected(type(self).__name__, "strategy", f"'auto' or one of {dataflows}", strategy)
            )
        self.strategy = strategy
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(expected(type(self).__name__, name, "a positive int", value))
        if _triple("kernel_size", kernel_size, 1) != (3, 3, 3):
            raise ValueError(expected(type(self).__name__, "kernel_size", "3", kernel_size))
        if _triple("dilation", dilation, 1) != (1, 1, 1):
            raise ValueError(expected(type(self).__name__, "dilation", "1", dilation))
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = (3, 3, 3)
        self.stride = (1, 1, 1) if self.subm else _triple("stride", stride, 1)
        self.padding = _triple("padding", padding, 0)
        self.indice_key = indice_key
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.empty(out_channels, 3, 3, 3, in_channels, **factory))
        self.bias = torch.nn.Parameter(torch.empty(out_channels, **factory)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``, ``fan_in = 27 in_channels`` (torch's conv)."""
        bound = 1.0 / math.sqrt(27 * self.in_channels)
        torch.nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        """Like spconv's."""
        s = f"{self.in_channels}, {self.out_channels}, kernel_size=(3, 3, 3), stride={self.stride}"
        if not self.subm:
            s += f", padding={self.padding}"
        if self.bias is None:
            s += ", bias=False"
        return s + (f", indice_key={self.indice_key!r}" if self.indice_key else "")

    def _map(self, x: SparseTensor) -> ConvMap:
        cached = x.maps.get(self.indice_key) if self.indice_key is not None else None
        if cached is not None and fingerprint(cached.indices) == cached.fingerprint:
            if cached.indices is not x.indices and not torch.equal(cached.indices, x.indices):
                raise ValueError(
                    expected(
                        type(self).__name__,
                        "indice_key",
                        "a key whose map was built on these indices",
                        repr(self.indice_key),
                    )
                )
            return cached
        # no map, or its indices were edited in place since it was built: build (again)
        if x.indices.device.type == "cpu":
            shape, stride = x.spatial_shape, self.stride
            hits = km.find_hits(x.indices, shape, x.batch_size, stride, self.padding, self.subm)
            entry = ConvMap(x.indices, hits=hits, subm=self.subm)
        else:
            built = km.build(
                x.indices, x.spatial_shape, x.batch_size, self.stride, self.padding, self.subm
            )
            entry = ConvMap(x.indices, built=built, subm=self.subm)
        if self.indice_key is not None:
            entry.fingerprint = fingerprint(x.indices)
            x.maps[self.indice_key] = entry
        return entry

    def forward(self, x: SparseTensor) -> SparseTensor:
        """Convolve.

        Args:
            x: the input voxels and features (``C = in_channels``).

        Returns:
            The output voxels (SubM: the inputs) with ``out_channels`` features.

        Raises:
            TypeError: ``x`` is not a :class:`SparseTensor`, or its dtype is not the weight's.
            ValueError: its channels are not ``in_channels``; duplicate voxels; an
                ``indice_key`` reused on other indices.
        """
        name = type(self).__name__
        if not isinstance(x, SparseTensor):
            raise TypeError(expected(name, "x", "a fusekit.nn.SparseTensor", type(x).__name__))
        if x.features.shape[1] != self.in_channels:
            raise ValueError(
                expected(
                    name,
                    "x.features",
                    f"{self.in_channels} channels (in_channels)",
                    f"shape {tuple(x.features.shape)}",
                )
            )
        if x.features.dtype != self.weight.dtype:
            raise TypeError(
                expected(
                    name, "x.features", f"{self.weight.dtype} like the weight", x.features.dtype
                )
            )
        entry = self._map(x)
        training = needs_grad(x.features, self.weight)
        plan, cfg = entry.plan_for(
            self.in_channels,
            self.out_channels,
            x.features.dtype,
            x.features.device,
            constraints_for(self.strategy, training),
        )
        # [out, 3, 3, 3, in] -> [27, in, out]: W_k = weight[:, k].T
        w = self.weight.reshape(self.out_channels, 27, self.in_channels).permute(1, 2, 0)
        with launch(cfg.launch):
            y = gms(x.features.contiguous(), w.contiguous(), plan, None, cfg.strategy)
        if self.bias is not None:
            y = y + self.bias
        kmap = entry.kmap
        return SparseTensor._trusted(y, kmap.out_coords, kmap.out_shape, x.batch_size, x.maps)


class SubMConv3d(_SparseConv):
    r"""Submanifold 3x3x3 convolution: outputs on the input voxels (spconv's ``SubMConv3d``).

    .. math::  y_o = b + \sum_{k} W_k^\top x_{\,\mathrm{in}(c_o + k - 1)}

    Args:
        in_channels: input features per voxel.
        out_channels: output features per voxel.
        kernel_size: 3 (the only size).
        stride: ignored (1), as spconv.
        padding: ignored, as spconv's submanifold convolution.
        dilation: 1.
        bias: add a learned bias.
        indice_key: layers with one key share a kernel map on a :class:`SparseTensor`, kept
            while its indices are unchanged (a fingerprint of their contents is compared on
            every use, so in-place edits of the indices, tracked or not, rebuild it).
        strategy: ``"auto"`` (the gms selector's choice; under autograd the target's
            :data:`fusekit.gms.selector.TRAINING` strategy) or a gms dataflow to run pairwise,
            e.g. ``"G-Mseg-S"``.
        device, dtype: of the parameters.
    """

    subm = True


class SparseConv3d(_SparseConv):
    r"""Regular sparse 3x3x3 convolution, stride 1 or 2 (spconv's ``SparseConv3d``).

    .. math::  y_o = b + \sum_{k} W_k^\top x_{\,\mathrm{in}(s c_o - p + k)}

    for every output ``o`` inside ``floor((S + 2p - 3) / s) + 1`` that some input reaches.
    Output coordinates are sorted by ``(b, z, y, x)``.

    Args: as :class:`SubMConv3d`, with ``stride`` and ``padding`` per axis (int or 3 ints).
    """
