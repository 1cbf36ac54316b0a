r"""Plain-PyTorch g-mm-s: the reference of every kernel test and the ATen baseline of benchmarks.

.. math::

    Y[d_e, m] \mathrel{\oplus}= c_e \sum_k X[g_e, k] \, W[s_e, k, m],
    \qquad \text{mean} = \text{sum} / \deg(d), \quad \text{rows without pairs} = 0

``max`` is ``torch.amax`` over each row's pair products: NaN propagates, and tied winners share
the gradient equally (a NaN row's gradient is NaN), the semantics every kernel matches.

:func:`gms_reference` favours obviousness over speed (one ``mm`` per segment on the pairs of that
segment, any pair order) and is differentiable by autograd. :func:`gms_aten` is what a user would
write for speed with ATen alone, given indices sorted by segment once: ``index_select``, then
``torch._grouped_mm`` (or one ``mm`` per segment), then ``index_add_``.
"""

from __future__ import annotations

import torch


def gms_reference(
    x: torch.Tensor,
    w: torch.Tensor,
    gather: torch.Tensor,
    segment: torch.Tensor,
    scatter: torch.Tensor,
    n_out: int,
    scale: torch.Tensor | None = None,
    reduce: str = "sum",
) -> torch.Tensor:
    """The g-mm-s of raw (unsorted) indices, in plain PyTorch.

    Args:
        x: ``[N_in, K]``.
        w: ``[S, K, M]``.
        gather: ``[E]`` rows of ``x``.
        segment: ``[E]`` matrices of ``w``.
        scatter: ``[E]`` output rows.
        n_out: output rows.
        scale: ``[E]`` per-pair factor, or None.
        reduce: ``"sum"``, ``"mean"`` or ``"max"``.

    Returns:
        ``[n_out, M]``.
    """
    products = x.new_zeros(gather.shape[0], w.shape[2])
    for s in torch.unique(segment).tolist():
        pairs = torch.nonzero(segment == s).flatten()
        products = products.index_put((pairs,), x[gather[pairs]] @ w[s])
    if scale is not None:
        products = products * scale[:, None]
    index = scatter[:, None].expand(-1, w.shape[2])
    if reduce == "max":
        # torch.amax per row: NaN propagates, tied winners share the gradient. The start value
        # is NaN, not -inf: scatter_reduce's gradient counts a start value equal to the result
        # among the winners even with include_self=False (a row whose max is -inf would give
        # its pair half the gradient), and NaN equals nothing.
        empty = torch.full((n_out, w.shape[2]), float("nan"), dtype=x.dtype, device=x.device)
        out = empty.scatter_reduce(0, index, products, "amax", include_self=False)
        count = torch.bincount(scatter, minlength=n_out)
        return torch.where((count > 0)[:, None], out, torch.zeros_like(out))
    out = x.new_zeros(n_out, w.shape[2]).index_add(0, scatter, products)
    if reduce == "mean":
        count = torch.bincount(scatter, minlength=n_out).clamp(min=1).to(x.dtype)
        out = out / count[:, None]
    return out


def gms_aten(
    x: torch.Tensor,
    w: torch.Tensor,
    gather: torch.Tensor,
    scatter: torch.Tensor,
    segment_ends: torch.Tensor,
    n_out: int,
    scale: torch.Tensor | None = None,
    grouped: bool = True,
    row_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The ATen composition a user would write (sum or mean), pairs already sorted by segment.

    Args:
        x: ``[N_in, K]``.
        w: ``[S, K, M]``.
        gather: ``[E]`` sorted by segment.
        scatter: ``[E]`` in the same order.
        segment_ends: ``[S]`` int32 cumulative pair counts (``offs`` of ``torch._grouped_mm``).
        n_out: output rows.
        scale: ``[E]`` in the same order, or None.
        grouped: ``torch._grouped_mm`` (needs 16-byte rows, fp32/bf16) instead of one ``mm`` per
            segment.
        row_scale: ``[n_out]`` factor per output row (``1 / deg`` for mean), or None.

    Returns:
        ``[n_out, M]``.
    """
    rows = x.index_select(0, gather)
    if grouped:
        products = torch._grouped_mm(rows, w, offs=segment_ends)
    else:
        products = rows.new_empty(rows.shape[0], w.shape[2])
        start = 0
        for s, end in enumerate(segment_ends.tolist()):
            if end > start:
                torch.mm(rows[start:end], w[s], out=products[start:end])
            start = end
    if scale is not None:
        products.mul_(scale[:, None])
    out = x.new_zeros(n_out, w.shape[2]).index_add_(0, scatter, products)
    return out.mul_(row_scale[:, None]) if row_scale is not None else out
