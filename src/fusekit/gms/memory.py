"""Memory gms keeps between calls, each piece with an explicit owner.

- **The parse memo** (:data:`PARSED`): :meth:`fusekit.gms.GMSPlan.from_packed` returns the plan
  object a buffer was last remembered with, at the buffer's version, so what kernels derived on
  it (:class:`~fusekit.gms.planning.derived.Derived`: host views, the transposed plan, a mirrored
  mark) serves every call that receives only the buffer. The memo refers to every plan weakly
  and holds the last :data:`KEPT_PLANS` plans strongly, except plans on pooled buffers: those
  live as long as their holders (a layer's map, an autograd graph), so their buffers go back to
  the pool as soon as nothing uses them.
- **The plan pool** (:data:`PLAN_POOL`): host buffers for packed plans (kernel maps write a
  fresh plan per map). A buffer is leased to the tensor storage built on it and returned by a
  finalizer when that storage dies, that is when no plan, view or autograd graph holds any part
  of it; a held plan is never overwritten.
- **Scratch buffers** (:func:`scratch`): per-thread intermediates of the CPU kernels.

:func:`release_buffers` frees all three for what nothing else holds.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

if TYPE_CHECKING:
    from fusekit.gms.planning.derived import Derived

#: Plans the parse memo holds strongly (the most recently remembered, pooled ones excepted).
KEPT_PLANS = 16
#: Host buffers the plan pool keeps.
KEPT_BUFFERS = 4


# ---------------------------------------------------------------------------------------------
# the parse memo
# ---------------------------------------------------------------------------------------------


class _Remembered(Protocol):
    """A plan as the parse memo keeps it (:class:`fusekit.gms.GMSPlan`, which uses the memo)."""

    @property
    def buffer(self) -> torch.Tensor | None: ...
    @property
    def parsed(self) -> bool: ...
    @property
    def derived(self) -> Derived[Any]: ...


class ParseMemo:
    """The plan object each packed buffer stands for, at the buffer's version.

    Keyed by the buffer tensor's identity (the remembered plan holds its buffer, so while the
    plan lives no other tensor has that identity). Safe to use from several threads.
    """

    def __init__(self, kept: int = KEPT_PLANS) -> None:
        self._kept = kept
        self._lock = threading.RLock()
        self._plans: dict[int, tuple[weakref.ref[_Remembered], int]] = {}
        self._strong: OrderedDict[int, _Remembered] = OrderedDict()

    def get(self, buffer: torch.Tensor) -> _Remembered | None:
        """The plan remembered for ``buffer`` at its current version, or ``None``."""
        key = id(buffer)
        with self._lock:
            entry = self._plans.get(key)
            if entry is None:
                return None
            plan = entry[0]()
            if plan is None or plan.buffer is not buffer or entry[1] != buffer._version:
                return None
            if key in self._strong:
                self._strong.move_to_end(key)
            return plan

    def put(self, plan: _Remembered, version: int, *, strong: bool) -> None:
        """Remember ``plan`` for its buffer at ``version``; ``strong``: also hold it."""
        buffer = plan.buffer
        if buffer is None:
            return
        key = id(buffer)
        with self._lock:
            entry = self._plans.get(key)
            if entry is None or entry[0]() is not plan or entry[1] != version:
                self._plans[key] = (weakref.ref(plan, self._forgetter(key)), version)
            self._strong.pop(key, None)
            if strong:  # the most recent last
                self._strong[key] = plan
                if len(self._strong) > self._kept:
                    self._strong.popitem(last=False)

    def _forgetter(self, key: int) -> Callable[[weakref.ref[_Remembered]], None]:
        """The callback that drops ``key``'s entry when its plan dies (unless replaced since)."""

        def forget(ref: weakref.ref[_Remembered]) -> None:
            with self._lock:
                entry = self._plans.get(key)
                if entry is not None and entry[0] is ref:
                    del self._plans[key]

        return forget

    def release(self) -> None:
        """Let go of the plans held strongly; plans held elsewhere stay remembered."""
        with self._lock:
            self._strong.clear()

    def __len__(self) -> int:
        """Plans remembered and still alive."""
        with self._lock:
            return sum(entry[0]() is not None for entry in self._plans.values())


# ---------------------------------------------------------------------------------------------
# the plan pool
# ---------------------------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class _Slot:
    """A pooled host buffer and whether a tensor storage holds it now."""

    memory: np.ndarray
    leased: bool = False


class PlanPool:
    """Host buffers for packed plans, each leased to the storage built on it.

    A fresh plan is tens of megabytes written once; in freshly mapped pages each 4 KiB costs a
    fault and a zeroed page, so buffers are kept and handed out again. :meth:`take` wraps a
    fresh numpy view of a free buffer in a tensor; the tensor's storage owns that view, and the
    view's finalizer returns the buffer when the storage dies. New buffers come from numpy,
    which advises transparent huge pages for arrays of 4 MiB and more.
    """

    def __init__(self, kept: int = KEPT_BUFFERS) -> None:
        self._kept = kept
        self._lock = threading.RLock()
        self._slots: list[_Slot] = []
        self._leases: set[int] = set()  # addresses of the buffers leased now, kept or not

    def take(self, numel: int) -> torch.Tensor:
        """An uninitialised int64 CPU tensor of ``numel``, on a free buffer of at most twice that.

        Returns:
            A tensor whose storage holds the lease of its buffer.
        """
        with self._lock:
            for slot in sorted(self._slots, key=lambda s: s.memory.shape[0]):
                if not slot.leased and numel <= slot.memory.shape[0] <= 2 * numel:
                    return self._lease(slot, numel)
            slot = _Slot(np.empty(numel, np.int64))
            self._slots.append(slot)
            if len(self._slots) > self._kept:  # forget the oldest free buffer, else the oldest
                free = [j for j in range(len(self._slots) - 1) if not self._slots[j].leased]
                del self._slots[free[0] if free else 0]
            return self._lease(slot, numel)

    def _lease(self, slot: _Slot, numel: int) -> torch.Tensor:
        view = slot.memory[:numel]  # a new array object: the storage's own reference
        slot.leased = True
        self._leases.add(slot.memory.ctypes.data)
        weakref.finalize(view, self._give_back, slot).atexit = False
        return torch.from_numpy(view)

    def _give_back(self, slot: _Slot) -> None:
        """A lease's finalizer: the storage on ``slot`` died (no lock: it may run anywhere)."""
        slot.leased = False
        self._leases.discard(slot.memory.ctypes.data)

    def owns(self, buffer: torch.Tensor) -> bool:
        """Whether ``buffer`` is a buffer this pool lent and that is still in use."""
        if not self._leases or buffer.device.type != "cpu":
            return False
        return buffer.untyped_storage().data_ptr() in self._leases

    def clear(self) -> None:
        """Forget every buffer (a leased one stays valid for its holders, then is freed)."""
        with self._lock:
            self._slots.clear()

    def __len__(self) -> int:
        """Buffers kept."""
        with self._lock:
            return len(self._slots)


#: The process's parse memo.
PARSED = ParseMemo()
#: The process's plan-buffer pool.
PLAN_POOL = PlanPool()


def remember(plan: _Remembered) -> None:
    """Make ``plan`` what :meth:`~fusekit.gms.GMSPlan.from_packed` returns for its buffer.

    Called when a plan hands out :attr:`~fusekit.gms.GMSPlan.packed`: the op that receives the
    buffer then works on this very plan, with what was derived on it. The record is stamped with
    the buffer's version; if the buffer was edited in place since (its version moved),
    everything derived from the old contents is dropped first, as a fresh parse would. Only a
    plan parsed from its buffer is remembered: one changed with ``dataclasses.replace`` may hold
    tensors that are not the buffer's, and the op reads the buffer.
    """
    buffer = plan.buffer
    if buffer is None or not plan.parsed:
        return
    version = buffer._version
    plan.derived.stamp(version)
    PARSED.put(plan, version, strong=not PLAN_POOL.owns(buffer))


def plan_storage(numel: int, device: torch.device | str) -> torch.Tensor:
    """An uninitialised int64 tensor of ``numel`` for a packed plan, its pages cheap to fill.

    On the CPU a buffer of :data:`PLAN_POOL`; elsewhere ``torch.empty``.
    """
    if torch.device(device).type != "cpu":
        return torch.empty(numel, dtype=torch.int64, device=device)
    return PLAN_POOL.take(numel)


# ---------------------------------------------------------------------------------------------
# scratch buffers
# ---------------------------------------------------------------------------------------------

#: Each thread's scratch buffers, by (name, dtype); see :func:`scratch`.
_SCRATCH = threading.local()


def scratch(name: str, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """A ``[rows, cols]`` intermediate of the calling thread, reused by every later call.

    Allocated afresh per call, the megabytes of products and gathered rows of a GEMM-bound
    problem cost a page fault (and a zeroed page) per 4 KiB whenever the C allocator has handed
    the memory back to the system. So each thread keeps one buffer per name and dtype, grown to
    the largest request and shared by every plan (a new plan per batch, as MoE routing makes,
    reuses it too); :func:`release_scratch` frees them. A buffer never leaves the kernel that
    asked: callers return only tensors they allocated, and a concurrent call from another
    thread gets its own buffers.
    """
    buffers: dict[tuple[str, torch.dtype], torch.Tensor] | None = getattr(_SCRATCH, "buffers", None)
    if buffers is None:
        buffers = _SCRATCH.buffers = {}
    key = (name, dtype)
    buffer = buffers.get(key)
    if buffer is None or buffer.numel() < rows * cols:
        buffers.pop(key, None)  # free the old buffer before allocating its successor
        buffer = buffers[key] = torch.empty(rows * cols, dtype=dtype)
    return buffer[: rows * cols].view(rows, cols)


def release_scratch() -> None:
    """Free the calling thread's :func:`scratch` buffers."""
    _SCRATCH.buffers = {}


def release_buffers() -> None:
    """Free the host memory gms keeps between calls for reuse.

    The pooled plan buffers (:data:`PLAN_POOL`), the plans the parse memo holds strongly
    (:data:`PARSED`), and the calling thread's scratch buffers (:func:`scratch`). A plan still
    held (a layer's map cached under an ``indice_key``, an autograd graph) keeps its buffer and
    stays valid; later calls allocate anew.
    """
    PARSED.release()
    PLAN_POOL.clear()
    release_scratch()
