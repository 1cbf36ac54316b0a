"""The OpenMP wait policy for work that alternates between numba's and torch's thread pools.

numba's parallel kernels and torch's ops run on two OpenMP runtimes (two libgomp copies). A
runtime that spins after its parallel region keeps its threads busy while the other pool needs
the cores, so fusekit asks for ``OMP_WAIT_POLICY=PASSIVE`` where it may alternate the two: the
``fusekit`` command before any command runs, the tour, and a stitched graph before its kernels
compile. A runtime reads the variable once, when it is loaded: torch's at ``import torch``,
numba's when its first parallel kernel is compiled. Nothing here runs at import; an explicit
value in the environment is never changed.
"""

from __future__ import annotations

import os
import sys

#: The environment variable every OpenMP runtime reads when it starts.
WAIT_POLICY = "OMP_WAIT_POLICY"


def prefer_passive_wait() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` for the OpenMP runtimes loaded from now on, unless set.

    Returns:
        Whether torch's runtime had already started with no policy set (its threads spin after
        each parallel region; only setting the variable before ``import torch`` avoids that).
    """
    torch_spins = "torch" in sys.modules and WAIT_POLICY not in os.environ
    os.environ.setdefault(WAIT_POLICY, "PASSIVE")
    return torch_spins
