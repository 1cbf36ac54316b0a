r"""gms: the gather-matmul-scatter engine behind RGCN, sparse convolution and Mixture-of-Experts.

.. math::

    Y[d_e, m] \mathrel{\oplus}= c_e \sum_k X[g_e, k] \, W[s_e, k, m],
    \qquad \oplus \in \{\text{sum}, \text{mean}, \text{max}\}

Pipeline: :class:`GMSProblem` (validated indices) → :func:`plan` (sorted, tiled, reused across
calls) → :func:`enumerate_candidates` (orders x dataflows) → :func:`gms` (runs one, with autograd,
as ``torch.ops.fusekit.gms``).

Importing this package imports neither torch nor numba; the names below load on first use.
"""

from __future__ import annotations

from fusekit.lazy import lazy_getattr

#: Public name -> the module of this package that defines it.
_WHERE = {
    "NAMED_STRATEGIES": "candidates",
    "Dataflow": "candidates",
    "GMSPlan": "planning.layout",
    "GMSProblem": "problem",
    "Order": "candidates",
    "Strategy": "candidates",
    "enumerate_candidates": "candidates",
    "gms": "api",
    "gather_rows": "segments",
    "reduce_rows": "segments",
    "segment_mm": "segments",
    "segment_outer_mm": "segments",
    "ExpertSegments": "routing",
    "check_routing": "routing",
    "swiglu_experts": "experts",
    "decode_applies": "fused_experts",
    "experts_decode": "fused_experts",
    "plan": "planning.build",
    "release_buffers": "memory",
    "Constraints": "selector",
    "select": "selector",
    "target_for": "target",
    "Backend": "backends",
    "backend_for": "backends",
}

__all__ = sorted(_WHERE)


__getattr__ = lazy_getattr(__name__, _WHERE)
