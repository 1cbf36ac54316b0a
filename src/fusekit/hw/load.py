"""Hardware YAML → schema validation (pydantic) → frozen dataclasses.

``load(name_or_path)`` accepts a preset name (``h200``, ``edge``, ``cpu-local`` …) or a YAML file.
Every problem with a file becomes one :class:`~fusekit.errors.ConfigError` line that names the
file, the field path and the problem, e.g.::

    my.yaml: network.hop_latency_cycles: must be greater than 0 (got -5)

Sizes and rates may be written with units: ``228 KiB``, ``141 GB``, ``4.8 TB/s``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fusekit.errors import ConfigError
from fusekit.files import load_yaml, short, top_mapping
from fusekit.hw.accel import Accelerator
from fusekit.hw.cpu_gpu import CPUTarget, GPUTarget
from fusekit.hw.detect import detect
from fusekit.hw.detect_gpu import detect_gpu
from fusekit.hw.schema import SCHEMAS as _SCHEMAS

Hardware = CPUTarget | GPUTarget | Accelerator

#: The name of the preset measured on this machine by :func:`fusekit.hw.detect.detect`.
LOCAL_CPU = "cpu-local"
#: The name of this machine's first CUDA GPU, measured by :func:`fusekit.hw.detect_gpu.detect_gpu`.
LOCAL_GPU = "gpu-local"

#: Problems of one file listed in its error line; the rest are counted.
_MAX_PROBLEMS = 5


def _describe(error: Any) -> str:
    """One error of a pydantic ValidationError as ``path: problem (got value)``."""
    path = ".".join(str(part) for part in error["loc"] if part != "[key]") or "(top level)"
    kind = error["type"]
    if kind == "missing":
        return f"{path}: missing required field"
    if kind == "extra_forbidden":
        return f"{path}: unknown field"
    message = error["msg"]
    message = message.removeprefix("Value error, ").replace("Input should be", "must be")
    return f"{path}: {message} (got {short(error['input'])})"


def parse(data: Any, source: str) -> Hardware:
    """Validate already-parsed YAML data and build the hardware description.

    Args:
        data: the mapping read from a YAML file.
        source: the file name used in error messages.

    Returns:
        A :class:`CPUTarget`, :class:`GPUTarget` or :class:`Accelerator`.

    Raises:
        ConfigError: one line naming ``source``, the field path and every problem found.
    """
    data = top_mapping(data, source)
    kind = data.get("kind")
    if kind not in _SCHEMAS:
        raise ConfigError(
            source, "kind", f"must be one of {', '.join(_SCHEMAS)} (got {short(kind)})"
        )
    try:
        spec = _SCHEMAS[kind].model_validate(data)
    except ValidationError as e:
        problems = [_describe(err) for err in e.errors()]
        first_path, _, first_problem = problems[0].partition(": ")
        rest = "".join(f"; {p}" for p in problems[1:_MAX_PROBLEMS])
        if len(problems) > _MAX_PROBLEMS:
            rest += f"; and {len(problems) - _MAX_PROBLEMS} more"
        raise ConfigError(source, first_path, first_problem + rest) from None
    return spec.build()


def load_file(path: str | Path) -> Hardware:
    """Load a hardware description from a YAML file.

    Raises:
        ConfigError: the file is missing, is not YAML (or breaks a bound of
            :func:`fusekit.files.load_yaml`), or does not validate.
    """
    return parse(load_yaml(path), str(path))


def preset_names() -> list[str]:
    """Names accepted by :func:`load`: ``cpu-local``, ``gpu-local`` and the YAML presets."""
    folder = resources.files("fusekit.hw") / "presets"
    names = sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )
    return [LOCAL_CPU, LOCAL_GPU, *names]


def load(name_or_path: str | Path) -> Hardware:
    """Load a preset by name, the measured local CPU, or a YAML file.

    Args:
        name_or_path: ``"cpu-local"`` (measured by :func:`fusekit.hw.detect.detect`, cached),
            ``"gpu-local"`` (the first CUDA device, measured and cached), a
            preset name such as ``"h200"`` or ``"edge"`` (case-insensitive), or a path to a
            ``.yaml`` file.

    Returns:
        The hardware description.

    Raises:
        ConfigError: unknown name, unreadable or invalid file.
    """
    text = str(name_or_path)
    if text.lower() == LOCAL_CPU:
        return detect()
    if text.lower() == LOCAL_GPU:
        return detect_gpu()
    preset = resources.files("fusekit.hw") / "presets" / f"{text.lower()}.yaml"
    if "/" not in text and not text.endswith((".yaml", ".yml")) and preset.is_file():
        with resources.as_file(preset) as file:
            return load_file(file)
    if Path(text).suffix in (".yaml", ".yml") or Path(text).exists():
        return load_file(text)
    raise ConfigError(text, "", f"not a preset ({', '.join(preset_names())}) nor a YAML file")
