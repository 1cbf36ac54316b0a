"""``torch.ops.fusekit.gms``: the g-mm-s engine as a PyTorch custom op, with autograd.

Importing this module registers two ops (``torch.library.custom_op``, each with a fake
implementation, so that ``torch.compile(fullgraph=True)`` traces through them without a graph
break and ``torch.export`` records them)::

    fusekit::gms(Tensor x, Tensor w, Tensor? scale, Tensor plan, SymInt n_out, str strategy)
        -> Tensor                                                     Y[n_out, M]
    fusekit::gms_backward(Tensor grad, Tensor x, Tensor w, Tensor? scale, Tensor plan,
                          str strategy, bool[] needs) -> (Tensor, Tensor, Tensor)

``plan`` is :attr:`fusekit.gms.GMSPlan.packed` of a plan made by :func:`fusekit.gms.plan`
(index values are checked there, or when an unknown buffer is parsed; each call verifies that
the plan was not edited since (:mod:`fusekit.gms.integrity`) and the kernels guard every index).
``strategy`` is ``"auto"`` or a strategy name (``"(GMS)seg"``, ``"aggregate-first"``,
``"transform-first/G-Mseg-S"``, ...). The backward is itself made of g-mm-s pieces; see
:mod:`fusekit.gms.dispatch`. It is not differentiable again (no double backward).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fusekit.errors import expected
from fusekit.gms import dispatch
from fusekit.gms.integrity import verify
from fusekit.gms.memory import remember
from fusekit.gms.operands import check_operands
from fusekit.gms.planning.layout import GMSPlan


def _plan_of(plan: torch.Tensor, n_out: int | None = None) -> GMSPlan:
    """The parsed plan, verified unchanged since it was made (:func:`integrity.verify`)."""
    built = GMSPlan.from_packed(plan)
    verify(built)
    if n_out is not None and built.n_out != n_out:
        raise ValueError(expected("gms", "n_out", f"{built.n_out} (the plan's)", n_out))
    return built


@torch.library.custom_op(
    "fusekit::gms",
    mutates_args=(),
    schema="(Tensor x, Tensor w, Tensor? scale, Tensor plan, SymInt n_out, str strategy) -> Tensor",
)
def gms_op(
    x: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor | None,
    plan: torch.Tensor,
    n_out: int,
    strategy: str,
) -> torch.Tensor:
    """Forward: check, resolve the strategy, run it (see :func:`fusekit.gms.gms`)."""
    built = _plan_of(plan, n_out)
    check_operands(x, w, scale, built)
    return dispatch.forward(dispatch.resolve(strategy, built), x, w, built, scale)


@gms_op.register_fake
def _gms_fake(x, w, scale, plan, n_out, strategy):  # type: ignore[no-untyped-def]
    return x.new_empty(n_out, w.shape[2])


@torch.library.custom_op(
    "fusekit::gms_backward",
    mutates_args=(),
    schema=(
        "(Tensor grad, Tensor x, Tensor w, Tensor? scale, Tensor plan, str strategy, "
        "bool[] needs) -> (Tensor, Tensor, Tensor)"
    ),
)
def gms_backward_op(
    grad: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor | None,
    plan: torch.Tensor,
    strategy: str,
    needs: Sequence[bool],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients w.r.t. ``x``, ``w``, ``scale``; an empty tensor where ``needs`` is False."""
    built = _plan_of(plan)
    flags = (bool(needs[0]), bool(needs[1]), bool(needs[2]) and scale is not None)
    dx, dw, dscale = dispatch.backward(
        dispatch.resolve(strategy, built), grad, x, w, built, scale, flags
    )
    return (
        dx if dx is not None else x.new_empty(0),
        dw if dw is not None else w.new_empty(0),
        dscale if dscale is not None else x.new_empty(0),
    )


@gms_backward_op.register_fake
def _gms_backward_fake(grad, x, w, scale, plan, strategy, needs):  # type: ignore[no-untyped-def]
    return (
        torch.empty_like(x) if needs[0] else x.new_empty(0),
        torch.empty_like(w) if needs[1] else w.new_empty(0),
        torch.empty_like(scale) if needs[2] and scale is not None else x.new_empty(0),
    )


def _setup_context(ctx, inputs, output):  # type: ignore[no-untyped-def]
    x, w, scale, plan, _n_out, strategy = inputs
    ctx.strategy = strategy
    ctx.save_for_backward(x, w, scale, plan)
    if type(plan) is torch.Tensor:  # not a tracing (fake) tensor
        # hold the parsed plan itself until the backward, so what was derived on it (the
        # transposed plan, a mirrored mark) reaches it even when nothing else holds the plan,
        # as for a layer without an indice_key (the parse memo refers to plans on pooled
        # buffers weakly, and holds the last 16 others only)
        ctx.parsed = GMSPlan.from_packed(plan)


def _backward(ctx, grad):  # type: ignore[no-untyped-def]
    x, w, scale, plan = ctx.saved_tensors
    parsed = getattr(ctx, "parsed", None)
    if parsed is not None:  # released here, not when the graph dies
        del ctx.parsed
        remember(parsed)  # what from_packed returns for the buffer, however many plans came since
    needs = [bool(n) for n in ctx.needs_input_grad[:3]]
    dx, dw, dscale = torch.ops.fusekit.gms_backward(grad, x, w, scale, plan, ctx.strategy, needs)
    return (
        dx if needs[0] else None,
        dw if needs[1] else None,
        dscale if needs[2] else None,
        None,
        None,
        None,
    )


gms_op.register_autograd(_backward, setup_context=_setup_context)
