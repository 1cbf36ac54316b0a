"""The compiled leaf (numba) against the Python stage 4, leaf by leaf, bit for bit.

Every leaf of random tilings of COMET's spaces (../shared/oracles/comet) and of every shared
run's own tree, for ``Compat()`` and ``Compat.native()``, folded and walked whole: the cycles,
the accesses, the merged level costs, the ramp and reuse tables; and every transfer of every
tile node (spatial ones too: network cycles, router energy, sub-mesh errors).
"""

from __future__ import annotations

import functools
import random
from dataclasses import astuple
from typing import Any

import pytest

from fusekit.accel.comet.files import read_case
from fusekit.accel.comet.space import Space, arch_constraints
from fusekit.accel.compat import Compat
from fusekit.accel.noc import MeshShapeError
from fusekit.accel.tree import TreeMapping, TreeNode, pre_order
from fusekit.accel.tree_model import compiled_leaf as cl
from fusekit.accel.tree_model.nests import build_movements, build_nests
from fusekit.accel.tree_model.records import Cost, Nests, TreeModelError
from fusekit.accel.tree_model.steady import LeafResult, SteadyState
from fusekit.accel.tree_model.transfers import Transfers

from .helpers_compiled import CASE_SPACES, CASES, COMPATS, case_dims, needs_oracle

pytestmark = needs_oracle
SPACES = CASE_SPACES
TILINGS = 30


def _tilings(case: str, n: int = TILINGS, seed: int = 0) -> list[TreeMapping]:
    sp = Space(CASES / case)
    dims = case_dims(case)
    tilings = sp.tilings(dims, arch_constraints(sp.arch))
    random.Random(seed).shuffle(tilings)
    return [sp.inputs(t, dims) for t in tilings[:n]]


def _cost_values(c: Cost) -> tuple[Any, ...]:
    """A merged cost's scalars (no parent reads a leaf's per-iteration vectors)."""
    return (c.compute_time, c.reuse, c.tens_idx, c.hide, c.cumm, c.cumm_stall, c.ramp_up,
            c.ramp_down, c.access_count, c.tile_size, c.noc_pj)  # fmt: skip


def _values(res: LeafResult) -> tuple[Any, ...]:
    """A leaf's results as plain values, dict orders included."""
    acc, levels, total, down, up = res
    accesses = [(a.level.name, *astuple(a)[1:]) for a in acc]
    costs = {key: [(lv, [_cost_values(c) for c in pair]) for lv, pair in per.items()]
             for key, per in levels.items()}  # fmt: skip
    return (accesses, costs, total, down and list(down.items()), up and list(up.items()))


def _check_leaves(inp: TreeMapping, compat: Compat, fold: bool) -> int:
    """Compare every leaf of ``inp``; returns how many."""
    nests = build_nests(inp)
    moves = build_movements(inp, nests)
    flat = cl.flatten_arch(inp.arch, compat)
    ss = SteadyState(inp, nests, moves, compat, fold=fold)
    n = 0
    for node in pre_order(inp.mapping):
        if not node.is_leaf_tile:
            continue
        ss._count_reuse(node)
        ss._visit_leaf(node)
        ref = ss._take_leaf(node)
        leaf = cl.flatten_leaf(node, nests.tiles[node.id], moves[node.id], flat)
        out = cl.run_leaf(leaf, flat, fold)
        assert _values(cl.to_leaf_result(out, leaf, flat)) == _values(ref), node.label
        assert cl.leaf_tables(out, leaf) == (ss.reuse[node.id], ss.actual[node.id])
        n += 1
    return n


@pytest.mark.parametrize("compat", COMPATS)
@pytest.mark.parametrize("case", SPACES)
def test_leaves_of_random_tilings(case: str, compat: str) -> None:
    trees = _tilings(case)
    n = sum(_check_leaves(inp, COMPATS[compat], fold=True) for inp in trees)
    n += sum(_check_leaves(inp, COMPATS[compat], fold=False) for inp in trees[:10])
    assert n >= TILINGS


@functools.cache
def _shared_trees() -> tuple[TreeMapping, ...]:
    """Every shared run's tree, read once (the tests do not change them)."""
    return tuple(read_case(d) for d in sorted(CASES.iterdir()))


@pytest.mark.parametrize("compat", COMPATS)
def test_leaves_of_every_shared_run(compat: str) -> None:
    """The runs' own trees: the example run's GEMM unit, the rejected tilings' large leaves."""
    n = 0
    for inp in _shared_trees():
        for fold in (True, False):
            n += _check_leaves(inp, COMPATS[compat], fold)
    assert n >= 100


def _transfer_ref(tr: Transfers, node: TreeNode, t: int, mv: Any) -> Any:
    try:
        return tr._transfer(node, t, mv)
    except MeshShapeError:
        return "mesh"


@pytest.mark.parametrize("compat", COMPATS)
def test_transfers_of_every_tile_node(compat: str) -> None:
    """Memory and network cycles and router energy of every move, spatial nodes' too."""
    seen = set()
    trees = [*_shared_trees(), *_tilings(SPACES[-1], 10)]
    for inp in trees:
        nests: Nests = build_nests(inp)
        moves = build_movements(inp, nests)
        flat = cl.flatten_arch(inp.arch, COMPATS[compat])
        tr = Transfers(inp.arch, nests, moves, flat.generalise)
        for node in pre_order(inp.mapping):
            if node.kind != "tile":
                continue
            slots, _tags, _keys = cl.flatten_slots(node, nests.tiles[node.id], moves[node.id], flat)
            for t, row in enumerate(moves[node.id]):
                for mv in (row.moved, row.kept):
                    err, memory, lat, pj, _a, _b = cl.transfer(
                        flat.lv, flat.net_of, flat.net, flat.net_pj, slots[t], mv.tile,
                        mv.unique, mv.count, flat.generalise,
                    )  # fmt: skip
                    got = "mesh" if err == cl.ERR_MESH else (memory, lat, pj)
                    assert got == _transfer_ref(tr, node, t, mv), (node.label, t, mv)
                    seen.add((mv.count > 1, lat > 0, pj > 0.0, err))
    assert (True, True, True, 0) in seen  # the network and ORION were exercised
    if compat == "comet":
        assert any(e == cl.ERR_MESH for *_x, e in seen)


def _leaf_of(case: str, unit_kind: str) -> tuple[TreeMapping, TreeNode]:
    for inp in _tilings(case, 5):
        for node in pre_order(inp.mapping):
            if node.is_leaf_tile and inp.arch.levels[node.childs[0]].kind == unit_kind:
                return inp, node
    raise AssertionError(f"no leaf on a {unit_kind} unit")


def _break_child(inp: TreeMapping, node: TreeNode) -> None:
    node.childs[0] = node.targets[0]  # a memory level


def _break_simd_op(inp: TreeMapping, node: TreeNode) -> None:
    node.children[0].op_type = "gemm"


def _break_reduction(inp: TreeMapping, node: TreeNode) -> None:
    node.children[0].red_dims = []


def _break_factor(inp: TreeMapping, node: TreeNode) -> None:
    op = node.children[0]
    op.red_factors = {d: 10**6 + 1 for d in op.red_factors}


@pytest.mark.parametrize(
    ("unit", "broken"),
    [
        ("VSIMD", _break_child),
        ("VSIMD", _break_simd_op),
        ("SystolicArray", _break_reduction),
        ("SystolicArray", _break_factor),
    ],
)
def test_errors_as_the_reference(unit: str, broken: Any) -> None:
    inp, node = _leaf_of(SPACES[0], unit)
    broken(inp, node)
    nests = build_nests(inp)
    moves = build_movements(inp, nests)
    ss = SteadyState(inp, nests, moves, Compat())
    with pytest.raises(TreeModelError) as ref:
        ss._visit_leaf(node)
    flat = cl.flatten_arch(inp.arch, Compat())
    with pytest.raises(TreeModelError) as got:
        cl.leaf_result(node, nests.tiles[node.id], moves[node.id], flat)
    assert str(got.value) == str(ref.value)
