"""Mappings of a compound op: the tree (tile, binding, op and collective nodes) and its knobs.

The tree is what people read and write (YAML, ``fusekit accel eval mapping.yaml``); the flat
:class:`Mapping` is what the mapper enumerates and the cost model reads. ``to_tree`` and
``from_tree`` convert between them, and ``from_tree`` validates every node. A fused GEMM-Softmax
on a 2x2 mesh, for instance::

    tile: {level: dram, temporal: {m: 4}, order: [m]}          # row blocks, one after another
    child:
      tile: {level: global, spatial: {m: 2, n: 2}}            # intermediates stay in the GB
      child:
        bind: pipeline                                         # ops overlap across row blocks
        children:
          - tile: {level: global, temporal: {n: 1, k: 2}, order: [n, k]}
            child: {op: S}                                     # GEMM on the systolic arrays
          - {op: X}                                            # row-max on the SIMD unit
          - {collective: all_reduce, tensor: X, over: n, reduce: max, model: mesh}
          - {op: E}
          ...

Unfused, the root is a ``sequential`` binding with one such nest per op (each with its own
``dram`` tile: intermediates go through DRAM). Errors name the node path and the constraint.
"""

from __future__ import annotations

import math
from collections.abc import Mapping as TMapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from fusekit.accel.collectives import MODELS, CollectiveKind, group_on_mesh
from fusekit.accel.problem import Problem
from fusekit.errors import ConfigError, FusekitError
from fusekit.files import load_yaml_mapping, short
from fusekit.hw import Accelerator


class Fusion(StrEnum):
    """Where a compound op's intermediates live."""

    UNFUSED = "unfused"  # written to DRAM by each op, read back by the next
    FUSED_GB = "fused_gb"  # kept in the cluster's slice of the global buffer
    FUSED_CLUSTER = "fused_cluster"  # kept in the cluster's output buffer


class BindingKind(StrEnum):
    """How a binding node's children run relative to each other, per row block of one cluster.

    * ``sequential``: one child after another, and row blocks one after another;
    * ``pipeline``: row blocks stream through the children, each unit (DRAM, systolic arrays,
      SIMD) working on a different block (intermediates of two blocks live);
    * ``sharing``: the children time-multiplex the cluster's compute units and buffers within one
      row block (one block of intermediates live), the next block's DRAM traffic overlapped;
    * ``parallel``: children that do not depend on one another run at once, each unit running
      its own children (legal only when no child reads another's result: no producer-consumer
      pair and no collective among them).
    """

    SEQUENTIAL = "sequential"
    PIPELINE = "pipeline"
    PARALLEL = "parallel"
    SHARING = "sharing"


class MappingError(FusekitError, ValueError):
    """A mapping breaks a constraint; the message names the node and the constraint."""

    def __init__(self, node: str, problem: str) -> None:
        self.node = node
        super().__init__(f"mapping: {node}: {problem}")


@dataclass(frozen=True, slots=True)
class Mapping:
    """The knobs of one mapping (see the module docstring for the tree they stand for).

    Attributes:
        fusion: where intermediates live.
        spatial_row: clusters the rows are split over.
        spatial_col: clusters the columns are split over (reductions over them need collectives).
        tile_row: rows of a row block on one cluster.
        tile_col: columns of one GEMM tile on one cluster.
        tile_red: contraction extent of one GEMM tile.
        order: loop order (outermost first) of the first GEMM's row, column and contraction loops.
        binding: how the ops of a row block run (:class:`BindingKind`).
        collective: collective cost model (a key of :data:`fusekit.accel.collectives.MODELS`).
    """

    fusion: Fusion
    spatial_row: int
    spatial_col: int
    tile_row: int
    tile_col: int
    tile_red: int
    order: tuple[str, ...]
    binding: BindingKind = BindingKind.PIPELINE
    collective: str = "mesh"

    @property
    def pipeline(self) -> bool:
        """Whether steps overlap."""
        return self.binding is BindingKind.PIPELINE

    def label(self) -> str:
        """A compact one-line description."""
        return (
            f"{self.fusion.value} {self.spatial_row}x{self.spatial_col} "
            f"t{self.tile_row}x{self.tile_col}x{self.tile_red} {''.join(self.order)} "
            f"{self.binding.value} {self.collective}"
        )


def _words(level_bytes: int, word_bytes: int, double: bool) -> int:
    return level_bytes // word_bytes // (2 if double else 1)


def check_mapping(problem: Problem, hw: Accelerator, m: Mapping) -> None:
    """Check every constraint of ``m``; the error names the tree node that breaks one.

    Constraints: factors multiply to the dimensions; the spatial partition is a sub-mesh of the
    accelerator; the loop order is a permutation (row loop outermost when fused); the GEMM tiles
    fit the weight and output buffers and the global buffer; fused intermediates fit their level.

    Raises:
        MappingError: the first broken constraint.
    """
    row, col = problem.row, problem.col
    first = problem.stages[0]
    red = first.reduced_vars[0] if first.reduced_vars else None
    er, ec = problem.extents[row], problem.extents[col]
    sr, sc = m.spatial_row, m.spatial_col
    for name in ("spatial_row", "spatial_col", "tile_row", "tile_col", "tile_red"):
        v = getattr(m, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise MappingError("tile", f"expected '{name}' to be an int >= 1 (got {v!r})")
    if sr * sc > hw.n_clusters or hw.n_clusters % (sr * sc):
        raise MappingError(
            "tile[spatial]",
            f"spatial factors {row}={sr} x {col}={sc} do not fit the "
            f"{hw.mesh_rows}x{hw.mesh_cols} mesh",
        )
    try:
        group_on_mesh(sc, hw.mesh_rows, hw.mesh_cols)
    except ValueError as e:
        raise MappingError("tile[spatial]", str(e)) from None
    if er % (sr * m.tile_row):
        raise MappingError(
            "tile[dram]", f"factors of {row} ({sr} x tile {m.tile_row}) do not divide {row}={er}"
        )
    if ec % sc or (ec // sc) % m.tile_col:
        raise MappingError(
            "tile[gemm]", f"factors of {col} ({sc} x tile {m.tile_col}) do not divide {col}={ec}"
        )
    ek = problem.extents[red] if red else 1
    if first.kind != "gemm" or red is None:
        raise MappingError("op", f"expected the first op {first.out} to be a GEMM")
    if ek % m.tile_red:
        raise MappingError("tile[gemm]", f"tile {m.tile_red} does not divide {red}={ek}")
    if sorted(m.order) != sorted((row, col, red)):
        raise MappingError("tile[dram]", f"expected order to permute {row},{col},{red}")
    fused = m.fusion is not Fusion.UNFUSED
    if not isinstance(m.binding, BindingKind):
        raise MappingError("bind", f"expected one of {', '.join(BindingKind)} (got {m.binding!r})")
    if m.binding is BindingKind.PARALLEL:
        if fused and not problem.independent():
            reader = next(st for st in problem.stages if set(st.inputs) - set(problem.inputs))
            raise MappingError(
                "bind",
                f"parallel children must be independent (op {reader.out} reads "
                f"{', '.join(t for t in reader.inputs if t not in problem.inputs)}, written by a "
                "sibling); use pipeline or sharing",
            )
        if sc > 1 and required_collectives(problem):
            raise MappingError(
                "bind", f"parallel children must be independent ({col} is split: a collective "
                "reads an op's result); use pipeline or sharing",
            )  # fmt: skip
    if fused and m.order[0] != row:
        raise MappingError("tile[dram]", f"fused mappings walk row blocks outermost ({row})")
    if m.collective not in MODELS:
        raise MappingError("collective", f"unknown model {m.collective!r}")
    wb, ob, gb = hw.level("weight"), hw.level("output"), hw.level("global")
    wb_words = _words(wb.size_bytes, hw.word_bytes, wb.double_buffered)
    ob_words = _words(ob.size_bytes, hw.word_bytes, ob.double_buffered)
    gb_words = _words(gb.size_bytes, hw.word_bytes, gb.double_buffered)
    cols = ec // sc
    # row blocks of intermediates live at once: two where blocks overlap (double-buffered)
    blocks = 2 if m.binding in (BindingKind.PIPELINE, BindingKind.PARALLEL) else 1
    for i, st in enumerate(problem.stages):
        if st.kind != "gemm":
            continue
        cvar = next(v for v in st.out_vars if v != row)
        kvar = st.reduced_vars[0]
        ct = m.tile_col if i == 0 else (cols if cvar == col else problem.extents[cvar])
        kt = m.tile_red if i == 0 else (cols if kvar == col else problem.extents[kvar])
        if kt > wb_words:
            raise MappingError(
                f"op {st.out}", f"a weight column of {kt} words exceeds the weight buffer"
            )
        if m.tile_row * ct > ob_words:
            raise MappingError(
                f"op {st.out}",
                f"output tile {m.tile_row}x{ct} = {m.tile_row * ct} words exceeds the output "
                f"buffer ({ob_words} words, double-buffered)",
            )
        gemm_words = m.tile_row * kt + kt * ct + m.tile_row * ct
        live = blocks * m.tile_row * cols if m.fusion is Fusion.FUSED_GB else 0
        if gemm_words + live > gb_words:
            raise MappingError(
                "tile[global]",
                f"tiles of {st.out} ({gemm_words} words) and fused intermediates ({live} words) "
                f"exceed the global buffer ({gb_words} words)",
            )
    if m.fusion is Fusion.FUSED_CLUSTER and blocks * m.tile_row * cols > ob_words:
        raise MappingError(
            "tile[output]",
            f"fused row block {blocks} x {m.tile_row}x{cols} words exceeds the output buffer "
            f"({ob_words} words, {m.binding.value})",
        )


# --- the tree ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TileNode:
    """Loops over tiles held at ``level``: temporal factors in ``order``, spatial over clusters."""

    level: str
    temporal: tuple[tuple[str, int], ...]
    spatial: tuple[tuple[str, int], ...]
    order: tuple[str, ...]
    child: Node


@dataclass(frozen=True, slots=True)
class BindingNode:
    """Children that run sequentially, pipelined, in parallel or sharing a resource."""

    kind: BindingKind
    children: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class OpLeaf:
    """One op of the problem (by the tensor it writes)."""

    op: str


@dataclass(frozen=True, slots=True)
class CollectiveNode:
    """A collective between the clusters that split ``over``, on ``tensor``."""

    kind: CollectiveKind
    tensor: str
    over: str
    reduce: str
    model: str


Node = TileNode | BindingNode | OpLeaf | CollectiveNode


def required_collectives(problem: Problem) -> dict[str, tuple[CollectiveKind, str]]:
    """Op -> (collective, reduce op) needed after it when the columns are split."""
    need = {}
    for st in problem.stages:
        if st.kind == "simd" and problem.col in st.reduced_vars:
            need[st.out] = (CollectiveKind.ALL_REDUCE, st.reduce_op)
        if st.kind == "gemm" and st.reduced_vars[0] == problem.col:
            need[st.out] = (CollectiveKind.REDUCE_SCATTER, "sum")
    return need


def to_tree(problem: Problem, m: Mapping) -> Node:
    """The tree ``m`` stands for (see the module docstring)."""
    row, col = problem.row, problem.col
    first = problem.stages[0]
    red = first.reduced_vars[0]
    steps = problem.extents[row] // (m.spatial_row * m.tile_row)
    fc = problem.extents[col] // m.spatial_col // m.tile_col
    fk = problem.extents[red] // m.tile_red
    spatial = ((row, m.spatial_row), (col, m.spatial_col))
    need = required_collectives(problem) if m.spatial_col > 1 else {}

    def leaves(out: str) -> list[Node]:
        nodes: list[Node] = [OpLeaf(out)]
        if out in need:
            kind, reduce = need[out]
            nodes.append(CollectiveNode(kind, out, col, reduce, m.collective))
        return nodes

    if m.fusion is Fusion.UNFUSED:
        nests: list[Node] = []
        for st in problem.stages:
            temporal = ((row, steps), (col, fc), (red, fk)) if st is first else ((row, steps),)
            order = m.order if st is first else (row,)
            inner = BindingNode(m.binding, tuple(leaves(st.out)))
            nests.append(
                TileNode("dram", temporal, (), order, TileNode("global", (), spatial, (), inner))
            )
        return BindingNode(BindingKind.SEQUENTIAL, tuple(nests))
    gemm = TileNode("global", ((col, fc), (red, fk)), (), m.order[1:], OpLeaf(first.out))
    children: list[Node] = [gemm, *leaves(first.out)[1:]]
    for st in problem.stages[1:]:
        children += leaves(st.out)
    level = "global" if m.fusion is Fusion.FUSED_GB else "output"
    body = TileNode(level, (), spatial, (), BindingNode(m.binding, tuple(children)))
    return TileNode("dram", ((row, steps),), (), (row,), body)


def _factor(pairs: tuple[tuple[str, int], ...], var: str) -> int:
    return dict(pairs).get(var, 1)


def _check_leaves(
    problem: Problem, nodes: tuple[Node, ...], path: str, split: bool, ops: list[str]
) -> str | None:
    """Check op leaves and collectives below a binding; returns the collective model used."""
    need = required_collectives(problem)
    model = None
    for j, node in enumerate(nodes):
        where = f"{path}.children[{j}]"
        if isinstance(node, TileNode):
            node = node.child
            where += ".child"
        if isinstance(node, OpLeaf):
            ops.append(node.op)
        elif isinstance(node, CollectiveNode):
            prev = ops[-1] if ops else None
            want = need.get(prev or "") if split else None
            if want is None:
                raise MappingError(
                    where,
                    f"collective {node.kind.value} after {prev} is not legal: the op does not "
                    f"reduce over a split variable ({problem.col} split: {split})",
                )
            if (node.kind, node.reduce) != want or node.over != problem.col:
                raise MappingError(
                    where,
                    f"expected {want[0].value}({want[1]}) over {problem.col} after {prev} "
                    f"(got {node.kind.value}({node.reduce}) over {node.over})",
                )
            if node.tensor != prev:
                raise MappingError(where, f"expected tensor {prev} (got {node.tensor})")
            model = node.model
            ops.append(f"#{prev}")
        else:
            raise MappingError(where, "expected an op, a collective or a tile over an op")
    if split:
        for op in [o for o in ops if not o.startswith("#")]:
            if op in need and f"#{op}" not in ops:
                kind, reduce = need[op]
                raise MappingError(
                    path, f"{problem.col} is split: op {op} needs a {kind.value}({reduce})"
                )
    return model


def from_tree(problem: Problem, tree: Node, hw: Accelerator) -> Mapping:
    """Read and validate a tree (the shapes :func:`to_tree` writes).

    Raises:
        MappingError: a node of another shape or a broken constraint, naming the node path.
    """
    row, col = problem.row, problem.col
    red = problem.stages[0].reduced_vars[0] if problem.stages[0].reduced_vars else ""
    ops: list[str] = []
    if isinstance(tree, BindingNode):
        if tree.kind is not BindingKind.SEQUENTIAL:
            raise MappingError("root", "an unfused mapping is a sequential binding of op nests")
        fusion = Fusion.UNFUSED
        first_nest: TileNode | None = None
        first_spatial: TileNode | None = None
        model, binding = "mesh", BindingKind.PIPELINE
        for j, nest in enumerate(tree.children):
            where = f"root.children[{j}]"
            if not (
                isinstance(nest, TileNode)
                and nest.level == "dram"
                and isinstance(nest.child, TileNode)
                and isinstance(nest.child.child, BindingNode | OpLeaf)
            ):
                raise MappingError(where, "expected tile[dram] > tile[global] > binding or op")
            if first_nest is None:
                first_nest, first_spatial = nest, nest.child
            elif _factor(nest.temporal, row) != _factor(first_nest.temporal, row) or (
                first_spatial is not None and nest.child.spatial != first_spatial.spatial
            ):
                raise MappingError(where, "unfused ops keep the same row tiling and partition")
            inner = nest.child.child
            kids = inner.children if isinstance(inner, BindingNode) else (inner,)
            if isinstance(inner, BindingNode):
                binding = inner.kind
            split = _factor(nest.child.spatial, col) > 1
            model = _check_leaves(problem, kids, f"{where}.child.child", split, ops) or model
        if first_nest is None or first_spatial is None:
            raise MappingError("root", "expected one nest per op")
        dram, spatial, gemm_tile = first_nest, first_spatial, first_nest
    elif isinstance(tree, TileNode) and tree.level == "dram":
        child = tree.child
        bind = child.child if isinstance(child, TileNode) else None
        if not (isinstance(child, TileNode) and isinstance(bind, BindingNode)):
            raise MappingError("root.child", "expected tile[global|output] > binding")
        spatial = child
        level_fusion = {"global": Fusion.FUSED_GB, "output": Fusion.FUSED_CLUSTER}
        if spatial.level not in level_fusion:
            raise MappingError(
                "root.child", f"fusion level must be global or output (got {spatial.level})"
            )
        fusion = level_fusion[spatial.level]
        binding = bind.kind
        split = _factor(spatial.spatial, col) > 1
        model = _check_leaves(problem, bind.children, "root.child.child", split, ops) or "mesh"
        gemm_node = bind.children[0] if bind.children else None
        if not isinstance(gemm_node, TileNode):
            raise MappingError("root.child.child.children[0]", "expected a tile over the GEMM")
        dram, gemm_tile = tree, gemm_node
    else:
        raise MappingError("root", "expected a sequential binding (unfused) or tile[dram] (fused)")
    got = [o for o in ops if not o.startswith("#")]
    want = [s.out for s in problem.stages]
    if got != want:
        raise MappingError("root", f"expected the ops {want} in order (got {got})")
    sr, sc = _factor(spatial.spatial, row), _factor(spatial.spatial, col)
    steps = _factor(dram.temporal, row)
    fc, fk = _factor(gemm_tile.temporal, col), _factor(gemm_tile.temporal, red)
    er, ec, ek = problem.extents[row], problem.extents[col], problem.extents.get(red, 1)
    for var, prod, extent in ((row, steps * sr, er), (col, sc * fc, ec), (red, fk, ek)):
        if extent % prod:
            raise MappingError(
                "tile", f"factors of {var} multiply to {prod}, which does not divide {var}={extent}"
            )
    order = tuple(v for v in (*dram.order, *gemm_tile.order) if v in (row, col, red))
    order = tuple(dict.fromkeys(order))
    order = (*order, *(v for v in (row, col, red) if v not in order))
    m = Mapping(
        fusion, sr, sc, er // (steps * sr), ec // (sc * fc), ek // fk, order, binding, model
    )
    check_mapping(problem, hw, m)
    return m


# --- YAML ---------------------------------------------------------------------------------------


def tree_to_dict(node: Node) -> dict[str, Any]:
    """The YAML form of a tree."""
    if isinstance(node, TileNode):
        tile: dict[str, Any] = {"level": node.level}
        if node.temporal:
            tile["temporal"] = dict(node.temporal)
        if node.spatial:
            tile["spatial"] = dict(node.spatial)
        if node.order:
            tile["order"] = list(node.order)
        return {"tile": tile, "child": tree_to_dict(node.child)}
    if isinstance(node, BindingNode):
        return {"bind": node.kind.value, "children": [tree_to_dict(c) for c in node.children]}
    if isinstance(node, OpLeaf):
        return {"op": node.op}
    return {
        "collective": node.kind.value,
        "tensor": node.tensor,
        "over": node.over,
        "reduce": node.reduce,
        "model": node.model,
    }


def _pairs(value: Any, source: str, path: str) -> tuple[tuple[str, int], ...]:
    if not isinstance(value, TMapping) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value.values()
    ):
        raise ConfigError(
            source, path, f"expected a mapping of variable to int >= 1 (got {short(value)})"
        )
    return tuple((str(k), int(v)) for k, v in value.items())


def tree_from_dict(data: Any, source: str = "<mapping>", path: str = "root") -> Node:
    """Parse the YAML form of a tree.

    Raises:
        ConfigError: one line naming ``source``, the node path and the problem.
    """
    if not isinstance(data, TMapping):
        raise ConfigError(source, path, f"expected a node mapping (got {short(data)})")
    keys = {"tile", "bind", "op", "collective"} & set(data)
    if len(keys) != 1:
        raise ConfigError(source, path, "expected exactly one of tile, bind, op, collective")
    key = keys.pop()
    allowed = {"tile": {"tile", "child"}, "bind": {"bind", "children"}, "op": {"op"}}.get(
        key, {"collective", "tensor", "over", "reduce", "model"}
    )
    extra = set(data) - allowed
    if extra:
        raise ConfigError(source, path, f"unexpected keys {short(sorted(map(str, extra)))}")
    if key == "tile":
        tile = data["tile"]
        if not isinstance(tile, TMapping) or set(tile) - {"level", "temporal", "spatial", "order"}:
            raise ConfigError(source, f"{path}.tile", "expected level, temporal, spatial, order")
        level = tile.get("level")
        if level not in ("dram", "global", "output", "input", "weight"):
            raise ConfigError(source, f"{path}.tile.level", f"unknown level {short(level)}")
        temporal = _pairs(tile.get("temporal", {}), source, f"{path}.tile.temporal")
        spatial = _pairs(tile.get("spatial", {}), source, f"{path}.tile.spatial")
        order = tile.get("order", [])
        if not isinstance(order, list) or not all(isinstance(v, str) for v in order):
            raise ConfigError(
                source, f"{path}.tile.order", f"expected a list of variables (got {short(order)})"
            )
        if "child" not in data:
            raise ConfigError(source, path, "a tile node needs a child")
        child = tree_from_dict(data["child"], source, f"{path}.child")
        return TileNode(level, temporal, spatial, tuple(order), child)
    if key == "bind":
        try:
            kind = BindingKind(data["bind"])
        except ValueError:
            have = ", ".join(k.value for k in BindingKind)
            raise ConfigError(
                source, f"{path}.bind", f"expected one of {have} (got {short(data['bind'])})"
            ) from None
        children = data.get("children")
        if not isinstance(children, list) or not children:
            raise ConfigError(source, f"{path}.children", "expected a non-empty list")
        return BindingNode(
            kind,
            tuple(
                tree_from_dict(c, source, f"{path}.children[{i}]") for i, c in enumerate(children)
            ),
        )
    if key == "op":
        return OpLeaf(str(data["op"]))
    try:
        kind_c = CollectiveKind(data["collective"])
    except ValueError:
        have = ", ".join(k.value for k in CollectiveKind)
        raise ConfigError(
            source,
            f"{path}.collective",
            f"expected one of {have} (got {short(data['collective'])})",
        ) from None
    model = data.get("model", "mesh")
    if model not in MODELS:
        raise ConfigError(
            source, f"{path}.model", f"expected one of {', '.join(MODELS)} (got {short(model)})"
        )
    for k in ("tensor", "over"):
        if not isinstance(data.get(k), str):
            raise ConfigError(source, f"{path}.{k}", f"expected a name (got {short(data.get(k))})")
    return CollectiveNode(
        kind_c, data["tensor"], data["over"], str(data.get("reduce", "sum")), model
    )


def load_mapping_file(path: str | Path) -> tuple[dict[str, Any], Node]:
    """Read a mapping YAML file: ``problem``, ``accelerator`` and ``mapping`` (the tree).

    ``problem`` is a problem mapping (see :mod:`fusekit.accel.problem`), ``accelerator`` a preset
    name or file (default ``edge``).

    Returns:
        The raw document and the parsed tree.

    Raises:
        ConfigError: the file, the node path and the problem.
    """
    source = str(path)
    data = load_yaml_mapping(path)
    for key in data:
        if key not in ("problem", "mapping", "accelerator"):
            raise ConfigError(
                source, "", f"unknown field {short(key)} (expected problem, mapping, accelerator)"
            )
    if "mapping" not in data or "problem" not in data:
        raise ConfigError(source, "", "expected keys problem, mapping (and accelerator)")
    if not isinstance(data.get("accelerator", ""), str):
        got = short(data["accelerator"])
        raise ConfigError(source, "accelerator", f"expected a preset name or file (got {got})")
    return data, tree_from_dict(data["mapping"], source, "mapping")


def steps_of(problem: Problem, m: Mapping) -> int:
    """Row-block steps of ``m``."""
    return math.ceil(problem.extents[problem.row] / (m.spatial_row * m.tile_row))
