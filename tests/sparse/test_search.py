"""The explorer's check: each output against the float64 reference, to its dtype's rounding."""

import numpy as np
import scipy.sparse as sp

from fusekit.sparse.formats import from_dense, from_scipy
from fusekit.sparse.program import Operand, Program, Statement, reference
from fusekit.sparse.search import compute_dtype, explore, matches_reference, terms
from fusekit.sparse.workloads import Workload


def _float32_chain() -> Program:
    # H[b,h] = relu(sum_f X[b,f] W1[f,h]) over 4,096 features, then Y = sum_h H W2 (float32)
    rng = np.random.default_rng(0)
    x = sp.random(16, 4096, density=0.5, random_state=1, format="csr", dtype=np.float32)
    w1 = rng.standard_normal((4096, 8)).astype(np.float32)
    w2 = rng.standard_normal((8, 4)).astype(np.float32)
    inputs = {
        "X": from_scipy("X", x, "csr"),
        "W1": from_dense("W1", w1),
        "W2": from_dense("W2", w2),
    }
    sts = (
        Statement(
            "H",
            ("b", "h"),
            (Operand("X", ("b", "f")), Operand("W1", ("f", "h"))),
            "mul",
            "sum",
            "relu",
        ),
        Statement(
            "Y", ("b", "g"), (Operand("H", ("b", "h")), Operand("W2", ("h", "g"))), "mul", "sum"
        ),
    )
    return Program("f32", sts, inputs, ("Y",))


def test_float32_program_with_long_reductions_is_correct() -> None:
    program = _float32_chain()
    assert compute_dtype(program, "Y") == np.float32
    assert terms(program, "H") == 4096 and terms(program, "Y") == 4096 + 8
    ex = explore(Workload("f32", program, (("H",), ("Y",))), top=1)
    assert ex.simulated and all(p.correct for p in ex.simulated)
    # the former check (rtol 1e-6 on every entry) rejected these correct float32 results
    out, want = ex.simulated[0].result.outputs["Y"], reference(program)["Y"]  # type: ignore[union-attr]
    assert not np.allclose(out, want, rtol=1e-6, atol=1e-9)


def test_wrong_results_fail() -> None:
    rng = np.random.default_rng(1)
    want = rng.standard_normal((16, 4))
    f32 = want.astype(np.float32).astype(np.float64)
    assert matches_reference(f32, want, np.float32, 4096)
    wrong = f32.copy()
    wrong[3, 2] += 1e-3 * np.abs(want).max()  # one entry off by 0.1% of the largest
    assert not matches_reference(wrong, want, np.float32, 4096)
    assert not matches_reference(f32 * 1.001, want, np.float32, 4096)
    # float64 is checked tightly: float32 rounding is an error there
    assert not matches_reference(f32, want, np.float64, 4096)
    assert matches_reference(want * (1 + 1e-15), want, np.float64, 4096)
