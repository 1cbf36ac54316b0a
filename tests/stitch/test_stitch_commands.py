import json

from typer.testing import CliRunner

from fusekit.cli import app


def test_plan_json_and_dot(tmp_path):
    dot = tmp_path / "plan.dot"
    result = CliRunner().invoke(
        app, ["stitch", "plan", "layernorm_bwd", "--json", "--dot", str(dot)]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["kernels"] == 1 and data["objective_s"] <= data["greedy_s"]
    assert "cluster_0" in dot.read_text()


def test_bench_json():
    result = CliRunner().invoke(app, ["stitch", "bench", "bias_gelu", "--json", "--repeats", "2"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["max_abs_err"] < 1e-4
