"""Stage 1, the fit check: do the tiles a tiling asks each level to hold fit in it?

Per temporal tile node, the bytes of its tensors' tiles at their target level (the largest per
tensor, then summed over the node's tensors) are added to the level's occupancy: as the largest
over sequential siblings, summed over pipelined ones. A level whose occupancy exceeds
``width * depth`` of one instance (half of it when double-buffered, natively) rejects the tiling;
DRAM is never checked.
"""

from __future__ import annotations

import math

from fusekit.accel.compat import Compat
from fusekit.accel.tree import Chain, TreeMapping, TreeNode
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
    """Reject a tiling whose tiles overflow a level (see the module docstring).

    Raises:
        FitError: every overflowing level with requested and available bytes.
    """
    arch = inp.arch
    sizes: Sizes = {}
    occupancy: dict[str, int] = {}

    def visit(node: TreeNode) -> None:
        if node.kind == "op":
            for t, ts in node.tilesizes.items():
                sizes[(t, node.op_name)] = dict(ts)
        elif node.kind == "collective":
            sizes[(node.in_tensor, node.tag)] = extent_after(node, _left_size(node, sizes), arch)
        elif node.kind == "tile":
            for c in node.children:
                visit(c)
            _grow(node, sizes)
            if node.parent is not None and not node.spatial:  # the root: dimension sizes only
                binding = _binding(node, node.parent, compat)
                _occupy(occupancy, _requested_bytes(node, inp.problem, sizes), binding)

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


def _grow(node: TreeNode, sizes: Sizes) -> None:
    """Multiply the tiles of ``node``'s tensors by its loop factors."""
    for t, tid in enumerate(node.tensors):
        acc = sizes.setdefault((tid, node.tags[t]), {})
        for fac in node.tilings[t]:
            for d, v in fac.items():
                acc[d] = acc.get(d, 0) * v


def _binding(node: TreeNode, parent: TreeNode, compat: Compat) -> str:
    """The binding ``node``'s tiles share their levels under: its own, else its parent's."""
    binding = binding_of(node, compat.binding_misread)
    if binding == "none":
        binding = binding_of(parent, compat.binding_misread)
    return binding


def _requested_bytes(node: TreeNode, prob: Chain, sizes: Sizes) -> dict[str, int]:
    """Bytes ``node`` asks of each target level: per tensor the largest tile, then summed."""
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
            for (tid, _tag), s in sorted(sizes.items(), key=lambda kv: kv[0][1]):
                if tid == node.in_tensor:
                    return s
    raise TreeModelError(f"{node.label}: tensor {node.in_tensor} is not produced on its left")
