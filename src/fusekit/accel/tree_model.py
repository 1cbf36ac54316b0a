"""The cost model of a mapping tree (:mod:`fusekit.accel.tree`), stage by stage.

Its semantics are COMET's (d-matrix-ai/comet, commit 917af0d): the COMET front end
(:mod:`fusekit.accel.comet`) reads COMET's files into a tree and evaluates it here.

The stages, run by :func:`analyse`:

1. ``fit_check``: per temporal tile node, the bytes of its tensors' tiles at their target level
   (max over sequential siblings, summed over pipelined ones); a level whose request exceeds
   ``width * depth`` of one instance rejects the tiling (DRAM is never checked).
2. ``build_nests``: post-order; each tile node's per-tensor loop descriptors (``stride`` = the
   tile below, ``end`` = stride x factor), its temporal iteration count, its spatial fan-out and
   the time steps of the child per iteration (``relative_timestep``).
3. ``build_movements``: pre-order; per tensor and iteration of a tile node, the projected tile
   (elements), how many distinct tiles move (0 when the tile did not change: reuse) and the
   number of spatial children.
4. ``SteadyState``: post-order; per tile node and tensor, memory and network cycles of every
   iteration against the child's compute window (stalls, ramp-up of the first read, ramp-down
   of the last write), merged per target level and port; a node's cycles are the compute window
   plus ramps plus stalls; a temporal node with sequential children sums them.
5. ``Energy``: pre-order; accesses x energy per ``width``-byte block, scaled by the parents'
   iterations and spatial instances; compute energy per op; router energy of the transfers.
6. ``report``: COMET's per-unit table (CS: ramps, OS: exposed transfers and collectives, TMW:
   compute) and per-level energy rows.

The arithmetic follows COMET's, defects included where the compatibility switch asks for them
(:class:`fusekit.accel.compat.Compat`, each defect named in ``DEVIATIONS``; the COMET front end
turns them on, the native model has them off).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fusekit.accel.compat import Compat
from fusekit.accel.noc import MeshShapeError, link_energy_pj, link_latency
from fusekit.accel.tree import Level, TreeMapping, TreeNode
from fusekit.errors import FusekitError

f32 = np.float32

SIMD_CYCLES = {"div": 1, "exp": 3, "add": 1, "mult": 1, "max": 1, "sqrt": 1, "softmax": 1}
SIMD_PJ = {"div": 0.8, "exp": 3.86, "add": 0.11, "mult": 0.64, "max": 0.0025, "sqrt": 2.84,
           "softmax": 1.0}  # fmt: skip
MAC_PJ = 0.2296


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


# --- plain records ----------------------------------------------------------------------------


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
class Move:
    """One iteration's transfer of a tensor: tile elements, distinct tiles, spatial children."""

    tile: int
    unique: int
    count: int


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


# --- stage 1: fit check -----------------------------------------------------------------------


def _binding_of(node: TreeNode, compat: bool = True) -> str:
    """The binding that governs ``node`` among its siblings (COMET's left-neighbour rule).

    COMET reads the sibling left of ``node`` (two to the left for the last child) as a binding.
    When that sibling is a tile node, COMET reads its loop type in place of a binding type
    (temporal as ``parallel``, spatial as ``sharing``: compatibility deviation
    ``binding-misread``); the native model takes the nearest binding on the left.
    """
    parent = node.parent
    if parent is None or len(parent.children) == 1:
        return "none"
    kids = parent.children
    i = kids.index(node)
    if i == len(kids) - 1 and i < 2:
        raise TreeModelError(
            f"{node.label}: no binding node on its left ({len(kids)} siblings): COMET "
            "dereferences a missing sibling here and crashes (use [binding, tile, binding, ...])"
        )
    pick = kids[i - 2] if i == len(kids) - 1 else kids[i - 1]
    if pick.kind == "bind":
        return pick.binding
    if compat and pick.kind == "tile":
        return "sharing" if pick.spatial else "parallel"
    if compat:
        raise TreeModelError(
            f"{node.label}: its left sibling {pick.label} is not a binding (COMET reads garbage)"
        )
    left = [k for k in kids[:i] if k.kind == "bind"]
    return left[-1].binding if left else "sequential"


def fit_check(inp: TreeMapping, compat: Compat) -> None:
    """Reject a tiling whose tiles overflow a level (see stage 1 of the module docstring).

    Raises:
        FitError: every overflowing level with requested and available bytes.
    """
    prob, arch = inp.problem, inp.arch
    sizes: dict[tuple[int, str], dict[int, int]] = {}
    occupancy: dict[str, int] = {}

    def visit(node: TreeNode) -> None:
        if node.kind == "op":
            for t, ts in node.tilesizes.items():
                sizes[(t, node.op_name)] = dict(ts)
            return
        if node.kind == "collective":
            size = _left_size(node, sizes)
            out = dict(size)
            n_src = math.prod(arch.levels[s].instances for s in node.src)
            n_dst = math.prod(arch.levels[s].instances for s in node.dest)
            if node.dim in out and node.col_type in ("gather", "allgather"):
                out[node.dim] *= n_src
            elif node.dim in out and node.col_type == "scatter":
                out[node.dim] = int(out[node.dim] / n_dst)
            sizes[(node.in_tensor, node.tag)] = out
            return
        if node.kind != "tile":
            return
        for c in node.children:
            visit(c)
        for t, tid in enumerate(node.tensors):
            key = (tid, node.tags[t])
            acc = sizes.setdefault(key, {})
            for fac in node.tilings[t]:
                for d, v in fac.items():
                    acc[d] = acc.get(d, 0) * v
        if node.parent is None:
            return  # the root: COMET checks the dimension sizes only
        if node.spatial:
            return
        binding = _binding_of(node, compat.binding_misread)
        if binding == "none":
            binding = _binding_of(node.parent, compat.binding_misread)
        per_tid: dict[int, dict[str, int]] = {}
        for t, tid in enumerate(node.tensors):
            tag = node.tags[t]
            proj = prob.projection(tag, tid)
            elems = math.prod(sizes[(tid, tag)].get(d, 0) for d in proj)
            nbytes = elems * node.scale[t] / 8.0
            lv = node.targets[t]
            cur = per_tid.setdefault(tid, {})
            cur[lv] = int(max(cur[lv], nbytes)) if lv in cur else int(nbytes)
        here: dict[str, int] = {}
        for lv_map in per_tid.values():
            for lv, b in lv_map.items():
                here[lv] = here.get(lv, 0) + b
        for lv, b in here.items():
            if lv in occupancy and binding != "none":
                if binding == "sequential":
                    occupancy[lv] = max(occupancy[lv], b)
                elif binding == "pipeline":
                    occupancy[lv] += b
            else:
                occupancy[lv] = occupancy.get(lv, 0) + b

    visit(inp.mapping)
    over = []
    for name in sorted(arch.levels):
        if name == "DRAM":
            continue
        cap = arch.levels[name].capacity_bytes()
        if not compat.full_double_buffer and arch.levels[name].attrs.get("doublebuffered"):
            cap //= 2
        req = occupancy.get(name, 0)
        if req > cap:
            over.append((name, cap, req))
    if over:
        raise FitError(inp.mapping_file, over)


def _left_size(node: TreeNode, sizes: dict[tuple[int, str], dict[int, int]]) -> dict[int, int]:
    assert node.parent is not None
    for c in node.parent.children:
        if c is node:
            break
        if c.kind == "tile" and node.in_tensor in c.tensors:
            for (tid, _tag), s in sorted(sizes.items(), key=lambda kv: kv[0][1]):
                if tid == node.in_tensor:
                    return s
    raise TreeModelError(f"{node.label}: tensor {node.in_tensor} is not produced on its left")


# --- stage 2: loop nests ----------------------------------------------------------------------


@dataclass(slots=True)
class Nests:
    """Loop nests of every tile node and the collectives' tensor extents."""

    tiles: dict[int, Nest] = field(default_factory=dict)
    col_in: dict[int, list[dict[int, int]]] = field(default_factory=dict)
    col_out: dict[int, list[dict[int, int]]] = field(default_factory=dict)


def build_nests(inp: TreeMapping) -> Nests:
    """Stage 2 (see the module docstring)."""
    prob = inp.problem
    stride: dict[tuple[int, str], dict[int, int]] = {}
    steps: dict[tuple[int, str], int] = {}
    produced: dict[str, dict[int, list[dict[int, int]]]] = {}
    out = Nests()
    inter = prob.intermediates

    def visit(node: TreeNode) -> None:
        if node.kind == "op":
            for t, ts in node.tilesizes.items():
                stride[(t, node.op_name)] = dict(ts)
                if node.op_type == "gemm":
                    rel = 1
                    for d, v in node.primitive.items():
                        rel *= ts.get(d, 0) // v
                    steps[(t, node.op_name)] = rel
                else:
                    steps[(t, node.op_name)] = 1
            return
        if node.kind == "collective":
            extents = produced.get(node.target, {}).get(node.in_tensor)
            if extents is None:
                raise TreeModelError(
                    f"{node.label}: in_tensor {prob.tensors[node.in_tensor]} is not produced at "
                    f"{node.target} on its left (COMET reads an empty tile here)"
                )
            n_src = math.prod(inp.arch.levels[s].instances for s in node.src)
            n_dst = math.prod(inp.arch.levels[s].instances for s in node.dest)
            sized = [dict(e) for e in extents]
            for e in sized:
                if node.dim in e and node.col_type in ("gather", "allgather"):
                    e[node.dim] *= n_src
                elif node.dim in e and node.col_type == "scatter":
                    e[node.dim] = int(e[node.dim] / n_dst)
            out.col_in[node.id] = [dict(e) for e in extents]
            out.col_out[node.id] = sized
            at = produced.get(node.target, {})
            if node.out_tensor in at:
                at[node.out_tensor] = sized
            if node.wb_output:
                stride[(node.in_tensor, node.tag)] = dict(sized[-1])
                steps[(node.in_tensor, node.tag)] = 1
            return
        if node.kind != "tile":
            return
        for c in node.children:
            visit(c)
        nest = Nest([], [], [], [], [], [])
        for t, tid in enumerate(node.tensors):
            tag = node.tags[t]
            key = (tid, tag)
            prev = steps.get(key, 0)
            op = prob.ops.get(tag)
            nest.rw.append(tid in op.rw if op is not None and tid in op.projections else True)
            nest.dependent.append(tid in inter)
            st = stride.setdefault(key, {})
            iters = sp = 1
            descs = []
            for fac in node.tilings[t]:
                desc = {}
                for d, v in fac.items():
                    s = st.get(d, 0)
                    desc[d] = (s * v, s)
                    st[d] = s * v
                    if node.spatial:
                        sp *= v
                    else:
                        steps[key] = steps.get(key, 0) * v
                        iters *= v
                descs.append(desc)
            nest.desc.append(descs)
            nest.rel_ts.append(prev)
            nest.iters.append(iters)
            nest.sp_iters.append(sp)
        out.tiles[node.id] = nest
        for op in prob.ops.values():
            oid = prob.tensors.index(op.out)
            for t, tid in enumerate(node.tensors):
                if tid == oid:
                    ends = [{d: e for d, (e, _s) in desc.items()} for desc in nest.desc[t]]
                    produced.setdefault(node.targets[t], {})[tid] = ends

    visit(inp.mapping)
    return out


# --- stage 3: movements -----------------------------------------------------------------------


def _temporal_moves(nest: Nest, node: TreeNode, t: int, proj: tuple[int, ...]) -> list[Move]:
    """Walk a temporal node's iterations (innermost dim first); a tile moves when it changes."""
    desc = nest.desc[t][-1]
    order = node.order
    strides = [desc[d][1] for d in order]
    ends = [desc[d][0] for d in order]
    where = [order.index(d) for d in proj]
    tile = math.prod(strides[i] for i in where)
    # the tile changes when a projected loop with more than one step advances: every
    # `period` iterations, the product of the steps of the loops inside the innermost such one
    period, inner = 0, 1
    for i in range(len(order)):
        steps = ends[i] // strides[i] if strides[i] else 1
        if i in where and steps > 1:
            period = inner
            break
        inner *= max(steps, 1)
    moved, kept = Move(tile, 1, 1), Move(tile, 0, 1)  # shared: moves are never mutated
    if period <= 0:
        return [moved] + [kept] * (nest.iters[t] - 1) if nest.iters[t] else []
    return [moved if idx % period == 0 else kept for idx in range(nest.iters[t])]


def build_movements(inp: TreeMapping, nests: Nests) -> dict[int, list[list[Move]]]:
    """Stage 3 (see the module docstring): per tile node, per tensor, one record per iteration."""
    prob = inp.problem
    moves: dict[int, list[list[Move]]] = {}

    def visit(node: TreeNode) -> None:
        if node.kind != "tile":
            return
        nest = nests.tiles[node.id]
        per: list[list[Move]] = []
        if not node.spatial:
            for t, tid in enumerate(node.tensors):
                per.append(_temporal_moves(nest, node, t, prob.projection(node.tags[t], tid)))
        else:
            parent = node.parent
            if parent is None or parent.kind != "tile" or parent.spatial:
                raise TreeModelError(f"{node.label}: a spatial tile needs a temporal tile above")
            pnest = nests.tiles[parent.id]
            pidx = 0  # COMET keeps the last match when a tensor's tag is not in the parent
            for t, tid in enumerate(node.tensors):
                tag = node.tags[t]
                for i, ptid in enumerate(parent.tensors):
                    if ptid == tid and parent.tags[i] == tag:
                        pidx = i
                        break
                if node.targets[t] == parent.targets[pidx]:
                    for i, ptid in enumerate(parent.tensors):
                        if ptid == tid and parent.tags[i] == tag:
                            nest.iters[t] = pnest.iters[i]
                proj = prob.projection(tag, tid)
                first, last = nest.desc[t][0], nest.desc[t][-1]
                unique = math.prod(-(-last[d][0] // first[d][1]) for d in proj)
                tile = math.prod(first[d][1] for d in proj)
                pmoves = moves[parent.id][pidx]
                kept, moved = Move(tile, 0, nest.sp_iters[t]), Move(tile, unique, nest.sp_iters[t])
                row = [
                    kept if idx != 0 and pmoves[idx].unique == 0 else moved
                    for idx in range(pnest.iters[pidx])
                ]
                per.append(row)
        moves[node.id] = per
        for c in node.children:
            visit(c)

    visit(inp.mapping)
    return moves


# --- stage 4: steady state --------------------------------------------------------------------


def simd_instructions(level: Level, op: TreeNode) -> int:
    r"""SIMD instructions of one tile primitive: one per ``width x T`` elements.

    .. math:: n_{instr} = \lceil |prim| / (width \cdot T) \rceil

    with ``T`` the product of the op's reduction factors (COMET's float32 arithmetic).
    """
    width = int(level.attrs.get("computeWidth", 8))
    red = f32(1)
    for d in op.red_dims:
        red = f32(red * f32(op.red_factors[d]))
    elems = math.prod(op.primitive.values())
    return math.ceil(f32(f32(elems) / f32(f32(width) * red)))


def simd_op_cycles(level: Level, op_type: str, from_arch: bool = False) -> int:
    """Cycles of one SIMD instruction of ``op_type``.

    COMET's constants (row reductions: ``ceil(log2 width)``), or with ``from_arch`` the unit's
    ``op_cycles`` where it gives one.
    """
    given = level.attrs.get("op_cycles") if from_arch else None
    if isinstance(given, dict) and op_type in given:
        return int(given[op_type])
    if op_type in ("rowsum", "rowmax"):
        return math.ceil(math.log2(int(level.attrs.get("computeWidth", 8))))
    if op_type in SIMD_CYCLES:
        return SIMD_CYCLES[op_type]
    raise TreeModelError(f"op type {op_type} is not a SIMD op")


def compute_cycles(level: Level, op: TreeNode, arch_costs: bool = False) -> int:
    """Cycles of one tile primitive of ``op`` on compute ``level`` (COMET's compute classes).

    Systolic array (ScaleSim): ``(2R + C + T - 2)`` per fold, folds over the ``R x C`` arrays
    of the two dims left after dropping the reduction factor ``T``; vector SIMD: the op's cycles
    per instruction (:func:`simd_op_cycles`; ``arch_costs``: the arch's where it gives them)
    times :func:`simd_instructions`.
    """
    a = level.attrs
    if level.kind == "SystolicArray":
        rows, cols = int(a.get("array_rows", 32)), int(a.get("array_cols", 32))
        if not op.red_dims:
            raise TreeModelError(f"{op.label}: a systolic GEMM needs reduction_dimensions")
        t = op.red_factors[op.red_dims[-1]]
        dims = list(reversed(op.primitive.values()))  # COMET's hash-map order
        if t not in dims:
            raise TreeModelError(f"{op.label}: reduction factor {t} is not a tile size")
        dims.remove(t)
        folds = 1
        for i, (v, n) in enumerate(zip(dims[:2], (rows * int(a.get("num_sa_rows", 1)),
                                                   cols * int(a.get("num_sa_cols", 1))),
                                       strict=False)):  # fmt: skip
            folds *= math.ceil(v / n) if i < 2 else 1
        return folds * (2 * rows + cols + t - 2)
    if level.kind == "VSIMD":
        try:
            cyc = simd_op_cycles(level, op.op_type, arch_costs)
        except TreeModelError as e:
            raise TreeModelError(f"{op.label}: {e}") from None
        return cyc * simd_instructions(level, op)
    if level.kind == "GEMM":
        lat = int(a.get("startupLatency", 0))
        if len(op.primitive) == 3:
            if op.red_dims:
                extra = {16: 16, 8: 12, 4: 8, 2: 6}
                lat += extra.get(op.red_factors[op.red_dims[0]] // 256, 0)
            lat += math.prod(op.primitive.values()) // 512 * int(a.get("computeLatency", 0))
            return lat
        return int(a.get("computeLatency", 0))
    raise TreeModelError(f"{op.label}: no latency model for compute type {level.kind}")


class SteadyState:
    """Stage 4 (see the module docstring): cycles of every node, and the accesses they make."""

    def __init__(
        self,
        inp: TreeMapping,
        nests: Nests,
        moves: dict[int, list[list[Move]]],
        compat: Compat,
        memo: dict[tuple[Any, ...], Any] | None = None,
    ) -> None:
        self.inp, self.arch, self.nests, self.moves = inp, inp.arch, nests, moves
        self.memo = memo
        self.compat = compat
        self.generalise = not compat.mesh_table
        self.node_cost: dict[int, int] = {}
        self.arch_cost: dict[int, dict[object, dict[tuple[str, str], list[list[Cost]]]]] = {}
        self.level_cost: dict[int, dict[object, dict[str, list[Cost]]]] = {}
        self.windows: dict[int, list[tuple[object, int]]] = {}
        self.reuse: dict[int, dict[tuple[int, str], int]] = {}
        self.actual: dict[int, dict[tuple[int, str], int]] = {}
        self.ramp_up: dict[int, dict[tuple[int, str], int]] = {}
        self.ramp_down: dict[int, dict[tuple[int, str], int]] = {}
        self.accesses: dict[int, list[Access]] = {}
        self.col_energy: dict[int, tuple[float, float]] = {}  # memory pJ, network pJ
        self.by_id: dict[int, TreeNode] = {}
        self._transfers: dict[tuple[int, int, int, int, int], tuple[int, int, float]] = {}

    # -- helpers ------------------------------------------------------------------------------

    def rank(self, name: str) -> int:
        """COMET orders its per-level maps by level creation."""
        return self.arch.levels[name].rank

    def _sorted_pairs(self, d: dict[tuple[str, str], list[list[Cost]]]):
        return sorted(d.items(), key=lambda kv: (self.rank(kv[0][0]), self.rank(kv[0][1])))

    def key_of(self, children: object) -> object:
        """A hashable key for one child or a group of children."""
        return children

    # -- one transfer --------------------------------------------------------------------------

    def transfer(self, node: TreeNode, t: int, mv: Move) -> tuple[int, int, float]:
        """Memory cycles, network cycles and router energy of one iteration's transfer."""
        key = (node.id, t, mv.tile, mv.unique, mv.count)
        hit = self._transfers.get(key)
        if hit is None:
            hit = self._transfer(node, t, mv)
            self._transfers[key] = hit
        return hit

    def _transfer(self, node: TreeNode, t: int, mv: Move) -> tuple[int, int, float]:
        nest = self.nests.tiles[node.id]
        target = self.arch.levels[node.targets[t]]
        child = self.arch.levels[node.childs[t]]
        net = target.link_net if target is child else target.child_nets.get(child.name)
        if net is None:
            raise TreeModelError(f"{node.label}: no network from {target.name} to {child.name}")
        rw = nest.rw[t]
        size, num, nodes = mv.tile, mv.unique, mv.count
        ports = int(target.attrs.get("ports", 1))
        used = max(min(num, ports), 1)
        if rw:
            tbw = target.bw("child_write_bw")
            num = max(num, 1)
        else:
            tbw = target.bw("child_read_bw")
        if used < ports:
            tbw = tbw // ports * used
        scale = f32(f32(node.scale[t]) / f32(8.0))
        if child.is_compute:
            cbw = net.port_bw
        else:
            cbw = child.bw("parent_read_bw" if rw else "parent_write_bw")
        tbw = min(tbw, used * net.port_bw)
        cbw = min(cbw, net.port_bw)
        support = net.reduction if rw else net.broadcast
        scatter = 1 if support or num == 0 else -(-nodes // num)
        t_target = math.ceil(f32(f32(f32(f32(scatter) * f32(num)) * f32(size)) * scale / f32(tbw)))
        t_child = 0 if num == 0 else math.ceil(f32(f32(f32(size) * scale) / f32(cbw)))
        if rw and node.rmw[t]:
            rbw = target.bw("child_read_bw")
            if used < ports:
                rbw = rbw // ports * used
            t_target += math.ceil(f32(f32(f32(f32(scatter) * f32(num)) * f32(size)) * scale
                                      / f32(rbw)))  # fmt: skip
        memory = int(max(t_target, t_child))
        kind = "gather" if rw else ("broadcast" if num == 1 else "scatter")
        lat = link_latency(net, kind, size, mv.unique, nodes, float(scale),
                           generalise=self.generalise)  # fmt: skip
        e = link_energy_pj(net, kind, size, mv.unique, nodes, float(scale),
                           generalise=self.generalise)  # fmt: skip
        return memory, lat, e

    def evaluate(self, node: TreeNode, t: int, mvs: list[Move], no_stall: list[int], hide: bool,
                 reuse: int, different: bool) -> Cost:  # fmt: skip
        """Per-iteration stalls of one tensor's transfers against the windows ``no_stall``."""
        rw = self.nests.tiles[node.id].rw[t]
        n = len(mvs)
        pseudo = n if different else n // reuse
        c = Cost.sized(pseudo)
        start = 1 if rw else -1
        c.tile_size = mvs[0].tile
        c.access_count = pseudo
        seen: dict[int, tuple[int, float]] = {}  # per Move object (rows share them)
        n_win = len(no_stall)
        c_stall, c_mem = c.stall, c.mem_net
        noc_pj, cumm, cumm_stall = c.noc_pj, 0, 0
        last = n - reuse if rw else -1
        for idx, mv in enumerate(mvs):
            hit = seen.get(id(mv))
            if hit is None:
                memory, lat, e = self.transfer(node, t, mv)
                hit = seen[id(mv)] = (memory + lat, e)
            eff, e = hit
            noc_pj += e
            if idx == last:
                c.ramp_down = eff
                continue
            if idx == 0 and not rw:
                c.ramp_up = eff
                continue
            if not hide:
                stall = eff
            elif eff == 0:
                stall = 0
            else:
                stall = eff - (no_stall[idx] if idx < n_win else 0)
            if different:
                j = idx + start
            elif idx % reuse == 0:
                j = idx // reuse + start
            else:
                continue
            if 0 <= j < pseudo:
                c_stall[j] = stall
                c_mem[j] = eff
            cumm += eff
            cumm_stall += stall
        c.noc_pj, c.cumm, c.cumm_stall = noc_pj, cumm, cumm_stall
        return c

    def target_child_cost(self, node: TreeNode, t: int, op_cycles: int | None, child_cost: int,
                          hide: bool, window: list[int]) -> list[Cost]:  # fmt: skip
        """COMET's per-tensor cost at a node: [read port, write port]."""
        nest = self.nests.tiles[node.id]
        mvs = self.moves[node.id][t]
        tt = 1 if nest.rw[t] else 0
        base = nest.rel_ts[t] * op_cycles if op_cycles is not None else child_cost
        different = len(set(nest.iters)) != 1
        actual = sum(1 for m in mvs if m.unique != 0)
        reuse = nest.iters[t] // actual if actual else 0
        reuse = reuse or 1
        if reuse == 1:
            no_stall = list(window)
        else:
            no_stall = [sum(window[i:i + reuse]) if i % reuse == 0 else 0
                        for i in range(len(window))]  # fmt: skip
        ports = [Cost(), Cost()]
        c = self.evaluate(node, t, mvs, no_stall, hide, reuse, different)
        c.window = [base * reuse] * actual
        c.reuse = reuse
        c.tens_idx = t
        c.compute_time = sum(no_stall)
        c.hide = hide
        ports[tt] = c
        return ports

    # -- merging -------------------------------------------------------------------------------

    def merge_levels(self, node: TreeNode, pairs: dict[tuple[str, str], list[list[Cost]]],
                     port_use: dict[str, dict[int, int]]) -> dict[str, list[Cost]]:  # fmt: skip
        """Merge per-tensor costs into per-target-level costs, windows shared per port."""
        nest = self.nests.tiles[node.id]
        n_it = max(nest.iters)
        ordered = self._sorted_pairs(pairs)
        windows: dict[str, list[list[int]]] = {}
        for (tgt, chl), vec in ordered:
            for idx in (0, 1):
                for per in vec:
                    if len(per) > idx and per[idx].stall:
                        child = self.arch.levels[chl]
                        w = list(per[idx].window)
                        if (
                            not child.is_compute
                            and port_use
                            and child.attrs.get("parent_child_ports_shared", False)
                        ):
                            cost = port_use.get(chl, {}).get(idx, 0)
                            w = [e - cost if e > cost else 0 for e in w]
                        windows.setdefault(tgt, []).append(w)
        merged: dict[str, list[Cost]] = {}
        count: dict[str, int] = {}
        for (tgt, _chl), vec in ordered:
            if tgt not in merged:
                merged[tgt] = [Cost.sized(n_it), Cost.sized(n_it)]
                count[tgt] = 0
            for idx in (0, 1):
                for per in vec:
                    k = count[tgt]
                    if not (len(per) > idx and per[idx].stall):
                        continue
                    p, m = per[idx], merged[tgt][idx]
                    m.ramp_up += p.ramp_up
                    m.ramp_down += p.ramp_down
                    m.compute_time = max(m.compute_time, p.compute_time)
                    if m.reuse == 0:
                        m.reuse = 1
                    if p.reuse > 0:
                        m.reuse = min(m.reuse, p.reuse)
                    m.cumm += p.cumm
                    f = p.reuse
                    its = min(n_it, len(windows[tgt][k]))
                    sharers: list[tuple[list[int], int, int]] | None = None
                    mw, mc, ms, wk = m.window, m.compulsory, m.stall, windows[tgt][k]
                    pw, ps, pn = p.window, p.stall, p.mem_net
                    n_mw, n_mc, n_ms, n_pw, n_ps, n_pn = map(len, (mw, mc, ms, pw, ps, pn))
                    for i in range(idx, its):
                        pwi = pw[i] // f if i < n_pw and pw[i] != 0 else -1
                        extra = (ps[i] if i < n_ps else 0) if not p.hide and i < n_pw else 0
                        stall = (pn[i] if i < n_pn else 0) // f - wk[i] // f
                        for mi in range(i * f, i * f + f):
                            if pwi >= 0 and mi < n_mw:
                                mw[mi] = max(mw[mi], pwi)
                            if extra and mi < n_mc:
                                mc[mi] += extra
                            if stall > 0 and mi < n_ms:
                                ms[mi] += stall
                        if not p.hide or i >= n_pn:
                            continue
                        # a transfer hidden under the compute window uses it up for the
                        # level's other tensors on the same port
                        if sharers is None:
                            sharers = [
                                (windows[tgt][kk], kf, len(windows[tgt][kk]))
                                for kk, kf in self._sharers(ordered, tgt, idx, k)
                            ]
                        used = pn[i] // f
                        for win, kf, n_win in sharers:
                            for mi in range(i * f, i * f + f):
                                nn = mi // kf
                                if nn < n_win:
                                    win[nn] = max(win[nn] - used, 0)
                    count[tgt] += 1
        return merged

    @staticmethod
    def _sharers(ordered, tgt: str, idx: int, k: int) -> list[tuple[int, int]]:
        """The level's other tensors on the same port: (their window index, their reuse)."""
        out = []
        seen: dict[str, int] = {}
        for (tgt1, _c1), vec1 in ordered:
            seen.setdefault(tgt1, 0)
            for idx1 in (0, 1):
                for per1 in vec1:
                    if not (idx1 < len(per1) and per1[idx1].stall):
                        continue
                    if tgt1 == tgt and idx1 == idx and seen[tgt1] != k:
                        out.append((seen[tgt1], per1[idx1].reuse))
                    seen[tgt1] += 1
        return out

    def node_total(self, node: TreeNode, merged: dict[str, list[Cost]]) -> tuple[Cost, int]:
        """Ramps, compute window and per-iteration stalls of a node, and its total cycles."""
        n_it = max(self.nests.tiles[node.id].iters)
        out = Cost.sized(n_it)
        for a, (_lv, cost) in enumerate(sorted(merged.items(), key=lambda kv: self.rank(kv[0]))):
            for idx in (0, 1):
                c = cost[idx]
                if not c.stall or c.compute_time == 0:
                    continue
                out.ramp_up = max(out.ramp_up, c.ramp_up)
                out.ramp_down = max(out.ramp_down, c.ramp_down)
                out.compute_time = max(out.compute_time, c.compute_time)
                f = c.reuse
                first = a == 0 and (idx == 0 or self.compat.port_overwrite)
                st, cp, os_ = c.stall, c.compulsory, out.stall
                for i in range(-(-idx // f) * f, n_it, f):  # the multiples of f from idx
                    v = st[i // f] + cp[i // f]
                    os_[i] = v if first else max(os_[i], v)
        total = out.compute_time + out.ramp_up + out.ramp_down + sum(out.stall)
        return out, total & 0xFFFFFFFF

    # -- windows -------------------------------------------------------------------------------

    def _strip_ramps(self, parent: TreeNode, child: TreeNode, win: list[int]) -> None:
        """Reads hidden by the parent's reuse: their ramp-up is not paid on reused iterations."""
        for key, f in sorted(self.reuse.get(parent.id, {}).items()):
            if (f != 1 and key in self.reuse.get(child.id, {})
                    and self.actual.get(child.id, {}).get(key) == 1):  # fmt: skip
                up = self.ramp_up.get(child.id, {}).get(key, 0)
                for i in range(len(win)):
                    if i % f:
                        win[i] = (win[i] - up) & 0xFFFFFFFF

    def window_vector(
        self, parent: TreeNode, children: list[TreeNode] | TreeNode, win: list[int]
    ) -> None:
        """COMET's memory windows of a node's children, less reused reads' ramp-ups."""
        if isinstance(children, list):
            for c in children:
                self._strip_ramps(parent, c, win)
            return
        child = children
        if child.kind == "tile" and child.is_leaf_tile:
            self._strip_ramps(parent, child, win)
            return
        for c in child.children:
            for key, f in sorted(self.reuse.get(parent.id, {}).items()):
                if (f != 1 and key in self.reuse.get(c.id, {})
                        and self.actual.get(c.id, {}).get(key) == 1):  # fmt: skip
                    up = self.ramp_up.get(c.id, {}).get(key, 0)
                    for i in range(len(win)):
                        if i % f:
                            win[i] = (win[i] - up) & 0xFFFFFFFF
                    self.window_vector(parent, list(c.children), win)

    def port_use(self, children: list[TreeNode] | TreeNode) -> dict[str, dict[int, int]]:
        """Cycles the children's transfers hold each port of a shared-port level."""
        out: dict[str, dict[int, int]] = {}

        def add(levels: dict[str, list[Cost]]) -> None:
            for lv, cv in sorted(levels.items(), key=lambda kv: self.rank(kv[0])):
                for idx in (0, 1):
                    ports = out.setdefault(lv, {})
                    v = cv[idx].cumm + (cv[idx].ramp_up if idx == 0 else cv[idx].ramp_down)
                    ports[1 - idx] = ports.get(1 - idx, 0) + v

        def add_node(n: TreeNode) -> None:
            for levels in self.level_cost.get(n.id, {}).values():
                add(levels)

        if isinstance(children, list):
            for c in children:
                add_node(c)
        elif children.kind == "collective" or children.is_leaf_tile:
            add_node(children)
        else:
            for c in children.children:
                if c.kind != "bind":
                    add_node(c)
        return out

    # -- the walk ------------------------------------------------------------------------------

    def visit(self, node: TreeNode) -> None:
        """Post-order walk (COMET's steady-state walker); errors name the node."""
        try:
            self._visit(node)
        except MeshShapeError as e:
            if str(e).startswith(("DataMovement", "CollectiveOp")):
                raise
            raise MeshShapeError(f"{node.label}: {e}") from None

    def _visit(self, node: TreeNode) -> None:
        self.by_id[node.id] = node
        if node.kind == "collective":
            self.visit_collective(node)
            return
        if node.kind != "tile":
            return
        nest = self.nests.tiles[node.id]
        if node.spatial or node.is_leaf_tile:
            for t, tid in enumerate(node.tensors):
                key = (tid, node.tags[t])
                actual = sum(1 for m in self.moves[node.id][t] if m.unique)
                f = nest.iters[t] // actual if actual else 0
                self.reuse.setdefault(node.id, {})[key] = f or 1
                self.actual.setdefault(node.id, {})[key] = actual
        bindings = []
        for c in node.children:
            if c.kind == "bind":
                bindings.append(c.binding)
            self.visit(c)
        if node.is_leaf_tile:
            self.visit_leaf(node)
            return
        if any(b != "sequential" for b in bindings):
            raise TreeModelError(
                f"{node.label}: only sequential bindings are modelled (got {', '.join(bindings)})"
            )
        windows: list[tuple[object, int]] = []
        if not bindings:
            child = node.children[-1]
            if not node.spatial:
                self.node_cost[node.id] = self.node_cost[child.id]
                return
            windows.append((child, self.node_cost[child.id]))
        else:
            group: list[TreeNode] = []
            kids = node.children
            for i, c in enumerate(kids):
                if c.kind == "bind" and i % 2 == 0:
                    found = [x for x in kids[i:] if x.kind in ("tile", "collective")][:2]
                    for x in found:
                        if x not in group:
                            group.append(x)
            windows.append((group, sum(self.node_cost[x.id] for x in group) & 0xFFFFFFFF))
        self.windows[node.id] = windows
        if node.spatial:
            self.visit_spatial(node, windows)
        else:
            self.visit_temporal(node, windows)

    def visit_collective(self, node: TreeNode) -> None:
        """A collective's memory and network cycles and energy (COMET's collective model)."""
        lv = self.arch.levels[node.target]
        net = lv.link_net
        if net is None:
            raise TreeModelError(f"{node.label}: {lv.name} has no link network (link_transfers)")
        prob = self.inp.problem
        proj = prob.projection("", node.in_tensor)
        order = sorted(range(len(prob.dims)), key=lambda d: prob.dims[d])
        ext_in = self.nests.col_in[node.id][-1]
        ext_out = self.nests.col_out[node.id][-1]
        for d in order:
            if d not in ext_in:
                raise TreeModelError(f"{node.label}: no extent of dim {prob.dims[d]}")
        rsize = math.prod(ext_in[d] for d in proj)
        wsize = math.prod(ext_out[d] for d in proj)
        scale = node.precision / 8.0
        n_src = math.prod(self.arch.levels[s].instances for s in node.src)
        n_dst = math.prod(self.arch.levels[s].instances for s in node.dest)
        sf = node.spatial_factor or n_src
        a = lv.attrs
        lr, lw, port = float(lv.bw("link_read_bw")), float(lv.bw("link_write_bw")), net.port_bw
        red_cost = 1
        block = float(lv.width_bytes())
        rc, wc = float(a.get("child_read_energy", 0)), float(a.get("child_write_energy", 0))
        mw = float(lv.bw("child_write_bw"))
        kind = node.col_type
        net_t = link_latency(net, kind, rsize, 1, n_src, scale, node.red_op, self.generalise)
        net_e = link_energy_pj(net, kind, rsize, 1, n_src, scale, node.red_op, self.generalise)
        if kind == "gather":
            ports = min(2, n_src - 1)
            lr, lw = min(lr, port), min(min(lw, ports * port), mw)
            mem = max(math.ceil((n_src - 1) * wsize * scale / (lw * n_src)),
                      math.ceil(rsize * scale / lr))  # fmt: skip
            re_ = rsize * scale / block * rc
            we = (n_src - 1) * rsize * scale / block * wc
        elif kind == "broadcast":
            lr, lw = min(lr, port), min(lw, port)
            tw = math.ceil(rsize * scale / lw)
            we = (n_dst - 1) * rsize * scale / block * wc
            if net.broadcast:
                tr = math.ceil(rsize * scale / lr)
                re_ = rsize * scale / block * rc
            else:
                tr = math.ceil(rsize * scale / lr * n_dst)
                re_ = n_dst * rsize * scale / block * rc
            mem = max(tr, tw)
        elif kind == "reduction":
            lr, lw = min(lr, port), min(lw, port)
            rb, wb = rsize * scale / lr, rsize * scale / lw
            re_ = rsize * scale * n_src / block * rc
            we = rsize * scale / block * wc
            if net.reduction:
                mem = math.ceil(rb + wb + wb * red_cost)
            else:
                mem = math.ceil(max(rb * (n_src - 1), wb * (n_src - 1)) + wb * red_cost)
                re_ *= n_src - 1
                we *= n_src - 1
        elif kind == "allgather":
            lr, lw = min(lr, port), min(lw, port)
            rb, wb = rsize * n_src * scale / lr, rsize * n_src * scale / lw
            re_ = rsize * n_src * scale / block * rc
            we = rsize * n_src * scale / block * wc * sf
            if net.broadcast:
                mem = math.ceil(wb * sf)
            else:
                mem = math.ceil(max(math.ceil(wb * sf), math.ceil(rb * sf)))
                re_ *= sf
        elif kind == "allreduce":
            lr, lw = min(lr, port), min(lw, port)
            rb, wb = rsize * n_src * scale / lr, wsize * n_src * scale / lw
            re_ = rsize * n_src * scale / block * rc
            we = wsize * n_src * scale / block * wc
            if net.broadcast and net.reduction:
                mem = math.ceil(wb + rb + wb * red_cost)
            elif net.broadcast:
                mem = math.ceil((wb + rb) * sf + wb * red_cost)
                re_ *= sf
                we *= sf
            else:
                mem = math.ceil((2 * rb + wb) * sf + wb * red_cost)
                re_ *= sf * 2
                we *= sf
        else:  # scatter
            sf = n_dst
            if n_dst <= 1:
                raise TreeModelError(f"{node.label}: a scatter needs more than one destination")
            ports = min(2, n_dst - 1)
            lr, lw = min(lr, ports * port), min(lw, port)
            mem = (math.ceil((sf - 1) * rsize * scale / (lr * sf))
                   + math.ceil(wsize * scale / (sf * lw)))  # fmt: skip
            re_ = (sf - 1) * rsize * scale / (sf * block) * rc
            we = wsize * scale / block * wc
        cyc = int(mem) + int(net_t)
        both = [Cost(), Cost()]
        for c in both:
            c.cumm = c.cumm_stall = cyc
            c.reuse = 1
        self.level_cost[node.id] = {node.id: {lv.name: both}}
        self.node_cost[node.id] = cyc
        self.col_energy[node.id] = (re_ + we, net_e)

    def _access(self, node: TreeNode, t: int, c: Cost, level: str, at_target: bool) -> Access:
        nest = self.nests.tiles[node.id]
        first = self.moves[node.id][t][0].unique
        return Access(
            level=self.arch.levels[level], count=c.access_count, tile=c.tile_size,
            precision=node.scale[t], rw=nest.rw[t], at_target=at_target, tid=node.tensors[t],
            rmw=node.rmw[t], proj_count=first or 1, tag=node.tags[t],
            noc_pj=0.0 if at_target else c.noc_pj,
        )  # fmt: skip

    def _keep_ramp_ups(self, node: TreeNode, ups: dict[str, dict[tuple[int, str], int]]) -> None:
        """Remember the ramp-ups of the target level that pays the most of them."""
        if not ups:
            return
        sums = {lv: sum(v.values()) for lv, v in ups.items()}
        top = max(sums.values())
        for lv, s in sums.items():
            if s == top:
                self.ramp_up.setdefault(node.id, {}).update(ups[lv])

    def _leaf_key(self, node: TreeNode) -> tuple[Any, ...]:
        """All a leaf's stage-4 results depend on besides the tree's shape and the arch."""
        nest, op = self.nests.tiles[node.id], node.children[0]
        return (
            node.id, repr(nest.desc), tuple(nest.iters), tuple(nest.rel_ts),
            tuple(sorted(op.primitive.items())), tuple(sorted(op.red_factors.items())),
        )  # fmt: skip

    def visit_leaf(self, node: TreeNode) -> None:
        """A tile node right above an op: its transfers against the op's compute time.

        With a ``memo`` (a tiling sweep over one template, :class:`fusekit.accel.comet.space.
        Space`), a leaf whose nest another tiling already gave is restored from it: a leaf
        reads nothing above itself. Energy later scales the accesses, so they are copied.
        """
        key = self._leaf_key(node) if self.memo is not None else None
        hit = self.memo.get(key) if self.memo is not None else None
        if hit is not None:
            acc, arch_cost, level_cost, total, down, up = hit
            self.accesses[node.id] = [replace(a) for a in acc]
            self.arch_cost[node.id], self.level_cost[node.id] = arch_cost, level_cost
            self.node_cost[node.id] = total
            if down is not None:
                self.ramp_down[node.id] = dict(down)
            if up is not None:
                self.ramp_up[node.id] = dict(up)
            return
        self._visit_leaf(node)
        if self.memo is not None:
            down, up = self.ramp_down.get(node.id), self.ramp_up.get(node.id)
            self.memo[key] = (
                [replace(a) for a in self.accesses[node.id]], self.arch_cost[node.id],
                self.level_cost[node.id], self.node_cost[node.id],
                None if down is None else dict(down), None if up is None else dict(up),
            )  # fmt: skip

    def _visit_leaf(self, node: TreeNode) -> None:
        op = node.children[0]
        nest = self.nests.tiles[node.id]
        n_it = max(nest.iters)
        pairs: dict[tuple[str, str], list[list[Cost]]] = {}
        ups: dict[str, dict[tuple[int, str], int]] = {}
        acc: list[Access] = []
        max_acc, comp = 0, 1
        for t, tid in enumerate(node.tensors):
            child = self.arch.levels[node.childs[t]]
            if not child.is_compute:
                raise TreeModelError(f"{node.label}: the child of an op's tile must compute")
            cyc = compute_cycles(child, op, not self.compat.simd_constants)
            ports = self.target_child_cost(node, t, cyc, 0, True, [cyc] * n_it)
            tt = 1 if nest.rw[t] else 0
            c = ports[tt]
            acc.append(self._access(node, t, c, node.targets[t], True))
            max_acc = max(max_acc, c.access_count)
            comp = max(comp, c.compute_time)
            key = (tid, node.tags[t])
            if nest.rw[t]:
                self.ramp_down.setdefault(node.id, {})[key] = c.ramp_down
            else:
                ups.setdefault(node.targets[t], {})[key] = c.ramp_up
            pairs.setdefault((node.targets[t], node.childs[t]), []).append(ports)
        unit = self.arch.levels[node.childs[0]]
        mac = float(f32(math.prod(op.primitive.values()) * MAC_PJ))
        acc.append(Access(level=unit, count=max_acc, at_target=False, compute=True,
                          tag=node.tags[0], op_type=op.op_type, rmw=node.rmw[0],
                          tid=node.tensors[0],
                          mac_pj=mac))  # fmt: skip
        self.accesses[node.id] = acc
        self.arch_cost[node.id] = {op.id: pairs}
        merged = self.merge_levels(node, pairs, {})
        self.level_cost[node.id] = {op.id: merged}
        _, total = self.node_total(node, merged)
        self.node_cost[node.id] = total
        self._keep_ramp_ups(node, ups)

    def visit_spatial(self, node: TreeNode, windows: list[tuple[object, int]]) -> None:
        """A spatial tile node: its tensors' transfers to the children against their windows."""
        nest = self.nests.tiles[node.id]
        n_it = max(nest.iters)
        seq_parent = _binding_of(node, self.compat.binding_misread) == "sequential"
        acc = self.accesses.setdefault(node.id, [])
        self.arch_cost[node.id] = {}
        self.level_cost[node.id] = {}
        for children, wsum in windows:
            win = [wsum] * n_it
            self.window_vector(node, children, win)
            group = children if isinstance(children, list) else [children]
            pairs: dict[tuple[str, str], list[list[Cost]]] = {}
            ups: dict[str, dict[tuple[int, str], int]] = {}
            hit_pair: tuple[str, str] | None = None
            for child in group:
                is_tile = child.kind == "tile"
                hide = is_tile  # a collective child always conflicts with the write-back
                for t, tid in enumerate(node.tensors):
                    tag = node.tags[t]
                    pair = (node.targets[t], node.childs[t])
                    if not isinstance(children, list):
                        if is_tile and node.childs[t] in child.targets:
                            hit_pair = pair
                        elif not is_tile and node.childs[t] == child.target:
                            hit_pair = pair
                        if is_tile and seq_parent:
                            hide = not nest.dependent[t]
                    elif is_tile:
                        hide = not nest.dependent[t]
                    hit = (tag in child.tags) if is_tile else (tag == child.tag)
                    if not hit:
                        continue
                    ports = self.target_child_cost(node, t, None, wsum, hide, win)
                    c = ports[1 if nest.rw[t] else 0]
                    acc.append(self._access(node, t, c, node.targets[t], True))
                    acc.append(self._access(node, t, c, node.childs[t], False))
                    if not nest.rw[t]:
                        ups.setdefault(node.targets[t], {})[(tid, tag)] = c.ramp_up
                    pairs.setdefault(pair, []).append(ports)
            self._keep_ramp_ups(node, ups)
            if not isinstance(children, list) and not pairs and hit_pair is not None:
                dummy = Cost.sized(n_it)
                dummy.window = [self.node_cost[children.id]] * n_it  # type: ignore[union-attr]
                dummy.compute_time = n_it * self.node_cost[children.id]  # type: ignore[union-attr]
                dummy.reuse = 1
                pairs[hit_pair] = [[dummy, dummy]]
            key = tuple(c.id for c in group) if isinstance(children, list) else children.id
            self.arch_cost[node.id][key] = pairs
            shared = any(self.arch.levels[c].attrs.get("parent_child_ports_shared", False)
                         for c in node.childs)  # fmt: skip
            use = self.port_use(children) if shared else {}
            merged = self.merge_levels(node, pairs, use)
            self.level_cost[node.id][key] = merged
            _, total = self.node_total(node, merged)
            self.node_cost[node.id] = total

    def visit_temporal(self, node: TreeNode, windows: list[tuple[object, int]]) -> None:
        """A temporal node over sequential children: their cycles add up."""
        nest = self.nests.tiles[node.id]
        self.level_cost.setdefault(node.id, {})
        total = 0
        for children, _w in windows:
            group = children if isinstance(children, list) else [children]
            for c in group:
                if c.kind == "collective":
                    n = max(nest.iters)
                    cost = Cost.sized(n)
                    cost.compute_time = n * self.node_cost[c.id]
                    cost.cumm = n * self.node_cost[c.id]
                    self.level_cost[node.id][c.id] = {c.target: [cost, cost]}
        for c in node.children:
            if c.kind == "bind":
                continue
            if c.kind == "collective":
                total += self.level_cost[node.id][c.id][c.target][0].compute_time
            else:
                total += self.node_cost[c.id]
        self.node_cost[node.id] = total & 0xFFFFFFFF


# --- stage 5: energy --------------------------------------------------------------------------


def _max_count(table: dict[str, dict[int, int]], tids: list[int]) -> tuple[bool, int]:
    found, best = False, 1
    for per in table.values():
        for tid, n in per.items():
            if tid in tids:
                best, found = max(best, n), True
    return found, best


class Energy:
    """Stage 5 (see the module docstring): energy per node and level, and parents' iterations."""

    def __init__(self, ss: SteadyState, compat: Compat) -> None:
        self.ss = ss
        self.compat = compat
        self.level_pj: dict[int, dict[str, float]] = {}
        self.noc_pj: dict[int, dict[str, float]] = {}
        self.parent_iters: dict[int, int] = {}
        self.fan_out: dict[int, int] = {}  # instances of each node: its spatial ancestors' fan-out
        self._fan(ss.inp.mapping, 1)

    def _fan(self, node: TreeNode, n: int) -> None:
        self.fan_out[node.id] = n
        if node.kind == "tile" and node.spatial:
            n *= max(self.ss.nests.tiles[node.id].sp_iters, default=1)
        for c in node.children:
            self._fan(c, n)

    def _left_tensors(self, node: TreeNode) -> list[int]:
        out: list[int] = []
        assert node.parent is not None
        for c in node.parent.children:
            if c is node:
                break
            if c.kind == "tile":
                out += [t for t in c.tensors if t not in out]
        return out

    def _left_tags(self, node: TreeNode, tid: int) -> list[str]:
        out: list[str] = []
        assert node.parent is not None
        for c in node.parent.children:
            if c is node:
                break
            if c.kind == "tile":
                out += [c.tags[i] for i, t in enumerate(c.tensors) if t == tid]
        return out

    def _unit_pj(self, a: Access) -> float:
        """Energy of one access of a compute unit.

        The formula is picked by the unit's tile name (``SystolicArray``: MACs, ``VSIMD``: SIMD
        ops; compatibility deviation ``energy_by_name``) or, native, by its class (``mac``,
        ``simd``) where the arch names one; any other unit: ``compute_energy`` per instance.
        """
        spec = a.level
        cls = spec.attrs.get("class")
        if self.compat.energy_by_name or cls is None:  # a tree file may not name classes
            mac, simd = spec.kind == "SystolicArray", spec.kind == "VSIMD"
        else:
            mac, simd = cls == "mac", cls == "simd"
        if mac:
            return a.mac_pj
        if simd:
            width = int(spec.attrs.get("computeWidth", 8))
            given = None if self.compat.simd_constants else spec.attrs.get("op_energy_pj")
            if isinstance(given, dict) and a.op_type in given:
                per = float(f32(float(given[a.op_type])))
            elif a.op_type in ("rowsum", "rowmax"):
                base = 0.11 if a.op_type == "rowsum" else 0.0025
                per = float(f32(base * math.ceil(math.log2(width))))
            elif a.op_type in SIMD_PJ:
                per = float(f32(SIMD_PJ[a.op_type]))
            else:
                raise TreeModelError(f"op type {a.op_type} has no SIMD energy")
            return per * width
        return float(spec.attrs.get("compute_energy", 0)) * spec.instances

    def _mem_pj(self, a: Access) -> float:
        at = a.level.attrs
        if a.rw:
            cost = at.get("parent_write_energy", 0) if a.at_target else at.get(
                "child_read_energy", 0)  # fmt: skip
        else:
            cost = at.get("parent_read_energy", 0) if a.at_target else at.get(
                "child_write_energy", 0)  # fmt: skip
        e = a.count * a.tile * a.proj_count * a.precision * float(f32(cost))
        e /= a.level.width_bytes() * 8.0
        return e * 2 if a.rmw else e

    def walk(self, node: TreeNode, sp: dict[str, dict[int, int]], iters: dict[str, dict[int, int]],
             root: TreeNode) -> None:  # fmt: skip
        """Pre-order walk; ``sp`` and ``iters`` are the parents' instance and iteration counts."""
        ss = self.ss
        if node.kind == "op":
            return
        here: dict[str, dict[int, int]] = {}
        if node.kind == "tile":
            nest = ss.nests.tiles[node.id]
            if node.spatial or node.is_leaf_tile:
                lv_pj: dict[str, float] = {}
                noc: dict[str, float] = {}
                is_root = node.parent is root
                for a in ss.accesses.get(node.id, []):
                    if a.at_target and not a.compute:
                        here.setdefault(a.tag, {})[a.tid] = a.count
                    if not a.compute and not is_root:
                        found, n = _max_count(iters, self._left_tensors(node) + node.tensors)
                        if not found:
                            raise TreeModelError(f"{node.label}: no parent iteration count")
                        a.count *= n
                        iters.setdefault(a.tag, {})[a.tid] = n
                        self.parent_iters[node.id] = max(self.parent_iters.get(node.id, 0), n)
                        if not a.at_target:
                            key = f"{a.level.name}<->{a.level.name}"
                            noc[key] = noc.get(key, 0.0) + a.noc_pj * n
                    nodes = 1
                    if a.tag in sp:
                        if a.tid in sp[a.tag]:
                            nodes = sp[a.tag][a.tid]
                        else:
                            for t in node.tensors:
                                if t in sp[a.tag]:
                                    nodes = max(nodes, sp[a.tag][t])
                            sp[a.tag][a.tid] = nodes
                    elif not is_root:
                        found, nodes = _max_count(sp, self._left_tensors(node) + node.tensors)
                        if not found:
                            raise TreeModelError(f"{node.label}: no parent instance count")
                    if not self.compat.tag_instances:
                        nodes = self.fan_out[node.id]
                    if a.compute:
                        n = 1
                        if a.tag in iters:
                            for t in node.tensors:
                                if t in iters[a.tag]:
                                    n = max(n, iters[a.tag][t])
                        else:
                            found, n = _max_count(iters, node.tensors)
                            if not found:
                                found, n = _max_count(iters, self._left_tensors(node))
                        a.count *= n
                        e = nodes * a.count * self._unit_pj(a)
                    else:
                        e = nodes * self._mem_pj(a)
                    lv_pj[a.level.name] = lv_pj.get(a.level.name, 0.0) + e
                self.level_pj[node.id] = lv_pj
                self.noc_pj[node.id] = noc
                cnt = 0
                for a in ss.accesses.get(node.id, []):
                    if not a.at_target:
                        continue
                    per = sp.setdefault(a.tag, {})
                    f = nest.sp_iters[cnt] if cnt < len(nest.sp_iters) else 1
                    per[a.tid] = per[a.tid] * f if a.tid in per else f
                    cnt += 1
            if node.is_leaf_tile:
                return
            for tag, per in here.items():
                for tid, n in per.items():
                    tgt = iters.setdefault(tag, {})
                    tgt[tid] = tgt[tid] * n if tid in tgt else n
        for i, c in enumerate(node.children):
            if c.kind == "collective":
                self._collective(node, c, i, here, iters)
            elif c.kind == "tile":
                self.walk(c, {k: dict(v) for k, v in sp.items()},
                          {k: dict(v) for k, v in iters.items()}, root)  # fmt: skip

    def _collective(self, node: TreeNode, c: TreeNode, i: int, here: dict[str, dict[int, int]],
                    iters: dict[str, dict[int, int]]) -> None:  # fmt: skip
        ss = self.ss
        mem, net = ss.col_energy[c.id]
        tags = self._left_tags(c, c.in_tensor)
        if not node.spatial:
            left = next((x for x in reversed(node.children[:i]) if x.kind == "tile"), None)
            if left is None or not tags:
                raise TreeModelError(f"{c.label}: no tile node producing its tensor on the left")
            for a in ss.accesses.get(left.id, []):
                if a.at_target and not a.compute:
                    here.setdefault(a.tag, {})[a.tid] = a.count
            n = here.get(tags[-1], {}).get(c.in_tensor, 0)
            self.parent_iters[c.id] = n
            self.level_pj[c.id] = {c.target: mem * n}
            self.noc_pj[c.id] = {f"{c.target}<->{c.target}": net * n}
        else:
            n = 1
            for tag, per in iters.items():
                if c.in_tensor in per and tag in tags:
                    n = per[c.in_tensor]
            self.parent_iters[c.id] = n
            self.level_pj[c.id] = {c.target: mem}
            self.noc_pj[c.id] = {f"{c.target}<->{c.target}": net}
            for d in (self.level_pj.get(node.id, {}), self.noc_pj.get(node.id, {})):
                for k in d:
                    d[k] *= n


# --- stage 6: report --------------------------------------------------------------------------


def _pre_order(node: TreeNode) -> list[TreeNode]:
    out = [node]
    for c in node.children:
        out += _pre_order(c)
    return out


def report(
    ss: SteadyState, en: Energy, root: TreeNode, calc_noc: bool, compat: Compat
) -> dict[str, object]:
    """COMET's per-unit cycle table (CS, OS, TMW) and per-level energy rows."""
    table: dict[str, dict[str, int]] = {}
    total = 0
    for node in _pre_order(root):
        if node.kind not in ("tile", "collective"):
            continue
        shown = node.kind == "collective" or node.spatial or node.is_leaf_tile
        if not shown:
            continue
        its = en.parent_iters.get(node.id, 1) & 0xFFFFFFFF
        for levels in ss.level_cost.get(node.id, {}).values():
            cs = [0, 0]
            os_ = 0
            comp = 0
            names = []
            for lv, cv in sorted(levels.items(), key=lambda kv: ss.rank(kv[0])):
                names.append(lv)
                for idx in (0, 1):
                    cs[idx] = max(cs[idx], cv[idx].ramp_up + cv[idx].ramp_down)
                    os_ = max(os_, cv[idx].cumm)
                comp = max(comp, cv[0].compute_time, cv[1].compute_time)
            if node.kind == "collective":
                key = f"{node.col_type.upper()}-{node.id}"
                total += (cs[0] + cs[1] + os_) * its
                row = table.setdefault(key, {})
                row["OS"] = row.get("OS", 0) + (cs[0] + cs[1] + os_) * its
                continue
            os_ = max(ss.node_cost[node.id] - cs[0] - cs[1] - comp, 0)
            key = "".join(f"{n}-" for n in names)
            total += (cs[0] + cs[1] + os_) * its
            row = table.setdefault(key, {})
            row["CS"] = row.get("CS", 0) + (cs[0] + cs[1]) * its
            row["OS"] = row.get("OS", 0) + (os_ if compat.unscaled_os else os_ * its)
            if node.is_leaf_tile:
                total += comp * its
                table.setdefault(node.children[0].op_name, {})["TMW"] = comp * its
    energy: dict[str, np.float32] = {}
    for node in _pre_order(root):
        if node.kind not in ("tile", "collective"):
            continue
        for lv, e in sorted(en.level_pj.get(node.id, {}).items(), key=lambda kv: ss.rank(kv[0])):
            level = ss.arch.levels[lv]
            key = f"{lv}-{node.children[0].op_name}" if (
                node.is_leaf_tile and level.is_compute) else lv  # fmt: skip
            energy[key] = f32(float(energy.get(key, f32(0))) + e)
        if calc_noc:
            for name, e in sorted(en.noc_pj.get(node.id, {}).items()):
                key = f"{name}-{node.col_type.upper()}" if node.kind == "collective" else name
                energy[key] = f32(float(energy.get(key, f32(0))) + e)
    e_total = f32(0)
    for k in sorted(energy):
        e_total = f32(e_total + energy[k])
    units = {
        k: {**{p: v for p, v in sorted(row.items())}, "total": sum(row.values())}
        for k, row in sorted(table.items())
    }
    return {
        "total_cycles": total if compat.unit_sum_total else ss.node_cost[root.id],
        "total_energy_pj": float(e_total),
        "cycles": units,
        "energy_pj": {k: float(v) for k, v in sorted(energy.items())},
        "root_cycles": ss.node_cost[root.id],
        "nest": loop_nest(ss, en, root),
        **dict(zip(("ideal_cycles", "utilisation"), ideal_compute(ss, root), strict=True)),
    }


def _total_nodes(arch: Any, name: str) -> int:
    """Instances of a level across the chip: its own times its widest parent's, up to the root."""
    n = arch.levels[name].instances
    while True:
        parents = [lv for lv in arch.levels.values() if name in lv.child_nets]
        if not parents:
            return n
        top = max(parents, key=lambda lv: lv.instances)
        n *= top.instances
        name = top.name


def ideal_op_cycles(inp: TreeMapping, arch_costs: bool = False) -> dict[str, int]:
    r"""COMET's ideal compute cycles per op: a function of the tree alone, no stage run.

    .. math::

        t_{op} = \frac{(|\text{op}| / |\text{primitive}|) \, t_{prim}}{n_{units}}

    with ``|op|`` the op's iteration space, ``t_prim`` one primitive's cycles on its unit and
    ``n_units`` the unit's instances across the chip. Their sum is the mapper's lower bound on
    the total cycles (:meth:`fusekit.accel.comet.space.Space.lower_bound`). ``arch_costs``: SIMD
    cycles from the arch where it gives them (the native model, :func:`compute_cycles`).
    """
    prob, arch = inp.problem, inp.arch
    ideal: dict[str, int] = {}
    for node in _pre_order(inp.mapping):
        if not node.is_leaf_tile:
            continue
        op = node.children[0]
        unit = arch.levels[node.childs[0]]
        spec = prob.ops[op.op_name]
        space = math.prod(prob.sizes[d] for d in (spec.dims or range(len(prob.dims))))
        steps = space // math.prod(op.primitive.values())
        cyc = compute_cycles(unit, op, arch_costs)
        ideal[op.op_name] = steps * cyc // _total_nodes(arch, unit.name)
    return dict(sorted(ideal.items()))


def ideal_compute(ss: SteadyState, root: TreeNode) -> tuple[dict[str, int], dict[str, float]]:
    r"""COMET's ideal compute cycles per op (:func:`ideal_op_cycles`) and units' utilisation.

    .. math::

        u_{unit} = \sum_{op \text{ on unit}} t_{op} / t_{root}
    """
    ideal = ideal_op_cycles(ss.inp, not ss.compat.simd_constants)
    unit_of = {
        node.children[0].op_name: node.childs[0] for node in _pre_order(root) if node.is_leaf_tile
    }
    util: dict[str, float] = {}
    total = ss.node_cost[root.id] or 1
    for op_name, t in ideal.items():
        u = unit_of[op_name]
        util[u] = float(f32(f32(util.get(u, 0.0)) + f32(f32(t) / f32(total))))
    return ideal, dict(sorted(util.items()))


def loop_nest(ss: SteadyState, en: Energy, root: TreeNode) -> list[dict[str, object]]:
    """What an architect reads, per node in pre-order (Timeloop's loop-nest view).

    Each tile node: its loops (per tensor: dim -> factor, temporal or spatial, at ``target ->
    child``), its accesses (per level: tensor, reads or writes of ``count`` tiles of ``tile``
    elements of ``bits`` bits, and the resulting bytes), its cycles and its energy by level.
    Collectives: kind, tensor, level, cycles (per iteration) and iterations.
    """
    prob = ss.inp.problem
    out: list[dict[str, object]] = []

    def walk(node: TreeNode, depth: int) -> None:
        rec: dict[str, object] = {"node": node.label, "depth": depth}
        if node.kind == "tile":
            rec["type"] = "spatial" if node.spatial else "temporal"
            rec["loops"] = [
                {
                    "tensor": prob.tensors[tid], "tag": node.tags[t],
                    "from": node.targets[t], "to": node.childs[t], "bits": node.scale[t],
                    "factors": [{prob.dims[d]: v for d, v in f.items() if v != 1}
                                for f in node.tilings[t]],
                }
                for t, tid in enumerate(node.tensors)
            ]  # fmt: skip
            rec["accesses"] = [
                {
                    "level": a.level.name, "tensor": prob.tensors[a.tid], "tag": a.tag,
                    "role": "compute" if a.compute else ("target" if a.at_target else "child"),
                    "write": a.rw if not a.compute else None, "count": a.count,
                    "tile_elems": a.tile * a.proj_count,
                    "bytes": a.count * a.tile * a.proj_count * a.precision // 8,
                }
                for a in ss.accesses.get(node.id, [])
            ]  # fmt: skip
            rec["cycles"] = ss.node_cost.get(node.id)
        elif node.kind == "collective":
            rec.update(type=node.col_type, tensor=prob.tensors[node.in_tensor], level=node.target,
                       cycles=ss.node_cost.get(node.id),
                       iterations=en.parent_iters.get(node.id, 1))  # fmt: skip
        elif node.kind == "op":
            rec.update(type="op", op=node.op_name, op_type=node.op_type,
                       primitive={prob.dims[d]: v for d, v in node.primitive.items()})  # fmt: skip
        else:
            rec["type"] = node.binding
        if node.id in en.level_pj:
            rec["energy_pj"] = {**en.level_pj[node.id], **en.noc_pj.get(node.id, {})}
        out.append(rec)
        for c in node.children:
            walk(c, depth + 1)

    walk(root, 0)
    return out


def analyse(
    inp: TreeMapping,
    calc_noc: bool = True,
    compat: Compat | None = None,
    memo: dict[tuple[Any, ...], Any] | None = None,
) -> dict:
    """Run COMET's stages 1-6 on one run's inputs (see the module docstring).

    ``memo``: leaf results shared by the tilings of one template, same arch, dims and
    ``compat`` (:meth:`SteadyState.visit_leaf`); ``None`` evaluates every node.
    """
    compat = compat or Compat()
    fit_check(inp, compat)
    nests = build_nests(inp)
    moves = build_movements(inp, nests)
    ss = SteadyState(inp, nests, moves, compat, memo)
    ss.visit(inp.mapping)
    en = Energy(ss, compat)
    en.walk(inp.mapping, {}, {}, inp.mapping)
    return report(ss, en, inp.mapping, calc_noc, compat)
