"""A plan's layout: :class:`GMSPlan`, its order sub-plans, and its packed form.

A plan is every tensor the kernels need besides ``x``, ``w`` and ``c``, held as views into one
int64 buffer (:attr:`GMSPlan.packed`, the form ``torch.ops.fusekit.gms`` takes; the layout is
:mod:`fusekit.gms.planning.format`). :func:`pack` writes a plan into such a buffer;
:meth:`GMSPlan.from_packed` parses one back, checking its layout in O(1) and its values
(:mod:`fusekit.gms.integrity`) unless a builder of this package wrote it. A plan is immutable:
one edited after it was made is detected at the next call and validated again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from fusekit.errors import expected
from fusekit.gms.integrity import admit, trust_copy
from fusekit.gms.memory import PARSED, remember
from fusekit.gms.planning.derived import Derived
from fusekit.gms.planning.format import (
    MAGIC,
    META_LENGTH,
    PART_NAMES,
    PLAN_PARTS,
    SCHEDULES,
    TENSOR_FIELDS,
)
from fusekit.gms.problem import REDUCES


@dataclass(frozen=True, slots=True, eq=False, weakref_slot=True)
class GMSPlan:
    """Everything the kernels need besides ``x``, ``w`` and ``c``.

    All tensors are int64 (``norm`` float64) on the problem's device; positions ``p`` index the
    pairs in plan order.

    Attributes:
        num_pairs: ``E``.
        n_in: rows ``x`` must have at least.
        n_out: output rows.
        num_segments: ``S``, matrices ``w`` must have at least.
        reduce: the problem's reduce.
        tile_rows: most pairs per tile.
        schedule: ``"pad"`` (a work item is one tile) or ``"pack"`` (small tiles of a block share
            an item).
        meta: ``[8]`` the sizes above as a tensor (the first of :meth:`tensors`).
        order: ``[E]`` original pair of each position; pairs are sorted by (segment,
            destination block, scatter row).
        gather: ``[E]`` ``g`` in plan order.
        segment: ``[E]`` ``s`` in plan order.
        scatter: ``[E]`` ``d`` in plan order.
        norm: ``[E]`` ``1 / deg(d)`` for ``mean``; empty otherwise.
        segment_ptr: ``[S+1]`` positions where each segment starts.
        tile_segment: ``[T]`` segment of each tile; tiles are ordered by (block, segment).
        tile_start: ``[T]`` first position of each tile.
        tile_end: ``[T]`` one past its last position.
        block_ptr: ``[B+1]`` tiles of each destination block. A block owns a contiguous range of
            output rows, so a CPU thread that runs one block's tiles scatters without atomics.
        item_ptr: ``[I+1]`` tiles of each work item.
        dst_ptr: ``[N_out+1]`` CSR of positions by scatter row ...
        dst_pos: ``[E]`` ... its positions.
        src_ptr: ``[n_in+1]`` CSR of positions by gather row (the input gradient) ...
        src_pos: ``[E]`` ... its positions.
        aggregate: the aggregate-first order (``None`` for max or when not planned).
        transform: the transform-first order (``None`` when not planned).
        buffer: the packed plan every tensor above is a view of (``None`` in sub-plans); see
            :attr:`packed`.
        derived: what kernels derive from the plan once and reuse across calls (host views, the
            mean weights in the compute dtype, checks passed); a plan changed with
            ``dataclasses.replace`` starts empty.
        parsed: whether the plan was parsed from ``buffer`` (its tensors are views of it);
            False for one changed with ``dataclasses.replace``.
    """

    num_pairs: int
    n_in: int
    n_out: int
    num_segments: int
    reduce: str
    tile_rows: int
    schedule: str
    meta: torch.Tensor
    order: torch.Tensor
    gather: torch.Tensor
    segment: torch.Tensor
    scatter: torch.Tensor
    norm: torch.Tensor
    segment_ptr: torch.Tensor
    tile_segment: torch.Tensor
    tile_start: torch.Tensor
    tile_end: torch.Tensor
    block_ptr: torch.Tensor
    item_ptr: torch.Tensor
    dst_ptr: torch.Tensor
    dst_pos: torch.Tensor
    src_ptr: torch.Tensor
    src_pos: torch.Tensor
    aggregate: OrderPlan | None = None
    transform: OrderPlan | None = None
    buffer: torch.Tensor | None = None
    derived: Derived[GMSPlan] = field(
        init=False, default_factory=Derived, repr=False, compare=False
    )
    parsed: bool = field(init=False, default=False, repr=False, compare=False)

    @property
    def device(self) -> torch.device:
        """Where the plan's tensors live (and where ``x`` must live)."""
        return self.order.device

    @property
    def num_tiles(self) -> int:
        """``T``, tiles over all segments and blocks."""
        return int(self.tile_start.shape[0])

    @property
    def num_blocks(self) -> int:
        """``B``, destination blocks."""
        return int(self.block_ptr.shape[0]) - 1

    @property
    def packed(self) -> torch.Tensor:
        """The whole plan as one int64 tensor: the form ``torch.ops.fusekit.gms`` takes.

        Every tensor of the plan (and of its order sub-plans) is a view into this buffer, so
        passing it costs nothing; ``norm`` is stored bit-cast to int64. The op that receives it
        works on this very plan (:func:`fusekit.gms.memory.remember`).
        """
        if self.buffer is None:
            raise ValueError(expected("gms", "plan", "a top-level plan", "an order sub-plan"))
        remember(self)
        return self.buffer

    @classmethod
    def from_packed(cls, packed: torch.Tensor) -> GMSPlan:
        """Rebuild a plan from :attr:`packed`, checking every value it holds.

        The layout is checked in O(1); the values are checked in O(E)
        (:func:`fusekit.gms.integrity.validate`) unless the buffer is one a plan of this
        process was made in and is unchanged since (:func:`fusekit.gms.integrity.admit`). The
        plan remembered for the buffer at its version is returned as it is
        (:data:`fusekit.gms.memory.PARSED`, so an in-place edit is parsed and validated
        again): an epoch of calls parses once.

        Raises:
            ValueError: the tensor does not have the layout of a packed plan, or does not hold
                a consistent problem.
        """
        return _parsed(packed, trusted=False)

    @classmethod
    def _parse(cls, packed: torch.Tensor) -> GMSPlan:
        """The plan ``packed`` holds, its layout checked (O(1)), its values not."""
        count = len(PART_NAMES)
        head = packed[: 2 + count].tolist() if packed.dtype == torch.int64 else []
        if len(head) != 2 + count or head[0] != MAGIC or head[1] != count:
            raise ValueError(
                expected("gms", "plan", "GMSPlan.packed of fusekit.gms.plan(...)", "another tensor")
            )
        lengths: list[int] = head[2:]
        if min(lengths) < 0 or sum(lengths) != packed.shape[0] - 2 - count:
            raise ValueError(expected("gms", "plan", "a consistent packed plan", lengths[:8]))
        tensors = torch.split(packed[2 + count :], lengths)
        width = len(PLAN_PARTS)
        orders: list[OrderPlan | None] = []
        for i, name in ((width, "aggregate"), (2 * width + 1, "transform")):
            chunk = tensors[i + 1 : i + 1 + width]
            if chunk[0].numel() == 0:
                orders.append(None)
                continue
            orders.append(OrderPlan(index=tensors[i], plan=_unflatten(chunk, f"plan ({name})")))
        return _unflatten(tensors[:width], "plan", orders[0], orders[1], packed)

    def reread(self) -> GMSPlan:
        """The plan :attr:`buffer` holds now: its layout parsed again, its values unchecked.

        Raises:
            ValueError: an order sub-plan (no buffer), or the buffer no longer has the layout
                of a packed plan.
        """
        if self.buffer is None:
            raise ValueError(expected("gms", "plan", "a top-level plan", "an order sub-plan"))
        return GMSPlan._parse(self.buffer)

    def to(self, device: torch.device | str) -> GMSPlan:
        """The same plan with every tensor on ``device`` (checked unchanged, then copied).

        Raises:
            ValueError: the plan was edited into an inconsistent one since it was made.
        """
        packed = self.packed
        moved = packed.to(device)
        if moved is packed:
            return self
        trust_copy(self, moved)
        return _parsed(moved, trusted=True)


@dataclass(frozen=True, slots=True, eq=False)
class OrderPlan:
    """A transform-first or aggregate-first order: a position index and a smaller gms plan.

    Attributes:
        index: aggregate-first: ``[U+1]`` CSR pointer of positions per distinct (s, d);
            transform-first: ``[E]`` the distinct (s, g) row ``v`` of each position.
        plan: the sub-problem's plan (a gms problem with ``U`` or ``V`` GEMM rows).
    """

    index: torch.Tensor
    plan: GMSPlan


def built(packed: torch.Tensor) -> GMSPlan:
    """The plan a builder of this package wrote into ``packed``: sealed without validation.

    Writing into the plan's views afterwards is an edit, which the next call detects.

    Raises:
        ValueError: ``packed`` does not have the layout of a packed plan.
    """
    return _parsed(packed, trusted=True)


def _parsed(packed: torch.Tensor, *, trusted: bool) -> GMSPlan:
    """The remembered plan of ``packed``, or ``packed`` parsed, admitted and remembered."""
    hit = PARSED.get(packed)
    if isinstance(hit, GMSPlan):
        return hit
    plan = GMSPlan._parse(packed)
    admit(plan, trusted=trusted)
    remember(plan)
    return plan


def _flatten(plan: GMSPlan) -> list[torch.Tensor]:
    """``[meta, *fields]`` with ``norm`` bit-cast to int64."""
    return [
        plan.meta,
        *(
            getattr(plan, f).view(torch.int64) if f == "norm" else getattr(plan, f)
            for f in TENSOR_FIELDS
        ),
    ]


def pack(plan: GMSPlan) -> GMSPlan:
    """The plan rebuilt as views into one int64 buffer (header: magic, count, lengths).

    The buffer is ``[MAGIC, count, len_0, ..., len_{count-1}, part_0, ..., part_{count-1}]``
    with the parts ``meta, order, gather, ...`` (:attr:`GMSPlan.packed`); packing a packed plan
    gives an equal one (``pack(p).packed`` equals ``p.packed``).

    Args:
        plan: a plan whose tensors may live anywhere (sub-plans built separately). Its values
            are trusted (this is a builder's step, after :func:`fusekit.gms.plan` or
            ``plan_sorted``); a buffer assembled elsewhere goes through
            :meth:`GMSPlan.from_packed`, which checks them.

    Returns:
        The packed plan (:attr:`GMSPlan.buffer` set).
    """
    parts = _flatten(plan)
    for sub in (plan.aggregate, plan.transform):
        if sub is None:
            parts += [plan.order.new_empty(0)] * (1 + len(PLAN_PARTS))
        else:
            parts += [sub.index, *_flatten(sub.plan)]
    head = torch.tensor([MAGIC, len(parts), *(len(t) for t in parts)], device=plan.order.device)
    return built(torch.cat([head, *parts]))


def _unflatten(
    chunk: Sequence[torch.Tensor],
    name: str,
    aggregate: OrderPlan | None = None,
    transform: OrderPlan | None = None,
    buffer: torch.Tensor | None = None,
) -> GMSPlan:
    meta = chunk[0]
    values: list[int] = meta.tolist() if meta.dim() == 1 and meta.numel() == META_LENGTH else []
    if not values or values[0] != MAGIC:
        raise ValueError(expected("gms", name, "a plan made by fusekit.gms.plan", "another tensor"))
    e, n_in, n_out, s, reduce, tile_rows, schedule = values[1:]
    if not (0 <= reduce < len(REDUCES) and 0 <= schedule < len(SCHEDULES)) or tile_rows <= 0:
        raise ValueError(expected("gms", name, "a valid meta tensor", values))
    tensors = dict(zip(TENSOR_FIELDS, chunk[1:], strict=True))
    tensors["norm"] = tensors["norm"].view(torch.float64)
    plan = GMSPlan(
        num_pairs=e,
        n_in=n_in,
        n_out=n_out,
        num_segments=s,
        reduce=REDUCES[reduce],
        tile_rows=tile_rows,
        schedule=SCHEDULES[schedule],
        meta=meta,
        aggregate=aggregate,
        transform=transform,
        buffer=buffer,
        **tensors,
    )
    _check_layout(plan, name)
    object.__setattr__(plan, "parsed", True)  # its tensors are views of its buffer
    return plan


def _check_layout(plan: GMSPlan, name: str) -> None:
    """O(1) checks of lengths and dtypes (:mod:`fusekit.gms.integrity` checks the values)."""
    e = plan.num_pairs
    t = plan.tile_segment.shape[0]
    blocks, items = plan.block_ptr.shape[0], plan.item_ptr.shape[0]
    lengths = (
        ("block_ptr", max(blocks, 2)),  # at least one block
        ("item_ptr", max(items, 1)),
        ("order", e),
        ("gather", e),
        ("segment", e),
        ("scatter", e),
        ("segment_ptr", plan.num_segments + 1),
        ("tile_segment", t),
        ("tile_start", t),
        ("tile_end", t),
        ("dst_ptr", plan.n_out + 1),
        ("dst_pos", e),
        ("src_ptr", plan.n_in + 1),
        ("src_pos", e),
    )
    for field_name, length in lengths:
        tensor = getattr(plan, field_name)
        if tensor.dtype != torch.int64 or tensor.shape != (length,):
            raise ValueError(
                expected(
                    "gms",
                    f"{name}.{field_name}",
                    f"int64 of length {length}",
                    f"{str(tensor.dtype).split('.')[-1]} of shape {tuple(tensor.shape)}",
                )
            )
    if plan.reduce == "mean" and plan.norm.shape != (e,):
        raise ValueError(expected("gms", f"{name}.norm", f"of length {e}", tuple(plan.norm.shape)))
