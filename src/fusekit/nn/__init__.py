"""Drop-in PyTorch layers on the gms engine: RGCN, sparse 3-D convolution, Mixture-of-Experts.

Each layer turns its indices (edges and relations, voxel kernel maps, routed tokens) into a
:class:`fusekit.gms.GMSProblem`, plans it once per index tensor, asks the gms selector for a
dataflow and configuration, and runs :func:`fusekit.gms.gms` (differentiable).

Importing this package imports neither torch nor numba; the names below load on first use.
"""

from __future__ import annotations

from fusekit.lazy import lazy_getattr

_WHERE = {
    "FastRGCNConv": "rgcn_fast",
    "MoE": "moe",
    "from_mixtral": "moe",
    "swap_mixtral_moe": "hf",
    "use_fusekit_experts": "hf",
    "UnsupportedExperts": "hf",
    "fusekit_experts_forward": "hf",
    "RGCNConv": "rgcn",
    "SparseConv3d": "conv",
    "SparseConvTranspose3d": "conv",
    "SparseInverseConv3d": "conv",
    "SparseModule": "sparse_tensor",
    "SparseSequential": "sequential",
    "SparseTensor": "sparse_tensor",
    "SubMConv3d": "conv",
    "conv_reference": "conv",
    "from_spconv": "convert",
    "voxel_backbone_8x": "backbones",
}

__all__ = sorted(_WHERE)


__getattr__ = lazy_getattr(__name__, _WHERE)
