"""Drop-in PyTorch layers on the gms engine: RGCN, sparse 3-D convolution, Mixture-of-Experts.

Each layer turns its indices (edges and relations, voxel kernel maps, routed tokens) into a
:class:`fusekit.gms.GMSProblem`, plans it once per index tensor, asks the gms selector for a
dataflow and configuration, and runs :func:`fusekit.gms.gms` (differentiable).
"""

from fusekit.nn.moe import MoE, from_mixtral, swap_mixtral_moe
from fusekit.nn.rgcn import RGCNConv

__all__ = ["MoE", "RGCNConv", "from_mixtral", "swap_mixtral_moe"]
