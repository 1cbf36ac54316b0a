"""A built kernel map planned for gms in O(E): its pairs are already in plan order.

:func:`plan_kernel_map` plans a built map (another layer width on a shared map): without
orders through :func:`fusekit.gms.planning.build.plan_sorted`, with them in O(E) passes (every
(offset, input) and (offset, output) pair is distinct, so the sorts of :func:`fusekit.gms.plan`,
its reference in the tests, become counting passes). :func:`features_of` gives the selector's
features of a map without planning it.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from functools import partial

import numpy as np
import torch

from fusekit.errors import expected
from fusekit.gms.features import Features, features_of_counts
from fusekit.gms.kmap.kernel_map import KernelMap
from fusekit.gms.planning.build import TILE_ROWS, default_blocks, plan_sorted
from fusekit.gms.planning.format import SCHEDULES
from fusekit.gms.planning.layout import GMSPlan, OrderPlan, pack


def plan_kernel_map(
    kmap: KernelMap,
    tile_rows: int | None = None,
    blocks: int | None = None,
    schedule: str = "pad",
    orders: bool = False,
) -> GMSPlan:
    """The :func:`fusekit.gms.plan` of a kernel map, equal field by field, without sorting.

    A map's pairs come sorted by (offset, output row), which is already the plan's order
    (destination blocks are ranges of output rows), so each plan is
    :func:`fusekit.gms.planning.build.plan_sorted` of its pairs; and every (offset, input) and
    (offset, output) is one pair, so the transform-first and aggregate-first orders have ``E``
    rows each and their pairs are sorted by (offset, row) as well.

    Args:
        kmap: a map from :func:`fusekit.gms.kmap.builder.build`.
        tile_rows: pairs per tile (default ``fusekit.gms.planning.build.TILE_ROWS``).
        blocks: destination blocks (default ``default_blocks`` of the device).
        schedule: ``"pad"`` or ``"pack"``.
        orders: also plan the transform-first and aggregate-first orders.

    Returns:
        The packed :class:`fusekit.gms.GMSPlan` (on the CPU; ``.to(device)`` moves it).

    Raises:
        ValueError: a knob is out of range, or the pairs are not in plan order.
    """
    tile_rows = TILE_ROWS if tile_rows is None else tile_rows
    blocks = default_blocks("cpu") if blocks is None else blocks
    for name, value in (("tile_rows", tile_rows), ("blocks", blocks)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(expected("plan_kernel_map", name, "a positive int", value))
    if schedule not in SCHEDULES:
        raise ValueError(expected("plan_kernel_map", "schedule", "pad or pack", repr(schedule)))
    plan_pairs = partial(
        plan_sorted,
        num_segments=kmap.num_segments,
        tile_rows=tile_rows,
        blocks=blocks,
        schedule=schedule,
    )
    g, s, d = (t.cpu() for t in (kmap.gather, kmap.segment, kmap.scatter))
    csr = kmap.csr if all(a is not None for a in kmap.csr) else None
    try:
        base = plan_pairs(
            g,
            s,
            d,
            n_in=kmap.n_in,
            n_out=kmap.n_out,
            csr=tuple(torch.from_numpy(a) for a in csr) if csr is not None else None,  # type: ignore[arg-type]
        )
    except ValueError as err:
        if not orders:
            raise
        raise ValueError(expected("plan_kernel_map", "kmap", "a map in plan order", err)) from err
    if not orders:
        return base
    e = base.num_pairs
    rows = torch.arange(e)
    # aggregate-first: every (s, d) is one group, in the same order
    aggregate = OrderPlan(
        index=torch.arange(e + 1),
        plan=plan_pairs(rows, s, d, n_in=e, n_out=kmap.n_out),
    )
    # transform-first: the distinct (s, g) rows sorted by (s, g); pair p reads row row_of[p].
    # src_pos is the stable argsort by g, so a stable sort by s gives (s, g) order.
    by_sg = base.src_pos[torch.sort(s[base.src_pos], stable=True).indices]
    row_of = torch.empty(e, dtype=torch.int64)
    row_of[by_sg] = rows
    gs = g[by_sg]
    n_in = int(gs.max()) + 1 if e else 0
    transform = OrderPlan(
        index=row_of,
        plan=plan_pairs(gs, s[by_sg], rows, n_in=n_in, n_out=e),
    )
    return pack(replace(base, aggregate=aggregate, transform=transform))


def features_of(kmap: KernelMap, k: int, m: int, dtype: torch.dtype) -> Features:
    """``fusekit.gms.features(plan, k, m, dtype, has_scale=False)`` of a map, without a plan.

    Equal to the planned features (tests compare them): ``V = U = E`` (every (offset, input)
    and (offset, output) is one pair), per-offset rows are the pairs of each offset
    (:func:`fusekit.gms.features.features_of_counts`).
    """
    ptr = kmap.offset_ptr.tolist()
    dst_ptr, _, src_ptr, _ = kmap.csr
    degree = (
        torch.from_numpy(np.diff(dst_ptr))
        if dst_ptr is not None
        else torch.bincount(kmap.scatter.cpu(), minlength=kmap.n_out)
    )
    sources = (
        torch.from_numpy(np.diff(src_ptr))
        if src_ptr is not None
        else torch.bincount(kmap.gather.cpu(), minlength=kmap.n_in)
    )
    return features_of_counts(
        segment_pairs=tuple(b - a for a, b in itertools.pairwise(ptr)),
        degree=degree,
        sources=sources,
        n_in=kmap.n_in,
        k=k,
        m=m,
        dtype=dtype,
    )
