"""The compiled stages 1-3 (numba) against the Python reference, tiling by tiling, bit for bit.

Random tilings of COMET's spaces (../shared/oracles/comet) and of the built-in ops' spaces, for
``Compat()`` and ``Compat.native()``: the fit verdict and the overflowing levels, every loop nest
(descriptors, iterations, time steps, the collectives' extents) and every move row; the values
read from the constants against those read off the tree; the leaves' slots as the compiled leaf
flattens them; and the reference's exceptions on broken trees.
"""

from __future__ import annotations

import copy
import functools
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from fusekit.accel.comet.files import compile_mapping, read_case
from fusekit.accel.comet.space import Space, Tiling, arch_constraints, constants
from fusekit.accel.compat import Compat
from fusekit.accel.tree import TreeMapping, TreeNode, pre_order
from fusekit.accel.tree_model import compiled_leaf as cl
from fusekit.accel.tree_model import compiled_tree as ct
from fusekit.accel.tree_model.fit import fit_check
from fusekit.accel.tree_model.nests import build_movements, build_nests
from fusekit.accel.tree_model.records import FitError, Moves

from .helpers_compiled import (
    CASE_SPACES,
    CASES,
    COMPATS,
    OPS,
    SHAPES,
    builtin_space,
    case_space,
    needs_oracle,
)

SPACES = CASE_SPACES
TILINGS = 30


def _moves(moves: Moves) -> dict[int, list[tuple[Any, ...]]]:
    """Move rows as plain values."""
    return {k: [(r.n, r.period, (r.moved.tile, r.moved.unique, r.moved.count),
                 (r.kept.tile, r.kept.unique, r.kept.count)) for r in rows]
            for k, rows in moves.items()}  # fmt: skip


def _reference(inp: TreeMapping, compat: Compat) -> Any:
    """Stages 1-3 of the reference: the nests and moves, or the exception (type, message)."""
    try:
        fit_check(inp, compat)
        nests = build_nests(inp)
        moves = build_movements(inp, nests)
    except FitError as e:
        return ("fit", e.overflows, str(e))
    except Exception as e:  # the reference's errors, compared by type and message
        return (type(e), str(e))
    return nests, _moves(moves)


def _compiled(flat: ct.FlatTree, vals: np.ndarray) -> Any:
    """The same of the compiled stages."""
    try:
        out = ct.run_tree(flat, vals)
    except FitError as e:
        return ("fit", e.overflows, str(e))
    except Exception as e:
        return (type(e), str(e))
    return ct.to_nests(flat, out), _moves(ct.to_moves(flat, out))


def _check_leaves(flat: ct.FlatTree, inp: TreeMapping, vals: np.ndarray, ref: Any) -> int:
    """Every leaf's slots, op, tags and keys as the compiled leaf flattens them."""
    nests, _ = ref
    moves = build_movements(inp, build_nests(inp))
    out = ct.run_tree(flat, vals)
    nodes = pre_order(inp.mapping)
    n = 0
    for i in np.flatnonzero(flat.nd[:, ct.ND_LEAF]):
        node = nodes[i]
        got = ct.flat_leaf(flat, out, vals, int(i))
        want = cl.flatten_leaf(node, nests.tiles[node.id], moves[node.id], flat.arch)
        assert np.array_equal(got.slots, want.slots), node.label
        assert np.array_equal(got.op, want.op), node.label
        assert (got.tags, got.keys) == (want.tags, want.keys)
        n += got.slots.shape[0]
    return n


def _check_space(sp: Space, dims: dict[str, int], compat: Compat, seed: int = 0) -> list[int]:
    """Compare random tilings of a space; returns [tilings, accepted, rejected, slots]."""
    tilings: list[Tiling] = sp.tilings(dims, arch_constraints(sp.arch))
    random.Random(seed).shuffle(tilings)
    tilings = tilings[:TILINGS]
    first = sp.inputs(tilings[0], dims)
    tpl = compile_mapping(sp.mapping_doc, first.problem, sp.arch, "mapping.yaml")
    flat = ct.flatten_template(first, compat, tpl)
    assert not flat.errors
    counts = [0, 0, 0, 0]
    rows = []
    for t in tilings:
        inp = sp.inputs(t, dims)
        vals = ct.template_values(flat, constants(t, dims))
        assert np.array_equal(vals, ct.tree_values(flat, inp.mapping)), t
        ref = _reference(inp, compat)
        assert _compiled(flat, vals) == ref, t
        counts[0] += 1
        if ref[0] == "fit":
            counts[2] += 1
        else:
            counts[1] += 1
            counts[3] += _check_leaves(flat, inp, vals, ref)
        rows.append(vals)
    single = [ct.evaluate(flat, v) for v in rows]
    batch = ct.evaluate_batch(flat, np.array(rows))
    for name in ("head", "req", "slots", "desc", "col_ext"):
        assert np.array_equal(np.array([getattr(o, name) for o in single]), getattr(batch, name))
    return counts


@needs_oracle
@pytest.mark.parametrize("compat", COMPATS)
@pytest.mark.parametrize("case", SPACES)
def test_random_tilings_of_comet_spaces(case: str, compat: str) -> None:
    tilings, accepted, _rejected, slots = _check_space(*case_space(case), COMPATS[compat])
    assert tilings == TILINGS and accepted and slots


@pytest.mark.parametrize("compat", COMPATS)
@pytest.mark.parametrize("hw", SHAPES)
@pytest.mark.parametrize("op", OPS)
def test_random_tilings_of_builtin_spaces(op: str, hw: str, compat: str) -> None:
    tilings, accepted, _rejected, slots = _check_space(*builtin_space(op, hw), COMPATS[compat])
    assert tilings == TILINGS and accepted and slots


def test_rejected_tilings_name_the_levels() -> None:
    sp, _ = builtin_space("gemm_softmax", "cloud")
    counts = _check_space(sp, {"M": 1024, "N": 1024, "K": 512}, Compat.native(), seed=3)
    assert counts[2] > 0  # the fit check rejected some, each with its levels


# --- broken trees: the reference's exceptions, where the walk meets them -----------------------


def _find(inp: TreeMapping, pred: Callable[[TreeNode], bool]) -> TreeNode:
    return next(n for n in pre_order(inp.mapping) if pred(n))


def _no_binding(inp: TreeMapping) -> None:
    """A tile node whose left sibling is a tile (COMET crashes; stage 1)."""
    parent = _find(inp, lambda n: [c.kind for c in n.children] == ["bind", "tile", "tile"])
    parent.children = parent.children[1:]


def _not_produced(inp: TreeMapping) -> None:
    """A collective whose tensor is not produced at its level (stage 2)."""
    col = _find(inp, lambda n: n.kind == "collective")
    col.target = "DRAM"


def _spatial_under_spatial(inp: TreeMapping) -> None:
    """A spatial tile whose parent is spatial (stage 3)."""
    node = _find(inp, lambda n: n.kind == "tile" and n.spatial and n.parent is not None
                 and n.parent.parent is not None and n.parent.kind == "tile")  # fmt: skip
    node.parent.spatial = True  # type: ignore[union-attr]


def _zero_stride(inp: TreeMapping) -> None:
    """An op whose tile steps leave out a projected dim: a spatial slot divides by 0 (stage 3)."""
    op = _find(inp, lambda n: n.kind == "op" and n.op_type == "gemm")
    for ts in op.tilesizes.values():
        ts.pop(0, None)


@pytest.mark.parametrize("compat", COMPATS)
@pytest.mark.parametrize(
    "broken", [_no_binding, _not_produced, _spatial_under_spatial, _zero_stride]
)
def test_errors_as_the_reference(broken: Callable[[TreeMapping], None], compat: str) -> None:
    sp, dims = builtin_space("gemm_softmax", "edge")
    tilings = sp.tilings(dims, arch_constraints(sp.arch))
    random.Random(1).shuffle(tilings)
    trees = []
    for t in tilings[:20]:
        inp = copy.deepcopy(sp.inputs(t, dims))
        broken(inp)
        trees.append(inp)
    flat = ct.flatten_template(trees[0], COMPATS[compat])
    outcomes = set()
    for inp in trees:
        ref = _reference(inp, COMPATS[compat])
        assert _compiled(flat, ct.tree_values(flat, inp.mapping)) == ref
        outcomes.add(ref[0] if ref[0] == "fit" else getattr(ref[0], "__name__", "ok"))
    assert outcomes - {"fit", "ok"}, outcomes  # the error was met, not only rejections


@functools.cache
def _shared_trees() -> tuple[TreeMapping, ...]:
    """Every shared run's tree, read once (the tests do not change them)."""
    return tuple(read_case(d) for d in sorted(CASES.iterdir()))


@needs_oracle
@pytest.mark.parametrize("compat", COMPATS)
def test_every_shared_run(compat: str) -> None:
    """The runs' own trees, flattened without a template (the example run, the rejected ones)."""
    n = 0
    for inp in _shared_trees():
        flat = ct.flatten_template(inp, COMPATS[compat])
        vals = ct.tree_values(flat, inp.mapping)
        assert np.array_equal(vals, flat.ref_vals)
        assert _compiled(flat, vals) == _reference(inp, COMPATS[compat]), inp.mapping_file
        n += 1
    assert n >= 40
