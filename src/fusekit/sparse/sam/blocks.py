"""Blocks SAM graphs use that the per-token primitives do not cover.

:class:`DeepCrdDrop` is a ``crddrop`` whose inner stream nests ``gap`` levels below the outer
one (``gap=1`` is the ordinary dropper, :class:`~fusekit.sparse.sim.primitives.CrdDrop`): an
outer coordinate passes when its whole subtree holds a coordinate; the inner stream passes
unchanged. The ``matmul_ikj_hand_BLACKBOX`` graphs drop ``i`` against the ``j`` stream of the
``i, k, j`` loop nest, two levels down, before their ``vectorreducer`` sums over ``k``.

:class:`JoinN` joins more than two operands in one block.
"""

from __future__ import annotations

from fusekit.sparse.sim.channel import Channel
from fusekit.sparse.sim.primitives import Primitive
from fusekit.sparse.sim.tokens import DONE, EMPTY, Stop, Token, is_number


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


class JoinN(Primitive):
    """An intersect or union of ``n >= 2`` (crd, ref) streams with equal fiber structure.

    SAM's generated tests join three operands in one block (``mat_elemadd3``: ``set_in3``,
    ``out_ref3``); the two-operand joiners of :mod:`fusekit.sparse.sim.join` are the case
    ``n = 2``. Ports ``in_crd<k>``, ``in_ref<k>``, ``out_crd``, ``out_ref<k>`` for k = 1..n. ``N``
    (an absent fiber) joins as the empty set, as there: the unioner skips it (or sends ``N``
    when every side is absent); the intersecter drains the other sides and sends one ``N`` in
    the fiber's place.
    """

    def __init__(self, name: str, union: bool, crds: list[Channel], refs: list[Channel]) -> None:
        n = len(crds)
        inputs = {f"in_crd{k + 1}": c for k, c in enumerate(crds)}
        inputs.update({f"in_ref{k + 1}": r for k, r in enumerate(refs)})
        outputs = ("out_crd", *(f"out_ref{k + 1}" for k in range(n)))
        super().__init__(name, inputs, outputs)
        self.kind = "union" if union else "intersect"
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
