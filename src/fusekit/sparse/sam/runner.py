"""Run a SAM graph on the per-token machine: bind the inputs, build the network, decode the output.

The recipe (:func:`run`):

1. read the graph (:mod:`.gv`) and check it: known node types, no directed cycle (no block of
   SAM's graphs holds a FIFO that would let a cycle make progress);
2. fold the ``broadcast`` nodes away (a broadcast is an output port wired to several channels)
   and resolve every edge's two ports (:mod:`.ports`);
3. bind each input to SAM level storage per the graph's format string (:mod:`.bind`), checking
   the format against the array's rank;
4. add one primitive per node in dataflow order, feeding root scanners and root repeats a
   source ``[0, D]``;
5. run the network and decode the output writers' streams into a dense array.

Node types and the primitives they become:

=============================  ===============================================================
``fiberlookup``                ``CompressedScanner`` / ``UncompressedScanner`` (``format``)
``fiberwrite``                 ``CompressedWriter`` / ``UncompressedWriter``; ``ValsWriter``
``arrayvals``                  ``ArrayRead`` (a ``none`` tensor: values ``[v]`` read at ref 0)
``intersect``, ``union``       ``Intersect`` / ``Union``; :class:`JoinN` past two
``repsiggen``, ``repeat``      ``RepeatSigGen``, ``Repeat``
``mul``, ``add``               ``ALU`` (``sub=1``: the subtrahend negated, see :mod:`.ports`)
``reduce``                     ``Reduce``
``spaccumulator``              ``SparseAccumulator`` of ``order``; without ``in1`` (one
                               output level) every point's outer coordinate is 0, made by an
                               ``ALU`` as ``inner - inner``
``crddrop``                    ``CrdDrop`` (``vals=true``: on values); inner two levels down:
                               :class:`.blocks.DeepCrdDrop`
``crdhold``                    ``CrdHold``
``vectorreducer``              ``FiberAccumulator`` (sums over the fibers above the innermost)
``broadcast``                  none: the port feeds several channels
``locate``, ``iterate``,       fusekit extensions written by :mod:`.export`: ``Locator``,
``alu``                        ``UncompressedScanner``, ``ALU`` of ``op``
=============================  ===============================================================

Per-node token counts are named as SAM's generated tests name their blocks
(``fiberlookup_Bi_19``, ``intersectk_13``, ``spaccumulator1_3``, ``fiberwrite_Xvals_0``): the
tokens the block sent on its busiest output channel (a writer: the tokens it received).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fusekit.sparse.sam.bind import BoundTensor, bind, decode, format_rank, mode_order
from fusekit.sparse.sam.blocks import DeepCrdDrop
from fusekit.sparse.sam.gv import SamGraph, SamGraphError, SamNode, read_gv
from fusekit.sparse.sam.ports import Wire, check_acyclic, resolve
from fusekit.sparse.sim.channel import Channel
from fusekit.sparse.sim.engine import Network
from fusekit.sparse.sim.engine import run as run_network
from fusekit.sparse.sim.fiber_acc import FiberAccumulator
from fusekit.sparse.sim.primitives import (
    ALU,
    ArrayRead,
    CompressedScanner,
    CompressedWriter,
    CrdDrop,
    CrdHold,
    Intersect,
    JoinN,
    Locator,
    Primitive,
    Reduce,
    Repeat,
    RepeatSigGen,
    SparseAccumulator,
    UncompressedScanner,
    UncompressedWriter,
    Union,
    ValsWriter,
)
from fusekit.sparse.sim.tokens import DONE


@dataclass(frozen=True, slots=True)
class SamResult:
    """A SAM graph run on the per-token machine.

    Attributes:
        output: the output tensor, dense, in its logical layout (0-d for a scalar).
        cycles: cycles until every block finished.
        tokens: per block (``<type>_<tensor><index>_<id>``), the tokens it sent.
    """

    output: np.ndarray
    cycles: int
    tokens: dict[str, int]


def block_name(node: SamNode) -> str:
    """The name SAM's generated tests give a block (``fiberlookup_Bi_19``, ``mul_5``)."""
    t, a, i = node.type, node.attrs, node.id
    if t in ("fiberlookup", "repeat", "locate", "iterate"):
        return f"{t}_{a.get('tensor', '')}{a.get('index', '')}_{i}"
    if t == "arrayvals":
        return f"{t}_{a.get('tensor', '')}_{i}"
    if t == "repsiggen":
        return f"{t}_{a.get('index', '')}_{i}"
    if t in ("intersect", "union"):
        return f"{t}{a.get('index', '')}_{i}"
    if t == "spaccumulator":
        return f"{t}{a.get('order', '')}_{i}"
    if t == "fiberwrite":
        return f"{t}_{a.get('tensor', '')}{a.get('mode', '')}_{i}"
    return f"{t}_{i}"


def _dims(graph: SamGraph, bound: Mapping[str, BoundTensor]) -> dict[str, int]:
    """The extent of every index variable, from the levels that scan it."""
    dims: dict[str, int] = {}
    for node in graph.nodes.values():
        if node.type not in ("fiberlookup", "locate", "iterate") or node.get("tensor") not in bound:
            continue
        t = bound[node.get("tensor")]
        mode = int(node.get("mode", "0"))
        dim = t.shape[mode]
        var = node.get("index")
        if dims.setdefault(var, dim) != dim:
            raise SamGraphError(
                graph.source,
                f"index {var!r} has extent {dims[var]} elsewhere but "
                f"{node.get('tensor')}'s mode {mode} has {dim}",
                node.id,
            )
    return dims


def bind_inputs(graph: SamGraph, inputs: Mapping[str, np.ndarray]) -> dict[str, BoundTensor]:
    """Store every input tensor per the graph's formats.

    Raises:
        SamGraphError: for a missing or unknown input, a rank that does not match the format,
            or a scanner of a mode or level kind the format does not have.
    """
    src = graph.source
    users: dict[str, int] = {}
    for node in graph.nodes.values():
        if node.get("tensor") and not (node.type == "fiberwrite"):
            users.setdefault(node.get("tensor"), node.id)
    names = list(graph.formats)[1:]
    for name in users:
        if name not in graph.formats:
            raise SamGraphError(
                src,
                f"tensor {name!r} is not in the graph comment ({','.join(graph.formats)})",
                users[name],
            )
    for name in inputs:
        if name not in names:
            raise SamGraphError(src, f"expected inputs {names} (got an input {name!r})")
    bound: dict[str, BoundTensor] = {}
    for name in names:
        fmt, at = graph.formats[name], users.get(name)
        if name not in inputs:
            raise SamGraphError(src, f"expected an input for tensor {name!r} (format {fmt})", at)
        arr = np.asarray(inputs[name])
        if arr.ndim != format_rank(fmt):
            raise SamGraphError(
                src,
                f"format {name}={fmt} has {format_rank(fmt)} levels but the bound tensor "
                f"has rank {arr.ndim} (shape {arr.shape})",
                at,
            )
        bound[name] = bind(name, fmt, arr)
    for node in graph.nodes.values():
        if node.type != "fiberlookup":
            continue
        t = bound.get(node.get("tensor"))
        level = t.level_of(int(node.get("mode", "-1"))) if t is not None else None
        kind = "d" if node.get("format") == "dense" else "s"
        if t is None or level is None or level.kind != kind:
            raise SamGraphError(
                src,
                f"the scanner of {node.get('tensor')} mode {node.get('mode')} "
                f"({node.get('format')}) does not match the format "
                f"{node.get('tensor')}={graph.formats.get(node.get('tensor'), '?')}",
                node.id,
            )
    return bound


def output_shape(graph: SamGraph, dims: Mapping[str, int]) -> tuple[int, ...]:
    """The output's logical shape: the extent of each output mode's index variable."""
    fmt = graph.formats[graph.output]
    shape = [0] * format_rank(fmt)
    for node in graph.nodes.values():
        if node.type == "fiberwrite" and node.get("mode") != "vals":
            var = node.get("index")
            if var not in dims:
                raise SamGraphError(
                    graph.source, f"no input scans index {var!r} of the output", node.id
                )
            shape[int(node.get("mode"))] = dims[var]
    return tuple(shape)


class _Builder:
    """Adds one primitive per node, in dataflow order, wiring its resolved input ports."""

    def __init__(
        self,
        graph: SamGraph,
        bound: Mapping[str, BoundTensor],
        dims: Mapping[str, int],
        net: Network,
    ) -> None:
        self.graph = graph
        self.bound = bound
        self.dims = dims
        self.net = net
        self.prims: dict[int, Primitive] = {}
        self.writers: dict[str, Channel] = {}  # output level ("vals" or the mode) -> channel

    def inputs(self, node: SamNode, wires: list[Wire]) -> dict[str, Channel]:
        chans: dict[str, Channel] = {}
        for w in wires:
            if w.dst_port is None:
                continue
            if w.dst_port in chans:
                raise SamGraphError(
                    self.graph.source, f"two producers feed input {w.dst_port!r}", node.id
                )
            chans[w.dst_port] = self.net.wire(self.prims[w.src], w.src_port)
        return chans

    def root(self, node: SamNode) -> Channel:
        return self.net.source(f"root_{block_name(node)}", [0, DONE])

    def need(self, node: SamNode, chans: dict[str, Channel], *ports: str) -> list[Channel]:
        for p in ports:
            if p not in chans:
                raise SamGraphError(
                    self.graph.source, f"input {p!r} of {node.type} has no producer", node.id
                )
        return [chans[p] for p in ports]

    def add(self, node: SamNode, wires: list[Wire], sub_neg: tuple[bool, bool]) -> None:
        chans = self.inputs(node, wires)
        t, name, a = node.type, block_name(node), node.attrs
        prim: Primitive
        if t == "fiberlookup":
            ref = (
                self.root(node) if a.get("root") == "true" else self.need(node, chans, "in_ref")[0]
            )
            level = self.bound[a["tensor"]].level_of(int(a["mode"]))
            assert level is not None
            if level.kind == "d":
                prim = UncompressedScanner(name, level.dim, ref)
            else:
                assert level.seg is not None and level.crd is not None
                prim = CompressedScanner(name, level.seg.tolist(), level.crd.tolist(), ref)
        elif t == "iterate":
            ref = (
                self.root(node) if a.get("root") == "true" else self.need(node, chans, "in_ref")[0]
            )
            prim = UncompressedScanner(name, self.dims[a["index"]], ref)
        elif t == "locate":
            ref = (
                self.root(node) if a.get("root") == "true" else self.need(node, chans, "in_ref")[0]
            )
            (crd,) = self.need(node, chans, "in_crd")
            level = self.bound[a["tensor"]].level_of(int(a["mode"]))
            assert level is not None
            prim = Locator(name, level.dim, ref, crd)
        elif t == "fiberwrite":
            if a.get("mode") == "vals":
                (ch,) = self.need(node, chans, "in_val")
                prim = ValsWriter(name, ch)
                self.writers["vals"] = ch
            else:
                (ch,) = self.need(node, chans, "in_crd")
                dim = self.dims.get(a.get("index", ""), 0)
                prim = (
                    UncompressedWriter(name, dim, ch)
                    if a.get("format") == "dense"
                    else CompressedWriter(name, ch)
                )
                self.writers[a.get("mode", "")] = ch
        elif t == "arrayvals":
            (ref,) = self.need(node, chans, "in_ref")
            prim = ArrayRead(name, self.bound[a["tensor"]].vals, ref)
        elif t in ("intersect", "union"):
            n = sum(1 for p in chans if p.startswith("in_crd"))
            crds = self.need(node, chans, *(f"in_crd{k + 1}" for k in range(max(n, 2))))
            refs = self.need(node, chans, *(f"in_ref{k + 1}" for k in range(max(n, 2))))
            if n > 2:
                prim = JoinN(name, t == "union", crds, refs)
            else:
                join = Intersect if t == "intersect" else Union
                prim = join(name, crds[0], refs[0], crds[1], refs[1])
        elif t == "repsiggen":
            prim = RepeatSigGen(name, *self.need(node, chans, "in_stream"))
        elif t == "repeat":
            ref = (
                self.root(node) if a.get("root") == "true" else self.need(node, chans, "in_ref")[0]
            )
            prim = Repeat(name, ref, *self.need(node, chans, "in_repeat"))
        elif t in ("mul", "add"):
            in1, in2 = self.need(node, chans, "in1", "in2")
            prim = ALU(name, t, in1, in2, neg1=sub_neg[0], neg2=sub_neg[1])
        elif t == "alu":
            (in1,) = self.need(node, chans, "in1")
            prim = ALU(name, a.get("op", ""), in1, chans.get("in2"))
        elif t == "reduce":
            prim = Reduce(name, self.need(node, chans, "in_val")[0], a.get("op", "sum"))
        elif t == "spaccumulator":
            prim = self._spacc(node, chans)
        elif t == "crddrop" and a.get("vals") == "true":
            outer, inner = self.need(node, chans, "in_outer_crd", "in_inner_crd")
            prim = CrdDrop(name, outer, inner, vals=True)
        elif t == "crddrop":
            outer, inner = self.need(node, chans, "in_outer_crd", "in_inner_crd")
            gap = max((w.gap for w in wires if w.gap is not None), default=1)
            prim = DeepCrdDrop(name, outer, inner, gap) if gap > 1 else CrdDrop(name, outer, inner)
        elif t == "crdhold":
            prim = CrdHold(name, *self.need(node, chans, "in_outer_crd", "in_inner_crd"))
        elif t == "vectorreducer":
            prim = FiberAccumulator(name, *self.need(node, chans, "in_crd", "in_val"))
        else:  # resolve() rejected every other type
            raise AssertionError(t)
        self.net.add(prim)
        self.prims[node.id] = prim

    def _spacc(self, node: SamNode, chans: dict[str, Channel]) -> Primitive:
        name = block_name(node)
        (val,) = self.need(node, chans, "in_val")
        (inner,) = self.need(node, chans, "in_inner_crdpt")
        outer = chans.get("in_outer_crdpt")
        if outer is None:  # no outer output index: one group, outer point 0 (inner - inner)
            if node.get("in1"):
                self.need(node, chans, "in_outer_crdpt")
            src = next(p for p in self.net.prims for v in p.outputs.values() if inner in v)
            port = next(k for k, v in src.outputs.items() if inner in v)
            zero = self.net.add(
                ALU(f"{name}_outer", "add", inner, self.net.wire(src, port), neg2=True)
            )
            outer, inner = self.net.wire(zero, "out_val"), self.net.wire(src, port)
        return SparseAccumulator(name, int(node.get("order", "1")), outer, inner, val)


def run(
    graph: SamGraph | str | Path,
    inputs: Mapping[str, np.ndarray],
    depth: int | None = None,
    latency: int = 1,
) -> SamResult:
    """Run a SAM graph on the per-token machine.

    Args:
        graph: a parsed graph or the path of a ``.gv`` file.
        inputs: every input tensor of the graph comment, dense in its logical layout (a 0-d
            array for a ``none`` tensor).
        depth: every channel's FIFO depth (``None``: unbounded, as SAM's tests run by default).
        latency: every channel's delivery latency in cycles.

    Returns:
        The output (dense, logical layout), the cycles and the per-block token counts.

    Raises:
        SamGraphError: for a malformed graph (syntax, unknown node type, an input port with no
            producer, a directed cycle) or inputs that do not match it (missing, format against
            rank); the message names the file and the node.
    """
    g = read_gv(graph) if isinstance(graph, str | Path) else graph
    check_acyclic(g)
    order, wires, sub_neg = resolve(g)
    bound = bind_inputs(g, inputs)
    dims = _dims(g, bound)
    shape = output_shape(g, dims)
    net = Network(depth, latency)
    b = _Builder(g, bound, dims, net)
    for nid in order:
        try:
            b.add(g.nodes[nid], wires.get(nid, []), sub_neg.get(nid, (False, False)))
        except SamGraphError:
            raise
        except (ValueError, KeyError) as e:  # a primitive refused its attributes
            raise SamGraphError(g.source, f"{g.nodes[nid].type}: {e}", nid) from e
    try:
        cycles = run_network(net)
    except (RuntimeError, ValueError) as e:
        raise SamGraphError(g.source, f"the network failed: {e}") from e
    fmt = g.formats[g.output]
    missing = [m for m in [str(m) for m in mode_order(fmt)] + ["vals"] if m not in b.writers]
    if missing:
        raise SamGraphError(g.source, f"expected a fiberwrite of {g.output} for mode(s) {missing}")
    try:
        out = decode(
            fmt, shape, [b.writers[str(m)].log for m in mode_order(fmt)], b.writers["vals"].log
        )
    except ValueError as e:
        raise SamGraphError(g.source, f"output {g.output}: {e}") from e
    tokens: dict[str, int] = {}
    for nid, prim in b.prims.items():
        sent = [ch.sent for chans in prim.outputs.values() for ch in chans]
        received = [ch.sent for ch in prim.inputs.values()]
        tokens[block_name(g.nodes[nid])] = max(sent) if sent else max(received, default=0)
    return SamResult(out, cycles, tokens)
