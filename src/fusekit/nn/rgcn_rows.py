r"""The row reductions RGCN runs outside one g-mm-s, each with its plain-torch reference.

.. code-block:: text

    gather_reduce  out[i]  = sum_{p: dst[p] = i} scale[p] * table[rows[p]]   (featureless layers)
    segment_max    H[u]    = max_{p: key[p] = keys[u]} src[rows[p]]         (aggr max / min)

``segment_max`` is PyG's ``max`` aggregation of the raw ``x_j`` per (target, relation) key, over
the keys that occur (``KeyGroups``); its gradient is split evenly between ties, as for
``torch.scatter_reduce(..., "amax")``, which PyG calls. ``min`` is ``-segment_max(-src)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fusekit.errors import expected
from fusekit.gms.segments import reduce_rows


def _shape(t: Any) -> str:
    return f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


class GatherReduce:
    """The indices of ``out[i] = sum_{p: dst[p] = i} scale[p] * table[rows[p]]``, both ways.

    Attributes:
        rows: ``[E]`` table row of each pair.
        dst: ``[E]`` output row of each pair.
        scale: ``[E]`` factor of each pair, or None.
        n_out: output rows.
        n_table: table rows.
        by_dst: (ptr, positions) CSR of pairs by output row (the forward).
        by_row: (ptr, positions) CSR of pairs by table row (the gradient of the table).
    """

    def __init__(
        self,
        rows: torch.Tensor,
        dst: torch.Tensor,
        scale: torch.Tensor | None,
        n_out: int,
        n_table: int,
    ) -> None:
        e = rows.shape[0] if isinstance(rows, torch.Tensor) and rows.dim() == 1 else -1
        for name, t, bound in (("rows", rows, n_table), ("dst", dst, n_out)):
            if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.shape[0] != e:
                raise ValueError(expected("GatherReduce", name, "[E] like 'rows'", _shape(t)))
            if t.dtype not in (torch.int64, torch.int32):
                raise TypeError(expected("GatherReduce", name, "int64 or int32", t.dtype))
            if e and not 0 <= int(t.min()) <= int(t.max()) < bound:
                raise ValueError(
                    expected(
                        "GatherReduce",
                        name,
                        f"in [0, {bound})",
                        f"values in [{int(t.min())}, {int(t.max())}]",
                    )
                )
        if scale is not None and (not isinstance(scale, torch.Tensor) or scale.shape != (e,)):
            raise ValueError(expected("GatherReduce", "scale", f"[{e}] or None", _shape(scale)))
        self.rows, self.dst, self.scale = rows.long(), dst.long(), scale
        self.n_out, self.n_table = n_out, n_table
        self.by_dst = _csr(self.dst, n_out)
        self.by_row = _csr(self.rows, n_table)


def _csr(key: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.argsort(key, stable=True)
    ptr = torch.zeros(n + 1, dtype=torch.int64, device=key.device)
    ptr[1:] = torch.cumsum(torch.bincount(key, minlength=n), 0)
    return ptr, pos


def gather_reduce(table: torch.Tensor, gr: GatherReduce) -> torch.Tensor:
    """``out[i] = sum_{p: dst[p] = i} scale[p] * table[rows[p]]``, differentiable in ``table``."""
    if gr.n_table != table.shape[0]:
        raise ValueError(expected("gather_reduce", "table", f"{gr.n_table} rows", table.shape[0]))
    if gr.scale is not None and gr.scale.dtype != table.dtype:
        gr.scale = gr.scale.to(table.dtype)
    out: torch.Tensor = _GatherReduce.apply(table, gr)  # type: ignore[no-untyped-call]
    return out


class _GatherReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, table: torch.Tensor, gr: GatherReduce) -> torch.Tensor:
        ctx.gr = gr
        return _reduce(table.contiguous(), gr.rows, gr.scale, gr.by_dst)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Sequence[torch.Tensor | None]:
        gr: GatherReduce = ctx.gr
        return _reduce(grad.contiguous(), gr.dst, gr.scale, gr.by_row), None


def _reduce(
    src: torch.Tensor,
    src_index: torch.Tensor,
    scale: torch.Tensor | None,
    csr: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """``out[i] = sum over the CSR positions p of row i of scale[p] * src[src_index[p]]``."""
    ptr, pos = csr
    return reduce_rows(
        src, ptr, n_pairs=int(src_index.shape[0]), src_index=src_index, scale=scale, pos=pos
    )


def reduce_reference(
    src: torch.Tensor,
    src_index: torch.Tensor,
    scale: torch.Tensor | None,
    ptr: torch.Tensor,
    pos: torch.Tensor,
    n_out: int,
) -> torch.Tensor:
    """The plain-torch reference of :func:`_reduce` (``index_add_``)."""
    rows = torch.repeat_interleave(torch.arange(n_out, device=src.device), ptr[1:] - ptr[:-1])
    values = src[src_index[pos]]
    if scale is not None:
        values = values * scale[pos, None].to(src.dtype)
    out = torch.zeros(n_out, src.shape[1], dtype=src.dtype, device=src.device)
    return out.index_add_(0, rows, values)


class KeyGroups:
    """Pairs grouped by key, over the keys that occur.

    Attributes:
        rows: ``[E]`` source row of each pair.
        keys: ``[U]`` the distinct keys, ascending.
        ptr: ``[U + 1]`` CSR pointer of the groups into ``pos``.
        pos: ``[E]`` pair positions ordered by key (stable).
        owner: ``[E]`` the group of ``pos[q]``, for each ``q``.
        sorted_rows: ``[E]`` ``rows[pos]``.
    """

    def __init__(self, rows: torch.Tensor, key: torch.Tensor) -> None:
        if not (isinstance(rows, torch.Tensor) and isinstance(key, torch.Tensor)) or (
            rows.dim() != 1 or rows.shape != key.shape
        ):
            raise ValueError(expected("KeyGroups", "key", "[E] like 'rows'", _shape(key)))
        self.rows = rows.long()
        self.pos = torch.argsort(key, stable=True)
        self.keys, counts = torch.unique_consecutive(key[self.pos], return_counts=True)
        self.ptr = torch.zeros(self.keys.shape[0] + 1, dtype=torch.int64, device=key.device)
        self.ptr[1:] = torch.cumsum(counts, 0)
        self.owner = torch.repeat_interleave(
            torch.arange(self.keys.shape[0], device=key.device), counts
        )
        self.sorted_rows = self.rows[self.pos]

    @property
    def num_groups(self) -> int:
        """``U``, the number of distinct keys."""
        return int(self.keys.shape[0])


def segment_max(src: torch.Tensor, groups: KeyGroups, *, negate: bool = False) -> torch.Tensor:
    """``H[u] = max_{p in group u} src[rows[p]]`` (``[U, C]``), differentiable in ``src``.

    With ``negate``, ``min`` through the max kernel: ``min_p v_p = -max_p (-v_p)``.
    """
    if negate:
        return -segment_max(-src, groups)
    out: torch.Tensor = _SegmentMax.apply(src, groups)  # type: ignore[no-untyped-call]
    return out


def segment_max_reference(src: torch.Tensor, groups: KeyGroups) -> torch.Tensor:
    """:func:`segment_max` with ``scatter_reduce(..., "amax")`` (PyG's ``scatter``)."""
    at = groups.owner[:, None].expand(-1, src.shape[1])
    out = src.new_zeros(groups.num_groups, src.shape[1])
    return out.scatter_reduce(0, at, src[groups.sorted_rows], "amax", include_self=False)


class _SegmentMax(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, src: torch.Tensor, groups: KeyGroups) -> torch.Tensor:
        out = reduce_rows(
            src.contiguous(),
            groups.ptr,
            n_pairs=int(groups.rows.shape[0]),
            src_index=groups.rows,
            pos=groups.pos,
            reduce_max=True,
        )
        ctx.groups = groups
        ctx.save_for_backward(src, out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Sequence[torch.Tensor | None]:
        """``dsrc[rows[p]] += grad[u] [src[rows[p]] = H[u]] / #ties`` (per column)."""
        groups: KeyGroups = ctx.groups
        src, out = ctx.saved_tensors
        hit = (src[groups.sorted_rows] == out[groups.owner]).to(grad.dtype)
        ties = torch.zeros_like(out, dtype=grad.dtype).index_add_(0, groups.owner, hit)
        share = grad / ties.clamp(min=1.0)
        dsrc = torch.zeros_like(src, dtype=grad.dtype)
        return dsrc.index_add_(0, groups.sorted_rows, hit * share[groups.owner]), None
