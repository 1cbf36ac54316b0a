r"""Mixture-of-Experts token batches whose router picks experts with a stated skew.

Real routers are unbalanced: a few experts take most tokens (Mixtral reports per-layer expert
loads far from uniform; DeepSeek-MoE adds balance losses because of it). :func:`moe_batch` draws
hidden states and a router matrix such that expert popularity follows a Zipf law:

.. math::

    x_t = z_t + \mu, \qquad W_r[e] = n_e + \alpha \log P(e)\, \hat\mu / \lVert\mu\rVert,
    \qquad n_e \perp \mu, \qquad P(e) \propto (e + 1)^{-s}

so every token's logits carry the common term ``alpha log P(e)`` on top of noise: with
``skew = s = 0`` routing is near uniform, ``s = 1`` Zipf-skewed. :func:`expert_load` reports the
share of routed pairs each expert receives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fusekit.errors import expected

#: The two routings the issue names: Mixtral-like and fine-grained (DeepSeek-MoE-like).
ROUTINGS: dict[str, tuple[int, int]] = {"8x2": (8, 2), "64x6": (64, 6)}


@dataclass(frozen=True, slots=True, eq=False)
class MoEBatch:
    """Hidden states and a router that routes them with the requested skew.

    Attributes:
        x: ``[T, hidden]`` float32 hidden states.
        router: ``[E, hidden]`` router weight (logits are ``x @ router.T``).
        top_k: experts per token.
        skew: the Zipf exponent of expert popularity.
    """

    x: torch.Tensor
    router: torch.Tensor
    top_k: int
    skew: float

    @property
    def num_experts(self) -> int:
        """``E``."""
        return int(self.router.shape[0])

    def route(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Mixtral routing: softmax, top-k, renormalised weights ``[T, k]`` and experts."""
        probs = torch.softmax(self.x @ self.router.T, dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        return weights / weights.sum(-1, keepdim=True), experts


def moe_batch(
    tokens: int,
    hidden: int,
    experts: int = 8,
    top_k: int = 2,
    skew: float = 1.0,
    seed: int = 0,
    alpha: float = 2.0,
) -> MoEBatch:
    """A token batch and router with Zipf(``skew``) expert popularity (see the module docstring)."""
    for name, value in (("tokens", tokens), ("hidden", hidden), ("experts", experts)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(expected("data.moe_batch", name, "a positive int", value))
    if not 1 <= top_k <= experts:
        raise ValueError(expected("data.moe_batch", "top_k", f"in [1, {experts}]", top_k))
    gen = torch.Generator().manual_seed(seed)
    mu = torch.randn(hidden, generator=gen)
    x = torch.randn(tokens, hidden, generator=gen) + mu
    log_p = -skew * torch.log(torch.arange(1, experts + 1, dtype=torch.float32))
    log_p = log_p - torch.logsumexp(log_p, 0)
    unit = mu / mu.norm()
    noise = torch.randn(experts, hidden, generator=gen) / hidden**0.5
    noise -= (noise @ unit)[:, None] * unit  # no common term from the noise: skew 0 is balanced
    direction = unit / mu.norm()  # (x @ direction) is about 1 for every token
    router = noise + alpha * log_p[:, None] * direction
    perm = torch.randperm(experts, generator=gen)  # popular experts are not the low ids
    return MoEBatch(x=x, router=router[perm].contiguous(), top_k=top_k, skew=skew)


def expert_load(experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Share of the routed (token, expert) pairs each expert receives, ``[E]``."""
    counts = torch.bincount(experts.reshape(-1), minlength=num_experts).double()
    return counts / counts.sum().clamp(min=1)
