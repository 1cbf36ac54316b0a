"""numba's ``noalias`` compiler flag as a jit option: ``@numba.njit(..., noalias=True)``.

numba marks every pointer argument of a function compiled with its ``noalias`` flag (an array
argument's data pointer among them) with LLVM's ``noalias``, as it does for the gufuncs of its
own parallel loops, but offers no option that sets the flag. Without it LLVM must prove at run
time that no output overlaps an input before it runs a loop's vector code: one check per pair of
arrays, and past ``-vectorize-memory-check-threshold`` (128) pairs it keeps the scalar loop. A
kernel streaming 40 inputs and 20 outputs per row ran scalar, 3x slower than Inductor's one
loop. A generated kernel (:mod:`.cpu`) passes its arrays, distinct allocations, to its row
loop compiled with this option.

Importing this module adds the option to numba's CPU target (once); the generated modules
import it, so that a compile worker has it too.
"""

from __future__ import annotations

from numba.core import cpu, options

#: The jit option's name, the ``numba.core.compiler.Flags`` field it sets.
OPTION = "noalias"


def install() -> None:
    """Let ``numba.njit`` take ``noalias=`` (maps to the compiler flag of that name).

    Raises:
        RuntimeError: numba's flags have no ``noalias`` field (a numba that dropped it).
    """
    import numba
    from numba.core.compiler import Flags

    if not hasattr(Flags, OPTION):
        raise RuntimeError(f"stitch: numba {numba.__version__} has no '{OPTION}' flag")
    target = cpu.CPUTargetOptions
    if not isinstance(getattr(target, OPTION, None), options.TargetOptions.Mapping):
        setattr(target, OPTION, options.TargetOptions.Mapping(OPTION))  # type: ignore[no-untyped-call]


install()
