import json
import os
import subprocess
import sys

from typer.testing import CliRunner

from fusekit.hw.commands import app

runner = CliRunner()


def fusekit(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "fusekit", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )


def test_show_gpu_and_accelerator():
    result = runner.invoke(app, ["show", "h200"])
    assert result.exit_code == 0, result.output
    assert "4.8 TB/s" in result.output and "132" in result.output
    result = runner.invoke(app, ["show", "edge"])
    assert result.exit_code == 0, result.output
    assert "GB 2x2 > IB 2x2" in result.output and "474 / 532" in result.output


def test_show_json_and_list():
    data = json.loads(runner.invoke(app, ["show", "cloud", "--json"]).output)
    assert data["macs_per_cycle"] == 256 * 64 * 32 * 32
    assert data["comet_arch"]["Hierarchy"][0]["name"] == "DRAM"
    names = [row["name"] for row in json.loads(runner.invoke(app, ["list", "--json"]).output)]
    assert "h200" in names and "cpu-local" in names


def test_show_cpu_local_json(tmp_path):
    out = fusekit("hw", "show", "cpu-local", "--json", env={"XDG_CACHE_HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["kind"] == "cpu" and data["peak_flops_per_s"]["fp32"] > 1e9
    assert (tmp_path / "fusekit" / "hw-detect.json").exists()


def test_malformed_yaml_prints_one_line_and_fails(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: gpu\nname: x\nsm_count: -1\n")
    out = fusekit("hw", "show", str(bad))
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"error: {bad}: ")
    assert "Traceback" not in out.stderr


def test_unknown_preset_prints_one_line():
    out = fusekit("hw", "show", "h300")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [out.stderr.strip()]
    assert "not a preset" in out.stderr
