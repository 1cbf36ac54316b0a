"""The streaming primitives, one small class each, one firing per cycle (SAM's step semantics).

Every primitive reads the heads of its input channels and, when it fires, consumes at most one
token per input and sends at most one token per output (to every channel of that output).
It fires only when every output it would write has room: that is the backpressure.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Any

from fusekit.sparse.formats import LevelKind, StoredLevel
from fusekit.sparse.sim.channel import Channel
from fusekit.sparse.sim.tokens import DONE, EMPTY, Stop, Token, is_data


class Primitive(ABC):
    """Base: named input channels, named outputs (each fanned out to several channels)."""

    kind = "primitive"

    def __init__(self, name: str, inputs: dict[str, Channel], outputs: tuple[str, ...]) -> None:
        self.name = name
        self.inputs = inputs
        self.outputs: dict[str, list[Channel]] = {port: [] for port in outputs}
        self.done = False
        self.firings = 0

    def connect(self, port: str, channel: Channel) -> Channel:
        """Send output ``port`` into ``channel`` too; returns it."""
        self.outputs[port].append(channel)
        return channel

    def peek(self, port: str, now: int) -> Token | None:
        """The head of input ``port`` if it has arrived."""
        return self.inputs[port].peek(now)

    def pop(self, port: str) -> Token:
        """Consume the head of input ``port``."""
        return self.inputs[port].pop()

    def ready(self, *ports: str) -> bool:
        """Whether every channel of the given outputs has room."""
        return all(ch.can_push() for p in ports for ch in self.outputs[p])

    def emit(self, port: str, token: Token, now: int) -> None:
        """Send ``token`` on every channel of output ``port``."""
        for ch in self.outputs[port]:
            ch.push(token, now)

    def step(self, now: int) -> bool:
        """Fire once if possible; returns whether it fired."""
        if self.done:
            return False
        fired = self._fire(now)
        self.firings += int(fired)
        return fired

    @abstractmethod
    def _fire(self, now: int) -> bool:
        """Issue at most one token per output this cycle; whether anything moved."""


class LevelScanner(Primitive):
    """References in, a level's fibers out: ``crd`` and ``ref`` (child positions).

    After a fiber it sends ``S0``, or ``S(k+1)`` in place of an input ``S(k)`` that follows it.
    """

    kind = "scanner"

    def __init__(self, name: str, level: StoredLevel, ref: Channel) -> None:
        super().__init__(name, {"ref": ref}, ("crd", "ref"))
        self.level = level
        self.fiber: list[tuple[int, int]] | None = None
        self.k = 0

    def _fibers(self, ref: Token) -> list[tuple[int, int]]:
        if ref is EMPTY:
            return []
        r = int(ref)  # type: ignore[arg-type]
        lv = self.level
        if lv.kind is LevelKind.DENSE:
            return [(c, r * lv.size + c) for c in range(lv.size)]
        assert lv.crd is not None
        if lv.kind is LevelKind.SINGLETON:
            return [(int(lv.crd[r]), r)]
        assert lv.seg is not None
        return [(int(lv.crd[p]), p) for p in range(int(lv.seg[r]), int(lv.seg[r + 1]))]

    def _fire(self, now: int) -> bool:
        if not self.ready("crd", "ref"):
            return False
        if self.fiber is not None and self.k < len(self.fiber):
            c, r = self.fiber[self.k]
            self.emit("crd", c, now)
            self.emit("ref", r, now)
            self.k += 1
            return True
        tok = self.peek("ref", now)
        if tok is None:
            return False
        if self.fiber is not None:
            stop = Stop(self.pop("ref").level + 1) if isinstance(tok, Stop) else Stop(0)  # type: ignore[union-attr]
            self._both(stop, now)
            self.fiber = None
            return True
        self.pop("ref")
        if tok is DONE:
            self._both(DONE, now)
            self.done = True
        elif isinstance(tok, Stop):
            self._both(Stop(tok.level + 1), now)
        else:
            self.fiber, self.k = self._fibers(tok), 0
            if self.fiber:
                return self._fire_first(now)
        return True

    def _fire_first(self, now: int) -> bool:
        assert self.fiber is not None
        c, r = self.fiber[0]
        self.emit("crd", c, now)
        self.emit("ref", r, now)
        self.k = 1
        return True

    def _both(self, tok: Token, now: int) -> None:
        self.emit("crd", tok, now)
        self.emit("ref", tok, now)


class Repeater(Primitive):
    """Repeats each reference once per coordinate of the matching fiber of ``repsig``."""

    kind = "repeater"

    def __init__(self, name: str, ref: Channel, repsig: Channel) -> None:
        super().__init__(name, {"ref": ref, "repsig": repsig}, ("ref",))
        self.drop_stop = False

    def _fire(self, now: int) -> bool:
        if self.drop_stop:
            head = self.peek("ref", now)
            if head is None:
                return False
            if isinstance(head, Stop):
                self.pop("ref")
            self.drop_stop = False
        sig, r = self.peek("repsig", now), self.peek("ref", now)
        if sig is None or r is None or not self.ready("ref"):
            return False
        self.pop("repsig")
        if is_data(sig):
            self.emit("ref", r, now)
        elif isinstance(sig, Stop):
            self.emit("ref", sig, now)
            self.pop("ref")
            self.drop_stop = sig.level >= 1
        else:
            self.emit("ref", DONE, now)
            self.done = True
        return True


class Locator(Repeater):
    """A dense level indexed by coordinates (no scan of the level).

    Repeats the parent reference per coordinate of ``repsig`` and sends ``ref * size + crd``.
    """

    kind = "locator"

    def __init__(self, name: str, size: int, ref: Channel, repsig: Channel) -> None:
        super().__init__(name, ref, repsig)
        self.size = size

    def emit(self, port: str, token: Token, now: int) -> None:
        """Send the located position instead of the parent reference."""
        if is_data(token) and token is not EMPTY and self._coord is not None:
            token = int(token) * self.size + self._coord  # type: ignore[arg-type]
        super().emit(port, token, now)

    def _fire(self, now: int) -> bool:
        sig = self.peek("repsig", now)
        self._coord = int(sig) if sig is not None and is_data(sig) and sig is not EMPTY else None  # type: ignore[arg-type]
        return super()._fire(now)


class Joiner(Primitive):
    """Intersecter or unioner of two (crd, ref) streams with equal fiber structure."""

    def __init__(
        self, name: str, union: bool, crd_a: Channel, ref_a: Channel, crd_b: Channel, ref_b: Channel
    ) -> None:
        super().__init__(
            name,
            {"crd_a": crd_a, "ref_a": ref_a, "crd_b": crd_b, "ref_b": ref_b},
            ("crd", "ref_a", "ref_b"),
        )
        self.union = union
        self.kind = "unioner" if union else "intersecter"

    def _take(self, side: str) -> Token:
        self.pop(f"crd_{side}")
        return self.pop(f"ref_{side}")

    def _fire(self, now: int) -> bool:
        a, b = self.peek("crd_a", now), self.peek("crd_b", now)
        refs = (self.peek("ref_a", now), self.peek("ref_b", now))
        if a is None or b is None or None in refs or not self.ready("crd", "ref_a", "ref_b"):
            return False
        if is_data(a) and is_data(b):
            if a == b:
                self._out(a, self._take("a"), self._take("b"), now)
            elif a < b:  # type: ignore[operator]
                ref = self._take("a")
                if self.union:
                    self._out(a, ref, EMPTY, now)
            else:
                ref = self._take("b")
                if self.union:
                    self._out(b, EMPTY, ref, now)
        elif is_data(a):
            ref = self._take("a")
            if self.union:
                self._out(a, ref, EMPTY, now)
        elif is_data(b):
            ref = self._take("b")
            if self.union:
                self._out(b, EMPTY, ref, now)
        else:
            self._take("a")
            self._take("b")
            self._out(a, a, a, now)
            self.done = a is DONE
        return True

    def _out(self, c: Token, ra: Token, rb: Token, now: int) -> None:
        self.emit("crd", c, now)
        self.emit("ref_a", ra, now)
        self.emit("ref_b", rb, now)


class Array(Primitive):
    """Reads a value per reference (``EMPTY`` reads 0); control tokens pass."""

    kind = "array"

    def __init__(self, name: str, values: Any, ref: Channel) -> None:
        super().__init__(name, {"ref": ref}, ("val",))
        self.values = values

    def _fire(self, now: int) -> bool:
        r = self.peek("ref", now)
        if r is None or not self.ready("val"):
            return False
        self.pop("ref")
        if is_data(r):
            self.emit("val", 0.0 if r is EMPTY else float(self.values[int(r)]), now)  # type: ignore[arg-type]
        else:
            self.emit("val", r, now)
            self.done = r is DONE
        return True


class ALU(Primitive):
    """An element-wise function of one or two aligned value streams."""

    kind = "alu"

    def __init__(self, name: str, fn: Callable[..., float], *vals: Channel) -> None:
        super().__init__(name, {f"in{k}": v for k, v in enumerate(vals)}, ("val",))
        self.fn = fn

    def _fire(self, now: int) -> bool:
        peeked = [self.peek(p, now) for p in self.inputs]
        heads = [h for h in peeked if h is not None]
        if len(heads) < len(peeked) or not self.ready("val"):
            return False
        for p in self.inputs:
            self.pop(p)
        if all(is_data(h) for h in heads):
            self.emit("val", float(self.fn(*(0.0 if h is EMPTY else h for h in heads))), now)
        else:
            ctrl = next(h for h in heads if not is_data(h))
            self.emit("val", ctrl, now)
            self.done = ctrl is DONE
        return True


class Reducer(Primitive):
    """Reduces each innermost fiber to one value; ``S(k)`` becomes value then ``S(k-1)``."""

    kind = "reducer"

    def __init__(self, name: str, val: Channel, op: str = "sum") -> None:
        super().__init__(name, {"val": val}, ("val",))
        self.op = op
        self.init = 0.0 if op == "sum" else float("-inf")
        self.acc = self.init
        self.pending: Token | None = None

    def _fire(self, now: int) -> bool:
        if not self.ready("val"):
            return False
        if self.pending is not None:
            self.emit("val", self.pending, now)
            self.done = self.pending is DONE
            self.pending = None
            return True
        tok = self.peek("val", now)
        if tok is None:
            return False
        self.pop("val")
        if is_data(tok):
            v = 0.0 if tok is EMPTY else float(tok)  # type: ignore[arg-type]
            self.acc = self.acc + v if self.op == "sum" else max(self.acc, v)
        elif isinstance(tok, Stop):
            self.emit("val", self.acc, now)
            self.acc = self.init
            if tok.level >= 1:
                self.pending = Stop(tok.level - 1)
        else:
            self.emit("val", DONE, now)
            self.done = True
        return True


class _Queued(Primitive):
    """A primitive that computes into per-output queues and drains one token per cycle."""

    def __init__(self, name: str, inputs: dict[str, Channel], outputs: tuple[str, ...]) -> None:
        super().__init__(name, inputs, outputs)
        self.queues: dict[str, deque[Token]] = {p: deque() for p in outputs}
        self.finished = False

    def _drain(self, now: int) -> bool:
        sent = False
        for port, q in self.queues.items():
            if q and self.ready(port):
                self.emit(port, q.popleft(), now)
                sent = True
        if self.finished and not any(self.queues.values()):
            self.done = True
        return sent

    def _fire(self, now: int) -> bool:
        sent = self._drain(now)
        if self.finished or any(len(q) > 64 for q in self.queues.values()):
            return sent
        return self._consume(now) or sent

    @abstractmethod
    def _consume(self, now: int) -> bool:
        """Read inputs and append results to the queues; whether anything was read."""


class CoordDropper(_Queued):
    """Drops outer coordinates whose inner fiber is empty (and the empty fibers' stops)."""

    kind = "dropper"

    def __init__(self, name: str, outer: Channel, inner: Channel) -> None:
        super().__init__(name, {"outer": outer, "inner": inner}, ("outer", "inner"))
        self.buf: list[Token] = []
        self.held: Stop | None = None

    def _consume(self, now: int) -> bool:
        tok = self.peek("inner", now)
        if tok is None:
            return False
        if is_data(tok):
            self.buf.append(self.pop("inner"))
            return True
        outer = self.peek("outer", now)
        if outer is None:
            return False
        self.pop("inner")
        if tok is DONE:
            if self.held is not None:
                self.queues["inner"].append(self.held)
            self.queues["inner"].append(DONE)
            self.queues["outer"].append(self.pop("outer"))
            self.finished = True
            return True
        assert isinstance(tok, Stop)
        coord = self.pop("outer")
        if self.buf:
            if self.held is not None:
                self.queues["inner"].append(self.held)
            self.queues["inner"].extend(self.buf)
            self.queues["outer"].append(coord)
            self.held = tok
        elif self.held is not None:
            self.held = Stop(max(self.held.level, tok.level))
        self.buf = []
        if tok.level >= 1:
            self.queues["outer"].append(Stop(tok.level - 1))
            self.pop("outer")
        return True


class SparseAccumulator(_Queued):
    """Order-1 sparse accumulator: sums values by inner coordinate over an outer reduced level.

    Input fibers of ``crd``/``val`` are one per reduced coordinate; ``S(k>=1)`` closes the
    reduction and flushes the sorted coordinates and sums, then ``S(k-1)``.
    """

    kind = "spacc"

    def __init__(self, name: str, crd: Channel, val: Channel) -> None:
        super().__init__(name, {"crd": crd, "val": val}, ("crd", "val"))
        self.acc: dict[int, float] = {}

    def _consume(self, now: int) -> bool:
        c, v = self.peek("crd", now), self.peek("val", now)
        if c is None or v is None:
            return False
        self.pop("crd")
        self.pop("val")
        if is_data(c):
            self.acc[int(c)] = self.acc.get(int(c), 0.0) + (0.0 if v is EMPTY else float(v))  # type: ignore[arg-type]
        elif isinstance(c, Stop) and c.level >= 1:
            for key in sorted(self.acc):
                self.queues["crd"].append(key)
                self.queues["val"].append(self.acc[key])
            self.acc = {}
            self.queues["crd"].append(Stop(c.level - 1))
            self.queues["val"].append(Stop(c.level - 1))
        elif c is DONE:
            self.queues["crd"].append(DONE)
            self.queues["val"].append(DONE)
            self.finished = True
        return True


class LevelWriter(Primitive):
    """Writes a coordinate stream as a compressed level (``seg``, ``crd``) or a value array."""

    kind = "writer"

    def __init__(self, name: str, stream: Channel) -> None:
        super().__init__(name, {"in": stream}, ())
        self.crd: list[float] = []
        self.seg: list[int] = [0]

    def _fire(self, now: int) -> bool:
        tok = self.peek("in", now)
        if tok is None:
            return False
        self.pop("in")
        if is_data(tok):
            self.crd.append(0.0 if tok is EMPTY else tok)  # type: ignore[arg-type]
        elif isinstance(tok, Stop):
            self.seg.append(len(self.crd))
        else:
            self.done = True
        return True


class Source(Primitive):
    """Sends a fixed token list (the root reference stream ``0, D``, or test inputs)."""

    kind = "source"

    def __init__(self, name: str, tokens: list[Token]) -> None:
        super().__init__(name, {}, ("out",))
        self.tokens = deque(tokens)

    def _fire(self, now: int) -> bool:
        if not self.tokens or not self.ready("out"):
            return False
        self.emit("out", self.tokens.popleft(), now)
        self.done = not self.tokens
        return True
