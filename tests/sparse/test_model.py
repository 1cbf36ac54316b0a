"""The estimator: one case recomputed by hand, and its ranking against the simulator."""

import numpy as np
import pytest

from fusekit.sparse.candidates import Patterns
from fusekit.sparse.formats import from_dense
from fusekit.sparse.machine import Machine
from fusekit.sparse.model import Statistics, estimate
from fusekit.sparse.program import Operand, Program, Statement
from fusekit.sparse.schedule import Schedule
from fusekit.sparse.search import explore
from fusekit.sparse.workloads import autoencoder, bigbird


def test_estimate_by_hand() -> None:
    # C[i,j] = sum_k A[i,k] B[k,j], dense 2x3 @ 3x4, order (i, j, k), ideal memory.
    st = Statement(
        "C", ("i", "j"), (Operand("A", ("i", "k")), Operand("B", ("k", "j"))), "mul", "sum"
    )
    p = Program(
        "mm",
        (st,),
        {"A": from_dense("A", np.ones((2, 3))), "B": from_dense("B", np.ones((3, 4)))},
        ("C",),
    )
    s = Schedule("unfused", (("C",),), (("C", ("i", "j", "k")),))
    e = estimate(p, s, Statistics(p, Patterns.of(p)), Machine(memory=None))
    # iterators: i 1*(2+1)=3, j 2*(4+1)=10, k 8*(3+1)=32; values 24; reducer 24 + 8 outputs = 32
    busiest = 32
    fill = 2 * 1 * (3 + 3)  # 2 cycles per stage, 3 levels + array, ALU, reducer
    assert e.cycles == pytest.approx(busiest + fill)
    assert e.flops == pytest.approx(24 + 32)  # one ALU op per value, reducer tokens
    assert "cycles" in e.explain()


@pytest.mark.parametrize(
    "make", [lambda: autoencoder(features=128, hidden=32), lambda: bigbird(tokens=128, block=16)]
)
def test_estimator_ranks_best_simulated_in_top_three(make) -> None:  # type: ignore[no-untyped-def]
    ex = explore(make(), top=3)
    assert all(p.correct for p in ex.simulated)
    assert ex.estimator_rank_of_best() <= 3
