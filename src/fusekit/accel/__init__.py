"""Compound ops on multi-cluster spatial accelerators (COMET, arXiv 2509.00599): one cost model.

A mapping is a tree (:mod:`.tree`: a hierarchy of spatial levels, an op chain, tile, op,
binding and collective nodes) evaluated by the staged tree cost model (:mod:`.tree_model`, with
:mod:`.noc`, :mod:`.orion` and the named defects of :mod:`.compat`; its compiled twin scores
large spaces). :mod:`.comet` reads COMET's own files into that tree, writes the built-in ops'
templates and searches COMET's tiling space; :mod:`.mapper` searches it (best by
latency, energy or EDP, the Pareto front, COMET's unfused baseline), drawn by :mod:`.plot`
(``fusekit accel explore``, ``fusekit accel eval``, ``fusekit accel comet``).

Importing this package imports none of its modules; the names below load on first use.
"""

from __future__ import annotations

from fusekit.lazy import lazy_getattr

_WHERE = {
    "Compat": "compat",
    "Exploration": "mapper",
    "OBJECTIVES": "mapper",
    "TreeMapping": "tree",
    "explore": "mapper",
    "pareto": "mapper",
    "tree_from_dict": "tree",
    "tree_to_dict": "tree",
}

__all__ = sorted(_WHERE)

__getattr__ = lazy_getattr(__name__, _WHERE)
