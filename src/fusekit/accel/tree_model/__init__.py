"""The cost model of a mapping tree (:mod:`fusekit.accel.tree`), stage by stage.

Its semantics are COMET's (d-matrix-ai/comet, commit 917af0d): the COMET front end
(:mod:`fusekit.accel.comet`) reads COMET's files into a tree and evaluates it here.

The stages, run by :func:`.stages.analyse`, one module each:

1. :mod:`.fit`: per temporal tile node, the bytes of its tensors' tiles at their target level
   (max over sequential siblings, summed over pipelined ones); a level whose request exceeds
   ``width * depth`` of one instance rejects the tiling (DRAM is never checked).
2. :mod:`.nests` (``build_nests``): post-order; each tile node's per-tensor loop descriptors
   (``stride`` = the tile below, ``end`` = stride x factor), its temporal iteration count, its
   spatial fan-out and the time steps of the child per iteration (``relative_timestep``).
3. :mod:`.nests` (``build_movements``): pre-order; per tensor and iteration of a tile node, the
   projected tile (elements), how many distinct tiles move (0 when the tile did not change:
   reuse) and the number of spatial children.
4. :mod:`.steady`: post-order; per tile node and tensor, memory and network cycles of every
   iteration (:mod:`.transfers`) against the child's compute window (:mod:`.compute`: stalls,
   ramp-up of the first read, ramp-down of the last write), merged per target level and port
   (:mod:`.merge`); a node's cycles are the compute window plus ramps plus stalls; a temporal
   node with sequential children sums them; a collective costs :mod:`.collectives`. A leaf
   whose transfers repeat every ``L`` iterations is evaluated over ``2L`` and ``3L`` and its
   totals extended to its ``n`` (:meth:`.steady.SteadyState.leaf_period`; bit-identical to
   walking every iteration, which ``analyse(..., fold=False)`` does).
5. :mod:`.energy`: pre-order; accesses x energy per ``width``-byte block, scaled by the parents'
   iterations and spatial instances; compute energy per op; router energy of the transfers.
6. :mod:`.report`: COMET's per-unit table (CS: ramps, OS: exposed transfers and collectives,
   TMW: compute) and per-level energy rows.

The arithmetic follows COMET's, defects included where the compatibility switch asks for them
(:class:`fusekit.accel.compat.Compat`, each defect named in ``DEVIATIONS``; the COMET front end
turns them on, the native model has them off).

A compiled twin (numba, over flat arrays) scores the tilings of a template in a search:
:mod:`.compiled_tree` (stages 1-3 over a template flattened once; a tiling is a vector of
values), :mod:`.compiled_leaf` and :mod:`.compiled_upper` (stage 4), :mod:`.compiled_energy`
(stages 5-6), :mod:`.compiled` (them together). Each is tested bit-identical to the stages
above, which stay the reference.

Importing this package imports none of its modules (nor numpy); the names below load on use.
"""

from __future__ import annotations

from fusekit.lazy import lazy_getattr

_WHERE = {
    "FitError": "records",
    "TreeModelError": "records",
    "analyse": "stages",
    "compute_cycles": "compute",
    "fit_check": "fit",
    "ideal_op_cycles": "compute",
}

__all__ = sorted(_WHERE)

__getattr__ = lazy_getattr(__name__, _WHERE)
