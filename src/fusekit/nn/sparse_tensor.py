r"""Features on voxels: :class:`SparseTensor`, spconv 2.x's ``SparseConvTensor`` in plain data.

Same surface as spconv's: ``features [N, C]``, ``indices [N, 4]`` ``(b, z, y, x)``,
``spatial_shape``, ``batch_size``, :meth:`~SparseTensor.dense`,
:meth:`~SparseTensor.replace_feature` and ``indice_dict`` (kernel maps by ``indice_key``,
shared with the tensors the layers return).
:meth:`SparseTensor.from_spconv` / :meth:`SparseTensor.to_spconv` convert at the boundary
(the layers accept an spconv tensor as it is).

Grids are checked before any kernel runs (:mod:`fusekit.gms.kmap.grid`): integer sizes (6.7 is
refused, not truncated), ``batch_size >= 1``, and ``B Z Y X < 2^63`` so that voxel keys fit int64.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from fusekit.errors import expected
from fusekit.gms import kmap as km
from fusekit.gms.kmap.grid import check_grid
from fusekit.nn.conv_map import ConvMap

#: Feature dtypes the layers run (float16 computes in float32, as gms has no float16 kernels).
FEATURE_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _check_features(features: Any, rows: int | None) -> None:
    """A float ``[N, C]`` tensor (``N = rows`` unless ``None``), or a TypeError / ValueError."""
    if not isinstance(features, torch.Tensor):
        raise TypeError(expected("SparseTensor", "features", "a torch.Tensor", type(features)))
    if features.dtype not in FEATURE_DTYPES:
        raise TypeError(
            expected(
                "SparseTensor",
                "features",
                "float32, float64, bfloat16 or float16",
                str(features.dtype).split(".")[-1],
            )
        )
    if features.dim() != 2:
        raise ValueError(expected("SparseTensor", "features", "[N, C]", tuple(features.shape)))
    if rows is not None and features.shape[0] != rows:
        raise ValueError(
            expected(
                "SparseTensor",
                "features",
                f"{rows} rows (one per row of 'indices')",
                f"{features.shape[0]} rows",
            )
        )


@dataclass(eq=False)
class SparseTensor:
    """Features on voxels, spconv's ``SparseConvTensor`` in plain data.

    Attributes:
        features: ``[N, C]`` float32/float64/bfloat16/float16.
        indices: ``[N, 4]`` int32 distinct voxels ``(b, z, y, x)``.
        spatial_shape: ``(Z, Y, X)``, ints in ``[1, 2^31]``.
        batch_size: batches, an int in ``[1, 2^31]``; ``B Z Y X < 2^63``
            (:func:`fusekit.gms.kmap.grid.check_grid`).
        maps: kernel maps by ``indice_key`` (spconv's ``indice_dict``), shared with the tensors
            that layers return; each is used while the indices keep the contents it was built
            on (a content check).
    """

    features: torch.Tensor
    indices: torch.Tensor
    spatial_shape: tuple[int, int, int]
    batch_size: int
    maps: dict[str, ConvMap] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        _check_features(self.features, None)
        self.spatial_shape, self.batch_size = check_grid(
            self.spatial_shape, self.batch_size, "SparseTensor"
        )
        km.check_indices(self.indices, self.spatial_shape, self.batch_size)
        _check_features(self.features, int(self.indices.shape[0]))
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

    @property
    def indice_dict(self) -> dict[str, ConvMap]:
        """The kernel maps by ``indice_key`` (:attr:`maps`, under spconv's name)."""
        return self.maps

    def find_indice_pair(self, key: str | None) -> ConvMap | None:
        """The kernel map under ``key`` (spconv's ``find_indice_pair``), or ``None``."""
        return None if key is None else self.maps.get(key)

    def replace_feature(self, features: torch.Tensor) -> SparseTensor:
        """The same voxels (and shared maps) with other features (``[N, C']``, any width).

        The voxels were checked when this tensor was made, so only the features are (O(1)).

        Raises:
            TypeError, ValueError: ``features`` not a float ``[N, C']`` tensor on the indices'
                device with one row per voxel.
        """
        _check_features(features, int(self.indices.shape[0]))
        if features.device != self.indices.device:
            raise ValueError(
                expected("SparseTensor", "features", f"on {self.indices.device}", features.device)
            )
        return SparseTensor._trusted(
            features, self.indices, self.spatial_shape, self.batch_size, self.maps
        )

    def dense(self, channels_first: bool = True) -> torch.Tensor:
        """The dense grid, zero off the voxels (differentiable in the features).

        Returns:
            ``[B, C, Z, Y, X]`` (spconv's layout), or ``[B, Z, Y, X, C]`` with
            ``channels_first=False``.
        """
        c = self.features.shape[1]
        grid = self.features.new_zeros(self.batch_size, *self.spatial_shape, c)
        b, z, y, x = self.indices.long().unbind(1)
        grid = grid.index_put((b, z, y, x), self.features)
        return grid.permute(0, 4, 1, 2, 3).contiguous() if channels_first else grid

    @classmethod
    def from_spconv(cls, tensor: Any) -> SparseTensor:
        """From spconv's ``SparseConvTensor`` (features, indices, shape and batch size)."""
        shape = tuple(int(n) for n in tensor.spatial_shape)
        return cls(tensor.features, tensor.indices, shape, int(tensor.batch_size))  # type: ignore[arg-type]

    def to_spconv(self) -> Any:
        """To spconv's ``SparseConvTensor`` (needs spconv; indices as int32)."""
        import spconv.pytorch as spconv  # optional: the peer this layer replaces

        return spconv.SparseConvTensor(
            self.features, self.indices.int(), list(self.spatial_shape), self.batch_size
        )


class SparseModule(torch.nn.Module):
    """A module whose forward takes a :class:`SparseTensor` (spconv's ``SparseModule``).

    :class:`fusekit.nn.SparseSequential` passes such modules the tensor itself, and every other
    module the features alone. The sparse convolutions are ones; subclass it for a block of
    your own (a residual block, say).
    """


def is_spconv_tensor(x: Any) -> bool:
    """Whether ``x`` is spconv's ``SparseConvTensor`` (checked without importing spconv)."""
    kind = type(x)
    return kind.__name__ == "SparseConvTensor" and kind.__module__.startswith("spconv")


def as_sparse_tensor(x: Any, where: str) -> SparseTensor:
    """``x``, or spconv's ``SparseConvTensor`` ``x`` converted (:meth:`SparseTensor.from_spconv`).

    Raises:
        TypeError: ``x`` is neither.
    """
    if isinstance(x, SparseTensor):
        return x
    if is_spconv_tensor(x):
        return SparseTensor.from_spconv(x)
    raise TypeError(
        expected(
            where, "x", "a fusekit.nn.SparseTensor or spconv SparseConvTensor", type(x).__name__
        )
    )
