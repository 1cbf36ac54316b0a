"""The per-call operands ``x``, ``w`` and ``scale`` of a planned g-mm-s, checked in O(1).

The plan fixes the indices; each call brings ``x[N_in, K]``, ``w[S, K, M]`` and an optional
``scale[E]``. :func:`check_operands` reads no tensor data: shapes, dtypes, devices and layouts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fusekit.errors import expected

if TYPE_CHECKING:
    from fusekit.gms.planning.layout import GMSPlan

_FLOAT_DTYPES = ("torch.float32", "torch.float64", "torch.bfloat16")


def check_operands(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, plan: GMSPlan
) -> None:
    """Check the per-call operands against a plan; O(1), no tensor data is read.

    Args:
        x: ``[N_in, K]`` float32/float64/bfloat16, contiguous, ``N_in >= plan.n_in``.
        w: ``[S, K, M]`` same dtype and device, contiguous, ``S >= plan.num_segments``.
        scale: ``None`` or ``[E]`` same dtype and device, contiguous (original pair order).
        plan: the plan of the indices.

    Raises:
        TypeError: an operand is not a tensor or has the wrong dtype.
        ValueError: a shape, device or layout is wrong.
    """
    for name, t in (("x", x), ("w", w), ("scale", scale)):
        if t is None and name == "scale":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(expected("gms", name, "a torch.Tensor", type(t).__name__))
    if str(x.dtype) not in _FLOAT_DTYPES:
        raise TypeError(
            expected("gms", "x", "float32, float64 or bfloat16", str(x.dtype).split(".")[-1])
        )
    dtype = str(x.dtype).split(".")[-1]
    for name, t in (("w", w), ("scale", scale)):
        if t is not None and t.dtype != x.dtype:
            raise TypeError(expected("gms", name, f"{dtype} like 'x'", str(t.dtype).split(".")[-1]))
    if x.dim() != 2:
        raise ValueError(expected("gms", "x", "2-D [N_in, K]", f"shape {tuple(x.shape)}"))
    if w.dim() != 3:
        raise ValueError(expected("gms", "w", "3-D [S, K, M]", f"shape {tuple(w.shape)}"))
    if w.shape[1] != x.shape[1]:
        raise ValueError(
            expected(
                "gms", "w", f"of shape [S, {x.shape[1]}, M] (K of 'x')", f"shape {tuple(w.shape)}"
            )
        )
    if x.shape[0] < plan.n_in:
        raise ValueError(
            expected("gms", "x", f"at least {plan.n_in} rows (max gather + 1)", x.shape[0])
        )
    if w.shape[0] < plan.num_segments:
        raise ValueError(
            expected(
                "gms",
                "w",
                f"at least {plan.num_segments} segments (max segment + 1)",
                f"shape {tuple(w.shape)}",
            )
        )
    if scale is not None and (scale.dim() != 1 or scale.shape[0] != plan.num_pairs):
        raise ValueError(
            expected(
                "gms", "scale", f"1-D of length {plan.num_pairs}", f"shape {tuple(scale.shape)}"
            )
        )
    for name, t in (("w", w), ("scale", scale)):
        if t is not None and t.device != x.device:
            raise ValueError(expected("gms", name, f"on {x.device} like 'x'", str(t.device)))
    if plan.device != x.device:
        raise ValueError(expected("gms", "plan", f"on {x.device} like 'x'", str(plan.device)))
    for name, t in (("x", x), ("w", w), ("scale", scale)):
        if t is not None and not t.is_contiguous():
            raise ValueError(expected("gms", name, "contiguous", f"strides {t.stride()}"))
