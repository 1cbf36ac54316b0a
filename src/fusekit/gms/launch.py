"""Launch settings of the gms kernels: what a tuned configuration sets besides the plan.

A configuration has two halves. Its plan knobs (``tile_rows``, destination ``blocks``,
``schedule``) are arguments of :func:`fusekit.gms.plan`; its launch knobs are a :class:`Launch`
applied around the calls::

    with launch(Launch(threads=2, chunk=1)):         # CPU: numba/torch threads, prange chunks
        y = gms(x, w, pl, scale, "(GMS)seg")
    with launch(Launch(block_e=32, block_m=64, block_k=32, num_warps=4, num_stages=3)):
        y = gms(x_cuda, w_cuda, pl_cuda)             # GPU: the Triton segment GEMM's tile

The CPU settings are the thread counts of numba and torch and numba's ``prange`` chunk size
(0 = static split; ``n`` = threads take ``n`` iterations at a time), set on entry and restored on
exit. The GPU settings are read by the Triton launchers through :func:`current` (a context
variable: scoped to the calling thread or task, never a process-wide global).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

import numba
import torch

from fusekit.errors import expected


@dataclass(frozen=True, slots=True)
class Launch:
    """Launch knobs; ``None`` keeps the kernel's default.

    Attributes:
        threads: CPU threads of the numba kernels and torch ops.
        chunk: CPU ``prange`` chunk size (0: static split over threads).
        block_e: GPU rows (pairs) of the segment GEMM's tile.
        block_k: GPU ``K`` step of its inner loop.
        block_m: GPU output columns of its tile.
        num_warps: GPU warps per program.
        num_stages: GPU software-pipelining stages of the ``K`` loop.
    """

    threads: int | None = None
    chunk: int | None = None
    block_e: int | None = None
    block_k: int | None = None
    block_m: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None

    def __post_init__(self) -> None:
        for name in ("threads", "block_e", "block_k", "block_m", "num_warps", "num_stages"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(expected("Launch", name, "a positive int or None", value))
        if self.chunk is not None and (not isinstance(self.chunk, int) or self.chunk < 0):
            raise ValueError(expected("Launch", "chunk", "an int >= 0 or None", self.chunk))
        for name in ("block_e", "block_k", "block_m"):
            value = getattr(self, name)
            if value is not None and (value < 16 or value & (value - 1)):
                raise ValueError(expected("Launch", name, "a power of two >= 16", value))


_DEFAULT = Launch()
_CURRENT: ContextVar[Launch | None] = ContextVar("fusekit_gms_launch", default=None)


def current() -> Launch:
    """The launch settings in force (defaults outside any :func:`launch` block)."""
    return _CURRENT.get() or _DEFAULT


@contextlib.contextmanager
def launch(settings: Launch) -> Iterator[Launch]:
    """Apply ``settings`` to the gms calls inside the block, then restore the previous ones.

    Args:
        settings: the knobs to apply.

    Yields:
        ``settings``.
    """
    token = _CURRENT.set(settings)
    torch_threads = torch.get_num_threads()
    numba_state = None
    if settings.threads is not None or settings.chunk is not None:
        numba_state = (numba.get_num_threads(), numba.get_parallel_chunksize())
        if settings.threads is not None:
            # the most threads numba's pool has (numba.config sets its names at run time)
            most = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]
            numba.set_num_threads(min(settings.threads, most))
            torch.set_num_threads(settings.threads)
        if settings.chunk is not None:
            numba.set_parallel_chunksize(settings.chunk)
    try:
        yield settings
    finally:
        _CURRENT.reset(token)
        if numba_state is not None:
            numba.set_num_threads(numba_state[0])
            numba.set_parallel_chunksize(numba_state[1])
        if torch.get_num_threads() != torch_threads:
            torch.set_num_threads(torch_threads)
