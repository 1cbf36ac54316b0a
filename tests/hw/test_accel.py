import pytest

from fusekit.hw import load
from fusekit.hw.accel import arch_levels


def test_summary_follows_comets_hierarchy():
    edge, cloud = load("edge"), load("cloud")
    # one GEMM engine (8x8 arrays of 32x32 PEs) per core; cores 2x2 (4x4) under 2x2 (4x4) GBs
    assert edge.level("GEMMEngine").instances == 16 and cloud.level("GEMMEngine").instances == 256
    assert edge.macs_per_cycle == 16 * 64 * 32 * 32
    assert cloud.peak_flops_per_s == pytest.approx(2 * 256 * 64 * 1024 * 1e9)
    assert edge.spatial() == "GB 2x2 > IB 2x2" and cloud.spatial() == "GB 4x4 > IB 4x4"
    gb = edge.level("GB")
    assert (gb.width_bytes, gb.capacity_bytes, gb.read_pj, gb.write_pj) == (
        2048,
        2 * 2**20,
        474,
        532,
    )
    dram = edge.level("DRAM")
    assert (dram.capacity_bytes, dram.bw_bytes_per_cycle, dram.read_pj / dram.width_bytes) == (
        0,
        25,
        100,
    )  # unbounded; 25 B/cycle; 800 pJ per 8-byte block
    assert (gb.link_bw_bytes_per_cycle, gb.hop_latency_cycles) == (64, 5)
    assert edge.level("SE").lanes == 16


def test_unknown_level_lists_the_levels():
    with pytest.raises(KeyError, match=r"one of DRAM, GB, IB, .*\(got 'l9'\)"):
        load("edge").level("l9")


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda a: a.pop("Hierarchy"), "Hierarchy: expected a non-empty list"),
        (lambda a: a["Hierarchy"][0]["connects"][0]["attributes"].update(meshX=0), "'meshX'"),
        (lambda a: a["Hierarchy"][0]["connects"][0].update(type="Nope"), "unknown spec 'Nope'"),
        (lambda a: a["MemoryTypes"][-1]["attributes"].update(bw=float("inf")), "'bw'"),
        (lambda a: a["MemoryTypes"][0]["attributes"].update(width=1.5), "'width'"),
    ],
)
def test_bad_arch_names_the_entry(edit, words):
    import copy

    arch = {k: copy.deepcopy(v) for k, v in load("edge").comet_arch.items()}
    edit(arch)
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace("'", "'")):
        arch_levels(arch)
