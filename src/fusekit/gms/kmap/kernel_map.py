"""A built kernel map: its pairs in plan order, its output voxels and, where free, its CSRs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fusekit.gms.kmap.primitives import KERNEL_VOLUME
from fusekit.gms.problem import GMSProblem


@dataclass(frozen=True, slots=True, eq=False)
class KernelMap:
    """The pairs of a convolution, sorted by (offset, output row).

    Attributes:
        gather: ``[E]`` int64 input rows.
        segment: ``[E]`` int64 kernel offsets ``9 kz + 3 ky + kx``.
        scatter: ``[E]`` int64 output rows.
        offset_ptr: ``[28]`` int64 where each offset's pairs start.
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

    def problem(self) -> GMSProblem:
        """The validated g-mm-s problem of the map (27 segments, sum)."""
        return GMSProblem.create(
            self.gather,
            self.segment,
            self.scatter,
            self.n_out,
            n_in=self.n_in,
            num_segments=KERNEL_VOLUME,
        )


# ---------------------------------------------------------------------------------------------
# CPU: numba hash table
# ---------------------------------------------------------------------------------------------
