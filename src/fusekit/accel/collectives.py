"""Collective communication between clusters of the mesh, with pluggable cost models.

A collective moves ``n`` bytes among a group of ``p = rows x cols`` clusters forming a sub-mesh
(``D = (rows - 1) + (cols - 1)`` hops across). With ``h`` the hop latency (cycles) and
``beta = 1 / link_bw`` (cycles per byte), the three models give (COMET models collectives
explicitly; the alpha-beta forms are Thakur, Rabenseifner and Gropp, IJHPCA 2005):

* broadcast: mesh ``D h + n beta`` (multicast); ring ``2 (p-1)(alpha + n/p beta)``
  (scatter then all-gather); tree ``D h + L n beta`` (``L = ceil(log2 p)`` steps);
* reduce: mesh ``D (h + n beta)`` (no in-network reduction: each hop reduces and forwards);
  ring ``2 (p-1)(alpha + n/p beta)``; tree ``D h + L n beta``;
* scatter, gather, all-gather, reduce-scatter: mesh and tree ``D h + (p-1)/p n beta``; ring
  ``(p-1)(alpha + n/p beta)``;
* all-reduce: mesh reduce + broadcast; ring ``2 (p-1)(alpha + n/p beta)``; tree
  ``2 D h + 2 (p-1)/p n beta`` (recursive halving then doubling).

With in-network broadcast off, the mesh broadcast is ``D (h + n beta)`` (store and forward); with
in-network reduction on, the mesh reduce is ``D h + n beta``. The ring is embedded in the group:
a ring step is one hop (``s = 1``) when the sub-mesh has a Hamiltonian cycle (both sides >= 2, an
even count) or ``p = 2``, else two hops (a ring folded onto a line). Energy counts byte-hops, the
same for every model: ``(p-1) n`` for broadcast, reduce, all-gather and reduce-scatter,
``2 (p-1) n`` for all-reduce, and ``n/p`` times the summed distance from the root corner for
scatter and gather.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from fusekit.errors import expected
from fusekit.hw import Network


class CollectiveKind(StrEnum):
    """The collectives a mapping may place between siblings."""

    BROADCAST = "broadcast"
    REDUCE = "reduce"
    SCATTER = "scatter"
    GATHER = "gather"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_REDUCE = "all_reduce"


@dataclass(frozen=True, slots=True)
class Group:
    """A sub-mesh of ``rows x cols`` clusters taking part in a collective."""

    rows: int
    cols: int

    def __post_init__(self) -> None:
        for name in ("rows", "cols"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(expected("Group", name, "an int >= 1", v))

    @property
    def size(self) -> int:
        """Clusters in the group."""
        return self.rows * self.cols

    @property
    def diameter_hops(self) -> int:
        """Hops between opposite corners."""
        return self.rows - 1 + self.cols - 1


@dataclass(frozen=True, slots=True)
class CollectiveCost:
    """Latency and traffic of one collective."""

    cycles: float
    byte_hops: float


class CollectiveModel(Protocol):
    """A cost model of collectives; add one by implementing ``cycles``."""

    @property
    def name(self) -> str:
        """The key of the model in :data:`MODELS`."""
        ...

    def cycles(self, kind: CollectiveKind, n_bytes: float, group: Group, net: Network) -> float:
        """Cycles of ``kind`` moving ``n_bytes`` within ``group``."""
        ...


def _beta(net: Network) -> float:
    return 1.0 / net.link_bw_bytes_per_cycle


@dataclass(frozen=True, slots=True)
class MeshDiameter:
    """Every collective crosses the group's diameter once (twice for all-reduce)."""

    name: str = "mesh"

    def cycles(self, kind: CollectiveKind, n_bytes: float, group: Group, net: Network) -> float:
        """See the module table."""
        p, d, h, b = group.size, group.diameter_hops, net.hop_latency_cycles, _beta(net)
        broadcast = d * h + n_bytes * b if net.in_network_broadcast else d * (h + n_bytes * b)
        reduce = d * h + n_bytes * b if net.in_network_reduction else d * (h + n_bytes * b)
        spread = d * h + (p - 1) / p * n_bytes * b
        return {
            CollectiveKind.BROADCAST: broadcast,
            CollectiveKind.REDUCE: reduce,
            CollectiveKind.ALL_REDUCE: reduce + broadcast,
        }.get(kind, spread)


@dataclass(frozen=True, slots=True)
class RingAlphaBeta:
    """Ring algorithms embedded in the sub-mesh."""

    name: str = "ring"

    def cycles(self, kind: CollectiveKind, n_bytes: float, group: Group, net: Network) -> float:
        """See the module table."""
        p = group.size
        hamiltonian = group.rows >= 2 and group.cols >= 2 and p % 2 == 0
        step_hops = 1 if hamiltonian or p <= 2 else 2
        alpha, b = net.hop_latency_cycles * step_hops, _beta(net)
        one_pass = (p - 1) * (alpha + n_bytes / p * b)
        two_pass = (CollectiveKind.BROADCAST, CollectiveKind.REDUCE, CollectiveKind.ALL_REDUCE)
        return 2 * one_pass if kind in two_pass else one_pass


@dataclass(frozen=True, slots=True)
class TreeAlphaBeta:
    """Binomial trees and recursive halving/doubling; the steps together span the diameter."""

    name: str = "tree"

    def cycles(self, kind: CollectiveKind, n_bytes: float, group: Group, net: Network) -> float:
        """See the module table."""
        p, d, h, b = group.size, group.diameter_hops, net.hop_latency_cycles, _beta(net)
        steps = math.ceil(math.log2(p))
        if kind in (CollectiveKind.BROADCAST, CollectiveKind.REDUCE):
            return d * h + steps * n_bytes * b
        if kind is CollectiveKind.ALL_REDUCE:
            return 2 * d * h + 2 * (p - 1) / p * n_bytes * b
        return d * h + (p - 1) / p * n_bytes * b


#: The collective models by name.
MODELS: dict[str, CollectiveModel] = {
    "mesh": MeshDiameter(),
    "ring": RingAlphaBeta(),
    "tree": TreeAlphaBeta(),
}


def byte_hops(kind: CollectiveKind, n_bytes: float, group: Group) -> float:
    """Bytes times hops of one collective (see the module docstring)."""
    p, r, c = group.size, group.rows, group.cols
    if kind in (CollectiveKind.SCATTER, CollectiveKind.GATHER):
        distance_sum = c * r * (r - 1) / 2 + r * c * (c - 1) / 2
        return n_bytes / p * distance_sum
    if kind is CollectiveKind.ALL_REDUCE:
        return 2 * (p - 1) * n_bytes
    return (p - 1) * n_bytes


def collective_cost(
    kind: CollectiveKind | str, n_bytes: float, group: Group, net: Network, model: str = "mesh"
) -> CollectiveCost:
    """Latency and byte-hops of one collective; a group of one cluster costs nothing.

    Args:
        kind: the collective.
        n_bytes: bytes of the (whole) message: each cluster's vector for all-reduce.
        group: the clusters taking part.
        net: the network-on-chip.
        model: ``mesh``, ``ring`` or ``tree`` (a key of :data:`MODELS`).

    Raises:
        ValueError: an unknown kind or model, or negative bytes.
    """
    try:
        kind = CollectiveKind(kind)
    except ValueError:
        have = ", ".join(k.value for k in CollectiveKind)
        raise ValueError(expected("collective", "kind", f"one of {have}", kind)) from None
    if model not in MODELS:
        raise ValueError(expected("collective", "model", "one of " + ", ".join(MODELS), model))
    if n_bytes < 0:
        raise ValueError(expected("collective", "n_bytes", ">= 0", n_bytes))
    if group.size == 1 or n_bytes == 0:
        return CollectiveCost(0.0, 0.0)
    cycles = MODELS[model].cycles(kind, n_bytes, group, net)
    return CollectiveCost(cycles, byte_hops(kind, n_bytes, group))


def group_on_mesh(size: int, mesh_rows: int, mesh_cols: int, first: str = "cols") -> Group:
    """The sub-mesh a partition of ``size`` clusters occupies, filling ``first`` first.

    Raises:
        ValueError: ``size`` does not tile the mesh that way.
    """
    along, across = (mesh_cols, mesh_rows) if first == "cols" else (mesh_rows, mesh_cols)
    a = min(size, along)
    b = size // a
    if a * b != size or b > across:
        raise ValueError(
            expected("accel", "spatial factor", f"a sub-mesh of {mesh_rows}x{mesh_cols}", size)
        )
    return Group(b, a) if first == "cols" else Group(a, b)
