r"""The expert half of an MoE block as ``torch.library`` custom ops, for any weight layout.

A routing of ``T`` tokens to ``k`` experts each gives ``P = T k`` pairs ``p = t k + j``.
Sorted by expert (:class:`fusekit.gms.routing.ExpertSegments`), the expert half is
``G-Mseg-S`` over expert segments, split into ops that a model's own activation, biases and
norms can sit between:

.. code-block:: text

    expert_route    (token[q], segment_ptr[e], token_pos[p], expert[q])    one stable sort
    expert_mm       H[q] = x[token[q]] @ W[expert[q]]   (or rows[q] @ W[...] without token)
    expert_combine  y[t] = sum_j c[t, j] * Z[token_pos[t k + j]]      in promote(Z, c), as Z

``W`` is ``[E, K, N]`` with any strides: a Hugging Face ``[E, N, K]`` parameter passes as its
``transpose(1, 2)`` view and is read in place (no copy per call). ``expert_mm`` and
``expert_combine`` have their backward registered (each itself an op), so autograd,
``torch.compile(fullgraph=True)`` and ``torch.export`` see only these ops and plain torch:

.. code-block:: text

    expert_mm:       dW[e] = rows_e^T dH_e         drows = dH @ W[e]^T
                     dx = scatter_add(token, drows)
    expert_combine:  dZ[token_pos[p]] = c[p] dy[t]  dc[p] = <dy[t], Z[token_pos[p]]>

:func:`swiglu_experts_infer` is the inference fast path for the common variant (SwiGLU
``silu(G) * U`` on ``[gate | up]`` columns, no biases): the one-call numba decode kernel
(:func:`fusekit.gms.fused_experts.experts_decode`) for few pairs per expert, else the scratch
buffered expert segments (:func:`fusekit.gms.experts.expert_segments_forward`). It has no
backward (callers take it only when autograd is off). The decode kernel reads a Hugging Face
``[E, N, K]`` parameter in place, as dot products along ``K``
(:func:`~fusekit.gms.kernels.cpu.skinny.rows_times_wt`): no copy of the experts' weights is
made or kept.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fusekit.errors import expected
from fusekit.gms.experts import expert_segments_forward
from fusekit.gms.fused_experts import decode_applies, experts_decode
from fusekit.gms.routing import ExpertSegments, check_routing
from fusekit.gms.segments import (
    gather_rows,
    reduce_rows,
    runs_on_cpu_kernels,
    segment_mm,
    segment_outer_mm,
)

# ---------------------------------------------------------------- routing


@torch.library.custom_op("fusekit::expert_route", mutates_args=())
def _expert_route_op(
    experts: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    seg = ExpertSegments.of(experts, num_experts)
    return seg.token, seg.segment_ptr, seg.token_pos, experts.reshape(-1).long()[seg.order]


@_expert_route_op.register_fake
def _expert_route_fake(experts, num_experts):  # type: ignore[no-untyped-def]
    pairs = experts.numel()
    token, token_pos, expert = (experts.new_empty(pairs, dtype=torch.int64) for _ in range(3))
    return token, experts.new_empty(num_experts + 1, dtype=torch.int64), token_pos, expert


def expert_route(
    experts: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort the pairs of a ``[T, k]`` routing by expert (``torch.ops.fusekit.expert_route``).

    Args:
        experts: ``[T, k]`` int32/int64 expert ids in ``[0, num_experts)``.
        num_experts: ``E``.

    Returns:
        ``(token, segment_ptr, token_pos, expert)``: the token ``[P]`` and expert ``[P]`` of each
        sorted position, where each expert's positions start ``[E + 1]``, and the sorted
        position of each pair ``[P]`` (all int64).

    Raises:
        TypeError, ValueError: ids that are not ``[T, k]`` integers in range.
    """
    token, segment_ptr, token_pos, expert = torch.ops.fusekit.expert_route(experts, num_experts)
    return token, segment_ptr, token_pos, expert


# ---------------------------------------------------------------- expert GEMMs


def expert_mm_reference(
    x: torch.Tensor, w: torch.Tensor, segment_ptr: torch.Tensor, token: torch.Tensor | None
) -> torch.Tensor:
    """:func:`expert_mm` in plain torch: one ``mm`` per segment."""
    rows = x if token is None else x[token]
    out = rows.new_zeros(rows.shape[0], w.shape[2])
    bounds = segment_ptr.tolist()
    for e in range(len(bounds) - 1):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            out[lo:hi] = rows[lo:hi] @ w[e]
    return out


def _rows_of(x: torch.Tensor, token: torch.Tensor | None) -> torch.Tensor:
    if token is None:
        return x.contiguous()
    return gather_rows(x.contiguous(), token)


@torch.library.custom_op("fusekit::expert_mm", mutates_args=())
def _expert_mm_op(
    x: torch.Tensor, w: torch.Tensor, segment_ptr: torch.Tensor, token: torch.Tensor | None
) -> torch.Tensor:
    return segment_mm(_rows_of(x, token), w, segment_ptr)


@_expert_mm_op.register_fake
def _expert_mm_fake(x, w, segment_ptr, token):  # type: ignore[no-untyped-def]
    rows = x.shape[0] if token is None else token.shape[0]
    return x.new_empty(rows, w.shape[2])


@torch.library.custom_op("fusekit::expert_mm_backward", mutates_args=())
def _expert_mm_backward_op(
    grad: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor,
    segment_ptr: torch.Tensor,
    token: torch.Tensor | None,
    needs: Sequence[bool],
) -> tuple[torch.Tensor, torch.Tensor]:
    grad = grad.contiguous()
    dx, dw = x.new_empty(0), w.new_empty(0)
    if needs[0]:
        # W transposed as a view: a copy would cost more than the GEMM
        drows = segment_mm(grad, w.transpose(1, 2), segment_ptr)
        dx = drows if token is None else torch.zeros_like(x).index_add_(0, token, drows)
    if needs[1]:
        dw = segment_outer_mm(_rows_of(x, token), grad, segment_ptr, w.shape[0])
    return dx, dw


@_expert_mm_backward_op.register_fake
def _expert_mm_backward_fake(grad, x, w, segment_ptr, token, needs):  # type: ignore[no-untyped-def]
    return (
        x.new_empty(x.shape) if needs[0] else x.new_empty(0),
        w.new_empty(w.shape) if needs[1] else w.new_empty(0),
    )


def _expert_mm_setup(ctx, inputs, output):  # type: ignore[no-untyped-def]
    x, w, segment_ptr, token = inputs
    ctx.save_for_backward(x, w, segment_ptr, token)


def _expert_mm_backward(ctx, grad):  # type: ignore[no-untyped-def]
    x, w, segment_ptr, token = ctx.saved_tensors
    needs = [bool(n) for n in ctx.needs_input_grad[:2]]
    dx, dw = torch.ops.fusekit.expert_mm_backward(grad, x, w, segment_ptr, token, needs)
    return (dx if needs[0] else None, dw if needs[1] else None, None, None)


_expert_mm_op.register_autograd(_expert_mm_backward, setup_context=_expert_mm_setup)


def expert_mm(
    x: torch.Tensor,
    w: torch.Tensor,
    segment_ptr: torch.Tensor,
    token: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""``H[q] = x[token[q]] @ w[e]`` for the positions ``q`` of each expert ``e`` (an op).

    .. math:: H_q = x_{\mathrm{token}_q} W_{e(q)}, \qquad
        e(q) = e \iff \mathrm{segment\_ptr}_e \le q < \mathrm{segment\_ptr}_{e+1}

    Args:
        x: ``[T, K]`` rows (or ``[P, K]`` already sorted by expert when ``token`` is None).
        w: ``[E, K, N]``, any strides (a ``[E, N, K]`` parameter as ``transpose(1, 2)``).
        segment_ptr: ``[E + 1]`` where each expert's positions start.
        token: ``[P]`` row of ``x`` at each position; None: ``x`` itself.

    Returns:
        ``[P, N]``, differentiable in ``x`` and ``w`` (``torch.ops.fusekit.expert_mm``).

    Raises:
        TypeError, ValueError: operands of different dtypes or disagreeing shapes.
    """
    if x.dtype != w.dtype:
        raise TypeError(expected("expert_mm", "x", f"{w.dtype} like 'w'", x.dtype))
    out: torch.Tensor = torch.ops.fusekit.expert_mm(x, w, segment_ptr, token)
    return out


# ---------------------------------------------------------------- combine


def expert_combine_reference(
    z: torch.Tensor, weights: torch.Tensor, token_pos: torch.Tensor
) -> torch.Tensor:
    """:func:`expert_combine` in plain torch (HF's ``(Z * c).view(T, k, -1).sum(1)``)."""
    tokens, k = weights.shape
    compute = torch.promote_types(z.dtype, weights.dtype)
    picked = z[token_pos].to(compute) * weights.reshape(-1, 1).to(compute)
    return picked.view(tokens, k, -1).sum(1).to(z.dtype)


@torch.library.custom_op("fusekit::expert_combine", mutates_args=())
def _expert_combine_op(
    z: torch.Tensor, weights: torch.Tensor, token_pos: torch.Tensor
) -> torch.Tensor:
    tokens, k = weights.shape
    if runs_on_cpu_kernels(z) and weights.dtype == z.dtype:
        ptr = torch.arange(0, tokens * k + 1, k)
        scale = weights.reshape(-1).contiguous()
        return reduce_rows(
            z.contiguous(), ptr, n_pairs=tokens * k, src_index=token_pos, scale=scale
        )
    return expert_combine_reference(z, weights, token_pos)


@_expert_combine_op.register_fake
def _expert_combine_fake(z, weights, token_pos):  # type: ignore[no-untyped-def]
    return z.new_empty(weights.shape[0], z.shape[1])


@torch.library.custom_op("fusekit::expert_combine_backward", mutates_args=())
def _expert_combine_backward_op(
    grad: torch.Tensor,
    z: torch.Tensor,
    weights: torch.Tensor,
    token_pos: torch.Tensor,
    needs: Sequence[bool],
) -> tuple[torch.Tensor, torch.Tensor]:
    tokens, k = weights.shape
    compute = torch.promote_types(z.dtype, weights.dtype)
    dy = grad.to(compute).repeat_interleave(k, dim=0)  # [P, hidden]: dy[t] for pair t k + j
    dz, dw = z.new_empty(0), weights.new_empty(0)
    if needs[0]:
        dz = torch.empty_like(z, memory_format=torch.contiguous_format)
        dz[token_pos] = (dy * weights.reshape(-1, 1).to(compute)).to(z.dtype)
    if needs[1]:
        dw = (dy * z[token_pos].to(compute)).sum(1).view(tokens, k).to(weights.dtype)
    return dz, dw


@_expert_combine_backward_op.register_fake
def _expert_combine_backward_fake(grad, z, weights, token_pos, needs):  # type: ignore[no-untyped-def]
    return (
        z.new_empty(z.shape) if needs[0] else z.new_empty(0),
        weights.new_empty(weights.shape) if needs[1] else weights.new_empty(0),
    )


def _expert_combine_setup(ctx, inputs, output):  # type: ignore[no-untyped-def]
    ctx.save_for_backward(*inputs)


def _expert_combine_backward(ctx, grad):  # type: ignore[no-untyped-def]
    z, weights, token_pos = ctx.saved_tensors
    needs = [bool(n) for n in ctx.needs_input_grad[:2]]
    dz, dw = torch.ops.fusekit.expert_combine_backward(grad, z, weights, token_pos, needs)
    return (dz if needs[0] else None, dw if needs[1] else None, None)


_expert_combine_op.register_autograd(_expert_combine_backward, setup_context=_expert_combine_setup)


def expert_combine(z: torch.Tensor, weights: torch.Tensor, token_pos: torch.Tensor) -> torch.Tensor:
    """``y[t] = sum_j weights[t, j] * z[token_pos[t k + j]]`` (an op).

    ``torch.ops.fusekit.expert_combine``: the products and the sum are in
    ``promote(z, weights)`` (float32 routing weights on half rows stay float32, as Hugging
    Face's ``grouped_mm`` does), the result in ``z``'s dtype.

    Args:
        z: ``[P, hidden]`` expert outputs sorted by expert.
        weights: ``[T, k]`` routing weights (``P = T k``).
        token_pos: ``[P]`` sorted position of each pair (from :func:`expert_route`).

    Returns:
        ``[T, hidden]``, differentiable in ``z`` and ``weights``.

    Raises:
        ValueError: ``weights`` that is not ``[T, k]`` with ``T k`` rows of ``z``.
    """
    if weights.dim() != 2 or weights.numel() != z.shape[0]:
        raise ValueError(
            expected("expert_combine", "weights", f"[T, k] with T k = {z.shape[0]}", weights.shape)
        )
    out: torch.Tensor = torch.ops.fusekit.expert_combine(z, weights, token_pos)
    return out


# ---------------------------------------------------------------- SwiGLU inference


def swiglu_infer_applies(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> bool:
    """Whether :func:`swiglu_experts_infer` takes these operands (CPU float32/64, one dtype)."""
    return runs_on_cpu_kernels(x) and x.dtype == w_gate_up.dtype == w_down.dtype


@torch.library.custom_op("fusekit::swiglu_experts_infer", mutates_args=())
def _swiglu_experts_infer_op(
    x: torch.Tensor,
    experts: torch.Tensor,
    weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
) -> torch.Tensor:
    check_routing(x, experts, weights, w_gate_up, w_down, where="swiglu_experts_infer")
    x = x.contiguous()
    num_experts = w_gate_up.shape[0]
    if decode_applies(x, experts, num_experts):
        y = experts_decode(x, experts, weights, w_gate_up, w_down)
        if y is not None:
            return y
    seg = ExpertSegments.of(experts, num_experts)
    scale = weights.reshape(-1).to(x.dtype)
    return expert_segments_forward(x, w_gate_up, w_down, scale, seg)[0]


@_swiglu_experts_infer_op.register_fake
def _swiglu_experts_infer_fake(x, experts, weights, w_gate_up, w_down):  # type: ignore[no-untyped-def]
    return x.new_empty(x.shape[0], w_down.shape[2])


def _swiglu_experts_infer_backward(ctx, grad):  # type: ignore[no-untyped-def]
    raise RuntimeError(
        "fusekit::swiglu_experts_infer has no backward: it is the inference path; with autograd "
        "on, run expert_route, expert_mm and expert_combine (fusekit.gms.experts_ops)"
    )


def _swiglu_experts_infer_setup(ctx, inputs, output):  # type: ignore[no-untyped-def]
    return None


_swiglu_experts_infer_op.register_autograd(
    _swiglu_experts_infer_backward, setup_context=_swiglu_experts_infer_setup
)


def swiglu_experts_infer(
    x: torch.Tensor,
    experts: torch.Tensor,
    weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
) -> torch.Tensor:
    r"""``y[t] = sum_j weights[t, j] SwiGLU_{experts[t, j]}(x[t])``, inference only (an op).

    .. math:: \mathrm{SwiGLU}_e(x) = \big(\mathrm{silu}(x G_e) \odot (x U_e)\big) D_e,
        \qquad W^{gu}_e = [G_e \mid U_e]

    Args:
        x: ``[T, hidden]`` CPU float32/float64 (:func:`swiglu_infer_applies`).
        experts: ``[T, k]`` expert ids.
        weights: ``[T, k]`` routing weights.
        w_gate_up: ``[E, hidden, 2 ffn]`` (gate columns, then up), any strides.
        w_down: ``[E, ffn, hidden]``, any strides.

    Returns:
        ``[T, hidden]`` (no backward: the autograd path is :func:`expert_mm`).

    Raises:
        TypeError, ValueError: operands that disagree (:func:`fusekit.gms.check_routing`).
    """
    out: torch.Tensor = torch.ops.fusekit.swiglu_experts_infer(
        x, experts, weights, w_gate_up, w_down
    )
    return out
