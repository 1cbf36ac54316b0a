"""The per-cycle engine: every primitive may fire once per cycle, channels are FIFOs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fusekit.errors import expected
from fusekit.sparse.sim.base import Primitive, Source
from fusekit.sparse.sim.channel import Channel
from fusekit.sparse.sim.tokens import Token


@dataclass
class Network:
    """Primitives and the channels between them, built in dataflow order.

    ``depth`` is every channel's FIFO depth (``None``: unbounded), ``latency`` its delivery time.
    """

    depth: int | None = 8
    latency: int = 1
    prims: list[Primitive] = field(default_factory=list)
    channels: list[Channel] = field(default_factory=list)

    def channel(self, name: str) -> Channel:
        """A new channel with the network's depth and latency."""
        ch = Channel(name, self.depth, self.latency)
        self.channels.append(ch)
        return ch

    def add(self, prim: Primitive) -> Primitive:
        """Register a primitive (in dataflow order)."""
        self.prims.append(prim)
        return prim

    def wire(self, prim: Primitive, port: str, name: str | None = None) -> Channel:
        """A new channel fed by ``prim``'s output ``port`` (call again for a broadcast)."""
        return prim.connect(port, self.channel(name or f"{prim.name}.{port}"))

    def source(self, name: str, tokens: list[Token | None], timed: bool = False) -> Channel:
        """A source of fixed tokens and its channel (``timed``: one element a cycle)."""
        src = Source(name, tokens, timed)
        self.add(src)
        return self.wire(src, "out")


def run(net: Network, max_cycles: int = 10_000_000, until: Callable[[], bool] | None = None) -> int:
    """Run until every primitive is done (or ``until()`` holds).

    Primitives are stepped consumers first each cycle, so a FIFO emptied by its consumer in a
    cycle can take its producer's token in the same cycle (a pipelined FIFO).

    Returns:
        The number of cycles.

    Raises:
        RuntimeError: if the network deadlocks (nothing moves for longer than a channel's
            latency while some primitive is not done) or exceeds ``max_cycles``.
    """
    order = list(reversed(net.prims))
    finished = until or (lambda: all(p.done for p in net.prims))
    idle = 0
    for cycle in range(max_cycles):
        if finished():
            return cycle
        fired = [p.step(cycle) for p in order]
        idle = 0 if any(fired) else idle + 1
        if idle > net.latency + 2:
            stuck = [p.name for p in net.prims if not p.done]
            raise RuntimeError(f"sparse engine: deadlock at cycle {cycle}; waiting: {stuck}")
    raise RuntimeError(expected("sparse engine", "cycles", f"at most {max_cycles}", "more"))
