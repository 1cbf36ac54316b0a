"""Workloads and datasets: real graphs and LiDAR scans shipped with fusekit, and generators.

A leaf of the import graph (numpy, torch, SciPy only): every part, the benchmarks and the tests
read their inputs from here. Importing the package loads nothing heavy; names load on first
use. The shipped files are converted once from ``shared/data`` by
``tools/make_data.py``; they are plain npz arrays, never pickles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusekit.lazy import lazy_getattr

if TYPE_CHECKING:
    from fusekit.data.graphs import (
        ENTITY_STATS,
        CitationGraph,
        EntityGraph,
        entities,
        entities_shaped,
        planetoid,
        read_entities_raw,
    )
    from fusekit.data.tokens import ROUTINGS, MoEBatch, expert_load, moe_batch
    from fusekit.data.voxels import LIDAR_SCANS, VoxelScan, lidar_like, lidar_scan

_WHERE = {
    "ENTITY_STATS": "graphs",
    "CitationGraph": "graphs",
    "EntityGraph": "graphs",
    "entities": "graphs",
    "entities_shaped": "graphs",
    "planetoid": "graphs",
    "read_entities_raw": "graphs",
    "ROUTINGS": "tokens",
    "MoEBatch": "tokens",
    "expert_load": "tokens",
    "moe_batch": "tokens",
    "LIDAR_SCANS": "voxels",
    "VoxelScan": "voxels",
    "lidar_like": "voxels",
    "lidar_scan": "voxels",
}

__all__ = [
    "ENTITY_STATS",
    "LIDAR_SCANS",
    "ROUTINGS",
    "CitationGraph",
    "EntityGraph",
    "MoEBatch",
    "VoxelScan",
    "entities",
    "entities_shaped",
    "expert_load",
    "lidar_like",
    "lidar_scan",
    "moe_batch",
    "planetoid",
    "read_entities_raw",
]


__getattr__ = lazy_getattr(__name__, _WHERE)
