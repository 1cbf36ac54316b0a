r"""Routing of tokens to experts as segments: the (token, expert) pairs sorted by expert.

A top-k routing gives ``T k`` pairs ``p = t k + j`` (token ``t``, its ``j``-th expert
``e[t, j]``). Sorted stably by expert, each expert's pairs are one segment of a g-mm-s problem:

.. code-block:: text

    order[q]       the pair at sorted position q (tokens ascending within an expert)
    segment_ptr[e] where expert e's positions start                     [E + 1]
    token[q]       = order[q] // k                                      [T k]
    token_pos[p]   the sorted position of pair p (the inverse of order)  [T k]

:class:`ExpertSegments` sorts in torch (any device, one argsort); :func:`sort_pairs` is the
counting sort in numba that the fused decode kernel (:mod:`fusekit.gms.fused_experts`) runs
inside its one call. :func:`check_routing` checks the operands of the expert half before any
kernel reads them.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from fusekit.errors import expected

#: :func:`sort_pairs` return codes.
DONE, TOO_MANY_ROWS, BAD_EXPERT = 1, 0, -1


class ExpertSegments:
    """The routed pairs ``p = t k + j`` sorted by expert: all the planning a call needs.

    Attributes:
        order: ``[P]`` pair at each sorted position (stable: tokens ascending within an expert).
        token: ``[P]`` token of each sorted position.
        segment_ptr: ``[E + 1]`` where each expert's positions start.
        token_ptr: ``[T + 1]`` CSR of positions by token (``k`` each) ...
        token_pos: ``[P]`` ... the sorted position of pair ``t k + j`` (the inverse of ``order``).
        num_experts: ``E``.
    """

    def __init__(
        self,
        order: torch.Tensor,
        token: torch.Tensor,
        segment_ptr: torch.Tensor,
        token_ptr: torch.Tensor,
        token_pos: torch.Tensor,
        num_experts: int,
    ) -> None:
        self.order, self.token, self.segment_ptr = order, token, segment_ptr
        self.token_ptr, self.token_pos, self.num_experts = token_ptr, token_pos, num_experts

    @classmethod
    def of(cls, experts: torch.Tensor, num_experts: int) -> ExpertSegments:
        """Sort the pairs of a ``[T, k]`` routing by expert."""
        if experts.dtype not in (torch.int64, torch.int32) or experts.dim() != 2:
            raise TypeError(expected("MoE", "experts", "[T, k] int64", f"{experts.dtype}"))
        tokens, k = experts.shape
        flat = experts.reshape(-1).long()
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= num_experts):
            raise ValueError(
                expected(
                    "MoE", "experts", f"in [0, {num_experts})", f"[{flat.min()}, {flat.max()}]"
                )
            )
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=num_experts)
        segment_ptr = torch.zeros(num_experts + 1, dtype=torch.int64, device=flat.device)
        segment_ptr[1:] = torch.cumsum(counts, 0)
        token_pos = torch.empty_like(order)
        token_pos[order] = torch.arange(order.numel(), device=flat.device)
        token_ptr = torch.arange(0, tokens * k + 1, k, device=flat.device)
        return cls(order, order // k, segment_ptr, token_ptr, token_pos, num_experts)


@numba.njit(cache=True)
def sort_pairs(experts, num_experts, max_rows):  # type: ignore[no-untyped-def]
    """Stable counting sort of the ``[T, k]`` pairs ``p = t k + j`` by expert (numba).

    Returns ``(status, ptr, token, pos)``: a return code (:data:`DONE`, or
    :data:`TOO_MANY_ROWS` when an expert has more than ``max_rows`` pairs, :data:`BAD_EXPERT`
    for an id outside ``[0, num_experts)``), where each expert's positions start ``[E + 1]``,
    the token at each position ``[T k]`` and the position of each pair ``[T k]``.
    """
    tokens, k = experts.shape
    pairs = tokens * k
    ptr = np.zeros(num_experts + 1, dtype=np.int64)
    token = np.empty(pairs, dtype=np.int64)
    pos = np.empty(pairs, dtype=np.int64)
    for p in range(pairs):
        e = experts[p // k, p % k]
        if e < 0 or e >= num_experts:
            return BAD_EXPERT, ptr, token, pos
        ptr[e + 1] += 1
    for e in range(num_experts):
        if ptr[e + 1] > max_rows:
            return TOO_MANY_ROWS, ptr, token, pos
        ptr[e + 1] += ptr[e]
    fill = ptr[:-1].copy()
    for p in range(pairs):
        e = experts[p // k, p % k]
        q = fill[e]
        fill[e] = q + 1
        pos[p] = q
        token[q] = p // k
    return DONE, ptr, token, pos


def _describe(t: object) -> str:
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"{str(t.dtype).split('.')[-1]} {list(t.shape)} on {t.device}"


def check_routing(
    x: torch.Tensor,
    experts: torch.Tensor,
    weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    where: str = "MoE",
) -> None:
    """Raise unless the expert half's operands agree, before any kernel reads them.

    O(1) (shapes, dtypes, devices); the expert ids' range is checked where they are read (the
    counting sort :func:`sort_pairs`, :meth:`ExpertSegments.of`, the gms problem).

    Args:
        x: ``[T, hidden]`` floating point.
        experts: ``[T, k]`` int32/int64 expert ids, ``k >= 1`` (one row per row of ``x``).
        weights: ``[T, k]`` floating-point routing weights.
        w_gate_up: ``[E, hidden, 2 ffn]``, ``x``'s dtype.
        w_down: ``[E, ffn, hidden]``, ``x``'s dtype.
        where: the caller named in errors.

    Raises:
        TypeError: a non-tensor, float (or bool) expert ids, integer weights, or a dtype that
            is not the expert weights'.
        ValueError: disagreeing shapes or devices.
    """
    named: tuple[tuple[str, torch.Tensor], ...] = (
        ("x", x),
        ("experts", experts),
        ("weights", weights),
        ("w_gate_up", w_gate_up),
        ("w_down", w_down),
    )
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(expected(where, name, "a torch.Tensor", _describe(t)))
    if not x.is_floating_point() or x.dim() != 2:
        raise TypeError(expected(where, "x", "[T, hidden] floating point", _describe(x)))
    tokens, hidden = x.shape
    if experts.dtype not in (torch.int32, torch.int64):
        raise TypeError(expected(where, "experts", "int32 or int64 expert ids", _describe(experts)))
    if experts.dim() != 2 or experts.shape[0] != tokens or experts.shape[1] < 1:
        raise ValueError(
            expected(
                where, "experts", f"[{tokens}, k >= 1] (a row per token of 'x')", _describe(experts)
            )
        )
    if not weights.is_floating_point():
        raise TypeError(
            expected(where, "weights", "floating-point routing weights", _describe(weights))
        )
    if weights.shape != experts.shape:
        raise ValueError(
            expected(where, "weights", f"{list(experts.shape)} like 'experts'", _describe(weights))
        )
    if w_gate_up.dim() != 3 or w_gate_up.shape[1] != hidden or w_gate_up.shape[2] % 2:
        raise ValueError(
            expected(where, "w_gate_up", f"[E, {hidden}, 2 ffn]", _describe(w_gate_up))
        )
    num_experts, ffn = w_gate_up.shape[0], w_gate_up.shape[2] // 2
    if tuple(w_down.shape) != (num_experts, ffn, hidden):
        raise ValueError(
            expected(where, "w_down", f"[{num_experts}, {ffn}, {hidden}]", _describe(w_down))
        )
    for name, t in named[1:]:
        if t.device != x.device:
            raise ValueError(expected(where, name, f"on {x.device} like 'x'", t.device))
    for name, t in named[3:]:
        if t.dtype != x.dtype:
            raise TypeError(expected(where, "x", f"{t.dtype} like '{name}'", x.dtype))
