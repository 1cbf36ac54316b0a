"""Search infrastructure shared by the parts: spaces, measurement, a tuning cache, executors.

The pieces of every tuner (see ``fusekit.gms.search`` for the g-mm-s one)::

    Space of Knobs  --model-->  top_k points  --time_call-->  TuningCache  (per point, atomic)
    (the measuring runs through an Executor: serial, local processes or Ray)

Importing this package imports none of its modules: the names below load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusekit.lazy import lazy_getattr

if TYPE_CHECKING:
    from fusekit.search.cache import TuningCache as TuningCache
    from fusekit.search.executor import Executor as Executor
    from fusekit.search.executor import LocalExecutor as LocalExecutor
    from fusekit.search.executor import RayExecutor as RayExecutor
    from fusekit.search.executor import SerialExecutor as SerialExecutor
    from fusekit.search.executor import default_workers as default_workers
    from fusekit.search.measure import Timing as Timing
    from fusekit.search.measure import fastest as fastest
    from fusekit.search.measure import time_call as time_call
    from fusekit.search.space import Knob as Knob
    from fusekit.search.space import Space as Space
    from fusekit.search.space import point_key as point_key
    from fusekit.search.space import top_k as top_k

_WHERE = {
    "TuningCache": "cache",
    "Executor": "executor",
    "LocalExecutor": "executor",
    "RayExecutor": "executor",
    "SerialExecutor": "executor",
    "default_workers": "executor",
    "Timing": "measure",
    "time_call": "measure",
    "fastest": "measure",
    "Knob": "space",
    "Space": "space",
    "point_key": "space",
    "top_k": "space",
}

__all__ = sorted(_WHERE)

__getattr__ = lazy_getattr(__name__, _WHERE)
