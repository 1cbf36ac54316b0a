"""A built kernel map: its pairs in plan order, its output voxels and, where free, its CSRs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fusekit.gms.problem import GMSProblem


@dataclass(frozen=True, slots=True, eq=False)
class KernelMap:
    """The pairs of a convolution, sorted by (offset, output row).

    Attributes:
        gather: ``[E]`` int64 input rows.
        segment: ``[E]`` int64 kernel offsets ``(kz K_y + ky) K_x + kx``.
        scatter: ``[E]`` int64 output rows.
        offset_ptr: ``[V + 1]`` int64 where each offset's pairs start (``V = 27`` for 3x3x3).
        n_in: input voxels.
        out_coords: ``[N_out, 4]`` int32 output voxels ``(b, z, y, x)`` (the inputs for SubM).
        out_shape: output spatial shape ``(Z, Y, X)``.
        csr: ``(dst_ptr, dst_pos, src_ptr, src_pos)`` numpy arrays, the plan's CSRs by output
            and by input row, where the builder had them for free (``None`` entries else).
    """

    gather: torch.Tensor
    segment: torch.Tensor
    scatter: torch.Tensor
    offset_ptr: torch.Tensor
    n_in: int
    out_coords: torch.Tensor
    out_shape: tuple[int, int, int]
    csr: tuple[Any, ...] = (None, None, None, None)

    @property
    def num_pairs(self) -> int:
        """``E``."""
        return int(self.gather.shape[0])

    @property
    def n_out(self) -> int:
        """Output voxels."""
        return int(self.out_coords.shape[0])

    @property
    def num_segments(self) -> int:
        """``V``, the kernel's offsets."""
        return int(self.offset_ptr.shape[0]) - 1

    def problem(self) -> GMSProblem:
        """The validated g-mm-s problem of the map (``V`` segments, sum)."""
        return GMSProblem.create(
            self.gather,
            self.segment,
            self.scatter,
            self.n_out,
            n_in=self.n_in,
            num_segments=self.num_segments,
        )

    def inverse(self, in_coords: torch.Tensor, in_shape: tuple[int, int, int]) -> KernelMap:
        """The map of the inverse convolution: every pair ``(i, r, o)`` read as ``(o, r, i)``.

        Its outputs are this map's inputs ``in_coords`` (in their order, on grid
        ``in_shape``), its inputs this map's outputs; pairs sorted by (offset, output row)
        again (spconv's ``SparseInverseConv3d``, which uses the forward's offsets as they are).
        """
        n_in = int(in_coords.shape[0])
        order = torch.argsort(self.segment * (n_in + 1) + self.gather, stable=True)
        return KernelMap(
            gather=self.scatter[order],
            segment=self.segment[order],
            scatter=self.gather[order],
            offset_ptr=self.offset_ptr,
            n_in=self.n_out,
            out_coords=in_coords,
            out_shape=in_shape,
        )
