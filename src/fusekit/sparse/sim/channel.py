"""A FIFO channel with a depth and a delivery latency."""

from __future__ import annotations

from collections import deque

from fusekit.errors import expected
from fusekit.sparse.sim.tokens import Token


class Channel:
    """A FIFO of ``depth`` tokens (``None``: unbounded) that delivers after ``latency`` cycles.

    A token pushed at cycle ``t`` is visible at ``t + latency``.
    Tokens in flight count against the depth. ``sent`` counts every token ever pushed; ``log``
    and ``times`` keep each token and the cycle it was pushed.
    """

    def __init__(self, name: str, depth: int | None = 8, latency: int = 1) -> None:
        if (depth is not None and depth < 1) or latency < 1:
            raise ValueError(expected(f"channel {name}", "depth/latency", ">= 1", (depth, latency)))
        self.name = name
        self.depth = depth
        self.latency = latency
        self._queue: deque[tuple[int, Token]] = deque()
        self.sent = 0
        self.log: list[Token] = []
        self.times: list[int] = []

    def can_push(self) -> bool:
        """Whether there is room for one more token."""
        return self.depth is None or len(self._queue) < self.depth

    def push(self, token: Token, now: int) -> None:
        """Send ``token`` at cycle ``now``."""
        self._queue.append((now + self.latency, token))
        self.sent += 1
        self.log.append(token)
        self.times.append(now)

    def peek(self, now: int) -> Token | None:
        """The head token if it has arrived by cycle ``now``, else ``None``."""
        if self._queue and self._queue[0][0] <= now:
            return self._queue[0][1]
        return None

    def pop(self) -> Token:
        """Remove and return the head token (call after :meth:`peek`)."""
        return self._queue.popleft()[1]

    def __len__(self) -> int:
        return len(self._queue)
