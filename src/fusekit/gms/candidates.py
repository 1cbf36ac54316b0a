"""The choices gms makes for one problem: an order of the algebra and a dataflow of the GEMM.

A g-mm-s problem computes, for pairs ``e`` with gather row ``g[e]``, segment ``s[e]``, scatter row
``d[e]`` and scale ``c[e]``::

    Y[d[e], m]  (+= | max=)  c[e] * sum_k X[g[e], k] * W[s[e], k, m]

**Orders** (which GEMM runs; FLOPs and bytes change by the duplication factors of the indices):

- ``pairwise``: one GEMM row per pair, ``E`` rows.
- ``transform-first``: ``T[v] = X[g_v] @ W[s_v]`` once per distinct ``(s, g)`` (``V`` rows), then
  ``Y[d[e]] (+=|max=) c[e] * T[v[e]]``. Valid for every reduce.
- ``aggregate-first``: ``A[u] = sum c[e] * X[g[e]]`` per distinct ``(s, d)`` (``U`` rows), then
  ``Y[d_u] += A[u] @ W[s_u]``. Valid for sum and mean (linear), not for max.

**Dataflows** (how that GEMM is run; brackets are one kernel, ``seg`` a GEMM over pairs sorted by
segment), spelled as in Efficient-GMS (DAC 2025):

- ``G-Mseg-S``: gather rows, segment GEMM, scatter rows: three kernels, two intermediates.
- ``(GM)seg-S``: gather in the GEMM prologue; the products go through memory to a scatter kernel.
- ``G-(MS)seg``: gathered rows go through memory; the scatter is the GEMM epilogue.
- ``(GMS)seg``: one kernel; nothing but ``X``, ``W`` and ``Y`` touches memory.

A :class:`Strategy` is one order with one dataflow. This module only enumerates and names them;
``fusekit.gms.dispatch`` runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Dataflow(StrEnum):
    """How the gather, the segment GEMM and the scatter are split into kernels."""

    G_MSEG_S = "G-Mseg-S"
    GM_SEG_S = "(GM)seg-S"
    G_MS_SEG = "G-(MS)seg"
    GMS_SEG = "(GMS)seg"

    @property
    def module(self) -> str:
        """File stem of the dataflow's kernels: ``kernels/{cpu,triton}/<module>.py``."""
        return _MODULES[self]


_MODULES = {
    Dataflow.G_MSEG_S: "g_mseg_s",
    Dataflow.GM_SEG_S: "gm_seg_s",
    Dataflow.G_MS_SEG: "g_ms_seg",
    Dataflow.GMS_SEG: "gms_seg",
}


class Order(StrEnum):
    """Which GEMM the algebra runs: one row per pair, per distinct (s, g) or per distinct (s, d)."""

    PAIRWISE = "pairwise"
    TRANSFORM_FIRST = "transform-first"
    AGGREGATE_FIRST = "aggregate-first"

    def allows(self, reduce: str) -> bool:
        """Whether the order computes the same result as pairwise for ``reduce``.

        Aggregating inputs before the GEMM commutes only with a linear reduce (sum, mean).
        """
        return not (self is Order.AGGREGATE_FIRST and reduce == "max")


@dataclass(frozen=True, slots=True)
class Strategy:
    """One way to compute a g-mm-s problem: an order and the dataflow of its GEMM.

    Attributes:
        order: which GEMM runs (see :class:`Order`).
        dataflow: how the GEMM, gather and scatter are split into kernels.
    """

    order: Order = Order.PAIRWISE
    dataflow: Dataflow = Dataflow.GMS_SEG

    @property
    def name(self) -> str:
        """``"(GMS)seg"`` for pairwise strategies, ``"aggregate-first/(GMS)seg"`` otherwise."""
        if self.order is Order.PAIRWISE:
            return self.dataflow.value
        return f"{self.order.value}/{self.dataflow.value}"

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, text: str | Strategy | Dataflow | Order) -> Strategy:
        """Read a strategy from its name, a dataflow, an order, or ``"order/dataflow"``.

        An order alone runs its GEMM with ``(GMS)seg``; a dataflow alone is pairwise.

        Args:
            text: e.g. ``"(GM)seg-S"``, ``"aggregate-first"``, ``"transform-first/G-Mseg-S"``.

        Returns:
            The strategy.

        Raises:
            ValueError: the name is neither an order nor a dataflow; the message lists both.
        """
        if isinstance(text, Strategy):
            return text
        if isinstance(text, Dataflow):
            return cls(Order.PAIRWISE, text)
        if isinstance(text, Order):
            return cls(text, Dataflow.GMS_SEG)
        order_text, _, flow_text = str(text).partition("/")
        try:
            if not flow_text:
                if order_text in Order._value2member_map_:
                    return cls(Order(order_text), Dataflow.GMS_SEG)
                return cls(Order.PAIRWISE, Dataflow(order_text))
            return cls(Order(order_text), Dataflow(flow_text))
        except ValueError:
            names = ", ".join([*(d.value for d in Dataflow), *(o.value for o in Order)])
            raise ValueError(
                f"gms: expected 'strategy' to be one of {names} or 'order/dataflow' (got {text!r})"
            ) from None


#: The six named strategies of issue 3: the four dataflows (pairwise) and the two other orders.
NAMED_STRATEGIES: tuple[Strategy, ...] = (
    *(Strategy(Order.PAIRWISE, d) for d in Dataflow),
    Strategy(Order.TRANSFORM_FIRST, Dataflow.GMS_SEG),
    Strategy(Order.AGGREGATE_FIRST, Dataflow.GMS_SEG),
)


@dataclass(frozen=True, slots=True)
class GemmRows:
    """Rows of the GEMM each order runs, counted exactly from the plan.

    Attributes:
        pairwise: pairs ``E``.
        transform_first: distinct ``(segment, gather row)`` ``V``.
        aggregate_first: distinct ``(segment, scatter row)`` ``U``; ``None`` when not planned.
    """

    pairwise: int
    transform_first: int | None
    aggregate_first: int | None

    def of(self, order: Order) -> int | None:
        """The row count of ``order`` (``None`` when the order was not planned)."""
        return {
            Order.PAIRWISE: self.pairwise,
            Order.TRANSFORM_FIRST: self.transform_first,
            Order.AGGREGATE_FIRST: self.aggregate_first,
        }[order]


def enumerate_candidates(
    reduce: str, rows: GemmRows | None = None, named_only: bool = False
) -> list[Strategy]:
    """Every legal strategy for a reduce, pairwise first.

    Args:
        reduce: ``"sum"``, ``"mean"`` or ``"max"``.
        rows: the plan's GEMM row counts; orders that were not planned are left out.
        named_only: keep only :data:`NAMED_STRATEGIES`.

    Returns:
        The strategies, orders in :class:`Order` order, dataflows in :class:`Dataflow` order.
    """
    pool = NAMED_STRATEGIES if named_only else [Strategy(o, d) for o in Order for d in Dataflow]
    return [
        s for s in pool if s.order.allows(reduce) and (rows is None or rows.of(s.order) is not None)
    ]


def default_strategy(reduce: str, rows: GemmRows) -> Strategy:
    """The strategy used when none is asked for: the order with the fewest GEMM rows, fused.

    GEMM rows are exact counts (no tuned constants); ties go to pairwise. The measured choice
    belongs to the tuner; this default only avoids a GEMM that the algebra can shrink.

    Args:
        reduce: the problem's reduce.
        rows: the plan's GEMM row counts.

    Returns:
        A :class:`Strategy` with the ``(GMS)seg`` dataflow.
    """
    best = Order.PAIRWISE
    for order in (Order.AGGREGATE_FIRST, Order.TRANSFORM_FIRST):
        count = rows.of(order)
        best_count = rows.of(best)
        if order.allows(reduce) and count is not None and best_count is not None:
            if count < best_count:
                best = order
    return Strategy(best, Dataflow.GMS_SEG)
