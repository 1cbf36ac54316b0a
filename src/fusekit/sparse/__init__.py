"""Sparse models on a streaming dataflow machine (FuseFlow, arXiv 2511.04768).

Pipeline: workload (:mod:`.workloads`, :mod:`.frontend` from the IR) -> candidates
(:mod:`.candidates`: cuts x dataflow orders x storage orders x parallelism) -> cost model
(:mod:`.model`, the estimator) -> search (:mod:`.search`: estimate, prune, simulate) -> realise
(:mod:`.simulate`, the stream simulator; :mod:`.sim` and :mod:`.graph`, the per-token reference
machine) -> report (``fusekit sparse explore``). Importing this package imports nothing else:
the names below load on first use (the CLI mounts ``fusekit sparse`` without numpy).
"""

from __future__ import annotations

from fusekit.lazy import lazy_getattr

_WHERE = {
    "enumerate_schedules": "candidates",
    "FORMATS": "formats",
    "SparseTensor": "formats",
    "from_dense": "formats",
    "from_scipy": "formats",
    "from_torch": "formats",
    "from_graph": "frontend",
    "from_module": "frontend",
    "from_text": "frontend",
    "FusionTable": "fusion_table",
    "fusion_table": "fusion_table",
    "Machine": "machine",
    "MemoryModel": "machine",
    "estimate": "model",
    "Operand": "program",
    "Program": "program",
    "Statement": "program",
    "reference": "program",
    "Schedule": "schedule",
    "explore": "search",
    "simulate": "simulate",
    "Workload": "workloads",
}

__all__ = sorted(_WHERE)


__getattr__ = lazy_getattr(__name__, _WHERE)
