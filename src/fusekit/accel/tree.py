"""A mapping tree general enough for COMET's mappings, on a hierarchy of spatial levels.

The shared description that :mod:`fusekit.accel.tree_model` evaluates (the COMET front end,
:mod:`fusekit.accel.comet`, reads COMET's files into it):

* :class:`Hierarchy`: levels (memory or compute) by name, each with its spec attributes, its
  instance count (``meshX * meshY``: cores under each global buffer, global buffers under DRAM:
  a two-level spatial hierarchy), the network to each child and, for collectives, to its peers;
* :class:`Chain`: the ops (a chain need not start with a GEMM), their tensors and projections;
* :class:`TreeNode`: tile nodes (per tensor: target and child level, op tag, precision in bits,
  temporal or spatial factors per dim, loop order), op leaves (tile primitive, per-tensor tile
  steps, reduction attributes), bindings, and collectives placed where the mapping puts them;
* :class:`TreeMapping`: the three together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fusekit.errors import FusekitError


class TreeInputError(FusekitError, ValueError):
    """A mapping-tree description is malformed; one line naming the file (source) and the node."""

    def __init__(self, file: str, node: str, problem: str) -> None:
        self.file = file
        self.node = node
        super().__init__(f"{file}: {node}: {problem}")


@dataclass(frozen=True, slots=True)
class Network:
    """A parent-to-child (or peer) network: COMET's ``NetworkSpec`` attributes."""

    mesh: bool
    dims: tuple[int, int]
    port_bw: int
    hop_latency: int
    broadcast: bool
    reduction: bool
    queuing_delay: int
    channel_width: int


@dataclass(slots=True)
class Level:
    """One architecture level (memory or compute) with its spec and networks."""

    name: str
    rank: int  # creation order: COMET orders its per-level maps by this
    kind: str  # spec (type) name, e.g. "GBuffer", "SystolicArray"
    is_compute: bool
    attrs: dict[str, Any]
    instances: int = 1
    child_nets: dict[str, Network] = field(default_factory=dict)
    link_net: Network | None = None

    def num(self, key: str, default: float = 0) -> Any:
        """A numeric spec attribute (``default`` when absent)."""
        return self.attrs.get(key, default)

    def width_bytes(self) -> int:
        """Bytes per access block."""
        return int(self.attrs.get("width", 1))

    def capacity_bytes(self) -> int:
        """Bytes of one instance: ``width * depth`` (compute levels: ``capacity``)."""
        if self.is_compute:
            return int(self.attrs.get("capacity", 0))
        return int(self.attrs.get("width", 1)) * int(self.attrs.get("depth", 1))

    def bw(self, which: str) -> int:
        """A bandwidth attribute (``parent_read_bw``, ...); a generic ``bw`` overrides them."""
        if "bw" in self.attrs:
            return int(self.attrs["bw"])
        return int(self.attrs.get(which, 0))


@dataclass(slots=True)
class Hierarchy:
    """The levels by name."""

    levels: dict[str, Level]

    def level(self, name: str, file: str, node: str) -> Level:
        """The level called ``name``; a clear error when there is none."""
        if name not in self.levels:
            raise TreeInputError(
                file, node, f"unknown level {name!r} (levels: {', '.join(sorted(self.levels))})"
            )
        return self.levels[name]


@dataclass(frozen=True, slots=True)
class OpSpec:
    """One op of the problem: its io and each tensor's projection (one dim per rank)."""

    name: str
    ins: tuple[str, ...]
    out: str
    projections: dict[int, tuple[int, ...]]  # tensor id -> dim id per rank
    rw: frozenset[int]
    dims: tuple[int, ...] = ()  # the op's iteration space (dim ids); empty: every dim


@dataclass(frozen=True, slots=True)
class Chain:
    """Dimensions, sizes, tensors and ops of a COMET problem."""

    dims: tuple[str, ...]
    sizes: dict[int, int]
    tensors: tuple[str, ...]  # by id
    ins: tuple[str, ...]
    outs: tuple[str, ...]
    ops: dict[str, OpSpec]  # sorted by name, as COMET iterates them

    def tid(self, name: str, file: str, node: str) -> int:
        """The id of tensor ``name``."""
        if name not in self.tensors:
            raise TreeInputError(file, node, f"unknown tensor {name!r}")
        return self.tensors.index(name)

    def dim(self, name: str, file: str, node: str) -> int:
        """The id of dimension ``name``."""
        if name not in self.dims:
            raise TreeInputError(file, node, f"unknown dimension {name!r}")
        return self.dims.index(name)

    @property
    def intermediates(self) -> frozenset[int]:
        """Tensors that are neither problem inputs nor outputs."""
        io = set(self.ins) | set(self.outs)
        return frozenset(i for i, t in enumerate(self.tensors) if t not in io)

    def projection(self, tag: str, tid: int) -> tuple[int, ...]:
        """The projection of ``tid`` as COMET picks it: the tag's op, else the first op using it."""
        op = self.ops.get(tag)
        if op is None or tid not in op.projections:
            name = self.tensors[tid]
            op = next(
                (o for o in self.ops.values() if name in o.ins or name == o.out),
                list(self.ops.values())[-1],
            )
        if tid not in op.projections:
            raise KeyError(tid)
        return op.projections[tid]


@dataclass(slots=True)
class TreeNode:
    """One node of a COMET mapping tree (``kind``: tile, op, bind or collective)."""

    id: int
    kind: str
    children: list[TreeNode] = field(default_factory=list)
    parent: TreeNode | None = None
    # tile
    spatial: bool = False
    tensors: list[int] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)
    childs: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    scale: list[int] = field(default_factory=list)
    rmw: list[bool] = field(default_factory=list)
    order: list[int] = field(default_factory=list)  # dim ids, innermost first
    tilings: list[list[dict[int, int]]] = field(default_factory=list)  # [tensor][spatial idx]
    # op
    op_type: str = ""
    op_name: str = ""
    primitive: dict[int, int] = field(default_factory=dict)
    tilesizes: dict[int, dict[int, int]] = field(default_factory=dict)
    red_dims: list[int] = field(default_factory=list)
    red_factors: dict[int, int] = field(default_factory=dict)
    # binding
    binding: str = ""
    # collective
    col_type: str = ""
    red_op: str = ""
    dim: int = 0
    tag: str = ""
    spatial_factor: int = 0
    precision: int = 1
    src: list[str] = field(default_factory=list)
    dest: list[str] = field(default_factory=list)
    in_tensor: int = 0
    out_tensor: int = 0
    wb_output: bool = False
    target: str = ""
    child: str = ""

    @property
    def label(self) -> str:
        """COMET's printed name of the node."""
        names = {"tile": "DataMovementTileNode", "op": "OperationNode",
                 "bind": "InterTileBinding", "collective": "CollectiveOpNode"}  # fmt: skip
        return f"{names[self.kind]}::{self.id}"

    @property
    def is_leaf_tile(self) -> bool:
        """A tile node whose first child is an op."""
        return self.kind == "tile" and bool(self.children) and self.children[0].kind == "op"


@dataclass(frozen=True, slots=True)
class TreeMapping:
    """A hierarchy, an op chain and a mapping tree over them."""

    arch: Hierarchy
    problem: Chain
    mapping: TreeNode
    const: dict[str, Any]
    mapping_file: str
