"""The tree model's six stages, run in order on one tree (see :mod:`fusekit.accel.tree_model`)."""

from __future__ import annotations

from typing import Any

from fusekit.accel.compat import Compat
from fusekit.accel.tree import TreeMapping
from fusekit.accel.tree_model.energy import Energy
from fusekit.accel.tree_model.fit import fit_check
from fusekit.accel.tree_model.nests import build_movements, build_nests
from fusekit.accel.tree_model.report import Report, report
from fusekit.accel.tree_model.steady import SteadyState


def analyse(
    inp: TreeMapping,
    calc_noc: bool = True,
    compat: Compat | None = None,
    memo: dict[tuple[Any, ...], Any] | None = None,
    fold: bool = True,
    detail: bool = True,
) -> Report:
    """Run COMET's stages 1-6 on one run's inputs.

    Args:
        inp: the tree, its hierarchy and its op chain.
        calc_noc: add the routers' energy rows (COMET's ``--calc_noc_energy``).
        compat: which of COMET's defects to reproduce; all of them by default.
        memo: leaf results shared by the tilings of one template, same arch, dims and
            ``compat`` (:meth:`.steady.SteadyState.visit_leaf`); ``None`` evaluates every node.
        fold: a leaf whose costs repeat is evaluated over two and three periods and its totals
            extended (:meth:`.steady.SteadyState.leaf_period`; the same numbers, tested);
            ``False`` walks every iteration of every leaf (the reference).
        detail: build the loop nest and the ideal compute cycles and utilisation; ``False``
            leaves them empty (a mapper scoring tilings reads only the totals and tables).

    Returns:
        The report (:func:`.report.report`).

    Raises:
        FitError: the tiling overflows a level.
        TreeModelError: a tree COMET cannot evaluate.
    """
    compat = compat or Compat()
    fit_check(inp, compat)  # 1: the tiles fit their levels
    nests = build_nests(inp)  # 2: loop nests
    moves = build_movements(inp, nests)  # 3: the tiles each iteration moves
    ss = SteadyState(inp, nests, moves, compat, memo, fold)  # 4: cycles and accesses
    ss.visit(inp.mapping)
    en = Energy(ss, compat)  # 5: energy
    en.walk(inp.mapping, {}, {}, inp.mapping)
    return report(ss, en, inp.mapping, calc_noc, compat, detail)  # 6: the report
