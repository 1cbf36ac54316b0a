import json

import pytest
import torch

from fusekit.gms import search
from fusekit.gms.candidates import config_of
from fusekit.gms.kernels.reference import gms_reference
from fusekit.gms.search import choose_points, hardware_key, operands, refit, run_config, tune
from fusekit.search import LocalExecutor, TuningCache, point_key

from .helpers_tuning import TARGET, small_problem


def test_pruned_tune_measures_only_its_budget_and_returns_the_best_measured():
    result = tune(small_problem(), 8, 8, target=TARGET, budget=10, repeats=1)
    assert result.space_size == 540 and result.newly_measured == 10 == len(result.measured)
    assert result.best_s == min(result.measured.values())
    assert point_key(result.best_point) in result.measured
    assert result.best == config_of(result.best_point)
    assert len(result.predicted_s) == result.space_size


def test_choose_points_takes_every_strategys_best_first():
    points = [{"strategy": s, "i": i} for i, s in enumerate("aabbc")]
    predicted = [1.0, 2.0, 0.5, 0.6, 9.0]
    assert [p["i"] for p in choose_points(points, predicted, 3)] == [2, 0, 4]
    assert [p["i"] for p in choose_points(points, predicted, 4)] == [2, 0, 4, 3]
    assert [p["i"] for p in choose_points(points, predicted, 2)] == [2, 0]


def test_every_measured_configuration_computes_the_right_result():
    problem = small_problem(reduce="mean")
    x, w, c = operands("t", problem, 8, 8, "float32", "cpu", True)
    expected = gms_reference(
        x, w, problem.gather, problem.segment, problem.scatter, problem.n_out, c, "mean"
    )
    result = tune(problem, 8, 8, has_scale=True, target=TARGET, budget=30, repeats=1)
    for key in result.measured:
        got = run_config(config_of(json.loads(key)), "t", problem, x, w, c)()
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5, msg=key)


def test_the_cache_makes_a_second_tune_free_and_refits_the_model(tmp_path):
    cache = TuningCache(tmp_path / "tuning.json")
    problem = small_problem()
    first = tune(problem, 8, 8, target=TARGET, budget=6, repeats=1, cache=cache)
    again = tune(problem, 8, 8, target=TARGET, budget=6, repeats=1, cache=cache)
    assert first.newly_measured == 6 and again.newly_measured == 0
    assert again.best_point == first.best_point
    coef = refit(cache, TARGET)
    assert coef is not None and cache.model(hardware_key(TARGET), search.MODEL_NAME) == coef
    assert refit(TuningCache(tmp_path / "empty.json"), TARGET) is None


def test_an_interrupted_tune_loses_only_the_point_in_flight(tmp_path, monkeypatch):
    cache = TuningCache(tmp_path / "tuning.json")
    real = search.time_call
    calls = []

    def flaky(fn, repeats):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(fn, repeats=repeats)

    monkeypatch.setattr(search, "time_call", flaky)
    with pytest.raises(KeyboardInterrupt):
        tune(small_problem(), 8, 8, target=TARGET, budget=8, repeats=1, cache=cache)
    (entry,) = cache.entries()
    assert len(entry.points) == 3
    monkeypatch.setattr(search, "time_call", real)
    resumed = tune(small_problem(), 8, 8, target=TARGET, budget=8, repeats=1, cache=cache)
    assert resumed.newly_measured == 5


def test_tune_in_a_local_process_pool(tmp_path):
    cache = TuningCache(tmp_path / "tuning.json")
    with LocalExecutor(2) as ex:
        result = tune(
            small_problem(), 8, 8, target=TARGET, budget=4, repeats=1, cache=cache, executor=ex
        )
    assert result.newly_measured == 4
    assert len(cache.entries()[0].points) == 4  # written by the workers


def test_tune_rejects_a_bad_budget():
    with pytest.raises(ValueError, match="budget"):
        tune(small_problem(), 8, 8, target=TARGET, budget=0)


def test_hardware_key_ignores_measured_rates():
    from dataclasses import replace

    assert hardware_key(TARGET) == hardware_key(replace(TARGET, mem_bw_bytes_per_s=1.0))
    assert hardware_key(TARGET) != hardware_key(replace(TARGET, cores=4))
