"""``from_spconv``: an spconv 2.x module tree as fusekit's, with the same ``state_dict``.

The tree is copied (the spconv module is left as it was) and in the copy every spconv layer is
replaced by its fusekit twin, under the same name:

============================== ==========================================
spconv (``spconv.pytorch``)    fusekit (``fusekit.nn``)
============================== ==========================================
``SubMConv3d``                 :class:`~fusekit.nn.conv.SubMConv3d`
``SparseConv3d``               :class:`~fusekit.nn.conv.SparseConv3d`
``SparseInverseConv3d``        :class:`~fusekit.nn.conv.SparseInverseConv3d`
``SparseConvTranspose3d``      :class:`~fusekit.nn.conv.SparseConvTranspose3d`
``SparseSequential``           :class:`~fusekit.nn.sequential.SparseSequential`
``SparseBatchNorm``            ``torch.nn.BatchNorm1d`` (same buffers)
``SparseReLU``                 ``torch.nn.ReLU``
``SparseIdentity``             ``torch.nn.Identity``
============================== ==========================================

Other modules (``nn.BatchNorm1d``, ``nn.ReLU``, user modules holding spconv children) stay,
their children converted. Each convolution keeps its kernel size, stride, padding, dilation,
bias and ``indice_key`` and loads its twin's weights, so ``converted.state_dict()`` has the
keys and values of ``module.state_dict()`` and spconv checkpoints load into it. A user module's
``forward`` that builds an ``spconv.SparseConvTensor`` keeps working: the fusekit layers take
one, and their :class:`SparseTensor` answers the calls such forwards make (``features``,
``indices``, ``replace_feature``, ``dense``).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any

import torch

from fusekit.errors import expected
from fusekit.nn.conv import SparseConv3d, SparseConvTranspose3d, SparseInverseConv3d, SubMConv3d
from fusekit.nn.sequential import SparseSequential

_CONVS: dict[str, type[torch.nn.Module]] = {
    "SubMConv3d": SubMConv3d,
    "SparseConv3d": SparseConv3d,
    "SparseInverseConv3d": SparseInverseConv3d,
    "SparseConvTranspose3d": SparseConvTranspose3d,
}
_FEATURE_WISE: dict[str, type[torch.nn.Module]] = {
    "SparseBatchNorm": torch.nn.BatchNorm1d,
    "SparseReLU": torch.nn.ReLU,
    "SparseIdentity": torch.nn.Identity,
}


def _is_spconv(module: torch.nn.Module) -> bool:
    return type(module).__module__.startswith("spconv.")


def _conv(module: Any, path: str, strategy: str) -> torch.nn.Module:
    """The fusekit twin of an spconv convolution, with its parameters loaded."""
    name = type(module).__name__
    if module.ndim != 3 or tuple(module.output_padding) != (0, 0, 0):
        raise ValueError(
            expected("from_spconv", path, "a 3-D convolution without output_padding", name)
        )
    common: dict[str, Any] = {
        "bias": module.bias is not None,
        "strategy": strategy,
        "device": module.weight.device,
        "dtype": module.weight.dtype,
    }
    size = tuple(module.kernel_size)
    twin: torch.nn.Module
    if name == "SparseInverseConv3d":
        twin = SparseInverseConv3d(
            module.in_channels, module.out_channels, size, module.indice_key, **common
        )
    else:
        twin = _CONVS[name](
            module.in_channels,
            module.out_channels,
            size,
            tuple(module.stride),
            tuple(module.padding),
            tuple(module.dilation),
            indice_key=module.indice_key,
            **common,
        )
    state = module.state_dict()
    state.pop("max_num_voxels_during_training", None)  # spconv's voxel-count record
    twin.load_state_dict(state)
    return twin.train(module.training)


def _leaf(module: torch.nn.Module, path: str, strategy: str) -> torch.nn.Module | None:
    """The fusekit twin of an spconv leaf, or ``None`` for a module to walk into."""
    name = type(module).__name__
    if not _is_spconv(module):
        return None
    if name in _CONVS:
        return _conv(module, path, strategy)
    if name == "SparseSequential":
        return SparseSequential(OrderedDict(module._modules)).train(module.training)
    if name in _FEATURE_WISE:  # subclasses of the torch modules: same state, plain forward
        twin = copy.copy(module)
        twin.__class__ = _FEATURE_WISE[name]
        return twin
    raise TypeError(expected("from_spconv", path, "an spconv module fusekit has", name))


def _walk(module: torch.nn.Module, path: str, strategy: str) -> torch.nn.Module:
    twin = _leaf(module, path, strategy)
    if twin is None:
        twin = module
    for name, child in list(twin.named_children()):
        where = f"{path}.{name}" if path else name
        twin._modules[name] = _walk(child, where, strategy)
    return twin


def from_spconv(module: torch.nn.Module, strategy: str = "auto") -> torch.nn.Module:
    """A copy of ``module`` with every spconv layer replaced by its fusekit twin.

    Args:
        module: an spconv layer, ``SparseSequential``, or any ``torch.nn.Module`` holding them.
        strategy: the converted convolutions' gms strategy (``"auto"``: the selector's).

    Returns:
        The converted copy: the same module names, ``state_dict`` keys and values.

    Raises:
        TypeError: ``module`` is not a ``torch.nn.Module``, or holds an spconv module fusekit
            has no twin for (pooling, 1-, 2- or 4-D convolutions), named by its path.
        ValueError: an spconv convolution fusekit cannot run as it is (``output_padding``).
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(
            expected("from_spconv", "module", "a torch.nn.Module", type(module).__name__)
        )
    return _walk(copy.deepcopy(module), "", strategy)
