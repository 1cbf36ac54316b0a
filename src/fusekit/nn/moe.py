r"""``MoE``: a top-k routed Mixture-of-Experts block with SwiGLU experts, run as two g-mm-s.

.. math::

    p = \mathrm{softmax}(x W_r^\top), \quad (e_{t,1..k}, \pi_{t,1..k}) = \mathrm{topk}(p_t),
    \quad \pi \leftarrow \pi / \textstyle\sum_j \pi_{t,j}

    y_t = \sum_j \pi_{t,j}\; \big(\mathrm{silu}(x_t G_{e}) \odot (x_t U_{e})\big)\, D_{e},
    \qquad e = e_{t,j}

(Mixtral's router and experts, Jiang et al. 2024; the HF ``MixtralSparseMoeBlock``). With one
pair ``p = t k + j`` per routed (token, expert):

1. ``H[p] = x[t] @ [G_e | U_e]``: gather ``g = t``, segment ``s = e``, scatter ``d = p`` (each
   pair its own row), no reduce: one g-mm-s over ``[E, hidden, 2 ffn]``;
2. ``A[p] = silu(H[p, :ffn]) * H[p, ffn:]``;
3. ``y[t] = sum_j pi[t, j] * A[p] @ D_e``: gather ``g = p``, segment ``s = e``, scatter ``d = t``,
   scale ``c = pi``, sum reduce: one g-mm-s over ``[E, ffn, hidden]``.

Weights are stored in the g-mm-s layout (``[E, K, M]``, input-major), the transpose of HF's
``nn.Linear`` layout; :func:`from_mixtral` and :func:`swap_mixtral_moe` convert once.

Routing changes every call, so planning must cost next to nothing. With ``strategy="auto"`` the
block runs the ``G-Mseg-S`` dataflow on expert segments directly (:class:`ExpertSegments`: one
stable argsort of the ``T k`` pairs by expert, no tiles or orders), with the gms kernels: numba
row gather, one GEMM per expert segment into one buffer, and a numba reduce of the scaled rows
into their tokens (each token's ``k`` rows read once, its output row written once). Its backward
is written out in :class:`_ExpertsFn`. Without autograd and with at most
:data:`~fusekit.nn.moe_decode.DECODE_ROWS` pairs per expert (decode-sized batches) the whole
expert half instead runs in one numba call (:mod:`fusekit.nn.moe_decode`), which equals this path.
A named gms strategy instead plans the two problems in full
and runs :func:`fusekit.gms.gms` twice (every dataflow; slower to plan).
"""

from __future__ import annotations

from typing import Any

import numba
import torch
from torch import nn
from torch.nn import functional as F

from fusekit.errors import expected
from fusekit.gms.kernels.cpu.tile import FASTMATH
from fusekit.nn.engine import needs_grad, prepare
from fusekit.nn.moe_decode import check_routing, decode_applies, experts_decode


class MoE(nn.Module):
    """Top-k routed SwiGLU experts (Mixtral's sparse MoE block) on gms.

    Args:
        hidden_size: model width (``K`` of the first GEMM, ``M`` of the second).
        ffn_size: expert width (Mixtral's ``intermediate_size``).
        num_experts: experts ``E``.
        top_k: experts per token (``1 <= top_k <= num_experts``).
        strategy: ``"auto"`` (the gms selector) or a gms strategy name.

    Attributes:
        router: ``[E, hidden]`` router weight (HF ``gate.weight``).
        w_gate_up: ``[E, hidden, 2 ffn]``: gate columns first, then up.
        w_down: ``[E, ffn, hidden]``.
    """

    def __init__(
        self,
        hidden_size: int,
        ffn_size: int,
        num_experts: int,
        top_k: int = 2,
        strategy: str = "auto",
    ) -> None:
        super().__init__()
        for name, value in (
            ("hidden_size", hidden_size),
            ("ffn_size", ffn_size),
            ("num_experts", num_experts),
            ("top_k", top_k),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(expected("MoE", name, "a positive int", value))
        if top_k > num_experts:
            raise ValueError(expected("MoE", "top_k", f"<= num_experts ({num_experts})", top_k))
        self.hidden_size, self.ffn_size = hidden_size, ffn_size
        self.num_experts, self.top_k = num_experts, top_k
        self.strategy = strategy
        #: Which path the last :meth:`experts` call ran (for reports).
        self.last_path = ""
        self.router = nn.Parameter(torch.empty(num_experts, hidden_size))
        self.w_gate_up = nn.Parameter(torch.empty(num_experts, hidden_size, 2 * ffn_size))
        self.w_down = nn.Parameter(torch.empty(num_experts, ffn_size, hidden_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Uniform in ``±1/sqrt(fan_in)`` (``nn.Linear``'s default bound)."""
        for p, fan_in in (
            (self.router, self.hidden_size),
            (self.w_gate_up, self.hidden_size),
            (self.w_down, self.ffn_size),
        ):
            nn.init.uniform_(p, -(fan_in**-0.5), fan_in**-0.5)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Router logits ``[T, E]``, top-k weights ``[T, k]`` (float32, renormalised), experts."""
        logits = F.linear(x, self.router)
        probs = torch.softmax(logits.float(), dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return logits, weights, experts

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[..., hidden]`` -> ``[..., hidden]``."""
        if not isinstance(hidden_states, torch.Tensor):
            raise TypeError(expected("MoE", "hidden_states", "a torch.Tensor", type(hidden_states)))
        if hidden_states.dim() == 0 or hidden_states.shape[-1] != self.hidden_size:
            raise ValueError(
                expected(
                    "MoE",
                    "hidden_states",
                    f"[..., {self.hidden_size}]",
                    f"shape {tuple(hidden_states.shape)}",
                )
            )
        if hidden_states.dtype != self.router.dtype:
            raise TypeError(
                expected("MoE", "hidden_states", f"{self.router.dtype}", hidden_states.dtype)
            )
        x = hidden_states.reshape(-1, self.hidden_size).contiguous()
        _, weights, experts = self.route(x)
        return self.experts(x, experts, weights).view_as(hidden_states)

    def experts(
        self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """The expert half: ``y[t] = sum_j weights[t, j] * SwiGLU_{experts[t, j]}(x[t])``.

        Args:
            x: ``[T, hidden]``, the expert weights' dtype and device.
            experts: ``[T, k]`` int32/int64 expert ids in ``[0, num_experts)``.
            weights: ``[T, k]`` floating-point routing weights.

        Returns:
            ``[T, hidden]``.

        Raises:
            TypeError, ValueError: operands that disagree in shape, dtype or device
                (:func:`fusekit.nn.moe_decode.check_routing`: checked before any kernel
                runs); an expert id outside ``[0, num_experts)``.
        """
        check_routing(x, experts, weights, self.w_gate_up, self.w_down)
        if self.strategy == "auto":
            if not needs_grad(x, self.w_gate_up, self.w_down, weights) and decode_applies(
                x, experts, self.num_experts
            ):
                y = experts_decode(x, experts, weights, self.w_gate_up, self.w_down)
                if y is not None:
                    self.last_path = "fused decode"
                    return y
            self.last_path = "expert segments (G-Mseg-S)"
            seg = ExpertSegments.of(experts, self.num_experts)
            scale = weights.reshape(-1).to(x.dtype)
            if not needs_grad(x, self.w_gate_up, self.w_down, weights):
                return expert_segments_forward(x, self.w_gate_up, self.w_down, scale, seg)[0]
            return _ExpertsFn.apply(x, self.w_gate_up, self.w_down, scale, seg)
        self.last_path = f"gms {self.strategy}"
        up, down = self.plans(experts, x)
        h = up(x, self.w_gate_up)
        a = F.silu(h[:, : self.ffn_size]) * h[:, self.ffn_size :]
        return down(a, self.w_down, weights.reshape(-1).to(x.dtype))

    def plans(self, experts: torch.Tensor, x: torch.Tensor) -> tuple[Any, Any]:
        """The two prepared g-mm-s of one routing (``experts``: ``[T, k]``)."""
        from fusekit.gms.problem import GMSProblem

        tokens, k = experts.shape
        pairs = tokens * k
        token = torch.arange(tokens, device=x.device).repeat_interleave(k)
        pair = torch.arange(pairs, device=x.device)
        segment = experts.reshape(-1)
        first = GMSProblem.create(
            token, segment, pair, pairs, n_in=tokens, num_segments=self.num_experts
        )
        second = GMSProblem.create(
            pair, segment, token, tokens, n_in=pairs, num_segments=self.num_experts
        )
        up = prepare(
            first,
            self.hidden_size,
            2 * self.ffn_size,
            x.dtype,
            has_scale=False,
            device=x.device,
            strategy=self.strategy,
        )
        down = prepare(
            second,
            self.ffn_size,
            self.hidden_size,
            x.dtype,
            has_scale=True,
            device=x.device,
            strategy=self.strategy,
        )
        return up, down

    def extra_repr(self) -> str:
        """Sizes."""
        return (
            f"hidden={self.hidden_size}, ffn={self.ffn_size}, experts={self.num_experts}, "
            f"top_k={self.top_k}"
        )


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


def _host(x: torch.Tensor) -> bool:
    """Whether the numba row kernels take ``x``."""
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)


def _gather(x: torch.Tensor, index: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    if _host(x):
        from fusekit.gms.kernels.cpu.rows import gather_rows_cpu

        return gather_rows_cpu(x, index, out=out)
    return x.index_select(0, index)


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
    buffers (:func:`fusekit.gms.kernels.cpu.rows.scratch`), reused by the next call. Fresh ones
    cost a page fault per 4 KiB on every call (four ``[T k, 1024+]`` buffers: 100 MB at 1024
    tokens top-6), and on this shared host that cost swings: in one run it put the call at
    1.34-1.44x the bare expert GEMMs, which preallocate theirs. With ``keep`` they are new
    tensors, saved for the backward.
    """
    from fusekit.gms.kernels.cpu.g_mseg_s import segment_mm
    from fusekit.gms.kernels.cpu.rows import scratch

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
        if keep or not _host(x):
            return x.new_empty(rows, cols)
        return scratch(f"moe {name}", rows, cols, x.dtype)

    xs = _gather(x, seg.token, out=buffer("xs", x.shape[1]) if _host(x) else None)
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
    if _host(rows):
        from fusekit.gms.kernels.cpu.rows import reduce_rows_cpu

        return reduce_rows_cpu(
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
    one numba pass that reads ``H``, ``sigma(G)`` and ``dA`` and writes ``[dG | dU]``. The
    reference makes ten passes and a copy (8 experts of ffn 3584, 1024 tokens top-2: 33 ms
    against 87 ms). CPU float32/float64 only; other tensors take the reference.
    """
    if not _host(h):
        return swiglu_backward_reference(h, da)
    h, da = h.detach().contiguous(), da.detach().contiguous()
    sig = torch.sigmoid(h[:, : da.shape[1]])
    dh = torch.empty_like(h)
    _swiglu_backward_kernel(h.numpy(), sig.numpy(), da.numpy(), dh.numpy())
    return dh


class _ExpertsFn(torch.autograd.Function):
    """SwiGLU experts over expert segments, forward and backward (see the module docstring).

    Forward, with ``Xs = x[token]`` (positions sorted by expert)::

        H = Xs @ Wgu[e]          A = silu(G) * U  (H = [G | U])
        Z = A @ Wd[e]            y[t] = sum_j c[t k + j] * Z[pos(t, j)]

    Backward, with ``dZ[p] = c[p] * dy[token[p]]``::

        dc[p] = <dy[token[p]], Z[p]>          dWd[e] = A_e^T dZ_e      dA = dZ @ Wd[e]^T
        dG = dA * U * silu'(G)   dU = dA * silu(G)
        dWgu[e] = Xs_e^T [dG | dU]            dx = scatter_add(token, [dG | dU] @ Wgu[e]^T)
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        w_gate_up: torch.Tensor,
        w_down: torch.Tensor,
        scale: torch.Tensor,
        seg: ExpertSegments,
    ) -> torch.Tensor:
        y, kept = expert_segments_forward(x, w_gate_up, w_down, scale, seg, keep=True)
        ctx.save_for_backward(x, w_gate_up, w_down, scale, *kept)
        ctx.seg = seg
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        from fusekit.gms.kernels.cpu.g_mseg_s import segment_mm, segment_outer_mm

        x, w_gate_up, w_down, scale, xs, h, a, z = ctx.saved_tensors
        seg: ExpertSegments = ctx.seg
        e = seg.num_experts
        dy = dy.contiguous()
        dy_rows = _gather(dy, seg.token)
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


def from_mixtral(block: nn.Module, strategy: str = "auto") -> MoE:
    """A :class:`MoE` with the weights of an HF ``MixtralSparseMoeBlock`` (transposed once).

    Reads ``block.gate.weight`` ``[E, hidden]``, ``block.experts.gate_up_proj``
    ``[E, 2 ffn, hidden]`` and ``block.experts.down_proj`` ``[E, hidden, ffn]`` (transformers 5).
    """
    try:
        router = block.gate.weight
        gate_up = block.experts.gate_up_proj
        down = block.experts.down_proj
        top_k = int(block.top_k)
    except AttributeError as e:
        raise TypeError(
            expected(
                "from_mixtral",
                "block",
                "a MixtralSparseMoeBlock (gate.weight, experts.gate_up_proj, experts.down_proj)",
                type(block).__name__,
            )
        ) from e
    num_experts, hidden = router.shape
    ffn = down.shape[2]
    moe = MoE(hidden, ffn, num_experts, top_k, strategy=strategy).to(router.dtype)
    with torch.no_grad():
        moe.router.copy_(router)
        moe.w_gate_up.copy_(gate_up.transpose(1, 2))
        moe.w_down.copy_(down.transpose(1, 2))
    return moe.to(router.device)


def swap_mixtral_moe(model: nn.Module, strategy: str = "auto") -> int:
    """Replace every ``MixtralSparseMoeBlock`` inside ``model`` by an equal :class:`MoE`.

    Returns:
        The number of blocks replaced.
    """
    swapped = 0
    for name, child in list(model.named_children()):
        if type(child).__name__ == "MixtralSparseMoeBlock":
            setattr(model, name, from_mixtral(child, strategy))
            swapped += 1
        else:
            swapped += swap_mixtral_moe(child, strategy)
    return swapped
