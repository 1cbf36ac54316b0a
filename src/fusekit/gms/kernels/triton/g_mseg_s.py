"""``G-Mseg-S`` in Triton: gather, segment GEMM and scatter-reduce as three kernels.

.. code-block:: text

    Xg[p, k] = X[g[p], k]                                     kernel 1 (G-(MS)seg's gather)
    P[p, m]  = sum_k Xg[p, k] * W[s, k, m]    p in segment s    kernel 2 ((GMS)seg's GEMM, STORE)
    Y[i, m] (+= | max=) c[p] * P[p, m]        p in CSR(i)       kernel 3 ((GM)seg-S's reduce)

Dataflow: both intermediates, ``Xg[E, K]`` (``x``'s dtype) and ``P[E, M]`` (float32), go through
memory. Kernel 2 takes its tiles from ``segment_ptr`` alone (chunks of ``TILE_ROWS`` positions of
one segment), not from the plan's destination-blocked tiles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fusekit.gms.kernels.triton.checks import (
    check_dst_csr,
    check_index,
    check_operands,
    check_segment_ptr,
)
from fusekit.gms.kernels.triton.g_ms_seg import gather_rows
from fusekit.gms.kernels.triton.gm_seg_s import reduce_by_destination
from fusekit.gms.kernels.triton.gms_seg import STORE, segment_gemm

if TYPE_CHECKING:
    from fusekit.gms.planning.layout import GMSPlan

#: Most positions one program of the segment GEMM runs.
TILE_ROWS = 64


def segment_tiles(
    segment_ptr: torch.Tensor, rows: int = TILE_ROWS
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split each segment ``[segment_ptr[s], segment_ptr[s+1])`` into tiles of ``rows`` positions.

    Args:
        segment_ptr: ``[S + 1]`` non-decreasing positions (checked by the caller).
        rows: most positions per tile.

    Returns:
        ``(tile_segment, tile_start, tile_end)``, each ``[T]`` int64.
    """
    starts, ends = segment_ptr[:-1], segment_ptr[1:]
    per_segment = (ends - starts + rows - 1) // rows
    n_tiles = int(per_segment.sum())
    segment = torch.repeat_interleave(
        torch.arange(per_segment.shape[0], device=segment_ptr.device),
        per_segment,
        output_size=n_tiles,
    )
    first_tile = torch.cumsum(per_segment, 0) - per_segment
    local = torch.arange(n_tiles, device=segment_ptr.device) - first_tile[segment]
    tile_start = starts[segment] + local * rows
    tile_end = torch.minimum(tile_start + rows, ends[segment])
    return segment, tile_start, tile_end


def g_mseg_s_triton(
    x: torch.Tensor, w: torch.Tensor, plan: GMSPlan, scale: torch.Tensor | None
) -> torch.Tensor:
    """Run ``G-Mseg-S`` over a plan: gather, segment GEMM, CSR reduce (no atomics).

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
    check_segment_ptr(plan, w.shape[0])
    check_dst_csr(plan)
    tiles = plan.derived.segment_tiles
    if tiles is None:
        tiles = plan.derived.segment_tiles = segment_tiles(plan.segment_ptr)
    gathered = gather_rows(x, plan.gather)
    products = torch.zeros(plan.num_pairs, w.shape[2], dtype=torch.float32, device=x.device)
    segment_gemm(gathered, None, w, tiles, products, epilogue=STORE)
    return reduce_by_destination(products, plan, scale, x.dtype)
