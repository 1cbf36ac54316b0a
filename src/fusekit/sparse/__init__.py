"""Sparse models on a streaming dataflow machine (FuseFlow, arXiv 2511.04768).

Pipeline: workload (:mod:`.workloads`, :mod:`.frontend` from the IR) -> candidates
(:mod:`.candidates`: cuts x dataflow orders x storage orders x parallelism) -> cost model
(:mod:`.model`, the estimator) -> search (:mod:`.search`: estimate, prune, simulate) -> realise
(:mod:`.simulate`, the stream simulator; :mod:`.sim` and :mod:`.graph`, the per-token reference
machine) -> report (``fusekit sparse explore``). Importing this package imports numpy only.
"""

from fusekit.sparse.candidates import enumerate_schedules as enumerate_schedules
from fusekit.sparse.formats import FORMATS as FORMATS
from fusekit.sparse.formats import SparseTensor as SparseTensor
from fusekit.sparse.formats import from_dense as from_dense
from fusekit.sparse.formats import from_scipy as from_scipy
from fusekit.sparse.formats import from_torch as from_torch
from fusekit.sparse.frontend import from_graph as from_graph
from fusekit.sparse.frontend import from_module as from_module
from fusekit.sparse.frontend import from_text as from_text
from fusekit.sparse.fusion_table import FusionTable as FusionTable
from fusekit.sparse.fusion_table import fusion_table as fusion_table
from fusekit.sparse.machine import Machine as Machine
from fusekit.sparse.machine import MemoryModel as MemoryModel
from fusekit.sparse.model import estimate as estimate
from fusekit.sparse.program import Operand as Operand
from fusekit.sparse.program import Program as Program
from fusekit.sparse.program import Statement as Statement
from fusekit.sparse.program import reference as reference
from fusekit.sparse.schedule import Schedule as Schedule
from fusekit.sparse.search import explore as explore
from fusekit.sparse.simulate import simulate as simulate
from fusekit.sparse.workloads import Workload as Workload

__all__ = [
    "FORMATS",
    "FusionTable",
    "Machine",
    "MemoryModel",
    "Operand",
    "Program",
    "Schedule",
    "SparseTensor",
    "Statement",
    "Workload",
    "enumerate_schedules",
    "estimate",
    "explore",
    "from_dense",
    "from_graph",
    "from_module",
    "from_scipy",
    "from_text",
    "from_torch",
    "fusion_table",
    "reference",
    "simulate",
]
