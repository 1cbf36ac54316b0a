"""A g-mm-s plan: the sorting, tiling and indexing of a problem's pairs that every call reuses.

- :mod:`.format`: the packed plan's vocabulary (magic, parts, schedules); no torch.
- :mod:`.layout`: :class:`GMSPlan`, :class:`OrderPlan` and the packed form (:func:`pack`,
  :meth:`GMSPlan.from_packed`).
- :mod:`.build`: the planners (:func:`plan`, :func:`plan_sorted` and their steps).
- :mod:`.buffers`: plans allocated empty for builders that write them in place.
- :mod:`.derived`: what kernels derive from a plan once (:class:`Derived`).

Importing this package imports neither torch nor numba; the names below load on first use.
"""

from __future__ import annotations

from fusekit.lazy import lazy_getattr

#: Public name -> the module of this package that defines it.
_WHERE = {
    "Check": "derived",
    "Derived": "derived",
    "GMSPlan": "layout",
    "OrderPlan": "layout",
    "Passed": "derived",
    "PlanBuffer": "buffers",
    "SCHEDULES": "format",
    "TILE_ROWS": "build",
    "block_rows": "build",
    "default_blocks": "build",
    "empty_plan": "buffers",
    "empty_plan_with_tiles": "buffers",
    "pack": "layout",
    "plan": "build",
    "plan_sorted": "build",
    "tiles_of_runs": "build",
}

__all__ = sorted(_WHERE)


__getattr__ = lazy_getattr(__name__, _WHERE)
