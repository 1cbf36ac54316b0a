"""Value primitives: array reads, ALUs, reducers and sparse accumulators."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from fusekit.errors import expected
from fusekit.sparse.sim.base import Primitive
from fusekit.sparse.sim.channel import Channel
from fusekit.sparse.sim.tokens import DONE, EMPTY, Stop, Token, is_data

Number = int | float

BINARY_OPS: dict[str, Callable[[Number, Number], Number]] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b if b else (math.copysign(math.inf, a) if a else math.nan),
    "max": max,
    "min": min,
}
UNARY_OPS: dict[str, Callable[[Number], Number]] = {
    "neg": lambda a: -a,
    "relu": lambda a: a if a > 0 else 0.0,
    "exp": math.exp,
    "abs": abs,
    "square": lambda a: a * a,
    "sqrt": math.sqrt,
    "sigmoid": lambda a: 1.0 / (1.0 + math.exp(-a)),
}


def _number(tok: Token) -> Number:
    """A value token as a number (``N`` reads as 0)."""
    return 0 if tok is EMPTY else tok  # type: ignore[return-value]


class ArrayRead(Primitive):
    """Reads ``values[ref]`` per reference in the same cycle (``N`` reads 0); control passes."""

    kind = "array"

    def __init__(self, name: str, values: Sequence[Any] | Any, in_ref: Channel) -> None:
        super().__init__(name, {"in_ref": in_ref}, ("out_val",))
        self.values = values.tolist() if hasattr(values, "tolist") else list(values)

    def _fire(self, now: int) -> bool:
        ref = self.peek("in_ref", now)
        if ref is None:
            return False
        self.pop("in_ref")
        if ref is EMPTY:
            self.emit("out_val", 0, now)
        elif is_data(ref):
            r = int(ref)  # type: ignore[arg-type]
            if not 0 <= r < len(self.values):
                raise ValueError(expected(self.name, "reference", f"in [0, {len(self.values)})", r))
            self.emit("out_val", self.values[r], now)
        else:
            self.emit("out_val", ref, now)
            self.done = ref is DONE
        return True


class ALU(Primitive):
    """An element-wise function of one or two aligned value streams.

    ``op`` names an entry of :data:`BINARY_OPS` or :data:`UNARY_OPS`, or is a function; with
    ``neg1``/``neg2`` an operand is negated first (SAM's subtracting adder). Matching control
    tokens pass. A value met by a stop on the other side is SAM's patch for a union feeding a
    reduction (``b(i) + C(i,j) d(j)`` with every input empty, where the reduction's stream has a
    0 the union's has no slot for): ``add``/``sub`` send the value, ``mul`` sends 0, and the stop
    waits for the next cycle. Any other misalignment raises.
    """

    kind = "alu"

    def __init__(
        self,
        name: str,
        op: str | Callable[..., Number],
        in1: Channel,
        in2: Channel | None = None,
        neg1: bool = False,
        neg2: bool = False,
    ) -> None:
        inputs = {"in1": in1} | ({"in2": in2} if in2 is not None else {})
        super().__init__(name, inputs, ("out_val",))
        table: dict[str, Callable[..., Number]] = dict(BINARY_OPS if in2 is not None else UNARY_OPS)
        if isinstance(op, str) and op not in table:
            raise ValueError(expected(name, "op", ", ".join(sorted(table)), op))
        self.op = op if isinstance(op, str) else getattr(op, "__name__", "fn")
        self.fn: Callable[..., Number] = table[op] if isinstance(op, str) else op
        self.signs = (-1 if neg1 else 1, -1 if neg2 else 1)

    def _fire(self, now: int) -> bool:
        heads = [self.peek(p, now) for p in self.inputs]
        if any(h is None for h in heads):
            return False
        if len(heads) == 2 and is_data(heads[0]) != is_data(heads[1]):  # type: ignore[arg-type]
            return self._patch(heads, now)
        for p in self.inputs:
            self.pop(p)
        if all(is_data(h) for h in heads):  # type: ignore[arg-type]
            args = [s * _number(h) for s, h in zip(self.signs, heads, strict=False)]  # type: ignore[arg-type]
            self.emit("out_val", self.fn(*args), now)
            return True
        if any(h != heads[0] for h in heads):
            raise self._malformed("aligned value streams", heads)
        tok = heads[0]
        assert tok is not None
        self.emit("out_val", tok, now)
        self.done = tok is DONE
        return True

    def _patch(self, heads: list[Token | None], now: int) -> bool:
        """A value against a stop: send the value (add, sub) or 0 (mul); keep the stop."""
        side = 0 if is_data(heads[0]) else 1  # type: ignore[arg-type]
        value, other = heads[side], heads[1 - side]
        kind = _PATCHED.get(self.op)
        if kind is None or not isinstance(other, Stop):
            raise self._malformed("aligned value streams", heads)
        self.pop(list(self.inputs)[side])
        signed = self.signs[side] * _number(value)  # type: ignore[arg-type]
        if kind == "minus" and side == 1:
            signed = -signed
        self.emit("out_val", 0 if kind == "zero" else signed, now)
        return True


_PATCHED = {"add": "plus", "sub": "minus", "subtract": "minus", "mul": "zero", "multiply": "zero"}
"""What SAM's patch sends for a value met by a stop: the value (signed), or 0 for a product."""


class Reduce(Primitive):
    """Reduces each innermost fiber to one value.

    At ``S0`` it sends the sum (0 for an empty fiber), at ``S(k>=1)`` the sum and then
    ``S(k-1)``; ``D`` passes. ``op``: sum, max or min.
    """

    kind = "reducer"

    def __init__(self, name: str, in_val: Channel, op: str = "sum") -> None:
        super().__init__(name, {"in_val": in_val}, ("out_val",))
        if op not in ("sum", "max", "min"):
            raise ValueError(expected(name, "op", "sum, max or min", op))
        self.op = op
        self.init: Number = {"sum": 0, "max": -math.inf, "min": math.inf}[op]
        self.acc: Number = self.init
        self.pending: Token | None = None

    def _fire(self, now: int) -> bool:
        if self.pending is not None:
            self.emit("out_val", self.pending, now)
            self.pending = None
            return True
        tok = self.peek("in_val", now)
        if tok is None:
            return False
        self.pop("in_val")
        if is_data(tok):
            v = _number(tok)
            self.acc = (
                self.acc + v
                if self.op == "sum"
                else (max if self.op == "max" else min)(self.acc, v)
            )
        elif isinstance(tok, Stop):
            self.emit("out_val", self.acc, now)
            self.acc = self.init
            if tok.level >= 1:
                self.pending = Stop(tok.level - 1)
        else:
            self.emit("out_val", DONE, now)
            self.done = True
        return True


class SparseAccumulator(Primitive):
    """Sums values by (outer, inner) coordinate point; outputs SAM's stop-token form.

    Inputs are point streams (one outer coordinate, inner coordinate and value per point, ending
    in ``D``); stop tokens on them are skipped, so the crd-hold outputs SAM's graphs feed it can
    be wired directly. Order 1 accumulates within each run of equal outer coordinates and emits
    the run when the outer coordinate changes; order 2 accumulates the whole stream and emits
    every outer coordinate in order at ``D``. Output: outer ``o..., S0, D``; inner fibers sorted,
    separated by ``S0`` and the last closed by ``S1``; values mirror the inner stream.
    """

    kind = "spacc"
    _PORTS = ("in_outer_crdpt", "in_inner_crdpt", "in_val")

    def __init__(
        self,
        name: str,
        order: int,
        in_outer_crdpt: Channel,
        in_inner_crdpt: Channel,
        in_val: Channel,
    ) -> None:
        channels = (in_outer_crdpt, in_inner_crdpt, in_val)
        super().__init__(
            name,
            dict(zip(self._PORTS, channels, strict=True)),
            ("out_outer_crd", "out_inner_crd", "out_val"),
        )
        if order not in (1, 2):
            raise ValueError(expected(name, "order", "1 or 2", order))
        self.order = order
        self.acc: dict[int, dict[int, Number]] = {}
        self.queue: list[tuple[Token, Token, Token]] = []  # (outer, inner, val) per cycle
        self.emitted_rows = 0
        self.finished = False

    def _flush(self, last: bool) -> None:
        for o in sorted(self.acc):
            row = self.acc[o]
            if self.emitted_rows:
                self.queue.append((None, Stop(0), Stop(0)))  # type: ignore[arg-type]
            self.queue.append((o, *self._first(row)))
            for i in sorted(row)[1:]:
                self.queue.append((None, i, row[i]))  # type: ignore[arg-type]
            self.emitted_rows += 1
        self.acc = {}
        if last:
            self.queue.append((Stop(0), Stop(1), Stop(1)))
            self.queue.append((DONE, DONE, DONE))

    @staticmethod
    def _first(row: dict[int, Number]) -> tuple[int, Number]:
        i = min(row)
        return i, row[i]

    def _fire(self, now: int) -> bool:
        if self.queue:
            outer, inner, val = self.queue.pop(0)
            if outer is not None:
                self.emit("out_outer_crd", outer, now)
            self.emit("out_inner_crd", inner, now)
            self.emit("out_val", val, now)
            self.done = self.finished and not self.queue
            return True
        if self.finished:
            return False
        heads = [self.peek(p, now) for p in self._PORTS]
        skipped = False
        for p, h in zip(self._PORTS, heads, strict=True):
            if isinstance(h, Stop):
                self.pop(p)
                skipped = True
        if skipped or any(h is None for h in heads):
            return skipped
        outer, inner, val = (h for h in heads if h is not None)
        for p in self._PORTS:
            self.pop(p)
        if outer is DONE or inner is DONE or val is DONE:
            if not outer is inner is val is DONE:
                raise self._malformed("D on all three inputs together", heads)
            self._flush(last=True)
            self.finished = True
            return True
        o, i = int(outer), int(inner)  # type: ignore[arg-type]
        if val is EMPTY:
            val = 0
        if self.order == 1 and self.acc and o not in self.acc:
            self._flush(last=False)
        row = self.acc.setdefault(o, {})
        row[i] = row.get(i, 0) + _number(val)
        return True
