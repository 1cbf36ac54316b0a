"""What kernels derive from a plan once and reuse on every call: a typed record per plan.

Every field is a function of the plan's buffer. The record is stamped with the buffer's version
counter (:func:`fusekit.gms.memory.remember`) and emptied when the version moves or when
:mod:`fusekit.gms.integrity` finds the buffer edited behind the counter, as a fresh parse would
start. A plan changed with ``dataclasses.replace`` starts with an empty record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    import numpy as np
    import torch

#: The plan type (:class:`fusekit.gms.GMSPlan`, whose module imports this one).
P = TypeVar("P")


class Check(Enum):
    """A launcher's check of plan arrays, run once per plan (the kernels guard every read too)."""

    #: CPU: ``block_ptr`` non-decreasing within ``[0, T]``.
    CPU_BLOCK_PTR = "cpu block_ptr"
    #: Triton: an ``[E]`` index array in ``[0, bound)``.
    TRITON_INDEX = "triton index"
    #: Triton: tiles name segments below ``bound`` and positions inside ``[0, E]``.
    TRITON_TILES = "triton tiles"
    #: Triton: ``segment_ptr`` from 0 to ``E``, at most ``bound`` segments.
    TRITON_SEGMENT_PTR = "triton segment_ptr"
    #: Triton: the destination CSR points into its positions, positions in range.
    TRITON_DST_CSR = "triton dst csr"


@dataclass(frozen=True, slots=True)
class Passed:
    """A check that passed: which one, on which plan array, against which bound.

    Attributes:
        check: the check.
        array: the plan array checked, for checks that take one (``"gather"``...).
        bound: the bound it was checked against (rows of ``x``, matrices of ``w``), or 0.
    """

    check: Check
    array: str = ""
    bound: int = 0


@dataclass(slots=True)
class Derived(Generic[P]):
    """What kernels derived from a plan's buffer, reused across calls.

    Attributes:
        buffer_version: the buffer's version counter these values were derived at (``None``:
            not stamped yet).
        transposed: the input-gradient plan and its permutation
            (:func:`fusekit.gms.dispatch.transposed_plan`).
        mirrored: whether the pairs are closed under ``(d, g, s) -> (g, d, S - 1 - s)``
            (:func:`fusekit.gms.dispatch.mirrored`); ``None``: not known yet.
        norms: the mean weights ``1 / deg(d)`` in each compute dtype.
        arrays: numpy views of plan fields, by field name (the CPU kernels' arguments).
        passed: the launcher checks that passed.
        segment_bounds: ``segment_ptr`` as a list, checked (CPU ``G-Mseg-S``).
        segment_tiles: ``(tile_segment, tile_start, tile_end)`` of the segments alone (Triton
            ``G-Mseg-S``).
    """

    buffer_version: int | None = None
    transposed: tuple[P, torch.Tensor] | None = None
    mirrored: bool | None = None
    norms: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    passed: set[Passed] = field(default_factory=set)
    segment_bounds: list[int] | None = None
    segment_tiles: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def stamp(self, buffer_version: int) -> None:
        """Stamp the record with the buffer's version; empty it first if the version moved."""
        if self.buffer_version is None:
            self.buffer_version = buffer_version
        elif self.buffer_version != buffer_version:
            self.reset(buffer_version)

    def reset(self, buffer_version: int | None = None) -> None:
        """Forget every derived value (the buffer changed) and stamp ``buffer_version``."""
        self.buffer_version = buffer_version
        self.transposed = None
        self.mirrored = None
        self.norms = {}
        self.arrays = {}
        self.passed = set()
        self.segment_bounds = None
        self.segment_tiles = None
