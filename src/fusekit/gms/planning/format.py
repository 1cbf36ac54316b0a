"""The packed plan's vocabulary: its magic number, its parts in order, the schedule names.

A packed plan (:attr:`fusekit.gms.GMSPlan.packed`) is one int64 buffer::

    [MAGIC, count, len_0, ..., len_{count-1}, part_0, ..., part_{count-1}]

whose parts are :data:`PART_NAMES`: the plan's ``meta`` and :data:`TENSOR_FIELDS`, then the
aggregate-first and the transform-first orders, each an ``index`` and a whole sub-plan (all
parts empty when the plan does not hold that order). ``meta`` is ``[MAGIC, E, N_in, N_out, S,
reduce, tile_rows, schedule]``, reduce and schedule as positions in
:data:`fusekit.gms.problem.REDUCES` and :data:`SCHEDULES`.

Importing this module imports neither torch nor numba (the tuning space reads the schedules).
"""

from __future__ import annotations

#: The first entry of every packed plan and of every ``meta`` part ("gms" in ASCII).
MAGIC = 0x676D73
#: Work-item schedules: ``"pad"`` (a work item is one tile) or ``"pack"`` (small tiles of a
#: destination block share an item).
SCHEDULES: tuple[str, ...] = ("pad", "pack")
#: Entries of a ``meta`` part.
META_LENGTH = 8
#: The tensor fields of :class:`fusekit.gms.GMSPlan` a packed plan stores, in order.
TENSOR_FIELDS: tuple[str, ...] = (
    "order",
    "gather",
    "segment",
    "scatter",
    "norm",
    "segment_ptr",
    "tile_segment",
    "tile_start",
    "tile_end",
    "block_ptr",
    "item_ptr",
    "dst_ptr",
    "dst_pos",
    "src_ptr",
    "src_pos",
)
#: The parts of one plan: its meta, then its tensor fields.
PLAN_PARTS: tuple[str, ...] = ("meta", *TENSOR_FIELDS)
#: Every part of a packed plan, in order: the plan, then each order's index and sub-plan.
PART_NAMES: tuple[str, ...] = (*PLAN_PARTS, *(("index", *PLAN_PARTS) * 2))
