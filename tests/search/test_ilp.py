import logging

import pytest

from fusekit.search.ilp import solve_partition


def test_partition_optimum():
    # items 0,1,2; singletons cost 1 each, {0,1} costs 1.5, {1,2} costs 1.2
    r = solve_partition([1, 1, 1, 1.5, 1.2], [[0], [1], [2], [0, 1], [1, 2]], 3)
    assert r.optimal and not r.timed_out
    assert sorted(r.chosen) == [0, 4]
    assert r.objective == pytest.approx(2.2)
    assert r.bound == pytest.approx(2.2)


def test_lazy_cut_forbids_a_combination():
    def lazy(chosen):
        return [[0, 4]] if {0, 4} <= set(chosen) else []

    r = solve_partition([1, 1, 1, 1.5, 1.2], [[0], [1], [2], [0, 1], [1, 2]], 3, lazy=lazy)
    assert sorted(r.chosen) == [2, 3]
    assert r.cuts == 1 and r.rounds == 2


def test_time_limit_returns_warm_start(caplog):
    with caplog.at_level(logging.WARNING):
        r = solve_partition([1, 1, 0.5], [[0], [1], [0, 1]], 2, warm_start=[0, 1], time_limit_s=0)
    assert r.timed_out and not r.optimal
    assert sorted(r.chosen) == [0, 1]


def test_bad_input():
    with pytest.raises(ValueError, match="covering"):
        solve_partition([1.0], [[0]], 2)
    with pytest.raises(ValueError, match="warm_start"):
        solve_partition([1.0, 1.0], [[0], [0]], 1, warm_start=[0, 1])
    with pytest.raises(ValueError, match="weights"):
        solve_partition([1.0], [[0], [0]], 1)
