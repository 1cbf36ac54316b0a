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
from fusekit.sparse.simulate import simulate
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
    # streams (points + one stop per fiber + D): iterators i 2+1+1=4, j 8+2+1=11, k 24+8+1=33;
    # values 33; the reducer takes 33 and fires once more per row stop (2): 35, and sends
    # 8 sums + 2 stops + D = 11
    busiest = 35
    fill = 2 * 3 + 3  # two stages per level, three for the values (array, ALU, reducer)
    assert e.cycles == pytest.approx(busiest + fill)
    assert e.flops == pytest.approx(33 + 35)  # the ALU's tokens and the reducer's firings
    # the simulator counts the same for a dense program (no empty fibers to estimate)
    r = simulate(p, s, Machine(memory=None))
    assert (r.cycles, r.flops) == (pytest.approx(e.cycles), pytest.approx(e.flops))
    assert "cycles" in e.explain()


@pytest.mark.parametrize(
    "make", [lambda: autoencoder(features=128, hidden=32), lambda: bigbird(tokens=128, block=16)]
)
def test_estimator_ranks_best_simulated_in_top_three(make) -> None:  # type: ignore[no-untyped-def]
    ex = explore(make(), top=3)
    assert all(p.correct for p in ex.simulated)
    assert ex.estimator_rank_of_best() <= 3
