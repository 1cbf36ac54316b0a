"""Compiling the generated CPU kernels: in this process, or ahead of time in worker processes.

numba compiles a kernel in about a second, holding the GIL. A plan's kernels are all known when
it is made, so :func:`precompile` compiles the ones numba's disk cache does not hold yet in
worker processes, one per core (as Inductor's compile workers do): fresh interpreters running
this module on the kernels' files (``python -m fusekit.stitch.codegen.compiling``), never a
fork or a ``multiprocessing`` spawn (which re-runs the user's script). Each worker writes the
cache, and this process then loads every kernel from it at its first call. Importing this
module imports neither torch nor the launchers.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

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


def precompile(jobs: Sequence[tuple[str, int]]) -> int:
    """Compile the kernel ``(source, interleave)`` jobs not loaded nor cached, in workers.

    Nothing happens for fewer than two such kernels or fewer than two workers (the first call
    compiles them here, as before); a failing worker is logged, and what it did not compile
    compiles here at its first call.

    Returns:
        The number of kernels handed to workers.
    """
    todo = [j for j in dict.fromkeys(jobs) if not is_loaded(j[0], "k") and not is_cached(j[0])]
    n = workers(len(todo))
    if len(todo) < 2 or n < 2:
        return 0
    args: list[list[str]] = [[] for _ in range(n)]
    for i, (source, interleave) in enumerate(todo):
        args[i % n] += [str(write_generated(source, "k")), str(interleave)]
    log.info("stitch: compiling %d kernels in %d processes", len(todo), n)
    env = {**os.environ, WORKERS_ENV: "0"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", __name__, *a], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        for a in args
    ]  # fmt: skip
    for p in procs:
        _, err = p.communicate()
        if p.returncode:
            tail = (err or "").strip().splitlines()[-1:] or ["no message"]
            log.warning("stitch: a kernel compile worker failed (%s); compiling here", tail[0])
    return len(todo)


def _main(argv: Sequence[str]) -> int:
    """Compile the kernel files ``path interleave ...`` (a worker of :func:`precompile`)."""
    for path, interleave in zip(argv[::2], argv[1::2], strict=True):
        compile_module(Path(path).read_text(), int(interleave))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
