"""Lowering one statement to a network of per-token primitives (the reference machine).

The network follows the statement's dataflow order level by level, as the fast simulator does::

    level v:   scan O.v        operands with a compressed level at v (LevelScanner); in a
                               union of sparse operands, their dense levels too
               intersecter v   / unioner v, when two operands scan v
               iterate v       when no operand scans v (a dense LevelScanner)
               locate O.v      operands with a dense level at v (Locator)
               repeat O.v      operands that v does not index (Repeat)
    values:    array O         one per operand
               alu <combine>   the combine, then the epilogue
               reducer         when the reduced variable is innermost
               spacc           when it is followed by one output variable (order-1 accumulator)
               write Y         the output's values

Names match the fast simulator's primitives, so their token counts can be compared one by one
(:func:`run_statement`). Supported here: one or two operands, at most one reduced variable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fusekit.errors import expected
from fusekit.sparse.formats import LevelKind, SparseTensor, StoredLevel
from fusekit.sparse.program import BINARY, UNARY, Statement
from fusekit.sparse.sim.channel import Channel
from fusekit.sparse.sim.engine import Network, run
from fusekit.sparse.sim.fiber_acc import FiberAccumulator
from fusekit.sparse.sim.primitives import (
    ALU,
    ArrayRead,
    CompressedWriter,
    Intersect,
    Locator,
    Reduce,
    Repeat,
    Union,
    ValsWriter,
    level_scanner,
)
from fusekit.sparse.sim.tokens import DONE


@dataclass
class _Ref:
    """An operand's reference stream while lowering."""

    tensor: SparseTensor
    vars: tuple[str, ...]
    level: int
    ref: Channel
    flat: np.ndarray


@dataclass(frozen=True, slots=True)
class TokenRun:
    """A statement run on the reference machine.

    Attributes:
        cycles: cycles until every primitive finished.
        tokens: per primitive name, the tokens it sent (done token included).
        firings: per primitive name, the cycles it fired (its busy time).
        values: the output values in emission order.
    """

    cycles: int
    tokens: dict[str, int]
    firings: dict[str, int]
    values: list[float]


def lower_statement(
    st: Statement,
    order: tuple[str, ...],
    inputs: dict[str, SparseTensor],
    depth: int = 8,
    latency: int = 1,
) -> tuple[Network, ValsWriter]:
    """Build the network of one statement over stored inputs.

    Raises:
        ValueError: for more than two operands, more than one reduced variable, or an order
            the order-1 accumulator cannot take.
    """
    where = f"lower {st.out}"
    if len(st.operands) > 2 or len(st.reduce_vars) > 1:
        raise ValueError(
            expected(where, "statement", "at most two operands and one reduced variable", st)
        )
    net = Network(depth, latency)
    _CLAIMED.clear()
    refs: list[_Ref] = []
    extents: dict[str, int] = {}
    for k, o in enumerate(st.operands):
        t = inputs[o.tensor]
        visit = (
            sorted(range(t.rank), key=lambda d: order.index(o.vars[d]))
            if t.is_dense
            else list(t.order)
        )
        flat = np.transpose(t.to_dense(), visit).ravel() if t.is_dense else t.values
        if t.is_dense:
            t = SparseTensor(
                t.name,
                t.shape,
                tuple(visit),
                tuple(StoredLevel(LevelKind.DENSE, t.shape[d]) for d in visit),
                flat,
            )
        refs.append(_Ref(t, o.vars, 0, net.source(f"root {o.tensor}{k}", [0, DONE]), flat))
        extents.update(zip(o.vars, t.shape, strict=True))
    crd_of: dict[str, Channel] = {}
    union = st.combine in ("add", "sub", "max")
    dense = {o.tensor for o in st.operands if inputs[o.tensor].is_dense}
    for v in order:
        at_v = [r for r in refs if r.level < r.tensor.rank and r.vars[r.tensor.order[r.level]] == v]
        scans = [r for r in at_v if r.tensor.levels[r.level].kind is not LevelKind.DENSE]
        if union and len(dense) + 1 < len(st.operands):
            # a union of sparse operands scans their dense levels too (uncompressed): located,
            # a dense level would lose the coordinates only the other operand holds, and an
            # absent (N) side would reach it as a coordinate
            scans = [r for r in at_v if r.tensor.name not in dense]
        outs = []
        for r in scans:
            sc = net.add(
                level_scanner(
                    f"scan {r.tensor.name}.{v}", r.tensor.levels[r.level], _fan(net, r.ref)
                )
            )
            outs.append((net.wire(sc, "out_crd"), net.wire(sc, "out_ref")))
            r.level += 1
        if len(scans) == 2:
            ins = [_fan(net, c) for pair in outs for c in pair]
            join = Union if union else Intersect
            j = net.add(join(f"{'unioner' if union else 'intersecter'} {v}", *ins))
            crd = net.wire(j, "out_crd")
            scans[0].ref, scans[1].ref = net.wire(j, "out_ref1"), net.wire(j, "out_ref2")
        elif len(scans) == 1:
            crd, scans[0].ref = outs[0]
        else:
            it = net.add(
                level_scanner(
                    f"iterate {v}", StoredLevel(LevelKind.DENSE, extents[v]), _fork(net, refs[0])
                )
            )
            crd = net.wire(it, "out_crd")
        for r in refs:
            if r in scans:
                continue
            if r in at_v:
                size = r.tensor.levels[r.level].size
                loc = net.add(
                    Locator(f"locate {r.tensor.name}.{v}", size, _fan(net, r.ref), _fan(net, crd))
                )
                r.ref, r.level = net.wire(loc, "out_ref"), r.level + 1
            else:
                rep = net.add(
                    Repeat(f"repeat {r.tensor.name}.{v}", _fan(net, r.ref), _fan(net, crd))
                )
                r.ref = net.wire(rep, "out_ref")
        crd_of[v] = crd
    vals = []
    for r in refs:
        arr = net.add(ArrayRead(f"array {r.tensor.name}", r.flat, _fan(net, r.ref)))
        vals.append(net.wire(arr, "out_val"))
    val = vals[0]
    if st.combine != "copy":
        ins = [_fan(net, x) for x in vals]
        second = ins[1] if len(ins) > 1 else None
        alu = net.add(ALU(f"alu {st.combine} 0", BINARY[st.combine], ins[0], second))
        val = net.wire(alu, "out_val")
    if st.reduce_vars:
        rv = st.reduce_vars[0]
        if order[-1] == rv:
            red = net.add(Reduce(f"reducer {st.reduce}", _fan(net, val), st.reduce or "sum"))
            val = net.wire(red, "out_val")
        elif order.index(rv) == len(order) - 2:
            acc = net.add(
                FiberAccumulator(f"spacc {st.reduce}", _fan(net, crd_of[order[-1]]), _fan(net, val))
            )
            val = net.wire(acc, "out_val")
            net.add(
                CompressedWriter(f"write {st.out}.{order[-1]}", _fan(net, net.wire(acc, "out_crd")))
            )
        else:
            raise ValueError(
                expected(where, "order", "the reduced variable last or second to last", order)
            )
    if st.epilogue:
        ep = net.add(ALU(f"alu {st.epilogue}", UNARY[st.epilogue], _fan(net, val)))
        val = net.wire(ep, "out_val")
    for v in st.out_vars:
        if not (st.reduce_vars and v == order[-1] and order[-1] != st.reduce_vars[0]):
            net.add(CompressedWriter(f"write {st.out}.{v}", _fan(net, crd_of[v])))
    writer = net.add(ValsWriter(f"write {st.out}", _fan(net, val)))
    assert isinstance(writer, ValsWriter)
    for p in net.prims:  # outputs nobody reads are not wired
        for port, chans in p.outputs.items():
            p.outputs[port] = [c for c in chans if id(c) in _CLAIMED]
    return net, writer


_CLAIMED: set[int] = set()


def _fan(net: Network, ch: Channel) -> Channel:
    """``ch`` itself the first time, then another channel carrying the same stream (a fork)."""
    if id(ch) not in _CLAIMED:
        _CLAIMED.add(id(ch))
        return ch
    for p in net.prims:
        for chans in p.outputs.values():
            if ch in chans:
                new = net.wire(p, next(k for k, c in p.outputs.items() if c is chans))
                _CLAIMED.add(id(new))
                return new
    raise ValueError(expected("lower", "channel", "produced by a primitive", ch.name))


def _fork(net: Network, r: _Ref) -> Channel:
    return _fan(net, r.ref)


def run_statement(
    st: Statement,
    order: tuple[str, ...],
    inputs: dict[str, SparseTensor],
    depth: int = 8,
    latency: int = 1,
) -> TokenRun:
    """Lower and run one statement on the reference machine."""
    net, writer = lower_statement(st, order, inputs, depth, latency)
    cycles = run(net)
    tokens = {
        p.name: max((ch.sent for chans in p.outputs.values() for ch in chans), default=p.firings)
        for p in net.prims
        if not p.name.startswith("root")
    }
    firings = {p.name: p.firings for p in net.prims if not p.name.startswith("root")}
    return TokenRun(cycles, tokens, firings, [float(x) for x in writer.vals])
