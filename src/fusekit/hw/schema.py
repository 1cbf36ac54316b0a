"""The schemas of hardware YAML (pydantic): fields, units, bounds, and what each builds.

Sizes and rates may be written with units: ``228 KiB``, ``141 GB``, ``4.8 TB/s``. Read by
:mod:`fusekit.hw.load` (files and presets) and :mod:`fusekit.hw.detect` (its cache, with strict
types), so that both check the same fields the same way.
"""

from __future__ import annotations

import math
import re
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from fusekit.hw.accel import Accelerator, arch_levels
from fusekit.hw.cpu_gpu import CPUTarget, GPUTarget

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


class AcceleratorSchema(_Schema):
    """YAML form of :class:`~fusekit.hw.accel.Accelerator`: COMET's arch plus a name and a clock."""

    kind: Literal["accelerator"]
    name: str
    description: str
    source: str
    clock_hz: Positive
    comet_arch: dict[str, Any]

    @field_validator("comet_arch")
    @classmethod
    def _levels(cls, arch: dict[str, Any]) -> dict[str, Any]:
        arch_levels(arch)  # raises ValueError naming the entry and the key
        return arch

    def build(self) -> Accelerator:
        """The frozen dataclass."""
        return Accelerator(
            name=self.name,
            description=self.description,
            source=self.source,
            clock_hz=self.clock_hz,
            comet_arch=MappingProxyType(self.comet_arch),
            levels=arch_levels(self.comet_arch),
        )


SCHEMAS: dict[str, type[CPUSchema | GPUSchema | AcceleratorSchema]] = {
    "cpu": CPUSchema,
    "gpu": GPUSchema,
    "accelerator": AcceleratorSchema,
}
