"""The compiled stages 5 and 6 (numba) against the Python energy walk and report, bit for bit.

Random tilings of COMET's spaces (../shared/oracles/comet) and every shared run's own tree, for
``Compat()`` and ``Compat.native()``: the totals a mapper reads (cycles, float32 energy), each
unit's CS/OS/TMW, each energy row, and stage 5 in detail (per node and level the energy and the
routers' energy, the parents' iterations, the accesses' scaled counts).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from fusekit.accel.comet.files import read_case
from fusekit.accel.comet.space import Space, arch_constraints
from fusekit.accel.compat import Compat
from fusekit.accel.noc import MeshShapeError
from fusekit.accel.tree import TreeMapping, TreeNode, pre_order
from fusekit.accel.tree_model import compiled_energy as ce
from fusekit.accel.tree_model.energy import Energy
from fusekit.accel.tree_model.fit import fit_check
from fusekit.accel.tree_model.nests import build_movements, build_nests
from fusekit.accel.tree_model.records import FitError, TreeModelError
from fusekit.accel.tree_model.report import report
from fusekit.accel.tree_model.stages import analyse
from fusekit.accel.tree_model.steady import SteadyState

from .helpers_compiled import CASE_SPACES, CASES, COMPATS, case_dims, needs_oracle

pytestmark = needs_oracle
SPACES = CASE_SPACES[:-1]
TILINGS = 30


@functools.cache
def _space(case: str) -> Space:
    return Space(CASES / case)


def _tilings(case: str, n: int = TILINGS, seed: int = 0) -> list[TreeMapping]:
    sp = _space(case)
    dims = case_dims(case)
    tilings = sp.tilings(dims, arch_constraints(sp.arch))
    random.Random(seed).shuffle(tilings)
    return [sp.inputs(t, dims) for t in tilings[: 3 * n]]


def _stage4(inp: TreeMapping, compat: Compat) -> SteadyState:
    fit_check(inp, compat)
    nests = build_nests(inp)
    ss = SteadyState(inp, nests, build_movements(inp, nests), compat)
    ss.visit(inp.mapping)
    return ss


def _check(inp: TreeMapping, compat: Compat, calc_noc: bool, fe: ce.FlatEnergyArch) -> None:
    """Compare stages 5 and 6 of one tree after stage 4."""
    ss = _stage4(inp, compat)
    tree = ce.flatten_tree(ss, fe)  # before the walk scales the accesses
    out = ce.run_energy(tree, fe, calc_noc)
    en = Energy(ss, compat)
    en.walk(inp.mapping, {}, {}, inp.mapping)
    ref = report(ss, en, inp.mapping, calc_noc, compat, False)
    got = ce.to_report(out, tree)
    assert got == {k: ref[k] for k in got}
    assert type(got["total_cycles"]) is int and type(got["total_energy_pj"]) is float
    names = fe.flat.names
    for r, node in enumerate(tree.tree):
        level = {names[g]: out.level_pj[r, g] for g in range(len(names)) if out.level_has[r, g]}
        noc = {f"{names[g]}<->{names[g]}": out.noc_pj[r, g]
               for g in range(len(names)) if out.noc_has[r, g]}  # fmt: skip
        assert level == en.level_pj.get(node.id, {}), node.label
        assert noc == en.noc_pj.get(node.id, {}), node.label
        its = int(out.parent_iters[r])
        assert (its if its >= 0 else None) == en.parent_iters.get(node.id), node.label
    counts = [a.count for node in pre_order(inp.mapping) for a in ss.accesses.get(node.id, [])]
    assert out.counts.tolist() == counts


@pytest.mark.parametrize("compat", COMPATS)
@pytest.mark.parametrize("case", SPACES)
def test_random_tilings(case: str, compat: str) -> None:
    c = COMPATS[compat]
    fe = ce.flatten_energy_arch(_space(case).arch, c)
    n = 0
    for inp in _tilings(case):
        if n == TILINGS:
            break
        try:
            _check(inp, c, calc_noc=True, fe=fe)
        except FitError:
            continue
        n += 1
    assert n == TILINGS


@functools.cache
def _shared_cases() -> tuple[Path, ...]:
    return tuple(sorted(CASES.iterdir()))


@pytest.mark.parametrize("compat", COMPATS)
def test_every_shared_run(compat: str) -> None:
    """The runs' own trees (the example run's GEMM unit and collectives, the ``_noc`` one)."""
    c = COMPATS[compat]
    n = 0
    for case in _shared_cases():
        inp = read_case(case)
        fe = ce.flatten_energy_arch(inp.arch, c)
        for calc_noc in (True, False):
            try:
                _check(inp, c, calc_noc, fe)
            except (FitError, MeshShapeError):  # rejected tilings; 3x3 sub-meshes (COMET)
                continue
            n += 1
    assert n >= 40


def test_analyse_compiled_matches_analyse() -> None:
    case = CASES / "ex_example_run_gemm_softmax_fused_M256_N1024_K4096_noc"
    for c in COMPATS.values():
        ref = analyse(read_case(case), compat=c, detail=False)
        got = ce.analyse_compiled(read_case(case), compat=c)
        assert got == {k: ref[k] for k in got}
        assert any(k.endswith("-GATHER") for k in got["energy_pj"])


def _errors(case: Path, broken: Callable[[SteadyState, TreeNode], bool]) -> tuple[str, str]:
    """The kernel's and the reference's errors for a tree broken after stage 4.

    ``broken``: breaks the first node it returns true for (in pre-order).
    """
    inp = read_case(case)
    ss = _stage4(inp, Compat())
    next(n for n in pre_order(inp.mapping) if broken(ss, n))
    fe = ce.flatten_energy_arch(inp.arch, Compat())
    tree = ce.flatten_tree(ss, fe)
    with pytest.raises(TreeModelError) as got:
        ce.run_energy(tree, fe)
    with pytest.raises(TreeModelError) as ref:
        Energy(ss, Compat()).walk(inp.mapping, {}, {}, inp.mapping)
    return str(got.value), str(ref.value)


def _break_collective(ss: SteadyState, node: TreeNode) -> bool:
    if node.kind != "collective":
        return False
    node.in_tensor = 11  # no tile node on its left holds it
    return True


def _break_simd_op(ss: SteadyState, node: TreeNode) -> bool:
    if not (node.is_leaf_tile and node.childs[0] == "SE"):
        return False
    ss.accesses[node.id][-1].op_type = "cosine"  # the unit's access: a SIMD op without energy
    return True


def _break_scope(ss: SteadyState, node: TreeNode) -> bool:
    if not (node.is_leaf_tile and node.parent is not None and node.parent.spatial):
        return False
    node.tensors = [11] * len(node.tensors)  # none of its tensors above it
    return True


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        (_break_collective, "no tile node producing"),
        (_break_simd_op, "has no SIMD energy"),
        (_break_scope, "no parent iteration count"),
    ],
)
def test_errors_as_the_reference(
    broken: Callable[[SteadyState, TreeNode], bool], message: str
) -> None:
    got, ref = _errors(CASES / SPACES[0], broken)
    assert got == ref and message in got


def _shuffle_tags(ss: SteadyState, rng: random.Random) -> None:
    """Break the tree after stage 4 at random where stage 5 branches: op tags and collectives.

    Tags of tensors and accesses are redrawn from the tree's, and collectives are inserted under
    random tile nodes on random tensors (COMET's tables then miss, or match several tags).
    """
    nodes = pre_order(ss.inp.mapping)
    tags = sorted({t for n in nodes for t in n.tags})
    next_id = max(n.id for n in nodes) + 1
    for node in nodes:
        if node.kind != "tile":
            continue
        node.tags = [rng.choice(tags) if rng.random() < 0.3 else t for t in node.tags]
        for a in ss.accesses.get(node.id, []):
            if rng.random() < 0.3:
                a.tag = rng.choice(tags)
        if node.is_leaf_tile or rng.random() < 0.5:
            continue
        tids = sorted({t for c in node.children if c.kind == "tile" for t in c.tensors})
        col = TreeNode(id=next_id, kind="collective", parent=node, col_type="allreduce",
                       in_tensor=rng.choice(tids or [0]), target=node.targets[0])  # fmt: skip
        node.children.insert(rng.randrange(len(node.children) + 1), col)
        ss.col_energy[next_id] = (rng.random() * 100.0, rng.random())
        next_id += 1


@pytest.mark.parametrize("compat", COMPATS)
@pytest.mark.parametrize(
    "case",
    [SPACES[0], SPACES[5], "ex_example_run_gemm_softmax_fused_M256_N1024_K4096_noc"],
)
def test_broken_trees(case: str, compat: str) -> None:
    """Random tags and collectives: the same numbers, or the same error, as the reference."""
    c = COMPATS[compat]
    rng = random.Random(1)
    inp = read_case(CASES / case)
    fe = ce.flatten_energy_arch(inp.arch, c)
    ss = _stage4(inp, c)
    nodes = pre_order(inp.mapping)
    shape = [(n, list(n.tags), list(n.children)) for n in nodes]
    accesses = {k: [replace(a) for a in v] for k, v in ss.accesses.items()}
    col_energy = dict(ss.col_energy)
    outcomes = set()
    for _ in range(40):
        for n, tags, children in shape:  # the tree as stage 4 left it
            n.tags, n.children = list(tags), list(children)
        ss.accesses = {k: [replace(a) for a in v] for k, v in accesses.items()}
        ss.col_energy = dict(col_energy)
        _shuffle_tags(ss, rng)
        tree = ce.flatten_tree(ss, fe)
        try:
            out = ce.run_energy(tree, fe)
        except TreeModelError as e:
            with pytest.raises(TreeModelError) as ref:
                Energy(ss, c).walk(inp.mapping, {}, {}, inp.mapping)
            assert str(ref.value) == str(e)
            outcomes.add(str(e).split(": ")[-1])
            continue
        en = Energy(ss, c)
        en.walk(inp.mapping, {}, {}, inp.mapping)
        ref_report = report(ss, en, inp.mapping, True, c, False)
        got = ce.to_report(out, tree)
        assert got == {k: ref_report[k] for k in got}
        assert out.parent_iters.tolist() == [en.parent_iters.get(n.id, -1) for n in tree.tree]
        outcomes.add("ok")
    assert "ok" in outcomes


def test_collective_reads_the_newest_tag() -> None:
    """Under a spatial node, a collective's count is that of the tag ``iters`` got last.

    Node 22 (spatial: tensors 5 and 7) sends tensor 5 down under a new tag, EXP1, after ROWSUM;
    the tiles on the collective's left hold tensor 5 under both: the reference reads EXP1's
    count (``iters``' insertion order), not ROWSUM's (the tags' order in the tree).
    """
    inp = read_case(CASES / SPACES[0])
    ss = _stage4(inp, Compat())
    nodes = {n.id: n for n in pre_order(inp.mapping)}
    spatial = nodes[22]
    child = next(a for a in ss.accesses[22] if a.tid == 5 and not a.at_target)
    child.tag = "EXP1"
    nodes[26].tags[0] = "EXP1"
    col = TreeNode(id=99, kind="collective", parent=spatial, col_type="allreduce", in_tensor=5,
                   target="GB")  # fmt: skip
    spatial.children.append(col)
    ss.col_energy[99] = (3.0, 0.5)
    fe = ce.flatten_energy_arch(inp.arch, Compat())
    tree = ce.flatten_tree(ss, fe)
    out = ce.run_energy(tree, fe)
    en = Energy(ss, Compat())
    en.walk(inp.mapping, {}, {}, inp.mapping)
    ref = report(ss, en, inp.mapping, True, Compat(), False)
    assert ce.to_report(out, tree) == {k: ref[k] for k in ce.to_report(out, tree)}
    row = tree.tree.index(col)
    assert out.parent_iters[row] == en.parent_iters[99] != 1
