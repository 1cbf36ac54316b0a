"""Compound ops on multi-cluster spatial accelerators (COMET, arXiv 2509.00599).

Pipeline: problem (:mod:`.problem`) -> candidates (:mod:`.candidates`) -> cost model
(:mod:`.model`, with :mod:`.collectives` and the Timeloop-style :mod:`.nest`) -> search
(:mod:`.search`) -> report (``fusekit accel explore``).

COMET's own mappings: a general mapping tree (:mod:`.tree`) and its staged cost model
(:mod:`.tree_model`, with :mod:`.noc`, :mod:`.orion` and the named defects of :mod:`.compat`);
:mod:`.comet` reads COMET's files into it and searches COMET's tiling space.
"""

from fusekit.accel.candidates import enumerate_mappings as enumerate_mappings
from fusekit.accel.collectives import CollectiveKind as CollectiveKind
from fusekit.accel.collectives import Group as Group
from fusekit.accel.collectives import collective_cost as collective_cost
from fusekit.accel.mapping import Fusion as Fusion
from fusekit.accel.mapping import Mapping as Mapping
from fusekit.accel.mapping import MappingError as MappingError
from fusekit.accel.mapping import check_mapping as check_mapping
from fusekit.accel.mapping import from_tree as from_tree
from fusekit.accel.mapping import to_tree as to_tree
from fusekit.accel.model import Breakdown as Breakdown
from fusekit.accel.model import evaluate as evaluate
from fusekit.accel.problem import Problem as Problem
from fusekit.accel.problem import attention as attention
from fusekit.accel.problem import gemm as gemm
from fusekit.accel.problem import gemm_layernorm as gemm_layernorm
from fusekit.accel.problem import gemm_softmax as gemm_softmax
from fusekit.accel.problem import make_problem as make_problem
from fusekit.accel.search import SearchResult as SearchResult
from fusekit.accel.search import explore as explore

__all__ = [
    "Breakdown",
    "CollectiveKind",
    "Fusion",
    "Group",
    "Mapping",
    "MappingError",
    "Problem",
    "SearchResult",
    "attention",
    "check_mapping",
    "collective_cost",
    "enumerate_mappings",
    "evaluate",
    "explore",
    "from_tree",
    "gemm",
    "gemm_layernorm",
    "gemm_softmax",
    "make_problem",
    "to_tree",
]
