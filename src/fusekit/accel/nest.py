"""Timeloop-style access counting for one op in a perfectly nested, multi-level loop nest.

Levels are listed outermost (main memory) first; the loops listed at a level step through the
tiles held by the level below it, so the tile a level holds spans its own loops and every loop
below. For a tensor ``t`` at level ``i`` with footprint ``F`` (the tile of every dimension:
``sum over its index variables of (extent - 1) + 1``):

* fills: ``outer * (F + (f - 1) * delta)``, where ``f`` is the innermost loop above the level
  that indexes ``t`` (loops inside it reuse the tile: stationarity), ``outer`` multiplies every
  loop outside it, and ``delta`` is the data a step of that loop brings in (all of ``F``, or the
  new part of a sliding window such as ``I[p+r]``);
* reads by the level below: its fills (the MAC count at the innermost level);
* outputs: updates = the level below's fills (drains), or the MAC count innermost; reads =
  updates - fills (the first update of an element reads nothing) plus re-fetched partial sums;
* main memory has no fills; a block of ``block_words`` words costs one access energy.

This reproduces the Timeloop/Accelergy two-level 1-D convolution exercise (tests/accel/
test_nest.py) and counts the DRAM traffic of the accelerator model's GEMM tiles.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Loop = tuple[str, int]


@dataclass(frozen=True, slots=True)
class NestTensor:
    """A tensor of the op: each dimension is indexed by a sum of loop variables."""

    name: str
    dims: tuple[tuple[str, ...], ...]
    is_output: bool = False

    def uses(self, var: str) -> bool:
        """Whether some dimension depends on ``var``."""
        return any(var in d for d in self.dims)


@dataclass(frozen=True, slots=True)
class NestLevel:
    """A storage level: capacity, per-access energies, block size and bandwidth (words)."""

    name: str
    read_pj: float
    write_pj: float
    size_words: int = 0
    block_words: int = 1
    bw_words_per_cycle: float | None = None


@dataclass(frozen=True, slots=True)
class TensorAccesses:
    """Accesses of one tensor at one level, in words."""

    reads: int
    fills: int
    updates: int


@dataclass(frozen=True, slots=True)
class NestBreakdown:
    """Counts, energy and cycles of a loop nest."""

    macs: int
    cycles: float
    accesses: Mapping[str, Mapping[str, TensorAccesses]]
    level_energy_pj: Mapping[str, float]
    mac_energy_pj: float

    @property
    def energy_pj(self) -> float:
        """MAC energy plus every level's access energy."""
        return self.mac_energy_pj + sum(self.level_energy_pj.values())


def footprint(tensor: NestTensor, extents: Mapping[str, int]) -> int:
    """Words of ``tensor`` touched by a tile with the given loop extents."""
    return math.prod(sum(extents.get(v, 1) - 1 for v in d) + 1 for d in tensor.dims)


def fills(tensor: NestTensor, above: Sequence[Loop], extents: Mapping[str, int]) -> int:
    """Words of ``tensor`` brought into a level (see the module docstring).

    Args:
        tensor: the tensor.
        above: the loops above the level, outermost first.
        extents: the extent of every variable within the level's tile.
    """
    size = footprint(tensor, extents)
    active = [(v, f) for v, f in above if f > 1]
    inner = max((i for i, (v, _) in enumerate(active) if tensor.uses(v)), default=None)
    if inner is None:
        return size
    var, factor = active[inner]
    kept = 1.0
    for d in tensor.dims:
        if var in d:
            width = sum(extents.get(v, 1) - 1 for v in d) + 1
            kept *= max(0, width - extents.get(var, 1)) / width
    delta = round(size * (1.0 - kept))
    outer = math.prod(f for _, f in active[:inner])
    return outer * (size + (factor - 1) * delta)


def analyze_nest(
    levels: Sequence[NestLevel],
    loops: Sequence[Sequence[Loop]],
    tensors: Sequence[NestTensor],
    mac_pj: float,
    macs_per_cycle: float = 1.0,
) -> NestBreakdown:
    """Accesses, energy and cycles of one op mapped onto ``levels`` (outermost first).

    Args:
        levels: the storage levels, main memory first.
        loops: the ``(variable, factor)`` loops of each level, outermost first.
        tensors: the op's tensors (one output).
        mac_pj: energy of one MAC.
        macs_per_cycle: MACs per cycle of the compute.

    Returns:
        The breakdown: ``cycles = max(macs / macs_per_cycle, accesses / bandwidth per level)``.

    Raises:
        ValueError: ``loops`` and ``levels`` differ in length, or a tile exceeds a capacity.
    """
    if len(loops) != len(levels):
        raise ValueError(f"nest: expected one loop list per level (got {len(loops)})")
    n = len(levels)
    extents_at = []
    for i in range(n):
        ext: dict[str, int] = {}
        for lv in loops[i:]:
            for v, f in lv:
                ext[v] = ext.get(v, 1) * f
        extents_at.append(ext)
    macs = math.prod(extents_at[0].values())
    above_at = [[lp for lv in loops[:i] for lp in lv] for i in range(n)]
    fill = [
        {t.name: fills(t, above_at[i], extents_at[i]) if i else 0 for t in tensors}
        for i in range(n)
    ]
    for i in range(1, n):
        used = sum(footprint(t, extents_at[i]) for t in tensors)
        if levels[i].size_words and used > levels[i].size_words:
            raise ValueError(
                f"nest: expected the tiles at {levels[i].name} to fit {levels[i].size_words} "
                f"words (got {used})"
            )
    accesses: dict[str, dict[str, TensorAccesses]] = {}
    energy: dict[str, float] = {}
    cycles = macs / macs_per_cycle
    for i, level in enumerate(levels):
        per: dict[str, TensorAccesses] = {}
        for t in tensors:
            served = fill[i + 1][t.name] if i + 1 < n else macs
            size = footprint(t, extents_at[0])
            if t.is_output:
                refetch = max(0, served - size) if i + 1 < n else 0
                rmw = served - fill[i][t.name] if i else 0
                per[t.name] = TensorAccesses(rmw + refetch, fill[i][t.name], served)
            else:
                per[t.name] = TensorAccesses(served, fill[i][t.name], 0)
        accesses[level.name] = per
        b = level.block_words
        energy[level.name] = sum(
            math.ceil(a.reads / b) * level.read_pj
            + math.ceil((a.fills + a.updates) / b) * level.write_pj
            for a in per.values()
        )
        if level.bw_words_per_cycle:
            words = sum(a.reads + a.fills + a.updates for a in per.values())
            cycles = max(cycles, words / level.bw_words_per_cycle)
    return NestBreakdown(macs, cycles, accesses, energy, macs * mac_pj)
