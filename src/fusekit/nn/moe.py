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
``nn.Linear`` layout; :func:`from_mixtral` converts once. To run an HF model's own MoE blocks on
gms without replacing them (same state_dict), set its experts implementation to ``"fusekit"``
(:mod:`fusekit.nn.hf`).

Routing changes every call, so planning must cost next to nothing, and ``strategy="auto"``
does not ask the gms selector (which ranks configurations of planned problems): the block runs
the ``G-Mseg-S`` dataflow on expert segments directly (:func:`fusekit.gms.experts.swiglu_experts`
on :class:`fusekit.gms.routing.ExpertSegments`: one stable argsort of the ``T k`` pairs by
expert, no tiles or orders; numba row gather, one GEMM per expert segment, a numba reduce of
the scaled rows into their tokens), with its backward written out. Without autograd and with at
most :data:`~fusekit.gms.fused_experts.DECODE_ROWS` pairs per expert (decode-sized batches) the
whole expert half instead runs in one numba call
(:func:`fusekit.gms.fused_experts.experts_decode`), which equals it. A named gms strategy
plans the two problems in full and runs :func:`fusekit.gms.gms` twice (every dataflow; slower
to plan).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from fusekit.errors import expected
from fusekit.gms.experts import swiglu_experts
from fusekit.gms.fused_experts import decode_applies, experts_decode
from fusekit.gms.problem import GMSProblem
from fusekit.gms.routing import ExpertSegments, check_routing
from fusekit.nn.engine import Prepared, needs_grad, prepare


class MoE(nn.Module):
    """Top-k routed SwiGLU experts (Mixtral's sparse MoE block) on gms.

    Args:
        hidden_size: model width (``K`` of the first GEMM, ``M`` of the second).
        ffn_size: expert width (Mixtral's ``intermediate_size``).
        num_experts: experts ``E``.
        top_k: experts per token (``1 <= top_k <= num_experts``).
        strategy: ``"auto"``: expert segments, or the fused decode call for few pairs without
            autograd (routing changes every call, so no plan is built for a selector to
            choose; module docstring); or a gms strategy name, planned and run by
            :func:`fusekit.gms.gms`.

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
                (:func:`fusekit.gms.routing.check_routing`: checked before any kernel
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
            return swiglu_experts(x, self.w_gate_up, self.w_down, scale, seg)
        self.last_path = f"gms {self.strategy}"
        up, down = self.plans(experts, x)
        h = up(x, self.w_gate_up)
        a = F.silu(h[:, : self.ffn_size]) * h[:, self.ffn_size :]
        return down(a, self.w_down, weights.reshape(-1).to(x.dtype))

    def plans(self, experts: torch.Tensor, x: torch.Tensor) -> tuple[Prepared, Prepared]:
        """The two prepared g-mm-s of one routing (``experts``: ``[T, k]``)."""
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


def from_mixtral(block: nn.Module, strategy: str = "auto") -> MoE:
    """A :class:`MoE` with the weights of an HF ``MixtralSparseMoeBlock`` (transposed once).

    Reads ``block.gate.weight`` ``[E, hidden]``, ``block.experts.gate_up_proj``
    ``[E, 2 ffn, hidden]`` and ``block.experts.down_proj`` ``[E, hidden, ffn]`` (transformers 5).
    """
    hf: Any = block  # transformers' attributes, read by name
    try:
        router = hf.gate.weight
        gate_up = hf.experts.gate_up_proj
        down = hf.experts.down_proj
        top_k = int(hf.top_k)
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
