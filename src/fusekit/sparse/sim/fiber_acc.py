"""A fiber accumulator: fusekit's order-1 accumulator over stop-structured streams.

SAM's sparse accumulator (:class:`~fusekit.sparse.sim.values.SparseAccumulator`) takes point
streams. The statement lowering of :mod:`fusekit.sparse.graph` instead feeds the innermost
coordinate stream and its values unchanged, one fiber per coordinate of the reduced variable:
this primitive sums values by coordinate across those fibers, and a ``S(k>=1)`` (the end of the
reduction) sends the sorted coordinates and sums followed by ``S(k-1)``.
"""

from __future__ import annotations

from collections import deque

from fusekit.sparse.sim.base import Primitive
from fusekit.sparse.sim.channel import Channel
from fusekit.sparse.sim.tokens import DONE, EMPTY, Stop, Token, is_data


class FiberAccumulator(Primitive):
    """Sums ``in_val`` by coordinate of ``in_crd`` over the fibers of one reduction."""

    kind = "spacc"

    def __init__(self, name: str, in_crd: Channel, in_val: Channel) -> None:
        super().__init__(name, {"in_crd": in_crd, "in_val": in_val}, ("out_crd", "out_val"))
        self.acc: dict[int, float] = {}
        self.queue: deque[tuple[Token, Token]] = deque()
        self.finished = False

    def _fire(self, now: int) -> bool:
        sent = False
        if self.queue:  # drains one result per cycle while it reads the next reduction
            crd, val = self.queue.popleft()
            self.emit("out_crd", crd, now)
            self.emit("out_val", val, now)
            sent = True
        self.done = self.finished and not self.queue
        if self.finished or len(self.queue) > 64:
            return sent
        return self._consume(now) or sent

    def _consume(self, now: int) -> bool:
        c, v = self.peek("in_crd", now), self.peek("in_val", now)
        if c is None or v is None:
            return False
        self.pop("in_crd")
        self.pop("in_val")
        if is_data(c) and c is not EMPTY:
            value = 0.0 if v is EMPTY else float(v)  # type: ignore[arg-type]
            self.acc[int(c)] = self.acc.get(int(c), 0.0) + value  # type: ignore[arg-type]
        elif isinstance(c, Stop) and c.level >= 1:
            self.queue.extend((key, self.acc[key]) for key in sorted(self.acc))
            self.queue.append((Stop(c.level - 1), Stop(c.level - 1)))
            self.acc = {}
        elif c is DONE:
            self.queue.append((DONE, DONE))
            self.finished = True
        return True
