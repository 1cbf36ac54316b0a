"""A plan's integrity: every value checked where it comes from outside, edits detected per call.

A :class:`~fusekit.gms.GMSPlan` is immutable by contract; torch cannot enforce it (a
tensor has no read-only flag), so this module does, in three steps:

1. **admit**: a packed plan is *sealed* when it is made. A builder of this package
   (:func:`fusekit.gms.plan`, ``plan_sorted``, ``pack``, ``GMSPlan.to``) is trusted; any other
   buffer handed to :meth:`GMSPlan.from_packed` (a clone, a loaded or exported tensor, a tensor
   written by hand) is first checked value by value (:func:`validate`, O(E)).
2. **seal**: the buffer's version counter, and on the CPU a checksum of its control arrays (header,
   meta, segment pointers, tiles, block and item pointers of the plan and its sub-plans, and the
   plan's CSR pointers: ``O(T + S + B + N)`` values, far fewer than the ``E K M`` multiply-adds of
   a call).
3. **verify** (:func:`verify`, at every call of ``torch.ops.fusekit.gms``): a moved version (an
   in-place torch edit, of the plan or of any sub-plan: they share the buffer) or a changed
   checksum (a write through ``.data`` or a numpy view, which bypasses the version counter)
   re-validates the plan, drops what was derived from its old contents, and re-seals it; a plan
   that no longer holds a consistent problem raises ``ValueError`` naming the array.

What the seal does not cover, the kernels do: an edit of a per-pair array (``gather``,
``scatter``, ``order``, ``dst_pos``, a sub-plan's CSR) that bypasses the version counter is not
detected, but every kernel bounds-checks the indices it dereferences, so it can give a different
answer, never a read or write outside an array. On CUDA the seal is the version counter alone
(a checksum would synchronise every call).

Importing this module does not import numba (only CPU plans are checksummed).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from fusekit.errors import expected
from fusekit.gms.planning.format import PART_NAMES, PLAN_PARTS

if TYPE_CHECKING:
    from fusekit.gms.planning.derived import Derived


class _OrderArrays(Protocol):
    """An order sub-plan as this module reads it (:class:`fusekit.gms.planning.OrderPlan`)."""

    @property
    def index(self) -> torch.Tensor: ...
    @property
    def plan(self) -> _PlanArrays: ...


class _PlanArrays(Protocol):
    """A plan as this module reads it (:class:`fusekit.gms.GMSPlan`, whose module seals here)."""

    @property
    def num_pairs(self) -> int: ...
    @property
    def n_in(self) -> int: ...
    @property
    def n_out(self) -> int: ...
    @property
    def num_segments(self) -> int: ...
    @property
    def reduce(self) -> str: ...
    @property
    def tile_rows(self) -> int: ...
    @property
    def schedule(self) -> str: ...
    @property
    def num_tiles(self) -> int: ...
    @property
    def order(self) -> torch.Tensor: ...
    @property
    def gather(self) -> torch.Tensor: ...
    @property
    def segment(self) -> torch.Tensor: ...
    @property
    def scatter(self) -> torch.Tensor: ...
    @property
    def norm(self) -> torch.Tensor: ...
    @property
    def segment_ptr(self) -> torch.Tensor: ...
    @property
    def tile_segment(self) -> torch.Tensor: ...
    @property
    def tile_start(self) -> torch.Tensor: ...
    @property
    def tile_end(self) -> torch.Tensor: ...
    @property
    def block_ptr(self) -> torch.Tensor: ...
    @property
    def item_ptr(self) -> torch.Tensor: ...
    @property
    def dst_ptr(self) -> torch.Tensor: ...
    @property
    def dst_pos(self) -> torch.Tensor: ...
    @property
    def src_ptr(self) -> torch.Tensor: ...
    @property
    def src_pos(self) -> torch.Tensor: ...
    @property
    def aggregate(self) -> _OrderArrays | None: ...
    @property
    def transform(self) -> _OrderArrays | None: ...
    @property
    def buffer(self) -> torch.Tensor | None: ...
    @property
    def derived(self) -> Derived[Any]: ...
    def reread(self) -> _PlanArrays:
        """The plan its buffer holds now, the layout parsed again."""
        ...


#: Fields whose values steer the kernels' loops, of O(T + S + B) values: checksummed per call on
#: the CPU, in the plan and in its order sub-plans.
CONTROL_FIELDS = frozenset(
    {"meta", "segment_ptr", "tile_segment", "tile_start", "tile_end", "block_ptr", "item_ptr"}
)
#: The plan's CSR pointers (``O(N_in + N_out)``), checksummed in the top-level plan only: a
#: sub-plan's have ``O(E)`` entries, as many as the per-pair arrays the kernels guard instead.
TOP_CONTROL_FIELDS = CONTROL_FIELDS | {"dst_ptr", "src_ptr"}


@dataclass(frozen=True, slots=True)
class Seal:
    """What a plan's buffer held when it was admitted.

    Attributes:
        version: the buffer's version counter.
        starts: ``[R]`` first element of each checksummed range (None on other devices).
        ends: ``[R]`` one past the last.
        checksum: the checksum of those ranges (None on other devices).
    """

    version: int
    starts: np.ndarray | None
    ends: np.ndarray | None
    checksum: int | None


#: Seals by ``id(buffer)``: a weak reference to the buffer (so that a recycled id is told apart
#: and a dead buffer's entry goes) and its seal.
_SEALS: dict[int, tuple[weakref.ref[Any], Seal]] = {}
_LOCK = threading.RLock()


def admit(plan: _PlanArrays, *, trusted: bool) -> None:
    """Seal a freshly parsed top-level plan, validating it first unless a builder made it.

    A buffer whose seal is still good (same version, same checksum) is not validated again.

    Raises:
        ValueError: the plan is not a consistent problem (:func:`validate`).
    """
    buffer = plan.buffer
    if buffer is None:
        return
    with _LOCK:
        seal = _seal_of(buffer)
        if seal is not None and _intact(buffer, seal):
            return
        if not trusted:
            validate(plan)
        _store(buffer, _make_seal(buffer))


def verify(plan: _PlanArrays) -> None:
    """Check, before a call runs, that ``plan`` still holds what it was admitted with.

    O(1) for the version; on the CPU a checksum of the control arrays. A plan changed since is
    validated again (what was derived on it and on its sub-plans dropped first) and re-sealed.

    Raises:
        ValueError: the plan was changed into an inconsistent one, or its sizes changed under
            a plan object parsed before (a new plan must be made).
    """
    buffer = plan.buffer
    if buffer is None:
        raise ValueError(expected("gms", "plan", "a top-level plan", "an order sub-plan"))
    seal = _seal_of(buffer)
    if seal is not None and _intact(buffer, seal):
        return
    with _LOCK:
        seal = _seal_of(buffer)
        if seal is not None and _intact(buffer, seal):
            return
        fresh = plan.reread()  # the layout as the buffer holds it now
        if _sizes(fresh) != _sizes(plan):
            raise ValueError(
                expected(
                    "gms",
                    "plan",
                    "unchanged since it was made (edit a problem, then plan it again)",
                    f"a buffer edited in place to other sizes: {_sizes(fresh)[:4]}",
                )
            )
        _forget(plan)
        validate(plan)
        _store(buffer, _make_seal(buffer))


def trust_copy(source: _PlanArrays, copy: torch.Tensor) -> None:
    """Seal ``copy``, a ``.to(device)`` of ``source``'s verified buffer, without validating it."""
    verify(source)
    with _LOCK:
        _store(copy, _make_seal(copy))


def _sizes(plan: _PlanArrays) -> tuple[Any, ...]:
    """Everything a parsed plan object fixed from its buffer's header and meta."""

    def one(p: _PlanArrays) -> tuple[Any, ...]:
        pointers = (int(p.block_ptr.shape[0]), int(p.item_ptr.shape[0]))
        sizes = (p.num_pairs, p.n_in, p.n_out, p.num_segments, p.num_tiles)
        return (*sizes, p.reduce, p.tile_rows, p.schedule, *pointers)

    subs = tuple(
        None if o is None else (int(o.index.shape[0]), *one(o.plan))
        for o in (plan.aggregate, plan.transform)
    )
    return (*one(plan), *subs)


def _forget(plan: _PlanArrays) -> None:
    """Drop what was derived from the plan's old contents, sub-plans included."""
    plan.derived.reset(plan.buffer._version if plan.buffer is not None else None)
    for sub in (plan.aggregate, plan.transform):
        if sub is not None:
            sub.plan.derived.reset()


def _seal_of(buffer: torch.Tensor) -> Seal | None:
    entry = _SEALS.get(id(buffer))
    if entry is None or entry[0]() is not buffer:
        return None
    return entry[1]


def _store(buffer: torch.Tensor, seal: Seal) -> None:
    key = id(buffer)

    def drop(ref: weakref.ref[Any], key: int = key) -> None:
        with _LOCK:
            entry = _SEALS.get(key)
            if entry is not None and entry[0] is ref:
                del _SEALS[key]

    _SEALS[key] = (weakref.ref(buffer, drop), seal)


def _intact(buffer: torch.Tensor, seal: Seal) -> bool:
    if buffer._version != seal.version:
        return False
    if seal.checksum is None:
        return True
    return _checksum(buffer, seal) == seal.checksum


def _make_seal(buffer: torch.Tensor) -> Seal:
    if buffer.device.type != "cpu":
        return Seal(buffer._version, None, None, None)
    starts, ends = _control_ranges(buffer)
    seal = Seal(buffer._version, np.asarray(starts, np.int64), np.asarray(ends, np.int64), None)
    return Seal(seal.version, seal.starts, seal.ends, _checksum(buffer, seal))


def _control_ranges(buffer: torch.Tensor) -> tuple[list[int], list[int]]:
    """``[start, end)`` ranges of the header and of every control array, adjacent ones merged."""
    count = int(buffer[1])
    lengths = buffer[2 : 2 + count].tolist()
    starts, ends = [0], [2 + count]
    offset = 2 + count
    for i, (name, length) in enumerate(zip(PART_NAMES, lengths, strict=True)):
        control = TOP_CONTROL_FIELDS if i < len(PLAN_PARTS) else CONTROL_FIELDS
        if name in control and length:
            if starts and ends[-1] == offset:
                ends[-1] = offset + length
            else:
                starts.append(offset)
                ends.append(offset + length)
        offset += length
    return starts, ends


def _checksum(buffer: torch.Tensor, seal: Seal) -> int:
    # (d) numba loads only where a CPU plan is sealed: a CUDA process never needs it
    from fusekit.gms.kernels.cpu.checks import range_checksum

    return int(range_checksum(buffer.detach().numpy(), seal.starts, seal.ends))


# ---------------------------------------------------------------------------------------------
# validation: the invariants fusekit.gms.plan establishes, checked with torch ops on any device
# ---------------------------------------------------------------------------------------------


def validate(plan: _PlanArrays) -> None:
    """Check that a plan holds a consistent problem, as :func:`fusekit.gms.plan` makes them.

    Indices in range; ``order`` a permutation; pairs sorted by segment with ``segment_ptr``
    their counts; tiles of one segment each, at most ``tile_rows`` long, covering every
    position once; block and item pointers running over the tiles; blocks owning disjoint,
    ascending ranges of output rows (the CPU kernels' threads write them without atomics);
    both CSRs exact; ``mean`` weights ``1 / deg``; the order sub-plans consistent with it.
    O(E) torch ops.

    Args:
        plan: a top-level plan.

    Raises:
        ValueError: the first array found inconsistent, by name.
    """
    _check_plan(plan, "plan")
    if plan.aggregate is not None:
        _check_aggregate(plan, plan.aggregate)
    if plan.transform is not None:
        _check_transform(plan, plan.transform)


def _fail(name: str, want: str, got: Any) -> ValueError:
    return ValueError(expected("gms", name, want, got))


def _ptr(counts: torch.Tensor) -> torch.Tensor:
    return torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])


def _span(t: torch.Tensor) -> str:
    return f"values in [{int(t.min())}, {int(t.max())}]" if t.numel() else "empty"


def _in_range(t: torch.Tensor, high: int, name: str) -> None:
    if t.numel() and bool(((t < 0) | (t >= high)).any()):
        raise _fail(name, f"indices in [0, {high})", _span(t))


def _permutation(t: torch.Tensor, n: int, name: str) -> None:
    _in_range(t, n, name)
    if n and int(torch.bincount(t, minlength=n).max()) != 1:
        raise _fail(name, f"a permutation of [0, {n})", "a repeated index")


def _pointer(ptr: torch.Tensor, last: int, name: str) -> None:
    if ptr.numel() == 0 or int(ptr[0]) != 0 or int(ptr[-1]) != last or bool((ptr.diff() < 0).any()):
        raise _fail(name, f"non-decreasing from 0 to {last}", ptr[:8].tolist())


def _check_plan(p: _PlanArrays, name: str) -> None:
    e, n_tiles = p.num_pairs, p.num_tiles
    for field in ("block_ptr", "item_ptr"):
        t = getattr(p, field)
        if (
            t.dtype != torch.int64
            or t.dim() != 1
            or t.shape[0] < (2 if field == "block_ptr" else 1)
        ):
            raise _fail(f"{name}.{field}", "a 1-D int64 pointer", tuple(t.shape))
    _in_range(p.gather, p.n_in, f"{name}.gather")
    _in_range(p.segment, p.num_segments, f"{name}.segment")
    _in_range(p.scatter, p.n_out, f"{name}.scatter")
    _permutation(p.order, e, f"{name}.order")
    if e > 1 and bool((p.segment.diff() < 0).any()):
        raise _fail(f"{name}.segment", "sorted (pairs in segment order)", "unsorted")
    if not torch.equal(p.segment_ptr, _ptr(torch.bincount(p.segment, minlength=p.num_segments))):
        raise _fail(f"{name}.segment_ptr", "the segments' pair counts, accumulated", "others")
    _check_tiles(p, name)
    _pointer(p.block_ptr, n_tiles, f"{name}.block_ptr")
    _pointer(p.item_ptr, n_tiles, f"{name}.item_ptr")
    _check_blocks(p, name)
    deg = _check_csr(p.dst_ptr, p.dst_pos, p.scatter, p.n_out, f"{name}.dst")
    _check_csr(p.src_ptr, p.src_pos, p.gather, p.n_in, f"{name}.src")
    if p.reduce == "mean" and not torch.equal(p.norm, 1.0 / deg[p.scatter].to(torch.float64)):
        raise _fail(f"{name}.norm", "1 / deg(scatter row) of each pair", "other weights")


def _check_tiles(p: _PlanArrays, name: str) -> None:
    seg, lo, hi, e = p.tile_segment, p.tile_start, p.tile_end, p.num_pairs
    if seg.numel() == 0:
        if e:
            raise _fail(f"{name}.tiles", f"tiles covering {e} pairs", "no tiles")
        return
    bad = (seg < 0) | (seg >= p.num_segments) | (lo < 0) | (hi <= lo) | (hi > e)
    bad |= hi - lo > p.tile_rows
    if bool(bad.any()):
        want = f"segments in [0, {p.num_segments}), 0 <= start < end <= {e}, <= {p.tile_rows} long"
        raise _fail(f"{name}.tiles", want, f"tile {int(torch.nonzero(bad)[0, 0])}")
    cover = torch.zeros(e + 1, dtype=torch.int64, device=lo.device)
    ones = torch.ones_like(lo)
    cover.index_add_(0, lo, ones).index_add_(0, hi, -ones)
    if not bool((torch.cumsum(cover, 0)[:e] == 1).all()):
        raise _fail(f"{name}.tiles", "covering every pair exactly once", "gaps or overlaps")
    if not (torch.equal(p.segment[lo], seg) and torch.equal(p.segment[hi - 1], seg)):
        raise _fail(f"{name}.tile_segment", "the segment of the tile's pairs", "another")


def _check_blocks(p: _PlanArrays, name: str) -> None:
    """Blocks own disjoint, ascending ranges of output rows (tiles already cover every pair)."""
    if p.num_pairs == 0:
        return
    lo, hi = p.tile_start, p.tile_end
    by_start = torch.argsort(lo)
    tile_of_pair = torch.repeat_interleave(by_start, (hi - lo)[by_start])
    n_tiles, blocks = p.num_tiles, p.block_ptr.shape[0] - 1
    big, dev = p.n_out, lo.device
    row_lo = torch.full((n_tiles,), big, device=dev).scatter_reduce(
        0, tile_of_pair, p.scatter, "amin"
    )
    row_hi = torch.full((n_tiles,), -1, device=dev).scatter_reduce(
        0, tile_of_pair, p.scatter, "amax"
    )
    block = torch.repeat_interleave(torch.arange(blocks, device=dev), p.block_ptr.diff())
    b_lo = torch.full((blocks,), big, device=dev).scatter_reduce(0, block, row_lo, "amin")
    b_hi = torch.full((blocks,), -1, device=dev).scatter_reduce(0, block, row_hi, "amax")
    used = b_hi >= 0
    b_lo, b_hi = b_lo[used], b_hi[used]
    if bool((b_hi[:-1] >= b_lo[1:]).any()):
        raise _fail(
            f"{name}.block_ptr", "blocks owning disjoint, ascending output rows", "overlapping"
        )


def _check_csr(
    ptr: torch.Tensor, pos: torch.Tensor, rows: torch.Tensor, n: int, name: str
) -> torch.Tensor:
    """Check ``(ptr, pos)`` lists the positions of each row; return the rows' degrees."""
    deg = torch.bincount(rows, minlength=n)
    if not torch.equal(ptr, _ptr(deg)):
        raise _fail(f"{name}_ptr", "the rows' pair counts, accumulated", ptr[:8].tolist())
    _permutation(pos, rows.shape[0], f"{name}_pos")
    want = torch.repeat_interleave(torch.arange(n, device=rows.device), deg)
    if rows.numel() and not torch.equal(rows[pos], want):
        raise _fail(f"{name}_pos", "the positions of each row, row after row", "others")
    return deg


def _check_sub(
    base: _PlanArrays, order: _OrderArrays, name: str, n_in: int | None, n_out: int
) -> None:
    sub = order.plan
    _check_plan(sub, f"{name}.plan")
    want = (n_in, n_out, base.num_segments, "sum")
    got = (sub.n_in if n_in is not None else None, sub.n_out, sub.num_segments, sub.reduce)
    if got != want:
        raise _fail(f"{name}.plan", f"(n_in, n_out, num_segments, reduce) = {want}", got)


def _check_aggregate(base: _PlanArrays, order: _OrderArrays) -> None:
    """Groups of equal (segment, scatter row); the sub-problem's row ``u`` is group ``u``."""
    name, sub, index = "plan.aggregate", order.plan, order.index
    u = sub.num_pairs
    _check_sub(base, order, name, u, base.n_out)
    if index.shape != (u + 1,) or int(index[0]) != 0 or int(index[-1]) != base.num_pairs:
        raise _fail(f"{name}.index", f"[{u + 1}] from 0 to {base.num_pairs}", tuple(index.shape))
    if bool((index.diff() <= 0).any()):
        raise _fail(f"{name}.index", "strictly increasing (no empty group)", index[:8].tolist())
    _permutation(sub.gather, u, f"{name}.plan.gather")
    by_u = torch.empty_like(sub.gather)
    by_u[sub.gather] = torch.arange(u, device=index.device)
    group = torch.repeat_interleave(by_u, index.diff())
    if not (
        torch.equal(sub.segment[group], base.segment)
        and torch.equal(sub.scatter[group], base.scatter)
    ):
        raise _fail(f"{name}.index", "groups of equal (segment, scatter row)", "mixed groups")


def _check_transform(base: _PlanArrays, order: _OrderArrays) -> None:
    """Each position reads the sub-problem's row ``v`` of its own (segment, gather row)."""
    name, sub, index = "plan.transform", order.plan, order.index
    v = sub.num_pairs
    _check_sub(base, order, name, None, v)
    if sub.n_in > base.n_in:
        raise _fail(f"{name}.plan", f"n_in <= {base.n_in}", sub.n_in)
    if index.shape != (base.num_pairs,):
        raise _fail(f"{name}.index", f"[{base.num_pairs}]", tuple(index.shape))
    _in_range(index, v, f"{name}.index")
    _permutation(sub.scatter, v, f"{name}.plan.scatter")
    by_v = torch.empty_like(sub.scatter)
    by_v[sub.scatter] = torch.arange(v, device=index.device)
    q = by_v[index]
    if not (torch.equal(sub.gather[q], base.gather) and torch.equal(sub.segment[q], base.segment)):
        raise _fail(f"{name}.index", "rows of each position's (segment, gather row)", "others")
