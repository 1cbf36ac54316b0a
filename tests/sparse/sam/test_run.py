"""Every shared SAM graph, run on the per-token machine, equals numpy on its manifest expression.

The graphs and their manifest live in ``../shared/data/sam_graphs`` (relative to the repository
root); the tests skip when it is absent. Inputs are random at three densities: 0 (every tensor
empty), 0.3 with a third of the rows (first-mode slices) emptied, and 1.0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fusekit.sparse.sam import read_gv, run
from fusekit.sparse.sam.runner import block_name

from .taco import evaluate, extents, parse

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "sam_graphs"
MANIFEST: list[dict[str, Any]] = (
    json.loads((DATA / "manifest.json").read_text())["graphs"]
    if (DATA / "manifest.json").exists()
    else []
)
needs_data = pytest.mark.skipif(not MANIFEST, reason=f"{DATA} is absent")
IDS = [g["file"].removesuffix(".gv") for g in MANIFEST]


def random_inputs(expr: str, density: float, size: int, small: int, seed: int) -> dict[str, Any]:
    """One random dense array per right-hand-side tensor (0-d for scalars)."""
    rng = np.random.default_rng(seed)
    dims = extents(expr, size, small)
    out: dict[str, Any] = {}
    for _, factors in parse(expr)[2]:
        for name, idx in factors:
            shape = tuple(dims[v] for v in idx)
            a = rng.uniform(-1, 1, shape) * (rng.random(shape) < density)
            if 0 < density < 1 and a.ndim:
                a[rng.random(shape[0]) < 0.33] = 0  # empty rows / fibers
            out[name] = np.asarray(a)
    return out


def check(entry: dict[str, Any], density: float, size: int, small: int, seed: int) -> None:
    path = DATA / entry["file"]
    inputs = random_inputs(entry["expression"], density, size, small, seed)
    got = run(path, inputs)
    want = evaluate(entry["expression"], inputs)
    assert got.output.shape == want.shape
    np.testing.assert_allclose(got.output, want, rtol=1e-9, atol=1e-9)
    assert got.cycles > 0


@needs_data
@pytest.mark.parametrize("density", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("entry", MANIFEST, ids=IDS)
def test_graph_equals_numpy(entry: dict[str, Any], density: float) -> None:
    check(entry, density, 6, 3, seed=int(density * 10) + 1)


@needs_data
@pytest.mark.parametrize("entry", MANIFEST, ids=IDS)
def test_graph_odd_sizes_bounded_fifos(entry: dict[str, Any]) -> None:
    """Odd extents, FIFOs of depth 2 and a channel latency of 2 give the same output."""
    path = DATA / entry["file"]
    inputs = random_inputs(entry["expression"], 0.4, 5, 2, seed=7)
    want = evaluate(entry["expression"], inputs)
    got = run(path, inputs, depth=2, latency=2)
    np.testing.assert_allclose(got.output, want, rtol=1e-9, atol=1e-9)


@pytest.mark.slow
@needs_data
@pytest.mark.parametrize("entry", MANIFEST, ids=IDS)
def test_graph_equals_numpy_200(entry: dict[str, Any]) -> None:
    """Matrices and vectors of 200 (3-D tensors 12 per mode) at density 0.05."""
    check(entry, 0.05, 200, 12, seed=3)


@needs_data
def test_token_counts_are_named_like_sams_tests() -> None:
    path = DATA / "matmul_ikj.gv"
    if not path.exists():
        pytest.skip("matmul_ikj.gv is absent")
    graph = read_gv(path)
    res = run(path, random_inputs("X(i,j) = B(i,k) * C(k,j)", 0.5, 4, 4, seed=2))
    blocks = {block_name(n) for n in graph.nodes.values() if n.type != "broadcast"}
    assert set(res.tokens) == blocks
    assert {"fiberlookup_Bi_19", "intersectk_13", "spaccumulator1_3", "fiberwrite_Xvals_0"} <= set(
        res.tokens
    )
    assert res.tokens["fiberwrite_X0_2"] > 0


@needs_data
def test_scalar_input_and_output() -> None:
    path = DATA / "vec_scalar_mul.gv"
    if not path.exists():
        pytest.skip("vec_scalar_mul.gv is absent")
    c = np.array([0.0, 2.0, 0.0, 3.0])
    res = run(path, {"b": np.array(1.5), "c": c})
    np.testing.assert_allclose(res.output, 1.5 * c)
