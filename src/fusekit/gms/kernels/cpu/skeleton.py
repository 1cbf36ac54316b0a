"""The one loop every numba dataflow kernel runs: work items, tiles, register tiles (numba).

.. code-block:: text

    for item b (in parallel):                      a destination block, or a (pad | pack) item
        for tile t of b:                           s = segment(t)
            for MR positions e of t:
                prologue: the register tile's rows (gathered, consecutive or aggregated)
                for NR columns m0 of M:
                    GEMM:     acc[r, j] = sum_k A[rows[r], k] * W[s, k, m0 + j]
                    epilogue: scatter acc into Y (+= | max=, scaled) or store it in plan order

The dataflows differ only in the prologue and the epilogue, picked by which optional operands the
launcher passes as ``None``:

=======================  =========  =========  ============  =========
kernel                   a_index    groups     scatter       scratch
=======================  =========  =========  ============  =========
``(GMS)seg``             gather     None       scatter       None
``G-(MS)seg``            None       None       scatter       None
``(GM)seg-S`` kernel 1   a_index    None       None          None
aggregate-first fused    gather     sub-plan   sub-plan      [B, MR, K]
=======================  =========  =========  ============  =========

numba compiles one specialisation per pattern of ``None`` (and per dtype) and removes the branches
on ``x is None`` before type inference, so each specialisation holds its own phases only, as a
hand-written kernel would. The branches must test the argument itself (``if scatter is None``):
numba prunes nothing it cannot trace back to an argument.

Every index a kernel reads is guarded: a work item, tile or position range out of range is
skipped and counted; the launcher raises if the count is not zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numba
import numpy as np
import numpy.typing as npt
from numba.np.numpy_support import carray

from fusekit.gms.kernels.cpu.rows import plan_array
from fusekit.gms.kernels.cpu.tile import (
    FASTMATH,
    MR,
    MR_NR,
    NR,
    add_tile,
    aggregate_rows,
    block_ok,
    consecutive_rows,
    load_rows,
    rows_in_range,
    scatter_tile,
    stack_buffer,
    store_tile,
    tile_ok,
    tile_product,
)

if TYPE_CHECKING:
    from fusekit.gms.planning.layout import GMSPlan


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def dataflow_kernel(  # type: ignore[no-untyped-def]
    # pointers: a [R, K] rows, w [S, K, M], out [N_out, M] (or [E, M] in plan order)
    a,
    w,
    out,
    # prologue: a_index [E] (None: row e of a is position e's); group_ptr [U + 1] and groups [E]
    # (None: no aggregation), scratch [I, MR, K] (None unless aggregating)
    a_index,
    group_ptr,
    groups,
    scratch,
    # epilogue: scatter [E] (None: store in plan order); scale [E], or [1] = 1 without one
    scatter,
    scale,
    # schedule: tiles [T] listed by work item, tile_ptr [I + 1]
    tile_segment,
    tile_start,
    tile_end,
    tile_ptr,
    # flags
    has_scale,
    reduce_max,
):
    """The tiles of ``tiles`` through prologue, register tile and epilogue (module docstring).

    Returns the number of work items, tiles and register tiles skipped for an index out of range.
    """
    n_rows = a.shape[0]
    n_out = out.shape[0]
    n_segments = w.shape[0]
    M = w.shape[2]
    n_tiles = min(tile_segment.shape[0], tile_start.shape[0], tile_end.shape[0])
    # the positions a tile may name: every array read by position bounds them
    n_pos = n_out if scatter is None else scatter.shape[0]
    n_groups = 0
    if groups is None:
        n_pos = min(n_pos, n_rows if a_index is None else a_index.shape[0])
        if has_scale:
            n_pos = min(n_pos, scale.shape[0])
    else:
        n_pos = min(n_pos, groups.shape[0])
        n_groups = group_ptr.shape[0] - 1
    n_items = tile_ptr.shape[0] - 1
    if scratch is not None:
        n_items = min(n_items, scratch.shape[0])
    bad = 0
    for b in numba.prange(n_items):
        rows = stack_buffer(tile_start, MR)
        acc = carray(stack_buffer(a, MR_NR), (MR, NR))
        src = a if scratch is None else scratch[b]
        if not block_ok(tile_ptr, b, n_tiles):
            bad += 1
            continue
        # ---- tiles of this item, segment by segment ----
        for t in range(tile_ptr[b], tile_ptr[b + 1]):
            if not tile_ok(t, tile_segment, tile_start, tile_end, n_segments, n_pos):
                bad += 1
                continue
            s = tile_segment[t]
            for e in range(tile_start[t], tile_end[t], MR):
                n = min(MR, tile_end[t] - e)
                # ---- prologue: the register tile's rows of src ----
                if scatter is not None and not rows_in_range(scatter, e, n, n_out):
                    bad += 1
                    continue
                if groups is not None:
                    # rows aggregated from each position's group into the item's scratch
                    if not rows_in_range(groups, e, n, n_groups) or not aggregate_rows(
                        a, a_index, scale, has_scale, group_ptr, groups, e, n, rows, src
                    ):
                        bad += 1
                        continue
                elif a_index is None:
                    consecutive_rows(e, n, rows)  # a is gathered in plan order
                elif not load_rows(a_index, e, n, n_rows, rows):  # the gather indices
                    bad += 1
                    continue
                for m0 in range(0, M, NR):
                    nc = min(NR, M - m0)
                    # ---- GEMM: MR x NR register tile over K ----
                    tile_product(src, rows, w, s, m0, nc, acc)
                    # ---- epilogue ----
                    if scatter is None:
                        store_tile(out, e, n, m0, nc, acc)
                    elif groups is None:
                        scatter_tile(out, scatter, scale, has_scale, e, n, m0, nc, acc, reduce_max)
                    else:  # the scale went into the aggregation
                        add_tile(out, scatter, e, n, m0, nc, acc)
    return bad


#: A numpy operand of a kernel (numba specialises on its dtype and dimensions).
Array = npt.NDArray[Any]


@dataclass(frozen=True, slots=True)
class Tiles:
    """A plan's schedule as the kernel reads it: tiles ``[T]`` listed by work item, ``ptr [I + 1]``.

    Work item ``b`` runs the tiles ``ptr[b] .. ptr[b + 1]``; tile ``t`` is the positions
    ``start[t] .. end[t]`` of segment ``segment[t]``.
    """

    segment: Array
    start: Array
    end: Array
    ptr: Array


def tiles_of(plan: GMSPlan, items: Literal["block_ptr", "item_ptr"]) -> Tiles:
    """The plan's tiles, listed by destination block (``block_ptr``) or by item (``item_ptr``)."""
    return Tiles(
        plan_array(plan, "tile_segment"),
        plan_array(plan, "tile_start"),
        plan_array(plan, "tile_end"),
        plan_array(plan, items),
    )


def run_dataflow(
    a: Array,
    w: Array,
    out: Array,
    tiles: Tiles,
    *,
    a_index: Array | None = None,
    group_ptr: Array | None = None,
    groups: Array | None = None,
    scratch: Array | None = None,
    scatter: Array | None = None,
    scale: Array | None = None,
    reduce_max: bool = False,
) -> int:
    """Run :func:`dataflow_kernel`; the operands left ``None`` pick the dataflow (module table).

    Args:
        a: ``[R, K]`` the rows the GEMM reads (by ``a_index``, in plan order, or aggregated).
        w: ``[S, K, M]`` of ``a``'s dtype.
        out: ``[N_out, M]`` to scatter into, or ``[E, M]`` to store into without a ``scatter``.
        tiles: the schedule; its work items run in parallel.
        a_index: ``[E]`` the row of ``a`` of each position (of each group member when
            aggregating), or None if ``a`` is already in plan order.
        group_ptr: ``[U + 1]`` each group's members, to aggregate ``a`` rows before the GEMM.
        groups: ``[E]`` the group of each position (with ``group_ptr``).
        scratch: ``[I, MR, K]`` each work item's aggregated rows (with ``group_ptr``).
        scatter: ``[E]`` the output row of each position, or None to store in plan order.
        scale: ``[E]`` a factor per position (per group member when aggregating), or None.
        reduce_max: ``max=`` instead of ``+=`` into ``out`` (scatter without groups only).

    Returns:
        The number of work items, tiles and register tiles skipped for an index out of range.
    """
    one = np.ones(1, dtype=a.dtype)
    bad: int = dataflow_kernel(
        a,
        w,
        out,
        a_index,
        group_ptr,
        groups,
        scratch,
        scatter,
        one if scale is None else scale,
        tiles.segment,
        tiles.start,
        tiles.end,
        tiles.ptr,
        scale is not None,
        reduce_max,
    )
    return bad
