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
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
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


def instance_keys(doc: Any) -> tuple[str, ...]:
    """The texts :func:`read_problem` reads the instance sizes from, one per dimension.

    The problem depends on the constants only through these keys (a size names a constant or
    gives a number), so a reader may keep one :class:`Chain` per their values.
    """
    p = doc.get("problem") if isinstance(doc, dict) else None
    inst = (p.get("instance") or {}) if isinstance(p, dict) else {}
    if not isinstance(p, dict) or not isinstance(inst, dict):
        return ()
    return tuple(str(inst.get(str(d), "")).strip() for d in p.get("dimensions") or [])


# --- mapping ----------------------------------------------------------------------------------
#
# A mapping is read in two steps: :func:`compile_mapping` walks the document once and checks all
# that does not depend on the constants' values (keys, levels, tensors, factor and primitive
# texts); :meth:`MappingTemplate.build` gives the tree of one set of constants. A search builds
# thousands of trees of one template, differing only in the constants. Each error comes where a
# single walk would raise it: a check that fails in the compile step is raised by ``build`` at
# the point of the walk where it belongs (after the values met before it), and the values are
# resolved in the walk's order when one of them is bad.

_FACTORS = re.compile(r"\s*([A-Z]+)\s*=\s*\[([^\]]+)\]")
_TERMS = re.compile(r"(.)=([^ ]*)")
_BINDINGS = {"seq": "sequential", "para": "parallel", "pipe": "pipeline", "shar": "sharing"}
_RED_OPS = {"max": "max", "add": "add", "sub": "add", "mult": "mult"}

#: Pairs (dim id, value id) of one factors line or tile primitive, in the text's order.
_Terms = list[tuple[int, int]]


@dataclass(slots=True)
class _Texts:
    """The distinct value texts of a mapping, numbered by first use, each with where it is met.

    A value's error names the node where the walk first meets its text: a text that is bad is
    bad wherever it occurs.
    """

    texts: list[str] = field(default_factory=list)
    wheres: list[str] = field(default_factory=list)
    ids: dict[str, int] = field(default_factory=dict)

    def add(self, text: Any, where: str, used: list[int]) -> int:
        """The id of ``text`` (as :func:`_value` keys it); appended to ``used``, the node's."""
        key = str(text).strip()
        i = self.ids.get(key)
        if i is None:
            i = self.ids[key] = len(self.texts)
            self.texts.append(key)
            self.wheres.append(where)
        used.append(i)
        return i


class _LazyValues:
    """The values of a template's texts, each resolved when first read (the walk's order).

    Used when resolving them all at once fails, so that the error raised is the one a single
    walk of the document meets first.
    """

    def __init__(self, texts: _Texts, const: dict[str, Any], file: str) -> None:
        self._texts = texts
        self._const = const
        self._file = file
        self._got: dict[int, int] = {}

    def __getitem__(self, i: int) -> int:
        got = self._got.get(i)
        if got is None:
            got = _value(self._texts.texts[i], self._const, self._file, self._texts.wheres[i])
            self._got[i] = got
        return got


@dataclass(slots=True)
class _Build:
    """What building one tree reads: the constants, their values by text id, the problem."""

    const: dict[str, Any]
    vals: list[int] | _LazyValues
    careful: bool  # values resolve lazily: read each node's in the walk's order
    prob: Chain
    file: str


def _again(error: Exception) -> Exception:
    """A failed check of the compile step, to raise at each build (a fresh copy where it can)."""
    if isinstance(error, CometInputError):
        return CometInputError(error.file, error.node, error.problem)
    return error.with_traceback(None)  # a document malformed past the checks: as a walk fails


@dataclass(frozen=True, slots=True)
class _Site:
    """Where a node sits: its pre-order id and the path an error names."""

    id: int
    where: str


@dataclass(slots=True)
class TemplateNode(ABC):
    """A compiled mapping node: what its tree node holds that no constant changes."""

    id: int
    where: str
    children: list[TemplateNode] = field(default_factory=list)
    used: list[int] = field(default_factory=list)  # value ids read before ``error``
    error: Exception | None = None  # a failed check, raised after the values in ``used``

    @abstractmethod
    def build(self, b: _Build, parent: TreeNode | None) -> TreeNode:
        """A fresh tree node (and subtree) for ``b``'s constants."""

    def subtree(self, b: _Build, node: TreeNode) -> TreeNode:
        """``node`` with its children built (after its own checks)."""
        node.children = [c.build(b, node) for c in self.children]
        return node

    def values(self, b: _Build) -> None:
        """Resolve the node's values in their order (when resolving lazily), then its error."""
        if b.careful:
            for i in self.used:
                b.vals[i]
        if self.error is not None:
            raise _again(self.error)


@dataclass(slots=True)
class _Broken(TemplateNode):
    """A node whose check fails before it reads any constant."""

    def build(self, b: _Build, parent: TreeNode | None) -> TreeNode:
        """Raise the failed check."""
        assert self.error is not None
        raise _again(self.error)


@dataclass(slots=True)
class _Order:
    """The loop order of a tile for one permutation text, and per tensor the dicts it fills."""

    order: list[int]
    error: str  # the factors lines do not fit the order (raised after the values)
    fill: list[list[list[tuple[int, int]]]]  # [tensor][line] (dim id, value id), in order


@dataclass(slots=True)
class TemplateTile(TemplateNode):
    """A ``DataMovement_Tile``; the permutation may name a constant, resolved per build."""

    spatial: bool = False
    tensors: list[int] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)
    childs: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    scale: list[int] = field(default_factory=list)
    rmw: list[bool] = field(default_factory=list)
    perm: str = ""
    lines: list[dict[int, list[int]]] = field(default_factory=list)  # dim -> value id per tensor
    orders: dict[str, _Order] = field(default_factory=dict)

    def order(self, perm: str, prob: Chain, file: str) -> _Order:
        """The loop order for permutation ``perm`` (cached), checked against the factors."""
        got = self.orders.get(perm)
        if got is None:
            order = [prob.dim(c, file, self.where) for c in perm if not c.isspace()]
            error = ""
            for fac in self.lines:
                if len(fac) != len(order) or set(fac) != set(order):
                    error = "factors and permutation name other dims"
                    break
                if any(len(v) != len(self.tensors) for v in fac.values()):
                    error = "expected one factor per tensor"
                    break
            fill = [] if error else [[[(d, fac[d][t]) for d in order] for fac in self.lines]
                                     for t in range(len(self.tensors))]  # fmt: skip
            got = self.orders[perm] = _Order(order, error, fill)
        return got

    def build(self, b: _Build, parent: TreeNode | None) -> TreeNode:
        """The tile node: loop order, then the factors per tensor and line."""
        perm = str(b.const.get(self.perm, self.perm))
        order = self.order(perm, b.prob, b.file)
        self.values(b)
        if order.error:
            raise CometInputError(b.file, self.where, order.error)
        vals = b.vals
        node = TreeNode(
            self.id, "tile", parent=parent, spatial=self.spatial, tensors=list(self.tensors),
            targets=list(self.targets), childs=list(self.childs), tags=list(self.tags),
            scale=list(self.scale), rmw=list(self.rmw), order=list(order.order),
            tilings=[[{d: vals[i] for d, i in line} for line in lines] for lines in order.fill],
        )  # fmt: skip
        return self.subtree(b, node)


@dataclass(slots=True)
class TemplateOp(TemplateNode):
    """An ``Operation`` leaf; reduction dimension names may name constants."""

    op_type: str = ""
    op_name: str = ""
    tensors: list[int] = field(default_factory=list)
    primitive: _Terms = field(default_factory=list)
    steps: list[tuple[int, _Terms]] = field(default_factory=list)  # per tensor, in order
    reductions: list[tuple[str, int]] = field(default_factory=list)  # (dim text, value id)

    def build(self, b: _Build, parent: TreeNode | None) -> TreeNode:
        """The op node: primitive and tile steps, then the reduction attributes."""
        self.values(b)
        vals = b.vals
        node = TreeNode(
            self.id, "op", parent=parent, tensors=list(self.tensors), op_type=self.op_type,
            op_name=self.op_name, primitive={d: vals[i] for d, i in self.primitive},
            tilesizes={t: {d: vals[i] for d, i in terms} for t, terms in self.steps},
        )  # fmt: skip
        for d, i in self.reductions:
            name = str(b.const[d]) if d in b.const and len(d) != 1 else d
            did = b.prob.dim(name, b.file, self.where)
            node.red_dims.append(did)
            node.red_factors[did] = vals[i]
        return self.subtree(b, node)


@dataclass(slots=True)
class _Bind(TemplateNode):
    """An ``inter_tile_binding``."""

    binding: str = ""

    def build(self, b: _Build, parent: TreeNode | None) -> TreeNode:
        """The binding node."""
        return self.subtree(b, TreeNode(self.id, "bind", parent=parent, binding=self.binding))


@dataclass(slots=True)
class _Collective(TemplateNode):
    """A ``CollectiveOperation``: its fields name no constant."""

    fields: dict[str, Any] = field(default_factory=dict)  # TreeNode fields, lists copied

    def build(self, b: _Build, parent: TreeNode | None) -> TreeNode:
        """The collective node."""
        f = self.fields
        node = TreeNode(self.id, "collective", parent=parent, **{**f, "src": list(f["src"]),
                        "dest": list(f["dest"])})  # fmt: skip
        return self.subtree(b, node)


@dataclass(slots=True)
class MappingTemplate:
    """A mapping document compiled for a problem and an arch (:func:`compile_mapping`).

    Its trees use only the problem's dimension, tensor and op names, not its sizes, so one
    template serves every problem read from the same document.
    """

    root: TemplateNode
    texts: _Texts
    prob: Chain
    file: str

    def build(self, const: dict[str, Any]) -> TreeNode:
        """A fresh tree for ``const``, numbered in pre-order, the same as :func:`read_mapping`'s.

        Raises:
            CometInputError: the error a walk of the document with ``const`` meets first.
        """
        try:
            vals: list[int] | _LazyValues = resolve_values(self.texts, const, self.file)
            careful = False
        except CometInputError:
            vals, careful = _LazyValues(self.texts, const, self.file), True
        return self.root.build(_Build(const, vals, careful, self.prob, self.file), None)


def resolve_values(texts: _Texts, const: dict[str, Any], file: str) -> list[int]:
    """Every text's value (a positive int constant directly, else through :func:`_value`)."""
    out = []
    for key, where in zip(texts.texts, texts.wheres, strict=True):
        v = const.get(key)
        out.append(v if type(v) is int and v >= 1 else _value(key, const, file, where))
    return out


def _terms(text: Any, prob: Chain, texts: _Texts, file: str, where: str, used: list[int]) -> _Terms:
    """The ``D=VALUE`` terms of a tile primitive or tile steps text."""
    return [(prob.dim(key, file, where), texts.add(val, where, used))
            for key, val in _TERMS.findall(str(text))]  # fmt: skip


def _factors(
    text: str, prob: Chain, texts: _Texts, file: str, where: str, used: list[int]
) -> dict[int, list[int]]:
    """The ``D=[v, ...]`` terms of a factors line: per dim, a value id per tensor."""
    out: dict[int, list[int]] = {}
    for key, vals in _FACTORS.findall(text):
        d = prob.dim(key, file, where)
        out[d] = [texts.add(v.strip(), where, used) for v in vals.split(",")]
    return out


def _tile(
    raw: dict[str, Any], node: _Site, prob: Chain, arch: Hierarchy, texts: _Texts, file: str
) -> TemplateTile:
    where = node.where

    def lst(key: str, n: int, default: Any) -> list[Any]:
        v = raw.get(key)
        if v is None:
            return [default] * n
        if not isinstance(v, list) or len(v) != n:
            raise CometInputError(file, where, f"expected '{key}' to list one entry per tensor")
        return v

    names = [str(t) for t in raw.get("tensors") or []]
    n = len(names)
    tile = TemplateTile(node.id, where, spatial=str(raw.get("type")) != "temporal")
    tile.tensors = [prob.tid(t, file, where) for t in names]
    tile.targets = [str(t) for t in lst("target", n, None)]
    tile.childs = [str(t) for t in lst("child", n, None)]
    for lv in tile.targets + tile.childs:
        arch.level(lv, file, where)
    tile.tags = [str(t) for t in lst("tag", n, "None")]
    tile.scale = [count(s, file, where, "precision") for s in lst("precision", n, 1)]
    tile.rmw = [bool(s) for s in lst("rmw", n, False)]
    tile.perm = str(raw.get("permutation", ""))
    try:  # checked after the permutation, which may name a constant
        factors = raw.get("factors")
        if not isinstance(factors, list) or not factors:
            raise CometInputError(file, where, "expected a list of 'factors'")
        tile.lines = [_factors(str(f), prob, texts, file, where, tile.used) for f in factors]
    except Exception as e:  # raised by build, in the walk's order
        tile.error = e
    return tile


def _op(raw: dict[str, Any], node: _Site, prob: Chain, texts: _Texts, file: str) -> TemplateOp:
    where = node.where
    op = TemplateOp(node.id, where, op_type=str(raw.get("type", "")).lower())
    if op.op_type not in OP_TYPES:
        raise CometInputError(file, where, f"unknown operation type {op.op_type!r}")
    op.op_name = str(raw.get("name", ""))
    if op.op_name not in prob.ops:
        raise CometInputError(file, where, f"op {op.op_name!r} is not in the problem")
    op.tensors = [prob.tid(str(t), file, where) for t in raw.get("tensors") or []]
    if "TilePrimitive" not in raw or "TileSteps" not in raw:
        raise CometInputError(file, where, "expected 'TilePrimitive' and 'TileSteps'")
    try:  # checked after the values met before
        op.primitive = _terms(raw["TilePrimitive"], prob, texts, file, where, op.used)
        steps = raw["TileSteps"] or {}
        for t in op.tensors:
            name = prob.tensors[t]
            if name not in steps:
                raise CometInputError(file, where, f"no TileSteps for tensor {name}")
            op.steps.append((t, _terms(steps[name], prob, texts, file, where, op.used)))
        attrs = raw.get("compute_attributes")
        if isinstance(attrs, dict):
            dims = [str(d) for d in attrs.get("reduction_dimensions") or []]
            facs = [str(f) for f in attrs.get("reduction_factors") or []]
            if len(dims) != len(facs):
                raise CometInputError(
                    file, where, "reduction dimensions and factors differ in length"
                )
            late: list[int] = []  # read by build, each after its dimension's check
            pairs = zip(dims, facs, strict=True)
            op.reductions = [(d, texts.add(f, where, late)) for d, f in pairs]
    except Exception as e:  # raised by build, in the walk's order
        op.error = e
    return op


def _bind(raw: dict[str, Any], node: _Site, file: str) -> _Bind:
    b = str(raw.get("binding", "")).lower()
    binding = next((v for k, v in _BINDINGS.items() if k in b), "")
    if not binding:
        raise CometInputError(file, node.where, f"unknown binding {b!r}")
    return _Bind(node.id, node.where, binding=binding)


def _collective(
    raw: dict[str, Any], node: _Site, prob: Chain, arch: Hierarchy, file: str
) -> _Collective:
    where = node.where
    col_type = str(raw.get("type", ""))
    if col_type not in COLLECTIVE_TYPES:
        raise CometInputError(file, where, f"unknown collective type {col_type!r}")
    f: dict[str, Any] = {"col_type": col_type}
    f["target"] = arch.level(str(raw.get("target")), file, where).name
    f["child"] = arch.level(str(raw.get("child")), file, where).name
    f["red_op"] = _RED_OPS.get(str(raw.get("reduction_op", "")).lower(), "")
    f["dim"] = prob.dim(str(raw.get("dimension")), file, where)
    f["tag"] = str(raw.get("tag", ""))
    f["spatial_factor"] = count(raw.get("spatial_factor", 0), file, where, "spatial_factor", 0)
    f["precision"] = count(raw.get("precision", 1), file, where, "precision")
    f["src"] = [arch.level(str(s), file, where).name for s in raw.get("src") or []]
    f["dest"] = [arch.level(str(s), file, where).name for s in raw.get("dest") or []]
    f["in_tensor"] = prob.tid(str(raw.get("in_tensor")), file, where)
    f["out_tensor"] = prob.tid(str(raw.get("out_tensor")), file, where)
    if "wb_output" not in raw:
        raise CometInputError(file, where, "expected 'wb_output'")
    f["wb_output"] = bool(raw["wb_output"])
    return _Collective(node.id, where, fields=f)


def compile_mapping(
    doc: dict[str, Any], prob: Chain, arch: Hierarchy, file: str
) -> MappingTemplate:
    """The mapping document checked and parsed once, for :meth:`MappingTemplate.build`.

    Raises:
        CometInputError: the document has no ``mapping`` node (other failed checks are raised
            by ``build``, where a walk of the document meets them).
    """
    m = doc.get("mapping") if isinstance(doc, dict) else None
    if not isinstance(m, dict):
        raise CometInputError(file, "mapping", "expected a 'mapping' node")
    _known(doc, "mapping_file", file, "")
    texts = _Texts()
    counter = [0]
    broken = [False]  # a node failed: the walk stops there

    def node(raw: Any, path: str) -> TemplateNode:
        if not isinstance(raw, dict) or "node_type" not in raw:
            raise CometInputError(file, path, "expected a node with a 'node_type'")
        kind = str(raw["node_type"]).lower()
        base = _Site(counter[0], f"{path} ({kind} node {counter[0]})")
        counter[0] += 1
        if kind in KEYS:
            _known(raw, kind, file, base.where)
        if kind == "datamovement_tile":
            return _tile(raw, base, prob, arch, texts, file)
        if kind == "operation":
            return _op(raw, base, prob, texts, file)
        if kind == "inter_tile_binding":
            return _bind(raw, base, file)
        if kind == "collectiveoperation":
            return _collective(raw, base, prob, arch, file)
        raise CometInputError(file, path, f"unknown node_type {raw['node_type']!r}")

    def visit(raw: Any, path: str) -> TemplateNode:
        try:
            out = node(raw, path)
        except Exception as e:  # raised by build, in the walk's order
            out = _Broken(counter[0], path, error=e)
        broken[0] = broken[0] or out.error is not None
        sub = raw.get("subtree") if isinstance(raw, dict) else None
        if sub is not None:
            for i, s in enumerate(sub if isinstance(sub, list) else [sub]):
                if broken[0]:
                    break
                out.children.append(visit(s, f"{path}.subtree[{i}]"))
        return out

    return MappingTemplate(visit(m, "mapping"), texts, prob, file)


def read_mapping(
    doc: dict[str, Any], prob: Chain, arch: Hierarchy, const: dict[str, Any], file: str
) -> TreeNode:
    """The mapping tree, numbered in pre-order as COMET numbers it."""
    return compile_mapping(doc, prob, arch, file).build(const)


# --- the four files ---------------------------------------------------------------------------


def walk_nodes(doc: Any) -> Iterator[dict[str, Any]]:
    """Every mapping (a node of a COMET document) in ``doc``, parents first, in file order."""
    if isinstance(doc, dict):
        yield doc
        for v in doc.values():
            yield from walk_nodes(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from walk_nodes(v)


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
