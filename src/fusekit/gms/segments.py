r"""The segment operations layers compose: gather rows, reduce rows, GEMMs per segment.

.. code-block:: text

    gather_rows       out[p] = x[index[p]]
    reduce_rows       out[i] (+= | max=) scale[p] * src[src_index[p]]    p = pos[q], q in CSR(i)
    segment_mm        P[p] = rows[p] @ W[s]                             p in segment s
    segment_outer_mm  dW[s] = rows_a[P_s]^T @ rows_b[P_s]               the weight gradient

These are the ``G``, ``S`` and ``M`` steps of ``G-Mseg-S`` on their own, for layers whose
indices change every call (MoE routing) or that run one step alone (RGCN's gather-reduce), so
that no plan is worth building. Each picks its kernel from the operands: the numba row kernels
for CPU float32/float64 tensors (:func:`runs_on_cpu_kernels`), plain torch elsewhere; the
segment GEMMs are one vendor GEMM per segment on every device (the skinny numba GEMM for
segments of a few rows on the CPU).
"""

from __future__ import annotations

import torch

from fusekit.gms.kernels.cpu.g_mseg_s import segment_mm as segment_mm
from fusekit.gms.kernels.cpu.g_mseg_s import segment_outer_mm as segment_outer_mm
from fusekit.gms.kernels.cpu.rows import gather_rows_cpu, reduce_rows_cpu


def runs_on_cpu_kernels(t: torch.Tensor) -> bool:
    """Whether the numba row kernels take ``t``: a CPU float32/float64 tensor."""
    return t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64)


def gather_rows(
    x: torch.Tensor, index: torch.Tensor, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``out[p] = x[index[p]]``.

    Args:
        x: ``[N, K]`` (contiguous for the CPU kernels).
        index: ``[E]`` int64 rows of ``x``.
        out: ``[E, K]`` tensor of ``x``'s dtype to write into; new if None.

    Returns:
        ``out``, ``[E, K]``.

    Raises:
        ValueError: an index outside ``[0, N)``, or an ``out`` of the wrong layout.
    """
    if runs_on_cpu_kernels(x):
        return gather_rows_cpu(x, index, out=out)
    if out is None:
        return x.index_select(0, index)
    return torch.index_select(x, 0, index, out=out)


def reduce_rows(
    src: torch.Tensor,
    ptr: torch.Tensor,
    *,
    n_pairs: int,
    src_index: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    pos: torch.Tensor | None = None,
    reduce_max: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out[i] (+= | max=) scale[p] * src[src_index[p]]`` over the positions of row ``i``.

    Row ``i``'s positions are ``p = pos[q]`` for ``q`` in ``[ptr[i], ptr[i + 1])``.

    Args:
        src: ``[R, M]`` rows to reduce (contiguous for the CPU kernels).
        ptr: ``[N_out + 1]`` CSR pointer into ``pos`` (or into positions, if ``pos`` is None).
        n_pairs: number of positions (the length of ``src_index`` and ``scale``).
        src_index: ``[n_pairs]`` the ``src`` row of each position; identity if None.
        scale: ``[n_pairs]`` factor of each position; 1 if None.
        pos: ``[Q]`` positions listed by output row; identity if None.
        reduce_max: ``max`` instead of ``sum``.
        out: accumulate into this ``[N_out, M]`` tensor; if None, a new tensor holds the
            reduction alone (rows without entries zero).

    Returns:
        ``out``.

    Raises:
        ValueError: a pointer, position or row index out of range (CPU kernels).
    """
    if runs_on_cpu_kernels(src):
        return reduce_rows_cpu(
            src,
            ptr,
            n_pairs=n_pairs,
            src_index=src_index,
            scale=scale,
            pos=pos,
            reduce_max=reduce_max,
            out=out,
        )
    return reduce_rows_reference(
        src, ptr, src_index=src_index, scale=scale, pos=pos, reduce_max=reduce_max, out=out
    )


def reduce_rows_reference(
    src: torch.Tensor,
    ptr: torch.Tensor,
    *,
    src_index: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    pos: torch.Tensor | None = None,
    reduce_max: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`reduce_rows` in plain torch (any device): ``index_add_`` or ``scatter_reduce_``."""
    n_out = max(ptr.shape[0] - 1, 0)
    ptr = ptr.long()
    rows = torch.repeat_interleave(torch.arange(n_out, device=src.device), ptr[1:] - ptr[:-1])
    q = torch.arange(int(ptr[0]), int(ptr[-1]), device=src.device) if n_out else rows
    p = pos[q].long() if pos is not None else q
    values = src[src_index[p].long() if src_index is not None else p]
    if scale is not None:
        values = values * scale[p, None].to(src.dtype)
    if out is None:
        out, include_self = src.new_zeros(n_out, src.shape[1]), False
    else:
        include_self = True
    if not reduce_max:
        return out.index_add_(0, rows, values)
    at = rows[:, None].expand(-1, src.shape[1])
    return out.scatter_reduce_(0, at, values, "amax", include_self=include_self)


__all__ = [
    "gather_rows",
    "reduce_rows",
    "reduce_rows_reference",
    "runs_on_cpu_kernels",
    "segment_mm",
    "segment_outer_mm",
]
