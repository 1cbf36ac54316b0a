import json
import subprocess
import sys

from typer.testing import CliRunner

from fusekit.gms.commands import app, run_records


def test_run_prints_every_named_strategy_and_the_aten_baselines():
    result = CliRunner().invoke(
        app,
        [
            "run",
            "--shape",
            "moe",
            "--scale",
            "0.05",
            "--k",
            "8",
            "--m",
            "8",
            "--repeats",
            "1",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    impls = [r["impl"] for r in rows]
    assert impls[:2] == ["aten per-segment mm", "aten _grouped_mm"]
    assert "(GMS)seg" in impls and "aggregate-first/(GMS)seg" in impls
    assert all(r["max_abs_error"] < 1e-4 for r in rows)


def test_run_one_strategy_as_a_table():
    result = CliRunner().invoke(
        app,
        [
            "run",
            "--shape",
            "conv",
            "--scale",
            "0.02",
            "--repeats",
            "1",
            "--strategy",
            "transform-first/G-Mseg-S",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "transform-first" in result.output


def test_run_records_for_max_free_families():
    rows = run_records("rgcn", 4, 8, 0.02, 0, "all", 1)
    assert len(rows) == 2 + 12


def test_plan_json():
    result = CliRunner().invoke(app, ["plan", "--shape", "rgcn", "--scale", "0.05", "--json"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.output)
    assert row["segments"] == 90 and row["aggregate_first_rows"] <= row["pairs"]


def test_bad_input_is_one_line_with_status_2():
    out = subprocess.run(
        [sys.executable, "-m", "fusekit", "gms", "run", "--shape", "graph"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert (
        out.stderr.strip() == "error: gms: expected 'shape' to be rgcn or conv or moe (got 'graph')"
    )
