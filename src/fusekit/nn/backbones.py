"""Published sparse 3-D backbones, built from any spconv-compatible set of layers.

``voxel_backbone_8x`` is the 3-D backbone of SECOND (Yan et al. 2018) and CenterPoint (Yin et
al. 2021) as OpenPCDet configures it (``VoxelBackBone8x``): a SubM input block at 16 channels,
then three stages that each halve the grid with a strided ``SparseConv3d`` and refine it with two
``SubMConv3d`` blocks (32, 64, 64 channels), then a ``(3, 1, 1)`` convolution of stride
``(2, 1, 1)`` to 128 channels that folds the height. Every convolution is followed by
BatchNorm1d (eps 1e-3, momentum 0.01) and ReLU; output stride 8 in y and x::

    input  [N, C] on (Z, Y, X)
    subm1  SubM 3   C  -> 16,  SubM 3  16 -> 16
    2x     Conv 3/2 16 -> 32,  SubM 3 x2            (indice keys spconv2, subm2)
    4x     Conv 3/2 32 -> 64,  SubM 3 x2            (spconv3, subm3)
    8x     Conv 3/2 64 -> 64 (padding (0, 1, 1)), SubM 3 x2   (spconv4, subm4)
    out    Conv (3, 1, 1)/(2, 1, 1) 64 -> 128       (spconv_down2)

The same function builds it from fusekit's layers (the default) or from spconv's
(``voxel_backbone_8x(layers=spconv.pytorch)``), so that a network built for spconv can be
converted by :func:`fusekit.nn.from_spconv` and checked against itself.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import torch

from fusekit.errors import expected

#: The channels of the input block and of the three downsampling stages.
STAGE_CHANNELS = (16, 32, 64, 64)
#: The backbone's output channels.
OUT_CHANNELS = 128


def voxel_backbone_8x(in_channels: int = 4, layers: ModuleType | None = None) -> torch.nn.Module:
    """OpenPCDet's ``VoxelBackBone8x`` as a ``SparseSequential`` (module docstring).

    Args:
        in_channels: features per input voxel (4: x, y, z, intensity of the mean point).
        layers: a namespace with ``SubMConv3d``, ``SparseConv3d`` and ``SparseSequential``:
            ``fusekit.nn`` (default) or ``spconv.pytorch``.

    Returns:
        The backbone, in training mode, parameters initialised by the layers' own rules.

    Raises:
        ValueError: ``in_channels`` is not a positive int.
    """
    if isinstance(in_channels, bool) or not isinstance(in_channels, int) or in_channels < 1:
        raise ValueError(
            expected("voxel_backbone_8x", "in_channels", "a positive int", in_channels)
        )
    lib: Any = layers if layers is not None else importlib.import_module("fusekit.nn")

    def block(cin: int, cout: int, key: str, **conv: Any) -> Any:
        if conv:
            op = lib.SparseConv3d(cin, cout, bias=False, indice_key=key, **conv)
        else:
            op = lib.SubMConv3d(cin, cout, 3, padding=1, bias=False, indice_key=key)
        norm = torch.nn.BatchNorm1d(cout, eps=1e-3, momentum=0.01)
        return lib.SparseSequential(op, norm, torch.nn.ReLU())

    def stage(cin: int, cout: int, n: int, padding: int | tuple[int, int, int]) -> Any:
        down = block(cin, cout, f"spconv{n}", kernel_size=3, stride=2, padding=padding)
        return lib.SparseSequential(
            down, block(cout, cout, f"subm{n}"), block(cout, cout, f"subm{n}")
        )

    c1, c2, c3, c4 = STAGE_CHANNELS
    net: torch.nn.Module = lib.SparseSequential(
        block(in_channels, c1, "subm1"),  # conv_input
        block(c1, c1, "subm1"),  # conv1
        stage(c1, c2, 2, 1),  # conv2: 2x
        stage(c2, c3, 3, 1),  # conv3: 4x
        stage(c3, c4, 4, (0, 1, 1)),  # conv4: 8x
        block(c4, OUT_CHANNELS, "spconv_down2", kernel_size=(3, 1, 1), stride=(2, 1, 1),
              padding=0),  # conv_out
    )  # fmt: skip
    return net
