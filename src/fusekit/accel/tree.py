"""A mapping tree general enough for COMET's mappings, on a hierarchy of spatial levels.

The shared description that :mod:`fusekit.accel.tree_model` evaluates (the COMET front end,
:mod:`fusekit.accel.comet`, reads COMET's files into it):

* :class:`Hierarchy`: levels (memory or compute) by name, each with its spec attributes, its
  instance count (``meshX * meshY``: cores under each global buffer, global buffers under DRAM:
  a two-level spatial hierarchy), the network to each child and, for collectives, to its peers;
* :class:`Chain`: the ops (a chain need not start with a GEMM), their tensors and projections;
* :class:`TreeNode`: tile nodes (per tensor: target and child level, op tag, precision in bits,
  temporal or spatial factors per dim, loop order), op leaves (tile primitive, per-tensor tile
  steps, reduction attributes), bindings, and collectives placed where the mapping puts them;
* :class:`TreeMapping`: the three together.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fusekit.errors import FusekitError
from fusekit.files import short


class TreeInputError(FusekitError, ValueError):
    """A mapping-tree description is malformed; one line naming the file (source) and the node."""

    def __init__(self, file: str, node: str, problem: str) -> None:
        self.file = file
        self.node = node
        self.problem = problem
        super().__init__(f"{file}: {node}: {problem}" if node else f"{file}: {problem}")


def count(value: Any, file: str, where: str, name: str, low: int = 1) -> int:
    """``value`` as an integer ``>= low`` (COMET writes some as text); else one error line.

    Raises:
        TreeInputError: naming the file, where and ``name``, when ``value`` is not an integer
            (a bool, a float such as 1.5, a word) or is below ``low``.
    """
    number = None
    if isinstance(value, int | str) and not isinstance(value, bool):
        try:
            number = int(value)
        except ValueError:
            pass
    if number is None or number < low:
        problem = f"expected '{name}' to be an integer >= {low} (got {short(value)})"
        raise TreeInputError(file, where, problem)
    return number


#: Attributes that COMET's files give as numbers: a word there is refused, not skipped.
_NUMERIC_ATTRS = frozenset(
    "array_cols array_rows capacity computeLatency computeOpC computeWidth compute_energy "
    "computewidth datawidth num_sa_cols num_sa_rows startupLatency bw child_read_bw "
    "child_read_energy child_write_bw child_write_energy depth link_read_bw link_write_bw "
    "parent_read_bw parent_read_energy parent_write_bw parent_write_energy ports width "
    "channel_width hop_latency meshX meshY queuing_delay".split()
)


def looks_numeric(text: str) -> bool:
    """Whether ``text`` starts like a number (``12``, ``-3``): COMET writes some as text."""
    return text.strip().lstrip("+-")[:1].isdigit()


def check_attrs(attrs: Mapping[Any, Any], file: str, where: str, path: str = "") -> None:
    """Check the numbers of an attribute map (nested maps too), by what the key names.

    Energies (a key with ``energy`` or ``_pj``) are finite numbers ``>= 0``; latencies, delays
    and cycles integers ``>= 0``; every other number (widths, depths, bandwidths, ports, mesh
    sizes, counts) an integer ``>= 1``, as in every file COMET ships. Words and flags pass.

    Raises:
        TreeInputError: one line naming the file, where and the attribute.
    """
    for k, v in attrs.items():
        name = f"{path}.{k}" if path else str(k)
        low = name.lower()
        if isinstance(v, Mapping):
            check_attrs(v, file, where, name)
        elif v is None or isinstance(v, bool):
            continue  # a flag
        elif isinstance(v, str) and not looks_numeric(v) and k not in _NUMERIC_ATTRS:
            continue  # a word (class, connection_type)
        elif "energy" in low or "_pj" in low:
            if not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                problem = f"expected '{name}' to be a finite number >= 0 (got {short(v)})"
                raise TreeInputError(file, where, problem)
        else:
            timing = any(w in low for w in ("latency", "delay", "cycles"))
            count(v, file, where, name, 0 if timing else 1)


@dataclass(frozen=True, slots=True)
class Network:
    """A parent-to-child (or peer) network: COMET's ``NetworkSpec`` attributes."""

    mesh: bool
    dims: tuple[int, int]
    port_bw: int
    hop_latency: int
    broadcast: bool
    reduction: bool
    queuing_delay: int
    channel_width: int


@dataclass(slots=True)
class Level:
    """One architecture level (memory or compute) with its spec and networks."""

    name: str
    rank: int  # creation order: COMET orders its per-level maps by this
    kind: str  # spec (type) name, e.g. "GBuffer", "SystolicArray"
    is_compute: bool
    attrs: dict[str, Any]
    instances: int = 1
    child_nets: dict[str, Network] = field(default_factory=dict)
    link_net: Network | None = None

    def num(self, key: str, default: float = 0) -> Any:
        """A numeric spec attribute (``default`` when absent)."""
        return self.attrs.get(key, default)

    def width_bytes(self) -> int:
        """Bytes per access block."""
        return int(self.attrs.get("width", 1))

    def capacity_bytes(self) -> int:
        """Bytes of one instance: ``width * depth`` (compute levels: ``capacity``)."""
        if self.is_compute:
            return int(self.attrs.get("capacity", 0))
        return int(self.attrs.get("width", 1)) * int(self.attrs.get("depth", 1))

    def bw(self, which: str) -> int:
        """A bandwidth attribute (``parent_read_bw``, ...); a generic ``bw`` overrides them."""
        if "bw" in self.attrs:
            return int(self.attrs["bw"])
        return int(self.attrs.get(which, 0))


@dataclass(slots=True)
class Hierarchy:
    """The levels by name."""

    levels: dict[str, Level]

    def level(self, name: str, file: str, node: str) -> Level:
        """The level called ``name``; a clear error when there is none."""
        if name not in self.levels:
            raise TreeInputError(
                file, node, f"unknown level {name!r} (levels: {', '.join(sorted(self.levels))})"
            )
        return self.levels[name]


@dataclass(frozen=True, slots=True)
class OpSpec:
    """One op of the problem: its io and each tensor's projection (one dim per rank)."""

    name: str
    ins: tuple[str, ...]
    out: str
    projections: dict[int, tuple[int, ...]]  # tensor id -> dim id per rank
    rw: frozenset[int]
    dims: tuple[int, ...] = ()  # the op's iteration space (dim ids); empty: every dim


@dataclass(frozen=True, slots=True)
class Chain:
    """Dimensions, sizes, tensors and ops of a COMET problem."""

    dims: tuple[str, ...]
    sizes: dict[int, int]
    tensors: tuple[str, ...]  # by id
    ins: tuple[str, ...]
    outs: tuple[str, ...]
    ops: dict[str, OpSpec]  # sorted by name, as COMET iterates them

    def tid(self, name: str, file: str, node: str) -> int:
        """The id of tensor ``name``."""
        if name not in self.tensors:
            raise TreeInputError(file, node, f"unknown tensor {name!r}")
        return self.tensors.index(name)

    def dim(self, name: str, file: str, node: str) -> int:
        """The id of dimension ``name``."""
        if name not in self.dims:
            raise TreeInputError(file, node, f"unknown dimension {name!r}")
        return self.dims.index(name)

    @property
    def intermediates(self) -> frozenset[int]:
        """Tensors that are neither problem inputs nor outputs."""
        io = set(self.ins) | set(self.outs)
        return frozenset(i for i, t in enumerate(self.tensors) if t not in io)

    def projection(self, tag: str, tid: int) -> tuple[int, ...]:
        """The projection of ``tid`` as COMET picks it: the tag's op, else the first op using it."""
        op = self.ops.get(tag)
        if op is None or tid not in op.projections:
            name = self.tensors[tid]
            op = next(
                (o for o in self.ops.values() if name in o.ins or name == o.out),
                list(self.ops.values())[-1],
            )
        if tid not in op.projections:
            raise KeyError(tid)
        return op.projections[tid]


@dataclass(slots=True)
class TreeNode:
    """One node of a COMET mapping tree (``kind``: tile, op, bind or collective)."""

    id: int
    kind: str
    children: list[TreeNode] = field(default_factory=list)
    parent: TreeNode | None = None
    # tile
    spatial: bool = False
    tensors: list[int] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)
    childs: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    scale: list[int] = field(default_factory=list)
    rmw: list[bool] = field(default_factory=list)
    order: list[int] = field(default_factory=list)  # dim ids, innermost first
    tilings: list[list[dict[int, int]]] = field(default_factory=list)  # [tensor][spatial idx]
    # op
    op_type: str = ""
    op_name: str = ""
    primitive: dict[int, int] = field(default_factory=dict)
    tilesizes: dict[int, dict[int, int]] = field(default_factory=dict)
    red_dims: list[int] = field(default_factory=list)
    red_factors: dict[int, int] = field(default_factory=dict)
    # binding
    binding: str = ""
    # collective
    col_type: str = ""
    red_op: str = ""
    dim: int = 0
    tag: str = ""
    spatial_factor: int = 0
    precision: int = 1
    src: list[str] = field(default_factory=list)
    dest: list[str] = field(default_factory=list)
    in_tensor: int = 0
    out_tensor: int = 0
    wb_output: bool = False
    target: str = ""
    child: str = ""

    @property
    def label(self) -> str:
        """COMET's printed name of the node."""
        names = {"tile": "DataMovementTileNode", "op": "OperationNode",
                 "bind": "InterTileBinding", "collective": "CollectiveOpNode"}  # fmt: skip
        return f"{names[self.kind]}::{self.id}"

    @property
    def is_leaf_tile(self) -> bool:
        """A tile node whose first child is an op."""
        return self.kind == "tile" and bool(self.children) and self.children[0].kind == "op"

    def position(self) -> int:
        """The index of this node among its parent's children (0 for the root)."""
        if self.parent is None:
            return 0
        for i, c in enumerate(self.parent.children):
            if c is self:
                return i
        raise ValueError(f"{self.label} is not among its parent's children")


def pre_order(node: TreeNode) -> list[TreeNode]:
    """``node`` and its descendants, parents before children, children left to right."""
    out = []
    stack = [node]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(reversed(n.children))
    return out


def release(root: TreeNode) -> None:
    """Drop the parent links of a tree no one reads any more.

    Without the child-to-parent cycles, reference counting frees the tree at once; a search
    builds a tree per tiling, and leaving thousands to the cycle collector costs it more than
    a third of its time.
    """
    for n in pre_order(root):
        n.parent = None


@dataclass(frozen=True, slots=True)
class TreeMapping:
    """A hierarchy, an op chain and a mapping tree over them."""

    arch: Hierarchy
    problem: Chain
    mapping: TreeNode
    const: dict[str, Any]
    mapping_file: str


# --- fusekit's own form (YAML-ready), names instead of ids --------------------------------------


def _net_dict(n: Network) -> dict[str, Any]:
    return {"mesh": n.mesh, "dims": list(n.dims), "port_bw": n.port_bw,
            "hop_latency": n.hop_latency, "broadcast": n.broadcast, "reduction": n.reduction,
            "queuing_delay": n.queuing_delay, "channel_width": n.channel_width}  # fmt: skip


def _net(d: dict[str, Any]) -> Network:
    return Network(**{**d, "dims": tuple(d["dims"])})


def tree_to_dict(tm: TreeMapping) -> dict[str, Any]:
    """``tm`` as plain data with tensor and dim names (:func:`tree_from_dict` reads it back)."""
    p = tm.problem
    dn, tn = p.dims, p.tensors

    def dims(m: dict[int, int]) -> dict[str, int]:
        return {dn[d]: v for d, v in m.items()}

    def node(n: TreeNode) -> dict[str, Any]:
        out: dict[str, Any] = {"id": n.id}
        if n.kind == "tile":
            out["tile"] = "spatial" if n.spatial else "temporal"
            out["order"] = [dn[d] for d in n.order]
            out["tensors"] = [
                {"tensor": tn[t], "tag": n.tags[i], "from": n.targets[i], "to": n.childs[i],
                 "bits": n.scale[i], "rmw": n.rmw[i], "factors": [dims(f) for f in n.tilings[i]]}
                for i, t in enumerate(n.tensors)
            ]  # fmt: skip
        elif n.kind == "op":
            out.update(op=n.op_name, type=n.op_type, tensors=[tn[t] for t in n.tensors],
                       primitive=dims(n.primitive),
                       tile_steps={tn[t]: dims(s) for t, s in n.tilesizes.items()},
                       reduce=[[dn[d], n.red_factors[d]] for d in n.red_dims])  # fmt: skip
        elif n.kind == "bind":
            out["bind"] = n.binding
        else:
            out.update(collective=n.col_type, tensor=tn[n.in_tensor], out=tn[n.out_tensor],
                       over=dn[n.dim], reduce=n.red_op, level=n.target, child=n.child,
                       src=n.src, dest=n.dest, bits=n.precision, tag=n.tag,
                       spatial_factor=n.spatial_factor, write_back=n.wb_output)  # fmt: skip
        if n.children:
            out["children"] = [node(c) for c in n.children]
        return out

    return {
        "hierarchy": {
            lv.name: {"rank": lv.rank, "kind": lv.kind, "compute": lv.is_compute,
                      "instances": lv.instances, "attrs": dict(lv.attrs),
                      "nets": {c: _net_dict(n) for c, n in lv.child_nets.items()},
                      "link": _net_dict(lv.link_net) if lv.link_net else None}
            for lv in tm.arch.levels.values()
        },
        "chain": {
            "dims": {dn[d]: s for d, s in p.sizes.items()}, "tensors": list(tn),
            "ins": list(p.ins), "outs": list(p.outs),
            "ops": {o.name: {"ins": list(o.ins), "out": o.out, "dims": [dn[d] for d in o.dims],
                             "read_write": [tn[t] for t in sorted(o.rw)],
                             "projections": {tn[t]: [dn[d] for d in r]
                                             for t, r in o.projections.items()}}
                    for o in p.ops.values()},
        },
        "tree": node(tm.mapping),
    }  # fmt: skip


#: The keys :func:`tree_to_dict` writes, by part (a node's by kind); others are refused.
_TREE_KEYS = {
    "top": {"hierarchy", "chain", "tree"},
    "level": {"rank", "kind", "compute", "instances", "attrs", "nets", "link"},
    "net": {"mesh", "dims", "port_bw", "hop_latency", "broadcast", "reduction", "queuing_delay",
            "channel_width"},
    "chain": {"dims", "tensors", "ins", "outs", "ops"},
    "op_spec": {"ins", "out", "dims", "read_write", "projections"},
    "tile": {"id", "children", "tile", "order", "tensors"},
    "tile_tensor": {"tensor", "tag", "from", "to", "bits", "rmw", "factors"},
    "op": {"id", "children", "op", "type", "tensors", "primitive", "tile_steps", "reduce"},
    "bind": {"id", "children", "bind"},
    "collective": {"id", "children", "collective", "tensor", "out", "over", "reduce", "level",
                   "child", "src", "dest", "bits", "tag", "spatial_factor", "write_back"},
}  # fmt: skip


def _known(d: Any, part: str, source: str, where: str) -> None:
    """Refuse a key of ``d`` that :func:`tree_to_dict` does not write for ``part``."""
    if not isinstance(d, dict):
        raise TreeInputError(source, where, f"expected a mapping (got {type(d).__name__})")
    extra = sorted(str(k) for k in d if k not in _TREE_KEYS[part])
    if extra:
        raise TreeInputError(source, where, f"unknown key {extra[0][:80]!r}")


def _check_net(net: Any, source: str, where: str) -> None:
    _known(net, "net", source, where)
    for key, low in (
        ("port_bw", 1),
        ("hop_latency", 0),
        ("queuing_delay", 0),
        ("channel_width", 1),
    ):
        count(net.get(key, low), source, where, key, low)
    for size in net.get("dims") or []:
        count(size, source, where, "dims", 1)


def _counts(m: Any, source: str, where: str, low: int = 1) -> None:
    """Every value of the mapping ``m`` (dim -> factor or size) an integer ``>= low``."""
    for key, value in (m or {}).items() if isinstance(m, dict) else ():
        count(value, source, where, str(key), low)


def _check_form(doc: Any, source: str) -> None:
    """Refuse keys that :func:`tree_to_dict` does not write and numbers out of range."""
    _known(doc, "top", source, "")
    for name, v in (doc.get("hierarchy") or {}).items():
        where = f"hierarchy.{name}"
        _known(v, "level", source, where)
        check_attrs(v.get("attrs") or {}, source, f"{where}.attrs")
        count(v.get("rank", 0), source, where, "rank", 0)
        count(v.get("instances", 1), source, where, "instances", 1)
        for child, net in (v.get("nets") or {}).items():
            _check_net(net, source, f"{where}.nets.{child}")
        if v.get("link"):
            _check_net(v["link"], source, f"{where}.link")
    chain = doc.get("chain") or {}
    _known(chain, "chain", source, "chain")
    _counts(chain.get("dims"), source, "chain.dims")
    for name, o in (chain.get("ops") or {}).items():
        _known(o, "op_spec", source, f"chain.ops.{name}")
    stack = [(doc.get("tree") or {}, "tree")]
    while stack:
        d, where = stack.pop()
        is_map = isinstance(d, dict)
        kind = next((k for k in ("tile", "op", "bind") if is_map and k in d), "collective")
        _known(d, kind, source, where)
        count(d.get("id", 0), source, where, "id", 0)
        for i, e in enumerate(d.get("tensors") or [] if kind == "tile" else []):
            _known(e, "tile_tensor", source, f"{where}.tensors[{i}]")
            count(e.get("bits", 1), source, f"{where}.tensors[{i}]", "bits")
            for f in e.get("factors") or []:
                _counts(f, source, f"{where}.tensors[{i}].factors")
        if kind == "op":
            _counts(d.get("primitive"), source, f"{where}.primitive")
            for t, steps in (d.get("tile_steps") or {}).items():
                _counts(steps, source, f"{where}.tile_steps.{t}")
            for pair in d.get("reduce") or []:
                count(
                    pair[1] if isinstance(pair, list) and len(pair) == 2 else 0,
                    source,
                    where,
                    "reduce",
                )
        if kind == "collective":
            count(d.get("bits", 1), source, where, "bits")
            count(d.get("spatial_factor", 0), source, where, "spatial_factor", 0)
        stack.extend((c, f"{where}.children[{i}]") for i, c in enumerate(d.get("children") or []))


def tree_from_dict(doc: dict[str, Any], source: str = "tree") -> TreeMapping:
    """Read :func:`tree_to_dict`'s form back; a malformed document names the key.

    Raises:
        TreeInputError: one line naming ``source``, where, and the problem (an unknown key too).
    """
    try:
        _check_form(doc, source)
        levels = {
            name: Level(name, int(v["rank"]), str(v["kind"]), bool(v["compute"]),
                        dict(v["attrs"]), int(v["instances"]),
                        {c: _net(n) for c, n in (v.get("nets") or {}).items()},
                        _net(v["link"]) if v.get("link") else None)
            for name, v in doc["hierarchy"].items()
        }  # fmt: skip
        c = doc["chain"]
        dn = tuple(c["dims"])
        tn = tuple(c["tensors"])
        ops = {
            name: OpSpec(name, tuple(o["ins"]), o["out"],
                         {tn.index(t): tuple(dn.index(d) for d in r)
                          for t, r in o["projections"].items()},
                         frozenset(tn.index(t) for t in o["read_write"]),
                         tuple(dn.index(d) for d in o.get("dims") or []))
            for name, o in c["ops"].items()
        }  # fmt: skip
        chain = Chain(dn, {i: int(c["dims"][d]) for i, d in enumerate(dn)}, tn,
                      tuple(c["ins"]), tuple(c["outs"]), dict(sorted(ops.items())))  # fmt: skip

        def dims(m: dict[str, int]) -> dict[int, int]:
            return {dn.index(d): int(v) for d, v in m.items()}

        def node(d: dict[str, Any], parent: TreeNode | None) -> TreeNode:
            n = TreeNode(int(d["id"]), "", parent=parent)
            if "tile" in d:
                n.kind, n.spatial = "tile", d["tile"] == "spatial"
                n.order = [dn.index(x) for x in d["order"]]
                for e in d["tensors"]:
                    n.tensors.append(tn.index(e["tensor"]))
                    n.tags.append(e["tag"])
                    n.targets.append(e["from"])
                    n.childs.append(e["to"])
                    n.scale.append(int(e["bits"]))
                    n.rmw.append(bool(e["rmw"]))
                    n.tilings.append([dims(f) for f in e["factors"]])
            elif "op" in d:
                n.kind, n.op_name, n.op_type = "op", d["op"], d["type"]
                n.tensors = [tn.index(t) for t in d["tensors"]]
                n.primitive = dims(d["primitive"])
                n.tilesizes = {tn.index(t): dims(s) for t, s in d["tile_steps"].items()}
                n.red_dims = [dn.index(x) for x, _ in d["reduce"]]
                n.red_factors = {dn.index(x): int(f) for x, f in d["reduce"]}
            elif "bind" in d:
                n.kind, n.binding = "bind", d["bind"]
            else:
                n.kind, n.col_type = "collective", d["collective"]
                n.in_tensor, n.out_tensor = tn.index(d["tensor"]), tn.index(d["out"])
                n.dim, n.red_op = dn.index(d["over"]), d["reduce"]
                n.target, n.child = d["level"], d["child"]
                n.src, n.dest = list(d["src"]), list(d["dest"])
                n.precision, n.tag = int(d["bits"]), d["tag"]
                n.spatial_factor, n.wb_output = int(d["spatial_factor"]), bool(d["write_back"])
            n.children = [node(x, n) for x in d.get("children") or []]
            return n

        root = node(doc["tree"], None)
    except TreeInputError:
        raise
    except (KeyError, ValueError, TypeError, AttributeError) as e:
        raise TreeInputError(
            source, "-", f"not a fusekit mapping tree ({type(e).__name__}: {e})"
        ) from None
    return TreeMapping(Hierarchy(levels), chain, root, {}, source)
