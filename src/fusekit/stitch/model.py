r"""Cost model of one fusion group (one kernel) on a CPU or GPU target.

.. math::

    t = \max\Big(\frac{B_{dram}}{BW u}, \frac{F}{P u}\Big) + L t_{launch}

with (FusionStitching, arXiv 1911.11576, section 5; the roofline of Williams et al. 2009):

- :math:`B_{dram}` bytes moved: every input read once, every output written once, plus the
  spill of row buffers that do not fit on chip (written and read back: ``2 x rows x buffer``);
  on-chip capacity is the L2 of one core on a CPU, the shared memory of one SM on a GPU (and a
  row held in registers beyond 64 values per thread spills the same way);
- :math:`F` floating-point work: per op, its iteration domain times the arithmetic nodes of its
  expression (a transcendental function counts 8), :math:`2MNK` for a contraction;
- :math:`u = \min(1, \text{rows} / \text{parallel units})` the occupancy: a kernel whose rows
  cannot fill the cores or SMs gets that fraction of the bandwidth and FLOP/s;
- :math:`L` launches (one per kernel; a column reduction on a GPU adds its combine kernel).

A group of layout ops only (views, transposes, reshapes) is predicted to move nothing: it runs
as strided views of its sources. A GEMM's epilogue add left alone runs inside the GEMM's ATen
call (:func:`estimate_epilogue`).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from fusekit.hw.cpu_gpu import CPUTarget, GPUTarget
from fusekit.ir.expr import Bin, Call, Reduce, walk
from fusekit.ir.graph import Graph
from fusekit.stitch.classify import EXPENSIVE, layout_only
from fusekit.stitch.schemes import Layout, Role

_BYTES = {"float64": 8, "int64": 8, "complex64": 8, "complex128": 16, "float32": 4, "int32": 4,
          "float16": 2, "bfloat16": 2, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}  # fmt: skip
#: Values of one row a GPU thread may hold in registers before spilling.
REGISTER_VALUES_PER_THREAD = 64


@dataclass(frozen=True, slots=True)
class GroupCost:
    """The terms of one kernel's predicted time.

    Attributes:
        dram_bytes: bytes read and written in DRAM (spills included).
        flops: floating-point work.
        launches: kernel launches.
        occupancy: fraction of the parallel units the kernel fills.
        memory_s: ``dram_bytes / (bandwidth * occupancy)``.
        compute_s: ``flops / (peak * occupancy)``.
        launch_s: ``launches * launch overhead``.
        spill_bytes: the part of ``dram_bytes`` caused by buffers exceeding on-chip capacity.
    """

    dram_bytes: float
    flops: float
    launches: int
    occupancy: float
    memory_s: float
    compute_s: float
    launch_s: float
    spill_bytes: float

    @property
    def total_s(self) -> float:
        """Predicted seconds: the slower of memory and compute, plus launches."""
        return max(self.memory_s, self.compute_s) + self.launch_s

    def explain(self) -> str:
        """One line with every term."""
        return (
            f"{self.total_s * 1e6:.1f} us = max(mem {self.memory_s * 1e6:.1f}, "
            f"compute {self.compute_s * 1e6:.1f}) + {self.launches} launch "
            f"{self.launch_s * 1e6:.1f} us; {self.dram_bytes / 1e6:.3f} MB "
            f"(spill {self.spill_bytes / 1e6:.3f}), occupancy {self.occupancy:.2f}"
        )


def tensor_bytes(graph: Graph, name: str) -> int:
    """Bytes of tensor ``name`` (static shape)."""
    t = graph.tensor(name)
    return t.numel() * _BYTES.get(t.dtype, 4)


def op_flops(graph: Graph, name: str) -> float:
    """Floating-point work of one op: its domain times its arithmetic (2MNK for a contraction)."""
    op = graph.op(name)
    ext = graph.extents(name)
    domain = math.prod(int(v) for v in ext.values()) if ext else 0
    work = 0
    for n in walk(op.expr):
        if isinstance(n, Call):
            work += 8 if n.fn in EXPENSIVE else 1
        elif isinstance(n, Bin | Reduce):
            work += 1
    return float(domain * max(work, 1))


def estimate(
    graph: Graph,
    ops: Collection[str],
    target: CPUTarget | GPUTarget,
    layout: Layout | None = None,
) -> GroupCost:
    """Predict the time of ``ops`` run as one kernel (``layout``) or, without one, as one op.

    Args:
        graph: the graph.
        ops: the group's op names.
        target: the CPU or GPU the kernel runs on.
        layout: the stitched layout of the group; ``None`` for a single op run alone.

    Returns:
        The :class:`GroupCost`.
    """
    group = set(ops)
    reads = {n for o in group for n in graph.op(o).inputs if n not in group}
    writes = {o for o in group if o in graph.outputs or set(graph.successors(o)) - group}
    if layout is not None:  # folded layout ops read their sources directly
        reads = set(layout.inputs)
    dram_bytes = float(sum(tensor_bytes(graph, n) for n in reads | writes))
    flops = sum(op_flops(graph, o) for o in group)
    if layout is not None and layout_only(graph, group):
        # layout ops only: strided views of their sources (alone.LayoutViews), no data moved
        # when the sources are contiguous, as the kernels write them
        dram_bytes = flops = 0.0
    rows = layout.rows if layout is not None else _rows(graph, ops)
    spill_bytes = 0.0
    launches = 1
    if layout is not None:
        row_bytes = 4.0 * layout.inner_numel * max(len(layout.buffered), 1)
        if isinstance(target, CPUTarget):
            capacity = float(target.l2_bytes)
        else:
            capacity = float(target.shared_mem_per_sm_bytes)
            threads = min(1024, max(32, layout.inner_numel))
            if layout.inner_numel / threads > REGISTER_VALUES_PER_THREAD:
                capacity = 0.0
            launches += any(r is Role.COL_REDUCE for r in layout.roles.values())
        if layout.buffered and row_bytes > capacity:
            spill_bytes = 2.0 * rows * row_bytes
    return _cost(target, dram_bytes + spill_bytes, flops, launches, rows, spill_bytes)


def _cost(
    target: CPUTarget | GPUTarget,
    dram_bytes: float,
    flops: float,
    launches: int,
    rows: int,
    spill_bytes: float = 0.0,
) -> GroupCost:
    """The :class:`GroupCost` of these terms on ``target`` (the module's formula)."""
    occupancy = min(1.0, rows / max(target.parallel_units, 1))
    memory_s = dram_bytes / (target.mem_bw_bytes_per_s * occupancy)
    compute_s = flops / (target.peak("fp32") * occupancy)
    launch_s = launches * target.launch_overhead_s
    return GroupCost(
        dram_bytes, flops, launches, occupancy, memory_s, compute_s, launch_s, spill_bytes
    )


def estimate_epilogue(
    graph: Graph, gemm: str, add: str, target: CPUTarget | GPUTarget
) -> GroupCost:
    """Predict the epilogue add ``Y = C + Y_mm`` of contraction ``gemm``, run inside its call.

    The runner merges a lone epilogue add back into its contraction
    (:func:`fusekit.stitch.epilogue.merged_addend`): ``addmm`` first broadcasts ``C`` into
    ``Y``, then accumulates the product onto it, so the add costs a read of ``C`` and a write of
    ``Y`` and no launch (oneDNN adds a bias inside its GEMM, for less). Run as a kernel of its
    own, it would also read ``Y_mm``.
    """
    addends = [n for n in graph.op(add).inputs if n != gemm]
    dram_bytes = float(sum(tensor_bytes(graph, n) for n in (add, *addends)))
    return _cost(target, dram_bytes, 0.0, 0, _rows(graph, [add]))


def _rows(graph: Graph, ops: Collection[str]) -> int:
    """Parallel rows of an op run alone: its output elements over its innermost dim."""
    best = 1
    for o in ops:
        shape = [int(s) for s in graph.tensor(o).shape]
        best = max(best, math.prod(shape[:-1]) if len(shape) > 1 else 1)
    return best
