import pytest

from fusekit.hw import load


def test_peak_and_clusters():
    cloud = load("cloud")
    assert cloud.n_clusters == 16
    assert cloud.macs_per_cycle == 16 * 64 * 32 * 32
    assert cloud.peak_flops_per_s == pytest.approx(2 * 16 * 64 * 1024 * 1e9)


def test_unknown_level_and_op():
    edge = load("edge")
    with pytest.raises(
        KeyError, match=r"expected 'level' to be one of input, weight, .*\(got 'l9'\)"
    ):
        edge.level("l9")
    with pytest.raises(KeyError, match=r"expected 'op' to be one of .*got 'tanh'"):
        edge.simd_cycles("tanh")
    with pytest.raises(KeyError, match="got 'tanh'"):
        edge.simd_energy_pj("tanh")
