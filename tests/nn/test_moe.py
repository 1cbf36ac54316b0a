"""MoE against HF Mixtral's sparse MoE block, the gms dataflows and its own backward."""

from __future__ import annotations

import re

import pytest
import torch

from fusekit.data.tokens import ROUTINGS, expert_load, moe_batch
from fusekit.gms.experts import swiglu_backward, swiglu_backward_reference
from fusekit.nn import swap_mixtral_moe
from fusekit.nn.moe import MoE, from_mixtral

transformers = pytest.importorskip("transformers")


def _config(**kw):
    from transformers import MixtralConfig

    base = {
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 50,
    }
    return MixtralConfig(**(base | kw))


def _block(**kw):
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    torch.manual_seed(0)
    block = MixtralSparseMoeBlock(_config(**kw))
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.1)
    return block


@pytest.mark.parametrize("strategy", ["auto", "G-Mseg-S", "(GMS)seg", "transform-first"])
@pytest.mark.parametrize(("experts", "top_k"), [(8, 2), (16, 6)])
def test_equals_mixtral_block(strategy, experts, top_k):
    block = _block(num_local_experts=experts, num_experts_per_tok=top_k)
    x = torch.randn(2, 9, 32)
    moe = from_mixtral(block, strategy)
    torch.testing.assert_close(moe(x), block(x), rtol=1e-5, atol=1e-6)


def test_swap_in_a_mixtral_model_keeps_the_logits_and_the_modules():
    from transformers import MixtralForCausalLM

    torch.manual_seed(0)
    model = MixtralForCausalLM(_config()).eval()
    ids = torch.randint(0, 50, (2, 7))
    before = model(ids).logits
    state = model.state_dict()
    assert swap_mixtral_moe(model) == 2
    assert model.config._experts_implementation == "fusekit"
    assert not any(isinstance(m, MoE) for m in model.modules())  # HF's blocks stay
    assert model.state_dict().keys() == state.keys()
    torch.testing.assert_close(model(ids).logits, before, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="'strategy' to be 'auto'"):
        swap_mixtral_moe(model, "G-Mseg-S")


@pytest.mark.parametrize("tokens", [1, 3, 40, 120])  # 120: experts past the skinny rows
def test_expert_segments_backward_equals_gms_path(tokens):
    torch.manual_seed(tokens)
    fast = MoE(16, 24, 6, 2)
    ref = MoE(16, 24, 6, 2, strategy="G-Mseg-S")
    ref.load_state_dict(fast.state_dict())
    x = torch.randn(tokens, 16, requires_grad=True)
    a, b = fast(x), ref(x)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    ga = torch.autograd.grad(a.square().sum(), [x, *fast.parameters()])
    gb = torch.autograd.grad(b.square().sum(), [x, *ref.parameters()])
    for u, v in zip(ga, gb, strict=True):
        torch.testing.assert_close(u, v, rtol=1e-4, atol=1e-5)


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="'top_k' to be <= num_experts"):
        MoE(8, 8, 4, top_k=5)
    with pytest.raises(ValueError, match="'hidden_size' to be a positive int"):
        MoE(0, 8, 4)
    moe = MoE(8, 8, 4)
    with pytest.raises(ValueError, match=re.escape("'hidden_states' to be [..., 8]")):
        moe(torch.randn(3, 7))
    with pytest.raises(TypeError, match=re.escape("'hidden_states' to be torch.float32")):
        moe(torch.randn(3, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="'experts' to be in \\[0, 4\\)"):
        moe.experts(torch.randn(3, 8), torch.tensor([[0, 9]] * 3), torch.ones(3, 2))
    with pytest.raises(TypeError, match="a MixtralSparseMoeBlock"):
        from_mixtral(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("name", list(ROUTINGS))
def test_router_skew_is_as_stated(name):
    experts, top_k = ROUTINGS[name]
    flat = moe_batch(2048, 64, experts, top_k, skew=0.0, seed=1)
    skewed = moe_batch(2048, 64, experts, top_k, skew=1.0, seed=1)
    load_flat = expert_load(flat.route()[1], experts)
    load_skew = expert_load(skewed.route()[1], experts)
    assert load_flat.max() < 2.0 / experts  # near uniform
    assert load_skew.max() > 1.5 * load_flat.max()  # a few experts take most tokens
    weights, chosen = skewed.route()
    assert chosen.shape == (2048, top_k)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2048))
    with pytest.raises(ValueError, match="'top_k'"):
        moe_batch(4, 8, experts=2, top_k=3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_swiglu_backward_equals_autograd(dtype):
    torch.manual_seed(0)
    h = torch.randn(7, 2 * 5, dtype=torch.float64, requires_grad=True)
    da = torch.randn(7, 5, dtype=torch.float64)
    a = torch.nn.functional.silu(h[:, :5]) * h[:, 5:]
    (expected,) = torch.autograd.grad(a, h, da)
    got = swiglu_backward(h.detach().to(dtype), da.to(dtype))
    torch.testing.assert_close(got, expected.to(dtype))
    torch.testing.assert_close(swiglu_backward_reference(h.detach(), da), expected)
