"""The hardware a device's gms problems are chosen for: one measured target per device.

The selector (:func:`fusekit.gms.selector.select`) and the tuner rank configurations on a
:class:`~fusekit.hw.CPUTarget` or :class:`~fusekit.hw.GPUTarget`; this module says which one a
device is. The CPU is :func:`fusekit.hw.detect` (measured once per machine, cached on disk), a
CUDA device is :func:`fusekit.hw.detect_gpu.detect_gpu` of its index (likewise), never a preset
standing in for whatever GPU is there. Each device is measured at most once per process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusekit.errors import expected
from fusekit.hw import CPUTarget, GPUTarget
from fusekit.hw.detect import detect
from fusekit.hw.detect_gpu import detect_gpu

if TYPE_CHECKING:
    import torch

_TARGETS: dict[str, CPUTarget | GPUTarget] = {}


def target_for(device: torch.device | str) -> CPUTarget | GPUTarget:
    """The measured target of ``device`` (measured once per process and device).

    Args:
        device: a CPU or CUDA device (``"cuda"`` alone is ``cuda:0``).

    Returns:
        :func:`fusekit.hw.detect` for the CPU, ``detect_gpu(index)`` for a CUDA device.

    Raises:
        ValueError: a device type gms chooses nothing for (neither ``cpu`` nor ``cuda``).
    """
    kind, _, index_text = str(device).partition(":")
    index = int(index_text) if index_text else 0
    if kind not in ("cpu", "cuda"):
        raise ValueError(expected("target_for", "device", "a cpu or cuda device", str(device)))
    key = f"{kind}:{index}"
    if key not in _TARGETS:
        _TARGETS[key] = detect_gpu(index) if kind == "cuda" else detect()
    return _TARGETS[key]
