"""COMET's four input files (arch, problem, mapping, constants) read into plain data.

The files are read the way the COMET binary reads them (d-matrix-ai/comet, commit 917af0d):

* **arch**: ``ComputeTiles`` and ``MemoryTypes`` give specs by name; ``Hierarchy`` is a tree of
  levels (``connects``, then ``drains``, then ``fills``), each naming a spec by ``type``. The
  attributes of a child entry describe the network from its parent to it (``meshX``/``meshY``,
  ``bw``, ``hop_latency``, ``queuing_delay``, ``channel_width``, ``broadcast_support``); with
  ``link_transfers: true`` they also describe the level's own peer-to-peer network (collectives).
  A level's instance count is ``meshX * meshY``. Names drop their ``[0..n]`` suffix.
* **problem**: global dimensions (ids in their listed order), their sizes (a number or a constant),
  the io tensors, and the ops with their tensors' projections; tensor ids follow first appearance.
* **constants**: the ``const`` map; mapping factors, tile primitives and reduction attributes name
  constants or give numbers.
* **mapping**: a tree of ``DataMovement_Tile`` (temporal or spatial factors per tensor),
  ``Operation``, ``inter_tile_binding`` and ``CollectiveOperation`` nodes, numbered in pre-order
  (the ids COMET prints, e.g. ``ALLREDUCE-12``).

Every problem is raised as :class:`CometInputError`, one line naming the file and the node.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fusekit.accel.tree import (
    Chain,
    Hierarchy,
    Level,
    Network,
    OpSpec,
    TreeInputError,
    TreeMapping,
    TreeNode,
    check_attrs,
    count,
    looks_numeric,
)
from fusekit.errors import ConfigError
from fusekit.files import load_yaml_mapping, short

OP_TYPES = ("gemm", "softmax", "max", "exp", "div", "add", "mult", "sqrt", "rowsum", "rowmax")
COLLECTIVE_TYPES = ("broadcast", "reduction", "allgather", "allreduce", "scatter", "gather")


#: A malformed COMET file: one line naming the file and the node.
CometInputError = TreeInputError


#: The keys COMET's own files use, by part (a mapping node's by its node_type); any other key is
#: refused, so that a misspelt key is not silently ignored. Attribute maps stay open.
KEYS: dict[str, frozenset[str]] = {
    k: frozenset(v.split())
    for k, v in {
        "arch": "ComputeTiles MemoryTypes Hierarchy",
        "spec": "name class attributes",
        "level": "name type attributes is_compute connects drains fills",
        "problem_file": "problem",
        "problem": "dimensions instance io operations",
        "io": "ins outs",
        "op": "name dimensions ins out tensors",
        "tensor": "name projection read-write",
        "mapping_file": "mapping",
        "constants_file": "const",
        "datamovement_tile": "node_type type tensors target child tag precision rmw wb_output "
        "permutation factors subtree",
        "operation": "node_type type name tensors TilePrimitive TileSteps Scale compute_attributes "
        "subtree",
        "inter_tile_binding": "node_type binding subtree",
        "collectiveoperation": "node_type type target child reduction_op dimension tag "
        "spatial_factor precision src dest in_tensor out_tensor wb_output subtree",
    }.items()
}


def _known(raw: dict[str, Any], part: str, file: str, where: str) -> None:
    """Refuse a key of ``raw`` that COMET's files do not use for ``part`` (see :data:`KEYS`)."""
    extra = sorted(str(k) for k in raw if k not in KEYS[part])
    if extra:
        raise CometInputError(file, where, f"unknown key {extra[0][:80]!r}")


# --- arch -------------------------------------------------------------------------------------


def _strip(name: str) -> str:
    return name.split("[", 1)[0]


def _network(attrs: dict[str, Any], file: str, node: str) -> Network:
    if "bw" not in attrs:
        raise CometInputError(file, node, "expected a network 'bw' in attributes")
    check_attrs(attrs, file, node)
    mesh = "meshX" in attrs
    dims = (int(attrs.get("meshX", 1)), int(attrs.get("meshY", 1))) if mesh else (1, 1)
    return Network(
        mesh=mesh,
        dims=dims,
        port_bw=count(attrs["bw"], file, node, "bw"),
        hop_latency=int(attrs.get("hop_latency", 1)),
        broadcast=bool(attrs.get("broadcast_support", False)),
        reduction=bool(attrs.get("reduction_support", False)),
        queuing_delay=int(attrs.get("queuing_delay", 0)),
        channel_width=int(attrs.get("channel_width", 32)),
    )


def read_arch(doc: dict[str, Any], file: str) -> Hierarchy:
    """Levels, specs and networks of an arch file (see the module docstring)."""
    _known(doc, "arch", file, "")
    specs: dict[str, tuple[bool, dict[str, Any]]] = {}
    for key, compute in (("ComputeTiles", True), ("MemoryTypes", False)):
        for i, entry in enumerate(doc.get(key) or []):
            if not isinstance(entry, dict) or "name" not in entry:
                raise CometInputError(file, f"{key}[{i}]", "expected a mapping with a 'name'")
            _known(entry, "spec", file, f"{key}[{i}]")
            spec = dict(entry.get("attributes") or {})
            check_attrs(spec, file, f"{key}[{i}] ({entry['name']})")
            if "class" in entry:  # mac, simd, SRAM, DRAM: what the native model dispatches on
                spec["class"] = str(entry["class"])
            specs[str(entry["name"])] = (compute, spec)
    levels: dict[str, Level] = {}
    counter = [0]

    def visit(entry: Any, parent: Level | None, where: str) -> Level:
        counter[0] += 1
        if not isinstance(entry, dict) or "name" not in entry or "type" not in entry:
            raise CometInputError(file, where, "expected a level with 'name' and 'type'")
        _known(entry, "level", file, where)
        name = _strip(str(entry["name"]))
        attrs = dict(entry.get("attributes") or {})
        check_attrs(attrs, file, f"{where} ({name})")
        if parent is not None and "attributes" not in entry:
            raise CometInputError(file, f"{where} ({name})", "expected 'attributes'")
        if name in levels and (entry.get("is_compute") or (parent is not None)):
            return levels[name]
        kind = str(entry["type"])
        if kind not in specs:
            raise CometInputError(file, f"{where} ({name})", f"unknown type {kind!r}")
        compute, spec = specs[kind]
        lvl = Level(name, counter[0], kind, bool(entry.get("is_compute", False)) or False, spec)
        if lvl.is_compute and not compute:
            lvl.is_compute = True
        if attrs:
            lvl.instances = int(attrs.get("meshX", 1)) * int(attrs.get("meshY", 1))
            if attrs.get("link_transfers"):
                lvl.link_net = _network(attrs, file, f"{where} ({name})")
        levels[name] = lvl
        for group in ("connects", "drains", "fills"):
            for j, sub in enumerate(entry.get(group) or []):
                child = visit(sub, lvl, f"{where}.{group}[{j}]")
                lvl.child_nets[child.name] = _network(
                    dict(sub.get("attributes") or {}), file, f"{where}.{group}[{j}]"
                )
        return lvl

    roots = doc.get("Hierarchy")
    if not isinstance(roots, list) or not roots:
        raise CometInputError(file, "Hierarchy", "expected a list of levels")
    for i, root in enumerate(roots):
        visit(root, None, f"Hierarchy[{i}]")
    return Hierarchy(levels)


# --- problem ----------------------------------------------------------------------------------


def _names(text: Any) -> tuple[str, ...]:
    return tuple(re.findall(r"[A-Za-z0-9]+", str(text).split("#")[0]))


def _value(v: Any, const: dict[str, Any], file: str, node: str) -> int:
    key = str(v).strip()
    if key in const:
        return count(const[key], file, node, f"constant {key}")
    if not looks_numeric(key):
        raise CometInputError(file, node, f"missing constant {short(key)}")
    return count(key, file, node, "a factor or size")


def read_problem(doc: dict[str, Any], const: dict[str, Any], file: str) -> Chain:
    """Dimensions, tensors and ops of a problem file (see the module docstring)."""
    p = doc.get("problem") if isinstance(doc, dict) else None
    if not isinstance(p, dict):
        raise CometInputError(file, "problem", "expected a 'problem' mapping")
    _known(doc, "problem_file", file, "")
    _known(p, "problem", file, "problem")
    io = p.get("io")
    if not isinstance(io, dict) or "ins" not in io or "outs" not in io:
        raise CometInputError(file, "problem.io", "expected 'ins' and 'outs'")
    _known(io, "io", file, "problem.io")
    dims = tuple(str(d) for d in p.get("dimensions") or [])
    if not dims:
        raise CometInputError(file, "problem.dimensions", "expected a list of dimensions")
    inst = p.get("instance") or {}
    sizes = {i: _value(inst.get(d, ""), const, file, f"problem.instance.{d}") for i, d in
             enumerate(dims)}  # fmt: skip
    tensors: list[str] = []
    ops: dict[str, OpSpec] = {}
    for i, op in enumerate(p.get("operations") or []):
        where = f"problem.operations[{i}]"
        if not isinstance(op, dict) or "name" not in op:
            raise CometInputError(file, where, "expected an op with a 'name'")
        _known(op, "op", file, where)
        name = str(op["name"])
        proj: dict[int, tuple[int, ...]] = {}
        rw = set()
        for j, t in enumerate(op.get("tensors") or []):
            if not isinstance(t, dict):
                raise CometInputError(file, f"{where}.tensors[{j}]", "expected a tensor mapping")
            _known(t, "tensor", file, f"{where}.tensors[{j}]")
            tname = str(t.get("name"))
            if tname not in tensors:
                tensors.append(tname)
            tid = tensors.index(tname)
            ranks = []
            for term in t.get("projection") or []:
                if not isinstance(term, list) or len(term) != 1 or len(term[0]) != 1:
                    raise CometInputError(
                        file, f"{where}.tensors[{j}] ({tname})", "expected [[DIM]] per rank"
                    )
                d = str(term[0][0])
                if d not in dims:
                    raise CometInputError(file, f"{where} ({name})", f"unknown dimension {d!r}")
                ranks.append(dims.index(d))
            proj[tid] = tuple(ranks)
            if t.get("read-write"):
                rw.add(tid)
        out = _names(op.get("out", ""))
        named = {tensors[t] for t in proj}
        if len(out) != 1 or not set(_names(op.get("ins", ""))) | set(out) <= named:
            raise CometInputError(
                file, f"{where} ({name})", "expected 'ins' and one 'out' among its tensors"
            )
        op_dims = tuple(dims.index(str(d)) for d in op.get("dimensions") or [] if str(d) in dims)
        ops[name] = OpSpec(name, _names(op.get("ins", "")), _names(op.get("out", ""))[0],
                           proj, frozenset(rw), op_dims)  # fmt: skip
    if not ops:
        raise CometInputError(file, "problem.operations", "expected at least one op")
    return Chain(dims, sizes, tuple(tensors), _names(io["ins"]), _names(io["outs"]),
                   dict(sorted(ops.items())))  # fmt: skip


# --- mapping ----------------------------------------------------------------------------------


def _tiling(
    text: str, prob: Chain, const: dict[str, Any], file: str, where: str
) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for key, vals in re.findall(r"\s*([A-Z]+)\s*=\s*\[([^\]]+)\]", text):
        d = prob.dim(key, file, where)
        out[d] = [_value(v.strip(), const, file, where) for v in vals.split(",")]
    return out


def _primitive(
    text: str, prob: Chain, const: dict[str, Any], file: str, where: str
) -> dict[int, int]:
    out: dict[int, int] = {}
    for key, val in re.findall(r"(.)=([^ ]*)", str(text)):
        out[prob.dim(key, file, where)] = _value(val, const, file, where)
    return out


def _attrs(
    node: TreeNode, raw: dict[str, Any], prob: Chain, const: dict[str, Any], file: str, where: str
) -> None:
    attrs = raw.get("compute_attributes")
    if not isinstance(attrs, dict):
        return
    dims = [str(d) for d in attrs.get("reduction_dimensions") or []]
    facs = [str(f) for f in attrs.get("reduction_factors") or []]
    if len(dims) != len(facs):
        raise CometInputError(file, where, "reduction dimensions and factors differ in length")
    for d, f in zip(dims, facs, strict=True):
        name = str(const[d]) if d in const and len(d) != 1 else d
        did = prob.dim(name, file, where)
        node.red_dims.append(did)
        node.red_factors[did] = _value(f, const, file, where)


def read_mapping(
    doc: dict[str, Any], prob: Chain, arch: Hierarchy, const: dict[str, Any], file: str
) -> TreeNode:
    """The mapping tree, numbered in pre-order as COMET numbers it."""
    counter = [0]

    def lst(raw: dict[str, Any], key: str, n: int, default: Any, where: str) -> list[Any]:
        v = raw.get(key)
        if v is None:
            return [default] * n
        if not isinstance(v, list) or len(v) != n:
            raise CometInputError(file, where, f"expected '{key}' to list one entry per tensor")
        return v

    def visit(raw: Any, parent: TreeNode | None, path: str) -> TreeNode:
        if not isinstance(raw, dict) or "node_type" not in raw:
            raise CometInputError(file, path, "expected a node with a 'node_type'")
        kind = str(raw["node_type"]).lower()
        node = TreeNode(counter[0], "")
        counter[0] += 1
        node.parent = parent
        where = f"{path} ({kind} node {node.id})"
        if kind in KEYS:
            _known(raw, kind, file, where)
        if kind == "datamovement_tile":
            node.kind = "tile"
            node.spatial = str(raw.get("type")) != "temporal"
            names = [str(t) for t in raw.get("tensors") or []]
            n = len(names)
            node.tensors = [prob.tid(t, file, where) for t in names]
            node.targets = [str(t) for t in lst(raw, "target", n, None, where)]
            node.childs = [str(t) for t in lst(raw, "child", n, None, where)]
            for lv in node.targets + node.childs:
                arch.level(lv, file, where)
            node.tags = [str(t) for t in lst(raw, "tag", n, "None", where)]
            node.scale = [
                count(s, file, where, "precision") for s in lst(raw, "precision", n, 1, where)
            ]
            node.rmw = [bool(s) for s in lst(raw, "rmw", n, False, where)]
            perm = str(raw.get("permutation", ""))
            perm = str(const.get(perm, perm))
            node.order = [prob.dim(c, file, where) for c in perm if not c.isspace()]
            factors = raw.get("factors")
            if not isinstance(factors, list) or not factors:
                raise CometInputError(file, where, "expected a list of 'factors'")
            parsed = [_tiling(str(f), prob, const, file, where) for f in factors]
            for fac in parsed:
                if len(fac) != len(node.order) or set(fac) != set(node.order):
                    raise CometInputError(file, where, "factors and permutation name other dims")
                if any(len(v) != n for v in fac.values()):
                    raise CometInputError(file, where, "expected one factor per tensor")
            node.tilings = [[{d: fac[d][t] for d in node.order} for fac in parsed]
                            for t in range(n)]  # fmt: skip
        elif kind == "operation":
            node.kind = "op"
            node.op_type = str(raw.get("type", "")).lower()
            if node.op_type not in OP_TYPES:
                raise CometInputError(file, where, f"unknown operation type {node.op_type!r}")
            node.op_name = str(raw.get("name", ""))
            if node.op_name not in prob.ops:
                raise CometInputError(file, where, f"op {node.op_name!r} is not in the problem")
            node.tensors = [prob.tid(str(t), file, where) for t in raw.get("tensors") or []]
            if "TilePrimitive" not in raw or "TileSteps" not in raw:
                raise CometInputError(file, where, "expected 'TilePrimitive' and 'TileSteps'")
            node.primitive = _primitive(raw["TilePrimitive"], prob, const, file, where)
            steps = raw["TileSteps"] or {}
            for t in node.tensors:
                name = prob.tensors[t]
                if name not in steps:
                    raise CometInputError(file, where, f"no TileSteps for tensor {name}")
                node.tilesizes[t] = _primitive(steps[name], prob, const, file, where)
            _attrs(node, raw, prob, const, file, where)
        elif kind == "inter_tile_binding":
            node.kind = "bind"
            b = str(raw.get("binding", "")).lower()
            kinds = {"seq": "sequential", "para": "parallel", "pipe": "pipeline", "shar": "sharing"}
            node.binding = next((v for k, v in kinds.items() if k in b), "")
            if not node.binding:
                raise CometInputError(file, where, f"unknown binding {b!r}")
        elif kind == "collectiveoperation":
            node.kind = "collective"
            node.col_type = str(raw.get("type", ""))
            if node.col_type not in COLLECTIVE_TYPES:
                raise CometInputError(file, where, f"unknown collective type {node.col_type!r}")
            node.target = arch.level(str(raw.get("target")), file, where).name
            node.child = arch.level(str(raw.get("child")), file, where).name
            node.red_op = {"max": "max", "add": "add", "sub": "add", "mult": "mult"}.get(
                str(raw.get("reduction_op", "")).lower(), ""
            )
            node.dim = prob.dim(str(raw.get("dimension")), file, where)
            node.tag = str(raw.get("tag", ""))
            node.spatial_factor = count(
                raw.get("spatial_factor", 0), file, where, "spatial_factor", 0
            )
            node.precision = count(raw.get("precision", 1), file, where, "precision")
            node.src = [arch.level(str(s), file, where).name for s in raw.get("src") or []]
            node.dest = [arch.level(str(s), file, where).name for s in raw.get("dest") or []]
            node.in_tensor = prob.tid(str(raw.get("in_tensor")), file, where)
            node.out_tensor = prob.tid(str(raw.get("out_tensor")), file, where)
            if "wb_output" not in raw:
                raise CometInputError(file, where, "expected 'wb_output'")
            node.wb_output = bool(raw["wb_output"])
        else:
            raise CometInputError(file, path, f"unknown node_type {raw['node_type']!r}")
        sub = raw.get("subtree")
        if sub is not None:
            for i, s in enumerate(sub if isinstance(sub, list) else [sub]):
                node.children.append(visit(s, node, f"{path}.subtree[{i}]"))
        return node

    m = doc.get("mapping") if isinstance(doc, dict) else None
    if not isinstance(m, dict):
        raise CometInputError(file, "mapping", "expected a 'mapping' node")
    _known(doc, "mapping_file", file, "")
    return visit(m, None, "mapping")


# --- the four files ---------------------------------------------------------------------------


def load_document(path: Path) -> dict[str, Any]:
    """The file's top-level mapping, read by :func:`fusekit.files.load_yaml_mapping`."""
    try:
        return load_yaml_mapping(path)
    except ConfigError as e:
        raise CometInputError(str(path), e.path, e.problem) from None


def read_case(case_dir: str | Path, arch_doc: dict[str, Any] | None = None) -> TreeMapping:
    """Read ``arch.yaml``, ``problem.yaml``, ``mapping.yaml`` and ``constants.yaml`` of a run.

    Args:
        case_dir: the run's folder.
        arch_doc: an arch description to use instead of the folder's ``arch.yaml`` (a preset's
            ``comet_arch``).
    """
    d = Path(case_dir)
    names = ("problem", "mapping", "constants") if arch_doc is not None else (
        "arch", "problem", "mapping", "constants")  # fmt: skip
    files = {k: d / f"{k}.yaml" for k in names}
    docs = {k: load_document(p) for k, p in files.items()}
    const = docs["constants"].get("const")
    if not isinstance(const, dict):
        raise CometInputError(str(files["constants"]), "const", "expected a 'const' mapping")
    _known(docs["constants"], "constants_file", str(files["constants"]), "")
    if arch_doc is None:
        arch = read_arch(docs["arch"], str(files["arch"]))
    else:
        arch = read_arch(arch_doc, "comet_arch")
    prob = read_problem(docs["problem"], const, str(files["problem"]))
    root = read_mapping(docs["mapping"], prob, arch, const, str(files["mapping"]))
    return TreeMapping(arch, prob, root, const, str(files["mapping"]))
