r"""Spatial accelerators as COMET describes them: a hierarchy of memory and compute levels.

An accelerator is COMET's arch description (arXiv 2509.00599; the ``arch.yaml`` of
d-matrix-ai/comet), kept as written in :attr:`Accelerator.comet_arch`: ``ComputeTiles`` and
``MemoryTypes`` (specs: a memory's access ``width`` in bytes and ``depth``, its energies in pJ
per access of one ``width``-byte block, bandwidths in bytes per cycle; a systolic engine's
arrays and PEs, a SIMD unit's lanes) and a ``Hierarchy`` of named levels, each instantiated
``meshX x meshY`` times under its parent (global buffers under DRAM, cores under each global
buffer: a two-level spatial hierarchy) with the network to its parent. The accel cost model
(:mod:`fusekit.accel.tree_model`) reads that description and nothing else; this module checks
its numbers and summarises it for people (:class:`ArchLevel`):

.. math::

    capacity = width \cdot depth, \qquad
    instances = \prod_{\text{path from DRAM}} meshX \cdot meshY, \qquad
    MACs/cycle = \sum_{\text{mac units}} instances \cdot rows_{PE} \cdot cols_{PE}
                 \cdot rows_{arrays} \cdot cols_{arrays}.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fusekit.hw.cpu_gpu import plain

#: Keys under which a hierarchy level lists the levels below it.
_CHILD_KEYS = ("connects", "fills", "drains")


@dataclass(frozen=True, slots=True)
class ArchLevel:
    """One level of the hierarchy, summarised (figures per instance; energies per access).

    Attributes:
        name: the level's name (``GB``, ``IB``, ``GEMMEngine``; COMET's ``[0..3]`` dropped).
        spec: its spec (``GBuffer``, ``SystolicArray``).
        unit_class: the spec's class (``DRAM``, ``SRAM``, ``mac``, ``simd``).
        compute: a compute unit rather than a memory.
        parent: the level above (empty for the root).
        mesh: ``(meshX, meshY)``: the instances under each parent instance, as a mesh.
        per_parent: ``meshX * meshY``.
        instances: instances on the whole accelerator.
        width_bytes: bytes per access (memories; 0 for compute units).
        capacity_bytes: ``width * depth`` (0: unbounded, as DRAM, or a compute unit).
        read_pj: energy of reading one ``width``-byte block (towards the children).
        write_pj: energy of writing one block.
        bw_bytes_per_cycle: the spec's bandwidth (``bw``, else its child-read bandwidth).
        link_bw_bytes_per_cycle: the network to the parent (its ``bw``; 0 at the root).
        hop_latency_cycles: that network's cycles per hop.
        macs_per_cycle: a systolic unit's MACs per cycle (arrays times PEs), else 0.
        lanes: a SIMD unit's lanes (``computeWidth``), else 0.
    """

    name: str
    spec: str
    unit_class: str
    compute: bool
    parent: str
    mesh: tuple[int, int]
    per_parent: int
    instances: int
    width_bytes: int
    capacity_bytes: int
    read_pj: float
    write_pj: float
    bw_bytes_per_cycle: float
    link_bw_bytes_per_cycle: float
    hop_latency_cycles: int
    macs_per_cycle: int
    lanes: int


def _count(value: Any, where: str, key: str, low: int = 1) -> int:
    """``value`` as an integer ``>= low``; else a ``ValueError`` naming ``where`` and ``key``."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    if not ok:
        raise ValueError(f"{where}: expected {key!r} to be an integer >= {low} (got {value!r})")
    return int(value)


def _number(value: Any, where: str, key: str) -> float:
    """``value`` as a finite number ``>= 0``; else a ``ValueError`` naming ``where``/``key``."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: expected {key!r} to be a finite number >= 0 (got {value!r})")
    return float(value)


def _specs(arch: Mapping[str, Any]) -> dict[str, tuple[bool, str, Mapping[str, Any]]]:
    """Spec name -> (compute, class, attributes), from ``ComputeTiles`` and ``MemoryTypes``."""
    out: dict[str, tuple[bool, str, Mapping[str, Any]]] = {}
    for key, compute in (("ComputeTiles", True), ("MemoryTypes", False)):
        entries = arch.get(key) or []
        if not isinstance(entries, list):
            raise ValueError(f"{key}: expected a list of specs")
        for i, e in enumerate(entries):
            if not isinstance(e, Mapping) or "name" not in e:
                raise ValueError(f"{key}[{i}]: expected a mapping with a 'name'")
            attrs = e.get("attributes") or {}
            if not isinstance(attrs, Mapping):
                raise ValueError(f"{key}[{i}]: expected 'attributes' to be a mapping")
            out[str(e["name"])] = (compute, str(e.get("class", "")), attrs)
    return out


def _level(
    entry: Any,
    where: str,
    specs: dict[str, tuple[bool, str, Mapping[str, Any]]],
    parent: str,
    above: int,
) -> ArchLevel:
    """One hierarchy entry summarised; numbers checked, errors naming ``where``."""
    if not isinstance(entry, Mapping) or "name" not in entry or "type" not in entry:
        raise ValueError(f"{where}: expected a level with 'name' and 'type'")
    name = re.sub(r"\[.*\]$", "", str(entry["name"]))
    here = f"{where} ({name})"
    if str(entry["type"]) not in specs:
        raise ValueError(f"{here}: unknown spec {str(entry['type'])!r}")
    compute, cls, spec = specs[str(entry["type"])]
    net = entry.get("attributes") or {}
    if not isinstance(net, Mapping):
        raise ValueError(f"{here}: expected 'attributes' to be a mapping")
    mesh = (_count(net.get("meshX", 1), here, "meshX"), _count(net.get("meshY", 1), here, "meshY"))
    per = mesh[0] * mesh[1]
    width = 0 if compute else _count(spec.get("width", 1), here, "width")
    depth = _count(spec.get("depth", 1), here, "depth") if "depth" in spec else 0
    read = spec.get("child_read_energy", spec.get("parent_read_energy", 0))
    write = spec.get("child_write_energy", spec.get("parent_write_energy", 0))
    macs = 0
    if cls == "mac":
        macs = math.prod(_count(spec.get(k, 1), here, k) for k in
                         ("array_rows", "array_cols", "num_sa_rows", "num_sa_cols"))  # fmt: skip
    return ArchLevel(
        name=name,
        spec=str(entry["type"]),
        unit_class=cls,
        compute=compute or bool(entry.get("is_compute")),
        parent=parent,
        mesh=mesh,
        per_parent=per,
        instances=above * per,
        width_bytes=width,
        capacity_bytes=width * depth,
        read_pj=_number(read, here, "read energy"),
        write_pj=_number(write, here, "write energy"),
        bw_bytes_per_cycle=_number(spec.get("bw", spec.get("child_read_bw", 0)), here, "bw"),
        link_bw_bytes_per_cycle=_number(net.get("bw", 0), here, "bw") if parent else 0.0,
        hop_latency_cycles=_count(net.get("hop_latency", 0), here, "hop_latency", 0),
        macs_per_cycle=macs,
        lanes=_count(spec.get("computeWidth", 1), here, "computeWidth") if cls == "simd" else 0,
    )


def arch_levels(arch: Mapping[str, Any]) -> tuple[ArchLevel, ...]:
    """Every level of a COMET arch description, parents first (a unit under several buffers once).

    Raises:
        ValueError: a malformed description; the message names the entry and the key.
    """
    specs = _specs(arch)
    roots = arch.get("Hierarchy")
    if not isinstance(roots, list) or not roots:
        raise ValueError("Hierarchy: expected a non-empty list of levels")
    out: dict[str, ArchLevel] = {}
    top = [(r, f"Hierarchy[{i}]", "", 1) for i, r in enumerate(roots)]
    stack: list[tuple[Any, str, str, int]] = top[::-1]
    while stack:
        entry, where, parent, above = stack.pop()
        lv = _level(entry, where, specs, parent, above)
        out.setdefault(lv.name, lv)
        kids = [(c, f"{where}.{key}[{i}]") for key in _CHILD_KEYS
                for i, c in enumerate(entry.get(key) or [])]  # fmt: skip
        stack.extend((c, w, lv.name, lv.instances) for c, w in reversed(kids))
    return tuple(out.values())


@dataclass(frozen=True, slots=True)
class Accelerator:
    """A spatial accelerator: COMET's arch description and its summary.

    Attributes:
        name: preset name, e.g. ``"edge"``.
        description: one line for people.
        source: where the figures come from.
        clock_hz: clock used to turn cycles into seconds (COMET gives none: assumed).
        comet_arch: COMET's description, as its arch file spells it (what the cost model reads).
        levels: its levels summarised (:func:`arch_levels`), parents first.
    """

    name: str
    description: str
    source: str
    clock_hz: float
    comet_arch: Mapping[str, Any] = field(hash=False)
    levels: tuple[ArchLevel, ...]

    @property
    def kind(self) -> Literal["accelerator"]:
        """Always ``"accelerator"``."""
        return "accelerator"

    @property
    def macs_per_cycle(self) -> int:
        """MACs per cycle of every systolic unit on the accelerator together."""
        return sum(lv.instances * lv.macs_per_cycle for lv in self.levels)

    @property
    def peak_flops_per_s(self) -> float:
        """Peak GEMM FLOP/s (2 FLOPs per MAC)."""
        return 2.0 * self.macs_per_cycle * self.clock_hz

    def level(self, name: str) -> ArchLevel:
        """The level called ``name``.

        Raises:
            KeyError: no such level; the message lists the levels there are.
        """
        for lv in self.levels:
            if lv.name == name:
                return lv
        have = ", ".join(lv.name for lv in self.levels)
        raise KeyError(f"{self.name}: expected 'level' to be one of {have} (got {name!r})")

    def spatial(self) -> str:
        """The meshes on the way from the root to the first systolic unit: ``GB 2x2 > IB 2x2``."""
        by_name = {lv.name: lv for lv in self.levels}
        unit = next((lv for lv in self.levels if lv.macs_per_cycle), None)
        path = []
        while unit is not None and unit.parent:
            if unit.per_parent > 1:
                path.append(f"{unit.name} {unit.mesh[0]}x{unit.mesh[1]}")
            unit = by_name.get(unit.parent)
        return " > ".join(reversed(path)) or "one instance"

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-ready), with ``kind`` first."""
        return {"kind": self.kind, **plain(self), "macs_per_cycle": self.macs_per_cycle}

    def fingerprint(self) -> str:
        """A short stable hash of every figure, used to key caches."""
        blob = json.dumps(self.to_dict(), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]
