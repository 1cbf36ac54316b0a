"""The memory-intensive subgraphs of the stitch benchmark, as small PyTorch modules.

========================= ==========================================================================
name                      computation (bench shapes; ``small=True`` gives test shapes)
========================= ==========================================================================
layernorm_fwd             ``F.layer_norm(x, [C], w, b)``, x [4096, 1024]
layernorm_bwd             dx, dgamma, dbeta of LayerNorm from (dy, x, mean, rstd, gamma), as
                          written out by autograd's decomposition, [4096, 1024]
masked_softmax            ``softmax(s * scale + mask)``, s [8, 12, 128, 128], mask [8, 1, 1, 128]
bias_gelu                 ``gelu(x + b)``, x [2048, 3072]
bias_dropout_res_ln       ``LN(r + dropout(x + b))`` (dropout in eval mode), [4096, 1024]
attention_core            ``bmm(softmax(bmm(q, k^T) * scale + mask), v)``, [96, 128, 64]
row_reduce_tall           ``x.sum(-1)``, x [750000, 32]
row_reduce_wide           ``x.sum(-1)``, x [64, 30000]
sibling_reductions        ``x.sum(1)`` and ``x.amax(0)``: one read for both axes, [8192, 1024]
bert                      BERT encoder layer (C=256, 4 heads, FFN 1024), x [8, 128, 256]
========================= ==========================================================================
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fusekit.errors import expected
from fusekit.ir.examples import BertLayer


class LayerNormFwd(nn.Module):
    """LayerNorm over the last dim."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: [N, C]."""
        out: torch.Tensor = self.ln(x)
        return out


class LayerNormBwd(nn.Module):
    r"""LayerNorm backward, as autograd's decomposition writes it.

    .. math:: \hat x = (x - \mu) r, \; g = dy \gamma, \;
        dx = r (g - \overline{g} - \hat x \overline{g \hat x}), \;
        d\gamma = \textstyle\sum_n dy \hat x, \; d\beta = \sum_n dy
    """

    def forward(
        self, dy: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
        gamma: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """Row statistics ``mean`` and ``rstd`` are [N]; ``gamma`` is [C]."""
        xhat = (x - mean[:, None]) * rstd[:, None]
        g = dy * gamma
        c1 = (g * xhat).mean(-1, keepdim=True)
        c2 = g.mean(-1, keepdim=True)
        dx = (g - c2 - xhat * c1) * rstd[:, None]
        return dx, (dy * xhat).sum(0), dy.sum(0)


class MaskedSoftmax(nn.Module):
    """Scaled, masked softmax of attention scores."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, s: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``s``: [B, H, T, T]; ``mask``: [B, 1, 1, T] additive."""
        return torch.softmax(s * self.scale + mask, dim=-1)


class BiasGelu(nn.Module):
    """``gelu(x + b)``."""

    def forward(self, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``x``: [N, C]; ``b``: [C]."""
        return F.gelu(x + b)


class BiasDropoutResidualLN(nn.Module):
    """``LN(r + dropout(x + b))``; capture needs eval mode, where dropout is the identity."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(c)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        """``x``, ``r``: [N, C]; ``b``: [C]."""
        out: torch.Tensor = self.ln(r + self.drop(x + b))
        return out


class AttentionCore(nn.Module):
    """``bmm(softmax(bmm(q, k^T) * scale + mask), v)``."""

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """``q``, ``k``, ``v``: [B, T, D]; ``mask``: [B, 1, T] additive."""
        s = torch.bmm(q, k.transpose(1, 2)) * (1.0 / math.sqrt(q.shape[-1])) + mask
        return torch.bmm(torch.softmax(s, dim=-1), v)


class RowSum(nn.Module):
    """``x.sum(-1)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: [N, C]."""
        return x.sum(-1)


class SiblingReductions(nn.Module):
    """Row sums and column maxima of one input."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x``: [N, C]."""
        return x.sum(1), x.amax(0)


@dataclass(frozen=True)
class Workload:
    """A benchmark subgraph: a module and its arguments."""

    name: str
    description: str
    module: nn.Module
    args: tuple[Any, ...]


def _rand(*shape: int, g: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, generator=g)


def _make(name: str, small: bool, g: torch.Generator) -> Workload:
    n, c = (64, 96) if small else (4096, 1024)
    if name == "layernorm_fwd":
        return Workload(name, f"LayerNorm [{n},{c}]", LayerNormFwd(c).eval(), (_rand(n, c, g=g),))
    if name == "layernorm_bwd":
        args = (_rand(n, c, g=g), _rand(n, c, g=g), _rand(n, g=g),
                torch.rand(n, generator=g) + 0.5, _rand(c, g=g))  # fmt: skip
        return Workload(name, f"LayerNorm backward [{n},{c}]", LayerNormBwd(), args)
    if name == "masked_softmax":
        b, h, t = (2, 3, 16) if small else (8, 12, 128)
        mask = torch.zeros(b, 1, 1, t)
        mask[..., t * 3 // 4 :] = -1e4
        return Workload(name, f"scaled masked softmax [{b},{h},{t},{t}]", MaskedSoftmax(0.125),
                        (_rand(b, h, t, t, g=g), mask))  # fmt: skip
    if name == "bias_gelu":
        n2, c2 = (64, 160) if small else (2048, 3072)
        return Workload(name, f"bias + GELU [{n2},{c2}]", BiasGelu(),
                        (_rand(n2, c2, g=g), _rand(c2, g=g)))  # fmt: skip
    if name == "bias_dropout_res_ln":
        return Workload(name, f"bias + dropout + residual + LayerNorm [{n},{c}]",
                        BiasDropoutResidualLN(c).eval(),
                        (_rand(n, c, g=g), _rand(c, g=g), _rand(n, c, g=g)))  # fmt: skip
    if name == "attention_core":
        b, t, d = (4, 16, 8) if small else (96, 128, 64)
        mask = torch.zeros(b, 1, t)
        mask[..., t * 3 // 4 :] = -1e4
        qkvm = (_rand(b, t, d, g=g), _rand(b, t, d, g=g), _rand(b, t, d, g=g), mask)
        return Workload(name, f"BMM-scale-mask-softmax-BMM [{b},{t},{d}]", AttentionCore(), qkvm)
    if name == "row_reduce_tall":
        shape = (3000, 32) if small else (750000, 32)
        return Workload(name, f"row sum {list(shape)}", RowSum(), (_rand(*shape, g=g),))
    if name == "row_reduce_wide":
        shape = (8, 3000) if small else (64, 30000)
        return Workload(name, f"row sum {list(shape)}", RowSum(), (_rand(*shape, g=g),))
    if name == "sibling_reductions":
        shape = (96, 80) if small else (8192, 1024)
        return Workload(name, f"row sum + column max {list(shape)}", SiblingReductions(),
                        (_rand(*shape, g=g),))  # fmt: skip
    if name == "bert":
        b, t, dim, hidden = (2, 16, 64, 128) if small else (8, 128, 256, 1024)
        mask = torch.zeros(b, t)
        mask[-1, t * 3 // 4 :] = -1e4
        model = BertLayer(dim, 4, hidden).eval()
        return Workload(name, f"BERT encoder layer [{b},{t},{dim}]", model,
                        (_rand(b, t, dim, g=g), mask))  # fmt: skip
    raise ValueError(expected("stitch", "workload", "one of " + ", ".join(NAMES), name))


#: Names of the subgraphs (the BERT layer last).
NAMES: tuple[str, ...] = (
    "layernorm_fwd", "layernorm_bwd", "masked_softmax", "bias_gelu", "bias_dropout_res_ln",
    "attention_core", "row_reduce_tall", "row_reduce_wide", "sibling_reductions", "bert",
)  # fmt: skip


def load_workload(name: str, *, small: bool = False, seed: int = 0) -> Workload:
    """Build workload ``name`` (test shapes with ``small``).

    Raises:
        ValueError: for an unknown name.
    """
    torch.manual_seed(seed)
    return _make(name, small, torch.Generator().manual_seed(seed))


#: Factories by name, for the CLI's model argument.
WORKLOADS: dict[str, Callable[..., Workload]] = {
    name: (lambda n: lambda **kw: load_workload(n, **kw))(name) for name in NAMES
}
