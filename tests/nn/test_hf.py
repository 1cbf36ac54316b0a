"""The "fusekit" experts implementation against HF's "eager" one, on tiny random MoE models."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

transformers = pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.activations import ACT2FN  # noqa: E402
from transformers.integrations.moe import use_experts_implementation  # noqa: E402

from fusekit.gms.experts_ops import (  # noqa: E402
    expert_combine,
    expert_combine_reference,
    expert_mm,
    expert_mm_reference,
    expert_route,
    swiglu_experts_infer,
)
from fusekit.gms.fused_experts import experts_decode  # noqa: E402
from fusekit.nn.hf import UnsupportedExperts, experts_variant, use_fusekit_experts  # noqa: E402

_COMMON = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 64,
    "max_position_embeddings": 128,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


def _config(family: str):  # type: ignore[no-untyped-def]
    t = transformers
    if family == "mixtral":
        return t.MixtralConfig(
            **_COMMON, intermediate_size=48, num_local_experts=8, num_experts_per_tok=2
        )
    if family == "qwen3_moe":
        return t.Qwen3MoeConfig(
            **_COMMON,
            intermediate_size=64,
            moe_intermediate_size=24,
            num_experts=8,
            num_experts_per_tok=2,
            head_dim=8,
        )
    if family == "olmoe":
        return t.OlmoeConfig(**_COMMON, intermediate_size=24, num_experts=8, num_experts_per_tok=2)
    if family == "gpt_oss":
        return t.GptOssConfig(
            **_COMMON,
            intermediate_size=24,
            num_local_experts=8,
            num_experts_per_tok=2,
            head_dim=8,
            layer_types=["sliding_attention", "full_attention"],
            sliding_window=16,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        )
    if family == "deepseek_v3":
        return t.DeepseekV3Config(
            **(_COMMON | {"num_key_value_heads": 4}),
            intermediate_size=48,
            moe_intermediate_size=16,
            n_routed_experts=8,
            n_shared_experts=1,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
            n_group=2,
            topk_group=1,
            kv_lora_rank=16,
            q_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=8,
        )
    assert family == "qwen2_moe"
    return t.Qwen2MoeConfig(
        **_COMMON,
        intermediate_size=48,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
    )


FAMILIES = ["mixtral", "qwen3_moe", "olmoe", "gpt_oss", "deepseek_v3", "qwen2_moe"]


def _model(family: str, implementation: str = "fusekit", **kw: object) -> nn.Module:
    torch.manual_seed(0)
    config = _config(family)
    for key, value in kw.items():
        setattr(config, key, value)
    model = AutoModelForCausalLM.from_config(config)
    for name, p in model.named_parameters():
        if "experts" in name:  # HF's init leaves biases zero and weights tiny
            nn.init.normal_(p, std=0.1)
    model.set_experts_implementation(implementation)
    return model.eval()


def _ids(tokens: int = 9, batch: int = 2) -> torch.Tensor:
    return torch.randint(3, 64, (batch, tokens), generator=torch.Generator().manual_seed(1))


def _run(model: nn.Module, implementation: str, ids: torch.Tensor, **kw: object):  # type: ignore[no-untyped-def]
    model.set_experts_implementation(implementation)  # type: ignore[operator]
    return model(ids, **kw)


def _experts_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if hasattr(m, "has_gate") and hasattr(m, "down_proj")]


# --------------------------------------------------------------- whole models against eager


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_and_router_logits_equal_eager(family: str) -> None:
    model = _model(family)
    assert _experts_modules(model)
    ids = _ids()
    with torch.no_grad():
        ref = _run(model, "eager", ids, output_router_logits=True)
        out = _run(model, "fusekit", ids, output_router_logits=True)
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-5, rtol=0)
    if getattr(ref, "router_logits", None) is not None:
        for r, o in zip(ref.router_logits, out.router_logits, strict=True):
            torch.testing.assert_close(o, r, atol=1e-5, rtol=0)
    if getattr(ref, "aux_loss", None) is not None:
        torch.testing.assert_close(out.aux_loss, ref.aux_loss, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_equals_eager(family: str) -> None:
    model = _model(family)
    ids = _ids(tokens=5, batch=1)
    kw = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": 0}
    model.set_experts_implementation("eager")
    ref = model.generate(ids, **kw)
    model.set_experts_implementation("fusekit")
    out = model.generate(ids, **kw)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("family", FAMILIES)
def test_gradients_equal_eager(family: str) -> None:
    model = _model(family).train()
    ids = _ids()
    grads = {}
    for implementation in ("eager", "fusekit"):
        model.zero_grad(set_to_none=True)
        out = _run(model, implementation, ids, labels=ids, output_router_logits=True)
        out.loss.backward()
        grads[implementation] = {
            n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
        }
    assert grads["fusekit"].keys() == grads["eager"].keys()
    assert any("experts" in n for n in grads["eager"])
    for name, ref in grads["eager"].items():
        torch.testing.assert_close(grads["fusekit"][name], ref, atol=2e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("family", ["mixtral", "gpt_oss"])
def test_save_and_load_keep_fusekit(family: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = _model(family)
    ids = _ids()
    with torch.no_grad():
        ref = _run(model, "eager", ids).logits
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.set_experts_implementation("fusekit")
    model.save_pretrained(tmp_path)
    assert model.state_dict().keys() == state.keys()  # the modules are HF's own
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, experts_implementation="fusekit")
    assert loaded.config._experts_implementation == "fusekit"
    for key, value in loaded.state_dict().items():
        torch.testing.assert_close(value, state[key], atol=0, rtol=0)
    with torch.no_grad():
        out = loaded.eval()(ids).logits
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["mixtral", "gpt_oss"])
def test_bfloat16_equals_grouped_mm(family: str) -> None:
    # both weight each expert's bfloat16 rows by float32 routing weights and sum in float32
    model = _model(family).to(torch.bfloat16)
    ids = _ids()
    with torch.no_grad():
        ref = _run(model, "grouped_mm", ids).logits
        out = _run(model, "fusekit", ids).logits
    torch.testing.assert_close(out, ref, atol=0, rtol=0)


@pytest.mark.parametrize("act", ["gelu", "relu"])
def test_other_activations_equal_eager(act: str) -> None:
    model = _model("mixtral", hidden_act=act)
    ids = _ids()
    with torch.no_grad():
        ref = _run(model, "eager", ids).logits
        out = _run(model, "fusekit", ids).logits
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


def test_variants_read_from_the_flags() -> None:
    mixtral = experts_variant(_experts_modules(_model("mixtral"))[0])
    assert mixtral.plain_swiglu and not mixtral.is_transposed and not mixtral.has_bias
    gpt_oss = experts_variant(_experts_modules(_model("gpt_oss"))[0])
    assert gpt_oss.is_transposed and gpt_oss.has_bias and not gpt_oss.plain_swiglu
    gelu = experts_variant(_experts_modules(_model("mixtral", hidden_act="gelu"))[0])
    assert not gelu.plain_swiglu


def test_unsupported_variant_names_it_and_the_model() -> None:
    model = _model("mixtral")
    _experts_modules(model)[0]._is_expert_parallel = True  # type: ignore[assignment]
    with pytest.raises(UnsupportedExperts, match=r"expert parallelism.*MixtralExperts.*'mixtral'"):
        model(_ids())


def test_quantized_weights_are_unsupported() -> None:
    model = _model("qwen3_moe")
    experts = _experts_modules(model)[0]
    experts.down_proj = nn.Parameter(experts.down_proj.detach().to(torch.int8), requires_grad=False)
    with pytest.raises(UnsupportedExperts, match=r"'down_proj' of torch.int8.*Qwen3MoeExperts"):
        model(_ids())


# --------------------------------------------------------------- the decorator's other flags


class _Config:
    model_type = "toy"
    _experts_implementation = "fusekit"
    hidden_act = "gelu"


@use_experts_implementation(has_gate=False)
class _NoGateExperts(nn.Module):
    """Experts with one up projection and an activation (Nemotron-H's layout), eager forward."""

    def __init__(self, config: _Config) -> None:
        super().__init__()
        self.up_proj = nn.Parameter(torch.randn(6, 20, 12) * 0.2)
        self.down_proj = nn.Parameter(torch.randn(6, 12, 20) * 0.2)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        y = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(index.shape[1]):
                e = int(index[t, j])
                h = self.act_fn(self.up_proj[e] @ x[t])
                y[t] += weights[t, j] * (self.down_proj[e] @ h)
        return y


@use_experts_implementation(has_post_expert_norm=True)
class _PostNormExperts(nn.Module):
    """SwiGLU experts followed by an RMS norm of each expert's output, eager forward."""

    def __init__(self, config: _Config) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(6, 24, 12) * 0.2)
        self.down_proj = nn.Parameter(torch.randn(6, 12, 12) * 0.2)
        self.act_fn = ACT2FN["silu"]
        self.post_expert_norm = nn.RMSNorm(12)

    def forward(self, x: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        y = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(index.shape[1]):
                e = int(index[t, j])
                gate, up = (self.gate_up_proj[e] @ x[t]).chunk(2)
                z = self.post_expert_norm(self.down_proj[e] @ (self.act_fn(gate) * up))
                y[t] += weights[t, j] * z
        return y


@pytest.mark.parametrize("cls", [_NoGateExperts, _PostNormExperts])
def test_flagged_variants_equal_their_eager_forward(cls: type[nn.Module]) -> None:
    torch.manual_seed(0)
    config = _Config()
    experts = cls(config)
    hidden = experts.down_proj.shape[1]
    x = torch.randn(7, hidden, requires_grad=True)
    index = torch.randint(0, 6, (7, 2))
    weights = torch.rand(7, 2, requires_grad=True)
    config._experts_implementation = "eager"
    ref = experts(x, index, weights)
    (gx_ref, gw_ref, *gp_ref) = torch.autograd.grad(
        ref.square().sum(), [x, weights, *experts.parameters()]
    )
    config._experts_implementation = "fusekit"
    out = experts(x, index, weights)
    (gx, gw, *gp) = torch.autograd.grad(out.square().sum(), [x, weights, *experts.parameters()])
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for a, b in zip([gx, gw, *gp], [gx_ref, gw_ref, *gp_ref], strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)  # float32 sums of ~1


# --------------------------------------------------------------- compile and export


def _outputs(out: object) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)  # type: ignore[return-value]


def _block(family: str) -> nn.Module:
    model = _model(family)
    for m in model.modules():
        if _experts_modules(m) and m not in _experts_modules(model) and hasattr(m, "experts"):
            return m
    raise AssertionError(f"no MoE block in {family}")


@pytest.mark.parametrize("family", ["mixtral", "gpt_oss"])
@pytest.mark.parametrize("tokens", [1, 4, 64])
def test_compile_fullgraph_equals_eager(family: str, tokens: int) -> None:
    torch._dynamo.reset()
    block = _block(family)
    x = torch.randn(1, tokens, 32, generator=torch.Generator().manual_seed(2))
    block.experts.config._experts_implementation = "eager"
    with torch.no_grad():
        ref = block(x)
    block.experts.config._experts_implementation = "fusekit"
    compiled = torch.compile(block, fullgraph=True, backend="eager")
    with torch.no_grad():
        out = compiled(x)
    for a, b in zip(_outputs(out), _outputs(ref), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_compile_fullgraph_with_autograd() -> None:
    torch._dynamo.reset()
    model = _model("qwen3_moe").train()
    ids = _ids()
    model.set_experts_implementation("eager")
    ref = model(ids, labels=ids).loss
    (ref_grad,) = torch.autograd.grad(ref, [_experts_modules(model)[0].gate_up_proj])
    model.set_experts_implementation("fusekit")
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    loss = compiled(ids, labels=ids).loss
    (grad,) = torch.autograd.grad(loss, [_experts_modules(model)[0].gate_up_proj])
    torch.testing.assert_close(loss, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(grad, ref_grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", ["mixtral", "gpt_oss"])
def test_export_moe_block(family: str) -> None:
    block = _block(family)
    x = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = block(x)
        exported = torch.export.export(block, (x,))
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert any("fusekit" in t for t in targets)
    with torch.no_grad():
        out = exported.module()(x)
    for a, b in zip(_outputs(out), _outputs(ref), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


# --------------------------------------------------------------- the ops against references


def _routing(tokens: int, k: int, experts: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    index = torch.rand(tokens, experts, generator=g).argsort(1)[:, :k]
    return index, torch.rand(tokens, k, generator=g)


@pytest.mark.parametrize("tokens", [1, 3, 50])
@pytest.mark.parametrize("transposed", [False, True])
def test_expert_mm_equals_reference(tokens: int, transposed: bool) -> None:
    torch.manual_seed(0)
    index, _ = _routing(tokens, 2, 5)
    token, segment_ptr, _, expert = expert_route(index, 5)
    assert torch.equal(expert, index.reshape(-1)[index.reshape(-1).argsort(stable=True)])
    x = torch.randn(tokens, 10, dtype=torch.float64)
    w = (
        torch.randn(5, 7, 10, dtype=torch.float64).transpose(1, 2)
        if transposed
        else (torch.randn(5, 10, 7, dtype=torch.float64))
    )
    torch.testing.assert_close(
        expert_mm(x, w, segment_ptr, token), expert_mm_reference(x, w, segment_ptr, token)
    )


def test_ops_pass_opcheck() -> None:
    index, weights = _routing(6, 2, 4)
    token, segment_ptr, token_pos, _ = expert_route(index, 4)
    x = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, 5, dtype=torch.float64).transpose(1, 2).requires_grad_()
    z = torch.randn(12, 5, dtype=torch.float64, requires_grad=True)
    weights = weights.double().requires_grad_()
    torch.library.opcheck(torch.ops.fusekit.expert_route, (index, 4))
    torch.library.opcheck(torch.ops.fusekit.expert_mm, (x, w, segment_ptr, token))
    torch.library.opcheck(torch.ops.fusekit.expert_mm, (z, w[:, :, :5], segment_ptr, None))
    torch.library.opcheck(torch.ops.fusekit.expert_combine, (z, weights, token_pos))
    assert torch.autograd.gradcheck(lambda a, b: expert_mm(a, b, segment_ptr, token), (x, w))
    assert torch.autograd.gradcheck(lambda a, b: expert_combine(a, b, token_pos), (z, weights))


def test_combine_applies_float32_routing_weights_to_half_rows() -> None:
    index, weights = _routing(5, 3, 6)
    _, _, token_pos, _ = expert_route(index, 6)
    z = torch.randn(15, 8).to(torch.bfloat16)
    weights = weights / 3 + 1e-3  # not representable in bfloat16
    out = expert_combine(z, weights, token_pos)
    exact = (z[token_pos].float() * weights.reshape(-1, 1)).view(5, 3, 8).sum(1)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, exact.to(torch.bfloat16), atol=0, rtol=0)
    torch.testing.assert_close(out, expert_combine_reference(z, weights, token_pos))
    rounded = (z[token_pos] * weights.reshape(-1, 1).to(torch.bfloat16)).view(5, 3, 8).sum(1)
    assert not torch.equal(out, rounded)


@pytest.mark.parametrize("tokens", [1, 4, 200])
def test_swiglu_infer_equals_the_op_chain(tokens: int) -> None:
    torch.manual_seed(0)
    index, weights = _routing(tokens, 2, 8)
    x = torch.randn(tokens, 16)
    gate_up = torch.randn(8, 2 * 24, 16) * 0.2  # HF's [E, 2 ffn, hidden]
    down = torch.randn(8, 16, 24) * 0.2
    out = swiglu_experts_infer(x, index, weights, gate_up.transpose(1, 2), down.transpose(1, 2))
    token, segment_ptr, token_pos, _ = expert_route(index, 8)
    h = expert_mm(x, gate_up.transpose(1, 2), segment_ptr, token)
    a = nn.functional.silu(h[:, :24]) * h[:, 24:]
    ref = expert_combine(expert_mm(a, down.transpose(1, 2), segment_ptr), weights, token_pos)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_decode_reads_hf_weights_in_place_and_sees_updates() -> None:
    """HF's [E, out, in] parameters go to the decode kernel as views, never copied or cached."""
    torch.manual_seed(0)
    num_experts, hidden, ffn = 4, 24, 20
    gate_up = nn.Parameter(torch.randn(num_experts, 2 * ffn, hidden) * 0.2)
    down = nn.Parameter(torch.randn(num_experts, hidden, ffn) * 0.2)
    x = torch.randn(3, hidden)
    experts = torch.tensor([[0, 2], [1, 2], [3, 0]])
    weights = torch.rand(3, 2)

    def want() -> torch.Tensor:
        y = torch.zeros(3, hidden)
        for t in range(3):
            for j in range(2):
                e = int(experts[t, j])
                h = gate_up[e] @ x[t]
                y[t] += weights[t, j] * (down[e] @ (F.silu(h[:ffn]) * h[ffn:]))
        return y

    with torch.no_grad():
        views = (gate_up.transpose(1, 2), down.transpose(1, 2))
        torch.testing.assert_close(experts_decode(x, experts, weights, *views), want())
        gate_up.mul_(2)  # an in-place update: the next call reads it
        torch.testing.assert_close(experts_decode(x, experts, weights, *views), want())
        copies = tuple(v.contiguous() for v in views)  # fusekit's own [E, in, out] layout
        torch.testing.assert_close(experts_decode(x, experts, weights, *copies), want())


def test_compile_inductor_decode_equals_eager() -> None:
    torch._dynamo.reset()
    block = _block("mixtral")
    x = torch.randn(1, 4, 32, generator=torch.Generator().manual_seed(4))
    block.experts.config._experts_implementation = "eager"
    with torch.no_grad():
        ref = block(x)
    block.experts.config._experts_implementation = "fusekit"
    with torch.no_grad():
        out = torch.compile(block, fullgraph=True)(x)  # inductor
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


def test_use_fusekit_experts_on_a_bare_container_of_blocks() -> None:
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    config = _config("mixtral")
    config._experts_implementation = "eager"
    torch.manual_seed(0)
    blocks = nn.Sequential(MixtralSparseMoeBlock(config), MixtralSparseMoeBlock(config))
    for p in blocks.parameters():  # torch.empty outside a model's init
        nn.init.normal_(p, std=0.1)
    x = torch.randn(1, 5, 32)
    with torch.no_grad():
        ref = blocks(x)
    assert use_fusekit_experts(blocks) == 2
    assert config._experts_implementation == "fusekit"
    with torch.no_grad():
        torch.testing.assert_close(blocks(x), ref, atol=1e-6, rtol=0)


@pytest.mark.slow  # a subprocess running pytest on a stand-in checkout (about 15 s)
def test_hf_model_tests_tool_makes_fusekit_the_default(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # tools/hf_model_tests.py runs transformers' own tests; here on a stand-in checkout
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_default.py").write_text(
        "import transformers\n"
        "def _model(**kw):\n"
        "    config = transformers.MixtralConfig(hidden_size=16, intermediate_size=8,\n"
        "        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,\n"
        "        vocab_size=20, num_local_experts=4, **kw)\n"
        "    return transformers.MixtralForCausalLM(config)\n"
        "def test_default():\n"
        "    assert _model().config._experts_implementation == 'fusekit'\n"
        "def test_explicit():\n"
        "    model = _model(experts_implementation='eager')\n"
        "    assert model.config._experts_implementation == 'eager'\n"
        "def test_fails():\n"
        "    assert _model().config._experts_implementation == 'grouped_mm'\n"
        "import unittest\n"
        "class Sub(unittest.TestCase):\n"  # subtests: one test each, however many pass
        "    def test_subtests_pass(self):\n"
        "        for i in range(3):\n"
        "            with self.subTest(i=i):\n"
        "                self.assertEqual(_model().config._experts_implementation, 'fusekit')\n"
        "    def test_a_subtest_fails(self):\n"
        "        for i in range(2):\n"
        "            with self.subTest(i=i):\n"
        "                self.assertEqual(i, 0)\n"
    )
    env = os.environ | {"PYTHONPATH": str(root / "src")}
    done = subprocess.run(
        [sys.executable, str(root / "tools" / "hf_model_tests.py"), str(tmp_path), "tests"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    last = done.stdout.strip().splitlines()[-1]
    assert last == "fusekit experts default: 3 passed, 2 failed, 0 skipped, 0 errors", done.stdout
    assert done.returncode == 1
