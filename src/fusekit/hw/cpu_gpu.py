"""CPU and GPU targets: the figures a roofline cost model needs.

A target answers two questions for a cost model: how fast can it compute (peak FLOP/s per dtype)
and how fast can it move data (memory bandwidth, cache sizes), plus the fixed cost of starting a
kernel. The roofline bound of a kernel that does ``F`` FLOPs and moves ``B`` bytes is::

    t >= max(F / peak_flops_per_s[dtype], B / mem_bw_bytes_per_s) + launch_overhead_s

(Williams, Waterman and Patterson, "Roofline", CACM 2009).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal


def plain(obj: Any) -> Any:
    """Frozen dataclasses and read-only mappings as JSON-ready dicts, lists and scalars."""
    if hasattr(obj, "__dataclass_fields__"):
        return {f.name: plain(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, tuple | list):
        return [plain(v) for v in obj]
    return obj


#: dtype names used as keys of ``peak_flops_per_s`` (torch spelling, short form).
DTYPES: tuple[str, ...] = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")


@dataclass(frozen=True, slots=True)
class _ComputeTarget:
    """Fields shared by CPU and GPU targets; see :class:`CPUTarget` and :class:`GPUTarget`."""

    name: str
    description: str
    source: str
    peak_flops_per_s: Mapping[str, float]
    mem_bw_bytes_per_s: float
    mem_bytes: int
    launch_overhead_s: float

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for a dtype.

        Args:
            dtype: a key of :data:`DTYPES`, e.g. ``"fp32"``.

        Returns:
            The dense (no structured sparsity) peak in FLOP/s.

        Raises:
            KeyError: the target has no figure for that dtype; the message lists those it has.
        """
        try:
            return self.peak_flops_per_s[dtype]
        except KeyError:
            have = ", ".join(sorted(self.peak_flops_per_s))
            raise KeyError(
                f"{self.name}: expected 'dtype' to be one of {have} (got {dtype!r})"
            ) from None

    def roofline_s(self, flops: float, dram_bytes: float, dtype: str = "fp32") -> float:
        """Lower bound on a kernel's time: max(compute, memory) plus one launch.

        Args:
            flops: floating-point operations of the kernel.
            dram_bytes: bytes it must move to and from main memory.
            dtype: the dtype its arithmetic runs in.

        Returns:
            ``max(flops / peak(dtype), dram_bytes / mem_bw_bytes_per_s) + launch_overhead_s``.
        """
        compute_s = flops / self.peak(dtype)
        memory_s = dram_bytes / self.mem_bw_bytes_per_s
        return max(compute_s, memory_s) + self.launch_overhead_s

    def ridge_flops_per_byte(self, dtype: str = "fp32") -> float:
        """Arithmetic intensity at which the roofline turns from memory- to compute-bound."""
        return self.peak(dtype) / self.mem_bw_bytes_per_s

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-ready), with ``kind`` first."""
        return {"kind": self.kind, **plain(self)}

    @property
    def kind(self) -> str:
        """``"cpu"`` or ``"gpu"``."""
        raise AttributeError("kind is defined by CPUTarget and GPUTarget")

    def fingerprint(self) -> str:
        """A short stable hash of every figure, used to key measurement caches."""
        blob = json.dumps(self.to_dict(), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class CPUTarget(_ComputeTarget):
    """A multi-core CPU.

    Attributes:
        cores: physical cores the kernels may use.
        threads: hardware threads (``cores`` times SMT ways).
        l1d_bytes: L1 data cache per core.
        l2_bytes: L2 cache per core.
        l3_bytes: last-level cache shared by all cores (0 if none).
        simd_width_bits: vector register width (128 SSE/NEON, 256 AVX2, 512 AVX-512).
    """

    cores: int
    threads: int
    l1d_bytes: int
    l2_bytes: int
    l3_bytes: int
    simd_width_bits: int

    @property
    def kind(self) -> Literal["cpu"]:
        """Always ``"cpu"``."""
        return "cpu"

    @property
    def parallel_units(self) -> int:
        """Cores, the unit a CPU kernel parallelises over."""
        return self.cores

    @property
    def last_level_cache_bytes(self) -> int:
        """L3 if present, else the L2 of all cores together."""
        return self.l3_bytes or self.l2_bytes * self.cores


@dataclass(frozen=True, slots=True)
class GPUTarget(_ComputeTarget):
    """An NVIDIA GPU.

    Attributes:
        sm_count: streaming multiprocessors.
        shared_mem_per_sm_bytes: largest shared memory one SM can give its blocks.
        l2_bytes: L2 cache of the whole device.
        registers_per_sm: 32-bit registers per SM.
        max_threads_per_sm: resident threads per SM.
        warp_size: threads per warp.
        clock_hz: boost clock.
    """

    sm_count: int
    shared_mem_per_sm_bytes: int
    l2_bytes: int
    registers_per_sm: int
    max_threads_per_sm: int
    warp_size: int
    clock_hz: float

    @property
    def kind(self) -> Literal["gpu"]:
        """Always ``"gpu"``."""
        return "gpu"

    @property
    def parallel_units(self) -> int:
        """SMs, the unit a GPU kernel's blocks spread over."""
        return self.sm_count

    @property
    def last_level_cache_bytes(self) -> int:
        """The device's L2."""
        return self.l2_bytes


Target = CPUTarget | GPUTarget
