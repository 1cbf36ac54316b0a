"""The compiled evaluator (``tree_model.compiled``) against the reference, tiling by tiling."""

from __future__ import annotations

import copy
import random
from typing import Any

import numpy as np
import pytest

from fusekit.accel.comet import space as space_module
from fusekit.accel.comet.space import Scored, Space, Tiling, arch_constraints, constants
from fusekit.accel.compat import Compat
from fusekit.accel.tree_model import compiled as cc
from fusekit.accel.tree_model import compiled_upper as cu
from fusekit.hw import load
from fusekit.hw.cpu_gpu import plain

from .helpers_compiled import COMPATS, OPS, SHAPES, builtin_space, case_space, needs_oracle

#: Small spaces, every tiling compared.
ALL = (
    "im_edge_gemm_softmax_fused_M1_N1024_K128_ok0",
    "au_edge_gemm_layernorm_fused_M1_N1024_K128_ok0",
)
#: Spaces whose random tilings are compared (the dims are in the names).
SPACES = (
    "im_cloud_gemm_softmax_fused_M256_N256_K512_ok0",
    "au_cloud_gemm_only_M256_N256_K512_ok0",
    "au_edge_softmax_only_M1_N1024_K128_ok0",
    "au_cloud_layernorm_only_M256_N256_K512_ok0",
    "au_edge_gemm_layernorm_fused_M256_N256_K128_ok0",
    "q_cloud_gemm_softmax_fused_M256_N256_K512_gbspatial4x2",
)
TILINGS = 50


def _plain(sc: Scored) -> tuple[Any, ...]:
    """A score as exact values (the types too: ``int`` cycles, ``float`` energy)."""
    return (type(sc.total_cycles), sc.total_cycles, type(sc.total_energy_pj), sc.total_energy_pj)


def _compare(sp: Space, dims: dict[str, int], compat: Compat, tilings: list[Tiling]) -> int:
    """Compiled and reference scores of ``tilings`` are equal; returns the compiled count."""
    got = sp.score_many(tilings, dims, compat)
    want = [sp.score(t, dims, compat, compiled=False) for t in tilings]
    for g, w in zip(got, want, strict=True):
        assert _plain(g) == _plain(w), g.tiling
    # the compiled path did them: no fallback but where the reference raises
    key = next(k for k in sp._compiled if k[1] == compat)
    tpl = sp._compiled[key][0]
    assert tpl is not None
    vals = np.stack([v for t in tilings if (v := tpl.values(constants(t, dims))) is not None])
    status, _c, _e = tpl.score(vals)
    assert len(vals) == len(tilings) and not (status == cc.FALLBACK).any()
    assert any(w.total_cycles is not None for w in want)
    return len(vals)


def _random(sp: Space, dims: dict[str, int], n: int = TILINGS, seed: int = 0) -> list[Tiling]:
    tilings: list[Tiling] = sp.tilings(dims, arch_constraints(sp.arch))
    random.Random(seed).shuffle(tilings)
    return tilings[:n]


@needs_oracle
@pytest.mark.parametrize("compat", COMPATS)
@pytest.mark.parametrize("case", ALL)
def test_every_tiling_of_small_spaces(case: str, compat: str) -> None:
    sp, dims = case_space(case)
    tilings = sp.tilings(dims, arch_constraints(sp.arch))
    assert _compare(sp, dims, COMPATS[compat], tilings) == len(tilings)


@needs_oracle
@pytest.mark.parametrize("compat", COMPATS)
@pytest.mark.parametrize("case", SPACES)
def test_random_tilings_of_comet_spaces(case: str, compat: str) -> None:
    sp, dims = case_space(case)
    assert _compare(sp, dims, COMPATS[compat], _random(sp, dims)) == TILINGS


@pytest.mark.parametrize("compat", COMPATS)
@pytest.mark.parametrize("hw", SHAPES)
@pytest.mark.parametrize("op", OPS)
def test_random_tilings_of_builtin_spaces(op: str, hw: str, compat: str) -> None:
    sp, dims = builtin_space(op, hw)
    assert _compare(sp, dims, COMPATS[compat], _random(sp, dims, 25)) == 25


def test_score_and_search_use_the_compiled_path() -> None:
    sp, dims = builtin_space("gemm_softmax", "edge")
    compat = Compat()
    t = _random(sp, dims, 1)[0]
    assert _plain(sp.score(t, dims, compat, compiled=True)) == _plain(sp.score(t, dims, compat))
    assert sp._compiled
    for workers in (1, 2):
        got = sp.search(dims, compat=compat, compiled=True, workers=workers)
        ref = Space.builtin("gemm_softmax", sp.arch_doc)
        want = ref.search(dims, compat=compat, compiled=False, workers=workers)
        assert [_plain(s) for s in got.scored] == [_plain(s) for s in want.scored]
        assert got.best == want.best


def test_search_compiles_large_spaces_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """By default the compiled evaluator scores a space of COMPILED_MIN_TILINGS or more."""
    sp, dims = builtin_space("gemm", "edge")
    n = len(sp.tilings(dims, arch_constraints(sp.arch)))
    calls: list[int] = []
    real = sp.score_many
    monkeypatch.setattr(sp, "score_many", lambda ts, d, c: calls.append(len(ts)) or real(ts, d, c))
    monkeypatch.setattr(space_module, "COMPILED_MIN_TILINGS", n + 1)
    sp.search(dims)
    assert not calls
    monkeypatch.setattr(space_module, "COMPILED_MIN_TILINGS", n)
    sp.search(dims)
    assert calls


def _outcome(f: Any) -> Any:
    try:
        return _plain(f())
    except Exception as e:  # compared by type and message
        return (type(e), str(e))


@pytest.mark.parametrize(
    "where",
    [(0, "parent_write_bw"), (2, "child_read_bw"), (3, "link_read_bw"), (2, "link_read_bw")],
)
def test_errors_as_the_reference(where: tuple[int, str]) -> None:
    """A missing bandwidth (0: infinite or divided-by-zero transfers) raises as the reference."""
    arch = copy.deepcopy(plain(load("edge").comet_arch))  # type: ignore[attr-defined]
    del arch["MemoryTypes"][where[0]]["attributes"][where[1]]
    sp = Space.builtin("gemm_softmax", arch)
    dims = dict(zip("MNK", SHAPES["edge"], strict=True))
    compat = Compat()
    for t in _random(sp, dims, 6):
        want = _outcome(lambda t=t: sp.score(t, dims, compat))
        assert _outcome(lambda t=t: sp.score(t, dims, compat, compiled=True)) == want


def test_a_raising_batch_reruns_row_by_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """A numba exception (a zero bandwidth's division) leaves only its own rows to the reference."""
    sp, dims = builtin_space("gemm", "edge")
    compat = Compat()
    tilings = _random(sp, dims, 12)
    want = [_plain(s) for s in sp.score_many(tilings, dims, compat)]
    batch = cc.score_batch

    def flaky(*args: Any) -> Any:
        if args[-1].shape[0] > 1 or args[-1][0].sum() % 3 == 0:
            raise ZeroDivisionError("division by zero")
        return batch(*args)

    monkeypatch.setattr(cc, "score_batch", flaky)
    assert [_plain(s) for s in sp.score_many(tilings, dims, compat)] == want


def _template(sp: Space, dims: dict[str, int], compat: Compat) -> cc.CompiledTemplate:
    key = next(k for k in sp._compiled if k[0] == tuple(sorted(dims.items())) and k[1] == compat)
    tpl = sp._compiled[key][0]
    assert tpl is not None
    return tpl


def test_values_many_gives_what_values_gives() -> None:
    """The batch path agrees row by row; a constant that changes the shape is left out."""
    sp, dims = builtin_space("gemm_softmax", "edge")
    compat = Compat()
    tilings = _random(sp, dims, 12)
    sp.score_many(tilings[:4], dims, compat)
    tpl = _template(sp, dims, compat)
    consts = [constants(t, dims) for t in tilings]
    consts[3] = {**consts[3], "red_dim": "N"}  # a reduction dim named by a constant
    consts[5] = {**consts[5], "M_Compute": "two"}  # not a count: the reference's error
    consts[6] = {**consts[6], "M_Compute": True}  # a bool is not a count either
    consts[7] = {**consts[7], "M_Compute": 2**70}  # past int64: the reference's path
    consts[8] = {k: v for k, v in consts[8].items() if k != "M_SE"}  # another key set
    vals, kept = tpl.values_many(consts)
    want = [(i, v) for i, c in enumerate(consts) if (v := tpl.values(c)) is not None]
    assert sorted(kept) == [i for i, _ in want]
    assert not {3, 5, 6, 7, 8} & set(kept) and len(kept) == 7
    assert vals is not None
    got = dict(zip(kept, vals.tolist(), strict=True))
    assert all(got[i] == v.tolist() for i, v in want)


def test_the_leaf_memo_is_kept_across_batches() -> None:
    """Batches of one template share its leaf memo; the numbers are those of a fresh memo."""
    sp, dims = builtin_space("gemm_softmax", "edge")
    compat = Compat()
    tilings = _random(sp, dims, 40, seed=3)
    first = sp.score_many(tilings[:20], dims, compat)
    tpl = _template(sp, dims, compat)
    kept = len(tpl.memo[1])
    assert kept > 0
    later = [s for k in range(20, 40, 5) for s in sp.score_many(tilings[k : k + 5], dims, compat)]
    assert len(tpl.memo[1]) >= kept
    vals, _ = tpl.values_many([constants(t, dims) for t in tilings])
    assert vals is not None
    status, cycles, energy = cc.score_batch(*tpl.args, cu.new_leaf_memo(), vals)  # type: ignore[call-arg]
    fresh = [Scored(t, int(c), float(e)) if s == cc.OK else Scored(t, None, None)
             for t, s, c, e in zip(tilings, status, cycles, energy, strict=True)]  # fmt: skip
    assert [_plain(s) for s in first + later] == [_plain(s) for s in fresh]
