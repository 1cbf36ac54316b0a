import numpy as np
import pytest

from fusekit.gms import model
from fusekit.gms.candidates import Config, Dataflow, Order, Strategy
from fusekit.gms.features import Features
from fusekit.gms.launch import Launch
from fusekit.hw import load

from .helpers_tuning import TARGET


def _features(**changes):
    base = dict(
        pairs=1000,
        segments=1,
        n_in=100,
        n_out=100,
        k=16,
        m=16,
        dtype="fp32",
        reduce="sum",
        has_scale=False,
        transform_rows=500,
        aggregate_rows=400,
        gather_rows=100,
        scatter_rows=100,
        max_row_pairs=10,
        segment_pairs=(1000,),
        transform_segment_rows=(500,),
        aggregate_segment_rows=(400,),
    )
    base.update(changes)
    return Features(**base)


def _config(order=Order.PAIRWISE, flow=Dataflow.GMS_SEG, threads=2, chunk=0, tile_rows=64):
    return Config(Strategy(order, flow), tile_rows, 4 * threads, "pad", Launch(threads, chunk))


def test_cpu_terms_by_hand():
    # (GMS)seg, E = 1000 pairs in one segment, K = M = 16, 2 threads, 8 blocks, 64-row tiles.
    # tiles: 8 runs of 125 rows -> 2 tiles each of 62.5 rows, padded to 64: 16 tiles, 1024 rows
    # eta: static, 4 blocks of 125 per thread = 500 = E / P -> 1
    # X (6.4 KB) and Y fit the LLC: 1000 gathered + 2 x 1000 scattered rows of one 64 B line
    b = model.estimate(_features(), _config(), TARGET)
    t = b.terms_s
    assert t["tile_gemm"] == pytest.approx(2 * 1024 * 16 * 16 / 100e9)
    assert t["vendor_gemm"] == 0
    assert t["stream"] == pytest.approx((16 * 16 + 100 * 16) * 4 / 10e9)  # W once, Y once
    assert t["random_cache"] == pytest.approx(3 * 1000 * 64 / 10e9)
    assert t["random_dram"] == 0
    assert t["tiles"] == pytest.approx(16 / 2 * 1e-6)
    assert t["calls"] == pytest.approx(1 * 5e-6)
    assert t["dynamic"] == 0  # static prange
    dynamic = model.estimate(_features(), _config(chunk=1), TARGET).terms_s["dynamic"]
    assert dynamic == pytest.approx(8 / 2 * 1e-7)  # the 8 blocks handed out one at a time
    assert b.eta == 1.0
    coef = model.DEFAULT_COEF
    assert b.total_s == pytest.approx(sum(coef[k] * v for k, v in t.items()))
    assert b.explain().startswith("calls 37%, tile_gemm 26%")  # 15 us, 10.5 us of 40.8 us


def test_orders_change_rows_and_passes():
    f = _features()
    pairwise = model.estimate(f, _config(), TARGET).terms_s
    agg = model.estimate(f, _config(Order.AGGREGATE_FIRST), TARGET).terms_s
    tf = model.estimate(f, _config(Order.TRANSFORM_FIRST, Dataflow.G_MSEG_S), TARGET).terms_s
    assert agg["tile_gemm"] < pairwise["tile_gemm"]  # 400 GEMM rows instead of 1000
    assert tf["tile_gemm"] == 0 and tf["vendor_gemm"] == pytest.approx(2 * 500 * 16 * 16 / 100e9)
    assert tf["calls"] > pairwise["calls"]  # gather, per-segment mm, scatter, reduce


def test_fewer_threads_add_the_parallel_work_once_per_missing_core():
    f = _features(pairs=100_000, segment_pairs=(100_000,), max_row_pairs=10)
    one = model.estimate(f, _config(threads=1), TARGET).terms_s
    two = model.estimate(f, _config(threads=2), TARGET).terms_s
    assert two["threads"] == 0 and one["stream"] == two["stream"]
    parallel = ("tile_gemm", "vendor_gemm", "stream", "random_dram", "random_cache", "tiles")
    assert one["threads"] == pytest.approx((2 / 1 - 1) * sum(one[t] for t in parallel))


def test_a_huge_row_unbalances_static_blocks():
    assert model._cpu_eta(1000, 10, 8, 2, 0) == 1.0
    static = model._cpu_eta(1000, 600, 8, 2, 0)
    dynamic = model._cpu_eta(1000, 600, 8, 2, 1)
    assert static == pytest.approx(500 / (600 + 3 * 400 / 7))
    assert dynamic == pytest.approx(500 / (500 + 600 * (1 - 1 / 2) / 2))  # last block half late


def test_tiles_and_padding():
    assert model._tiles((100,), 64, 1, 16) == (2, 2 * 64)  # 2 tiles of 50 -> padded to 64
    assert model._tiles((0, 3), 64, 4, 4) == (3, 12)  # 3 runs of one row, padded to 4
    assert model._tiles((), 64, 4, 4) == (0, 0)


def test_gpu_terms_cover_atomics_and_waves():
    h200 = load("h200")
    f = _features(pairs=200_000, segment_pairs=(200_000,), dtype="bf16")
    cfg = Config(
        Strategy(),
        128,
        1,
        "pad",
        Launch(block_e=64, block_m=16, block_k=16, num_warps=4, num_stages=3),
    )
    b = model.estimate(f, cfg, h200)
    assert b.terms_s["atomics"] > 0 and 0 < b.eta <= 1
    products = Config(Strategy(Order.PAIRWISE, Dataflow.GM_SEG_S), 128, 1, "pad", cfg.launch)
    assert model.estimate(f, products, h200).terms_s["atomics"] == 0


def test_fit_recovers_known_coefficients_and_keeps_unused_defaults():
    rng = np.random.default_rng(0)
    terms = rng.uniform(0.1, 1.0, size=(200, len(model.TERMS)))
    terms[:, model.TERMS.index("atomics")] = 0.0  # never exercised
    truth = np.array([1.5, 0.8, 1.2, 2.5, 0.4, 0.9, 0.7, 0.5, 3.0, 1.0])
    times = terms @ truth
    coef = model.fit(terms, times, prior_weight=0.0)
    for name, value in zip(model.TERMS[:-1], truth[:-1], strict=True):
        assert coef[name] == pytest.approx(value, rel=1e-6)
    pulled = model.fit(terms, times)
    assert pulled["atomics"] == pytest.approx(model.DEFAULT_COEF["atomics"])


def test_predict_is_the_term_matrix_times_coefficients():
    f = _features()
    configs = [_config(), _config(Order.TRANSFORM_FIRST), _config(threads=1)]
    coef = {**model.DEFAULT_COEF, "tile_gemm": 3.0}
    expected = [model.estimate(f, c, TARGET, coef).total_s for c in configs]
    assert model.predict(f, configs, TARGET, coef) == pytest.approx(expected)
