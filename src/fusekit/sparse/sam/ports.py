"""Resolving a SAM graph's edges to primitive ports.

An edge's ``comment`` names one port, sometimes the source's output and sometimes the
destination's input; the node types settle which:

- ``intersect``/``union``: ``in-X`` names the operand of tensor ``X`` on a crd or ref edge into
  the joiner (operands numbered 1, 2 in order of first appearance); ``out-X`` the ref output of
  that operand;
- ``crddrop``/``crdhold``: an input is outer or inner by its coordinate stream's index variable,
  found from the producer (the scanner, joiner, dropper or accumulator that made the stream) and
  failing that from the comment (``i``, ``in-i``, ``outer-i``); an output by the index the
  comment names (``outer-i``, ``inner-j``, ``out-i``, ``crddrp-crd-j-out``) or failing that the
  index of the block it feeds; a value edge is the ``vals=true`` variant's inner port;
- ``spaccumulator``: a crd input of index ``in1`` is the outer point stream, of ``in0`` the inner
  one; a crd input of another index (the reduced variable, which SAM's generated tests wire and
  then overwrite) is left unconnected; outputs ``out-<in0>``/``out-<in1>`` likewise;
- ``mul``/``add``: unlabelled, taken in file order. For a subtracting ``add`` (``sub=1``) file
  order is unreliable (two versions of the residual graph disagree), so the minuend is the
  operand computed from the tensor that comes first in the graph comment, which lists the
  tensors in the order the expression names them (TACO's convention): in
  ``x(i) = b(i) - C(i,j) * d(j)`` the operand read from ``b`` is the minuend.

A ``broadcast`` node is folded away: its consumers read its producer's port directly. So is a
``crddrop`` whose inner output feeds nothing (the compiler's ``mat_mattransmul``): the values
that belong to its outer coordinates do not pass through it, so dropping would misalign the
output's coordinates with its values; its consumers read its outer input instead.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from fusekit.sparse.sam.gv import SamEdge, SamGraph, SamGraphError, SamNode

KNOWN_TYPES = frozenset(
    {
        "fiberlookup",
        "fiberwrite",
        "arrayvals",
        "intersect",
        "union",
        "repsiggen",
        "repeat",
        "broadcast",
        "mul",
        "add",
        "reduce",
        "spaccumulator",
        "crddrop",
        "crdhold",
        "vectorreducer",
        "locate",
        "iterate",
        "alu",
    }
)


@dataclass(frozen=True, slots=True)
class Wire:
    """A resolved edge: ``src``'s output port into the consumer's input port.

    ``dst_port`` is ``None`` for an input the block does not read. ``gap`` (on a dropper's inner
    input) is how many levels the inner stream nests below the outer one.
    """

    src: int
    src_port: str
    dst_port: str | None
    gap: int | None = None


def check_acyclic(graph: SamGraph) -> None:
    """Raise for any directed cycle (no SAM block holds a FIFO that lets a cycle progress).

    Raises:
        SamGraphError: naming a node on the cycle and the cycle itself.
    """
    succ: dict[int, list[int]] = defaultdict(list)
    for e in graph.edges:
        succ[e.src].append(e.dst)
    state: dict[int, int] = {}
    for start in graph.nodes:
        if start in state:
            continue
        stack: list[tuple[int, int]] = [(start, 0)]
        path: list[int] = []
        while stack:
            nid, k = stack.pop()
            if k == 0:
                state[nid] = 1
                path.append(nid)
            if k < len(succ[nid]):
                stack.append((nid, k + 1))
                nxt = succ[nid][k]
                if state.get(nxt) == 1:
                    cyc = [*path[path.index(nxt) :], nxt]
                    raise SamGraphError(
                        graph.source, "a cycle without a FIFO: " + " -> ".join(map(str, cyc)), nxt
                    )
                if nxt not in state:
                    stack.append((nxt, 0))
            else:
                state[nid] = 2
                path.pop()


def _named_index(comment: str, choices: dict[str, str]) -> str | None:
    """The port in ``choices`` (index -> port) whose index the comment names."""
    for part in re.split(r"[^A-Za-z0-9]+", comment):
        if part in choices:
            return choices[part]
    return None


@dataclass(frozen=True, slots=True)
class _Hop:
    """An edge with broadcasts folded: the first hop's source and comment, the last hop's end."""

    src: int
    src_comment: str
    dst: int
    dst_comment: str
    type: str


class _Resolver:
    def __init__(self, graph: SamGraph) -> None:
        self.g = graph
        self.src = graph.source
        self.index: dict[tuple[int, str], str] = {}  # output port -> index variable
        self.depth: dict[tuple[int, str], int] = {}  # output port -> fiber nesting
        self.operands: dict[int, list[str]] = {}  # joiner -> operand tensors in port order
        self.folded: set[int] = set()  # broadcasts and pass-through droppers

    def fail(self, node: int, problem: str) -> SamGraphError:
        return SamGraphError(self.src, problem, node)

    def hops(self) -> list[_Hop]:
        into: dict[int, list[SamEdge]] = defaultdict(list)
        for e in self.g.edges:
            into[e.dst].append(e)
        for nid, node in self.g.nodes.items():
            if node.type not in KNOWN_TYPES:
                raise self.fail(nid, f"unknown node type {node.type!r}")
            if node.type == "broadcast" and len(into[nid]) != 1:
                raise self.fail(
                    nid, f"expected a broadcast to have one producer (got {len(into[nid])})"
                )

        outer_in = self._pass_through(into)
        self.folded = set(outer_in) | {n for n, v in self.g.nodes.items() if v.type == "broadcast"}

        def origin(e: SamEdge) -> SamEdge:
            while self.g.nodes[e.src].type == "broadcast" or e.src in outer_in:
                e = outer_in[e.src] if e.src in outer_in else into[e.src][0]
            return e

        out = []
        for e in self.g.edges:
            if self.g.nodes[e.dst].type != "broadcast" and e.dst not in outer_in:
                first = origin(e)
                out.append(_Hop(first.src, first.comment, e.dst, e.comment, e.type))
        return out

    def _pass_through(self, into: dict[int, list[SamEdge]]) -> dict[int, SamEdge]:
        """Coordinate droppers whose inner output feeds nothing, with their outer input edge.

        Such a dropper cannot keep anything aligned (the values that go with its outer
        coordinates do not pass through it), and dropping would misalign the output's
        coordinates with its values: it passes its outer stream on unchanged.
        """
        out: dict[int, SamEdge] = {}
        for nid, node in self.g.nodes.items():
            if node.type != "crddrop" or node.get("vals") == "true":
                continue
            choices = {node.get("outer"): "outer", node.get("inner"): "inner"}
            sides = {
                _named_index(e.comment, choices) or choices.get(self.g.nodes[e.dst].get("index"))
                for e in self.g.edges
                if e.src == nid
            }
            outer = [e for e in into[nid] if _named_index(e.comment, choices) == "outer"]
            if "inner" not in sides and None not in sides and len(outer) == 1:
                out[nid] = outer[0]
        return out

    # --- output ports ----------------------------------------------------------------------

    def src_port(self, h: _Hop) -> str:
        node = self.g.nodes[h.src]
        t, a = node.type, node.attrs
        simple = {
            "fiberlookup": {"crd": "out_crd", "ref": "out_ref"},
            "locate": {"ref": "out_ref"},
            "iterate": {"crd": "out_crd", "ref": "out_ref"},
            "alu": {"val": "out_val"},
            "repsiggen": {"repsig": "out_repeat"},
            "repeat": {"ref": "out_ref"},
            "arrayvals": {"val": "out_val"},
            "mul": {"val": "out_val"},
            "add": {"val": "out_val"},
            "reduce": {"val": "out_val"},
            "vectorreducer": {"crd": "out_crd", "val": "out_val"},
            "intersect": {"crd": "out_crd"},
            "union": {"crd": "out_crd"},
            "spaccumulator": {"val": "out_val"},
            "crddrop": {"val": "out_inner_crd"},
            "crdhold": {"val": "out_inner_crd"},
        }.get(t, {})
        if h.type in simple:
            return simple[h.type]
        port: str | None = None
        if t in ("intersect", "union") and h.type == "ref":
            tensor = h.src_comment.removeprefix("out-")
            ops = self.operands.get(h.src, [])
            if tensor in ops:
                port = f"out_ref{ops.index(tensor) + 1}"
        elif t in ("crddrop", "crdhold", "spaccumulator") and h.type == "crd":
            choices = (
                {a.get("outer", ""): "out_outer_crd", a.get("inner", ""): "out_inner_crd"}
                if t != "spaccumulator"
                else {a.get("in0", ""): "out_inner_crd", a.get("in1", ""): "out_outer_crd"}
            )
            choices.pop("", None)
            port = _named_index(h.src_comment, choices)
            if port is None:
                port = choices.get(self.g.nodes[h.dst].get("index"))
        if port is None:
            raise self.fail(
                h.src,
                f"cannot tell which output of {t} the {h.type} edge to node "
                f"{h.dst} (comment {h.src_comment!r}) leaves from",
            )
        return port

    # --- input ports -----------------------------------------------------------------------

    def dst_ports(self, nid: int, hops: list[_Hop], src_ports: list[str]) -> list[str | None]:
        node = self.g.nodes[nid]
        t, a = node.type, node.attrs
        ports: list[str | None] = []
        vals = 0
        for h, sp in zip(hops, src_ports, strict=True):
            idx = self.index.get((h.src, sp))
            port: str | None = {
                ("fiberlookup", "ref"): "in_ref",
                ("locate", "ref"): "in_ref",
                ("locate", "crd"): "in_crd",
                ("iterate", "ref"): "in_ref",
                ("repeat", "crd"): "in_repeat",
                ("fiberwrite", "crd"): "in_crd",
                ("fiberwrite", "val"): "in_val",
                ("arrayvals", "ref"): "in_ref",
                ("repsiggen", "crd"): "in_stream",
                ("repeat", "ref"): "in_ref",
                ("repeat", "repsig"): "in_repeat",
                ("reduce", "val"): "in_val",
                ("spaccumulator", "val"): "in_val",
                ("crddrop", "val"): "in_inner_crd",
                ("crdhold", "val"): "in_inner_crd",
                ("vectorreducer", "crd"): "in_crd",
                ("vectorreducer", "val"): "in_val",
            }.get((t, h.type))
            if t in ("mul", "add", "alu") and h.type == "val":
                vals += 1
                port = f"in{vals}" if vals <= 2 else None
            elif t in ("intersect", "union") and h.type in ("crd", "ref"):
                tensor = h.dst_comment.removeprefix("in-")
                ops = self.operands.setdefault(nid, [])
                if tensor and tensor not in ops:
                    ops.append(tensor)
                port = f"in_{h.type}{ops.index(tensor) + 1}" if tensor else None
            elif t in ("crddrop", "crdhold") and h.type == "crd":
                choices = {a.get("outer", ""): "in_outer_crd", a.get("inner", ""): "in_inner_crd"}
                port = choices.get(idx or "") or _named_index(h.dst_comment, choices)
            elif t == "spaccumulator" and h.type == "crd":
                choices = {a.get("in0", ""): "in_inner_crdpt", a.get("in1", ""): "in_outer_crdpt"}
                choices.pop("", None)
                port = choices.get(idx or "") or _named_index(h.dst_comment, choices)
                ports.append(port)  # another index: the reduced variable, not read
                continue
            if port is None:
                raise self.fail(
                    nid,
                    f"cannot tell which input of {t} the {h.type} edge from "
                    f"node {h.src} (comment {h.dst_comment!r}) feeds",
                )
            ports.append(port)
        if t in ("intersect", "union") and len(self.operands.get(nid, [])) < 2:
            raise self.fail(
                nid, f"expected {t} to join two or more operands (got {self.operands.get(nid, [])})"
            )
        if (t in ("mul", "add") and vals != 2) or (t == "alu" and vals not in (1, 2)):
            want = "one or two" if t == "alu" else "two"
            raise self.fail(nid, f"expected {t} to have {want} value inputs (got {vals})")
        return ports

    def record_outputs(self, nid: int, wires: list[Wire]) -> None:
        node = self.g.nodes[nid]
        t, a = node.type, node.attrs
        d_in = {w.dst_port: self.depth.get((w.src, w.src_port), 0) for w in wires if w.dst_port}
        root = 0 if a.get("root") == "true" else None
        if t in ("fiberlookup", "iterate"):
            d = (root if root is not None else d_in.get("in_ref", 0)) + 1
            self._out(nid, {"out_crd": d, "out_ref": d}, {"out_crd": a.get("index", "")})
        elif t in ("intersect", "union"):
            d = d_in.get("in_crd1", 0)
            ports = {"out_crd": d, "out_ref1": d, "out_ref2": d}
            self._out(nid, ports, {"out_crd": a.get("index", "")})
        elif t == "repsiggen":
            self._out(nid, {"out_repeat": d_in.get("in_stream", 0)}, {})
        elif t in ("repeat", "locate"):
            self._out(nid, {"out_ref": d_in.get("in_repeat", d_in.get("in_crd", 0))}, {})
        elif t in ("arrayvals", "mul", "add", "alu"):
            self._out(nid, {"out_val": max(d_in.values(), default=0)}, {})
        elif t == "reduce":
            self._out(nid, {"out_val": d_in.get("in_val", 1) - 1}, {})
        elif t in ("crddrop", "crdhold"):
            ports = {
                "out_outer_crd": d_in.get("in_outer_crd", 0),
                "out_inner_crd": d_in.get("in_inner_crd", 0),
            }
            self._out(
                nid,
                ports,
                {"out_outer_crd": a.get("outer", ""), "out_inner_crd": a.get("inner", "")},
            )
        elif t == "spaccumulator":
            ports = {"out_outer_crd": 1, "out_inner_crd": 2, "out_val": 2}
            self._out(
                nid, ports, {"out_outer_crd": a.get("in1", ""), "out_inner_crd": a.get("in0", "")}
            )
        elif t == "vectorreducer":
            d = d_in.get("in_crd", 1) - 1
            self._out(
                nid,
                {"out_crd": d, "out_val": d},
                {"out_crd": a.get("accum_index", a.get("index", ""))},
            )

    def _out(self, nid: int, depths: dict[str, int], index: dict[str, str]) -> None:
        for p, d in depths.items():
            self.depth[(nid, p)] = d
        for p, v in index.items():
            self.index[(nid, p)] = v


def _order(graph: SamGraph, hops: list[_Hop], folded: set[int]) -> list[int]:
    """Node ids (folded ones left out) in dataflow order, file order among ready nodes."""
    nodes = [n for n in graph.nodes if n not in folded]
    indeg = dict.fromkeys(nodes, 0)
    succ: dict[int, list[int]] = defaultdict(list)
    for h in hops:
        indeg[h.dst] += 1
        succ[h.src].append(h.dst)
    rank = {n: k for k, n in enumerate(nodes)}
    ready = sorted((n for n in nodes if indeg[n] == 0), key=rank.__getitem__)
    out: list[int] = []
    while ready:
        n = ready.pop(0)
        out.append(n)
        for m in succ[n]:
            indeg[m] -= 1
            if indeg[m] == 0:
                ready.append(m)
                ready.sort(key=rank.__getitem__)
    return out


def _tensors_above(graph: SamGraph, hops: list[_Hop], nid: int) -> set[str]:
    """The tensors whose values reach node ``nid`` (arrayvals upstream of it)."""
    into: dict[int, list[int]] = defaultdict(list)
    for h in hops:
        into[h.dst].append(h.src)
    seen, todo, out = {nid}, [nid], set()
    while todo:
        n = todo.pop()
        node: SamNode = graph.nodes[n]
        if node.type == "arrayvals":
            out.add(node.get("tensor"))
        for m in into[n]:
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return out


def resolve(
    graph: SamGraph,
) -> tuple[list[int], dict[int, list[Wire]], dict[int, tuple[bool, bool]]]:
    """Fold broadcasts and resolve every edge's ports.

    Returns:
        The nodes in dataflow order (no broadcasts), each node's input wires, and for each
        subtracting ``add`` which operand is negated.

    Raises:
        SamGraphError: for an unknown node type, a broadcast without exactly one producer, or an
            edge whose ports the comments and node types do not settle.
    """
    r = _Resolver(graph)
    hops = r.hops()
    order = _order(graph, hops, r.folded)
    into: dict[int, list[_Hop]] = defaultdict(list)
    for h in hops:
        into[h.dst].append(h)
    wires: dict[int, list[Wire]] = {}
    sub_neg: dict[int, tuple[bool, bool]] = {}
    position = {t: k for k, t in enumerate(graph.formats)}
    for nid in order:
        hs = into[nid]
        sps = [r.src_port(h) for h in hs]
        dps = r.dst_ports(nid, hs, sps)
        node = graph.nodes[nid]
        if node.type == "add" and node.get("sub") == "1":
            firsts = [
                min(
                    (position.get(t, len(position)) for t in _tensors_above(graph, hops, h.src)),
                    default=len(position),
                )
                for h, p in zip(hs, dps, strict=True)
                if p in ("in1", "in2")
            ]
            if firsts[1] < firsts[0]:
                dps = [{"in1": "in2", "in2": "in1"}.get(p or "", p) for p in dps]
            sub_neg[nid] = (False, True)
        ws = [Wire(h.src, sp, dp) for h, sp, dp in zip(hs, sps, dps, strict=True)]
        if node.type == "crddrop" and node.get("vals") != "true":
            depth = {w.dst_port: r.depth.get((w.src, w.src_port)) for w in ws}
            outer, inner = depth.get("in_outer_crd"), depth.get("in_inner_crd")
            if outer is not None and inner is not None:
                ws = [
                    Wire(
                        w.src,
                        w.src_port,
                        w.dst_port,
                        inner - outer if w.dst_port == "in_inner_crd" else None,
                    )
                    for w in ws
                ]
        wires[nid] = ws
        r.record_outputs(nid, ws)
    return order, wires, sub_neg
