"""Hardware descriptions: CPU and GPU targets, spatial accelerators, presets and detection.

The names are imported, not loaded lazily through :func:`fusekit.lazy.lazy_getattr`: ``detect``
and ``load`` share their modules' names, and a loaded submodule would shadow them. No module
here imports torch at import.
"""

from fusekit.hw.accel import Accelerator as Accelerator
from fusekit.hw.accel import ArchLevel as ArchLevel
from fusekit.hw.cpu_gpu import CPUTarget as CPUTarget
from fusekit.hw.cpu_gpu import GPUTarget as GPUTarget
from fusekit.hw.cpu_gpu import Target as Target
from fusekit.hw.detect import detect as detect
from fusekit.hw.load import Hardware as Hardware
from fusekit.hw.load import load as load
from fusekit.hw.load import load_file as load_file
from fusekit.hw.load import preset_names as preset_names

__all__ = [
    "Accelerator",
    "ArchLevel",
    "CPUTarget",
    "GPUTarget",
    "Hardware",
    "Target",
    "detect",
    "load",
    "load_file",
    "preset_names",
]
