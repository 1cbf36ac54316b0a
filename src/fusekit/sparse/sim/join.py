"""Coordinate joiners: intersect and union of two (crd, ref) streams of equal fiber structure.

Both walk two sorted fibers together, one step per cycle. Matching stops are emitted on every
output (an empty intersection still closes its fiber); ``D`` with ``D`` ends the join.

``N`` (an absent fiber) joins as the empty set: the intersecter drains the other side's fiber and
emits one ``N`` in its place (so arrays downstream read 0, as in SAM); the unioner skips it, or
emits ``N`` when both sides are absent.

The intersecter's skip outputs tell each side's scanner where the other side stands: when it
steps past side 1's coordinate it emits side 2's coordinate on ``out_crd_skip1`` (once per new
coordinate of side 2), and symmetrically; at matching stops each side gets the other's stop if
the other side moved since its last hint. Hints are advisory and travel against the data, so
they never hold the intersecter back (a loop of two bounded FIFOs would deadlock): an integer
hint that finds its FIFO full is dropped, and a stop hint, which the scanner counts to tell
fibers apart, waits in the intersecter until there is room, with no integer hint passing it.
"""

from __future__ import annotations

from collections import deque

from fusekit.sparse.sim.base import Primitive
from fusekit.sparse.sim.channel import Channel
from fusekit.sparse.sim.tokens import DONE, EMPTY, Stop, Token, is_data, is_number

_INPUTS = ("in_crd1", "in_ref1", "in_crd2", "in_ref2")


class _Joiner(Primitive):
    """Two (crd, ref) operands in; ``OUTPUTS`` out."""

    OUTPUTS: tuple[str, ...] = ("out_crd", "out_ref1", "out_ref2")

    def __init__(
        self, name: str, in_crd1: Channel, in_ref1: Channel, in_crd2: Channel, in_ref2: Channel
    ) -> None:
        channels = (in_crd1, in_ref1, in_crd2, in_ref2)
        super().__init__(name, dict(zip(_INPUTS, channels, strict=True)), self.OUTPUTS)

    def _heads(self, now: int) -> tuple[Token, Token, Token, Token] | None:
        heads = [self.peek(p, now) for p in _INPUTS]
        if any(h is None for h in heads):
            return None
        c1, r1, c2, r2 = heads
        assert c1 is not None and r1 is not None and c2 is not None and r2 is not None
        return c1, r1, c2, r2

    def _take(self, side: int) -> None:
        self.pop(f"in_crd{side}")
        self.pop(f"in_ref{side}")

    def _out(self, crd: Token, ref1: Token, ref2: Token, now: int) -> None:
        self.emit("out_crd", crd, now)
        self.emit("out_ref1", ref1, now)
        self.emit("out_ref2", ref2, now)

    def _control(self, c1: Token, c2: Token, now: int) -> bool:
        """Matching stops or done: forward on every output; mismatched control raises."""
        if c1 != c2:
            raise self._malformed("streams with the same fiber structure", (c1, c2))
        self._take(1)
        self._take(2)
        self._out(c1, c1, c1, now)
        self.done = c1 is DONE
        return True


class Intersect(_Joiner):
    """Coordinates present in both streams, with each side's reference; skip hints out."""

    kind = "intersecter"
    OUTPUTS = ("out_crd", "out_ref1", "out_ref2", "out_crd_skip1", "out_crd_skip2")

    def __init__(
        self, name: str, in_crd1: Channel, in_ref1: Channel, in_crd2: Channel, in_ref2: Channel
    ) -> None:
        super().__init__(name, in_crd1, in_ref1, in_crd2, in_ref2)
        self.moved = [True, True]  # side k's head changed since the other side's last hint
        self.owed: tuple[deque[Token], deque[Token]] = (deque(), deque())  # stop hints per side
        self.hinted = [False, False]  # a hint went out on that side this cycle

    _DATA = ("out_crd", "out_ref1", "out_ref2")

    def ready(self) -> bool:
        """Only the data outputs hold the intersecter back (hints are advisory)."""
        return all(ch.can_push() for p in self._DATA for ch in self.outputs[p])

    def _room(self, side: int) -> bool:
        chans = self.outputs[f"out_crd_skip{side}"]
        return not self.hinted[side - 1] and all(ch.can_push() for ch in chans)

    def _hint(self, side: int, tok: Token, now: int) -> None:
        """Send a hint to side ``side``'s scanner, or owe it (a stop) or drop it (an integer)."""
        owed = self.owed[side - 1]
        if isinstance(tok, Stop):
            owed.append(tok)
            self._pay(side, now)
        elif not owed and self._room(side):
            self.emit(f"out_crd_skip{side}", tok, now)
            self.hinted[side - 1] = True

    def _pay(self, side: int, now: int) -> None:
        owed = self.owed[side - 1]
        if owed and self._room(side):
            self.emit(f"out_crd_skip{side}", owed.popleft(), now)
            self.hinted[side - 1] = True

    def step(self, now: int) -> bool:
        """Fire as usual; owed stop hints go out even while the data outputs are full."""
        self.hinted = [False, False]
        for side in (1, 2):
            self._pay(side, now)
        return super().step(now)

    def _step_past(self, side: int, other: Token, now: int) -> bool:
        """Drop side ``side``'s head; hint it the other side's head if that one moved."""
        if self.moved[2 - side]:
            self._hint(side, other, now)
        self.moved[2 - side] = False
        self.moved[side - 1] = True
        self._take(side)
        return True

    def _fire(self, now: int) -> bool:
        heads = self._heads(now)
        if heads is None:
            return False
        c1, r1, c2, r2 = heads
        if c1 is EMPTY or c2 is EMPTY:
            if (c1 is EMPTY and c2 is EMPTY) or not is_data(c1) or not is_data(c2):
                for side, c in ((1, c1), (2, c2)):
                    if c is EMPTY:
                        self._take(side)
                self._out(EMPTY, EMPTY, EMPTY, now)
                return True
            self._take(1 if c2 is EMPTY else 2)  # drain the present side's fiber
            return True
        if is_data(c1) and is_data(c2):
            if c1 == c2:
                self._take(1)
                self._take(2)
                self._out(c1, r1, r2, now)
                self.moved = [True, True]
                return True
            return self._step_past(1, c2, now) if c1 < c2 else self._step_past(2, c1, now)  # type: ignore[operator]
        if is_data(c1):
            return self._step_past(1, c2, now)
        if is_data(c2):
            return self._step_past(2, c1, now)
        if isinstance(c1, Stop) and c1 == c2:
            if self.moved[0]:
                self._hint(2, c1, now)
            if self.moved[1]:
                self._hint(1, c2, now)
            self.moved = [True, True]
        return self._control(c1, c2, now)


class JoinN(Primitive):
    """An intersect or union of ``n >= 2`` (crd, ref) streams with equal fiber structure.

    SAM's generated tests join three operands in one block (``mat_elemadd3``: ``set_in3``,
    ``out_ref3``). :class:`Union` is the case ``n = 2``; :class:`Intersect` is the two-operand
    intersecter with skip outputs. Ports ``in_crd<k>``, ``in_ref<k>``, ``out_crd``,
    ``out_ref<k>`` for k = 1..n. ``N`` (an absent fiber) joins as the empty set: the unioner
    skips it (or sends ``N`` when every side is absent); the intersecter drains the other sides
    and sends one ``N`` in the fiber's place.
    """

    def __init__(self, name: str, union: bool, crds: list[Channel], refs: list[Channel]) -> None:
        n = len(crds)
        inputs = {f"in_crd{k + 1}": c for k, c in enumerate(crds)}
        inputs.update({f"in_ref{k + 1}": r for k, r in enumerate(refs)})
        outputs = ("out_crd", *(f"out_ref{k + 1}" for k in range(n)))
        super().__init__(name, inputs, outputs)
        self.kind = "unioner" if union else "intersecter"
        self.n = n
        self.union = union
        self.absent = False

    def _take(self, k: int) -> None:
        self.pop(f"in_crd{k + 1}")
        self.pop(f"in_ref{k + 1}")

    def _out(self, crd: Token, refs: list[Token], now: int) -> None:
        self.emit("out_crd", crd, now)
        for k, r in enumerate(refs):
            self.emit(f"out_ref{k + 1}", r, now)

    def _fire(self, now: int) -> bool:
        heads = [self.peek(f"in_crd{k + 1}", now) for k in range(self.n)]
        refs = [self.peek(f"in_ref{k + 1}", now) for k in range(self.n)]
        if any(h is None for h in heads) or any(r is None for r in refs):
            return False
        data = [k for k, h in enumerate(heads) if is_number(h)]  # type: ignore[arg-type]
        empty = [k for k, h in enumerate(heads) if h is EMPTY]
        if not data and not empty:  # stops or done on every side
            if self.absent:
                self.absent = False
                self._out(EMPTY, [EMPTY] * self.n, now)
                return True
            if any(h != heads[0] for h in heads):
                raise self._malformed("streams with the same fiber structure", heads)
            for k in range(self.n):
                self._take(k)
            tok = heads[0]
            assert tok is not None
            self._out(tok, [tok] * self.n, now)
            self.done = tok is DONE
            return True
        if empty:
            for k in empty:
                self._take(k)
            if self.union and len(empty) == self.n:
                self._out(EMPTY, [EMPTY] * self.n, now)
            self.absent = self.absent or not self.union
            return True
        crds = {k: heads[k] for k in data}
        if self.union:
            low = min(crds.values())  # type: ignore[type-var]
            out: list[Token] = []
            for k in range(self.n):
                if k in crds and crds[k] == low:
                    out.append(refs[k])  # type: ignore[arg-type]
                    self._take(k)
                else:
                    out.append(EMPTY)
            self._out(low, out, now)  # type: ignore[arg-type]
            return True
        if len(data) == self.n and len(set(crds.values())) == 1 and not self.absent:
            for k in range(self.n):
                self._take(k)
            self._out(heads[0], refs, now)  # type: ignore[arg-type]
            return True
        high = max(crds.values()) if len(data) == self.n else None  # type: ignore[type-var]
        for k in data:
            if high is None or self.absent or crds[k] != high:
                self._take(k)
        return True


class Union(JoinN):
    """Coordinates present in either of two streams; the side that lacks one gets ``N``."""

    def __init__(
        self, name: str, in_crd1: Channel, in_ref1: Channel, in_crd2: Channel, in_ref2: Channel
    ) -> None:
        super().__init__(name, True, [in_crd1, in_crd2], [in_ref1, in_ref2])
