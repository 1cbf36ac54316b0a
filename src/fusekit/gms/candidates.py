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

A :class:`Strategy` is one order with one dataflow; a :class:`Config` adds the plan knobs (tile
rows, destination blocks, pad/pack schedule) and the launch knobs (CPU threads and ``prange``
chunking; the GPU's Triton tile, warps and stages). :func:`cpu_space` and :func:`gpu_space` are
the configuration spaces the tuner searches (``fusekit.gms.search``). This module only
enumerates and names; ``fusekit.gms.dispatch`` runs them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from fusekit.gms.launch import Launch
from fusekit.gms.planning.format import SCHEDULES
from fusekit.search.space import Knob, Space


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


# ---- configurations: a strategy with its plan and launch knobs (issue 4) ----


@dataclass(frozen=True, slots=True)
class Config:
    """One point of a g-mm-s configuration space, ready to plan and launch.

    Attributes:
        strategy: the order and dataflow.
        tile_rows: most pairs per tile (``plan(tile_rows=...)``).
        blocks: destination blocks (``plan(blocks=...)``).
        schedule: ``"pad"`` or ``"pack"`` (``plan(schedule=...)``).
        launch: threads and chunking (CPU) or the Triton tile, warps and stages (GPU).
    """

    strategy: Strategy
    tile_rows: int
    blocks: int
    schedule: str
    launch: Launch

    @property
    def plan_knobs(self) -> tuple[int, int, str]:
        """``(tile_rows, blocks, schedule)``: configurations with equal knobs share a plan."""
        return self.tile_rows, self.blocks, self.schedule


def _threads_values(cores: int) -> tuple[int, ...]:
    """1, 2, 4, ... below ``cores``, and ``cores`` itself."""
    values = {cores}
    t = 1
    while t < cores:
        values.add(t)
        t *= 2
    return tuple(sorted(values))


def _uses_items(point: Mapping[str, Any]) -> bool:
    """Only the ``(GM)seg-S`` CPU kernel runs the plan's work items; ``pack`` changes no other."""
    return Strategy.parse(point["strategy"]).dataflow is Dataflow.GM_SEG_S


def cpu_space(reduce: str, cores: int) -> Space:
    """The CPU configuration space of a reduce.

    Knobs: strategy (every legal order x dataflow), ``tile_rows`` {16, 64, 256}, destination
    blocks per thread {1, 4, 16}, ``schedule`` pad/pack (pack only where the kernel runs work
    items), threads {1, 2, 4, ..., cores}, ``chunk`` {0: static, 1: dynamic} of ``prange``.

    Args:
        reduce: the problem's reduce.
        cores: the target's cores.

    Returns:
        The space (points are dicts of those knobs).
    """
    names = tuple(s.name for s in enumerate_candidates(reduce))
    return Space(
        (
            Knob("strategy", names, "order and dataflow"),
            Knob("tile_rows", (16, 64, 256), "most pairs per tile"),
            Knob("blocks_per_thread", (1, 4, 16), "destination blocks per thread"),
            Knob("schedule", SCHEDULES, "work items: one tile, or packed small tiles"),
            Knob("threads", _threads_values(cores), "numba and torch threads"),
            Knob("chunk", (0, 1), "prange chunk: 0 static split, 1 dynamic"),
        ),
        constraints=(lambda p: p["schedule"] == "pad" or _uses_items(p),),
    )


def gpu_space(reduce: str, shared_mem_bytes: int, k: int, m: int, dtype_bytes: int) -> Space:
    """The GPU configuration space of a reduce and operand widths.

    Knobs: strategy, ``tile_rows`` {32, 64, 128, 256}, the Triton segment GEMM's ``block_e``
    (pairs) {16, ..., 128}, ``block_m`` {16, ..., 128}, ``block_k`` {16, 32, 64}, ``num_warps``
    {2, 4, 8}, ``num_stages`` {2, 3, 4}. Constraints: a program's rows fit a tile
    (``block_e <= tile_rows``), blocks no wider than the operands need, and the pipelined operand
    tiles fit shared memory: ``num_stages * (block_e + block_m) * block_k * bytes <= smem``.

    Args:
        reduce: the problem's reduce.
        shared_mem_bytes: the target's shared memory per SM.
        k: columns of ``x``.
        m: columns of ``y``.
        dtype_bytes: bytes per operand element.

    Returns:
        The space (several thousand points for ``K = M = 64``).
    """
    names = tuple(s.name for s in enumerate_candidates(reduce))
    k_cap, m_cap = max(16, _next_pow2(k)), max(16, _next_pow2(m))
    return Space(
        (
            Knob("strategy", names, "order and dataflow"),
            Knob("tile_rows", (32, 64, 128, 256), "most pairs per tile"),
            Knob("block_e", (16, 32, 64, 128), "pairs per program"),
            Knob("block_m", (16, 32, 64, 128), "output columns per program"),
            Knob("block_k", (16, 32, 64), "K step"),
            Knob("num_warps", (2, 4, 8), "warps per program"),
            Knob("num_stages", (2, 3, 4), "pipelining stages"),
        ),
        constraints=(
            lambda p: p["block_e"] <= p["tile_rows"],
            lambda p: p["block_m"] <= m_cap and p["block_k"] <= k_cap,
            lambda p: (
                p["num_stages"] * (p["block_e"] + p["block_m"]) * p["block_k"] * dtype_bytes
                <= shared_mem_bytes
            ),
        ),
    )


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def config_of(point: Mapping[str, Any]) -> Config:
    """The :class:`Config` of a CPU or GPU space point."""
    strategy = Strategy.parse(point["strategy"])
    if "threads" in point:
        threads = int(point["threads"])
        return Config(
            strategy,
            int(point["tile_rows"]),
            int(point["blocks_per_thread"]) * threads,
            str(point["schedule"]),
            Launch(threads=threads, chunk=int(point["chunk"])),
        )
    return Config(
        strategy,
        int(point["tile_rows"]),
        1,
        "pad",
        Launch(
            block_e=int(point["block_e"]),
            block_k=int(point["block_k"]),
            block_m=int(point["block_m"]),
            num_warps=int(point["num_warps"]),
            num_stages=int(point["num_stages"]),
        ),
    )
