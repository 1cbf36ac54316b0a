"""Compiling the generated CPU kernels: in this process, or ahead of time in worker processes.

numba compiles a kernel in about a second, holding the GIL. A plan's kernels are all known when
it is made, so :func:`precompile` compiles the ones numba's disk cache does not hold yet in
worker processes, one per core (as Inductor's compile workers do): interpreters running this
module (``python -m fusekit.stitch.codegen.compiling --serve``), never a fork or a
``multiprocessing`` spawn (which re-runs the user's script). They start once per process
(:func:`warm`, when a graph is handed over) and serve every plan after (:class:`CompilePool`).
Each worker writes numba's cache, and this process then loads every kernel from it at its first
call. Importing this module imports neither torch nor the launchers.
"""

from __future__ import annotations

import atexit
import logging
import os
import selectors
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TextIO

import llvmlite.binding as llvm

from fusekit.stitch.codegen.render import (
    cache_dir,
    is_loaded,
    load_generated,
    source_digest,
    write_generated,
)

log = logging.getLogger(__name__)

#: Environment variable: worker processes that compile a plan's kernels ahead (0: none, all
#: compile in this process at their first call); by default one per core.
WORKERS_ENV = "FUSEKIT_COMPILE_WORKERS"


@contextmanager
def llvm_interleave(count: int) -> Iterator[None]:
    """Compile with LLVM's ``-force-vector-interleave=count``; 0: no change.

    An LLVM command-line option, global to the process: set for the compilation only, then back
    to 0 (the cost model's choice).
    """
    if not count:
        yield
        return
    llvm.set_option("fusekit", f"-force-vector-interleave={count}")
    try:
        yield
    finally:
        llvm.set_option("fusekit", "-force-vector-interleave=0")


def compile_module(source: str, interleave: int = 0) -> ModuleType:
    """Load (so compile, or read from numba's cache) a generated kernel module."""
    with llvm_interleave(interleave):
        return load_generated(source, "k")


def is_cached(source: str) -> bool:
    """Whether numba's cache holds the compiled functions of a generated kernel module."""
    stem = f"k_{source_digest(source)}."
    folder = cache_dir() / "__pycache__"
    return folder.is_dir() and any(p.name.endswith(".nbi") for p in folder.glob(stem + "*"))


def workers(todo: int) -> int:
    """Worker processes for ``todo`` kernels: :data:`WORKERS_ENV`, else one per core."""
    given = os.environ.get(WORKERS_ENV)
    try:
        n = int(given) if given is not None else (os.cpu_count() or 1)
    except ValueError:
        log.warning("%s=%r is not an integer; compiling in this process", WORKERS_ENV, given)
        return 0
    return max(0, min(n, todo))


class CompilePool:
    """Worker interpreters that compile kernel files on request, kept for the process's life.

    Each worker runs ``python -m fusekit.stitch.codegen.compiling --serve``: it imports numba,
    compiles a tiny function (numba's typing tables are built at the first compile, about as
    long as the import), then reads ``path<TAB>interleave`` lines from its stdin and answers
    each with one line, ``ok`` or ``error <why>``. Started once (a cold worker costs about
    1.5 s, paid once instead of at every plan) and fed one kernel at a time, so that a slow
    kernel does not hold back a queue behind it. A worker exits at end of input: when this
    process closes its pipe at exit, or dies. Its stderr goes to a temporary file, whose last
    line names why a worker that died without answering did (:meth:`_death`).
    """

    def __init__(self, count: int, folder: Path) -> None:
        #: the cache folder the workers write to (the environment they started with)
        self.folder = folder
        self._lock = threading.Lock()  # one caller feeds the workers and reads their answers
        env = {**os.environ, WORKERS_ENV: "0"}
        #: each worker's stderr, kept to name why one died (:meth:`_death`)
        self._stderr = [tempfile.TemporaryFile() for _ in range(count)]
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", __name__, "--serve"], env=env, text=True, bufsize=1,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr[i],
            )
            for i in range(count)
        ]  # fmt: skip

    @property
    def size(self) -> int:
        """Workers still running."""
        return sum(p.poll() is None for p in self.procs)

    def compile(self, files: Sequence[tuple[Path, int]]) -> int:
        """Compile the kernel files ``(path, interleave)`` in the workers; how many compiled.

        A kernel that fails, or whose worker dies, is logged: it compiles in this process at
        its first call instead. Concurrent callers take turns.
        """
        with self._lock:
            return self._compile(files)

    def _compile(self, files: Sequence[tuple[Path, int]]) -> int:
        queue = list(reversed(files))
        busy: dict[int, tuple[subprocess.Popen[str], Path]] = {}
        done = 0
        with selectors.DefaultSelector() as sel:

            def feed(proc: subprocess.Popen[str]) -> None:
                if not queue:
                    return
                path, interleave = queue.pop()
                assert proc.stdin is not None
                try:
                    proc.stdin.write(f"{path}\t{interleave}\n")
                    proc.stdin.flush()
                except OSError:  # the worker is gone
                    queue.append((path, interleave))
                    return
                busy[proc.pid] = (proc, path)
                sel.register(proc.stdout, selectors.EVENT_READ, proc)  # type: ignore[arg-type]

            for proc in self.procs:
                if proc.poll() is None:
                    feed(proc)
            while busy:
                for key, _ in sel.select():
                    proc = key.data
                    sel.unregister(key.fileobj)
                    _, path = busy.pop(proc.pid)
                    answer = key.fileobj.readline().strip()  # type: ignore[union-attr]
                    if answer == "ok":
                        done += 1
                        feed(proc)
                        continue
                    why = answer.removeprefix("error ") or self._death(proc)
                    log.warning("stitch: a compile worker failed on %s (%s); compiling it "
                                "here at its first call", path.name, why)  # fmt: skip
                    if answer:
                        feed(proc)
        return done

    def _death(self, proc: subprocess.Popen[str]) -> str:
        """Why a worker ended without answering: its exit status and its last stderr line."""
        try:
            status = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "the worker closed its output"
        how = f"signal {-status}" if status < 0 else f"status {status}"
        err = self._stderr[self.procs.index(proc)]
        err.seek(max(0, err.seek(0, os.SEEK_END) - 4096))
        lines = [ln for ln in err.read().decode(errors="replace").splitlines() if ln.strip()]
        return f"the worker exited with {how}" + (f": {lines[-1].strip()}" if lines else "")

    def close(self) -> None:
        """End the workers: end of input, then a kill for one that does not exit."""
        for proc in self.procs:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
                proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
            if proc.stdout is not None:
                proc.stdout.close()
        for err in self._stderr:
            err.close()


_POOL: list[CompilePool] = []  # the one pool of this process, once started
_POOL_LOCK = threading.Lock()


def pool(count: int | None = None) -> CompilePool | None:
    """This process's compile workers, started at the first call; ``None`` if fewer than two.

    Args:
        count: workers wanted; :func:`workers` of the core count by default.

    A pool started for another cache folder (the environment changed since) or that lost
    workers is replaced.
    """
    n = workers(os.cpu_count() or 1) if count is None else count
    if n < 2:
        return None
    folder = cache_dir()
    with _POOL_LOCK:
        if _POOL and (_POOL[0].folder != folder or _POOL[0].size < n):
            _POOL.pop().close()
        if not _POOL:
            _POOL.append(CompilePool(n, folder))
        return _POOL[0]


@atexit.register
def _close_pool() -> None:
    with _POOL_LOCK:
        while _POOL:
            _POOL.pop().close()


def warm() -> None:
    """Start the compile workers now, so that they are ready when a plan's kernels are known.

    A graph compiler calls this when it is handed a graph: the workers import numba while the
    graph is traced and planned. Nothing happens when the workers are off.
    """
    pool()


def precompile(jobs: Sequence[tuple[str, int]]) -> int:
    """Compile the kernel ``(source, interleave)`` jobs not loaded nor cached, in workers.

    Nothing happens for fewer than two such kernels or fewer than two workers (the first call
    compiles them here, as before); a kernel whose worker fails is logged, and compiles here at
    its first call.

    Returns:
        The number of kernels handed to workers.
    """
    todo = [j for j in dict.fromkeys(jobs) if not is_loaded(j[0], "k") and not is_cached(j[0])]
    ahead = pool() if len(todo) >= 2 else None
    if ahead is None:
        return 0
    log.info("stitch: compiling %d kernels in %d processes", len(todo), ahead.size)
    ahead.compile([(write_generated(source, "k"), interleave) for source, interleave in todo])
    return len(todo)


def _serve(lines: Iterable[str], out: TextIO) -> None:
    """A worker of :class:`CompilePool`: compile each ``path<TAB>interleave`` line's file."""
    import numba

    numba.njit(lambda x: x + 1.0)(1.0)  # numba's typing tables, built at the first compile
    for line in lines:
        path, interleave = line.rstrip("\n").split("\t")
        try:
            compile_module(Path(path).read_text(), int(interleave))
        except Exception as e:  # reported to the parent, which compiles it at first call
            why = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
            out.write(f"error {why}\n")
        else:
            out.write("ok\n")
        out.flush()


if __name__ == "__main__":
    if sys.argv[1:] != ["--serve"]:
        sys.exit("usage: python -m fusekit.stitch.codegen.compiling --serve")
    _serve(sys.stdin, sys.stdout)
