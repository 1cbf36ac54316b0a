import pytest

from fusekit.search import time_call


def test_time_call_warms_up_then_times_repeats():
    calls = []
    timing = time_call(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(calls) == 6
    assert timing.samples == 4
    assert 0 <= timing.q10_s <= timing.median_s <= timing.q90_s


def test_time_call_extends_short_calls_to_min_total():
    timing = time_call(lambda: None, repeats=1, warmup=0, min_total_s=1e-4)
    assert timing.samples > 1


def test_time_call_quantiles_with_many_samples():
    timing = time_call(lambda: None, repeats=20, warmup=0)
    assert timing.samples == 20 and timing.q10_s <= timing.median_s <= timing.q90_s


def test_time_call_rejects_bad_counts():
    with pytest.raises(ValueError, match="repeats"):
        time_call(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="warmup"):
        time_call(lambda: None, warmup=-1)


def test_max_total_s_stops_a_slow_call_early():
    import time

    from fusekit.search.measure import time_call

    timing = time_call(lambda: time.sleep(0.01), repeats=50, warmup=0, max_total_s=0.02)
    assert 3 <= timing.samples < 50


def test_fastest_interleaves_rounds_and_keeps_each_best_median():
    import time

    from fusekit.search import fastest

    order: list[str] = []

    def option(name: str, seconds: float):
        def call() -> None:
            order.append(name)
            time.sleep(seconds)

        return call

    name, best = fastest(
        {"slow": option("slow", 0.004), "quick": option("quick", 0.0)}, rounds=2, repeats=1
    )
    assert name == "quick" and set(best) == {"slow", "quick"}
    assert best["quick"] < 0.004 <= best["slow"]
    # round 1 warms each up once and times it once, round 2 times each again
    assert order == ["slow", "slow", "quick", "quick", "slow", "quick"]


def test_fastest_rejects_no_options_and_no_rounds():
    from fusekit.search import fastest

    with pytest.raises(ValueError, match="options"):
        fastest({})
    with pytest.raises(ValueError, match="rounds"):
        fastest({"a": lambda: None}, rounds=0)
