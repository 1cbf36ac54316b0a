"""The fast simulator against the per-token reference machine, statement by statement."""

import numpy as np
import pytest
import scipy.sparse as sp

from fusekit.sparse.formats import from_dense, from_scipy
from fusekit.sparse.graph import run_statement
from fusekit.sparse.machine import Machine
from fusekit.sparse.program import Operand, Program, Statement, reference
from fusekit.sparse.simulate import simulate_region

RNG = np.random.default_rng(0)
A = sp.random(12, 10, density=0.3, random_state=1, format="csr")
A2 = sp.random(12, 10, density=0.3, random_state=2, format="csr")
B = RNG.standard_normal((10, 4))
INPUTS = {
    "A": from_scipy("A", A, "csr"),
    "A2": from_scipy("A2", A2, "csr"),
    "B": from_dense("B", B),
    "Bt": from_dense("Bt", B.T.copy()),
}
SPMM = Statement(
    "C", ("i", "j"), (Operand("A", ("i", "k")), Operand("B", ("k", "j"))), "mul", "sum"
)
SDDMM = Statement(
    "C", ("i", "j"), (Operand("A", ("i", "k")), Operand("A2", ("j", "k"))), "mul", "sum"
)
ADD = Statement(
    "C", ("i", "k"), (Operand("A", ("i", "k")), Operand("A2", ("i", "k"))), "add", None, "relu"
)
CASES = [
    (SPMM, ("i", "k", "j")),  # Gustavson: sparse accumulator
    (SPMM, ("i", "j", "k")),  # inner product: reducer
    (SDDMM, ("i", "j", "k")),  # intersection of two compressed levels
    (ADD, ("i", "k")),  # union, then an epilogue
]


@pytest.mark.parametrize(("st", "order"), CASES)
def test_fast_simulator_matches_reference_machine(st: Statement, order: tuple[str, ...]) -> None:
    program = Program("t", (st,), INPUTS, ("C",))
    tokens = run_statement(st, order, INPUTS, depth=8)
    values = dict(INPUTS)
    fast = simulate_region(program, (st,), {"C": order}, values, Machine(memory=None))
    # functional: the same values, equal to the numpy reference
    np.testing.assert_allclose(values["C"].to_dense(), reference(program)["C"], atol=1e-12)
    stored, streamed = values["C"].values, np.array(tokens.values)
    # without a coordinate dropper the machine streams a 0 for every empty intersection
    np.testing.assert_allclose(
        np.sort(streamed[streamed != 0]), np.sort(stored[stored != 0]), atol=1e-12
    )
    # token counts: every level and value primitive sends what the fast simulator counts
    counts = {p.name: p.tokens for p in fast.prims}
    for name, sent in tokens.tokens.items():
        if name.split()[0] in ("scan", "locate", "repeat", "iterate", "array", "alu"):
            assert counts[name] == sent, name
        if name.split()[0] in ("intersecter", "unioner"):  # one firing per merge step
            assert counts[name] == tokens.firings[name], name
    for name in ("reducer sum", "spacc sum"):
        if name in tokens.firings:  # busy cycles: tokens consumed
            assert counts[name] == pytest.approx(tokens.firings[name], rel=0.1), name
    # cycles: the analytic model (busiest primitive + fill) against the cycle-by-cycle engine
    assert fast.cycles == pytest.approx(tokens.cycles, rel=0.15)


def test_small_fifos_cost_cycles_on_the_reference_machine() -> None:
    def cycles(depth: int) -> int:
        return run_statement(SPMM, ("i", "k", "j"), INPUTS, depth=depth).cycles

    # FIFO depth 1 stalls but never deadlocks: a repeat holds its reference in a register
    assert cycles(1) > cycles(2) > cycles(3) > cycles(4) == cycles(8)
