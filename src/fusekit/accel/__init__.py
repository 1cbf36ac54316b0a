"""Compound ops on multi-cluster spatial accelerators (COMET, arXiv 2509.00599).

Pipeline: problem (:mod:`.problem`) -> candidates (:mod:`.candidates`) -> cost model
(:mod:`.model`, a recipe of the per-unit terms of :mod:`.units`, with :mod:`.collectives` and
the Timeloop-style :mod:`.nest`) -> search (:mod:`.search`, pruned by :mod:`.bound`) -> report
(``fusekit accel explore``).

COMET's own mappings: a general mapping tree (:mod:`.tree`) and its staged cost model
(:mod:`.tree_model`, with :mod:`.noc`, :mod:`.orion` and the named defects of :mod:`.compat`);
:mod:`.comet` reads COMET's files into it and searches COMET's tiling space.

Importing this package imports none of its modules; the names below load on first use.
"""

from __future__ import annotations

from fusekit.lazy import lazy_getattr

_WHERE = {
    "Breakdown": "model",
    "CollectiveKind": "collectives",
    "Fusion": "mapping",
    "Group": "collectives",
    "Mapping": "mapping",
    "MappingError": "mapping",
    "Problem": "problem",
    "SearchResult": "search",
    "attention": "problem",
    "check_mapping": "mapping",
    "collective_cost": "collectives",
    "enumerate_mappings": "candidates",
    "evaluate": "model",
    "explore": "search",
    "from_tree": "mapping",
    "gemm": "problem",
    "gemm_layernorm": "problem",
    "gemm_softmax": "problem",
    "make_problem": "problem",
    "to_tree": "mapping",
}

__all__ = sorted(_WHERE)

__getattr__ = lazy_getattr(__name__, _WHERE)
