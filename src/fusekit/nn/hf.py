r"""The ``"fusekit"`` experts implementation of Hugging Face transformers' MoE models.

Importing this module registers :func:`fusekit_experts_forward` in transformers'
``ExpertsInterface`` under the name ``"fusekit"``, so that::

    import fusekit.nn.hf
    model.set_experts_implementation("fusekit")
    # or AutoModelForCausalLM.from_pretrained(path, experts_implementation="fusekit")

runs the experts of every model whose experts class carries ``@use_experts_implementation``
(Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V2/V3, GPT-OSS, Granite-MoE, ...) on gms. The model's
modules and parameters stay HF's own (state_dict, save/load, router logits, aux loss, init and
TP plans unchanged); only the experts' forward changes. With ``P = T k`` routed pairs sorted
by expert:

.. code-block:: text

    H[q] = x[token[q]] @ W_up[e] (+ b_up[e])            fusekit::expert_mm (gather in the GEMM)
    A    = experts._apply_gate(H)  |  act_fn(H)          the model's own gate (has_gate or not)
    Z[q] = A[q] @ W_down[e] (+ b_down[e])                fusekit::expert_mm
    Z    = post_expert_norm(Z)                           if the class has one
    y[t] = sum_j c[t, j] Z[pos(t, j)]                    fusekit::expert_combine, in float32
                                                         for half rows and float32 weights

The decorator's flags pick the weights and their layout: ``is_transposed`` (``[E, in, out]``
read as is; otherwise HF's ``[E, out, in]`` passes as a ``transpose(1, 2)`` view, never copied on
this path), ``has_gate`` (``gate_up_proj`` or ``up_proj``), ``has_bias`` (``*_bias`` rows added
per expert), ``has_post_expert_norm``; ``is_concatenated`` (``[gate | up]`` or interleaved) and
the activation (silu, gelu, relu, GPT-OSS's clamped ``(up + 1) * g sigmoid(alpha g)``, ...) are
whatever the class's own ``_apply_gate`` and ``act_fn`` compute, called as they are. The ops
have fake implementations and registered backwards (:mod:`fusekit.gms.experts_ops`), so
autograd, ``torch.compile(fullgraph=True)`` and ``torch.export`` run through them.

Without autograd, on CPU float32/float64, the plain SwiGLU variant (the default gate on
``[gate | up]`` with SiLU, no biases, no post norm) takes one op instead
(:func:`fusekit.gms.experts_ops.swiglu_experts_infer`: the one-call numba decode kernel for a few
tokens, the expert segments otherwise; both read HF's ``[E, out, in]`` weights in place, with
no copy of them made or kept).

Expert parallelism (``_is_expert_parallel``: sentinel expert ids), and weights that are not
three-dimensional floating-point tensors of the flagged names and shapes (e.g. quantized
experts) raise :class:`UnsupportedExperts`, naming the variant and the model.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn

from fusekit.errors import FusekitError, expected, require
from fusekit.gms.experts_ops import (
    expert_combine,
    expert_mm,
    expert_route,
    swiglu_experts_infer,
    swiglu_infer_applies,
)

_hf_moe: Any = require("transformers.integrations.moe", "fusekit.nn.hf", "peers")

#: HF's ``[gate | up]`` SwiGLU gate, which the decorator gives classes without their own.
_DEFAULT_GATE = getattr(_hf_moe, "_default_apply_gate", None)

#: The name the implementation is registered under.
IMPLEMENTATION = "fusekit"


class UnsupportedExperts(FusekitError, NotImplementedError):
    """An HF experts module whose variant the ``"fusekit"`` implementation cannot run."""


class ExpertsVariant(NamedTuple):
    """What an HF experts module computes, read from its decorator's flags and attributes."""

    up_name: str
    has_gate: bool
    has_bias: bool
    is_transposed: bool
    has_post_expert_norm: bool
    plain_swiglu: bool


def _model_of(experts: nn.Module) -> str:
    config = getattr(experts, "config", None)
    model_type = getattr(config, "model_type", None) or "?"
    return f"{type(experts).__name__} (model_type {model_type!r})"


def _unsupported(experts: nn.Module, variant: str) -> UnsupportedExperts:
    return UnsupportedExperts(
        f"experts_implementation='fusekit': cannot run {variant} of {_model_of(experts)}; "
        "use another experts_implementation (e.g. 'grouped_mm' or 'eager') for this model"
    )


def _is_silu(act: object) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation"


def _weight(experts: nn.Module, name: str) -> torch.Tensor:
    w = getattr(experts, name, None)
    if not isinstance(w, torch.Tensor) or w.dim() != 3 or not w.is_floating_point():
        got = f"{w.dtype} {list(w.shape)}" if isinstance(w, torch.Tensor) else type(w).__name__
        raise _unsupported(experts, f"weights '{name}' of {got} (expected floating [E, ., .])")
    return w


def experts_variant(experts: nn.Module) -> ExpertsVariant:
    """Read and check the variant of an HF experts module (``@use_experts_implementation``).

    Args:
        experts: the experts module (its class decorated by ``use_experts_implementation``).

    Returns:
        Its :class:`ExpertsVariant`.

    Raises:
        UnsupportedExperts: expert parallelism, or weights that are not ``[E, ., .]``
            floating-point tensors of the flagged names with matching shapes.
    """
    mod: Any = experts
    if getattr(mod, "_is_expert_parallel", False):
        raise _unsupported(experts, "expert parallelism (sentinel expert ids)")
    has_gate = bool(getattr(mod, "has_gate", True))
    has_bias = bool(getattr(mod, "has_bias", False))
    transposed = bool(getattr(mod, "is_transposed", False))
    up_name = "gate_up_proj" if has_gate else "up_proj"
    up = _weight(experts, up_name)
    down = _weight(experts, "down_proj")
    up_in = up.shape[1] if transposed else up.shape[2]  # [E, in, out] or [E, out, in]
    up_out = up.shape[2] if transposed else up.shape[1]
    down_out = down.shape[2] if transposed else down.shape[1]
    if down.shape[0] != up.shape[0] or down_out != up_in or (has_gate and up_out % 2):
        raise _unsupported(
            experts,
            f"weights '{up_name}' {list(up.shape)} and 'down_proj' {list(down.shape)} "
            f"(is_transposed={transposed}) that do not chain",
        )
    default_gate = _DEFAULT_GATE is not None and getattr(type(mod), "_apply_gate", None) is (
        _DEFAULT_GATE
    )
    plain = (
        has_gate
        and not has_bias
        and bool(getattr(mod, "is_concatenated", True))
        and not bool(getattr(mod, "has_post_expert_norm", False))
        and default_gate
        and _is_silu(getattr(mod, "act_fn", None))
    )
    return ExpertsVariant(
        up_name,
        has_gate,
        has_bias,
        transposed,
        bool(getattr(mod, "has_post_expert_norm", False)),
        plain,
    )


def fusekit_experts_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """The ``"fusekit"`` experts forward of an HF experts module (module docstring).

    Args:
        self: the experts module.
        hidden_states: ``[T, hidden]``.
        top_k_index: ``[T, k]`` expert ids.
        top_k_weights: ``[T, k]`` routing weights.

    Returns:
        ``[T, hidden]`` in ``hidden_states``' dtype.

    Raises:
        UnsupportedExperts: a variant this implementation cannot run (:func:`experts_variant`).
    """
    mod: Any = self
    variant = experts_variant(self)
    w_up: torch.Tensor = getattr(mod, variant.up_name)
    w_down: torch.Tensor = mod.down_proj
    if not variant.is_transposed:  # HF's [E, out, in] read in place as [E, in, out]
        w_up, w_down = w_up.transpose(1, 2), w_down.transpose(1, 2)
    x = hidden_states.to(w_up.dtype)
    grad = torch.is_grad_enabled() and (
        x.requires_grad or w_up.requires_grad or w_down.requires_grad or top_k_weights.requires_grad
    )
    if variant.plain_swiglu and not grad and swiglu_infer_applies(x, w_up, w_down):
        y = swiglu_experts_infer(x, top_k_index, top_k_weights, w_up, w_down)
        return y.to(hidden_states.dtype)
    token, segment_ptr, token_pos, expert = expert_route(top_k_index, w_up.shape[0])
    h = expert_mm(x, w_up, segment_ptr, token)
    if variant.has_bias:
        h = h + getattr(mod, f"{variant.up_name}_bias")[expert]
    h = mod._apply_gate(h) if variant.has_gate else mod.act_fn(h)
    z = expert_mm(h.to(w_down.dtype), w_down, segment_ptr)
    if variant.has_bias:
        z = z + mod.down_proj_bias[expert]
    if variant.has_post_expert_norm:
        z = mod.post_expert_norm(z)
    return expert_combine(z, top_k_weights, token_pos).to(hidden_states.dtype)


def is_hf_experts(module: nn.Module) -> bool:
    """Whether ``module`` is an HF experts module (a class under ``use_experts_implementation``)."""
    return all(hasattr(module, a) for a in ("config", "has_gate", "is_transposed", "down_proj"))


def use_fusekit_experts(model: nn.Module) -> int:
    """Run the experts of ``model`` (an HF model, or any module holding HF MoE blocks) on gms.

    Calls ``model.set_experts_implementation("fusekit")`` where the model has it, else sets
    ``"fusekit"`` on the config of each experts module. Modules and parameters are untouched.

    Args:
        model: the model.

    Returns:
        The number of experts modules (one per MoE block) that now run ``"fusekit"``.
    """
    setter = getattr(model, "set_experts_implementation", None)
    if callable(setter):
        setter(IMPLEMENTATION)
    experts = [m for m in model.modules() if is_hf_experts(m)]
    for m in experts:
        config: Any = getattr(m, "config")  # noqa: B009 - an attribute HF's decorator sets
        if config._experts_implementation != IMPLEMENTATION:
            config._experts_implementation = IMPLEMENTATION
    return len(experts)


def swap_mixtral_moe(model: nn.Module, strategy: str = "auto") -> int:
    """:func:`use_fusekit_experts` under its former name (it no longer replaces modules).

    It used to replace every ``MixtralSparseMoeBlock`` by a :class:`fusekit.nn.MoE`, which changed
    the state_dict; now HF's blocks stay and run the ``"fusekit"`` experts implementation, for
    every MoE family, not only Mixtral.

    Args:
        model: the model.
        strategy: ``"auto"`` (the only one: the expert half is routed anew each call, so there
            is no gms plan to choose a strategy for).

    Returns:
        The number of MoE blocks that now run on gms.

    Raises:
        ValueError: another ``strategy``.
    """
    if strategy != "auto":
        raise ValueError(expected("swap_mixtral_moe", "strategy", "'auto'", repr(strategy)))
    return use_fusekit_experts(model)


def register() -> None:
    """Register :func:`fusekit_experts_forward` as ``"fusekit"`` (done on import; idempotent)."""
    _hf_moe.ExpertsInterface.register(IMPLEMENTATION, fusekit_experts_forward)


register()
