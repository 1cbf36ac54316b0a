"""The tensor-expression graph every part of fusekit reads.

Tensors (shape, dtype, TACO-style format, statistics), ops in index notation, graphs with the
algorithms fusion planners need, a text form that round-trips, capture from PyTorch, an
interpreter used as the reference, and pattern matchers. Importing this package does not import
torch; capture and the interpreter import it when called. The built-in example models live in
:mod:`fusekit.ir.examples` (which imports torch).

The names are imported, not loaded lazily through :func:`fusekit.lazy.lazy_getattr`: ``capture``
and ``interpret`` share their modules' names, and a loaded submodule would shadow them.
"""

from fusekit.ir.capture import Capture as Capture
from fusekit.ir.capture import CaptureError as CaptureError
from fusekit.ir.capture import capture as capture
from fusekit.ir.capture import capture_graph as capture_graph
from fusekit.ir.dot import to_dot as to_dot
from fusekit.ir.expr import FUNCTIONS as FUNCTIONS
from fusekit.ir.expr import Access as Access
from fusekit.ir.expr import Bin as Bin
from fusekit.ir.expr import Call as Call
from fusekit.ir.expr import Const as Const
from fusekit.ir.expr import DTypeRef as DTypeRef
from fusekit.ir.expr import Expr as Expr
from fusekit.ir.expr import IBin as IBin
from fusekit.ir.expr import IConst as IConst
from fusekit.ir.expr import IndexTerm as IndexTerm
from fusekit.ir.expr import IVar as IVar
from fusekit.ir.expr import Opaque as Opaque
from fusekit.ir.expr import Reduce as Reduce
from fusekit.ir.expr import ReduceOp as ReduceOp
from fusekit.ir.expr import TensorRef as TensorRef
from fusekit.ir.graph import Graph as Graph
from fusekit.ir.graph import format_graph as format_graph
from fusekit.ir.interpret import interpret as interpret
from fusekit.ir.op import Op as Op
from fusekit.ir.op import OpKind as OpKind
from fusekit.ir.op import format_op as format_op
from fusekit.ir.patterns import GmsChain as GmsChain
from fusekit.ir.patterns import Weight as Weight
from fusekit.ir.patterns import find_gms_chains as find_gms_chains
from fusekit.ir.printer import format_expr as format_expr
from fusekit.ir.tensor import DTYPES as DTYPES
from fusekit.ir.tensor import Dim as Dim
from fusekit.ir.tensor import Format as Format
from fusekit.ir.tensor import Level as Level
from fusekit.ir.tensor import Tensor as Tensor
from fusekit.ir.tensor import TensorStats as TensorStats
from fusekit.ir.text import ParseError as ParseError
from fusekit.ir.text import parse_expr as parse_expr
from fusekit.ir.text import parse_graph as parse_graph
from fusekit.ir.text import parse_op as parse_op

__all__ = [
    "DTYPES",
    "FUNCTIONS",
    "Access",
    "Bin",
    "Call",
    "Capture",
    "CaptureError",
    "Const",
    "DTypeRef",
    "Dim",
    "Expr",
    "Format",
    "GmsChain",
    "Graph",
    "IBin",
    "IConst",
    "IVar",
    "IndexTerm",
    "Level",
    "Op",
    "OpKind",
    "Opaque",
    "ParseError",
    "Reduce",
    "ReduceOp",
    "Tensor",
    "TensorRef",
    "TensorStats",
    "Weight",
    "capture",
    "capture_graph",
    "find_gms_chains",
    "format_expr",
    "format_graph",
    "format_op",
    "interpret",
    "parse_expr",
    "parse_graph",
    "parse_op",
    "to_dot",
]
