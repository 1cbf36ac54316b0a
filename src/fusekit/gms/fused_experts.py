r"""Few-token MoE experts in one numba call: routing sort, gathered GEMMs, SwiGLU and the sum.

When no expert receives more than :data:`DECODE_ROWS` of the ``T k`` (token, expert) pairs
(decode-sized batches), the time is streaming each hit expert's ``3 x hidden x ffn`` weights
once from DRAM, and the torch ops around the two GEMMs of the general path (argsort, bincount,
cumsum, gather, silu, reduce: about a dozen dispatches and allocations) are what separates it
from the bare GEMMs. This path does the whole expert half in one call, with no torch op in
between:

1. a stable counting sort of the pairs ``p = t k + j`` by expert ``e[t, j]``
   (:func:`fusekit.gms.routing.sort_pairs`): ``ptr`` (where each expert's positions start),
   ``token[q]`` (the token at position ``q``), ``pos[p]``;
2. per item (expert ``e``, ffn columns ``[c0, c1)``), over the expert's positions ``q``::

       G = x[token[q]] @ Wgu[e][:, c0:c1]       U = x[token[q]] @ Wgu[e][:, F + c0:F + c1]
       A[q, c0:c1] = silu(G) * U                 (silu(g) = g / (1 + exp(-g)))

3. per item (expert ``e``, hidden columns ``[c0, c1)``): ``Z[q, c0:c1] = A[q] @ Wd[e][:, c0:c1]``;
4. per token: ``y[t] = sum_j pi[t, j] Z[pos[t k + j]]``.

Items are whole experts when dealing them to threads by cost, longest first
(:func:`~fusekit.gms.kernels.cpu.schedule.lpt_schedule`: a popular expert's item costs many small
ones), comes within :data:`BALANCE_SLACK` of an even split; otherwise experts are split into the
fewest column ranges that balance the threads
(:func:`~fusekit.gms.kernels.cpu.schedule.balanced_chunks`). The products are
:func:`~fusekit.gms.kernels.cpu.skinny.rows_times_w` (weight-streaming), gathering ``x`` rows in
place. The reference is the general path
(:func:`fusekit.gms.experts.swiglu_experts` on :class:`fusekit.gms.routing.ExpertSegments`),
which the tests compare with.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch
from numba import prange

from fusekit.errors import expected
from fusekit.gms.kernels.cpu.rows import numpy_of
from fusekit.gms.kernels.cpu.schedule import balanced_chunks, lpt_schedule
from fusekit.gms.kernels.cpu.skinny import (
    SKINNY_ROWS,
    item_cost,
    rows_times_w,
    rows_times_wt,
    segment_block,
    weight_layout,
)
from fusekit.gms.kernels.cpu.tile import FASTMATH
from fusekit.gms.routing import BAD_EXPERT, DONE, check_routing, sort_pairs

#: Most pairs one expert may receive on this path: the general path's segments of this many rows
#: run the same streaming kernel (:data:`~fusekit.gms.kernels.cpu.skinny.SKINNY_ROWS`), and
#: beyond it the BLAS GEMM that the general path gives larger segments outruns any numba loop
#: (``benchmarks/moe.py`` compares the paths by token count).
DECODE_ROWS = SKINNY_ROWS

#: Most a thread's share of whole-expert items may exceed an even split before experts are split
#: into column ranges (a split's shorter rows stream slower, a cost on every item's time).
BALANCE_SLACK = 1.08


@numba.njit(cache=True, fastmath=FASTMATH)
def _swiglu_item(x, rows, w, c0, c1, act, lo, transposed):  # type: ignore[no-untyped-def]
    """``act[lo + r, c0:c1] = silu(x[rows[r]] @ G[:, c0:c1]) * (x[rows[r]] @ U[:, c0:c1])``.

    ``w`` is ``[hidden, 2 ffn]``, or with ``transposed`` its transpose ``[2 ffn, hidden]`` (a
    Hugging Face parameter as stored), read as dot products along ``hidden``
    (:func:`~fusekit.gms.kernels.cpu.skinny.rows_times_wt`).
    """
    ffn = act.shape[1]
    n = rows.shape[0]
    if c1 - c0 == ffn and not transposed:  # one contiguous run of 2 ffn columns streams best
        h = np.zeros((n, 2 * ffn), dtype=act.dtype)
        rows_times_w(x, rows, w, 0, 2 * ffn, h)
        g, u = h[:, :ffn], h[:, ffn:]
    else:
        g = np.zeros((n, c1 - c0), dtype=act.dtype)
        u = np.zeros((n, c1 - c0), dtype=act.dtype)
        if transposed:
            rows_times_wt(x, rows, w, c0, c1, g)
            rows_times_wt(x, rows, w, ffn + c0, ffn + c1, u)
        else:
            rows_times_w(x, rows, w, c0, c1, g)
            rows_times_w(x, rows, w, ffn + c0, ffn + c1, u)
    for r in range(n):
        for m in range(c1 - c0):
            act[lo + r, c0 + m] = g[r, m] / (1.0 + math.exp(-g[r, m])) * u[r, m]


@numba.njit(cache=True)
def _item(item, chunks, hit, ptr, width):  # type: ignore[no-untyped-def]
    """The expert, positions ``[lo, hi)`` and columns ``[c0, c1)`` of one item.

    Item ``item`` is hit expert ``item // chunks``, column range ``item % chunks`` of ``width``.
    """
    e = hit[item // chunks]
    c = item % chunks
    return e, ptr[e], ptr[e + 1], c * width // chunks, (c + 1) * width // chunks


@numba.njit(cache=True)
def _lpt_items(hit, ptr, weights, chunks, threads):  # type: ignore[no-untyped-def]
    """LPT deal of the items ``(hit expert, column range)``: ``(order, tptr, load)``.

    An item's cost is :func:`item_cost` of its rows and ``weights / chunks`` elements.
    """
    costs = np.empty(hit.shape[0] * chunks)
    for item in range(costs.shape[0]):
        e = hit[item // chunks]
        costs[item] = item_cost(ptr[e + 1] - ptr[e], weights // chunks)
    return lpt_schedule(costs, threads)


@numba.njit(cache=True)
def _deal_items(hit, ptr, weights, threads):  # type: ignore[no-untyped-def]
    """The column split and the deal of items to threads: ``(chunks, order, tptr)``.

    Whole experts when their LPT deal is within :data:`BALANCE_SLACK` of an even split (full-width
    rows stream faster than split ones); otherwise the
    :func:`~fusekit.gms.kernels.cpu.schedule.balanced_chunks` split, which gives every thread the
    same number of (expert, range) items (e.g. one or three experts on two threads).
    """
    order, tptr, load = _lpt_items(hit, ptr, weights, 1, threads)
    if load.max() <= BALANCE_SLACK * load.mean():
        return 1, order, tptr
    chunks = balanced_chunks(hit.shape[0], threads)
    order, tptr, _ = _lpt_items(hit, ptr, weights, chunks, threads)
    return chunks, order, tptr


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def _decode_kernel(x, experts, scale, w_gate_up, w_down, max_rows, threads, out, transposed):  # type: ignore[no-untyped-def]
    status, ptr, token, pos = sort_pairs(experts, w_gate_up.shape[0], max_rows)
    if status != DONE:
        return status
    tokens, k = experts.shape
    # [E, hidden, 2 ffn] and [E, ffn, hidden]; transposed: [E, 2 ffn, hidden], [E, hidden, ffn]
    ffn = w_down.shape[2] if transposed else w_down.shape[1]
    hidden = w_down.shape[1] if transposed else w_down.shape[2]
    hit = np.nonzero(ptr[1:] > ptr[:-1])[0]
    act = np.empty((tokens * k, ffn), dtype=out.dtype)
    z = np.empty((tokens * k, hidden), dtype=out.dtype)

    chunks, order, tptr = _deal_items(hit, ptr, 3 * ffn * hidden, threads)

    for th in prange(threads):
        for q in range(tptr[th], tptr[th + 1]):
            e, lo, hi, c0, c1 = _item(order[q], chunks, hit, ptr, ffn)
            _swiglu_item(x, token[lo:hi], w_gate_up[e], c0, c1, act, lo, transposed)

    for th in prange(threads):
        for q in range(tptr[th], tptr[th + 1]):
            e, lo, hi, c0, c1 = _item(order[q], chunks, hit, ptr, hidden)
            segment_block(act, w_down[e], lo, hi, c0, c1, z, transposed)

    for t in prange(tokens):
        q = pos[t * k]
        c = scale[t * k]
        for m in range(hidden):
            out[t, m] = c * z[q, m]
        for j in range(1, k):
            q = pos[t * k + j]
            c = scale[t * k + j]
            for m in range(hidden):
                out[t, m] += c * z[q, m]
    return DONE


def decode_applies(x: torch.Tensor, experts: torch.Tensor, num_experts: int) -> bool:
    """Whether :func:`experts_decode` may run on these inputs.

    CPU float32/float64 and few enough pairs that every expert could hold them
    (``T k <= E x DECODE_ROWS``; the sort checks the actual counts). The caller checks autograd.
    """
    return (
        x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and experts.dim() == 2
        and experts.numel() <= num_experts * DECODE_ROWS
    )


def experts_decode(
    x: torch.Tensor,
    experts: torch.Tensor,
    weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
) -> torch.Tensor | None:
    """``y[t] = sum_j weights[t, j] SwiGLU_{experts[t, j]}(x[t])`` in one call (module docstring).

    Args:
        x: ``[T, hidden]`` CPU float32/float64.
        experts: ``[T, k]`` expert ids.
        weights: ``[T, k]`` routing weights.
        w_gate_up: ``[E, hidden, 2 ffn]`` (gate columns, then up).
        w_down: ``[E, ffn, hidden]``. Both contiguous, or both ``transpose(1, 2)`` views of
            contiguous tensors (Hugging Face's ``[E, out, in]`` parameters), read in place;
            other strides are copied for the call.

    Returns:
        ``[T, hidden]``, or ``None`` when some expert has more than ``DECODE_ROWS`` pairs (the
        caller's general path is faster there).

    Raises:
        TypeError, ValueError: operands that disagree (:func:`check_routing`); an expert id
            outside ``[0, E)``.
    """
    check_routing(x, experts, weights, w_gate_up, w_down)
    x = x.contiguous()
    out = x.new_empty(x.shape[0], w_down.shape[2])
    transposed = weight_layout(w_gate_up) == weight_layout(w_down) == "transposed"
    if transposed:  # HF's parameters as stored: dot products along hidden / ffn
        w_gate_up, w_down = w_gate_up.transpose(1, 2), w_down.transpose(1, 2)
    status = _decode_kernel(
        numpy_of(x),
        numpy_of(experts.contiguous().long()),
        numpy_of(weights.reshape(-1).to(x.dtype).contiguous()),
        numpy_of(w_gate_up.detach().contiguous()),
        numpy_of(w_down.detach().contiguous()),
        DECODE_ROWS,
        numba.get_num_threads(),
        numpy_of(out),
        transposed,
    )
    if status == BAD_EXPERT:
        num_experts = w_gate_up.shape[0]
        raise ValueError(
            expected(
                "MoE",
                "experts",
                f"in [0, {num_experts})",
                f"[{int(experts.min())}, {int(experts.max())}]",
            )
        )
    return out if status == DONE else None
