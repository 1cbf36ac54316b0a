"""``(GMS)seg`` on the CPU: gather, segment GEMM and scatter in one kernel (numba).

.. code-block:: text

    Y[d[p], m]  (+= | max=)  c[p] * sum_k X[g[p], k] * W[s, k, m]      p in tile t, s = segment(t)

Dataflow: one pass over the plan's tiles. A tile's gather indices are the register tile's rows, so
``X`` rows go from cache straight into the FMAs (no gathered copy); its products go from
registers straight into ``Y`` (no product buffer). Only ``X``, ``W`` and ``Y`` touch memory:
the fewest bytes of the four dataflows.

Parallelism without atomics: the threads take the plan's destination blocks; a block owns a
contiguous range of output rows and runs its tiles segment by segment (``W[s]`` stays in cache),
so two threads never write the same row. The kernel is
:func:`~fusekit.gms.kernels.cpu.skeleton.dataflow_kernel` with the gather indices and the scatter.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import torch

from fusekit.errors import expected
from fusekit.gms.kernels.cpu.checks import check_operands
from fusekit.gms.kernels.cpu.rows import numpy_of, plan_array, raise_if_bad
from fusekit.gms.kernels.cpu.skeleton import run_dataflow, tiles_of
from fusekit.gms.planning.derived import Check, Passed

if TYPE_CHECKING:
    from fusekit.gms.planning.layout import GMSPlan


def gms_seg_cpu(
    x: torch.Tensor, w: torch.Tensor, plan: GMSPlan, scale: torch.Tensor | None
) -> torch.Tensor:
    """Run ``(GMS)seg`` over a plan.

    Args:
        x: ``[N_in, K]`` float32/float64 (the caller upcasts bfloat16), contiguous.
        w: ``[S, K, M]`` same dtype, contiguous.
        plan: the plan (on the CPU), built for ``x``'s and ``w``'s sizes.
        scale: ``[E]`` per plan position (mean weights folded in), or None.

    Returns:
        ``Y`` of shape ``[N_out, M]``.

    Raises:
        TypeError: an operand has the wrong type or dtype.
        ValueError: an operand's shape is wrong, the plan's block pointer is malformed, or a
            guarded index is out of range.
    """
    check_operands(x, w, scale, plan.num_pairs, plan.num_segments)
    reduce_max = plan.reduce == "max"
    fill = float("-inf") if reduce_max else 0.0
    out = torch.full((plan.n_out, w.shape[2]), fill, dtype=x.dtype)
    check_block_ptr(plan)
    bad = run_dataflow(
        numpy_of(x),
        numpy_of(w),
        numpy_of(out),
        tiles_of(plan, "block_ptr"),
        a_index=plan_array(plan, "gather"),  # the gather indices are the register tile's rows
        scatter=plan_array(plan, "scatter"),  # into the block's own rows
        scale=None if scale is None else numpy_of(scale),
        reduce_max=reduce_max,
    )
    raise_if_bad(bad, "tiles", "segments, positions and rows in range")
    if reduce_max:
        empty_rows_to_zero(out, plan)
    return out


def check_block_ptr(plan: GMSPlan) -> None:
    """Raise unless ``block_ptr`` is non-decreasing within ``[0, T]`` (``B + 1`` values)."""
    if Passed(Check.CPU_BLOCK_PTR) in plan.derived.passed:
        return
    ptr = plan.block_ptr.tolist()
    decreasing = any(a > b for a, b in itertools.pairwise(ptr))
    if not ptr or ptr[0] < 0 or ptr[-1] > plan.num_tiles or decreasing:
        raise ValueError(
            expected("gms", "plan block_ptr", f"non-decreasing in [0, {plan.num_tiles}]", ptr[:8])
        )
    plan.derived.passed.add(Passed(Check.CPU_BLOCK_PTR))


def empty_rows_to_zero(out: torch.Tensor, plan: GMSPlan) -> None:
    """Set the rows no pair reaches (still ``-inf`` after a max) to zero."""
    degree = plan.dst_ptr[1:] - plan.dst_ptr[:-1]
    out[degree == 0] = 0
