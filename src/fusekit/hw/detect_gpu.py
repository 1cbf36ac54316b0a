"""Measure the local NVIDIA GPU: a streaming copy and GEMMs per dtype, timed with CUDA events.

``detect_gpu()`` returns a :class:`~fusekit.hw.cpu_gpu.GPUTarget` named ``gpu-local``: bandwidth,
peaks and launch overhead measured with torch on the current device; SMs, shared memory, L2 and
registers read from ``torch.cuda.get_device_properties``. Cached per device like
:func:`fusekit.hw.detect.detect`. Measured figures (best of several trials)::

    mem_bw_bytes_per_s    = 2 * nbytes / t_copy                     (1 GiB copy)
    peak_flops_per_s[dt]  = 2 * n**3 / t_matmul(n, dt)               (n = 8192; fp32 without TF32)
    launch_overhead_s     = host time per launch of a one-element add (100 in a row)

Timed with torch's dispatch modes off, as the CPU's (:func:`fusekit.hw.detect.real_tensors`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Any

from fusekit import __version__
from fusekit.errors import FusekitError
from fusekit.hw.cpu_gpu import GPUTarget
from fusekit.hw.detect import default_cache_path, load_cached, real_tensors, store

# torch is imported inside the functions that use it: fusekit.hw loads at CLI start-up.

log = logging.getLogger(__name__)

COPY_BYTES = 2**30
GEMM_N = 8192
#: dtypes timed, with the torch dtype name each maps to.
GEMM_DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _cuda_best_s(fn: Callable[[], object], trials: int) -> float:
    import torch

    fn()
    best = float("inf")
    for _ in range(trials):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def measure_gpu(device: int = 0) -> dict[str, Any]:
    """Time a copy, square GEMMs per dtype and tiny-op launches on one CUDA device.

    Returns:
        ``copy_bytes_per_s``, ``peak_flops_per_s`` (per dtype), ``launch_overhead_s``,
        ``elapsed_s``.
    """
    import torch

    begin = time.perf_counter()
    with real_tensors(), torch.cuda.device(device):
        src = torch.ones(COPY_BYTES // 4, device="cuda")
        dst = torch.empty_like(src)
        copy_s = _cuda_best_s(lambda: dst.copy_(src), trials=5)
        src = dst = torch.empty(0, device="cuda")  # free the 2 GiB before the GEMMs

        peaks = {}
        allow_tf32 = torch.backends.cuda.matmul.allow_tf32
        try:
            for name, torch_dtype in GEMM_DTYPES.items():
                torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
                dtype = getattr(torch, torch_dtype)
                a = torch.randn(GEMM_N, GEMM_N, device="cuda", dtype=dtype)
                b = torch.randn(GEMM_N, GEMM_N, device="cuda", dtype=dtype)
                peaks[name] = 2 * GEMM_N**3 / _cuda_best_s(partial(torch.mm, a, b), trials=5)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = allow_tf32

        one = torch.ones(1, device="cuda")
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(100):
            torch.add(one, one)
        launch_s = (time.perf_counter() - start) / 100
        torch.cuda.synchronize()
    return {
        "copy_bytes_per_s": 2 * COPY_BYTES / copy_s,
        "peak_flops_per_s": peaks,
        "launch_overhead_s": launch_s,
        "elapsed_s": time.perf_counter() - begin,
    }


def _device_key(device: int) -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(device)
    return {
        "gpu": props.name,
        "capability": f"{props.major}.{props.minor}",
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "fusekit": __version__,
    }


def detect_gpu(device: int = 0, refresh: bool = False, cache_path: Path | None = None) -> GPUTarget:
    """The local CUDA GPU as a target, measured once per device and cached.

    Args:
        device: CUDA device index.
        refresh: measure again even when a valid cache exists.
        cache_path: where the cache lives; ``hw-detect-gpu.json`` in the fusekit cache folder.

    Returns:
        The ``gpu-local`` target.

    Raises:
        FusekitError: torch sees no CUDA device.
    """
    import torch

    if not torch.cuda.is_available():
        raise FusekitError(
            "gpu-local: expected a CUDA device (got torch.cuda.is_available() False)"
        )
    path = cache_path or default_cache_path(f"hw-detect-gpu{device}.json")
    key = _device_key(device)
    if not refresh:
        cached = load_cached(path, key, GPUTarget)
        if cached is not None:
            return cached
    m = measure_gpu(device)
    props = torch.cuda.get_device_properties(device)
    target = GPUTarget(
        name="gpu-local",
        description=f"{props.name} (compute capability {props.major}.{props.minor})",
        source=(
            f"measured by fusekit.hw.detect_gpu in {m['elapsed_s']:.2f} s: "
            f"{COPY_BYTES // 2**20} MiB copy, {GEMM_N}^3 GEMMs; device properties"
        ),
        peak_flops_per_s=MappingProxyType(dict(m["peak_flops_per_s"])),
        mem_bw_bytes_per_s=m["copy_bytes_per_s"],
        mem_bytes=props.total_memory,
        launch_overhead_s=m["launch_overhead_s"],
        sm_count=props.multi_processor_count,
        shared_mem_per_sm_bytes=props.shared_memory_per_multiprocessor,
        l2_bytes=props.L2_cache_size,
        registers_per_sm=getattr(props, "regs_per_multiprocessor", 65536),
        max_threads_per_sm=props.max_threads_per_multi_processor,
        warp_size=getattr(props, "warp_size", 32),
        clock_hz=getattr(props, "clock_rate", 0) * 1e3 or float("nan"),  # kHz; NaN if unknown
    )
    log.info("measured local GPU: %s", target)
    store(path, key, target)
    return target
