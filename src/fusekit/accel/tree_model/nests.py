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

from fusekit.accel.tree import Chain, Hierarchy, TreeMapping, TreeNode
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
        prob = inp.problem
        self.inter = prob.intermediates
        self.outs = frozenset(prob.tensors.index(spec.out) for spec in prob.ops.values())
        self.rw: dict[tuple[int, str], bool] = {}  # per (tensor, tag): read-modify-written
        self.stride: dict[tuple[int, str], dict[int, int]] = {}
        self.steps: dict[tuple[int, str], int] = {}
        #: per level, per tensor: the loops that last produced its tiles there (their ends)
        self.produced: dict[str, dict[int, list[dict[int, tuple[int, int]]]]] = {}
        self.out = Nests()

    def visit(self, node: TreeNode) -> None:
        """``node`` after its children (bindings have nothing to add)."""
        if node.kind == "tile":
            for c in node.children:
                if c.kind != "bind":
                    self.visit(c)
            self.tile(node)
        elif node.kind == "op":
            self.op(node)
        elif node.kind == "collective":
            self.collective(node)

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
        loops = self.produced.get(node.target, {}).get(node.in_tensor)
        if loops is None:
            raise TreeModelError(
                f"{node.label}: in_tensor {prob.tensors[node.in_tensor]} is not produced at "
                f"{node.target} on its left (COMET reads an empty tile here)"
            )
        extents = [{d: e for d, (e, _s) in desc.items()} for desc in loops]
        sized = [extent_after(node, e, self.inp.arch) for e in extents]
        self.out.col_in[node.id] = extents
        self.out.col_out[node.id] = sized
        at = self.produced.get(node.target, {})
        if node.out_tensor in at:  # now produced as sized: as loops ending there
            at[node.out_tensor] = [{d: (e, e) for d, e in ext.items()} for ext in sized]
        if node.wb_output:
            self.stride[(node.in_tensor, node.tag)] = dict(sized[-1])
            self.steps[(node.in_tensor, node.tag)] = 1

    def is_rw(self, key: tuple[int, str]) -> bool:
        """Whether the tag's op reads and writes the tensor (one the op does not use: ``True``)."""
        rw = self.rw.get(key)
        if rw is None:
            tid, tag = key
            op = self.inp.problem.ops.get(tag)
            rw = self.rw[key] = tid in op.rw if op is not None and tid in op.projections else True
        return rw

    def tile(self, node: TreeNode) -> None:
        """A tile node's loops over each tensor's tile below, and the outputs it produces."""
        nest = Nest([], [], [], [], [], [])
        for t, tid in enumerate(node.tensors):
            key = (tid, node.tags[t])
            nest.rw.append(self.is_rw(key))
            nest.dependent.append(tid in self.inter)
            nest.rel_ts.append(self.steps.get(key, 0))
            descs, product = self.loops(key, node.tilings[t])
            nest.desc.append(descs)
            nest.iters.append(1 if node.spatial else product)
            nest.sp_iters.append(product if node.spatial else 1)
            if not node.spatial and any(node.tilings[t]):  # the steps grow by the factors
                self.steps[key] = nest.rel_ts[-1] * product
            if tid in self.outs:
                self.produced.setdefault(node.targets[t], {})[tid] = descs
        self.out.tiles[node.id] = nest

    def loops(
        self, key: tuple[int, str], factors: list[dict[int, int]]
    ) -> tuple[list[dict[int, tuple[int, int]]], int]:
        """A tensor's loop descriptors (``(end, stride)`` per dim) and its factors' product.

        Each loop's stride is the tensor's extent so far, which the loop grows by its factor.
        """
        st = self.stride.get(key)
        if st is None:
            st = self.stride[key] = {}
        product = 1
        descs = []
        for fac in factors:
            desc = {}
            for d, v in fac.items():
                s = st.get(d, 0)
                desc[d] = (s * v, s)
                if v != 1:
                    st[d] = s * v
                    product *= v
                elif d not in st:  # a factor of 1 changes nothing but an unknown dim's 0
                    st[d] = 0
            descs.append(desc)
        return descs, product


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
    tile = 1
    for d in proj:
        tile *= desc[d][1]
    period, inner = 0, 1
    for d in node.order:
        end, stride = desc[d]
        steps = end // stride if stride else 1
        if steps > 1:
            if d in proj:
                period = inner
                break
            inner *= steps
    return tile, period


def _spatial_moves(
    nests: Nests, moves: Moves, node: TreeNode, parent: TreeNode, proj: _Projections
) -> list[MoveRow]:
    """A spatial node's tiles move to its children when its temporal parent's tiles move."""
    nest, pnest = nests.tiles[node.id], nests.tiles[parent.id]
    first_at: dict[tuple[int, str], int] = {}  # per (tensor, tag): its first and last index
    last_at: dict[tuple[int, str], int] = {}
    for i, key in enumerate(zip(parent.tensors, parent.tags, strict=True)):
        first_at.setdefault(key, i)
        last_at[key] = i
    per: list[MoveRow] = []
    pidx = 0  # COMET keeps the last match when a tensor's tag is not in the parent
    for t, key in enumerate(zip(node.tensors, node.tags, strict=True)):
        if key in first_at:
            pidx = first_at[key]
            if node.targets[t] == parent.targets[pidx]:
                nest.iters[t] = pnest.iters[last_at[key]]
        first, last = nest.desc[t][0], nest.desc[t][-1]
        unique = tile = 1
        for d in proj.of(key):
            unique *= -(-last[d][0] // first[d][1])
            tile *= first[d][1]
        pmoves = moves[parent.id][pidx]
        if pmoves.kept.unique or not pmoves.moved.unique:
            raise TreeModelError(f"{node.label}: its parent's tiles move in no temporal pattern")
        kept, moved = Move(tile, 0, nest.sp_iters[t]), Move(tile, unique, nest.sp_iters[t])
        # a new tile to the children in the parent's iterations that moved one (and the first)
        per.append(MoveRow(pnest.iters[pidx], pmoves.period, moved, kept))
    return per


class _Projections:
    """``Chain.projection`` per (tensor, tag), looked up once per walk."""

    def __init__(self, prob: Chain) -> None:
        self.prob = prob
        self.known: dict[tuple[int, str], tuple[int, ...]] = {}

    def of(self, key: tuple[int, str]) -> tuple[int, ...]:
        """The projection of tensor ``key[0]`` under tag ``key[1]``."""
        proj = self.known.get(key)
        if proj is None:
            proj = self.known[key] = self.prob.projection(key[1], key[0])
        return proj


def build_movements(inp: TreeMapping, nests: Nests) -> Moves:
    """Stage 3 (see the module docstring): per tile node, per tensor, one record per iteration."""
    walk = _MoveWalk(inp, nests)
    if inp.mapping.kind == "tile":
        walk.visit(inp.mapping)
    return walk.moves


class _MoveWalk:
    """Stage 3's pre-order walk: a spatial node's moves follow its temporal parent's."""

    def __init__(self, inp: TreeMapping, nests: Nests) -> None:
        self.nests = nests
        self.proj = _Projections(inp.problem)
        self.moves: Moves = {}
        self.temporal: dict[int, tuple[Move, Move]] = {}  # per tile size (read-only, shared)

    def visit(self, node: TreeNode) -> None:
        """``node``, a tile node, then the tile nodes below it."""
        if not node.spatial:
            self.moves[node.id] = self.temporal_rows(node)
        else:
            parent = node.parent
            if parent is None or parent.kind != "tile" or parent.spatial:
                raise TreeModelError(f"{node.label}: a spatial tile needs a temporal tile above")
            self.moves[node.id] = _spatial_moves(self.nests, self.moves, node, parent, self.proj)
        for c in node.children:
            if c.kind == "tile":
                self.visit(c)

    def temporal_rows(self, node: TreeNode) -> list[MoveRow]:
        """A temporal node's tensors: a new tile moves at the first iteration, then is kept."""
        nest = self.nests.tiles[node.id]
        rows: list[MoveRow] = []
        for t, key in enumerate(zip(node.tensors, node.tags, strict=True)):
            tile, period = temporal_period(nest, node, t, self.proj.of(key))
            moved, kept = self.temporal.get(tile) or self.new_tile(tile)
            rows.append(MoveRow(nest.iters[t], period, moved, kept))
        return rows

    def new_tile(self, tile: int) -> tuple[Move, Move]:
        """A tile's moves (shared, read-only): moved at the first iteration, then kept."""
        pair = self.temporal[tile] = (Move(tile, 1, 1), Move(tile, 0, 1))
        return pair
