"""The streaming primitives of the per-token machine, with SAM's token semantics and port names.

One small class per primitive, in modules by family; this module gathers them. Every primitive
fires at most once per cycle and sends at most one token per output port; the base class owns
the backpressure (:mod:`fusekit.sparse.sim.base`). Each is correct under any input timing (idle
cycles, FIFO depth 1, channel latency above 1): it waits for what it needs, never assumes it.

========================  ====================================  =================================
primitive                 inputs                                outputs
========================  ====================================  =================================
CompressedScanner         in_ref, in_crd_skip (optional)        out_crd, out_ref
UncompressedScanner       in_ref                                out_crd, out_ref
Intersect                 in_crd1, in_ref1, in_crd2, in_ref2    out_crd, out_ref1, out_ref2,
                                                                out_crd_skip1, out_crd_skip2
Union                     in_crd1, in_ref1, in_crd2, in_ref2    out_crd, out_ref1, out_ref2
JoinN                     in_crd<k>, in_ref<k> (k = 1..n)       out_crd, out_ref<k>
RepeatSigGen              in_stream                             out_repeat
Repeat                    in_ref, in_repeat                     out_ref
Locator (fusekit)         in_ref, in_repeat (a crd stream)      out_ref
CrdHold                   in_outer_crd, in_inner_crd            out_outer_crd, out_inner_crd
CrdDrop                   in_outer_crd, in_inner_crd            out_outer_crd, out_inner_crd
ArrayRead                 in_ref                                out_val
ALU                       in1, in2 (binary ops)                 out_val
Reduce                    in_val                                out_val
SparseAccumulator         in_outer_crdpt, in_inner_crdpt,       out_outer_crd, out_inner_crd,
                          in_val                                out_val
CompressedWriter          in_crd                                (crd_arr, seg_arr)
UncompressedWriter        in_crd                                (dim)
ValsWriter                in_val                                (vals)
========================  ====================================  =================================

A broadcast is an output port wired to several channels.
"""

from fusekit.sparse.sim.base import Primitive, Sink, Source
from fusekit.sparse.sim.join import Intersect, JoinN, Union
from fusekit.sparse.sim.repeat import CrdDrop, CrdHold, Locator, Repeat, RepeatSigGen
from fusekit.sparse.sim.scan import CompressedScanner, Scanner, UncompressedScanner, level_scanner
from fusekit.sparse.sim.values import (
    ALU,
    BINARY_OPS,
    UNARY_OPS,
    ArrayRead,
    Reduce,
    SparseAccumulator,
)
from fusekit.sparse.sim.write import CompressedWriter, UncompressedWriter, ValsWriter

__all__ = [
    "ALU",
    "BINARY_OPS",
    "UNARY_OPS",
    "ArrayRead",
    "CompressedScanner",
    "CompressedWriter",
    "CrdDrop",
    "CrdHold",
    "Intersect",
    "JoinN",
    "Locator",
    "Primitive",
    "Reduce",
    "Repeat",
    "RepeatSigGen",
    "Scanner",
    "Sink",
    "Source",
    "SparseAccumulator",
    "UncompressedScanner",
    "UncompressedWriter",
    "Union",
    "ValsWriter",
    "level_scanner",
]
