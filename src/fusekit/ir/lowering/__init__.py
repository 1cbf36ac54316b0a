"""Lowering of ATen ops to IR ops, one module per op family.

Importing this package registers every rule in :data:`RULES` (ATen packet name -> rule).
"""

from fusekit.ir.lowering import elementwise as elementwise
from fusekit.ir.lowering import indexing as indexing
from fusekit.ir.lowering import layout as layout
from fusekit.ir.lowering import linalg as linalg
from fusekit.ir.lowering import reduce as reduce
from fusekit.ir.lowering.base import RULES as RULES
from fusekit.ir.lowering.base import Builder as Builder
from fusekit.ir.lowering.base import Out as Out
from fusekit.ir.lowering.base import Unsupported as Unsupported
from fusekit.ir.lowering.base import V as V

__all__ = [
    "RULES",
    "Builder",
    "Out",
    "Unsupported",
    "V",
    "elementwise",
    "indexing",
    "layout",
    "linalg",
    "reduce",
]
