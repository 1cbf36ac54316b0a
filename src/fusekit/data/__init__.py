"""Workloads and datasets: real graphs and LiDAR scans shipped with fusekit, and generators.

A leaf of the import graph (numpy, torch, SciPy only): every part, the benchmarks and the tests
read their inputs from here. The shipped files are converted once from ``shared/data`` by
``tools/make_data.py``; they are plain npz arrays, never pickles.
"""

from fusekit.data.graphs import (
    ENTITY_STATS,
    CitationGraph,
    EntityGraph,
    entities,
    entities_shaped,
    planetoid,
    read_entities_raw,
)

__all__ = [
    "ENTITY_STATS",
    "CitationGraph",
    "EntityGraph",
    "entities",
    "entities_shaped",
    "planetoid",
    "read_entities_raw",
]
