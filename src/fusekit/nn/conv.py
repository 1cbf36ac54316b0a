r"""Sparse 3-D convolution on gms, drop-in for spconv 2.x: four layers of any geometry.

``SubMConv3d``, ``SparseConv3d``, ``SparseInverseConv3d`` and ``SparseConvTranspose3d``.

For output voxel ``o`` and the kernel map's pairs ``(i, r, o)`` (:mod:`fusekit.gms.kmap`):

.. math::

    y_o = b + \sum_{(i, r, o)} W_r^\top x_i, \qquad
    W_r[c_{in}, c_{out}] = \text{weight}[c_{out}, r_z, r_y, r_x, c_{in}], \;
    r = (r_z K_y + r_y) K_x + r_x

which is one g-mm-s problem (gather ``i``, segment ``r``, scatter ``o``, sum) run by
:func:`fusekit.gms.gms`, differentiable in ``x``, ``weight`` and ``bias``. The weight keeps
spconv's ``[out, K_z, K_y, K_x, in]`` layout, so an spconv layer's ``state_dict`` loads as it is.
Kernel sizes 1-7 per axis, any stride, padding and dilation
(:mod:`fusekit.gms.kmap.geometry` gives each kind's pairs):

* ``SubMConv3d``: outputs on the inputs, in their order (odd sizes only, as spconv);
* ``SparseConv3d``: outputs wherever a kernel window reaches an input, sorted by
  ``(b, z, y, x)`` (spconv's GPU order; its CPU lists them in order of discovery: the set and
  the features per coordinate are equal);
* ``SparseInverseConv3d``: the pairs of the ``SparseConv3d`` that shares its ``indice_key``,
  read backwards: its outputs are that layer's inputs, in their order (a U-Net's decoder);
* ``SparseConvTranspose3d``: outputs ``s c_i - p + d r`` in the grid ``(S - 1) s - 2p + K``,
  sorted by ``(b, z, y, x)``.

Per kernel map, once: the map, the gms selector's choice for the layer's widths and dtype, and
the plan (:class:`fusekit.nn.conv_map.ConvMap`). Layers that share an ``indice_key`` share the
map (as in spconv), and repeated forwards on the same :class:`SparseTensor` do no planning. A
cached map is used only while its indices hold what they held when it was built: every use
compares their :func:`fusekit.nn.engine.fingerprint`, so an in-place edit, even one the version
counter misses (through ``.data`` or a numpy array sharing the memory), builds the map again.
float16 features compute in float32 and are rounded back (spconv's CPU layers run float16).

A 1x1x1 kernel of stride 1 is spconv's ``conv1x1``: one GEMM on the same voxels, which spconv
2.3.8 runs as ``x @ weight.view(in, out)`` (the ``[out, 1, 1, 1, in]`` memory read as
``[in, out]``, not transposed: spconv issue #450). The layers do the same, so that spconv
checkpoints give spconv's outputs; its padding must be 0, as spconv asserts.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fusekit.errors import expected
from fusekit.gms import kmap as km
from fusekit.gms.api import gms
from fusekit.gms.candidates import Dataflow
from fusekit.gms.kmap.geometry import Geometry
from fusekit.gms.launch import launch
from fusekit.nn.conv_map import KERNEL_MAP, ConvMap, build_map, choose, constraints_for
from fusekit.nn.engine import fingerprint, needs_grad
from fusekit.nn.sparse_tensor import SparseModule, SparseTensor, as_sparse_tensor

__all__ = [
    "KERNEL_MAP",
    "ConvMap",
    "SparseConv3d",
    "SparseConvTranspose3d",
    "SparseInverseConv3d",
    "SparseTensor",
    "SubMConv3d",
    "choose",
    "constraints_for",
    "conv_reference",
]


#: The ``strategy`` that runs :func:`conv_reference` on the layer's kernel map.
REFERENCE = "reference"


def conv_reference(
    features: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    kmap: km.KernelMap,
) -> torch.Tensor:
    """The layers' maths in plain torch, differentiable (spconv's native CPU algorithm).

    Per offset ``r``: ``y[o] += x[i] @ W_r`` with ``index_select``, ``mm`` and ``index_add``.
    """
    out_channels, volume = weight.shape[0], kmap.num_segments
    w = weight.reshape(out_channels, volume, -1)
    y = features.new_zeros(kmap.n_out, out_channels)
    ptr = kmap.offset_ptr.tolist()
    for r in range(volume):
        lo, hi = ptr[r], ptr[r + 1]
        rows = features.index_select(0, kmap.gather[lo:hi])
        y = y.index_add(0, kmap.scatter[lo:hi], rows @ w[:, r].T)
    return y + bias if bias is not None else y


class _SparseConv(SparseModule):
    """What the four layers share: spconv's parameters, the map cache and the gms call."""

    subm: bool = False
    transposed: bool = False
    inverse: bool = False

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
        name = type(self).__name__
        dataflows = [d.value for d in Dataflow]
        if strategy not in ("auto", REFERENCE, *dataflows):
            allowed = f"'auto', {REFERENCE!r} or one of {dataflows}"
            raise ValueError(expected(name, "strategy", allowed, strategy))
        self.strategy = strategy
        for arg, value in (("in_channels", in_channels), ("out_channels", out_channels)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(expected(name, arg, "a positive int", value))
        if indice_key is not None and not isinstance(indice_key, str):
            raise TypeError(expected(name, "indice_key", "a str or None", type(indice_key)))
        self.geometry = Geometry.create(
            kernel_size, stride, padding, dilation, self.subm, self.transposed, where=name
        )
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = self.geometry.kernel_size
        g = self.geometry
        if self.pointwise and not self.subm and g.padding != (0, 0, 0):
            raise ValueError(expected(name, "padding", "0 for a 1x1x1 kernel of stride 1", padding))
        # spconv keeps the arguments a submanifold layer ignores; its maps use s = 1, p = (K//2) d
        self.stride = (1, 1, 1) if self.subm else g.stride
        self.padding = g.padding if not self.subm else Geometry.create(padding=padding).padding
        self.dilation = g.dilation
        self.indice_key = indice_key
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        shape = (out_channels, *self.kernel_size, in_channels)
        self.weight = torch.nn.Parameter(torch.empty(shape, **factory))
        self.bias = torch.nn.Parameter(torch.empty(out_channels, **factory)) if bias else None
        self.reset_parameters()

    @property
    def pointwise(self) -> bool:
        """A 1x1x1 kernel of stride 1: spconv's ``conv1x1``, one GEMM on the same voxels."""
        return self.geometry.volume == 1 and self.geometry.stride == (1, 1, 1)

    def reset_parameters(self) -> None:
        """``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``, ``fan_in = V in_channels`` (spconv's)."""
        bound = 1.0 / math.sqrt(self.geometry.volume * self.in_channels)
        torch.nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        """Like spconv's."""
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}"
        s += f", stride={self.stride}"
        if self.padding != (0, 0, 0):
            s += f", padding={self.padding}"
        if self.dilation != (1, 1, 1):
            s += f", dilation={self.dilation}"
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
            self._check_shared(cached)
            return cached
        # no map, or its indices were edited in place since it was built: build (again)
        entry = build_map(x.indices, x.spatial_shape, x.batch_size, self.geometry)
        if self.indice_key is not None:
            entry.fingerprint = fingerprint(x.indices)
            x.maps[self.indice_key] = entry
        return entry

    def _check_shared(self, cached: ConvMap) -> None:
        """A shared map must be this layer's: same kernel (SubM), the same geometry (else)."""
        g, mine = cached.geometry, self.geometry
        same = (g.kernel_size, g.dilation, g.transposed) == (
            mine.kernel_size,
            mine.dilation,
            mine.transposed,
        )
        if not same or (not self.subm and g != mine):
            raise ValueError(
                expected(
                    type(self).__name__,
                    "indice_key",
                    f"a key whose map has this layer's geometry ({mine})",
                    f"{self.indice_key!r} with {g}",
                )
            )

    def _entry(self, x: SparseTensor) -> tuple[ConvMap, ConvMap | None]:
        """The map to run, and the map whose inputs are the outputs (``None``: its outputs)."""
        return self._map(x), None

    def forward(self, x: SparseTensor | Any) -> SparseTensor:
        """Convolve.

        Args:
            x: the input voxels and features (``C = in_channels``): a :class:`SparseTensor`,
                or spconv's ``SparseConvTensor`` (converted).

        Returns:
            The output voxels with ``out_channels`` features.

        Raises:
            TypeError: ``x`` is not a sparse tensor, or its dtype is not the weight's.
            ValueError: its channels are not ``in_channels``; duplicate voxels; an
                ``indice_key`` reused on other indices or by another geometry.
        """
        name = type(self).__name__
        x = as_sparse_tensor(x, name)
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
        # spconv's conv1x1: no kernel map, the voxels unchanged. Not for the inverse of a strided
        # 1x1x1 convolution, whose map (under its key) leads back to that layer's input voxels.
        if self.pointwise and not (self.inverse and self.indice_key in x.maps):
            y = x.features @ self.weight.reshape(self.in_channels, self.out_channels)
            y = y + self.bias if self.bias is not None else y
            return SparseTensor._trusted(y, x.indices, x.spatial_shape, x.batch_size, x.maps)
        entry, forward = self._entry(x)
        y = self._run(entry, x.features)
        if forward is not None:  # an inverse convolution: the forward layer's inputs
            return SparseTensor._trusted(y, forward.indices, forward.in_shape, x.batch_size, x.maps)
        kmap = entry.kmap
        return SparseTensor._trusted(y, kmap.out_coords, kmap.out_shape, x.batch_size, x.maps)

    def _run(self, entry: ConvMap, features: torch.Tensor) -> torch.Tensor:
        """``y = b + sum W_r^T x_i`` over the map's pairs, by gms (float16 in float32)."""
        half = features.dtype == torch.float16
        compute = torch.float32 if half else features.dtype
        if self.strategy == REFERENCE:  # spconv's per-offset algorithm in plain torch
            bias = self.bias.to(compute) if self.bias is not None else None
            y = conv_reference(features.to(compute), self.weight.to(compute), bias, entry.kmap)
            return y.to(features.dtype) if half else y
        training = needs_grad(features, self.weight)
        plan, cfg = entry.plan_for(
            self.in_channels,
            self.out_channels,
            compute,
            features.device,
            constraints_for(self.strategy, training),
        )
        # [out, Kz, Ky, Kx, in] -> [V, in, out]: W_r = weight[:, r].T
        volume = self.geometry.volume
        w = self.weight.reshape(self.out_channels, volume, self.in_channels).permute(1, 2, 0)
        x, w = features.to(compute).contiguous(), w.to(compute).contiguous()
        with launch(cfg.launch):
            y = gms(x, w, plan, None, cfg.strategy)
        if self.bias is not None:
            y = y + self.bias.to(compute)
        return y.to(features.dtype) if half else y


class SubMConv3d(_SparseConv):
    r"""Submanifold convolution: outputs on the input voxels (spconv's ``SubMConv3d``).

    .. math::  y_o = b + \sum_{r} W_r^\top x_{\,\mathrm{in}(c_o + d (r - K // 2))}

    Args:
        in_channels: input features per voxel.
        out_channels: output features per voxel.
        kernel_size: odd sizes in ``[1, 7]``, an int or 3 (spconv refuses even ones).
        stride: ignored (1), as spconv.
        padding: ignored (``(K // 2) d``), as spconv's submanifold convolution.
        dilation: per axis.
        bias: add a learned bias.
        indice_key: layers with one key share a kernel map on a :class:`SparseTensor`, kept
            while its indices are unchanged (a fingerprint of their contents is compared on
            every use, so in-place edits of the indices, tracked or not, rebuild it).
        strategy: ``"auto"`` (the gms selector's choice; under autograd the target's
            :data:`fusekit.gms.selector.TRAINING` strategy), a gms dataflow to run pairwise,
            e.g. ``"G-Mseg-S"``, or ``"reference"``: :func:`conv_reference` on the same map
            (spconv's per-offset algorithm in plain torch; a baseline, not a fast path).
        device, dtype: of the parameters.
    """

    subm = True


class SparseConv3d(_SparseConv):
    r"""Regular sparse convolution (spconv's ``SparseConv3d``).

    .. math::  y_o = b + \sum_{r} W_r^\top x_{\,\mathrm{in}(s c_o - p + d r)}

    for every output ``o`` inside ``floor((S + 2p - d (K - 1) - 1) / s) + 1`` that some input
    reaches. Output coordinates are sorted by ``(b, z, y, x)``. With an ``indice_key`` its map is
    kept for the :class:`SparseInverseConv3d` of the same key.

    Args: as :class:`SubMConv3d`, with any sizes in ``[1, 7]`` and ``stride``, ``padding``
    per axis (int or 3 ints).
    """


class SparseConvTranspose3d(_SparseConv):
    r"""Transposed sparse convolution (spconv's ``SparseConvTranspose3d``).

    .. math::  y_o = b + \sum_{(i, r):\ c_o = s c_i - p + d r} W_r^\top x_i

    for every output inside ``(S - 1) s - 2p + K`` (spconv's grid, which leaves the dilation
    out) that some input reaches, sorted by ``(b, z, y, x)``.

    Args: as :class:`SparseConv3d`.
    """

    transposed = True


class SparseInverseConv3d(_SparseConv):
    r"""The inverse of a :class:`SparseConv3d` (spconv's ``SparseInverseConv3d``).

    Runs the pairs ``(i, r, o)`` of the ``SparseConv3d`` with the same ``indice_key``
    backwards, from its outputs to its inputs:

    .. math::  y_i = b + \sum_{(i, r, o)} W_r^\top x_o

    so the output has that layer's input voxels (in their order) and grid: a U-Net's decoder
    restores its encoder's voxels exactly.

    Args:
        in_channels: input features per voxel.
        out_channels: output features per voxel.
        kernel_size: the forward layer's.
        indice_key: the forward layer's key (required).
        bias: add a learned bias.
        strategy, device, dtype: as :class:`SubMConv3d`.
    """

    inverse = True

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int, int],
        indice_key: str,
        bias: bool = True,
        strategy: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if not isinstance(indice_key, str):
            raise TypeError(
                expected(
                    "SparseInverseConv3d", "indice_key", "the str of a SparseConv3d", indice_key
                )
            )
        super().__init__(
            in_channels,
            out_channels,
            kernel_size,
            bias=bias,
            indice_key=indice_key,
            strategy=strategy,
            device=device,
            dtype=dtype,
        )

    def _entry(self, x: SparseTensor) -> tuple[ConvMap, ConvMap | None]:
        """The forward layer's map, inverted, and that map (its inputs are the outputs)."""
        forward = x.maps.get(self.indice_key)  # type: ignore[arg-type]
        name = "SparseInverseConv3d"
        if forward is None or forward.subm or forward.fingerprint != fingerprint(forward.indices):
            raise ValueError(
                expected(
                    name,
                    "indice_key",
                    "the key of a SparseConv3d run on these voxels' encoder side",
                    f"{self.indice_key!r} (keys: {sorted(x.maps)})",
                )
            )
        if forward.geometry.kernel_size != self.kernel_size:
            raise ValueError(
                expected(
                    name,
                    "kernel_size",
                    f"{forward.geometry.kernel_size}, the forward layer's",
                    self.kernel_size,
                )
            )
        kmap = forward.kmap
        if x.spatial_shape != kmap.out_shape:
            raise ValueError(
                expected(name, "x.spatial_shape", f"{kmap.out_shape}", x.spatial_shape)
            )
        if x.indices is not kmap.out_coords and not torch.equal(x.indices, kmap.out_coords):
            raise ValueError(
                expected(
                    name,
                    "x.indices",
                    f"the {kmap.n_out} output voxels of the SparseConv3d keyed {self.indice_key!r}",
                    f"{x.indices.shape[0]} other voxels",
                )
            )
        return forward.inverted(), forward
