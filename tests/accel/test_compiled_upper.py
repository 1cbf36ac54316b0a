"""The compiled stage 4 of a whole tree (numba) against the Python one, node by node, bit for bit.

Random tilings of COMET's spaces (../shared/oracles/comet) and every shared run's own tree, for
``Compat()`` and ``Compat.native()``: every node's cycles, merged level costs, accesses, reuse
and ramp tables and the collectives' energies, or the same exception. Then trees the spaces
never build: every collective kind and reduction op, networks with and without in-network
broadcast and reduction, spatial nodes whose child meets no tensor (the dummy pair) or is a
collective (transfers not hidden), bindings COMET cannot model, and spatial nodes' iterations
and moves perturbed at random (reuse, differing iterations, sub-meshes out of the table).
"""

from __future__ import annotations

import functools
import random
from dataclasses import astuple, replace
from typing import Any

import pytest

from fusekit.accel.comet.files import read_case
from fusekit.accel.comet.space import Space, arch_constraints
from fusekit.accel.compat import Compat
from fusekit.accel.tree import TreeMapping, TreeNode, pre_order
from fusekit.accel.tree_model import compiled_leaf as cl
from fusekit.accel.tree_model import compiled_upper as cu
from fusekit.accel.tree_model.fit import fit_check
from fusekit.accel.tree_model.nests import build_movements, build_nests
from fusekit.accel.tree_model.records import Cost, FitError, Move, MoveRow, Moves, Nests
from fusekit.accel.tree_model.steady import SteadyState

from .helpers_compiled import CASE_SPACES, CASES, COMPATS, case_dims, needs_oracle

pytestmark = needs_oracle
SPACES = CASE_SPACES
TILINGS = 30


def _tilings(case: str, compat: Compat, n: int = TILINGS) -> list[TreeMapping]:
    """The first ``n`` tilings of a seeded shuffle that pass the fit check."""
    sp = Space(CASES / case)
    dims = case_dims(case)
    tilings = sp.tilings(dims, arch_constraints(sp.arch))
    random.Random(0).shuffle(tilings)
    out = []
    for t in tilings:
        inp = sp.inputs(t, dims)
        try:
            fit_check(inp, compat)
        except FitError:
            continue
        out.append(inp)
        if len(out) == n:
            break
    return out


@functools.cache
def _shared_trees() -> tuple[TreeMapping, ...]:
    """Every shared run's tree, read once (the tests copy what they change)."""
    return tuple(read_case(d) for d in sorted(CASES.iterdir()))


def _cost_values(c: Cost) -> tuple[Any, ...]:
    """A level cost's scalars (no parent reads the per-iteration vectors)."""
    return (c.compute_time, c.reuse, c.tens_idx, c.hide, c.cumm, c.cumm_stall, c.ramp_up,
            c.ramp_down, c.access_count, c.tile_size, c.noc_pj)  # fmt: skip


def _tables(ss: Any) -> dict[str, Any]:
    """Stage 4's tables as plain values (dicts compared as dicts, lists in order)."""
    return {
        "node_cost": ss.node_cost,
        "level_cost": {
            nid: {
                key: {lv: [_cost_values(c) for c in pair] for lv, pair in per.items()}
                for key, per in levels.items()
            }
            for nid, levels in ss.level_cost.items()
        },
        "accesses": {
            nid: [(a.level.name, *astuple(a)[1:]) for a in acc] for nid, acc in ss.accesses.items()
        },
        "reuse": ss.reuse,
        "actual": ss.actual,
        "ramp_up": ss.ramp_up,
        "ramp_down": ss.ramp_down,
        "col_energy": ss.col_energy,
    }


def _outcome(run: Any) -> tuple[str, Any]:
    """``run()``'s tables, or its exception's type and message."""
    try:
        return "ok", _tables(run())
    except Exception as e:  # the reference's exceptions: COMET's crashes, named
        return type(e).__name__, str(e)


def _compare(
    inp: TreeMapping,
    compat: Compat,
    nests: Nests | None = None,
    moves: Moves | None = None,
    shape: cu.TreeShape | None = None,
) -> str:
    """The compiled tables of ``inp`` against the reference's; returns the outcome's kind."""
    if nests is None or moves is None:
        nests = build_nests(inp)
        moves = build_movements(inp, nests)
    flat = cl.flatten_arch(inp.arch, compat)

    def compiled() -> cu.TreeResult:
        return cu.steady_state(inp, nests, moves, flat, compat, shape)

    def reference() -> SteadyState:
        ss = SteadyState(inp, nests, moves, compat, None, True)
        ss.visit(inp.mapping)
        return ss

    got = _outcome(compiled)  # first: it reads the nests, the reference changes and restores
    want = _outcome(reference)
    assert got == want
    return want[0]


@pytest.mark.parametrize("compat", COMPATS)
@pytest.mark.parametrize("case", SPACES)
def test_random_tilings(case: str, compat: str) -> None:
    """The tilings share one shape (the template's), kept from the first."""
    trees = _tilings(case, COMPATS[compat])
    shape = cu.tree_shape(trees[0], cl.flatten_arch(trees[0].arch, COMPATS[compat]),
                          COMPATS[compat])  # fmt: skip
    kinds = [_compare(inp, COMPATS[compat], shape=shape) for inp in trees]
    assert len(kinds) == TILINGS
    assert kinds.count("ok") >= TILINGS // 2


@pytest.mark.parametrize("compat", COMPATS)
def test_every_shared_run(compat: str) -> None:
    """The runs' own trees: the example run's gather and GEMM unit, the rejected tilings."""
    kinds = [_compare(inp, COMPATS[compat]) for inp in _shared_trees()]
    assert kinds.count("ok") >= len(kinds) - 2


# --- trees the spaces never build ---------------------------------------------------------------


def _nodes(inp: TreeMapping, kind: str) -> list[TreeNode]:
    return [n for n in pre_order(inp.mapping) if n.kind == kind]


def _case(name: str) -> TreeMapping:
    """A shared run's tree, read afresh (its nodes, levels and networks to change)."""
    return read_case(CASES / name)


@pytest.mark.parametrize("kind", ["gather", "broadcast", "reduction", "allgather", "allreduce",
                                  "scatter", "shift"])  # fmt: skip
def test_collective_kinds(kind: str) -> None:
    """Collective kinds by reduction op, network flags and shape, sources and destinations.

    A seeded sample of the variants: in-network broadcast and reduction on or off, one
    destination (a scatter's error) or one source (a gather divides by zero), a 2x8 mesh (a
    sub-mesh outside COMET's table).
    """
    inp = _case("im_cloud_gemm_softmax_fused_M256_N256_K512_ok0")
    cols = _nodes(inp, "collective")
    ends = {c.id: (list(c.src), list(c.dest)) for c in cols}
    nets = {c.target: inp.arch.levels[c.target].link_net for c in cols}
    rng = random.Random(kind)
    kinds = set()
    for _ in range(40):
        red_op = rng.choice(["", "add", "max", "mult", "min"])
        flags = rng.randrange(32)
        for c in cols:  # every variant sets all it changes
            c.col_type, c.red_op = kind, red_op
            src, dest = ends[c.id]
            c.src = [] if flags & 8 else src
            c.dest = [] if flags & 4 else dest
            net = nets[c.target]
            assert net is not None
            inp.arch.levels[c.target].link_net = replace(
                net, broadcast=bool(flags & 1), reduction=bool(flags & 2),
                dims=(2, 8) if flags & 16 else net.dims,
            )  # fmt: skip
        for compat in COMPATS.values():
            kinds.add(_compare(inp, compat))
    assert "ok" in kinds


def test_spatial_dummy_pair() -> None:
    """A spatial node whose tags its child does not run: the child's cycles on the pair."""
    inp = _case("im_cloud_gemm_softmax_fused_M256_N256_K512_ok0")
    top = inp.mapping.children[0]
    assert top.spatial and len(top.children) == 1
    nests = build_nests(inp)
    moves = build_movements(inp, nests)
    top.tags = [f"none{t}" for t in range(len(top.tags))]  # after stage 3: stage 4 reads them
    for compat in COMPATS.values():
        assert _compare(inp, compat, nests, moves) == "ok"


def test_spatial_collective_child() -> None:
    """A spatial node's tensors reaching a collective child: transfers not hidden."""
    for case in ("ex_example_run_gemm_softmax_fused_M256_N1024_K4096",
                   "im_cloud_gemm_softmax_fused_M256_N256_K512_ok0"):  # fmt: skip
        inp = _case(case)
        for node in _nodes(inp, "tile"):
            cols = [c for c in node.children if c.kind == "collective"]
            if node.spatial or cols:
                for c in cols:
                    c.tag = node.tags[0]
        for compat in COMPATS.values():
            assert _compare(inp, compat) == "ok"


def test_errors_as_the_reference() -> None:
    """Bindings COMET cannot model or misreads, a broken leaf, a level without a link network,
    a tensor that moves over no iteration: the reference's exceptions, the first in post-order.
    """
    name = "im_cloud_gemm_softmax_fused_M256_N256_K512_ok0"
    seen = set()
    for binding in ("pipeline", "parallel"):
        inp = _case(name)
        _nodes(inp, "bind")[-1].binding = binding
        for compat in COMPATS.values():
            seen.add(_compare(inp, compat))
    inp = _case(name)
    for node in _nodes(inp, "tile"):  # drop the bindings: children side by side
        node.children = [c for c in node.children if c.kind != "bind"]
    for compat in COMPATS.values():
        seen.add(_compare(inp, compat))
    inp = _case(name)
    next(n for n in _nodes(inp, "op") if n.op_type == "div").op_type = "gemm"
    seen.add(_compare(inp, Compat()))
    inp = _case(name)
    inp.arch.levels[_nodes(inp, "collective")[0].target].link_net = None
    seen.add(_compare(inp, Compat()))
    inp = _case(name)
    nests = build_nests(inp)
    moves = build_movements(inp, nests)
    spatial = next(n for n in _nodes(inp, "tile") if n.spatial and not n.is_leaf_tile)
    row = moves[spatial.id][0]
    moves[spatial.id][0] = MoveRow(0, row.period, row.moved, row.kept)
    seen.add(_compare(inp, Compat(), nests, moves))
    assert {"TreeModelError", "IndexError"} <= seen


def _has_bandwidth(inp: TreeMapping, node: TreeNode, t: int, rw: bool) -> bool:
    """Whether a read (write) of tensor ``t`` has both levels' bandwidths (the arch's are 0
    for directions a level never serves; :mod:`.compiled_leaf` raises ZeroDivisionError there,
    the reference OverflowError or ValueError)."""
    target, child = inp.arch.levels[node.targets[t]], inp.arch.levels[node.childs[t]]
    ok = target.bw("child_write_bw" if rw else "child_read_bw") > 0
    if rw and node.rmw[t]:
        ok = ok and target.bw("child_read_bw") > 0
    return ok and (child.is_compute or child.bw("parent_read_bw" if rw else "parent_write_bw") > 0)


def _perturb(inp: TreeMapping, nests: Nests, moves: Moves, rng: random.Random) -> None:
    """Random iterations, reads and writes, dependences and moves of the spatial nodes."""
    for node in _nodes(inp, "tile"):
        if not node.spatial:
            continue
        nest = nests.tiles[node.id]
        rows = moves[node.id]
        for t in range(len(node.tensors)):
            if rng.random() < 0.3:
                continue
            row = rows[t]
            n = rng.choice([row.n, row.n, 1, 2, 4, 6, 8, 12])
            nest.iters[t] = rng.choice([n, n, 1, 2, 3, 4, max(1, n // 2), 2 * n])
            rw = rng.random() < 0.4
            if _has_bandwidth(inp, node, t, rw):
                nest.rw[t] = rw
            nest.dependent[t] = rng.random() < 0.5
            count = rng.choice([row.moved.count, row.moved.count, 1, 2, 4, 8, 9, 16])
            moved = Move(row.moved.tile, rng.choice([0, 1, 1, 2, 4]), count)
            kept = Move(rng.choice([row.kept.tile, 1, 64]), rng.choice([0, 0, 1, 2]), count)
            rows[t] = MoveRow(n, rng.choice([0, 1, 2, 3, n]), moved, kept)


PERTURBED = (
    "im_cloud_gemm_softmax_fused_M256_N256_K512_ok0",
    "au_cloud_gemm_layernorm_fused_M256_N256_K512_ok0",
    "ex_example_run_gemm_softmax_fused_M256_N1024_K4096",
)


@pytest.mark.parametrize("case", PERTURBED)
def test_perturbed_spatial_nodes(case: str) -> None:
    """Reuse, differing iterations, kept tiles that move, sub-meshes out of COMET's table."""
    inp = _case(case)
    rng = random.Random(1)
    kinds: dict[str, int] = {}
    for _ in range(40):
        nests = build_nests(inp)
        moves = build_movements(inp, nests)
        _perturb(inp, nests, moves, rng)
        for compat in COMPATS.values():
            k = _compare(inp, compat, nests, moves)
            kinds[k] = kinds.get(k, 0) + 1
    assert kinds.get("ok", 0) >= 20, kinds


@pytest.mark.parametrize("case", SPACES[:2])
def test_shared_ports_everywhere(case: str) -> None:
    """Every memory level's ports shared with its parent: every child's use of them counts."""
    for compat in COMPATS.values():
        trees = _tilings(case, compat, 8)
        for lv in trees[0].arch.levels.values():  # the tilings share the space's arch
            if not lv.is_compute:
                lv.attrs["parent_child_ports_shared"] = True
        kinds = [_compare(inp, compat) for inp in trees]
        assert kinds.count("ok") >= 4


def test_shape_of_another_tree() -> None:
    a = _shared_trees()[0]
    b = next(t for t in _shared_trees() if len(pre_order(t.mapping)) != len(pre_order(a.mapping)))
    shape = cu.tree_shape(a, cl.flatten_arch(a.arch, Compat()), Compat())
    nests = build_nests(b)
    with pytest.raises(ValueError, match="not of the shape"):
        cu.flatten_tree(shape, b, nests, build_movements(b, nests))
