"""The CPU kernels' launchers: one parallel loop over chunks, compiled once for every kernel.

A generated kernel (:mod:`fusekit.stitch.codegen.cpu`) is two plain functions of one signature,
:data:`CHUNK`: ``chunk(c, argv)`` computes chunk ``c`` of the rows, ``finish(c, argv)``
combines the column reductions' partials after every chunk (``argv``: the address of an
``int64`` array holding the tensors' data addresses, the partials', the trip counts and the
chunk count). The launchers take the addresses of their C entry points (:func:`address`), so
that the thread loop::

    for c in prange(n_chunks):
        chunk(c, argv)
    finish(n_chunks, argv)

is compiled once (and cached on disk), not per kernel: numba's ``parallel=True`` pipeline costs
about a second more per function than the function itself.

Importing this module compiles (or loads) both launchers.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from llvmlite import ir as llvm_ir
from numba import types
from numba.extending import intrinsic
from numba.np.ufunc import parallel as _parallel

#: A kernel's chunk and finish: ``(chunk index, address of its int64 argument array) -> None``.
CHUNK = types.void(types.int64, types.int64)
_LAUNCH = types.void(types.int64, types.int64, types.int64[::1], types.int64)


def address(fn: Any) -> int:
    """The address of the C entry point of ``fn``, a function compiled for :data:`CHUNK`.

    numba compiles a C-ABI wrapper beside every ``njit`` function (what it passes for a
    first-class function); calling it through its address costs a call, where passing the
    dispatcher costs its unboxing, about 100 us a launch.
    """
    res = fn.get_compile_result(CHUNK)
    addr = res.library.get_pointer_to_function(res.fndesc.llvm_cfunc_wrapper_name)
    if not addr:
        raise RuntimeError(f"stitch: no C entry point compiled for {fn}")
    return int(addr)


@intrinsic
def _call(typingctx, fn, c, argv):  # type: ignore[no-untyped-def]
    # call the C function at address fn with (c, argv)
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        i64 = llvm_ir.IntType(64)
        fnty = llvm_ir.FunctionType(llvm_ir.VoidType(), [i64, i64])
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [args[1], args[2]])
        return context.get_dummy_value()

    return types.void(types.int64, types.int64, types.int64), codegen


@numba.njit(_LAUNCH, parallel=True, cache=True)
def launch(chunk, finish, argv, n_chunks):  # type: ignore[no-untyped-def]
    """``chunk`` (an :func:`address`) over ``n_chunks`` chunks on numba's threads; ``finish``."""
    addr = np.int64(argv.ctypes.data)
    for c in numba.prange(n_chunks):
        _call(chunk, np.int64(c), addr)  # type: ignore[call-arg]
    _call(finish, n_chunks, addr)  # type: ignore[call-arg]


@numba.njit(_LAUNCH, cache=True)
def launch_serial(chunk, finish, argv, n_chunks):  # type: ignore[no-untyped-def]
    """``chunk`` over ``n_chunks`` chunks on the calling thread, then ``finish``."""
    addr = np.int64(argv.ctypes.data)
    for c in range(n_chunks):
        _call(chunk, c, addr)  # type: ignore[call-arg]
    _call(finish, n_chunks, addr)  # type: ignore[call-arg]


_CHAIN = types.void(types.int64[::1], types.int64[::1], types.int64[::1])


def chain_plan(
    pos: list[int], src: list[int], off: list[int],
    chunks: list[int], finishes: list[int], n_chunks: list[int], starts: list[int],
) -> np.ndarray:  # fmt: skip
    """:func:`launch_chain`'s ``plan``: the address fills, then the kernels, in one array.

    ``[n, k, pos (n), src (n), off (n), chunks (k), finishes (k), n_chunks (k), starts (k)]``:
    one array, where seven cost numba's dispatch a microsecond more a call.
    """
    n, k = len(pos), len(chunks)
    assert len(src) == len(off) == n and len(finishes) == len(n_chunks) == len(starts) == k
    return np.array([n, k, *pos, *src, *off, *chunks, *finishes, *n_chunks, *starts], np.int64)


@numba.njit(_CHAIN, parallel=True, cache=True)
def launch_chain(table, argv, plan):  # type: ignore[no-untyped-def]
    """Kernels one after another, each as :func:`launch` runs one (one chunk: on this thread).

    Their ``argv`` arrays lie end to end in ``argv`` (kernel ``k``'s from ``starts[k]``),
    which the caller holds while the kernels read it (an array made here would be freed after
    its last use in this function, before they do); the addresses are filled in first:
    ``argv[pos[i]] = table[src[i]] + off[i]`` (``table``: this call's base addresses;
    ``off``: byte offsets from them). ``plan``: :func:`chain_plan`.
    """
    n = plan[0]
    k = plan[1]
    pos = plan[2 : 2 + n]
    src = plan[2 + n : 2 + 2 * n]
    off = plan[2 + 2 * n : 2 + 3 * n]
    at = 2 + 3 * n
    chunks = plan[at : at + k]
    finishes = plan[at + k : at + 2 * k]
    n_chunks = plan[at + 2 * k : at + 3 * k]
    starts = plan[at + 3 * k : at + 4 * k]
    for i in range(n):
        argv[pos[i]] = table[src[i]] + off[i]
    base = np.int64(argv.ctypes.data)
    for j in range(k):
        addr = base + 8 * starts[j]
        m = n_chunks[j]
        fn = chunks[j]
        if m == 1:
            _call(fn, np.int64(0), addr)  # type: ignore[call-arg]
        else:
            for c in numba.prange(m):
                _call(fn, np.int64(c), addr)  # type: ignore[call-arg]
        _call(finishes[j], m, addr)  # type: ignore[call-arg]


def threads() -> int:
    """``numba.get_num_threads()`` for the calling thread, without its Python (2 us a call)."""
    n = int(_parallel._get_num_threads())  # type: ignore[attr-defined]
    return n if n > 0 else int(numba.get_num_threads())


numba.get_num_threads()  # starts the pool, binding _parallel._get_num_threads
