"""A block SAM graphs use that the per-token primitives do not cover.

:class:`DeepCrdDrop` is a ``crddrop`` whose inner stream nests ``gap`` levels below the outer
one (``gap=1`` is the ordinary dropper, :class:`~fusekit.sparse.sim.primitives.CrdDrop`): an
outer coordinate passes when its whole subtree holds a coordinate; the inner stream passes
unchanged. The ``matmul_ikj_hand_BLACKBOX`` graphs drop ``i`` against the ``j`` stream of the
``i, k, j`` loop nest, two levels down, before their ``vectorreducer`` sums over ``k``.

"""

from __future__ import annotations

from fusekit.sparse.sim.channel import Channel
from fusekit.sparse.sim.primitives import Primitive
from fusekit.sparse.sim.tokens import DONE, Stop, Token, is_number


class DeepCrdDrop(Primitive):
    """Drops outer coordinates whose inner subtree, ``gap`` levels deep, is empty."""

    kind = "crddrop"

    def __init__(self, name: str, in_outer_crd: Channel, in_inner_crd: Channel, gap: int) -> None:
        super().__init__(
            name,
            {"in_outer_crd": in_outer_crd, "in_inner_crd": in_inner_crd},
            ("out_outer_crd", "out_inner_crd"),
        )
        self.gap = gap
        self.current: Token | None = None
        self.seen = False
        self.pending_stop = False

    def _fire(self, now: int) -> bool:
        outer = self.peek("in_outer_crd", now)
        if self.pending_stop:  # the outer fiber closed with the subtree: pass its stop
            if outer is None:
                return False
            self.emit("out_outer_crd", self.pop("in_outer_crd"), now)
            self.pending_stop = False
            return True
        if self.current is None and outer is not None and is_number(outer):
            self.current, self.seen = self.pop("in_outer_crd"), False
            return True
        inner = self.peek("in_inner_crd", now)
        if inner is None:
            return False
        if self.current is None:  # an empty outer fiber, or the end
            if outer is None:
                return False
            if isinstance(inner, Stop) and inner.level < self.gap:
                self.emit("out_inner_crd", self.pop("in_inner_crd"), now)
                return True
            self.emit("out_outer_crd", self.pop("in_outer_crd"), now)
            self.emit("out_inner_crd", self.pop("in_inner_crd"), now)
            self.done = inner is DONE
            return True
        self.emit("out_inner_crd", self.pop("in_inner_crd"), now)
        if isinstance(inner, Stop):
            if inner.level >= self.gap - 1:
                if self.seen:
                    self.emit("out_outer_crd", self.current, now)
                self.current = None
                self.pending_stop = inner.level >= self.gap
        else:
            self.seen = self.seen or is_number(inner)
        return True
