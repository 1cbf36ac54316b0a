"""Small problems and a fixed CPU target shared by the tuning tests (no detect() run)."""

from types import MappingProxyType

import torch

from fusekit.gms import GMSProblem
from fusekit.hw import CPUTarget

TARGET = CPUTarget(
    name="test-cpu",
    description="a round-number CPU for hand-computed tests",
    source="tests",
    peak_flops_per_s=MappingProxyType({"fp32": 100e9}),
    mem_bw_bytes_per_s=10e9,
    mem_bytes=2**34,
    launch_overhead_s=5e-6,
    cores=2,
    threads=2,
    l1d_bytes=32768,
    l2_bytes=2**19,
    l3_bytes=2**25,
    simd_width_bits=256,
)


def small_problem(pairs: int = 120, n: int = 40, segments: int = 5, reduce: str = "sum", seed=0):
    gen = torch.Generator().manual_seed(seed)
    g = torch.randint(0, n, (pairs,), generator=gen)
    s = torch.randint(0, segments, (pairs,), generator=gen)
    d = torch.randint(0, n, (pairs,), generator=gen)
    return GMSProblem.create(g, s, d, n, n_in=n, num_segments=segments, reduce=reduce)
