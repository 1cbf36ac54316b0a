"""Replay SAM's primitive test vectors through the per-token primitives.

A record (the format of SAM's unit-test vectors: ``primitive``, ``params``, ``inputs``,
``expected``, ``cycle_exact``, ...) names a primitive and gives its input streams in SAM's token
spelling. The replay follows the protocol of SAM's unit tests: element ``t`` of every input
stream is offered at cycle ``t`` (``""`` offers nothing), the crd and ref of a joiner's operand
arrive together, FIFOs are unbounded, and the primitive runs until it emits ``D``. Our channels
deliver a token :data:`LATENCY` cycle after it is offered, so every output appears that constant
number of cycles after SAM's; cycle-exact records are compared cycle by cycle on that shift.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fusekit.errors import expected
from fusekit.sparse.sim.base import Primitive, Sink
from fusekit.sparse.sim.channel import Channel
from fusekit.sparse.sim.engine import Network, run
from fusekit.sparse.sim.primitives import (
    ALU,
    ArrayRead,
    CompressedScanner,
    CompressedWriter,
    CrdDrop,
    CrdHold,
    Intersect,
    Reduce,
    Repeat,
    RepeatSigGen,
    SparseAccumulator,
    UncompressedScanner,
    UncompressedWriter,
    Union,
    ValsWriter,
)
from fusekit.sparse.sim.tokens import SamToken, Token, from_sam, to_sam

LATENCY = 1
"""Cycles from offering a token to the primitive seeing it (SAM's tests: 0)."""

Streams = dict[str, list[SamToken]]
_Inputs = Mapping[str, Channel]
_Builder = Callable[[str, Mapping[str, Any], _Inputs], Primitive]


def _p(params: Mapping[str, Any], key: str, default: Any = None) -> Any:
    if key not in params and default is None:
        raise ValueError(expected("SAM record params", key, "present", sorted(params)))
    return params.get(key, default)


def _joiner(cls: type[Intersect] | type[Union]) -> _Builder:
    return lambda n, p, i: cls(n, i["in_crd1"], i["in_ref1"], i["in_crd2"], i["in_ref2"])


def _alu(op: str) -> _Builder:
    return lambda n, p, i: ALU(
        n, op, i["in1"], i["in2"], bool(p.get("neg1", False)), bool(p.get("neg2", False))
    )


def _spacc(order: int) -> _Builder:
    return lambda n, p, i: SparseAccumulator(
        n, order, i["in_outer_crdpt"], i["in_inner_crdpt"], i["in_val"]
    )


BUILDERS: dict[str, _Builder] = {
    "compressed_level_scanner": lambda n, p, i: CompressedScanner(
        n, _p(p, "seg"), _p(p, "crd"), i["in_ref"], i.get("in_crd_skip")
    ),
    "uncompressed_level_scanner": lambda n, p, i: UncompressedScanner(n, _p(p, "dim"), i["in_ref"]),
    "intersect2": _joiner(Intersect),
    "union2": _joiner(Union),
    "repeat_signal_generator": lambda n, p, i: RepeatSigGen(n, i["in_stream"]),
    "repeat": lambda n, p, i: Repeat(n, i["in_ref"], i["in_repeat"]),
    "reduce": lambda n, p, i: Reduce(n, i["in_val"]),
    "sparse_accumulator1": _spacc(1),
    "sparse_accumulator2": _spacc(2),
    "coordinate_dropper": lambda n, p, i: CrdDrop(n, i["in_outer_crd"], i["in_inner_crd"]),
    "coordinate_holder": lambda n, p, i: CrdHold(n, i["in_outer_crd"], i["in_inner_crd"]),
    "compressed_level_writer": lambda n, p, i: CompressedWriter(n, i["in_crd"]),
    "uncompressed_level_writer": lambda n, p, i: UncompressedWriter(n, _p(p, "dim"), i["in_crd"]),
    "values_writer": lambda n, p, i: ValsWriter(n, i["in_val"]),
    "array_read": lambda n, p, i: ArrayRead(n, _p(p, "arr"), i["in_ref"]),
    "add2": _alu("add"),
    "multiply2": _alu("mul"),
    "sub2": _alu("sub"),
    "divide2": _alu("div"),
    "max2": _alu("max"),
}
"""Record primitive ids and how each is built from its params and input channels."""


@dataclass(frozen=True, slots=True)
class Replayed:
    """One record replayed.

    ``streams`` holds the produced streams; ``per_cycle`` each output port's stream cycle by
    cycle (``""`` where nothing was sent) from the first cycle an input was visible.
    """

    streams: Streams
    per_cycle: Streams
    cycles: int


def _tokens(stream: list[SamToken], where: str) -> list[Token | None]:
    try:
        return [None if x == "" else from_sam(x) for x in stream]
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def replay_record(
    record: Mapping[str, Any],
    depth: int | None = None,
    latency: int = LATENCY,
    sink: Callable[[str, Channel], Sink] = Sink,
) -> Replayed:
    """Run one record under the replay protocol.

    For stall tests, ``depth``, ``latency`` and ``sink`` change the FIFO depth (``None``:
    unbounded), the channel latency and how the output ports are drained.

    Raises:
        ValueError: for an unknown primitive, a missing input port or param, or a malformed
            token (the message names the record's ``source``).
    """
    where = str(record.get("source", record.get("primitive", "record")))
    kind = record.get("primitive")
    if kind not in BUILDERS:
        raise ValueError(expected(where, "primitive", ", ".join(sorted(BUILDERS)), kind))
    inputs = dict(record.get("inputs", {}))
    net = Network(depth=depth, latency=latency)
    chans = {
        port: net.source(f"in {port}", _tokens(list(s), f"{where}: {port}"), timed=True)
        for port, s in inputs.items()
    }
    try:
        prim = net.add(BUILDERS[kind](kind, dict(record.get("params", {})), chans))
    except KeyError as e:
        raise ValueError(expected(where, "input port", "present", f"missing {e}")) from None
    unread = [port for port in inputs if port not in prim.inputs]
    if unread:
        raise ValueError(expected(where, "input port", ", ".join(prim.inputs), unread[0]))
    outs = {port: net.wire(prim, port) for port in prim.outputs}
    for port, ch in outs.items():
        net.add(sink(port, ch))
    cycles = run(net, until=lambda: prim.done and not any(len(c) for c in outs.values()))
    last = max((t for c in outs.values() for t in c.times), default=latency - 1)
    streams: Streams = {}
    per_cycle: Streams = {}
    for port, ch in outs.items():
        streams[port] = [to_sam(t) for t in ch.log]
        row: list[SamToken] = [""] * (last - latency + 1)
        for tok, t in zip(ch.log, ch.times, strict=True):
            row[t - latency] = to_sam(tok)
        per_cycle[port] = row
    if isinstance(prim, CompressedWriter):
        streams = {"crd_arr": list(prim.crd_arr), "seg_arr": list(prim.seg_arr)}
    elif isinstance(prim, ValsWriter):
        streams = {"vals": list(prim.vals)}
    return Replayed(streams, per_cycle, cycles)


def replay(record: Mapping[str, Any]) -> Streams:
    """The streams one record produces, ``{port: [tokens]}`` in SAM's spelling."""
    return replay_record(record).streams


def same_tokens(got: list[SamToken], want: list[SamToken]) -> bool:
    """Token-for-token equality; numbers compare numerically (``95.0 == 95``)."""
    if len(got) != len(want):
        return False
    for g, w in zip(got, want, strict=True):
        if isinstance(g, int | float) and isinstance(w, int | float):
            if not math.isclose(g, w, rel_tol=1e-9, abs_tol=1e-12):
                return False
        elif g != w:
            return False
    return True


def mismatches(record: Mapping[str, Any], done: Replayed) -> list[str]:
    """The expected ports whose produced stream differs (per cycle for cycle-exact records)."""
    bad = []
    for port, want in dict(record.get("expected", {})).items():
        got = done.streams.get(port)
        if got is None or not same_tokens(got, list(want)):
            bad.append(port)
        elif record.get("cycle_exact") and not same_tokens(done.per_cycle[port], list(want)):
            bad.append(f"{port} (cycles)")
    return bad
