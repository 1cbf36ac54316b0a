"""Measure the local CPU instead of guessing: a streaming copy and an fp32 GEMM, in a few seconds.

``detect()`` returns a :class:`~fusekit.hw.cpu_gpu.CPUTarget` named ``cpu-local`` whose
bandwidth, fp32 peak and launch overhead are measured with torch, and whose core count and cache
sizes are read from the operating system. The result is cached on disk, keyed by the machine
(processor model, hardware threads, torch threads and version), and re-measured when the key
changes, the cache is unreadable or fails the hardware schema (zero, negative, NaN or
wrong-typed figures: one warning), or ``refresh=True``.

Measured figures (best of several trials, as STREAM reports)::

    mem_bw_bytes_per_s  = 2 * nbytes / t_copy          (read + write)
    peak_flops_per_s    = 2 * n**3 / t_matmul(n)        (fp32, n grown until t >= 50 ms)
    launch_overhead_s   = median t(one-element torch.add)

The timings run with torch's dispatch modes switched off (:func:`real_tensors`): the first call
often comes from inside a tracer (``torch.compile(backend="fusekit")`` plans while AOTAutograd's
fake-tensor mode is active), where a copy or a matmul only computes shapes and would measure
terabytes per second.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from pydantic import ValidationError

from fusekit import __version__
from fusekit.hw.cpu_gpu import CPUTarget, GPUTarget
from fusekit.hw.schema import CPUSchema, GPUSchema
from fusekit.paths import cache_dir, write_atomic

# torch is imported inside the functions that use it: fusekit.hw loads at CLI start-up.

T = TypeVar("T", CPUTarget, GPUTarget)

log = logging.getLogger(__name__)

#: 2: version 1 caches may hold figures timed on fake tensors (see :func:`real_tensors`).
CACHE_VERSION = 2
#: Bytes of the copy's source buffer: far above any last-level cache of this class of machine.
COPY_BYTES = 256 * 2**20


@dataclass(frozen=True, slots=True)
class Measurements:
    """What :func:`measure` timed.

    Attributes:
        copy_bytes_per_s: best streaming-copy rate, read plus write bytes.
        gemm_flops_per_s: best fp32 square-matmul rate.
        gemm_n: the matmul size used.
        launch_overhead_s: median time of a one-element ``torch.add``.
        elapsed_s: wall time of the whole measurement.
    """

    copy_bytes_per_s: float
    gemm_flops_per_s: float
    gemm_n: int
    launch_overhead_s: float
    elapsed_s: float


@contextmanager
def real_tensors() -> Iterator[None]:
    """Run torch on real tensors: every active dispatch mode (fake, proxy, functional) is off.

    The Python dispatcher, which AOTAutograd turns on while it compiles, is off too: it triples
    the cost of dispatching one small op.

    Raises:
        RuntimeError: torch still makes tensors of a subclass (a mode this does not reach).
    """
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    no_python_dispatcher = getattr(torch._C, "_DisablePythonDispatcher", nullcontext)
    with _disable_current_modes(), no_python_dispatcher(), torch.no_grad():
        probe = torch.ones(1)
        if type(probe) is not torch.Tensor:
            raise RuntimeError(
                f"hw detect: expected plain tensors to time (got {type(probe).__name__})"
            )
        yield


def _best_time_s(fn: Callable[[], object], trials: int) -> float:
    times = []
    for _ in range(trials):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def read_bytes_per_s(nbytes: int = COPY_BYTES, trials: int = 5) -> float:
    """Best rate of streaming ``nbytes`` of fp32 from DRAM into a sum: ``nbytes / t_sum``.

    The bound for kernels that only read their big operand (weight-streaming GEMV, MoE experts
    at a few tokens): no write-allocate traffic, so on most machines above the copy rate of
    ``mem_bw_bytes_per_s``. Measured on demand rather than stored in the target.
    """
    import torch

    src = torch.ones(nbytes // 4, dtype=torch.float32)
    src.sum()
    return nbytes / _best_time_s(src.sum, trials=trials)


def copy_bytes_per_s(nbytes: int = COPY_BYTES, trials: int = 5) -> float:
    """Best rate of a streaming fp32 copy of ``nbytes``: ``2 nbytes / t_copy`` (read + write)."""
    import torch

    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch of dst's pages
    return 2 * nbytes / _best_time_s(lambda: dst.copy_(src), trials=trials)


def gemm_flops_per_s(trials: int = 5) -> tuple[float, int]:
    """Best fp32 ``n x n x n`` matmul rate ``2 n^3 / t`` and its ``n``.

    ``n`` doubles from 256 until one product takes at least 50 ms (or ``n`` reaches 4096), so
    that the timer and thread start-up are noise.
    """
    import torch

    n = 256
    while True:
        a = torch.randn(n, n)
        b = torch.randn(n, n)
        torch.mm(a, b)
        gemm_s = _best_time_s(lambda a=a, b=b: torch.mm(a, b), trials=trials)  # type: ignore[misc]
        if gemm_s >= 0.05 or n >= 4096:
            return 2 * n**3 / gemm_s, n
        n *= 2


def launch_overhead_s(samples: int = 200) -> float:
    """Median time of a one-element ``torch.add``: the cost of dispatching one op."""
    import torch

    one = torch.ones(1)
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        torch.add(one, one)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure() -> Measurements:
    """Time a streaming copy, an fp32 GEMM and a tiny op with torch on this CPU.

    Returns:
        The measured rates.
    """
    start = time.perf_counter()
    with real_tensors():
        copy = copy_bytes_per_s()
        flops, n = gemm_flops_per_s()
        launch = launch_overhead_s()
    return Measurements(
        copy_bytes_per_s=copy,
        gemm_flops_per_s=flops,
        gemm_n=n,
        launch_overhead_s=launch,
        elapsed_s=time.perf_counter() - start,
    )


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _cpu_model() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith(("model name", "Model", "cpu model")):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _simd_width_bits() -> int:
    flags = set()
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith(("flags", "Features")):
            flags = set(line.split(":", 1)[1].split())
            break
    if "avx512f" in flags:
        return 512
    if "avx2" in flags or "avx" in flags:
        return 256
    return 128  # SSE2 on x86-64, NEON on Arm: the baseline of both ISAs


def _size_bytes(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    return int(text.rstrip("KMG") or 0) * scale


def _caches() -> dict[str, int]:
    """L1d, L2 (per core) and L3 (shared) sizes from sysfs; typical x86 sizes if unreadable."""
    sizes = {"l1d_bytes": 48 * 2**10, "l2_bytes": 2 * 2**20, "l3_bytes": 0}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(base.glob("index*")):
        level = _read(str(index / "level")).strip()
        kind = _read(str(index / "type")).strip()
        size = _size_bytes(_read(str(index / "size")))
        if level == "1" and kind in ("Data", "Unified"):
            sizes["l1d_bytes"] = size
        elif level == "2":
            sizes["l2_bytes"] = size
        elif level == "3":
            sizes["l3_bytes"] = size
    return sizes


def _mem_bytes() -> int:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _machine_key() -> dict[str, Any]:
    import torch

    return {
        "cpu_model": _cpu_model(),
        "threads": os.cpu_count() or 1,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "fusekit": __version__,
    }


def default_cache_path(name: str = "hw-detect.json") -> Path:
    """``NAME`` in fusekit's cache folder (``$XDG_CACHE_HOME/fusekit`` on Linux)."""
    return cache_dir(name)


def _build(key: dict[str, Any], m: Measurements) -> CPUTarget:
    import torch

    return CPUTarget(
        name="cpu-local",
        description=f"{key['cpu_model']} ({key['torch_threads']} torch threads)",
        source=(
            f"measured by fusekit.hw.detect in {m.elapsed_s:.2f} s: "
            f"{COPY_BYTES // 2**20} MiB copy, {m.gemm_n}^3 fp32 matmul"
        ),
        peak_flops_per_s=MappingProxyType({"fp32": m.gemm_flops_per_s}),
        mem_bw_bytes_per_s=m.copy_bytes_per_s,
        mem_bytes=_mem_bytes(),
        launch_overhead_s=m.launch_overhead_s,
        cores=torch.get_num_threads(),
        threads=os.cpu_count() or 1,
        simd_width_bits=_simd_width_bits(),
        **_caches(),
    )


def _checked(fields: Any, cls: type[T]) -> T | str:
    """The cached ``target`` fields as a ``cls``, or why they cannot be used."""
    if not isinstance(fields, dict) or not isinstance(fields.get("peak_flops_per_s"), dict):
        return "'target' or its 'peak_flops_per_s' is not a mapping"
    text = ("kind", "name", "description", "source", "peak_flops_per_s")
    numbers = {f"target.{k}": v for k, v in fields.items() if k not in text}
    numbers |= {f"target.peak_flops_per_s.{k}": v for k, v in fields["peak_flops_per_s"].items()}
    for where, v in numbers.items():
        if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
            return f"{where}: not a finite number (got {str(v)[:40]})"
    schema = CPUSchema if cls is CPUTarget else GPUSchema
    try:
        target = schema.model_validate(fields, strict=True).build()
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"target.{where}: {first['msg']} (got {str(first.get('input'))[:40]})"
    if not isinstance(target, cls):
        return f"not a {cls.__name__}"
    return target


def load_cached(path: Path, key: dict[str, Any], cls: type[T]) -> T | None:
    """The target cached at ``path`` if it was measured on the machine ``key`` describes.

    The cache is untrusted input: every field is checked against the hardware schema
    (:class:`~fusekit.hw.schema.CPUSchema` or ``GPUSchema`` with strict types, every figure a
    finite number, sizes and rates > 0). A missing or foreign (other machine or version) cache
    gives ``None`` quietly; an unreadable, corrupt or implausible one gives ``None`` with one
    warning. Either way the caller measures again and overwrites it; nothing in it is used.
    """
    try:
        blob = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as e:
        log.warning("ignoring hw-detect cache %s: unreadable (%s); re-measuring", path, e)
        return None
    if not isinstance(blob, dict) or not isinstance(blob.get("key"), dict):
        what = f"a {type(blob).__name__}" if not isinstance(blob, dict) else "no 'key' mapping"
        log.warning("ignoring hw-detect cache %s: %s, not a cache; re-measuring", path, what)
        return None
    if blob.get("version") != CACHE_VERSION or blob["key"] != key:
        log.info("hw-detect cache %s is for another machine or version; re-measuring", path)
        return None
    target = _checked(blob.get("target"), cls)
    if isinstance(target, str):
        log.warning("ignoring hw-detect cache %s: %s; re-measuring", path, target)
        return None
    return target


def store(path: Path, key: dict[str, Any], target: CPUTarget | GPUTarget) -> None:
    """Write the cache atomically (:func:`fusekit.paths.write_atomic`); a failure is logged."""
    blob = {"version": CACHE_VERSION, "key": key, "target": target.to_dict()}
    try:
        write_atomic(path, json.dumps(blob, indent=2, allow_nan=False))
    except (OSError, ValueError) as e:
        log.warning("could not write hw-detect cache %s (%s)", path, e)


def detect(refresh: bool = False, cache_path: Path | None = None) -> CPUTarget:
    """The local CPU as a target, measured once per machine and cached.

    Args:
        refresh: measure again even when a valid cache exists.
        cache_path: where the cache lives; :func:`default_cache_path` by default.

    Returns:
        The ``cpu-local`` target.
    """
    path = cache_path or default_cache_path()
    key = _machine_key()
    if not refresh:
        cached = load_cached(path, key, CPUTarget)
        if cached is not None:
            return cached
    measurements = measure()
    log.info("measured local CPU: %s", measurements)
    target = _build(key, measurements)
    store(path, key, target)
    return target
