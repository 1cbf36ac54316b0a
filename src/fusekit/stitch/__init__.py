"""Fusion planning and stitched kernels for chains of memory-intensive ops (FusionStitching).

Entry points: ``torch.compile(model, backend="fusekit")`` (:mod:`fusekit.stitch.dynamo`,
registered at install) and ``fusekit.stitch.compile(model, args)`` (:mod:`fusekit.stitch.runner`).

The pipeline (DESIGN.md)::

    graph --classify--> dominant ops --candidates--> convex groups --model--> cost per group
          --search (ILP on HiGHS, greedy warm start)--> plan --codegen (numba / Triton)--> runner
"""

from fusekit.lazy import lazy_getattr

_WHERE = {"compile": "runner", "Stitched": "runner", "fusekit_backend": "dynamo"}
__getattr__ = lazy_getattr(__name__, _WHERE)
__all__ = sorted(_WHERE)
