import pytest

from fusekit.gms.candidates import (
    Config,
    Dataflow,
    Order,
    Strategy,
    config_of,
    cpu_space,
    gpu_space,
)
from fusekit.gms.launch import Launch


def test_cpu_space_sizes_and_constraints():
    space = cpu_space("sum", cores=2)
    points = space.points()
    # 12 strategies x 3 tile sizes x 3 block counts x 2 threads x 2 chunks, plus pack for the
    # three (GM)seg-S strategies
    assert len(points) == 12 * 3 * 3 * 2 * 2 + 3 * 3 * 3 * 2 * 2 == 540
    packed = {p["strategy"] for p in points if p["schedule"] == "pack"}
    assert {Strategy.parse(s).dataflow for s in packed} == {Dataflow.GM_SEG_S}
    assert {p["threads"] for p in points} == {1, 2}
    maxed = cpu_space("max", cores=2).points()
    assert not any(p["strategy"].startswith("aggregate-first") for p in maxed)
    assert {p["threads"] for p in cpu_space("sum", cores=6).points()} == {1, 2, 4, 6}


def test_gpu_space_has_over_a_thousand_legal_points():
    smem = 228 * 1024
    points = gpu_space("sum", smem, k=16, m=16, dtype_bytes=2).points()
    assert len(points) > 1000
    assert all(p["block_e"] <= p["tile_rows"] for p in points)
    assert all(p["block_m"] <= 16 and p["block_k"] <= 16 for p in points)  # K = M = 16
    wide = gpu_space("sum", 48 * 1024, k=256, m=256, dtype_bytes=4).points()
    assert all(
        p["num_stages"] * (p["block_e"] + p["block_m"]) * p["block_k"] * 4 <= 48 * 1024
        for p in wide
    )


def test_config_of_maps_points_to_plan_and_launch_knobs():
    cpu = config_of(
        {
            "strategy": "transform-first/(GM)seg-S",
            "tile_rows": 16,
            "blocks_per_thread": 4,
            "schedule": "pack",
            "threads": 2,
            "chunk": 1,
        }
    )
    assert cpu == Config(
        Strategy(Order.TRANSFORM_FIRST, Dataflow.GM_SEG_S),
        16,
        8,
        "pack",
        Launch(threads=2, chunk=1),
    )
    assert cpu.plan_knobs == (16, 8, "pack")
    gpu = config_of(
        {
            "strategy": "(GMS)seg",
            "tile_rows": 64,
            "block_e": 32,
            "block_m": 64,
            "block_k": 16,
            "num_warps": 4,
            "num_stages": 3,
        }
    )
    assert gpu.blocks == 1 and gpu.launch.block_m == 64 and gpu.launch.num_stages == 3


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"threads": 0}, "threads"),
        ({"chunk": -1}, "chunk"),
        ({"block_e": 24}, "block_e"),
        ({"block_m": 8}, "block_m"),
        ({"num_warps": 1.5}, "num_warps"),
    ],
)
def test_bad_launch_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Launch(**kwargs)
