"""Spatial accelerators: a mesh of clusters, each with systolic arrays, a SIMD unit and buffers.

The description follows the COMET configurations (arXiv 2509.00599): every cluster holds a grid of
systolic arrays for GEMM and a SIMD unit for the rest (exp, div, row-max, ...), private input /
weight / output buffers and a slice of the global buffer; clusters talk over a network-on-chip
(mesh, hop latency, link bandwidth) that may reduce or broadcast in the network; all share DRAM.
Energies are per access of ``word_bytes`` bytes.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fusekit.hw.cpu_gpu import plain

#: SIMD operations whose per-op cost is ``ceil(log2(simd_width))`` cycles (a reduction tree).
TREE_REDUCTIONS: tuple[str, ...] = ("row_sum", "row_max")


@dataclass(frozen=True, slots=True)
class MemoryLevel:
    """One level of the memory hierarchy.

    Attributes:
        name: ``input``, ``weight``, ``output``, ``global`` or ``dram``.
        size_bytes: capacity (per cluster for on-chip levels; 0 means unbounded, for DRAM).
        read_pj: energy of reading one word.
        write_pj: energy of writing one word.
        bw_bytes_per_cycle: bandwidth, or ``None`` where the level is sized to feed its consumer
            every cycle and so never limits (the COMET tables give no figure for it).
        double_buffered: whether filling the next tile overlaps computing the current one.
    """

    name: str
    size_bytes: int
    read_pj: float
    write_pj: float
    bw_bytes_per_cycle: float | None
    double_buffered: bool


@dataclass(frozen=True, slots=True)
class SystolicArrays:
    """A grid of systolic arrays in one cluster: ``grid_rows x grid_cols`` arrays of PEs."""

    grid_rows: int
    grid_cols: int
    pe_rows: int
    pe_cols: int

    @property
    def macs_per_cycle(self) -> int:
        """MACs per cycle of the whole grid at full utilisation."""
        return self.grid_rows * self.grid_cols * self.pe_rows * self.pe_cols


@dataclass(frozen=True, slots=True)
class Network:
    """The network-on-chip between clusters.

    Attributes:
        topology: ``mesh``, ``torus`` or ``ring``.
        link_bw_bytes_per_cycle: bandwidth of one link, one direction.
        hop_latency_cycles: cycles a flit spends per hop.
        channel_bits: width of one channel.
        in_network_broadcast: routers can replicate a packet (multicast).
        in_network_reduction: routers can add packets on the way.
        hop_pj_per_byte: energy of moving one byte over one hop (router plus link).
    """

    topology: Literal["mesh", "torus", "ring"]
    link_bw_bytes_per_cycle: float
    hop_latency_cycles: int
    channel_bits: int
    in_network_broadcast: bool
    in_network_reduction: bool
    hop_pj_per_byte: float


@dataclass(frozen=True, slots=True)
class Accelerator:
    """A multi-cluster spatial accelerator.

    Attributes:
        name: preset name, e.g. ``"edge"``.
        description: one line for people.
        source: where the figures come from.
        clock_hz: clock used to turn cycles into seconds.
        word_bytes: bytes per memory word; energies are per word.
        mesh_rows: cluster rows.
        mesh_cols: cluster columns.
        systolic: the systolic-array grid of one cluster.
        simd_width: lanes of one cluster's SIMD unit.
        levels: the memory levels, innermost first, DRAM last.
        network: the network-on-chip.
        mac_pj: energy of one MAC.
        simd_op_pj: energy of one SIMD lane-op, by op name.
        simd_op_cycles: cycles of one SIMD op over ``simd_width`` lanes, by op name (row
            reductions are derived, see :meth:`simd_cycles`).
        comet_arch: COMET's own description of the accelerator, as its arch file spells it
            (``ComputeTiles``, ``MemoryTypes``, ``Hierarchy``: a two-level spatial hierarchy,
            energies per ``width``-byte block, bandwidths in bytes per cycle), or ``None``;
            :mod:`fusekit.accel.comet` evaluates COMET mappings on it.
    """

    name: str
    description: str
    source: str
    clock_hz: float
    word_bytes: int
    mesh_rows: int
    mesh_cols: int
    systolic: SystolicArrays
    simd_width: int
    levels: tuple[MemoryLevel, ...]
    network: Network
    mac_pj: float
    simd_op_pj: Mapping[str, float]
    simd_op_cycles: Mapping[str, int]
    comet_arch: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)

    @property
    def kind(self) -> Literal["accelerator"]:
        """Always ``"accelerator"``."""
        return "accelerator"

    @property
    def n_clusters(self) -> int:
        """Clusters in the mesh."""
        return self.mesh_rows * self.mesh_cols

    @property
    def macs_per_cycle(self) -> int:
        """MACs per cycle of the whole chip."""
        return self.n_clusters * self.systolic.macs_per_cycle

    @property
    def peak_flops_per_s(self) -> float:
        """Peak GEMM FLOP/s (2 FLOPs per MAC)."""
        return 2.0 * self.macs_per_cycle * self.clock_hz

    def level(self, name: str) -> MemoryLevel:
        """The memory level called ``name``.

        Raises:
            KeyError: no such level; the message lists the levels there are.
        """
        for level in self.levels:
            if level.name == name:
                return level
        have = ", ".join(lv.name for lv in self.levels)
        raise KeyError(f"{self.name}: expected 'level' to be one of {have} (got {name!r})")

    def simd_cycles(self, op: str) -> int:
        """Cycles for one SIMD op over ``simd_width`` lanes.

        ``row_sum`` and ``row_max`` reduce a vector with an adder/comparator tree:
        ``ceil(log2(simd_width))`` cycles. Other ops come from ``simd_op_cycles``.

        Raises:
            KeyError: the op has no cycle figure.
        """
        if op in TREE_REDUCTIONS:
            return math.ceil(math.log2(self.simd_width))
        try:
            return self.simd_op_cycles[op]
        except KeyError:
            have = ", ".join([*sorted(self.simd_op_cycles), *TREE_REDUCTIONS])
            raise KeyError(f"{self.name}: expected 'op' to be one of {have} (got {op!r})") from None

    def simd_energy_pj(self, op: str) -> float:
        """Energy of one SIMD lane-op (row reductions cost one ``add``/``max`` per element).

        Raises:
            KeyError: the op has no energy figure.
        """
        base = {"row_sum": "add", "row_max": "max"}.get(op, op)
        try:
            return self.simd_op_pj[base]
        except KeyError:
            have = ", ".join(sorted(self.simd_op_pj))
            raise KeyError(f"{self.name}: expected 'op' to be one of {have} (got {op!r})") from None

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-ready), with ``kind`` first."""
        return {"kind": self.kind, **plain(self)}

    def fingerprint(self) -> str:
        """A short stable hash of every figure, used to key caches."""
        blob = json.dumps(self.to_dict(), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]
