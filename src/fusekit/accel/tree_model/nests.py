"""Stages 2 and 3: the loop nest of every tile node, and the tiles each iteration moves.

Stage 2 (:func:`build_nests`), post-order: each tile node's per-tensor loop descriptors
(``stride`` = the tile below, ``end`` = stride x factor), its temporal iteration count, its
spatial fan-out and the time steps of the child per iteration (``relative_timestep``).

Stage 3 (:func:`build_movements`), pre-order: per tensor and iteration of a tile node, the
projected tile (elements), how many distinct tiles move (0 when the tile did not change: reuse)
and the number of spatial children.
"""

from __future__ import annotations

import math

from fusekit.accel.tree import Hierarchy, TreeMapping, TreeNode
from fusekit.accel.tree_model.records import Move, MoveRow, Moves, Nest, Nests, TreeModelError


def extent_after(node: TreeNode, extent: dict[int, int], arch: Hierarchy) -> dict[int, int]:
    """A tensor's extent after collective ``node``: gathered over sources, scattered over sinks."""
    n_src = math.prod(arch.levels[s].instances for s in node.src)
    n_dst = math.prod(arch.levels[s].instances for s in node.dest)
    out = dict(extent)
    if node.dim in out and node.col_type in ("gather", "allgather"):
        out[node.dim] *= n_src
    elif node.dim in out and node.col_type == "scatter":
        out[node.dim] = int(out[node.dim] / n_dst)
    return out


class _NestWalk:
    """Stage 2's post-order walk: strides and time steps grow from the ops up."""

    def __init__(self, inp: TreeMapping) -> None:
        self.inp = inp
        self.stride: dict[tuple[int, str], dict[int, int]] = {}
        self.steps: dict[tuple[int, str], int] = {}
        self.produced: dict[str, dict[int, list[dict[int, int]]]] = {}
        self.out = Nests()

    def visit(self, node: TreeNode) -> None:
        if node.kind == "op":
            self.op(node)
        elif node.kind == "collective":
            self.collective(node)
        elif node.kind == "tile":
            for c in node.children:
                self.visit(c)
            self.tile(node)

    def op(self, node: TreeNode) -> None:
        """An op's tile sizes start the strides; a GEMM's primitives per tile, its steps."""
        for t, ts in node.tilesizes.items():
            self.stride[(t, node.op_name)] = dict(ts)
            if node.op_type == "gemm":
                rel = 1
                for d, v in node.primitive.items():
                    rel *= ts.get(d, 0) // v
                self.steps[(t, node.op_name)] = rel
            else:
                self.steps[(t, node.op_name)] = 1

    def collective(self, node: TreeNode) -> None:
        """A collective's tensor extents before and after it (from the tile on its left)."""
        prob = self.inp.problem
        extents = self.produced.get(node.target, {}).get(node.in_tensor)
        if extents is None:
            raise TreeModelError(
                f"{node.label}: in_tensor {prob.tensors[node.in_tensor]} is not produced at "
                f"{node.target} on its left (COMET reads an empty tile here)"
            )
        sized = [extent_after(node, e, self.inp.arch) for e in extents]
        self.out.col_in[node.id] = [dict(e) for e in extents]
        self.out.col_out[node.id] = sized
        at = self.produced.get(node.target, {})
        if node.out_tensor in at:
            at[node.out_tensor] = sized
        if node.wb_output:
            self.stride[(node.in_tensor, node.tag)] = dict(sized[-1])
            self.steps[(node.in_tensor, node.tag)] = 1

    def tile(self, node: TreeNode) -> None:
        """A tile node's loops over each tensor's tile below, and the outputs it produces."""
        prob = self.inp.problem
        inter = prob.intermediates
        nest = Nest([], [], [], [], [], [])
        for t, tid in enumerate(node.tensors):
            tag = node.tags[t]
            key = (tid, tag)
            prev = self.steps.get(key, 0)
            op = prob.ops.get(tag)
            nest.rw.append(tid in op.rw if op is not None and tid in op.projections else True)
            nest.dependent.append(tid in inter)
            st = self.stride.setdefault(key, {})
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
                        self.steps[key] = self.steps.get(key, 0) * v
                        iters *= v
                descs.append(desc)
            nest.desc.append(descs)
            nest.rel_ts.append(prev)
            nest.iters.append(iters)
            nest.sp_iters.append(sp)
        self.out.tiles[node.id] = nest
        for spec in prob.ops.values():
            oid = prob.tensors.index(spec.out)
            for t, tid in enumerate(node.tensors):
                if tid == oid:
                    ends = [{d: e for d, (e, _s) in desc.items()} for desc in nest.desc[t]]
                    self.produced.setdefault(node.targets[t], {})[tid] = ends


def build_nests(inp: TreeMapping) -> Nests:
    """Stage 2 (see the module docstring)."""
    walk = _NestWalk(inp)
    walk.visit(inp.mapping)
    return walk.out


def temporal_period(nest: Nest, node: TreeNode, t: int, proj: tuple[int, ...]) -> tuple[int, int]:
    """A temporal node's tensor ``t``: its tile (elements) and how often a new one moves.

    The tile changes when a projected loop with more than one step advances: every ``period``
    iterations, the product of the steps of the loops inside the innermost such loop (loops
    innermost first); ``0`` when no projected loop advances (the tile moves once).
    """
    desc = nest.desc[t][-1]
    order = node.order
    strides = [desc[d][1] for d in order]
    ends = [desc[d][0] for d in order]
    where = [order.index(d) for d in proj]
    tile = math.prod(strides[i] for i in where)
    period, inner = 0, 1
    for i in range(len(order)):
        steps = ends[i] // strides[i] if strides[i] else 1
        if i in where and steps > 1:
            period = inner
            break
        inner *= max(steps, 1)
    return tile, period


def _temporal_moves(nest: Nest, node: TreeNode, t: int, proj: tuple[int, ...]) -> MoveRow:
    """A temporal node's iterations (innermost dim first): a tile moves when it changes."""
    tile, period = temporal_period(nest, node, t, proj)
    return MoveRow(nest.iters[t], period, Move(tile, 1, 1), Move(tile, 0, 1))


def _spatial_moves(
    inp: TreeMapping, nests: Nests, moves: Moves, node: TreeNode, parent: TreeNode
) -> list[MoveRow]:
    """A spatial node's tiles move to its children when its temporal parent's tiles move."""
    prob = inp.problem
    nest, pnest = nests.tiles[node.id], nests.tiles[parent.id]
    per: list[MoveRow] = []
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
        if pmoves.kept.unique or not pmoves.moved.unique:
            raise TreeModelError(f"{node.label}: its parent's tiles move in no temporal pattern")
        kept, moved = Move(tile, 0, nest.sp_iters[t]), Move(tile, unique, nest.sp_iters[t])
        # a new tile to the children in the parent's iterations that moved one (and the first)
        per.append(MoveRow(pnest.iters[pidx], pmoves.period, moved, kept))
    return per


def build_movements(inp: TreeMapping, nests: Nests) -> Moves:
    """Stage 3 (see the module docstring): per tile node, per tensor, one record per iteration."""
    prob = inp.problem
    moves: Moves = {}

    def visit(node: TreeNode) -> None:
        if node.kind != "tile":
            return
        nest = nests.tiles[node.id]
        if not node.spatial:
            moves[node.id] = [
                _temporal_moves(nest, node, t, prob.projection(node.tags[t], tid))
                for t, tid in enumerate(node.tensors)
            ]
        else:
            parent = node.parent
            if parent is None or parent.kind != "tile" or parent.spatial:
                raise TreeModelError(f"{node.label}: a spatial tile needs a temporal tile above")
            moves[node.id] = _spatial_moves(inp, nests, moves, node, parent)
        for c in node.children:
            visit(c)

    visit(inp.mapping)
    return moves
