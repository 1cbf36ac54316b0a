"""The plain records the tree model's stages hand each other, and its errors."""

from __future__ import annotations

from dataclasses import dataclass, field

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


#: Per tile node, per tensor, one :class:`Move` per iteration.
Moves = dict[int, list[list[Move]]]


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
        return Cost(mem_net=[0] * n, stall=[0] * n, compulsory=[0] * n, window=[0] * n)


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
