"""``(GM)seg-S`` in Triton: segment GEMM with the gather fused, then a segment-reduce scatter.

.. code-block:: text

    P[p, m] = sum_k X[g[p], k] * W[s, k, m]                p in tile t, s = segment(t)   kernel 1
    Y[i, m] (+= | max=) c[p] * P[p, m]                      q in CSR(i), p = pos[q]       kernel 2

Dataflow: kernel 1 is ``(GMS)seg``'s kernel gathering ``X`` rows in its prologue and storing the
products in plan order (``P[E, M]``, float32); kernel 2 walks the destination CSR
(``dst_ptr``/``dst_pos``), one program per (output row, ``BLOCK_M`` columns), reducing
``BLOCK_Q`` positions at a time (the reduce of ``kernels/triton/rows.py``). Each output row has one
owner: no atomics, and the result does not depend on the schedule. A ``max`` row no pair reaches is
zero.

Kernel 1 alone (:func:`segment_products_triton`), with ``A = dY``, ``a_index = d`` and ``W^T``,
is the first half of the input gradient (see ``fusekit.gms.dispatch``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fusekit.gms.kernels.triton.checks import (
    check_dst_csr,
    check_index,
    check_operands,
    check_rows,
    check_tiles,
)
from fusekit.gms.kernels.triton.gms_seg import STORE, segment_gemm
from fusekit.gms.kernels.triton.rows import launch_reduce_rows

if TYPE_CHECKING:
    from fusekit.gms.planning.layout import GMSPlan


def reduce_by_destination(
    products: torch.Tensor, plan: GMSPlan, scale: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    """``Y[i] (+= | max=) c[p] * products[p]`` over the positions of row ``i`` (CSR checked).

    Args:
        products: ``[E, M]`` in plan order.
        plan: the plan whose ``dst_ptr``/``dst_pos`` and ``reduce`` to use.
        scale: ``[E]`` factor of each position, or None.
        dtype: the dtype of the result.

    Returns:
        ``Y`` of shape ``[N_out, M]``.
    """
    out = torch.empty(plan.n_out, products.shape[1], dtype=dtype, device=products.device)
    return launch_reduce_rows(
        products,
        plan.dst_ptr,
        out,
        n_pairs=products.shape[0],
        scale=scale,
        pos=plan.dst_pos,
        reduce_max=plan.reduce == "max",
    )


def segment_products_triton(
    a: torch.Tensor, a_index: torch.Tensor, w: torch.Tensor, plan: GMSPlan
) -> torch.Tensor:
    """Kernel 1: ``P[p] = A[a_index[p]] @ W[segment(p)]`` for every plan position.

    Args:
        a: ``[R, K]`` rows, float32, bfloat16 or float16.
        a_index: ``[E]`` the row of ``a`` of each plan position.
        w: ``[S, K, M]``, the dtype of ``a``.
        plan: the plan whose tiles to run.

    Returns:
        ``P`` of shape ``[E, M]`` in the dtype of ``a`` (accumulated in float32).

    Raises:
        ValueError: unsupported operands, or a guarded tile or row index is out of range.
    """
    check_operands(a, w, None, plan.num_pairs)
    check_rows(a_index, plan.num_pairs, a.shape[0], "row index")
    check_tiles(plan, w.shape[0])
    out = torch.zeros(plan.num_pairs, w.shape[2], dtype=a.dtype, device=a.device)
    tiles = (plan.tile_segment, plan.tile_start, plan.tile_end)
    return segment_gemm(a, a_index, w, tiles, out, epilogue=STORE)


def gm_seg_s_triton(
    x: torch.Tensor, w: torch.Tensor, plan: GMSPlan, scale: torch.Tensor | None
) -> torch.Tensor:
    """Run ``(GM)seg-S`` over a plan: gathering segment GEMM, then a CSR reduce (no atomics).

    Args:
        x: ``[N_in, K]`` float32, bfloat16 or float16.
        w: ``[S, K, M]`` same dtype.
        plan: the plan, on ``x``'s device.
        scale: ``[E]`` per plan position (mean weights folded in), or None.

    Returns:
        ``Y`` of shape ``[N_out, M]`` in ``x``'s dtype.

    Raises:
        ValueError: unsupported operands, or a plan array the kernels read is out of range.
    """
    check_operands(x, w, scale, plan.num_pairs)
    check_index(plan, "gather", x.shape[0])
    check_tiles(plan, w.shape[0])
    check_dst_csr(plan)
    products = torch.zeros(plan.num_pairs, w.shape[2], dtype=torch.float32, device=x.device)
    tiles = (plan.tile_segment, plan.tile_start, plan.tile_end)
    segment_gemm(x, plan.gather, w, tiles, products, epilogue=STORE)
    return reduce_by_destination(products, plan, scale, x.dtype)
