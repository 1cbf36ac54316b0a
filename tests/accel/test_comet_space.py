"""The mapper over COMET's space: the lower bound is a bound, pruning keeps the best tiling."""

from __future__ import annotations

import copy
import csv
import random
from pathlib import Path

import pytest

from fusekit.accel.comet.files import (
    CometInputError,
    compile_mapping,
    read_case,
    read_mapping,
    read_problem,
)
from fusekit.accel.comet.space import Space, Tiling, arch_constraints, constants
from fusekit.accel.compat import Compat
from fusekit.accel.tree import TreeMapping, TreeNode, pre_order, tree_to_dict
from fusekit.accel.tree_model import FitError, analyse, ideal_op_cycles
from fusekit.accel.tree_model.nests import build_movements, build_nests
from fusekit.accel.tree_model.records import Move, MoveRow
from fusekit.accel.tree_model.steady import SteadyState
from fusekit.hw import load
from fusekit.hw.cpu_gpu import plain

ORACLE = Path(__file__).resolve().parents[2] / ".." / "shared" / "oracles" / "comet"
OPS = ("gemm", "gemm_softmax", "gemm_layernorm")
# the shapes of the shared runs (decode, square, and the large ones whose tilings were rejected)
SHAPES = {
    "edge": ((1, 1024, 128), (256, 256, 128), (1024, 1024, 256)),
    "cloud": ((1, 4096, 512), (256, 256, 512), (1024, 1024, 512)),
}


def _space(op: str, hw: str) -> Space:
    return Space.builtin(op, plain(load(hw).comet_arch))  # type: ignore[attr-defined]


def _check_bound(op: str, hw: str, dims: tuple[int, int, int], n: int, seed: int) -> None:
    sp = _space(op, hw)
    extents = dict(zip("MNK", dims, strict=True))
    tilings = sp.tilings(extents, arch_constraints(sp.arch))
    random.Random(seed).shuffle(tilings)
    checked = 0
    for t in tilings:
        if checked == n:
            break
        lb = sp.lower_bound(t, extents)
        exact = [sp.score(t, extents, c).total_cycles for c in (Compat(), Compat.native())]
        if exact[0] is None:
            continue  # rejected by COMET's fit check
        assert all(lb <= c for c in exact if c is not None), (op, hw, dims, t, lb, exact)
        checked += 1
    assert checked == n


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("hw", ["edge", "cloud"])
def test_lower_bound_never_exceeds_the_exact_cycles(op, hw):
    _check_bound(op, hw, SHAPES[hw][0], n=3, seed=17)  # more, and larger shapes, under -m slow


@pytest.mark.slow
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("hw", ["edge", "cloud"])
def test_lower_bound_never_exceeds_the_exact_cycles_many(op, hw):
    for dims in SHAPES[hw]:
        _check_bound(op, hw, dims, n=12, seed=3)


@pytest.mark.skipif(not (ORACLE / "summary.csv").exists(), reason="COMET oracle absent")
def test_lower_bound_is_below_every_shared_run():
    with open(ORACLE / "summary.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["status"] == "ok"
                and (ORACLE / "cases" / r["case"]).is_dir()]  # fmt: skip
    assert len(rows) >= 40
    for r in rows:
        ideal = ideal_op_cycles(read_case(ORACLE / "cases" / r["case"]))
        assert sum(ideal.values()) <= int(r["total_cycles"]), r["case"]
        if r["ideal_Total"]:  # the bound is COMET's own ideal compute total
            assert sum(ideal.values()) == int(r["ideal_Total"]), r["case"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(("hw", "dims"), [("edge", (4, 128, 64)), ("cloud", (1, 4096, 512))])
def test_pruned_search_finds_the_exhaustive_best(op, hw, dims):
    sp = _space(op, hw)
    extents = dict(zip("MNK", dims, strict=True))
    pruned = sp.search(extents)
    full = sp.search(extents, prune=False)
    assert full.pruned == 0 and len(full.scored) == full.tilings
    assert pruned.pruned > 0
    assert pruned.best == full.best
    assert pruned.sample_median_cycles == full.sample_median_cycles
    assert pruned.rejected <= full.rejected


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("hw", ["edge", "cloud"])
def test_leaf_memo_gives_the_reference_record(op, hw):
    sp = _space(op, hw)
    for dims in SHAPES[hw][:2]:
        extents = dict(zip("MNK", dims, strict=True))
        tilings = sp.tilings(extents, arch_constraints(sp.arch))
        tilings.sort(key=lambda t: sp.lower_bound(t, extents))  # the search's order: shared leaves
        for compat in (Compat(), Compat.native()):
            memo: dict = {}
            checked = 0
            for t in tilings:
                if checked == 6:
                    break
                try:
                    ref = analyse(sp.inputs(t, extents), compat=compat)
                except FitError:
                    continue
                assert analyse(sp.inputs(t, extents), compat=compat, memo=memo) == ref, t
                checked += 1
            assert checked == 6 and memo  # leaves were kept


def _folds(inp, compat: Compat) -> int:
    """Leaves of ``inp`` that the steady state folds (:meth:`SteadyState.leaf_period`)."""
    nests = build_nests(inp)
    ss = SteadyState(inp, nests, build_movements(inp, nests), compat)
    return sum(1 for n in pre_order(inp.mapping) if n.is_leaf_tile and ss.leaf_period(n))


@pytest.mark.parametrize("op", (*OPS, "attention"))
@pytest.mark.parametrize("hw", ["edge", "cloud"])
def test_folded_leaves_give_the_walked_record(op, hw):
    # a leaf evaluated over two and three periods and extended must give every number of the
    # report (cycles table, energy rows, loop nest) that walking all its iterations gives
    sp = _space(op, hw)
    folded = checked = 0
    for dims in SHAPES[hw]:
        extents = dict(zip("MNK", dims, strict=True))
        tilings = sp.tilings(extents, arch_constraints(sp.arch))
        random.Random(5).shuffle(tilings)
        for t in tilings[:4]:
            for compat in (Compat(), Compat.native()):
                try:
                    ref = analyse(sp.inputs(t, extents), compat=compat, fold=False)
                except FitError:
                    continue
                inp = sp.inputs(t, extents)
                folded += _folds(inp, compat)
                assert analyse(inp, compat=compat) == ref, (dims, t)
                checked += 1
    assert checked >= 12 and folded >= 4  # folding was exercised


@pytest.mark.parametrize("period", [0, 1, 3, 4])
@pytest.mark.parametrize("n", [0, 1, 5, 12])
def test_move_row_is_the_list_it_stands_for(period, n):
    moved, kept = Move(8, 1, 2), Move(8, 0, 2)
    ref = [moved if i == 0 or (period and i % period == 0) else kept for i in range(n)]
    row = MoveRow(n, period, moved, kept)
    assert list(row) == ref and len(row) == n
    assert [row[i] for i in range(n)] == ref and (n == 0 or row[-1] is ref[-1])
    assert list(row[:3]) == ref[:3] and list(row[: n + 4]) == ref
    assert row.moving() == sum(1 for m in ref if m.unique)
    assert MoveRow(n, period, moved, moved).moving() == n


def _read_afresh(sp: Space, tiling: Tiling, extents: dict[str, int]) -> TreeMapping:
    """The tree as reading the files gives it: problem and mapping read for this tiling alone."""
    const = constants(tiling, extents)
    prob = read_problem(sp.problem_doc, const, "problem.yaml")
    root = read_mapping(sp.mapping_doc, prob, sp.arch, const, "mapping.yaml")
    return TreeMapping(sp.arch, prob, root, const, sp.mapping_file)


def _containers(n: TreeNode) -> list[object]:
    lists = (n.tensors, n.targets, n.childs, n.tags, n.scale, n.rmw, n.order, n.tilings,
             n.primitive, n.tilesizes, n.red_dims, n.red_factors, n.src, n.dest,
             n.children)  # fmt: skip
    return [n, *lists, *n.tilings, *(f for t in n.tilings for f in t), *n.tilesizes.values()]


@pytest.mark.parametrize("op", OPS)
def test_compiled_mapping_gives_the_tree_read_afresh(op, tmp_path):
    """``Space.inputs`` (mapping compiled once, problem kept per sizes) gives the files' tree.

    Every build makes fresh nodes and containers, numbered in pre-order, linked to their parents.
    """
    sp = _space(op, "edge")
    trees: list[TreeMapping] = []  # kept alive, so that no object id is reused
    for dims in SHAPES["edge"][:2]:
        extents = dict(zip("MNK", dims, strict=True))
        tilings = sp.tilings(extents, arch_constraints(sp.arch))
        random.Random(3).shuffle(tilings)
        for t in tilings[:6]:
            got = sp.inputs(t, extents)
            assert tree_to_dict(got) == tree_to_dict(_read_afresh(sp, t, extents)), (dims, t)
            nodes = pre_order(got.mapping)
            assert [n.id for n in nodes] == list(range(len(nodes)))
            assert got.mapping.parent is None
            assert all(c.parent is n for n in nodes for c in n.children)
            trees.append(got)
    owned = [id(x) for tm in trees for n in pre_order(tm.mapping) for x in _containers(n)]
    assert len(owned) == len(set(owned))  # nothing shared between two trees
    t = tilings[0]
    case = sp.write(tmp_path / "case", t, extents, "edge")
    assert tree_to_dict(read_case(case)) == tree_to_dict(sp.inputs(t, extents))


def _first_tiling(sp: Space) -> tuple[Tiling, dict[str, int]]:
    extents = dict(zip("MNK", SHAPES["edge"][1], strict=True))
    return sp.tilings(extents, arch_constraints(sp.arch))[0], extents


def test_compiled_mapping_keeps_the_errors_of_a_walk():
    """A bad constant is named as reading the files names it, tiling after tiling; a failed
    check that needs no constant, in a later node, does not come first."""
    sp = _space("gemm", "edge")
    sp.mapping_doc = copy.deepcopy(sp.mapping_doc)
    root = sp.mapping_doc["mapping"]
    root["factors"] = [str(f).replace("M_A_DRAM_temporal", "M_nowhere") for f in root["factors"]]
    leaf = root
    while leaf.get("subtree"):
        leaf = leaf["subtree"][-1]
    leaf["colour"] = "red"  # an unknown key, in the last node
    t, extents = _first_tiling(sp)
    with pytest.raises(CometInputError) as afresh:
        _read_afresh(sp, t, extents)
    text = str(afresh.value)
    assert text == "mapping.yaml: mapping (datamovement_tile node 0): missing constant 'M_nowhere'"
    for t in sp.tilings(extents, arch_constraints(sp.arch))[:3]:
        with pytest.raises(CometInputError) as cached:
            sp.inputs(t, extents)
        assert str(cached.value) == text
    const = constants(t, extents)
    prob = read_problem(sp.problem_doc, const, "problem.yaml")
    template = compile_mapping(sp.mapping_doc, prob, sp.arch, "mapping.yaml")
    with pytest.raises(CometInputError, match=r"\(\w+ node \d+\): unknown key 'colour'$"):
        template.build({**const, "M_nowhere": 1})
    bad = r"node 0\): expected 'constant M_nowhere' to be an integer >= 1 \(got 0\)$"
    with pytest.raises(CometInputError, match=bad):
        template.build({**const, "M_nowhere": 0})
