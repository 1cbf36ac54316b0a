"""The kernels' branch-free exp, erf and log (stitch.codegen.approx) against float64 numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fusekit.stitch.codegen import approx
from fusekit.stitch.codegen.cpu import _PRELUDE, FASTMATH
from fusekit.stitch.codegen.render import load_generated

EXTREMES = np.array(
    [-np.inf, np.inf, -1e30, 1e30, -200.0, 200.0, -88.5, 88.5, -87.0, 88.0, -4.0, 4.0, -1e-30,
     1e-30, 0.0, -0.0, 1e-8, 0.5, -0.5],
    dtype=np.float32,
)  # fmt: skip


@pytest.fixture(scope="module")
def kernels():  # type: ignore[no-untyped-def]
    """``fexp`` and ``ferf`` of the generated prelude, looped with the kernels' math flags."""
    flags = "{" + ", ".join(map(repr, sorted(FASTMATH))) + "}"
    loops = "\n".join(
        f"""
@numba.njit(fastmath={flags}, error_model="numpy")
def loop_{fn}(x, out):
    for i in range(x.size):
        out[i] = {fn}(x[i])
"""
        for fn in ("fexp", "ferf", "flog")
    )
    module = load_generated(_PRELUDE + loops, "approx_test")

    def run(name: str, x: np.ndarray) -> np.ndarray:
        out = np.empty_like(x)
        getattr(module, f"loop_{name}")(x, out)
        return out

    return run


def _exp_ref(x: np.ndarray) -> np.ndarray:
    return np.exp(x.astype(np.float64))


def _erf_ref(x: np.ndarray) -> np.ndarray:
    return np.array([math.erf(float(v)) for v in x])


def test_exp_relative_error_on_dense_grid(kernels) -> None:  # type: ignore[no-untyped-def]
    x = np.linspace(-87.0, 88.0, 1_000_003, dtype=np.float32)
    want = _exp_ref(x)
    for got in (kernels("fexp", x), approx.exp_f32(x)):
        assert float(np.max(np.abs(got - want) / want)) < approx.EXP_MAX_REL


def test_erf_absolute_error_on_dense_grid(kernels) -> None:  # type: ignore[no-untyped-def]
    x = np.linspace(-6.0, 6.0, 100_003, dtype=np.float32)
    want = _erf_ref(x)
    for got in (kernels("ferf", x), approx.erf_f32(x)):
        assert float(np.max(np.abs(got - want))) < approx.ERF_MAX_ABS


def test_extremes_and_nan(kernels) -> None:  # type: ignore[no-untyped-def]
    got = kernels("fexp", EXTREMES)
    with np.errstate(over="ignore"):
        want = _exp_ref(EXTREMES)
    normal = (want > 1e-37) & (want < 1.7e38)
    np.testing.assert_allclose(got[normal], want[normal], rtol=approx.EXP_MAX_REL)
    assert np.all(got[want < 1e-38] == 0.0)  # below the normal range: 0, exp(-inf) = 0
    assert np.all(np.isposinf(got[want > 3.5e38]))  # beyond float32: inf, exp(inf) = inf
    assert kernels("fexp", np.array([0.0], np.float32))[0] == 1.0
    np.testing.assert_allclose(
        kernels("ferf", EXTREMES), _erf_ref(EXTREMES), rtol=0, atol=approx.ERF_MAX_ABS
    )
    for name in ("fexp", "ferf"):
        assert np.isnan(kernels(name, np.array([np.nan], np.float32))[0])


def _log_error(got: np.ndarray, x: np.ndarray) -> float:
    """Largest error relative to ``max(|log x|, 1)``: relative, absolute near x = 1."""
    want = np.log(x.astype(np.float64))
    return float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1.0)))


def test_log_error_over_every_binade(kernels) -> None:  # type: ignore[no-untyped-def]
    """Every normal and subnormal binade, densely around 1 (where log(x) goes to 0)."""
    x = np.concatenate([
        np.geomspace(1.4e-45, 3.4e38, 2_000_003, dtype=np.float32),
        np.linspace(0.5, 2.0, 1_000_003, dtype=np.float32),
        np.float32(1.0) + np.arange(-2000, 2000, dtype=np.float32) * np.float32(2.0**-24),
    ])  # fmt: skip
    x = x[x > 0]
    for got in (kernels("flog", x), approx.log_f32(x)):
        assert _log_error(got, x) < approx.LOG_MAX_REL
    near_one = np.abs(x - 1) < 1e-3  # relative accuracy where log(x) is small
    want = np.log(x[near_one].astype(np.float64))
    got = kernels("flog", x[near_one]).astype(np.float64)
    nonzero = want != 0
    assert np.max(np.abs(got[nonzero] - want[nonzero]) / np.abs(want[nonzero])) < 1e-6
    assert kernels("flog", np.array([1.0], np.float32))[0] == 0.0


def test_log_special_values(kernels) -> None:  # type: ignore[no-untyped-def]
    x = np.array([0.0, -0.0, -1.0, -np.inf, np.inf, np.nan, 1e-45, 3.4e38], np.float32)
    for got in (kernels("flog", x), approx.log_f32(x)):
        assert got[0] == -np.inf and got[1] == -np.inf
        assert np.isnan(got[2]) and np.isnan(got[3]) and np.isnan(got[5])
        assert got[4] == np.inf
        np.testing.assert_allclose(got[6:], np.log(x[6:].astype(np.float64)), rtol=4e-7)


def test_numpy_emulation_matches_kernel(kernels) -> None:  # type: ignore[no-untyped-def]
    """The numpy emulation spells the same operations (FMA contraction aside: a few ulp)."""
    x = np.linspace(-20.0, 20.0, 100_001, dtype=np.float32)
    np.testing.assert_allclose(kernels("fexp", x), approx.exp_f32(x), rtol=4e-7)
    np.testing.assert_allclose(kernels("ferf", x), approx.erf_f32(x), rtol=0, atol=5e-7)
    y = np.geomspace(1e-40, 1e30, 100_001, dtype=np.float32)
    np.testing.assert_allclose(kernels("flog", y), approx.log_f32(y), rtol=4e-7, atol=4e-7)


def test_fits_reproduce_the_coefficients() -> None:
    np.testing.assert_allclose(approx.fit_exp(), approx.EXP_C, rtol=1e-6)
    p, q = approx.fit_erf()
    np.testing.assert_allclose(p, approx.ERF_P, rtol=1e-5)
    np.testing.assert_allclose(q, approx.ERF_Q, rtol=1e-5)
