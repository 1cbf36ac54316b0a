r"""gms: the gather-matmul-scatter engine behind RGCN, sparse convolution and Mixture-of-Experts.

.. math::

    Y[d_e, m] \mathrel{\oplus}= c_e \sum_k X[g_e, k] \, W[s_e, k, m],
    \qquad \oplus \in \{\text{sum}, \text{mean}, \text{max}\}

Pipeline: :class:`GMSProblem` (validated indices) → :func:`plan` (sorted, tiled, reused across
calls) → :func:`enumerate_candidates` (orders x dataflows) → :func:`gms` (runs one, with autograd,
as ``torch.ops.fusekit.gms``). Importing this package imports neither torch nor numba.
"""

from fusekit.gms.api import gms as gms
from fusekit.gms.candidates import NAMED_STRATEGIES as NAMED_STRATEGIES
from fusekit.gms.candidates import Dataflow as Dataflow
from fusekit.gms.candidates import Order as Order
from fusekit.gms.candidates import Strategy as Strategy
from fusekit.gms.candidates import enumerate_candidates as enumerate_candidates
from fusekit.gms.problem import GMSPlan as GMSPlan
from fusekit.gms.problem import GMSProblem as GMSProblem
from fusekit.gms.problem import plan as plan
from fusekit.gms.problem import release_buffers as release_buffers

__all__ = [
    "NAMED_STRATEGIES",
    "Dataflow",
    "GMSPlan",
    "GMSProblem",
    "Order",
    "Strategy",
    "enumerate_candidates",
    "gms",
    "plan",
    "release_buffers",
]
