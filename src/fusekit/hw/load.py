"""Hardware YAML → schema validation (pydantic) → frozen dataclasses.

``load(name_or_path)`` accepts a preset name (``h200``, ``edge``, ``cpu-local`` …) or a YAML file.
Every problem with a file becomes one :class:`~fusekit.errors.ConfigError` line that names the
file, the field path and the problem, e.g.::

    my.yaml: network.hop_latency_cycles: must be greater than 0 (got -5)

Sizes and rates may be written with units: ``228 KiB``, ``141 GB``, ``4.8 TB/s``.
"""

from __future__ import annotations

import math
import re
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from fusekit.errors import ConfigError
from fusekit.files import load_yaml, short, top_mapping
from fusekit.hw.accel import Accelerator, MemoryLevel, Network, SystolicArrays
from fusekit.hw.cpu_gpu import CPUTarget, GPUTarget

Hardware = CPUTarget | GPUTarget | Accelerator

#: The name of the preset measured on this machine by :func:`fusekit.hw.detect.detect`.
LOCAL_CPU = "cpu-local"
#: The name of this machine's first CUDA GPU, measured by :func:`fusekit.hw.detect_gpu.detect_gpu`.
LOCAL_GPU = "gpu-local"

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
#: Sizes above this do not fit a signed 64-bit integer.
_MAX_SIZE = 2**63
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)\s*(/s)?\s*$")


def _parse_quantity(value: Any, rate: bool) -> Any:
    """Turn ``"32 KiB"`` into 32768 and ``"4.8 TB/s"`` into 4.8e12; numbers pass through."""
    if not isinstance(value, str):
        return value
    match = _QUANTITY.match(value)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS or bool(match.group(3)) != rate:
        want = "a rate such as '4.8 TB/s'" if rate else "a size such as '32 KiB'"
        raise ValueError(f"expected a number or {want}")
    number = float(match.group(1)) * _UNITS[unit]
    if not math.isfinite(number):
        raise ValueError("expected a finite number")
    if not rate and number >= _MAX_SIZE:
        raise ValueError("expected a size below 2**63 bytes")
    return number if rate else int(number)


Size = Annotated[
    int, BeforeValidator(lambda v: _parse_quantity(v, rate=False)), Field(gt=0, lt=_MAX_SIZE)
]
Rate = Annotated[float, BeforeValidator(lambda v: _parse_quantity(v, rate=True)), Field(gt=0)]
Positive = Annotated[float, Field(gt=0)]
PositiveInt = Annotated[int, Field(gt=0)]
Dtype = Literal["fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8"]


class _Schema(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class _ComputeSchema(_Schema):
    name: str
    description: str
    source: str
    peak_flops_per_s: dict[Dtype, Positive] = Field(min_length=1)
    mem_bw_bytes_per_s: Rate
    mem_bytes: Size
    launch_overhead_s: Positive


class CPUSchema(_ComputeSchema):
    """YAML form of :class:`~fusekit.hw.cpu_gpu.CPUTarget`."""

    kind: Literal["cpu"]
    cores: PositiveInt
    threads: PositiveInt
    l1d_bytes: Size
    l2_bytes: Size
    l3_bytes: Annotated[
        int, BeforeValidator(lambda v: _parse_quantity(v, False)), Field(ge=0, lt=_MAX_SIZE)
    ]
    simd_width_bits: PositiveInt

    def build(self) -> CPUTarget:
        """The frozen dataclass."""
        fields = self.model_dump(exclude={"kind"})
        fields["peak_flops_per_s"] = MappingProxyType(fields["peak_flops_per_s"])
        return CPUTarget(**fields)


class GPUSchema(_ComputeSchema):
    """YAML form of :class:`~fusekit.hw.cpu_gpu.GPUTarget`."""

    kind: Literal["gpu"]
    sm_count: PositiveInt
    shared_mem_per_sm_bytes: Size
    l2_bytes: Size
    registers_per_sm: PositiveInt
    max_threads_per_sm: PositiveInt
    warp_size: PositiveInt
    clock_hz: Positive

    def build(self) -> GPUTarget:
        """The frozen dataclass."""
        fields = self.model_dump(exclude={"kind"})
        fields["peak_flops_per_s"] = MappingProxyType(fields["peak_flops_per_s"])
        return GPUTarget(**fields)


class _MeshSchema(_Schema):
    rows: PositiveInt
    cols: PositiveInt


class _SystolicSchema(_Schema):
    grid: tuple[PositiveInt, PositiveInt]
    pe: tuple[PositiveInt, PositiveInt]


class _ClusterSchema(_Schema):
    systolic_arrays: _SystolicSchema
    simd_width: PositiveInt


class _BufferSchema(_Schema):
    size_bytes: Size
    read_pj: Positive
    write_pj: Positive
    bw_bytes_per_cycle: Positive | None = None
    double_buffered: bool


class _BuffersSchema(_Schema):
    input: _BufferSchema
    weight: _BufferSchema
    output: _BufferSchema
    global_: _BufferSchema = Field(alias="global")


class _DramSchema(_Schema):
    bw_words_per_cycle: Positive
    read_pj: Positive
    write_pj: Positive


class _NetworkSchema(_Schema):
    topology: Literal["mesh", "torus", "ring"]
    link_bw_bytes_per_cycle: Positive
    hop_latency_cycles: PositiveInt
    channel_bits: PositiveInt
    in_network_broadcast: bool
    in_network_reduction: bool
    hop_pj_per_byte: Positive


class _EnergySchema(_Schema):
    mac: Positive
    simd: dict[str, Positive] = Field(min_length=1)


class AcceleratorSchema(_Schema):
    """YAML form of :class:`~fusekit.hw.accel.Accelerator`."""

    kind: Literal["accelerator"]
    name: str
    description: str
    source: str
    clock_hz: Positive
    word_bytes: PositiveInt
    mesh: _MeshSchema
    cluster: _ClusterSchema
    buffers: _BuffersSchema
    dram: _DramSchema
    network: _NetworkSchema
    energy_pj: _EnergySchema
    simd_cycles: dict[str, PositiveInt] = Field(min_length=1)
    comet_arch: dict[str, Any] | None = None

    def build(self) -> Accelerator:
        """The frozen dataclass."""
        levels = [
            MemoryLevel(name=name, **buf.model_dump())
            for name, buf in (
                ("input", self.buffers.input),
                ("weight", self.buffers.weight),
                ("output", self.buffers.output),
                ("global", self.buffers.global_),
            )
        ]
        levels.append(
            MemoryLevel(
                name="dram",
                size_bytes=0,
                read_pj=self.dram.read_pj,
                write_pj=self.dram.write_pj,
                bw_bytes_per_cycle=self.dram.bw_words_per_cycle * self.word_bytes,
                double_buffered=False,
            )
        )
        arrays = self.cluster.systolic_arrays
        return Accelerator(
            name=self.name,
            description=self.description,
            source=self.source,
            clock_hz=self.clock_hz,
            word_bytes=self.word_bytes,
            mesh_rows=self.mesh.rows,
            mesh_cols=self.mesh.cols,
            systolic=SystolicArrays(*arrays.grid, *arrays.pe),
            simd_width=self.cluster.simd_width,
            levels=tuple(levels),
            network=Network(**self.network.model_dump()),
            mac_pj=self.energy_pj.mac,
            simd_op_pj=MappingProxyType(dict(self.energy_pj.simd)),
            simd_op_cycles=MappingProxyType(dict(self.simd_cycles)),
            comet_arch=MappingProxyType(self.comet_arch) if self.comet_arch else None,
        )


_SCHEMAS: dict[str, type[CPUSchema | GPUSchema | AcceleratorSchema]] = {
    "cpu": CPUSchema,
    "gpu": GPUSchema,
    "accelerator": AcceleratorSchema,
}


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
        from fusekit.hw.detect import detect

        return detect()
    if text.lower() == LOCAL_GPU:
        from fusekit.hw.detect_gpu import detect_gpu

        return detect_gpu()
    preset = resources.files("fusekit.hw") / "presets" / f"{text.lower()}.yaml"
    if "/" not in text and not text.endswith((".yaml", ".yml")) and preset.is_file():
        with resources.as_file(preset) as file:
            return load_file(file)
    if Path(text).suffix in (".yaml", ".yml") or Path(text).exists():
        return load_file(text)
    raise ConfigError(text, "", f"not a preset ({', '.join(preset_names())}) nor a YAML file")
