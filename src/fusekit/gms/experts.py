r"""SwiGLU experts over expert segments: the expert half of an MoE block without a plan.

With the routed pairs sorted by expert (:class:`fusekit.gms.routing.ExpertSegments`), the
expert half is ``G-Mseg-S`` on the experts as segments:

.. code-block:: text

    Xs = x[token]                                   gather (numba rows on the CPU)
    H  = Xs @ Wgu[e]          A = silu(G) * U       one GEMM per expert, H = [G | U]
    Z  = A @ Wd[e]                                  one GEMM per expert
    y[t] = sum_j c[t k + j] * Z[pos(t, j)]          each token's k rows reduced once

Routing changes every call, so nothing is planned beyond one argsort: no tiles, no orders, no
selector. :func:`swiglu_experts` runs it, through :class:`SwiGLUExperts` (its backward written
out) when autograd needs it. The steps are the public segment operations
(:mod:`fusekit.gms.segments`).
"""

from __future__ import annotations

from typing import Any

import numba
import torch

from fusekit.errors import expected
from fusekit.gms.kernels.cpu.tile import FASTMATH
from fusekit.gms.memory import scratch
from fusekit.gms.routing import ExpertSegments
from fusekit.gms.segments import (
    gather_rows,
    reduce_rows,
    runs_on_cpu_kernels,
    segment_mm,
    segment_outer_mm,
)


def swiglu_experts(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    scale: torch.Tensor,
    seg: ExpertSegments,
) -> torch.Tensor:
    r"""``y[t] = sum_j scale[t k + j] SwiGLU_{e[t, j]}(x[t])`` over the expert segments.

    .. math:: \mathrm{SwiGLU}_e(x) = \big(\mathrm{silu}(x G_e) \odot (x U_e)\big) D_e

    Args:
        x: ``[T, hidden]``.
        w_gate_up: ``[E, hidden, 2 ffn]`` (gate columns, then up).
        w_down: ``[E, ffn, hidden]``.
        scale: ``[T k]`` routing weight of each pair ``t k + j``, ``x``'s dtype.
        seg: the routing's pairs sorted by expert.

    Returns:
        ``[T, hidden]``, differentiable in ``x``, the weights and ``scale`` when autograd needs.

    Raises:
        ValueError: ``seg`` is not the segments of ``x``'s tokens with a scale per pair.
    """
    if not torch.is_grad_enabled() or not any(
        t.requires_grad for t in (x, w_gate_up, w_down, scale)
    ):
        return expert_segments_forward(x, w_gate_up, w_down, scale, seg)[0]
    out: torch.Tensor = SwiGLUExperts.apply(x, w_gate_up, w_down, scale, seg)  # type: ignore[no-untyped-call]
    return out


def expert_segments_forward(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    scale: torch.Tensor,
    seg: ExpertSegments,
    keep: bool = False,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The expert half on expert segments: ``y`` and, if ``keep``, ``(Xs, H, A, Z)``.

    Without ``keep`` (inference) the four intermediates are the calling thread's scratch
    buffers (:func:`fusekit.gms.memory.scratch`), reused by the next call: fresh ones
    would cost a page fault per 4 KiB on every call (four ``[T k, hidden or 2 ffn]`` buffers),
    which the bare expert GEMMs, preallocating theirs, do not pay. With ``keep`` they are new
    tensors, saved for the backward.

    Raises:
        ValueError: ``seg`` is not the segments of ``x``'s tokens with a scale per pair.
    """
    rows, ffn, hidden = seg.token.shape[0], w_down.shape[1], w_down.shape[2]
    if seg.token_ptr.shape[0] != x.shape[0] + 1 or tuple(scale.shape) != (rows,):
        raise ValueError(
            expected(
                "expert_segments_forward",
                "seg",
                f"the segments of {x.shape[0]} tokens (rows of 'x') with a scale per pair",
                f"{seg.token_ptr.shape[0] - 1} tokens, {rows} pairs, scale {list(scale.shape)}",
            )
        )

    def buffer(name: str, cols: int) -> torch.Tensor:
        if keep or not runs_on_cpu_kernels(x):
            return x.new_empty(rows, cols)
        return scratch(f"moe {name}", rows, cols, x.dtype)

    xs = gather_rows(x, seg.token, out=buffer("xs", x.shape[1]) if runs_on_cpu_kernels(x) else None)
    h = segment_mm(xs, w_gate_up, seg.segment_ptr, out=buffer("h", 2 * ffn))
    gate, up = h[:, :ffn], h[:, ffn:]
    a = torch.sigmoid(gate, out=buffer("a", ffn)).mul_(gate).mul_(up)  # silu(G) U, no temporary
    z = segment_mm(a, w_down, seg.segment_ptr, out=buffer("z", hidden))
    y = _reduce_tokens(z, scale, seg, x.shape[0])
    return y, ((xs, h, a, z) if keep else ())


def _reduce_tokens(
    rows: torch.Tensor, scale: torch.Tensor, seg: ExpertSegments, tokens: int
) -> torch.Tensor:
    """``y[t] = sum_j scale[t k + j] * rows[token_pos[t k + j]]``."""
    if runs_on_cpu_kernels(rows):
        return reduce_rows(
            rows, seg.token_ptr, n_pairs=rows.shape[0], src_index=seg.token_pos, scale=scale
        )
    k = rows.shape[0] // max(tokens, 1)
    picked = rows[seg.token_pos] * scale[:, None]
    return picked.view(tokens, k, -1).sum(1)


def swiglu_backward_reference(h: torch.Tensor, da: torch.Tensor) -> torch.Tensor:
    r"""``[dG | dU]`` of ``A = silu(G) * U`` for ``H = [G | U]`` (torch; :func:`swiglu_backward`).

    .. math:: dU = dA\, \mathrm{silu}(G), \qquad
        dG = dA\, U\, \sigma(G) \big(1 + G (1 - \sigma(G))\big)
    """
    ffn = da.shape[1]
    gate, up = h[:, :ffn], h[:, ffn:]
    sig = torch.sigmoid(gate)
    return torch.cat([da * up * (sig * (1 + gate * (1 - sig))), da * gate * sig], dim=1)


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def _swiglu_backward_kernel(h, sig, da, dh):  # type: ignore[no-untyped-def]
    n, ffn = da.shape
    for r in numba.prange(n):
        for j in range(ffn):
            gate, up, s, d = h[r, j], h[r, ffn + j], sig[r, j], da[r, j]
            silu = gate * s
            dh[r, j] = d * up * (s + silu * (1 - s))
            dh[r, ffn + j] = d * silu


def swiglu_backward(h: torch.Tensor, da: torch.Tensor) -> torch.Tensor:
    """:func:`swiglu_backward_reference` in two passes over the rows.

    ``torch.sigmoid`` (a vectorised ``exp``; numba's scalar ``exp`` would not vectorise), then
    one numba pass that reads ``H``, ``sigma(G)`` and ``dA`` and writes ``[dG | dU]``, where
    the reference makes ten passes and a copy. CPU float32/float64 only; other tensors take the
    reference.
    """
    if not runs_on_cpu_kernels(h):
        return swiglu_backward_reference(h, da)
    h, da = h.detach().contiguous(), da.detach().contiguous()
    sig = torch.sigmoid(h[:, : da.shape[1]])
    dh = torch.empty_like(h)
    _swiglu_backward_kernel(h.numpy(), sig.numpy(), da.numpy(), dh.numpy())
    return dh


class SwiGLUExperts(torch.autograd.Function):
    """SwiGLU experts over expert segments, forward and backward.

    Forward, with ``Xs = x[token]`` (positions sorted by expert)::

        H = Xs @ Wgu[e]          A = silu(G) * U  (H = [G | U])
        Z = A @ Wd[e]            y[t] = sum_j c[t k + j] * Z[pos(t, j)]

    Backward, with ``dZ[p] = c[p] * dy[token[p]]``::

        dc[p] = <dy[token[p]], Z[p]>          dWd[e] = A_e^T dZ_e      dA = dZ @ Wd[e]^T
        dG = dA * U * silu'(G)   dU = dA * silu(G)
        dWgu[e] = Xs_e^T [dG | dU]            dx = scatter_add(token, [dG | dU] @ Wgu[e]^T)
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        w_gate_up: torch.Tensor,
        w_down: torch.Tensor,
        scale: torch.Tensor,
        seg: ExpertSegments,
    ) -> torch.Tensor:
        """:func:`expert_segments_forward`, keeping ``(Xs, H, A, Z)`` for the backward."""
        y, kept = expert_segments_forward(x, w_gate_up, w_down, scale, seg, keep=True)
        ctx.save_for_backward(x, w_gate_up, w_down, scale, *kept)
        ctx.seg = seg
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """``(dx, dWgu, dWd, dc, None)`` by the formulas of the class docstring."""
        x, w_gate_up, w_down, scale, xs, h, a, z = ctx.saved_tensors
        seg: ExpertSegments = ctx.seg
        e = seg.num_experts
        dy = dy.contiguous()
        dy_rows = gather_rows(dy, seg.token)
        c = scale[seg.order]
        d_scale = (dy_rows * z).sum(1)[seg.token_pos]
        dz = dy_rows * c[:, None]
        d_w_down = segment_outer_mm(a, dz, seg.segment_ptr, e)
        # the weights transposed as views: a copy of each would cost more than its GEMM
        da = segment_mm(dz, w_down.transpose(1, 2), seg.segment_ptr)
        dh = swiglu_backward(h, da)
        d_w_gate_up = segment_outer_mm(xs, dh, seg.segment_ptr, e)
        dxs = segment_mm(dh, w_gate_up.transpose(1, 2), seg.segment_ptr)
        dx = torch.zeros_like(x).index_add_(0, seg.token, dxs)
        return dx, d_w_gate_up, d_w_down, d_scale, None
