"""Repeaters and coordinate managers: repeat-signal generator, repeat, locate, hold and drop.

A repeat broadcasts each reference of its ``in_ref`` stream to the shape of the stream that made
its repeat signals: the held reference is emitted once per ``R``; ``S`` closes it with
``S(k+1)`` when the next reference is ``S(k)`` (absorbed), else ``S0``; a reference stop paired
with ``S`` becomes ``S(k+1)``; ``D`` with ``D`` ends. A repeat also reads a coordinate stream
directly as its signals (data is ``R``, any stop is ``S``): that is SAM's repeat-signal
generator fused in front of it.
"""

from __future__ import annotations

from fusekit.sparse.sim.base import Primitive, closing_stop
from fusekit.sparse.sim.channel import Channel
from fusekit.sparse.sim.tokens import ADVANCE, DONE, EMPTY, REPEAT, Stop, Token, is_data


def signal(tok: Token) -> Token:
    """A stream token's repeat signal: data and ``N`` are ``R``, stops ``S``, ``D`` is ``D``."""
    if tok is DONE or tok is REPEAT or tok is ADVANCE:
        return tok
    return ADVANCE if isinstance(tok, Stop) else REPEAT


class RepeatSigGen(Primitive):
    """A stream in, its repeat signals out (one per token)."""

    kind = "repsiggen"

    def __init__(self, name: str, in_stream: Channel) -> None:
        super().__init__(name, {"in_stream": in_stream}, ("out_repeat",))

    def _fire(self, now: int) -> bool:
        tok = self.peek("in_stream", now)
        if tok is None:
            return False
        self.pop("in_stream")
        self.emit("out_repeat", signal(tok), now)
        self.done = tok is DONE
        return True


class _Repeating(Primitive):
    """Holds the current reference of ``ref_port`` and answers one repeat signal per cycle."""

    def __init__(
        self, name: str, inputs: dict[str, Channel], outputs: tuple[str, ...], ref_port: str
    ) -> None:
        super().__init__(name, inputs, outputs)
        self.ref_port = ref_port
        self.held: Token | None = None

    def _answer(self, sig: Token, now: int) -> Token | None:
        """The token a repeat emits for ``sig``; ``None`` while what it needs has not arrived."""
        if self.held is None:
            self.held = self.peek(self.ref_port, now)
            if self.held is None:
                return None
            self.pop(self.ref_port)
        held = self.held
        if sig is REPEAT:
            if not is_data(held):
                raise self._malformed("a reference for every R", held)
            return held
        if sig is DONE:
            if held is not DONE:
                raise self._malformed("D on both inputs together", held)
            self.done = True
            return DONE
        if isinstance(held, Stop):
            self.held = None
            return Stop(held.level + 1)
        if held is DONE:
            raise self._malformed("a reference before D", sig)
        head = self.peek(self.ref_port, now)
        stop = closing_stop(head)
        if stop is None:
            return None
        if isinstance(head, Stop):
            self.pop(self.ref_port)
        self.held = None
        return stop


class Repeat(_Repeating):
    """``in_ref`` broadcast per repeat signal of ``in_repeat`` (or per token of a crd stream)."""

    kind = "repeater"

    def __init__(self, name: str, in_ref: Channel, in_repeat: Channel) -> None:
        super().__init__(name, {"in_ref": in_ref, "in_repeat": in_repeat}, ("out_ref",), "in_ref")

    def _fire(self, now: int) -> bool:
        sig = self.peek("in_repeat", now)
        if sig is None:
            return False
        out = self._answer(signal(sig), now)
        if out is None:
            return False
        self.pop("in_repeat")
        self.emit("out_ref", self._out_token(out, sig), now)
        return True

    def _out_token(self, out: Token, sig: Token) -> Token:
        """What is sent for the answer ``out`` to ``sig`` (the held reference itself)."""
        return out


class Locator(Repeat):
    """A dense level located by coordinate (a fusekit primitive; SAM scans dense levels).

    The parent reference ``r`` is held per coordinate ``c`` of ``in_crd``, and ``r * size + c``
    is sent: the position of ``c`` in the dense level under ``r`` (``N`` stays ``N``).
    """

    kind = "locator"

    def __init__(self, name: str, size: int, in_ref: Channel, in_crd: Channel) -> None:
        super().__init__(name, in_ref, in_crd)
        self.size = size

    def _out_token(self, out: Token, sig: Token) -> Token:
        if not is_data(out) or out is EMPTY or sig is EMPTY:
            return out
        return int(out) * self.size + int(sig)  # type: ignore[arg-type]


class CrdHold(_Repeating):
    """The outer coordinate held next to each inner coordinate (outer repeated per inner crd).

    ``out_outer_crd`` is the outer stream repeated by the inner stream's signals; ``out_inner_crd``
    passes the inner stream through, token for token alongside it.
    """

    kind = "crdhold"

    def __init__(self, name: str, in_outer_crd: Channel, in_inner_crd: Channel) -> None:
        super().__init__(
            name,
            {"in_outer_crd": in_outer_crd, "in_inner_crd": in_inner_crd},
            ("out_outer_crd", "out_inner_crd"),
            "in_outer_crd",
        )

    def _fire(self, now: int) -> bool:
        inner = self.peek("in_inner_crd", now)
        if inner is None:
            return False
        out = self._answer(signal(inner), now)
        if out is None:
            return False
        self.pop("in_inner_crd")
        self.emit("out_outer_crd", out, now)
        self.emit("out_inner_crd", inner, now)
        return True


class CrdDrop(Primitive):
    """Drops outer coordinates whose inner fiber is empty; the inner stream passes unchanged.

    An outer coordinate is sent with the first coordinate of its inner fiber (so the dropper
    never buffers a fiber); an inner ``S(k>=1)`` closes its outer coordinate and then passes the
    outer ``S(k-1)`` that follows it; an inner stop met by an outer stop (an empty outer fiber)
    passes that stop. With ``vals=True`` the inner stream is the values aligned with the outer
    coordinates, token for token, and a coordinate whose value is 0 is dropped with its value.
    """

    kind = "crddrop"

    def __init__(
        self, name: str, in_outer_crd: Channel, in_inner_crd: Channel, vals: bool = False
    ) -> None:
        super().__init__(
            name,
            {"in_outer_crd": in_outer_crd, "in_inner_crd": in_inner_crd},
            ("out_outer_crd", "out_inner_crd"),
        )
        self.vals = vals
        self.sent_outer = False
        self.outer_stop_due = False

    def _fire(self, now: int) -> bool:
        outer = self.peek("in_outer_crd", now)
        if self.outer_stop_due:
            if outer is None:
                return False
            if not isinstance(outer, Stop):
                raise self._malformed("an outer stop after an inner S(k>=1)", outer)
            self.emit("out_outer_crd", self.pop("in_outer_crd"), now)
            self.outer_stop_due = False
            return True
        inner = self.peek("in_inner_crd", now)
        if inner is None or outer is None:
            return False
        if self.vals:
            return self._fire_vals(outer, inner, now)
        self.pop("in_inner_crd")
        self.emit("out_inner_crd", inner, now)
        if is_data(inner):
            if not is_data(outer):
                raise self._malformed("an outer coordinate for every inner fiber", outer)
            if not self.sent_outer:
                self.emit("out_outer_crd", outer, now)
                self.sent_outer = True
            return True
        if inner is DONE or not is_data(outer):
            if (inner is DONE) != (outer is DONE):
                raise self._malformed("D on both inputs together", (outer, inner))
            self.emit("out_outer_crd", self.pop("in_outer_crd"), now)
            self.done = inner is DONE
            return True
        assert isinstance(inner, Stop)
        self.pop("in_outer_crd")
        self.sent_outer = False
        self.outer_stop_due = inner.level >= 1
        return True

    def _fire_vals(self, outer: Token, val: Token, now: int) -> bool:
        self.pop("in_inner_crd")
        self.pop("in_outer_crd")
        if is_data(outer) != is_data(val) or (not is_data(val) and outer != val):
            raise self._malformed("values aligned with the coordinates", (outer, val))
        if not is_data(val) or (val is not EMPTY and val != 0):
            self.emit("out_outer_crd", outer, now)
            self.emit("out_inner_crd", val, now)
        self.done = val is DONE
        return True
