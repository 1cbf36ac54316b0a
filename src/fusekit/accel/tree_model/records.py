"""The plain records the tree model's stages hand each other, and its errors."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

import numpy as np

from fusekit.accel.tree import Level, TreeNode
from fusekit.errors import FusekitError

#: COMET computes in float32 where its code does; the model rounds at the same places.
f32 = np.float32

#: One child of a node, or a group of children bound together: what a memory window covers.
Children = TreeNode | list[TreeNode]
#: Per (target level, child level): per tensor, its [read port, write port] costs.
PortCosts = dict[tuple[str, str], list[list["Cost"]]]
#: Per target level: its [read port, write port] costs, the level's tensors merged.
LevelCosts = dict[str, list["Cost"]]


class FitError(FusekitError, ValueError):
    """A tiling COMET's fit check rejects; the message names every overflowing level."""

    def __init__(self, file: str, overflows: list[tuple[str, int, int]]) -> None:
        self.overflows = overflows
        parts = "; ".join(
            f"Tensors do not fit in {lv} | Capacity: {cap} Bytes | Requested: {req} Bytes"
            for lv, cap, req in overflows
        )
        super().__init__(f"{file}: tiling rejected by the fit check: {parts}")


class TreeModelError(FusekitError, ValueError):
    """A tree the model cannot evaluate (COMET would crash on it); names the node."""


@dataclass(slots=True)
class Nest:
    """Per-tensor loop descriptors of one tile node (COMET's ``LoopNode``)."""

    desc: list[list[dict[int, tuple[int, int]]]]  # [tensor][spatial idx] dim -> (end, stride)
    iters: list[int]
    sp_iters: list[int]
    rel_ts: list[int]
    rw: list[bool]
    dependent: list[bool]


@dataclass(slots=True)
class Nests:
    """Loop nests of every tile node and the collectives' tensor extents."""

    tiles: dict[int, Nest] = field(default_factory=dict)
    col_in: dict[int, list[dict[int, int]]] = field(default_factory=dict)
    col_out: dict[int, list[dict[int, int]]] = field(default_factory=dict)


@dataclass(slots=True)
class Move:
    """One iteration's transfer of a tensor: tile elements, distinct tiles, spatial children."""

    tile: int
    unique: int
    count: int


class MoveRow(Sequence[Move]):
    """A tensor's moves over ``n`` iterations, without a list of ``n`` of them.

    ``moved`` at iteration 0 and every ``period``-th (``period`` 0: only at 0), ``kept`` between
    (:func:`.nests.temporal_period`); :meth:`moving` counts the iterations that move a tile.
    """

    __slots__ = ("kept", "moved", "n", "period")

    def __init__(self, n: int, period: int, moved: Move, kept: Move) -> None:
        self.n, self.period, self.moved, self.kept = n, period, moved, kept

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, i: int) -> Move: ...
    @overload
    def __getitem__(self, i: slice) -> MoveRow: ...
    def __getitem__(self, i: int | slice) -> Move | MoveRow:
        if isinstance(i, slice):
            if i.start not in (None, 0) or i.step not in (None, 1):
                raise IndexError("a MoveRow slices its first iterations only")
            stop = self.n if i.stop is None else max(0, min(i.stop, self.n))
            return MoveRow(stop, self.period, self.moved, self.kept)
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.moved if i == 0 or (self.period > 0 and i % self.period == 0) else self.kept

    def __iter__(self) -> Iterator[Move]:
        moved, kept, p = self.moved, self.kept, self.period
        for i in range(self.n):
            yield moved if i == 0 or (p > 0 and i % p == 0) else kept

    def firsts(self) -> int:
        """Iterations that get ``moved``: 0 and the multiples of ``period`` below ``n``."""
        if self.n == 0:
            return 0
        return 1 if self.period <= 0 else -(-self.n // self.period)

    def moving(self) -> int:
        """Iterations whose move carries tiles (``unique != 0``)."""
        first = self.firsts()
        return (first if self.moved.unique else 0) + (
            self.n - first if self.kept.unique else 0)  # fmt: skip


#: Per tile node, per tensor, its moves over the node's iterations.
Moves = dict[int, list[MoveRow]]


@dataclass(slots=True)
class Cost:
    """Per-port cost of a tensor (or merged per level) over a node's iterations."""

    compute_time: int = 0
    mem_net: list[int] = field(default_factory=list)
    stall: list[int] = field(default_factory=list)
    compulsory: list[int] = field(default_factory=list)
    window: list[int] = field(default_factory=list)
    reuse: int = 0
    tens_idx: int = 0
    hide: bool = True
    cumm: int = 0
    cumm_stall: int = 0
    ramp_up: int = 0
    ramp_down: int = 0
    access_count: int = 1
    tile_size: int = 1
    noc_pj: float = 0.0

    @staticmethod
    def sized(n: int) -> Cost:
        """A cost with ``n`` zeroed iterations."""
        # positional (compute_time, mem_net, stall, compulsory, window): the faster call
        return Cost(0, [0] * n, [0] * n, [0] * n, [0] * n)


@dataclass(slots=True)
class Access:
    """Accesses of one tensor at one level (or of a compute unit) at a node."""

    level: Level
    count: int
    tile: int = 0
    precision: int = 0
    rw: bool = True
    at_target: bool = True
    compute: bool = False
    tid: int = 0
    rmw: bool = False
    proj_count: int = 1
    tag: str = ""
    op_type: str = ""
    noc_pj: float = 0.0
    mac_pj: float = 0.0
