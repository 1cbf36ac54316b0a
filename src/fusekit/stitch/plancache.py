"""Plans kept on disk: a graph planned once for a target is not planned again.

Planning a whole model's graph analyses thousands of candidate groups (most of a first call's
time); Inductor likewise keeps its compiled graphs on disk. A plan is stored under

    sha256(planned graph's text, target, planner options, planner's source)

in ``cache_dir("plans")`` as the chosen groups' op names and the plan's figures. The planned
graph is the one :func:`fusekit.stitch.search.plan` partitions (merged dims split, epilogues
split off), so equal text means the same ops; the planner's own source is in the key, so a
changed planner plans again. A hit rebuilds the chosen groups only
(:func:`fusekit.stitch.candidates.rebuild`: tens of analyses, not thousands); an entry that
does not load or no longer fits its graph is ignored and the graph is planned afresh.
``FUSEKIT_PLAN_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
from functools import cache
from pathlib import Path
from typing import Any

from fusekit.paths import cache_dir, write_atomic

log = logging.getLogger(__name__)

#: The modules whose code decides a plan: their source is part of every key.
PLANNER_MODULES = (
    "fusekit.stitch.search",
    "fusekit.stitch.candidates",
    "fusekit.stitch.schemes",
    "fusekit.stitch.model",
    "fusekit.stitch.classify",
    "fusekit.stitch.epilogue",
    "fusekit.ir.refine",
    "fusekit.search.ilp",
)

#: What an entry holds besides the groups: :class:`~fusekit.stitch.search.Plan`'s figures,
#: with their JSON types.
FIGURES: dict[str, tuple[type, ...]] = {
    "objective_s": (int, float), "bound_s": (int, float), "greedy_s": (int, float),
    "unfused_s": (int, float), "solve_s": (int, float), "candidates_s": (int, float),
    "n_candidates": (int,), "optimal": (bool,), "timed_out": (bool,), "method": (str,),
}  # fmt: skip


def enabled() -> bool:
    """Whether plans are read from and written to the cache (``FUSEKIT_PLAN_CACHE``)."""
    return os.environ.get("FUSEKIT_PLAN_CACHE", "1") != "0"


@cache
def planner_digest() -> str:
    """sha256 of the planner's source (:data:`PLANNER_MODULES`)."""
    h = hashlib.sha256()
    for name in PLANNER_MODULES:
        module = importlib.import_module(name)
        h.update(Path(str(module.__file__)).read_bytes())
    return h.hexdigest()


def plan_key(graph_text: str, target: Any, options: tuple[Any, ...]) -> str:
    """The key of a plan: the graph, the target, the options and the planner, hashed."""
    h = hashlib.sha256()
    for part in (graph_text, repr(target), repr(options), planner_digest()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _path(key: str, folder: Path | None) -> Path:
    return (folder or cache_dir("plans")) / f"{key}.json"


def load(key: str, folder: Path | None = None) -> dict[str, Any] | None:
    """The entry under ``key``, or ``None`` (missing, unreadable or malformed)."""
    path = _path(key, folder)
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    groups = entry.get("groups") if isinstance(entry, dict) else None
    if not (isinstance(groups, list) and all(
        isinstance(g, list) and g and all(isinstance(o, str) for o in g) for g in groups
    ) and all(isinstance(entry.get(k), t) for k, t in FIGURES.items())):  # fmt: skip
        log.info("stitch: ignoring the malformed cached plan %s", path)
        return None
    return dict(entry)


def store(key: str, groups: list[list[str]], figures: dict[str, Any],
          folder: Path | None = None) -> None:  # fmt: skip
    """Write an entry (best effort: a cache that cannot be written is skipped with a log)."""
    path = _path(key, folder)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"groups": groups, **figures}))
    except OSError as e:
        log.info("stitch: plan not cached (%s)", e)
