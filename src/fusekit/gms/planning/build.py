r"""Planning: sort, tile and index a problem's pairs once, for every call to reuse.

:func:`plan` does the index work once (RGCN epochs and convolution layers sharing a kernel map
reuse it): it sorts the pairs by (segment, destination block, scatter row), cuts each segment into
tiles, records segment offsets, per-pair ``mean`` weights, a destination CSR (for scatter kernels
that own output rows), a source CSR (for the input gradient), and the sub-problems of the
transform-first and aggregate-first orders. Index values are checked here, once.
:func:`plan_sorted` plans pairs already in plan order without sorting them (the input-gradient
plan, kernel maps), with the host-side steps :func:`block_rows` and :func:`tiles_of_runs`.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from fusekit.errors import expected
from fusekit.gms.planning.buffers import empty_plan_with_tiles
from fusekit.gms.planning.format import MAGIC, SCHEDULES
from fusekit.gms.planning.layout import GMSPlan, OrderPlan, pack
from fusekit.gms.problem import REDUCES, GMSProblem, check_product, check_size

#: Default pairs per tile: a multiple of the CPU register tile's rows and of Triton's BLOCK sizes.
TILE_ROWS = 64


def default_blocks(device: torch.device | str) -> int:
    """Destination blocks of a plan: 4 per CPU thread (load balance), 1 on a GPU (atomics)."""
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
    tile_rows = check_size("tile_rows", tile_rows)
    if tile_rows == 0:
        raise ValueError(expected("gms", "tile_rows", "> 0", tile_rows))
    if blocks is None:
        blocks = default_blocks(problem.gather.device)
    blocks = check_size("blocks", blocks)
    if blocks == 0:
        raise ValueError(expected("gms", "blocks", "> 0", blocks))
    if schedule not in SCHEDULES:
        raise ValueError(expected("gms", "schedule", " or ".join(SCHEDULES), repr(schedule)))
    check_product("num_pairs * blocks", problem.num_pairs * blocks)
    check_product("num_pairs + tile_rows", problem.num_pairs + tile_rows)
    base = _plan(problem, tile_rows, blocks, schedule)
    if orders:
        base = _with_orders(base, problem, tile_rows, blocks, schedule)
    return pack(base)


def _plan(p: GMSProblem, tile_rows: int, blocks: int, schedule: str) -> GMSPlan:
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
    meta = [MAGIC, e, p.n_in, p.n_out, p.num_segments, REDUCES.index(p.reduce), tile_rows]
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
    e, dev, i64 = base.num_pairs, base.device, torch.int64
    gs, ss, ds = base.gather, base.segment, base.scatter

    def sub_plan(
        gather: torch.Tensor, segment: torch.Tensor, scatter: torch.Tensor, n_out: int
    ) -> GMSPlan:
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
    aggregate: OrderPlan | None = None
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
    return replace(base, aggregate=aggregate, transform=transform)


def _ptr(counts: torch.Tensor) -> torch.Tensor:
    """Exclusive prefix sum with the total appended: ``[0, c0, c0+c1, ...]``."""
    return torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])


def _ptr_at(block_ptr: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """For each tile (block-major), the rows of all earlier blocks' tiles."""
    counts = block_ptr[1:] - block_ptr[:-1]
    block_of_tile = torch.repeat_interleave(torch.arange(len(counts), device=rows.device), counts)
    rows_before_block = _ptr(rows)[block_ptr[:-1]]
    return rows_before_block[block_of_tile]


def _run_starts(*keys: torch.Tensor) -> torch.Tensor:
    """Positions where any of the (equal-length) keys changes, starting with 0 if non-empty."""
    n = keys[0].shape[0]
    if n == 0:
        return keys[0].new_zeros(0)
    change = torch.zeros(n, dtype=torch.bool, device=keys[0].device)
    change[0] = True
    for key in keys:
        change[1:] |= key[1:] != key[:-1]
    return torch.nonzero(change).flatten()


def block_rows(dst_ptr: torch.Tensor, blocks: int) -> torch.Tensor:
    r"""The first output row of each destination block, ``[B + 1]`` (the last is ``N_out``).

    Row ``r`` belongs to block :math:`\min(\lfloor \text{dst\_ptr}[r] \, B / E \rfloor, B - 1)`
    (:func:`plan`'s step 1), a non-decreasing function of ``r``, so block ``b`` starts at the
    first row whose block is ``b``. Computed on the host (numpy: no thread-pool wake-ups for
    an O(N) pass), returned on ``dst_ptr``'s device.
    """
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
