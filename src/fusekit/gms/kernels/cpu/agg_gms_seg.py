"""``aggregate-first/(GMS)seg`` fused on the CPU: the aggregation in the GEMM prologue (numba).

.. code-block:: text

    A[u, k]   = sum_{p in group u} c[p] * X[g[p], k]        u = distinct (segment, scatter row)
    Y[d_u, m] += sum_k A[u, k] * W[s_u, k, m]                u in tile t of the order's sub-plan

Dataflow: one kernel over the aggregate-first sub-plan's tiles. The ``MR`` rows of a register tile
are aggregated from their groups' input rows into a per-thread scratch (cache-resident), then go
through the register tile and are added into the block's own output rows. Unlike the two-step
composition (``reduce_rows`` then ``(GMS)seg`` over ``A``), ``A[U, K]`` never goes to memory and
the threads start once. ``fusekit.gms.dispatch`` uses it for ``aggregate-first/(GMS)seg`` when a
backend provides it. The kernel is :func:`~fusekit.gms.kernels.cpu.skeleton.dataflow_kernel` with
the groups and the scratch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fusekit.errors import expected
from fusekit.gms.kernels.cpu.checks import check_operands
from fusekit.gms.kernels.cpu.gms_seg import check_block_ptr
from fusekit.gms.kernels.cpu.rows import numpy_of, plan_array, raise_if_bad
from fusekit.gms.kernels.cpu.skeleton import run_dataflow, tiles_of
from fusekit.gms.kernels.cpu.tile import MR

if TYPE_CHECKING:
    from fusekit.gms.planning.layout import GMSPlan


def agg_gms_seg_cpu(
    x: torch.Tensor, w: torch.Tensor, plan: GMSPlan, scale: torch.Tensor | None
) -> torch.Tensor:
    """Run ``aggregate-first/(GMS)seg`` fused over a plan (sum or mean).

    Args:
        x: ``[N_in, K]`` float32/float64, contiguous.
        w: ``[S, K, M]`` same dtype, contiguous.
        plan: the plan, holding its aggregate-first order.
        scale: ``[E]`` per plan position (mean weights folded in), or None.

    Returns:
        ``Y`` of shape ``[N_out, M]``.

    Raises:
        TypeError: an operand has the wrong type or dtype.
        ValueError: an operand's shape is wrong, the plan has no aggregate-first order, or a
            guarded index is out of range.
    """
    if plan.aggregate is None:
        raise ValueError(expected("gms", "plan", "one with an aggregate-first order", "none"))
    check_operands(x, w, scale, plan.num_pairs, plan.num_segments)
    sub = plan.aggregate.plan
    check_block_ptr(sub)
    out = torch.zeros(plan.n_out, w.shape[2], dtype=x.dtype)
    scratch = torch.empty(sub.num_blocks, MR, x.shape[1], dtype=x.dtype)
    bad = run_dataflow(
        numpy_of(x),
        numpy_of(w),
        numpy_of(out),
        tiles_of(sub, "block_ptr"),
        a_index=plan_array(plan, "gather"),  # of the group members, in plan order
        group_ptr=numpy_of(plan.aggregate.index),
        groups=plan_array(sub, "gather"),  # the group of each sub-plan position
        scratch=numpy_of(scratch),
        scatter=plan_array(sub, "scatter"),
        scale=None if scale is None else numpy_of(scale),  # of the group members
    )
    raise_if_bad(bad, "aggregate-first order", "groups, positions and rows in range")
    return out
