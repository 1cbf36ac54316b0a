r"""Stage 6, the report: COMET's per-unit cycle table, per-level energy rows and the loop nest.

Per node shown (a collective, a spatial tile, a leaf tile) and per group of levels it moves
data through, times the iterations of the nodes above it:

* CS, the ramps: the largest ramp-up plus ramp-down over the levels, per port;
* OS, the exposed transfers: the node's cycles less its ramps and compute window (a
  collective: its cycles);
* TMW, the compute: a leaf's compute window, under its op's name.

The total cycles are the table's sum (COMET's binary) or the root node's cycles (native); the
total energy is the float32 sum of the energy rows.
"""

from __future__ import annotations

from typing import Any, TypedDict

from fusekit.accel.compat import Compat
from fusekit.accel.tree import TreeNode, pre_order
from fusekit.accel.tree_model.compute import ideal_op_cycles
from fusekit.accel.tree_model.energy import Energy, round_f32
from fusekit.accel.tree_model.records import LevelCosts, f32
from fusekit.accel.tree_model.steady import SteadyState


class Report(TypedDict):
    """What the tree model reports of one tree.

    Attributes:
        total_cycles: COMET's total: the table's sum, or (native) the root's cycles.
        total_energy_pj: the float32 sum of the energy rows.
        cycles: unit -> ``CS``, ``OS``, ``TMW`` cycles and their ``total``.
        energy_pj: COMET's energy rows: level (a compute level per op), then routers.
        root_cycles: the root node's cycles.
        nest: the loop nest, a record per node in pre-order (:func:`loop_nest`).
        ideal_cycles: op -> ideal compute cycles (:func:`.compute.ideal_op_cycles`).
        utilisation: compute unit -> ideal compute cycles over the root's cycles.
    """

    total_cycles: int
    total_energy_pj: float
    cycles: dict[str, dict[str, int]]
    energy_pj: dict[str, float]
    root_cycles: int
    nest: list[dict[str, Any]]  # JSON-ready records
    ideal_cycles: dict[str, int]
    utilisation: dict[str, float]


def report(
    ss: SteadyState, en: Energy, root: TreeNode, calc_noc: bool, compat: Compat,
    detail: bool = True,
) -> Report:  # fmt: skip
    """COMET's per-unit cycle table (CS, OS, TMW) and per-level energy rows.

    ``detail``: also the loop nest, ideal compute cycles and utilisation (else empty).
    """
    nodes = pre_order(root)
    table, total = unit_cycles(ss, en, nodes, compat)
    energy = level_energy(ss, en, nodes, calc_noc)
    e_total = 0.0
    for k in sorted(energy):
        e_total = round_f32(e_total + energy[k])
    units = {k: {**dict(sorted(row.items())), "total": sum(row.values())}
             for k, row in sorted(table.items())}  # fmt: skip
    ideal, utilisation = ideal_compute(ss, root) if detail else ({}, {})
    return {
        "total_cycles": total if compat.unit_sum_total else ss.node_cost[root.id],
        "total_energy_pj": e_total,
        "cycles": units,
        "energy_pj": dict(sorted(energy.items())),
        "root_cycles": ss.node_cost[root.id],
        "nest": loop_nest(ss, en, root) if detail else [],
        "ideal_cycles": ideal,
        "utilisation": utilisation,
    }


def _ranks(ss: SteadyState) -> dict[str, int]:
    """Each level's creation rank: COMET orders its per-level maps by it."""
    return {name: lv.rank for name, lv in ss.arch.levels.items()}


def _group_cycles(levels: LevelCosts, names: list[str]) -> tuple[int, int, int]:
    """A group of levels' ramps, largest cumulated transfer and largest compute window.

    The ramps: the largest ramp-up plus ramp-down per port, both ports summed.
    """
    cs_read = cs_write = cumm = comp = 0
    for lv in names:
        read, write = levels[lv]
        cs_read = max(cs_read, read.ramp_up + read.ramp_down)
        cs_write = max(cs_write, write.ramp_up + write.ramp_down)
        cumm = max(cumm, read.cumm, write.cumm)
        comp = max(comp, read.compute_time, write.compute_time)
    return cs_read + cs_write, cumm, comp


def unit_cycles(
    ss: SteadyState, en: Energy, nodes: list[TreeNode], compat: Compat
) -> tuple[dict[str, dict[str, int]], int]:
    """The per-unit table (unit -> CS, OS, TMW cycles) and its sum (module docstring).

    ``nodes``: the tree in pre-order; the table shows its collectives, spatial and leaf tiles.
    """
    table: dict[str, dict[str, int]] = {}
    total = 0
    by_rank = _ranks(ss).__getitem__
    for node in nodes:
        if not (node.kind == "collective" or (node.kind == "tile" and
                                              (node.spatial or node.is_leaf_tile))):  # fmt: skip
            continue
        its = en.parent_iters.get(node.id, 1) & 0xFFFFFFFF
        for levels in ss.level_cost.get(node.id, {}).values():
            names = sorted(levels, key=by_rank)
            cs, os_, comp = _group_cycles(levels, names)
            if node.kind == "collective":
                key = f"{node.col_type.upper()}-{node.id}"
                total += (cs + os_) * its
                row = table.setdefault(key, {})
                row["OS"] = row.get("OS", 0) + (cs + os_) * its
                continue
            os_ = max(ss.node_cost[node.id] - cs - comp, 0)
            key = "".join([f"{n}-" for n in names])
            total += (cs + os_) * its
            row = table.setdefault(key, {})
            row["CS"] = row.get("CS", 0) + cs * its
            row["OS"] = row.get("OS", 0) + (os_ if compat.unscaled_os else os_ * its)
            if node.is_leaf_tile:
                total += comp * its
                table.setdefault(node.children[0].op_name, {})["TMW"] = comp * its
    return table, total


def level_energy(
    ss: SteadyState, en: Energy, nodes: list[TreeNode], calc_noc: bool
) -> dict[str, float]:
    """COMET's energy rows (float32 sums): per level (a compute level per op), then routers'.

    ``nodes``: the tree in pre-order.
    """
    energy: dict[str, float] = {}
    by_rank = _ranks(ss).__getitem__
    levels = ss.arch.levels
    for node in nodes:
        if node.kind not in ("tile", "collective"):
            continue
        pj = en.level_pj.get(node.id)
        if pj:
            op = node.children[0].op_name if node.is_leaf_tile else None
            for lv in sorted(pj, key=by_rank):
                key = f"{lv}-{op}" if op is not None and levels[lv].is_compute else lv
                energy[key] = round_f32(energy.get(key, 0.0) + float(pj[lv]))
        noc = en.noc_pj.get(node.id) if calc_noc else None
        if noc:
            for name, e in sorted(noc.items()):
                key = f"{name}-{node.col_type.upper()}" if node.kind == "collective" else name
                energy[key] = round_f32(energy.get(key, 0.0) + float(e))
    return energy


def ideal_compute(ss: SteadyState, root: TreeNode) -> tuple[dict[str, int], dict[str, float]]:
    r"""COMET's ideal compute cycles per op (:func:`.compute.ideal_op_cycles`) and utilisation.

    .. math::

        u_{unit} = \sum_{op \text{ on unit}} t_{op} / t_{root}
    """
    ideal = ideal_op_cycles(ss.inp, not ss.compat.simd_constants)
    unit_of = {
        node.children[0].op_name: node.childs[0] for node in pre_order(root) if node.is_leaf_tile
    }
    util: dict[str, float] = {}
    total = ss.node_cost[root.id] or 1
    for op_name, t in ideal.items():
        u = unit_of[op_name]
        util[u] = float(f32(f32(util.get(u, 0.0)) + f32(f32(t) / f32(total))))
    return ideal, dict(sorted(util.items()))


def loop_nest(ss: SteadyState, en: Energy, root: TreeNode) -> list[dict[str, Any]]:
    """What an architect reads, per node in pre-order (Timeloop's loop-nest view).

    Each tile node: its loops (per tensor: dim -> factor, temporal or spatial, at ``target ->
    child``), its accesses (per level: tensor, reads or writes of ``count`` tiles of ``tile``
    elements of ``bits`` bits, and the resulting bytes), its cycles and its energy by level.
    Collectives: kind, tensor, level, cycles (per iteration) and iterations.
    """
    out: list[dict[str, Any]] = []

    def walk(node: TreeNode, depth: int) -> None:
        rec: dict[str, Any] = {"node": node.label, "depth": depth}
        rec.update(_nest_record(ss, en, node))
        if node.id in en.level_pj:
            rec["energy_pj"] = {**en.level_pj[node.id], **en.noc_pj.get(node.id, {})}
        out.append(rec)
        for c in node.children:
            walk(c, depth + 1)

    walk(root, 0)
    return out


def _nest_record(ss: SteadyState, en: Energy, node: TreeNode) -> dict[str, object]:
    """One node's line of the loop nest (see :func:`loop_nest`)."""
    prob = ss.inp.problem
    if node.kind == "tile":
        return {
            "type": "spatial" if node.spatial else "temporal",
            "loops": [
                {
                    "tensor": prob.tensors[tid], "tag": node.tags[t],
                    "from": node.targets[t], "to": node.childs[t], "bits": node.scale[t],
                    "factors": [{prob.dims[d]: v for d, v in f.items() if v != 1}
                                for f in node.tilings[t]],
                }
                for t, tid in enumerate(node.tensors)
            ],
            "accesses": [
                {
                    "level": a.level.name, "tensor": prob.tensors[a.tid], "tag": a.tag,
                    "role": "compute" if a.compute else ("target" if a.at_target else "child"),
                    "write": a.rw if not a.compute else None, "count": a.count,
                    "tile_elems": a.tile * a.proj_count,
                    "bytes": a.count * a.tile * a.proj_count * a.precision // 8,
                }
                for a in ss.accesses.get(node.id, [])
            ],
            "cycles": ss.node_cost.get(node.id),
        }  # fmt: skip
    if node.kind == "collective":
        return {"type": node.col_type, "tensor": prob.tensors[node.in_tensor],
                "level": node.target, "cycles": ss.node_cost.get(node.id),
                "iterations": en.parent_iters.get(node.id, 1)}  # fmt: skip
    if node.kind == "op":
        return {"type": "op", "op": node.op_name, "op_type": node.op_type,
                "primitive": {prob.dims[d]: v for d, v in node.primitive.items()}}  # fmt: skip
    return {"type": node.binding}
