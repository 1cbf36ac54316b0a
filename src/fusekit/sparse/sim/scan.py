"""Level scanners: a reference stream in, one level's fibers out (SAM's read scanners).

For each reference ``r`` a scanner emits the coordinates of fiber ``r`` on ``out_crd`` and their
positions (the children's references) on ``out_ref``, one per cycle, then the fiber's closing
stop in the next cycle: ``S(k+1)`` when the next reference is ``S(k)`` (absorbed), else ``S0``.
An empty fiber costs exactly the cycle of its stop. A stop that no fiber absorbs is forwarded as
``S(k+1)``; ``N`` (an absent fiber) emits ``N`` and then the closing stop; ``D`` is forwarded.

A compressed scanner may take skip hints (``in_crd_skip``, from an intersecter): an integer hint
jumps within the current fiber to the first coordinate at or above it, a stop hint ends the fiber
early. Hints and outputs count stops to tell fibers apart: a hint for a fiber already closed,
or below the last coordinate emitted, is dropped; one hint is read per cycle, and a hint waits
until the scanner acts on it or its fiber closes. (SAM's scanner keeps a stop hint that arrives
in the cycle its fiber closes naturally, and then cuts the next fiber short.)
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import numpy as np

from fusekit.errors import expected
from fusekit.sparse.formats import LevelKind, StoredLevel
from fusekit.sparse.sim.base import Primitive, closing_stop
from fusekit.sparse.sim.channel import Channel
from fusekit.sparse.sim.tokens import DONE, EMPTY, Stop, Token

_IDLE, _FIBER, _CLOSE, _FINISHED = range(4)
_Step = tuple[bool, Token | None]


class Scanner(Primitive):
    """The scanning state machine shared by the compressed and the uncompressed scanner."""

    kind = "scanner"

    def __init__(self, name: str, in_ref: Channel, in_crd_skip: Channel | None = None) -> None:
        inputs = {"in_ref": in_ref} | (
            {"in_crd_skip": in_crd_skip} if in_crd_skip is not None else {}
        )
        super().__init__(name, inputs, ("out_crd", "out_ref"))
        self.state = _IDLE
        self.pos = self.end = self.base = 0
        self.prev_crd: int = 0
        self.skip: Token | None = None
        self.skip_stops = self.out_stops = 0  # stop hints read, stops sent: fiber counters
        self.skip_fiber = 0  # the fiber the pending hint belongs to

    @abstractmethod
    def _fiber(self, ref: int) -> tuple[int, int]:
        """Positions ``[start, end)`` of fiber ``ref``."""

    @abstractmethod
    def _crd(self, pos: int) -> int:
        """The coordinate at position ``pos`` of the current fiber."""

    def step(self, now: int) -> bool:
        """Fire as usual; once done, keep draining late skip hints (they no longer matter)."""
        if self.done and "in_crd_skip" in self.inputs:
            if self.peek("in_crd_skip", now) is not None:
                self.pop("in_crd_skip")
            return False
        return super().step(now)

    def _fire(self, now: int) -> bool:
        took = self._take_skip(now)
        moved, out = self._advance(now)
        if isinstance(out, Stop):
            self.out_stops += 1
            if self.skip_fiber < self.out_stops:
                self.skip = None  # the hint's fiber has closed
        elif isinstance(out, int):
            self.prev_crd = out
        return took or moved

    def _take_skip(self, now: int) -> bool:
        if "in_crd_skip" not in self.inputs or self.skip is not None:
            return False
        hint = self.peek("in_crd_skip", now)
        if hint is None:
            return False
        self.pop("in_crd_skip")
        if self.skip_stops < self.out_stops:
            pass  # a hint for a fiber already closed
        elif isinstance(hint, Stop) or (isinstance(hint, int) and hint >= self.prev_crd):
            self.skip, self.skip_fiber = hint, self.skip_stops
        if isinstance(hint, Stop):
            self.skip_stops += 1
        return True

    def _both(self, tok: Token, now: int) -> None:
        self.emit("out_crd", tok, now)
        self.emit("out_ref", tok, now)

    def _emit_pos(self, now: int) -> _Step:
        crd = self._crd(self.pos)
        self.emit("out_crd", crd, now)
        self.emit("out_ref", self.pos, now)
        self.state = _FIBER
        return True, crd

    def _close(self, now: int) -> _Step:
        head = self.peek("in_ref", now)
        stop = closing_stop(head)
        if stop is None:
            self.state = _CLOSE
            return False, None
        if isinstance(head, Stop):
            self.pop("in_ref")
        self._both(stop, now)
        self.state = _IDLE
        return True, stop

    def _skip_to(self, first: int, now: int) -> _Step | None:
        """Act on a pending hint from position ``first`` on; ``None`` when it changes nothing."""
        hint, self.skip = self.skip, None
        if isinstance(hint, Stop):
            return self._close(now)
        if not isinstance(hint, int) or hint <= self.prev_crd:
            return None
        for p in range(first, self.end):
            if self._crd(p) >= hint:
                self.pos = p
                return self._emit_pos(now)
        return self._close(now)

    def _advance(self, now: int) -> _Step:
        if self.state == _FINISHED:
            return False, None
        if self.state == _CLOSE:
            return self._close(now)
        if self.state == _FIBER:
            if self.pos >= self.end - 1:
                return self._close(now)
            if self.skip is not None:
                jumped = self._skip_to(self.pos + 1, now)
                if jumped is not None:
                    return jumped
            self.pos += 1
            return self._emit_pos(now)
        head = self.peek("in_ref", now)
        if head is None:
            return False, None
        self.pop("in_ref")
        if head is DONE:
            self._both(DONE, now)
            self.state, self.done = _FINISHED, True
            return True, DONE
        if isinstance(head, Stop):
            self._both(Stop(head.level + 1), now)
            return True, Stop(head.level + 1)
        if head is EMPTY:
            self._both(EMPTY, now)
            self.state = _CLOSE
            return True, EMPTY
        if not isinstance(head, int | np.integer):
            raise self._malformed("an integer reference, a stop, N or D", head)
        self.pos, self.end = self._fiber(int(head))
        if self.pos >= self.end:
            return True, self._close(now)[1]
        if self.skip is not None:
            jumped = self._skip_to(self.pos, now)
            if jumped is not None:
                return jumped
        return self._emit_pos(now)


class CompressedScanner(Scanner):
    """A compressed level (``seg``, ``crd``): fiber ``r`` is ``crd[seg[r]:seg[r+1]]``."""

    def __init__(
        self,
        name: str,
        seg: Sequence[int] | np.ndarray,
        crd: Sequence[int] | np.ndarray,
        in_ref: Channel,
        in_crd_skip: Channel | None = None,
    ) -> None:
        super().__init__(name, in_ref, in_crd_skip)
        self.seg = [int(s) for s in seg]
        self.crd = [int(c) for c in crd]
        if not self.seg or self.seg[-1] > len(self.crd):
            raise ValueError(
                expected(name, "seg", f"ending at most at len(crd)={len(self.crd)}", self.seg[-1:])
            )

    def _fiber(self, ref: int) -> tuple[int, int]:
        if not 0 <= ref < len(self.seg) - 1:
            raise ValueError(expected(self.name, "reference", f"in [0, {len(self.seg) - 1})", ref))
        return self.seg[ref], self.seg[ref + 1]

    def _crd(self, pos: int) -> int:
        return self.crd[pos]


class UncompressedScanner(Scanner):
    """A dense level of size ``dim``: fiber ``r`` is ``0..dim-1`` at positions ``r*dim + c``."""

    def __init__(self, name: str, dim: int, in_ref: Channel) -> None:
        super().__init__(name, in_ref)
        if dim < 0:
            raise ValueError(expected(name, "dim", ">= 0", dim))
        self.dim = dim

    def _fiber(self, ref: int) -> tuple[int, int]:
        if ref < 0:
            raise ValueError(expected(self.name, "reference", ">= 0", ref))
        self.base = ref * self.dim
        return self.base, self.base + self.dim

    def _crd(self, pos: int) -> int:
        return pos - self.base


def level_scanner(name: str, level: StoredLevel, in_ref: Channel) -> Scanner:
    """The scanner of a stored level (a singleton level is compressed with one child each)."""
    if level.kind is LevelKind.DENSE:
        return UncompressedScanner(name, level.size, in_ref)
    assert level.crd is not None
    seg = level.seg if level.kind is LevelKind.COMPRESSED else np.arange(len(level.crd) + 1)
    assert seg is not None
    return CompressedScanner(name, seg, level.crd, in_ref)
