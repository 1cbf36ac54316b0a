r"""The public verb: ``gms(x, w, plan, scale, strategy)``.

.. math::

    Y[d_e, m] \mathrel{\oplus}= c_e \sum_k X[g_e, k] \, W[s_e, k, m]

Importing this module registers ``torch.ops.fusekit.gms`` (see :mod:`fusekit.gms.ops`).
"""

from __future__ import annotations

import torch

from fusekit.errors import expected
from fusekit.gms import ops  # noqa: F401  (registers torch.ops.fusekit.gms)
from fusekit.gms.candidates import Dataflow, Order, Strategy
from fusekit.gms.operands import check_operands
from fusekit.gms.planning.layout import GMSPlan


def gms(
    x: torch.Tensor,
    w: torch.Tensor,
    plan: GMSPlan,
    scale: torch.Tensor | None = None,
    strategy: str | Strategy | Dataflow | Order = "auto",
) -> torch.Tensor:
    """Gather rows of ``x``, multiply each by its segment's weight matrix, reduce into rows.

    Differentiable in ``x``, ``w`` and ``scale``; runs under ``torch.compile(fullgraph=True)``
    and ``torch.export`` through ``torch.ops.fusekit.gms``.

    Args:
        x: ``[N_in, K]`` float32, float64 or bfloat16 (CPU kernels compute bfloat16 in float32),
            contiguous, ``N_in >= plan.n_in``.
        w: ``[S, K, M]`` same dtype and device, contiguous, ``S >= plan.num_segments``.
        plan: :func:`fusekit.gms.plan` of the indices, on ``x``'s device.
        scale: ``[E]`` per-pair factor ``c`` in the original pair order, or None.
        strategy: ``"auto"`` (the order with the fewest GEMM rows, ``(GMS)seg``), a dataflow
            (``"G-Mseg-S"``, ``"(GM)seg-S"``, ``"G-(MS)seg"``, ``"(GMS)seg"``), an order
            (``"transform-first"``, ``"aggregate-first"``) or ``"order/dataflow"``.

    Returns:
        ``Y`` of shape ``[plan.n_out, M]``, dtype of ``x``.

    Raises:
        TypeError: an operand has the wrong type or dtype.
        ValueError: a shape, device or layout is wrong, or the strategy is unknown or not valid
            for the plan's reduce.
    """
    if not isinstance(plan, GMSPlan):
        raise TypeError(expected("gms", "plan", "a GMSPlan (see fusekit.gms.plan)", type(plan)))
    check_operands(x, w, scale, plan)
    name = strategy if isinstance(strategy, str) else Strategy.parse(strategy).name
    out: torch.Tensor = torch.ops.fusekit.gms(x, w, scale, plan.packed, plan.n_out, name)
    return out
