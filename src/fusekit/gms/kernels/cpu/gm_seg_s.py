"""``(GM)seg-S`` on the CPU: gather fused into the segment GEMM, then a scatter kernel (numba).

.. code-block:: text

    P[p, m] = sum_k A[a_index[p], k] * W[s, k, m]          p in tile t, s = segment(t)   kernel 1
    Y[i, m] (+= | max=) c[p] * P[p, m]                     p in dst CSR of row i          kernel 2

Dataflow: kernel 1 reads ``X`` rows by their gather indices straight into the register tile (no
gathered copy) and writes the products ``P[E, M]`` in plan order; kernel 2 walks the destination
CSR, one output row per thread, writing each row once. ``P`` makes one round trip through
memory (the thread's scratch buffer, reused across calls); in exchange no two threads ever write
the same row and kernel 1 needs no ownership: its work items are the plan's (``pad`` or
``pack``) items, not destination blocks. Kernel 1 is
:func:`~fusekit.gms.kernels.cpu.skeleton.dataflow_kernel` with the gather indices, no scatter.

Kernel 1 alone, with ``A = dY``, ``a_index = d`` and ``W^T``, is the first half of the input
gradient (see ``fusekit.gms.dispatch``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fusekit.gms.kernels.cpu.checks import check_index, check_operands
from fusekit.gms.kernels.cpu.rows import check_out, numpy_of, raise_if_bad, reduce_rows_cpu
from fusekit.gms.kernels.cpu.skeleton import run_dataflow, tiles_of
from fusekit.gms.memory import scratch

if TYPE_CHECKING:
    from fusekit.gms.planning.layout import GMSPlan


def segment_products_cpu(
    a: torch.Tensor,
    a_index: torch.Tensor,
    w: torch.Tensor,
    plan: GMSPlan,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Kernel 1: ``P[p] = A[a_index[p]] @ W[segment(p)]`` for every plan position.

    Args:
        a: ``[R, K]`` rows (contiguous).
        a_index: ``[E]`` the row of ``a`` of each plan position.
        w: ``[S, K, M]`` (contiguous).
        plan: the plan whose tiles and items to run.
        out: ``[E, M]`` contiguous tensor of the dtype of ``a`` to write into; new if None.

    Returns:
        ``out``, ``P`` of shape ``[E, M]``.

    Raises:
        TypeError: an operand has the wrong type or dtype.
        ValueError: an operand's shape is wrong, or a guarded tile, item or row index is out
            of range.
    """
    check_operands(a, w, None, plan.num_pairs, plan.num_segments, x_name="a")
    check_index("a_index", a_index, plan.num_pairs)
    if out is None:
        out = torch.empty(plan.num_pairs, w.shape[2], dtype=a.dtype)
    check_out(out, (plan.num_pairs, w.shape[2]), a.dtype)
    bad = run_dataflow(
        numpy_of(a),
        numpy_of(w),
        numpy_of(out),  # the products stored in plan order
        tiles_of(plan, "item_ptr"),
        a_index=numpy_of(a_index),  # the gather indices are the register tile's rows
    )
    raise_if_bad(bad, "tiles", "items, segments, positions and rows in range")
    return out


def gm_seg_s_cpu(
    x: torch.Tensor, w: torch.Tensor, plan: GMSPlan, scale: torch.Tensor | None
) -> torch.Tensor:
    """Run ``(GM)seg-S`` over a plan.

    Args:
        x: ``[N_in, K]`` float32/float64, contiguous.
        w: ``[S, K, M]`` same dtype, contiguous.
        plan: the plan (on the CPU).
        scale: ``[E]`` per plan position (mean weights folded in), or None.

    Returns:
        ``Y`` of shape ``[N_out, M]``.

    Raises:
        TypeError: an operand has the wrong type or dtype.
        ValueError: an operand's shape is wrong, or a guarded index is out of range.
    """
    check_operands(x, w, scale, plan.num_pairs, plan.num_segments)
    products = scratch("products", plan.num_pairs, w.shape[2], x.dtype)
    segment_products_cpu(x, plan.gather, w, plan, out=products)
    return reduce_rows_cpu(
        products,
        plan.dst_ptr,
        n_pairs=plan.num_pairs,
        scale=scale,
        pos=plan.dst_pos,
        reduce_max=plan.reduce == "max",
    )
