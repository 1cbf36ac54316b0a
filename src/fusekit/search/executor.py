"""Executors: run one function over many items, serially or in worker processes.

A searcher hands an executor a picklable, module-level function and a list of work items (usually
chunks of candidates) and gets the results back in item order::

    with LocalExecutor(workers=4) as ex:
        scores = ex.map(evaluate_chunk, chunks, chunksize=1)

Every executor satisfies the :class:`Executor` protocol (``map`` plus ``workers`` and context
management), so a searcher runs unchanged on one core, on a local process pool, or on a Ray
cluster (:class:`RayExecutor`, the ``distributed`` extra).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar, runtime_checkable

from fusekit.errors import FusekitError, expected, require

T = TypeVar("T")
R = TypeVar("R")


def default_workers() -> int:
    """The number of CPUs this process may run on (at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


@runtime_checkable
class Executor(Protocol):
    """Runs ``fn`` over ``items`` and returns the results in item order."""

    @property
    def workers(self) -> int:
        """How many items may run at the same time."""
        ...

    def map(self, fn: Callable[[T], R], items: Iterable[T], chunksize: int = 1) -> list[R]:
        """Apply ``fn`` to every item.

        Args:
            fn: a picklable (module-level) function of one item.
            items: the work items.
            chunksize: items sent to a worker at once (ignored where meaningless).

        Returns:
            ``[fn(item) for item in items]``, in the same order.
        """
        ...

    def close(self) -> None:
        """Release the workers; the executor cannot be used afterwards."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


def _check_chunksize(chunksize: int) -> None:
    if not isinstance(chunksize, int) or isinstance(chunksize, bool) or chunksize < 1:
        raise ValueError(expected("executor", "chunksize", "an int >= 1", repr(chunksize)))


class _Closing:
    """``with executor:`` closes it on exit (the context management every executor shares)."""

    def close(self) -> None:
        """Release the workers."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class SerialExecutor(_Closing):
    """Runs every item in this process, in order: for tests, debugging and tiny searches."""

    @property
    def workers(self) -> int:
        """Always 1."""
        return 1

    def map(self, fn: Callable[[T], R], items: Iterable[T], chunksize: int = 1) -> list[R]:
        """``[fn(item) for item in items]`` (see :meth:`Executor.map`)."""
        _check_chunksize(chunksize)
        return [fn(item) for item in items]

    def close(self) -> None:
        """Nothing to release."""


class LocalExecutor(_Closing):
    """Runs items in ``workers`` local processes (:class:`concurrent.futures.ProcessPoolExecutor`).

    The pool starts on the first :meth:`map` and is reused until :meth:`close`. With
    ``workers == 1`` no process is started and items run in this process.

    Args:
        workers: processes to use; ``None`` means :func:`default_workers`.

    Raises:
        ValueError: ``workers`` is not a positive int.
    """

    def __init__(self, workers: int | None = None) -> None:
        if workers is None:
            workers = default_workers()
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ValueError(expected("LocalExecutor", "workers", "an int >= 1", repr(workers)))
        self._workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._closed = False

    @property
    def workers(self) -> int:
        """The number of worker processes."""
        return self._workers

    def map(self, fn: Callable[[T], R], items: Iterable[T], chunksize: int = 1) -> list[R]:
        """Apply ``fn`` to every item in the worker processes (see :meth:`Executor.map`).

        Raises:
            RuntimeError: the executor was closed.
            ValueError: ``chunksize`` is not a positive int.
        """
        _check_chunksize(chunksize)
        if self._closed:
            raise RuntimeError("LocalExecutor: expected an open executor (got a closed one)")
        if self._workers == 1:
            return [fn(item) for item in items]
        if self._pool is None:
            # spawn, not fork: forking a process whose OpenMP runtime (torch, numba) is running
            # aborts the child ("fork() called from a process already using GNU OpenMP")
            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(max_workers=self._workers, mp_context=context)
        return list(self._pool.map(fn, items, chunksize=chunksize))

    def close(self) -> None:
        """Shut the worker processes down (waits for running items)."""
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _run_chunk(fn: Callable[[T], R], chunk: list[T]) -> list[R]:
    return [fn(item) for item in chunk]


def _one_host_problem(workers: int, hosts: int) -> FusekitError:
    return FusekitError(
        expected(
            "RayExecutor",
            "workers",
            f"at most {hosts}, the hosts of the Ray cluster, when timing (one point per host at "
            "a time: points timed side by side share cores and disturb each other's timings)",
            workers,
        )
    )


class RayExecutor(_Closing):
    """Runs items as Ray tasks, locally or on a cluster (``pip install 'fusekit[distributed]'``).

    ``ray`` is imported and initialised on the first use: with ``address`` it connects to a
    running cluster (``"auto"`` finds the local one), otherwise it starts a private local
    instance (one host) with ``workers`` CPUs. Items are sent ``chunksize`` at a time, one task
    per chunk.

    With ``one_per_host`` (for timing, as ``gms tune`` does) a host never runs two tasks at
    once: each task is pinned to a node, and a host (nodes grouped by IP address) gets its next
    task only when its last one is done, so ``workers`` hosts measure side by side, each alone
    on its cores. More workers than hosts are refused; on a private local instance that means
    any ``workers > 1``, refused here before Ray starts.

    Args:
        workers: tasks at once, and the parallelism reported by :attr:`workers`; ``None`` means
            :func:`default_workers` (with ``one_per_host``: every host of the cluster).
        address: a Ray cluster address, or None for a private local instance.
        one_per_host: at most one task per host at a time (see above).

    Raises:
        ValueError: ``workers`` is not a positive int.
        FusekitError: ``one_per_host`` with more workers than hosts (here for a private
            instance; on the first use for a cluster).
    """

    def __init__(
        self, workers: int | None = None, address: str | None = None, one_per_host: bool = False
    ) -> None:
        if workers is not None and (
            not isinstance(workers, int) or isinstance(workers, bool) or workers < 1
        ):
            raise ValueError(expected("RayExecutor", "workers", "an int >= 1", repr(workers)))
        if one_per_host and address is None:
            if workers is not None and workers > 1:
                raise _one_host_problem(workers, 1)
            workers = 1
        if workers is None and not one_per_host:
            workers = default_workers()
        self._workers: int | None = workers
        self._address = address
        self._one_per_host = one_per_host
        self._nodes: list[str] = []
        self._started = False
        self._closed = False

    @property
    def workers(self) -> int:
        """Tasks Ray may run at once (connects to the cluster to count its hosts if needed)."""
        if self._workers is None:
            self._ray()  # counts the hosts
        return self._workers if self._workers is not None else 1

    def _ray(self) -> Any:
        ray = require("ray", "RayExecutor", "distributed")  # MissingExtra: one line in the CLI
        if not ray.is_initialized():
            if self._address is not None:
                ray.init(address=self._address, log_to_driver=False)
            else:
                ray.init(
                    num_cpus=self._workers,
                    include_dashboard=False,
                    log_to_driver=False,
                    configure_logging=False,
                )
            self._started = True
        if self._one_per_host and not self._nodes:
            hosts: dict[str, str] = {}
            for node in ray.nodes():
                if node.get("Alive") and node.get("Resources", {}).get("CPU", 0) >= 1:
                    hosts.setdefault(node["NodeManagerAddress"], node["NodeID"])
            if self._workers is None:
                self._workers = max(1, len(hosts))
            if self._workers > len(hosts):
                raise _one_host_problem(self._workers, len(hosts))
            self._nodes = list(hosts.values())[: self._workers]
        return ray

    def map(self, fn: Callable[[T], R], items: Iterable[T], chunksize: int = 1) -> list[R]:
        """Apply ``fn`` to every item as Ray tasks (see :meth:`Executor.map`).

        Raises:
            RuntimeError: the executor was closed.
            MissingExtra: ray is not installed (an ImportError).
            FusekitError: ``one_per_host`` and the cluster has fewer hosts than workers.
        """
        _check_chunksize(chunksize)
        if self._closed:
            raise RuntimeError("RayExecutor: expected an open executor (got a closed one)")
        items = list(items)
        if not items:
            return []
        ray = self._ray()
        task = ray.remote(_run_chunk)
        chunks = [items[i : i + chunksize] for i in range(0, len(items), chunksize)]
        fn_ref = ray.put(fn)
        if not self._one_per_host:
            results = ray.get([task.remote(fn_ref, chunk) for chunk in chunks])
            return [r for chunk in results for r in chunk]
        return [r for chunk in self._one_per_node(ray, task, fn_ref, chunks) for r in chunk]

    def _one_per_node(self, ray: Any, task: Any, fn_ref: Any, chunks: list[Any]) -> list[Any]:
        """Run ``chunks`` with at most one task in flight per node of :attr:`_nodes`."""
        # ray is the optional 'distributed' extra, required when the executor was made
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        results: list[Any] = [None] * len(chunks)
        running: dict[Any, tuple[str, int]] = {}
        free, following = list(self._nodes), 0
        while following < len(chunks) or running:
            while free and following < len(chunks):
                node = free.pop()
                strategy = NodeAffinitySchedulingStrategy(node, soft=False)
                pinned = task.options(scheduling_strategy=strategy)
                running[pinned.remote(fn_ref, chunks[following])] = (node, following)
                following += 1
            done, _ = ray.wait(list(running), num_returns=1)
            for ref in done:
                node, i = running.pop(ref)
                results[i] = ray.get(ref)
                free.append(node)
        return results

    def close(self) -> None:
        """Shut down the local Ray instance this executor started (a cluster stays up)."""
        self._closed = True
        if self._started:
            import ray  # the optional 'distributed' extra, present since this instance started

            ray.shutdown()
            self._started = False
