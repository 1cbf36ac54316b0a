r"""A g-mm-s problem, validated once, and its plan: the sorting and tiling every call reuses.

.. math::

    Y[d_e, m] \mathrel{\oplus}= c_e \sum_k X[g_e, k] \, W[s_e, k, m]
    \qquad \oplus \in \{\text{sum}, \text{mean}, \text{max}\}

for pairs ``e < E`` with gather row ``g_e < N_in``, segment ``s_e < S``, scatter row
``d_e < N_out`` and optional scale ``c_e``. ``mean`` divides by the number of pairs of each output
row; a row that no pair reaches is zero for every reduce.

:func:`plan` does the index work once (RGCN epochs and convolution layers sharing a kernel map
reuse it): it sorts the pairs by (segment, destination block, scatter row), cuts each segment into
tiles, records segment offsets, per-pair ``mean`` weights, a destination CSR (for scatter kernels
that own output rows), a source CSR (for the input gradient), and the sub-problems of the
transform-first and aggregate-first orders. Index values are checked here, once. A plan is
immutable: one edited after it was made is detected at the next call and validated again
(:mod:`fusekit.gms.integrity`), and kernels still guard every index they dereference, so a plan
modified by hand cannot make them read or write out of bounds.

Importing this module does not import torch.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from fusekit.errors import expected

if TYPE_CHECKING:
    import torch

REDUCES: tuple[str, ...] = ("sum", "mean", "max")
SCHEDULES: tuple[str, ...] = ("pad", "pack")
#: Default pairs per tile: a multiple of the CPU register tile's rows and of Triton's BLOCK sizes.
TILE_ROWS = 64
#: Largest size (rows, segments, tile rows, blocks) a plan accepts: an int64 index array of
#: 2**40 entries is 8 TiB, beyond any machine; the bound keeps every product below in int64.
MAX_SIZE = 2**40
#: Bound of sizes derived by multiplication (sort keys ``s * (n_out + 1) + d``, block
#: numbers ``pairs before a row * blocks``): int64 with a factor 2 to spare.
INDEX_LIMIT = 2**62
_MAGIC = 0x676D73  # "gms": the first entry of every plan's meta tensor
_INDEX_DTYPES = ("torch.int32", "torch.int64")


@dataclass(frozen=True, slots=True, eq=False)
class GMSProblem:
    """The indices of a g-mm-s problem, validated; operands ``x``, ``w`` and ``c`` come per call.

    Build it with :meth:`create`, which checks every index once.

    Attributes:
        gather: ``g[E]`` int64, rows of ``x``.
        segment: ``s[E]`` int64, which weight matrix.
        scatter: ``d[E]`` int64, rows of the output.
        n_out: output rows ``N_out``.
        n_in: rows ``x`` must have at least (given, or ``max(g) + 1``).
        num_segments: weight matrices ``w`` must have at least (given, or ``max(s) + 1``).
        reduce: ``"sum"``, ``"mean"`` or ``"max"``.
    """

    gather: torch.Tensor
    segment: torch.Tensor
    scatter: torch.Tensor
    n_out: int
    n_in: int
    num_segments: int
    reduce: str = "sum"

    @property
    def num_pairs(self) -> int:
        """``E``, the number of (gather, segment, scatter) pairs."""
        return int(self.gather.shape[0])

    @classmethod
    def create(
        cls,
        gather: torch.Tensor,
        segment: torch.Tensor,
        scatter: torch.Tensor,
        n_out: int,
        *,
        n_in: int | None = None,
        num_segments: int | None = None,
        reduce: str = "sum",
    ) -> GMSProblem:
        """Validate the indices of a problem.

        Args:
            gather: ``g[E]``, int32 or int64, values in ``[0, n_in)``.
            segment: ``s[E]``, values in ``[0, num_segments)``.
            scatter: ``d[E]``, values in ``[0, n_out)``.
            n_out: output rows.
            n_in: rows of ``x``, if known now (otherwise checked against ``x`` per call).
            num_segments: weight matrices, if known now.
            reduce: ``"sum"``, ``"mean"`` or ``"max"``.

        Returns:
            The problem, holding contiguous int64 copies of the indices.

        Raises:
            TypeError: an index is not an integer tensor, or a size is not an int.
            ValueError: lengths, dimensions or devices differ, a size is negative, an index is
                out of range, or ``reduce`` is unknown.
        """
        import torch

        n_out = _check_size("n_out", n_out)
        if n_in is not None:
            n_in = _check_size("n_in", n_in)
        if num_segments is not None:
            num_segments = _check_size("num_segments", num_segments)
        if reduce not in REDUCES:
            raise ValueError(expected("gms", "reduce", " or ".join(REDUCES), repr(reduce)))
        named = {"gather": gather, "segment": segment, "scatter": scatter}
        for name, index in named.items():
            if not isinstance(index, torch.Tensor):
                raise TypeError(expected("gms", name, "a torch.Tensor", type(index).__name__))
            if str(index.dtype) not in _INDEX_DTYPES:
                raise TypeError(
                    expected("gms", name, "an int32/int64 tensor", str(index.dtype).split(".")[-1])
                )
            if index.dim() != 1:
                raise ValueError(expected("gms", name, "1-D", f"shape {tuple(index.shape)}"))
            if index.shape[0] != gather.shape[0]:
                raise ValueError(
                    expected(
                        "gms",
                        name,
                        f"of length {gather.shape[0]} like 'gather'",
                        f"length {index.shape[0]}",
                    )
                )
            if index.device != gather.device:
                raise ValueError(
                    expected("gms", name, f"on {gather.device} like 'gather'", str(index.device))
                )
        g, s, d = (named[k].to(torch.int64).contiguous() for k in named)
        g_max = _check_range("gather", g, n_in, "n_in")
        s_max = _check_range("segment", s, num_segments, "num_segments")
        _check_range("scatter", d, n_out, "n_out")
        n_in = g_max + 1 if n_in is None else n_in
        num_segments = s_max + 1 if num_segments is None else num_segments
        rows = max(n_in, n_out) + 1
        _check_product("num_segments * (max(n_in, n_out) + 1)", num_segments * rows)
        return cls(
            gather=g,
            segment=s,
            scatter=d,
            n_out=n_out,
            n_in=n_in,
            num_segments=num_segments,
            reduce=reduce,
        )


def _check_size(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(expected("gms", name, "an int", type(value).__name__))
    if value < 0:
        raise ValueError(expected("gms", name, ">= 0", value))
    if value > MAX_SIZE:
        raise ValueError(expected("gms", name, f"<= 2**{MAX_SIZE.bit_length() - 1}", value))
    return value


def _check_product(name: str, value: int) -> None:
    """Raise unless a size derived by multiplication stays clear of int64 overflow."""
    if value >= INDEX_LIMIT:
        raise ValueError(expected("gms", name, f"< 2**{INDEX_LIMIT.bit_length() - 1}", value))


def _check_range(name: str, index: torch.Tensor, bound: int | None, bound_name: str) -> int:
    """Raise on the first index outside ``[0, bound)``; return the largest index (-1 if empty)."""
    import torch

    if index.numel() == 0:
        return -1
    low, high = torch.aminmax(index)
    lo, hi = int(low), int(high)
    limit = bound if bound is not None else None
    if lo < 0 or (limit is not None and hi >= limit):
        bad = index < 0 if lo < 0 else index >= limit  # type: ignore[operator]
        at = int(torch.nonzero(bad)[0, 0])
        span = f"[0, {limit})" if limit is not None else f"[0, {bound_name})"
        raise ValueError(
            expected("gms", name, f"indices in {span}", f"{int(index[at])} at pair {at}")
        )
    return hi


# ---------------------------------------------------------------------------------------------
# the plan
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
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
        memo: per-plan derived values kernels reuse across calls (host views, the mean weights
            in the compute dtype); a plan changed with ``dataclasses.replace`` starts empty.
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
    memo: dict[Any, Any] = field(init=False, default_factory=dict, repr=False, compare=False)
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
        passing it costs nothing; ``norm`` is stored bit-cast to int64.
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
        last few plans parsed are remembered (keyed by the tensor object and its version
        counter, so an in-place edit is parsed and validated again): an epoch of calls parses
        once.

        Raises:
            ValueError: the tensor does not have the layout of a packed plan, or does not hold
                a consistent problem.
        """
        return cls._from_buffer(packed, trusted=False)

    @classmethod
    def _from_buffer(cls, packed: torch.Tensor, *, trusted: bool) -> GMSPlan:
        """:meth:`from_packed`; ``trusted``: a builder of this package wrote ``packed``."""
        from fusekit.gms.integrity import admit

        with _PARSED_LOCK:
            hit = _PARSED.get(id(packed))
            if hit is not None and hit[0].buffer is packed and hit[1] == packed._version:
                _PARSED.move_to_end(id(packed))
                return hit[0]
        parsed = cls._parse(packed)
        admit(parsed, trusted=trusted)
        remember(parsed)
        return parsed

    @classmethod
    def _parse(cls, packed: torch.Tensor) -> GMSPlan:
        import torch

        count = 3 * (1 + len(_TENSOR_FIELDS)) + 2
        head = packed[: 2 + count].tolist() if packed.dtype == torch.int64 else []
        if len(head) != 2 + count or head[0] != _MAGIC or head[1] != count:
            raise ValueError(
                expected("gms", "plan", "GMSPlan.packed of fusekit.gms.plan(...)", "another tensor")
            )
        lengths = head[2:]
        if min(lengths) < 0 or sum(lengths) != packed.shape[0] - 2 - count:
            raise ValueError(expected("gms", "plan", "a consistent packed plan", lengths[:8]))
        tensors = torch.split(packed[2 + count :], lengths)
        width = 1 + len(_TENSOR_FIELDS)
        orders = []
        for i, name in ((width, "aggregate"), (2 * width + 1, "transform")):
            chunk = tensors[i + 1 : i + 1 + width]
            if chunk[0].numel() == 0:
                orders.append(None)
                continue
            orders.append(OrderPlan(index=tensors[i], plan=_unflatten(chunk, f"plan ({name})")))
        return _unflatten(tensors[:width], "plan", orders[0], orders[1], packed)

    def to(self, device: torch.device | str) -> GMSPlan:
        """The same plan with every tensor on ``device`` (checked unchanged, then copied).

        Raises:
            ValueError: the plan was edited into an inconsistent one since it was made.
        """
        from fusekit.gms.integrity import trust_copy

        packed = self.packed
        moved = packed.to(device)
        if moved is packed:
            return self
        trust_copy(self, moved)
        return GMSPlan._from_buffer(moved, trusted=True)


#: Plans parsed by :meth:`GMSPlan.from_packed`, most recent last (each keeps its buffer alive).
_PARSED: OrderedDict[int, tuple[GMSPlan, int]] = OrderedDict()
_PARSED_KEPT = 16
#: Guards :data:`_PARSED`: parses, registrations and the pool's sweep may run on several threads.
_PARSED_LOCK = threading.RLock()


def remember(plan: GMSPlan) -> None:
    """Make ``plan`` what :meth:`GMSPlan.from_packed` returns for its buffer at its version.

    Called when a plan hands out :attr:`GMSPlan.packed`: the op that receives the buffer then
    works on this very plan, so what was memoised on it (``memo``: host views, the transposed
    plan of the input gradient, a mirrored-pairs mark) is not lost to a second parse. The memo
    is stamped with the buffer's version; if the buffer was edited in place since (its version
    moved), everything derived from the old contents is dropped first, as a fresh parse would.
    Only a plan parsed from its buffer is remembered: one changed with ``dataclasses.replace``
    may hold tensors that are not the buffer's, and the op reads the buffer.
    """
    if plan.buffer is None or not plan.parsed:
        return
    version = plan.buffer._version
    if plan.memo.setdefault("buffer version", version) != version:
        plan.memo.clear()
        plan.memo["buffer version"] = version
    with _PARSED_LOCK:
        key = id(plan.buffer)
        _PARSED[key] = (plan, version)
        _PARSED.move_to_end(key)
        if len(_PARSED) > _PARSED_KEPT:
            _PARSED.popitem(last=False)


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


_TENSOR_FIELDS: tuple[str, ...] = tuple(
    f.name
    for f in fields(GMSPlan)
    if f.name
    not in {
        "num_pairs",
        "n_in",
        "n_out",
        "num_segments",
        "reduce",
        "tile_rows",
        "schedule",
        "meta",
        "aggregate",
        "transform",
        "buffer",
        "memo",
        "parsed",
    }
)


def _replace(plan: GMSPlan, **changes: Any) -> GMSPlan:
    values = {name: getattr(plan, name) for name in _FIELD_NAMES}
    values.update(changes)
    return GMSPlan(**values)


_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(GMSPlan) if f.init)


def _flatten(plan: GMSPlan) -> list[torch.Tensor]:
    """``[meta, *fields]`` with ``norm`` bit-cast to int64."""
    import torch

    return [
        plan.meta,
        *(
            getattr(plan, f).view(torch.int64) if f == "norm" else getattr(plan, f)
            for f in _TENSOR_FIELDS
        ),
    ]


def pack(plan: GMSPlan) -> GMSPlan:
    """The plan rebuilt as views into one int64 buffer (header: magic, count, lengths).

    The buffer is ``[MAGIC, count, len_0, ..., len_{count-1}, part_0, ..., part_{count-1}]``
    with the parts ``meta, order, gather, ...`` (:attr:`GMSPlan.packed`); packing a packed plan
    gives an equal one (``pack(p).packed`` equals ``p.packed``).

    Args:
        plan: a plan whose tensors may live anywhere (sub-plans built separately). Its values
            are trusted (this is a builder's step, after :func:`plan` or ``plan_sorted``); a
            buffer assembled elsewhere goes through :meth:`GMSPlan.from_packed`, which checks
            them.

    Returns:
        The packed plan (:attr:`GMSPlan.buffer` set).
    """
    import torch

    parts = _flatten(plan)
    for sub in (plan.aggregate, plan.transform):
        if sub is None:
            parts += [plan.order.new_empty(0)] * (2 + len(_TENSOR_FIELDS))
        else:
            parts += [sub.index, *_flatten(sub.plan)]
    head = torch.tensor([_MAGIC, len(parts), *(len(t) for t in parts)], device=plan.order.device)
    return GMSPlan._from_buffer(torch.cat([head, *parts]), trusted=True)


def _unflatten(
    chunk: Sequence[torch.Tensor],
    name: str,
    aggregate: OrderPlan | None = None,
    transform: OrderPlan | None = None,
    buffer: torch.Tensor | None = None,
) -> GMSPlan:
    import torch

    meta = chunk[0]
    values = meta.tolist() if meta.dim() == 1 and meta.numel() == 8 else [None]
    if values[0] != _MAGIC:
        raise ValueError(expected("gms", name, "a plan made by fusekit.gms.plan", "another tensor"))
    e, n_in, n_out, s, reduce, tile_rows, schedule = values[1:]
    if not (0 <= reduce < len(REDUCES) and 0 <= schedule < len(SCHEDULES)) or tile_rows <= 0:
        raise ValueError(expected("gms", name, "a valid meta tensor", values))
    tensors = dict(zip(_TENSOR_FIELDS, chunk[1:], strict=True))
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
    import torch

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


# ---------------------------------------------------------------------------------------------
# packing plans written elsewhere: pairs already in plan order
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class PlanBuffer:
    """An allocated packed plan, its header and meta written, its tensors to be filled in place.

    Attributes:
        buffer: the int64 buffer :attr:`GMSPlan.packed` will be.
        views: every tensor field of :class:`GMSPlan` (``"order"``, ``"gather"``, ...,
            ``"src_pos"``) as a view into ``buffer``, uninitialised (``norm`` as int64 bits).
    """

    buffer: torch.Tensor
    views: dict[str, torch.Tensor]

    def plan(self) -> GMSPlan:
        """The plan, once every view is filled (the layout checked, the values trusted).

        The plan is sealed here (:func:`fusekit.gms.integrity.admit`): writing into a view
        afterwards is an edit, which the next call detects.
        """
        return GMSPlan._from_buffer(self.buffer, trusted=True)


#: Host buffers of plans that :func:`_plan_storage` hands out again once nothing views them.
_POOL: list[Any] = []
_POOL_KEPT = 4
_POOL_LOCK = threading.Lock()


def _pool_free(j: int) -> bool:
    """Whether nothing but the pool holds ``_POOL[j]``.

    A tensor made by ``torch.from_numpy`` keeps one reference to its array for as long as any
    tensor or view shares its storage, and a numpy view references its base, so the array's
    reference count is 2 here (the pool's list and this call's argument) exactly when no view
    of it is alive anywhere.
    """
    return sys.getrefcount(_POOL[j]) == 2


#: References to a plan while :func:`_forget_parsed` looks at it when only the parse memo holds
#: it: its ``(plan, version)`` entry and ``sys.getrefcount``'s argument.
_MEMO_ONLY_REFS = 2


def _forget_parsed(j: int) -> None:
    """Drop the entries of :meth:`GMSPlan.from_packed`'s memo that view ``_POOL[j]``.

    The memo keeps the last 16 plans alive, so a plan nobody else holds would pin its buffer
    for 16 more plans. Only plans that nothing but the memo holds are dropped: a plan a layer
    keeps (with its memo: the transposed plan, a mirrored mark) stays what ``from_packed``
    returns, and its buffer is not free anyway.
    """
    base = _POOL[j].ctypes.data
    with _PARSED_LOCK:
        for key, entry in list(_PARSED.items()):
            if _views(entry[0].buffer, base) and sys.getrefcount(entry[0]) <= _MEMO_ONLY_REFS:
                del _PARSED[key]


def _views(buffer: torch.Tensor | None, base: int) -> bool:
    """Whether a parsed plan's ``buffer`` lives in the host memory starting at ``base``."""
    return (
        buffer is not None
        and buffer.device.type == "cpu"
        and buffer.untyped_storage().data_ptr() == base
    )


def _pooled(numel: int) -> torch.Tensor | None:
    """A pooled buffer of at least ``numel`` (at most twice) that nothing views, or ``None``.

    A candidate is first freed of the parse memo's entries (:func:`_forget_parsed`).
    """
    import torch

    for j in sorted(range(len(_POOL)), key=lambda j: _POOL[j].shape[0]):
        if not numel <= _POOL[j].shape[0] <= 2 * numel:
            continue
        _forget_parsed(j)
        if _pool_free(j):
            return torch.from_numpy(_POOL[j][:numel])
    return None


def _plan_storage(numel: int, device: torch.device | str) -> torch.Tensor:
    """An uninitialised int64 tensor of ``numel`` for a packed plan, its pages cheap to fill.

    A fresh plan is tens of megabytes (a 160k-voxel kernel map: 50 MB) written once. In pages
    just mapped that costs a fault and a zeroed page per 4 KiB (filling 50 MB measured 26 ms in
    a fresh ``torch.empty`` buffer, 6.1 ms in mapped pages), and a plan is built per fresh
    kernel map. So CPU buffers are kept in a small pool (:data:`_POOL`, 4 buffers) and handed
    out again once no tensor views them (:func:`_pool_free`): a plan still held (a map cached
    under an ``indice_key``) is never overwritten. New ones come from numpy, which advises
    transparent huge pages for arrays of 4 MiB and more. Reference: ``torch.empty``, as on
    other devices.
    """
    import numpy as np
    import torch

    if torch.device(device).type != "cpu":
        return torch.empty(numel, dtype=torch.int64, device=device)
    with _POOL_LOCK:
        reused = _pooled(numel)
        if reused is not None:
            return reused
        base = np.empty(numel, np.int64)
        out = torch.from_numpy(base)
        _POOL.append(base)
        if len(_POOL) > _POOL_KEPT:  # forget the oldest buffer nothing views, else the oldest
            free = [j for j in range(len(_POOL) - 1) if _pool_free(j)]
            del _POOL[free[0] if free else 0]
        return out


def release_buffers() -> None:
    """Free the host memory gms keeps between calls for reuse.

    The pooled plan buffers (:func:`_plan_storage`: up to 4, 55 MB each at 160k voxels), the
    parse memo's plans that nothing else holds (:meth:`GMSPlan.from_packed`), and the calling
    thread's scratch buffers (:func:`fusekit.gms.kernels.cpu.rows.scratch`). A plan still held
    (a layer's map cached under an ``indice_key``, an autograd graph) keeps its buffer and
    stays valid; later calls allocate anew.
    """
    from fusekit.gms.kernels.cpu.rows import release_scratch

    with _POOL_LOCK, _PARSED_LOCK:
        for key, entry in list(_PARSED.items()):
            if sys.getrefcount(entry[0]) <= _MEMO_ONLY_REFS:
                del _PARSED[key]
        _POOL.clear()
    release_scratch()


def empty_plan(
    *,
    num_pairs: int,
    n_in: int,
    n_out: int,
    num_segments: int,
    num_tiles: int,
    num_blocks: int,
    num_items: int,
    tile_rows: int,
    schedule: str,
    reduce: str = "sum",
    device: torch.device | str = "cpu",
) -> PlanBuffer:
    """Allocate a packed plan without orders for a builder that writes its tensors in place.

    A builder that already has its pairs in plan order (a kernel map, written offset by offset)
    fills :attr:`PlanBuffer.views` directly and skips :func:`plan`'s sorts and :func:`pack`'s
    copy. Lengths: ``E`` for ``order, gather, segment, scatter, dst_pos, src_pos`` (and
    ``norm`` for mean), ``S + 1`` for ``segment_ptr``, ``T`` for the tiles, ``B + 1``, ``I + 1``,
    ``N_out + 1`` and ``N_in + 1`` for the pointers.

    Raises:
        TypeError, ValueError: a size is not a non-negative int; ``reduce`` or ``schedule``
            unknown; ``tile_rows`` or ``num_blocks`` not positive.
    """
    import torch

    sizes = {
        "num_pairs": num_pairs,
        "n_in": n_in,
        "n_out": n_out,
        "num_segments": num_segments,
        "num_tiles": num_tiles,
        "num_items": num_items,
    }
    e, n_in, n_out, s, t, items = (_check_size(k, v) for k, v in sizes.items())
    for name, value in (("tile_rows", tile_rows), ("num_blocks", num_blocks)):
        if _check_size(name, value) == 0:
            raise ValueError(expected("gms", name, "> 0", value))
    if reduce not in REDUCES:
        raise ValueError(expected("gms", "reduce", " or ".join(REDUCES), repr(reduce)))
    if schedule not in SCHEDULES:
        raise ValueError(expected("gms", "schedule", " or ".join(SCHEDULES), repr(schedule)))
    lengths = {
        "order": e,
        "gather": e,
        "segment": e,
        "scatter": e,
        "norm": e if reduce == "mean" else 0,
        "segment_ptr": s + 1,
        "tile_segment": t,
        "tile_start": t,
        "tile_end": t,
        "block_ptr": num_blocks + 1,
        "item_ptr": items + 1,
        "dst_ptr": n_out + 1,
        "dst_pos": e,
        "src_ptr": n_in + 1,
        "src_pos": e,
    }
    if tuple(lengths) != _TENSOR_FIELDS:
        raise RuntimeError(f"gms: GMSPlan fields changed: {_TENSOR_FIELDS}")
    parts = [8, *lengths.values()] + [0] * (2 * (2 + len(_TENSOR_FIELDS)))
    head = [_MAGIC, len(parts), *parts]
    buffer = _plan_storage(len(head) + sum(parts), device)
    meta = [_MAGIC, e, n_in, n_out, s, REDUCES.index(reduce), tile_rows]
    buffer[: len(head) + 8] = torch.tensor([*head, *meta, SCHEDULES.index(schedule)])
    views = dict(
        zip(_TENSOR_FIELDS, torch.split(buffer[len(head) + 8 :], parts[1:16]), strict=False)
    )
    return PlanBuffer(buffer, views)


def empty_plan_with_tiles(
    tiles: Mapping[str, torch.Tensor],
    *,
    num_pairs: int,
    n_in: int,
    n_out: int,
    num_segments: int,
    num_blocks: int,
    tile_rows: int,
    schedule: str,
    device: torch.device | str = "cpu",
) -> PlanBuffer:
    """:func:`empty_plan` sized by ``tiles`` (:func:`tiles_of_runs`), with the tiles written."""
    out = empty_plan(
        num_pairs=num_pairs,
        n_in=n_in,
        n_out=n_out,
        num_segments=num_segments,
        num_tiles=len(tiles["tile_start"]),
        num_blocks=num_blocks,
        num_items=len(tiles["item_ptr"]) - 1,
        tile_rows=tile_rows,
        schedule=schedule,
        device=device,
    )
    for name, value in tiles.items():
        out.views[name].copy_(value)
    return out


def block_rows(dst_ptr: torch.Tensor, blocks: int) -> torch.Tensor:
    r"""The first output row of each destination block, ``[B + 1]`` (the last is ``N_out``).

    Row ``r`` belongs to block :math:`\min(\lfloor \text{dst\_ptr}[r] \, B / E \rfloor, B - 1)`
    (:func:`plan`'s step 1), a non-decreasing function of ``r``, so block ``b`` starts at the
    first row whose block is ``b``. Computed on the host (numpy: no thread-pool wake-ups for
    an O(N) pass), returned on ``dst_ptr``'s device.
    """
    import numpy as np
    import torch

    ptr = dst_ptr.cpu().numpy()
    e = int(ptr[-1]) if len(ptr) else 0
    row_block = np.minimum(ptr[:-1] * blocks // max(e, 1), blocks - 1)
    first = np.searchsorted(row_block, np.arange(blocks + 1))
    return torch.from_numpy(first.astype(np.int64)).to(dst_ptr.device)


def tiles_of_runs(run_ptr: torch.Tensor, tile_rows: int, schedule: str) -> dict[str, torch.Tensor]:
    """Tiles and work items (:func:`plan`'s steps 3 and 4) of pairs in plan order.

    Computed on the host (numpy; ``T`` is about ``E / tile_rows``), returned on ``run_ptr``'s
    device.

    Args:
        run_ptr: ``[S, B + 1]`` int64, positions ``[run_ptr[s, b], run_ptr[s, b + 1])`` are the
            pairs of segment ``s`` in destination block ``b`` (``run_ptr[s, B]`` = the
            segment's end).
        tile_rows: most pairs per tile.
        schedule: ``"pad"`` (an item per tile) or ``"pack"`` (a block's tiles in windows of
            ``tile_rows`` pairs).

    Returns:
        ``tile_segment``, ``tile_start``, ``tile_end`` (tiles listed by (block, segment)),
        ``block_ptr`` and ``item_ptr``.
    """
    import numpy as np
    import torch

    runs = run_ptr.cpu().numpy()
    s, b1 = runs.shape
    start = runs[:, :-1].T.reshape(-1)  # runs listed by (block, segment)
    end = runs[:, 1:].T.reshape(-1)
    per_run = (end - start + tile_rows - 1) // tile_rows
    run_of_tile = np.repeat(np.arange(len(start)), per_run)
    first = np.cumsum(per_run) - per_run
    tile_start = start[run_of_tile] + (np.arange(len(run_of_tile)) - first[run_of_tile]) * tile_rows
    tile_end = np.minimum(tile_start + tile_rows, end[run_of_tile])
    tile_block = run_of_tile // s
    block_ptr = np.zeros(b1, np.int64)
    np.cumsum(np.bincount(tile_block, minlength=b1 - 1), out=block_ptr[1:])
    n_tiles = len(tile_start)
    if schedule == "pad":
        item_ptr = np.arange(n_tiles + 1)
    else:  # windows of tile_rows pairs within a block
        rows = tile_end - tile_start
        before = np.cumsum(rows) - rows  # pairs in the tiles before each tile
        # a tile's window counts from its block's first tile (empty blocks have no tiles)
        window = (before - before[block_ptr[tile_block]]) // tile_rows if n_tiles else rows
        change = np.ones(n_tiles, bool)
        change[1:] = (tile_block[1:] != tile_block[:-1]) | (window[1:] != window[:-1])
        item_ptr = np.concatenate([np.flatnonzero(change), [n_tiles]])
    out = {
        "tile_segment": run_of_tile % s,
        "tile_start": tile_start,
        "tile_end": tile_end,
        "block_ptr": block_ptr,
        "item_ptr": item_ptr,
    }
    return {k: torch.from_numpy(v.astype(np.int64)).to(run_ptr.device) for k, v in out.items()}


def plan_sorted(
    gather: torch.Tensor,
    segment: torch.Tensor,
    scatter: torch.Tensor,
    *,
    n_in: int,
    n_out: int,
    num_segments: int,
    tile_rows: int = TILE_ROWS,
    blocks: int | None = None,
    schedule: str = "pad",
    csr: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> GMSPlan:
    """:func:`plan` without orders of pairs already in plan order, without sorting them.

    Pairs sorted by (segment, scatter row) are in :func:`plan`'s (segment, block, scatter row)
    order for every ``blocks`` (a block is a range of rows), so the plan is the pairs as they
    are, ``segment_ptr`` and the runs of each (segment, block) found by binary search, the
    tiles of :func:`tiles_of_runs`, and the CSRs (given, or stable sorts). Equal, field by
    field, to ``plan(GMSProblem.create(...), orders=False)`` (sum reduce).

    Args:
        gather: ``[E]`` int64 input rows, in plan order.
        segment: ``[E]`` int64 segments, non-decreasing.
        scatter: ``[E]`` int64 output rows, non-decreasing within a segment.
        n_in: input rows (gather indices lie below).
        n_out: output rows.
        num_segments: ``S``.
        tile_rows: as :func:`plan`.
        blocks: as :func:`plan`.
        schedule: as :func:`plan`.
        csr: ``(dst_ptr, dst_pos, src_ptr, src_pos)`` if the caller has them.

    Returns:
        The packed plan.

    Raises:
        ValueError: the pairs are not sorted by (segment, scatter row), an index is out of
            range, or a knob is invalid.
    """
    import torch

    problem = GMSProblem.create(
        gather, segment, scatter, n_out, n_in=n_in, num_segments=num_segments
    )
    g, s, d = problem.gather, problem.segment, problem.scatter
    e = problem.num_pairs
    blocks = default_blocks(g.device) if blocks is None else blocks
    key = s * (n_out + 1) + d
    if e > 1 and bool((key[1:] < key[:-1]).any()):
        raise ValueError(expected("gms", "pairs", "sorted by (segment, scatter row)", "unsorted"))
    if csr is None:
        dst_ptr = _ptr(torch.bincount(d, minlength=n_out))
        src_ptr = _ptr(torch.bincount(g, minlength=n_in))
        csr = (
            dst_ptr,
            torch.sort(d, stable=True).indices,
            src_ptr,
            torch.sort(g, stable=True).indices,
        )
    dst_ptr, dst_pos, src_ptr, src_pos = (torch.as_tensor(t, device=g.device) for t in csr)
    segment_ptr = torch.searchsorted(s, torch.arange(num_segments + 1, device=g.device))
    first_row = block_rows(dst_ptr, blocks)
    # run (s, b): the pairs of segment s with scatter row in [first_row[b], first_row[b + 1])
    run_ptr = torch.empty(num_segments, blocks + 1, dtype=torch.int64, device=g.device)
    for seg in range(num_segments):
        lo, hi = int(segment_ptr[seg]), int(segment_ptr[seg + 1])
        run_ptr[seg] = lo + torch.searchsorted(d[lo:hi], first_row)
    out = empty_plan_with_tiles(
        tiles_of_runs(run_ptr, tile_rows, schedule),
        num_pairs=e,
        n_in=n_in,
        n_out=n_out,
        num_segments=num_segments,
        num_blocks=blocks,
        tile_rows=tile_rows,
        schedule=schedule,
        device=g.device,
    )
    torch.arange(e, out=out.views["order"])
    values = {"gather": g, "segment": s, "scatter": d, "segment_ptr": segment_ptr}
    values |= {"dst_ptr": dst_ptr, "dst_pos": dst_pos, "src_ptr": src_ptr, "src_pos": src_pos}
    for name, value in values.items():
        out.views[name].copy_(value)
    return out.plan()


# ---------------------------------------------------------------------------------------------
# planning
# ---------------------------------------------------------------------------------------------


def default_blocks(device: torch.device | str) -> int:
    """Destination blocks of a plan: 4 per CPU thread (load balance), 1 on a GPU (atomics)."""
    import torch

    if torch.device(device).type == "cpu":
        return 4 * torch.get_num_threads()
    return 1


def plan(
    problem: GMSProblem,
    *,
    tile_rows: int = TILE_ROWS,
    blocks: int | None = None,
    schedule: str = "pad",
    orders: bool = True,
) -> GMSPlan:
    """Sort, tile and index a problem once; every later call with the same indices reuses it.

    Steps (all O(E log E) sorts or O(E) scans, on the problem's device):

    1. destination blocks: output rows split into ``blocks`` contiguous ranges with about
       ``E / blocks`` pairs each (a row is never split);
    2. order pairs by (segment, block, scatter row): segments are contiguous (``segment_ptr``),
       each block's share of a segment is contiguous, rows of a block are consecutive;
    3. tiles: each (segment, block) run is cut into tiles of at most ``tile_rows`` pairs
       (the last one padded); tiles are listed by (block, segment) with ``block_ptr``;
    4. work items: ``pad`` gives each tile its own item; ``pack`` joins consecutive small tiles of
       a block until an item holds about ``tile_rows`` pairs;
    5. CSRs by scatter row and by gather row; ``mean`` weights ``1 / deg(d)``;
    6. orders: the distinct (s, d) groups (aggregate-first, not for max) and the distinct
       (s, g) rows (transform-first), each with the plan of its smaller GEMM.

    Args:
        problem: the validated indices.
        tile_rows: most pairs per tile (> 0).
        blocks: destination blocks; default :func:`default_blocks` of the problem's device.
        schedule: ``"pad"`` or ``"pack"``.
        orders: also plan the transform-first and aggregate-first orders.

    Returns:
        The plan.

    Raises:
        TypeError: ``problem`` is not a :class:`GMSProblem`, or a size is not an int.
        ValueError: ``tile_rows`` or ``blocks`` is not positive, or ``schedule`` is unknown.
    """
    if not isinstance(problem, GMSProblem):
        raise TypeError(
            expected("gms", "problem", "a GMSProblem (see GMSProblem.create)", type(problem))
        )
    # checked again (O(E), next to the sorts): a GMSProblem may be built without create()
    problem = GMSProblem.create(
        problem.gather,
        problem.segment,
        problem.scatter,
        problem.n_out,
        n_in=problem.n_in,
        num_segments=problem.num_segments,
        reduce=problem.reduce,
    )
    tile_rows = _check_size("tile_rows", tile_rows)
    if tile_rows == 0:
        raise ValueError(expected("gms", "tile_rows", "> 0", tile_rows))
    if blocks is None:
        blocks = default_blocks(problem.gather.device)
    blocks = _check_size("blocks", blocks)
    if blocks == 0:
        raise ValueError(expected("gms", "blocks", "> 0", blocks))
    if schedule not in SCHEDULES:
        raise ValueError(expected("gms", "schedule", " or ".join(SCHEDULES), repr(schedule)))
    _check_product("num_pairs * blocks", problem.num_pairs * blocks)
    _check_product("num_pairs + tile_rows", problem.num_pairs + tile_rows)
    base = _plan(problem, tile_rows, blocks, schedule)
    if orders:
        base = _with_orders(base, problem, tile_rows, blocks, schedule)
    return pack(base)


def _plan(p: GMSProblem, tile_rows: int, blocks: int, schedule: str) -> GMSPlan:
    import torch

    g, s, d = p.gather, p.segment, p.scatter
    e = p.num_pairs
    dev = g.device
    i64 = torch.int64

    # 1. destination blocks balanced by pair count: block of row i = floor(pairs before i * B / E)
    deg = torch.bincount(d, minlength=p.n_out)
    before = torch.cumsum(deg, 0) - deg
    row_block = torch.div(before * blocks, max(e, 1), rounding_mode="floor").clamp_(max=blocks - 1)
    pair_block = row_block[d]

    # 2. order by (segment, block, scatter row), ties by pair index: three stable sorts
    order = torch.sort(d, stable=True).indices
    order = order[torch.sort(pair_block[order], stable=True).indices]
    order = order[torch.sort(s[order], stable=True).indices]
    gs, ss, ds, bs = g[order], s[order], d[order], pair_block[order]
    segment_ptr = _ptr(torch.bincount(ss, minlength=p.num_segments))

    # 3. tiles of each (segment, block) run, listed by (block, segment)
    run_start = _run_starts(ss, bs)
    run_end = torch.cat([run_start[1:], torch.tensor([e], dtype=i64, device=dev)])[: len(run_start)]
    per_run = torch.div(run_end - run_start + tile_rows - 1, tile_rows, rounding_mode="floor")
    run_of_tile = torch.repeat_interleave(torch.arange(len(run_start), device=dev), per_run)
    first_tile = _ptr(per_run)[:-1]
    k = torch.arange(len(run_of_tile), device=dev) - first_tile[run_of_tile]
    tile_start = run_start[run_of_tile] + k * tile_rows
    tile_end = torch.minimum(tile_start + tile_rows, run_end[run_of_tile])
    tile_block = bs[tile_start] if e else tile_start
    by_block = torch.sort(tile_block, stable=True).indices
    tile_start, tile_end, tile_block = (
        tile_start[by_block],
        tile_end[by_block],
        tile_block[by_block],
    )
    tile_segment = ss[tile_start] if e else tile_start
    block_ptr = _ptr(torch.bincount(tile_block, minlength=blocks))

    # 4. work items
    if schedule == "pad":
        item_ptr = torch.arange(len(tile_start) + 1, device=dev)
    else:
        rows = tile_end - tile_start
        window = torch.div(
            torch.cumsum(rows, 0) - rows - _ptr_at(block_ptr, rows),
            tile_rows,
            rounding_mode="floor",
        )
        item_ptr = torch.cat(
            [_run_starts(tile_block, window), torch.tensor([len(rows)], device=dev)]
        )

    # 5. CSRs and mean weights
    dst_pos = torch.sort(ds, stable=True).indices
    src_pos = torch.sort(gs, stable=True).indices
    norm = (1.0 / deg[ds].to(torch.float64)) if p.reduce == "mean" else gs.new_empty(0).double()
    meta = [_MAGIC, e, p.n_in, p.n_out, p.num_segments, REDUCES.index(p.reduce), tile_rows]
    meta.append(SCHEDULES.index(schedule))
    base = GMSPlan(
        meta=torch.tensor(meta, dtype=i64, device=dev),
        num_pairs=e,
        n_in=p.n_in,
        n_out=p.n_out,
        num_segments=p.num_segments,
        reduce=p.reduce,
        tile_rows=tile_rows,
        schedule=schedule,
        order=order,
        gather=gs,
        segment=ss,
        scatter=ds,
        norm=norm,
        segment_ptr=segment_ptr,
        tile_segment=tile_segment,
        tile_start=tile_start,
        tile_end=tile_end,
        block_ptr=block_ptr,
        item_ptr=item_ptr,
        dst_ptr=_ptr(deg),
        dst_pos=dst_pos,
        src_ptr=_ptr(torch.bincount(gs, minlength=p.n_in)),
        src_pos=src_pos,
    )
    return base


def _with_orders(
    base: GMSPlan, p: GMSProblem, tile_rows: int, blocks: int, schedule: str
) -> GMSPlan:
    import torch

    e, dev, i64 = base.num_pairs, base.device, torch.int64
    gs, ss, ds = base.gather, base.segment, base.scatter

    def sub_plan(gather: torch.Tensor, segment: torch.Tensor, scatter: torch.Tensor, n_out: int):
        sub = GMSProblem(
            gather=gather,
            segment=segment,
            scatter=scatter,
            n_out=n_out,
            n_in=int(gather.max()) + 1 if gather.numel() else 0,
            num_segments=p.num_segments,
        )
        return _plan(sub, tile_rows, blocks, schedule)

    # 6a. aggregate-first: positions with equal (s, d) are already adjacent (d decides the block)
    aggregate = None
    if p.reduce != "max":
        starts = _run_starts(ss, ds)
        u = len(starts)
        aggregate = OrderPlan(
            index=torch.cat([starts, torch.tensor([e], dtype=i64, device=dev)]),
            plan=sub_plan(torch.arange(u, device=dev), ss[starts], ds[starts], p.n_out),
        )
    # 6b. transform-first: distinct (s, g), sorted by segment
    by_sg = torch.sort(gs, stable=True).indices
    by_sg = by_sg[torch.sort(ss[by_sg], stable=True).indices]
    starts = _run_starts(ss[by_sg], gs[by_sg])
    v = len(starts)
    row_of = torch.zeros(e, dtype=i64, device=dev)
    if e:
        new_row = torch.zeros(e, dtype=i64, device=dev)
        new_row[starts] = 1
        row_of[by_sg] = torch.cumsum(new_row, 0) - 1
    transform = OrderPlan(
        index=row_of,
        plan=sub_plan(gs[by_sg][starts], ss[by_sg][starts], torch.arange(v, device=dev), v),
    )
    return _replace(base, aggregate=aggregate, transform=transform)


def _ptr(counts: torch.Tensor) -> torch.Tensor:
    """Exclusive prefix sum with the total appended: ``[0, c0, c0+c1, ...]``."""
    import torch

    return torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])


def _ptr_at(block_ptr: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """For each tile (block-major), the rows of all earlier blocks' tiles."""
    import torch

    counts = block_ptr[1:] - block_ptr[:-1]
    block_of_tile = torch.repeat_interleave(torch.arange(len(counts), device=rows.device), counts)
    rows_before_block = _ptr(rows)[block_ptr[:-1]]
    return rows_before_block[block_of_tile]


def _run_starts(*keys: torch.Tensor) -> torch.Tensor:
    """Positions where any of the (equal-length) keys changes, starting with 0 if non-empty."""
    import torch

    n = keys[0].shape[0]
    if n == 0:
        return keys[0].new_zeros(0)
    change = torch.zeros(n, dtype=torch.bool, device=keys[0].device)
    change[0] = True
    for key in keys:
        change[1:] |= key[1:] != key[:-1]
    return torch.nonzero(change).flatten()


# ---------------------------------------------------------------------------------------------
# operands
# ---------------------------------------------------------------------------------------------

_FLOAT_DTYPES = ("torch.float32", "torch.float64", "torch.bfloat16")


def check_operands(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, plan: GMSPlan
) -> None:
    """Check the per-call operands against a plan; O(1), no tensor data is read.

    Args:
        x: ``[N_in, K]`` float32/float64/bfloat16, contiguous, ``N_in >= plan.n_in``.
        w: ``[S, K, M]`` same dtype and device, contiguous, ``S >= plan.num_segments``.
        scale: ``None`` or ``[E]`` same dtype and device, contiguous (original pair order).
        plan: the plan of the indices.

    Raises:
        TypeError: an operand is not a tensor or has the wrong dtype.
        ValueError: a shape, device or layout is wrong.
    """
    import torch

    for name, t in (("x", x), ("w", w), ("scale", scale)):
        if t is None and name == "scale":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(expected("gms", name, "a torch.Tensor", type(t).__name__))
    if str(x.dtype) not in _FLOAT_DTYPES:
        raise TypeError(
            expected("gms", "x", "float32, float64 or bfloat16", str(x.dtype).split(".")[-1])
        )
    dtype = str(x.dtype).split(".")[-1]
    for name, t in (("w", w), ("scale", scale)):
        if t is not None and t.dtype != x.dtype:
            raise TypeError(expected("gms", name, f"{dtype} like 'x'", str(t.dtype).split(".")[-1]))
    if x.dim() != 2:
        raise ValueError(expected("gms", "x", "2-D [N_in, K]", f"shape {tuple(x.shape)}"))
    if w.dim() != 3:
        raise ValueError(expected("gms", "w", "3-D [S, K, M]", f"shape {tuple(w.shape)}"))
    if w.shape[1] != x.shape[1]:
        raise ValueError(
            expected(
                "gms", "w", f"of shape [S, {x.shape[1]}, M] (K of 'x')", f"shape {tuple(w.shape)}"
            )
        )
    if x.shape[0] < plan.n_in:
        raise ValueError(
            expected("gms", "x", f"at least {plan.n_in} rows (max gather + 1)", x.shape[0])
        )
    if w.shape[0] < plan.num_segments:
        raise ValueError(
            expected(
                "gms",
                "w",
                f"at least {plan.num_segments} segments (max segment + 1)",
                f"shape {tuple(w.shape)}",
            )
        )
    if scale is not None and (scale.dim() != 1 or scale.shape[0] != plan.num_pairs):
        raise ValueError(
            expected(
                "gms", "scale", f"1-D of length {plan.num_pairs}", f"shape {tuple(scale.shape)}"
            )
        )
    for name, t in (("w", w), ("scale", scale)):
        if t is not None and t.device != x.device:
            raise ValueError(expected("gms", name, f"on {x.device} like 'x'", str(t.device)))
    if plan.device != x.device:
        raise ValueError(expected("gms", "plan", f"on {x.device} like 'x'", str(plan.device)))
    for name, t in (("x", x), ("w", w), ("scale", scale)):
        if t is not None and not t.is_contiguous():
            raise ValueError(expected("gms", name, "contiguous", f"strides {t.stride()}"))
