import textwrap
from importlib import resources
from pathlib import Path

import pytest

from fusekit.errors import ConfigError
from fusekit.hw import Accelerator, CPUTarget, GPUTarget, load, load_file, preset_names

GPU_YAML = """\
kind: gpu
name: toy
description: a toy GPU
source: test
peak_flops_per_s: {fp32: 1.0e12, bf16: 8.0e12}
mem_bw_bytes_per_s: 500 GB/s
mem_bytes: 8 GiB
sm_count: 10
shared_mem_per_sm_bytes: 100 KiB
l2_bytes: 4 MiB
registers_per_sm: 65536
max_threads_per_sm: 2048
warp_size: 32
clock_hz: 1.5e9
launch_overhead_s: 5.0e-6
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hw.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_every_preset_loads():
    names = preset_names()
    assert {"cpu-local", "gpu-local", "a100", "h100", "h200", "rtx3090", "edge", "cloud"} <= set(
        names
    )
    for name in names:
        if name not in ("cpu-local", "gpu-local"):
            hw = load(name)
            assert hw.name == name


def test_h200_datasheet_figures():
    h200 = load("H200")  # names are case-insensitive
    assert isinstance(h200, GPUTarget)
    assert h200.mem_bw_bytes_per_s == pytest.approx(4.8e12)
    assert h200.sm_count == 132
    assert h200.shared_mem_per_sm_bytes == 228 * 1024
    assert h200.l2_bytes == 50 * 2**20
    assert h200.peak("bf16") == pytest.approx(989.4e12)
    assert h200.mem_bytes == 141 * 10**9


def test_edge_and_cloud_are_comets_arch_files():
    edge, cloud = load("edge"), load("cloud")
    assert isinstance(edge, Accelerator) and isinstance(cloud, Accelerator)
    assert [lv.name for lv in edge.levels] == ["DRAM", "GB", "IB", "GEMMEngine", "WB", "OB", "SE"]
    assert edge.level("GB").mesh == (2, 2) and cloud.level("GB").mesh == (4, 4)
    assert cloud.level("GB").capacity_bytes == 8 * 2**20
    assert (cloud.level("GB").read_pj, cloud.level("GB").write_pj) == (994, 1111)
    assert (edge.level("OB").read_pj, edge.level("OB").write_pj) == (72, 129)
    assert (edge.level("DRAM").bw_bytes_per_cycle, cloud.level("DRAM").bw_bytes_per_cycle) == (
        25,
        50,
    )
    assert (
        edge.level("GB").link_bw_bytes_per_cycle,
        cloud.level("GB").link_bw_bytes_per_cycle,
    ) == (
        64,
        256,
    )


def test_units_parse(tmp_path):
    gpu = load_file(write(tmp_path, GPU_YAML))
    assert isinstance(gpu, GPUTarget)
    assert gpu.mem_bw_bytes_per_s == 500e9
    assert gpu.mem_bytes == 8 * 2**30
    assert gpu.shared_mem_per_sm_bytes == 100 * 1024


def test_load_by_path(tmp_path):
    path = write(tmp_path, GPU_YAML)
    assert load(str(path)).name == "toy"


@pytest.mark.parametrize(
    ("old", "new", "path", "problem"),
    [
        ("sm_count: 10", "sm_count: 10\nsm_cont: 3", "sm_cont", "unknown field"),
        ("sm_count: 10", "sm_count: lots", "sm_count", "must be a valid integer"),
        ("sm_count: 10", "sm_count: -4", "sm_count", "greater than 0"),
        ("l2_bytes: 4 MiB", "l2_bytes: 0", "l2_bytes", "greater than 0"),
        ("l2_bytes: 4 MiB", "l2_bytes: 4 furlongs", "l2_bytes", "a size such as"),
        (
            "mem_bw_bytes_per_s: 500 GB/s",
            "mem_bw_bytes_per_s: 500 GB",
            "mem_bw_bytes_per_s",
            "a rate such as",
        ),
        ("warp_size: 32\n", "", "warp_size", "missing required field"),
        ("{fp32: 1.0e12, bf16: 8.0e12}", "{fp33: 1.0e12}", "peak_flops_per_s.fp33", "fp32"),
    ],
)
def test_malformed_yaml_is_one_clear_line(tmp_path, old, new, path, problem):
    file = write(tmp_path, GPU_YAML.replace(old, new))
    with pytest.raises(ConfigError, match=problem) as info:
        load_file(file)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{file}: {path}: ")


def test_nested_accelerator_field_path(tmp_path):
    edge = (resources.files("fusekit.hw") / "presets" / "edge.yaml").read_text()
    file = write(tmp_path, edge.replace("hop_latency: 5,", "hop_latency: -5,", 1))
    with pytest.raises(ConfigError, match=r"comet_arch: .*\(GB\): expected 'hop_latency' .* >= 0"):
        load_file(file)


def test_unknown_kind_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="kind: must be one of cpu, gpu, accelerator"):
        load_file(write(tmp_path, "kind: tpu\nname: x\n"))
    with pytest.raises(ConfigError, match=r"not valid YAML: .* at line \d+, column \d+"):
        load_file(write(tmp_path, "kind: gpu\nname: [unclosed\n"))
    with pytest.raises(ConfigError, match="expected a mapping at top level"):
        load_file(write(tmp_path, "- 1\n- 2\n"))


def test_unknown_name_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not a preset"):
        load("h300")
    with pytest.raises(ConfigError, match="cannot read file"):
        load(str(tmp_path / "missing.yaml"))


def test_cpu_yaml(tmp_path):
    cpu = load_file(
        write(
            tmp_path,
            """\
        kind: cpu
        name: laptop
        description: a laptop
        source: test
        peak_flops_per_s: {fp32: 2.0e11}
        mem_bw_bytes_per_s: 40 GB/s
        mem_bytes: 16 GiB
        launch_overhead_s: 2.0e-6
        cores: 8
        threads: 16
        l1d_bytes: 48 KiB
        l2_bytes: 1.25 MiB
        l3_bytes: 0
        simd_width_bits: 256
        """,
        )
    )
    assert isinstance(cpu, CPUTarget)
    assert cpu.l2_bytes == int(1.25 * 2**20)
    assert cpu.last_level_cache_bytes == 8 * cpu.l2_bytes  # no L3: all L2s together
