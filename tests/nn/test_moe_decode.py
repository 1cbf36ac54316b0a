"""The one-call decode path of MoE against its general path (expert segments, SwiGLUExperts)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fusekit.data.tokens import moe_batch
from fusekit.gms.experts import SwiGLUExperts
from fusekit.gms.fused_experts import DECODE_ROWS, _deal_items, decode_applies, experts_decode
from fusekit.gms.routing import ExpertSegments
from fusekit.nn.moe import MoE


def _moe(experts, top_k, hidden=40, ffn=24, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return MoE(hidden, ffn, experts, top_k).to(dtype)


def _general(moe, x, experts, weights):
    seg = ExpertSegments.of(experts, moe.num_experts)
    scale = weights.reshape(-1).to(x.dtype)
    return SwiGLUExperts.apply(x, moe.w_gate_up, moe.w_down, scale, seg)


def _hf_layout(w: torch.Tensor) -> torch.Tensor:
    """The same values as a ``transpose(1, 2)`` view of ``[E, out, in]`` storage (HF's)."""
    return w.transpose(1, 2).contiguous().transpose(1, 2)


@pytest.mark.parametrize("layout", ["rows", "hf"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("experts", "top_k", "tokens"), [(8, 2, 1), (8, 2, 5), (16, 6, 3), (4, 4, 2)]
)
def test_decode_equals_general_path(experts, top_k, tokens, dtype, layout):
    moe = _moe(experts, top_k, dtype=dtype)
    # hidden 40 is not a multiple of the kernel's 4-deep unroll: the remainder loop runs too
    # (the HF layout's dot-product remainders: test_hf's ffn 20)
    x = torch.randn(tokens, 40, dtype=dtype)
    w_gate_up, w_down = moe.w_gate_up, moe.w_down
    if layout == "hf":
        w_gate_up, w_down = _hf_layout(w_gate_up.detach()), _hf_layout(w_down.detach())
    with torch.no_grad():
        _, weights, idx = moe.route(x)
        got = experts_decode(x, idx, weights, w_gate_up, w_down)
        want = _general(moe, x, idx, weights)
    assert got is not None
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_skewed_routing_with_many_rows_per_expert():
    """Zipf routing puts up to DECODE_ROWS pairs on one expert and few on others: odd row counts,
    4/2/1 row blocks."""
    batch = moe_batch(12, 32, experts=8, top_k=2, skew=1.5, seed=3)
    weights, idx = batch.route()
    counts = torch.bincount(idx.reshape(-1), minlength=8)
    assert DECODE_ROWS // 2 < int(counts.max()) <= DECODE_ROWS
    assert int(counts[counts > 0].min()) < 4
    moe = _moe(8, 2, hidden=32, ffn=20)
    with torch.no_grad():
        got = experts_decode(batch.x, idx, weights, moe.w_gate_up, moe.w_down)
        want = _general(moe, batch.x, idx, weights)
    assert got is not None
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_too_many_rows_on_one_expert_falls_back():
    moe = _moe(2, 1)
    tokens = DECODE_ROWS + 1
    idx = torch.zeros(tokens, 1, dtype=torch.int64)  # every token on expert 0
    weights = torch.ones(tokens, 1)
    x = torch.randn(tokens, 40)
    assert decode_applies(x, idx, 2)
    assert experts_decode(x, idx, weights, moe.w_gate_up, moe.w_down) is None
    with torch.no_grad():
        moe.experts(x, idx, weights)
    assert moe.last_path == "expert segments (G-Mseg-S)"


def test_module_takes_decode_only_without_autograd():
    moe = _moe(8, 2)
    x = torch.randn(3, 40)
    with torch.no_grad():
        y0 = moe(x)
    assert moe.last_path == "fused decode"
    y1 = moe(x)  # parameters require grad: the path with a backward
    assert moe.last_path == "expert segments (G-Mseg-S)"
    assert y1.requires_grad
    torch.testing.assert_close(y0, y1.detach(), rtol=1e-5, atol=1e-6)


def test_bad_expert_id_names_the_argument():
    moe = _moe(4, 2)
    x = torch.randn(2, 40)
    idx = torch.tensor([[0, 1], [2, 4]])
    with pytest.raises(ValueError, match=r"experts.*\[0, 4\)"):
        experts_decode(x, idx, torch.ones(2, 2) / 2, moe.w_gate_up, moe.w_down)


def test_applies_only_to_cpu_floats_and_small_batches():
    idx = torch.zeros(3, 2, dtype=torch.int64)
    assert decode_applies(torch.randn(3, 8), idx, 4)
    assert not decode_applies(torch.randn(3, 8, dtype=torch.bfloat16), idx, 4)
    many = torch.zeros(4 * DECODE_ROWS + 1, 1, dtype=torch.int64)
    assert not decode_applies(torch.randn(many.shape[0], 8), many, 4)


def test_items_are_whole_experts_unless_that_unbalances_the_threads():
    # costs (6 + rows) x weights: 70, 48, 21, 9, 9, 7, 7 deal evenly to 2 threads as whole experts
    ptr = np.array([0, 64, 106, 121, 124, 127, 128, 129])
    hit = np.arange(7)
    chunks, order, tptr = _deal_items(hit, ptr, 3000, 2)
    assert chunks == 1 and sorted(order.tolist()) == list(range(7)) and tptr[-1] == 7
    # one expert on two threads: each takes half its columns
    chunks, order, tptr = _deal_items(hit[:1], ptr, 3000, 2)
    assert chunks == 2 and tptr.tolist() == [0, 1, 2]
    # one dominant expert among small ones (70 against 4 x 7): split, two items per thread
    ptr = np.array([0, 64, 64, 64, 64, 64, 65, 66, 67, 68])
    chunks, _, tptr = _deal_items(np.array([0, 5, 6, 7, 8]), ptr, 3000, 2)
    assert chunks == 2 and np.diff(tptr).tolist() == [5, 5]
