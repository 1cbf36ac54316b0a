"""The primitive base class (ports, backpressure, firing), and the sources and sinks of a network.

Every primitive reads the heads of its input channels and, when it fires, consumes at most one
token per input and sends at most one token per output port (to every channel of that port: a
port with several channels is a broadcast). It fires only when every output port has room in
all its channels: that is the backpressure, owned here so that no primitive repeats it. A
primitive that needs a token that has not arrived waits; none reads a channel it has not peeked.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque

from fusekit.errors import expected
from fusekit.sparse.sim.channel import Channel
from fusekit.sparse.sim.tokens import DONE, Stop, Token


class Primitive(ABC):
    """Base: named input channels, named output ports (each fanned out to several channels)."""

    kind = "primitive"

    def __init__(self, name: str, inputs: dict[str, Channel], outputs: tuple[str, ...]) -> None:
        self.name = name
        self.inputs = inputs
        self.outputs: dict[str, list[Channel]] = {port: [] for port in outputs}
        self.done = False
        self.firings = 0

    def connect(self, port: str, channel: Channel) -> Channel:
        """Send output ``port`` into ``channel`` too; returns it."""
        if port not in self.outputs:
            raise ValueError(expected(self.name, "output port", ", ".join(self.outputs), port))
        self.outputs[port].append(channel)
        return channel

    def peek(self, port: str, now: int) -> Token | None:
        """The head of input ``port`` if it has arrived."""
        return self.inputs[port].peek(now)

    def pop(self, port: str) -> Token:
        """Consume the head of input ``port``."""
        return self.inputs[port].pop()

    def ready(self) -> bool:
        """Whether every channel of every output port has room for one token."""
        return all(ch.can_push() for chans in self.outputs.values() for ch in chans)

    def emit(self, port: str, token: Token, now: int) -> None:
        """Send ``token`` on every channel of output ``port``."""
        for ch in self.outputs[port]:
            ch.push(token, now)

    def step(self, now: int) -> bool:
        """Fire once if the outputs have room; returns whether anything moved."""
        if self.done or not self.ready():
            return False
        fired = self._fire(now)
        self.firings += int(fired)
        return fired

    @abstractmethod
    def _fire(self, now: int) -> bool:
        """Consume and issue at most one token per port this cycle; whether anything moved."""

    def _malformed(self, what: str, got: object) -> ValueError:
        return ValueError(expected(self.name, "input stream", what, got))


def closing_stop(head: Token | None) -> Stop | None:
    """The stop that closes a fiber, given the head of the reference stream after it.

    ``S(k+1)`` when the head is ``S(k)`` (which the caller absorbs), ``S0`` before anything else;
    ``None`` while the head has not arrived (the caller waits).
    """
    if head is None:
        return None
    return Stop(head.level + 1) if isinstance(head, Stop) else Stop(0)


class Source(Primitive):
    """Sends a token list, one token per cycle as room allows.

    With ``timed``, element ``t`` goes at cycle ``t`` (later when the channel is full) and
    ``None`` is an idle cycle: the replay protocol of SAM's unit tests.
    """

    kind = "source"

    def __init__(self, name: str, tokens: list[Token | None], timed: bool = False) -> None:
        super().__init__(name, {}, ("out",))
        self.tokens: deque[Token | None] = deque(
            tokens if timed else [t for t in tokens if t is not None]
        )
        self.timed = timed
        self.done = not self.tokens

    def _fire(self, now: int) -> bool:
        tok = self.tokens.popleft()
        if tok is not None:
            self.emit("out", tok, now)
        self.done = not self.tokens
        return True


class Sink(Primitive):
    """Consumes a stream and keeps it (``tokens``, with the cycle each arrived); done at ``D``."""

    kind = "sink"

    def __init__(self, name: str, stream: Channel) -> None:
        super().__init__(name, {"in": stream}, ())
        self.tokens: list[Token] = []
        self.cycles: list[int] = []

    def _fire(self, now: int) -> bool:
        tok = self.peek("in", now)
        if tok is None:
            return False
        self.tokens.append(self.pop("in"))
        self.cycles.append(now)
        self.done = tok is DONE
        return True
