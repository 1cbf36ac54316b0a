"""COMET's own inputs, evaluated as COMET evaluates them (Negi et al., arXiv 2509.00599).

``evaluate(case_dir)`` (:mod:`.run`) reads a COMET run's ``arch.yaml``, ``problem.yaml``,
``mapping.yaml`` and ``constants.yaml`` (:mod:`.files`) into fusekit's mapping tree
(:mod:`fusekit.accel.tree`: the hierarchy, the op chain, the tree) and evaluates it with the tree
cost model (:mod:`fusekit.accel.tree_model`), COMET's defects switched on
(:class:`fusekit.accel.compat.Compat`). It returns COMET's totals, its per-unit cycle table and
per-level energies. :mod:`.space` searches COMET's tiling space, :mod:`.templates` holds the
built-in ops' templates and :mod:`.fusion` COMET's unfused baseline.

The mapper (:mod:`fusekit.accel.mapper`, ``fusekit accel explore``) searches that space;
the tree model is fusekit's only accel cost model.

Importing this package imports none of its modules (nor numpy); the names below load on use.
"""

from __future__ import annotations

from fusekit.lazy import lazy_getattr

_WHERE = {
    "DEVIATIONS": "run",
    "CometFitError": "run",
    "CometInputError": "run",
    "CometModelError": "run",
    "Compat": "run",
    "MeshShapeError": "run",
    "evaluate": "run",
}

__all__ = sorted(_WHERE)

__getattr__ = lazy_getattr(__name__, _WHERE)
