"""``G-(MS)seg`` on the CPU: a gather kernel, then the segment GEMM with the scatter fused (numba).

.. code-block:: text

    Xg[p, k] = X[g[p], k]                                                    kernel 1
    Y[d[p], m] (+= | max=) c[p] * sum_k Xg[p, k] * W[s, k, m]   p in tile t   kernel 2

Dataflow: kernel 1 writes the gathered rows ``Xg[E, K]`` in plan order (a streaming write);
kernel 2 reads them as consecutive rows, so its register tile loads contiguous memory, and adds
the products from registers into ``Y``. On a GPU the epilogue would need atomics; on the CPU the
threads take the plan's destination blocks, each owning its output rows, as in ``(GMS)seg``.
Kernel 2 is :func:`~fusekit.gms.kernels.cpu.skeleton.dataflow_kernel` without gather indices.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fusekit.gms.kernels.cpu.checks import check_operands
from fusekit.gms.kernels.cpu.gms_seg import check_block_ptr, empty_rows_to_zero
from fusekit.gms.kernels.cpu.rows import gather_rows_cpu, numpy_of, plan_array, raise_if_bad
from fusekit.gms.kernels.cpu.skeleton import run_dataflow, tiles_of

if TYPE_CHECKING:
    from fusekit.gms.planning.layout import GMSPlan


def g_ms_seg_cpu(
    x: torch.Tensor, w: torch.Tensor, plan: GMSPlan, scale: torch.Tensor | None
) -> torch.Tensor:
    """Run ``G-(MS)seg`` over a plan.

    Args:
        x: ``[N_in, K]`` float32/float64, contiguous.
        w: ``[S, K, M]`` same dtype, contiguous.
        plan: the plan (on the CPU).
        scale: ``[E]`` per plan position (mean weights folded in), or None.

    Returns:
        ``Y`` of shape ``[N_out, M]``.

    Raises:
        TypeError: an operand has the wrong type or dtype.
        ValueError: an operand's shape is wrong, the block pointer is malformed or a guarded
            index is out of range.
    """
    check_operands(x, w, scale, plan.num_pairs, plan.num_segments)
    gathered = gather_rows_cpu(x, plan.gather)
    reduce_max = plan.reduce == "max"
    out = torch.full((plan.n_out, w.shape[2]), float("-inf") if reduce_max else 0.0, dtype=x.dtype)
    check_block_ptr(plan)
    bad = run_dataflow(
        numpy_of(gathered),  # consecutive rows: the register tile loads contiguous memory
        numpy_of(w),
        numpy_of(out),
        tiles_of(plan, "block_ptr"),
        scatter=plan_array(plan, "scatter"),  # into the block's own rows
        scale=None if scale is None else numpy_of(scale),
        reduce_max=reduce_max,
    )
    raise_if_bad(bad, "tiles", "segments, positions and rows in range")
    if reduce_max:
        empty_rows_to_zero(out, plan)
    return out
