"""Stage 1, the fit check: do the tiles a tiling asks each level to hold fit in it?

Per temporal tile node, the bytes of its tensors' tiles at their target level (the largest per
tensor, then summed over the node's tensors) are added to the level's occupancy: as the largest
over sequential siblings, summed over pipelined ones. A level whose occupancy exceeds
``width * depth`` of one instance (half of it when double-buffered, natively) rejects the tiling;
DRAM is never checked.
"""

from __future__ import annotations

from collections.abc import Callable

from fusekit.accel.compat import Compat
from fusekit.accel.tree import TreeMapping, TreeNode
from fusekit.accel.tree_model.nests import extent_after
from fusekit.accel.tree_model.records import FitError, TreeModelError

#: Per (tensor id, op tag): the tile's extent per dim, grown bottom-up.
Sizes = dict[tuple[int, str], dict[int, int]]


def binding_of(node: TreeNode, compat: bool = True) -> str:
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
    i = node.position()
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
    """Reject a tiling whose tiles overflow a level (see the module docstring).

    Raises:
        FitError: every overflowing level with requested and available bytes.
    """
    arch = inp.arch
    walk = _FitWalk(inp, compat)
    walk.visit(inp.mapping)
    over = []
    for name in sorted(arch.levels):
        if name == "DRAM":
            continue
        cap = arch.levels[name].capacity_bytes()
        if not compat.full_double_buffer and arch.levels[name].attrs.get("doublebuffered"):
            cap //= 2
        req = walk.occupancy.get(name, 0)
        if req > cap:
            over.append((name, cap, req))
    if over:
        raise FitError(inp.mapping_file, over)


class _FitWalk:
    """Stage 1's post-order walk: the tiles grow from the ops up and fill their levels."""

    def __init__(self, inp: TreeMapping, compat: Compat) -> None:
        self.inp = inp
        self.compat = compat
        self.sizes: Sizes = {}
        self.occupancy: dict[str, int] = {}  # bytes per level
        self.projections: dict[tuple[str, int], tuple[int, ...]] = {}

    def visit(self, node: TreeNode) -> None:
        """``node`` after its children (bindings have nothing to add)."""
        sizes = self.sizes
        if node.kind == "tile":
            for c in node.children:
                if c.kind != "bind":
                    self.visit(c)
            _grow(node, sizes)
            if node.parent is not None and not node.spatial:  # the root: dimension sizes only
                binding = _binding(node, node.parent, self.compat)
                _occupy(self.occupancy, _requested_bytes(node, self.projection, sizes), binding)
        elif node.kind == "op":
            for t, ts in node.tilesizes.items():
                sizes[(t, node.op_name)] = dict(ts)
        elif node.kind == "collective":
            extent = _left_size(node, sizes)
            sizes[(node.in_tensor, node.tag)] = extent_after(node, extent, self.inp.arch)

    def projection(self, tag: str, tid: int) -> tuple[int, ...]:
        """``Chain.projection`` of tensor ``tid`` under op tag ``tag``, looked up once."""
        proj = self.projections.get((tag, tid))
        if proj is None:
            proj = self.projections[(tag, tid)] = self.inp.problem.projection(tag, tid)
        return proj


def _grow(node: TreeNode, sizes: Sizes) -> None:
    """Multiply the tiles of ``node``'s tensors by its loop factors."""
    for t, key in enumerate(zip(node.tensors, node.tags, strict=True)):
        acc = sizes.get(key)
        if acc is None:
            acc = sizes[key] = {}
        for fac in node.tilings[t]:
            for d, v in fac.items():
                if v != 1:
                    acc[d] = acc.get(d, 0) * v
                elif d not in acc:  # a factor of 1 changes nothing but an unknown dim's 0
                    acc[d] = 0


def _binding(node: TreeNode, parent: TreeNode, compat: Compat) -> str:
    """The binding ``node``'s tiles share their levels under: its own, else its parent's."""
    binding = binding_of(node, compat.binding_misread)
    if binding == "none":
        binding = binding_of(parent, compat.binding_misread)
    return binding


def _requested_bytes(
    node: TreeNode, projection: Callable[[str, int], tuple[int, ...]], sizes: Sizes
) -> dict[str, int]:
    """Bytes ``node`` asks of each target level: per tensor the largest tile, then summed."""
    largest: dict[tuple[int, str], int] = {}  # per (tensor, level)
    tensors = zip(node.tensors, node.tags, node.scale, node.targets, strict=True)
    for tid, tag, bits, lv in tensors:
        tile = sizes[(tid, tag)]
        elems = 1
        for d in projection(tag, tid):
            elems *= tile.get(d, 0)
        nbytes = int(elems * bits / 8.0)
        if nbytes > largest.get((tid, lv), -1):
            largest[(tid, lv)] = nbytes
    here: dict[str, int] = {}
    for (_tid, lv), b in largest.items():
        here[lv] = here.get(lv, 0) + b
    return here


def _occupy(occupancy: dict[str, int], here: dict[str, int], binding: str) -> None:
    """Add a node's bytes: sequential siblings reuse the space, pipelined ones add to it."""
    for lv, b in here.items():
        if lv in occupancy and binding != "none":
            if binding == "sequential":
                occupancy[lv] = max(occupancy[lv], b)
            elif binding == "pipeline":
                occupancy[lv] += b
        else:
            occupancy[lv] = occupancy.get(lv, 0) + b


def _left_size(node: TreeNode, sizes: Sizes) -> dict[int, int]:
    """The tile of a collective's tensor, as the tile node on its left produced it."""
    if node.parent is None:
        raise TreeModelError(f"{node.label}: a collective needs a parent tile node")
    for c in node.parent.children:
        if c is node:
            break
        if c.kind == "tile" and node.in_tensor in c.tensors:
            first = min((tag for tid, tag in sizes if tid == node.in_tensor), default=None)
            if first is not None:  # the tensor's tile under its first tag
                return sizes[(node.in_tensor, first)]
    raise TreeModelError(f"{node.label}: tensor {node.in_tensor} is not produced on its left")
