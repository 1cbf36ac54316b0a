import json

from typer.testing import CliRunner

from fusekit.gms.commands import app


def test_tune_measures_caches_and_refits(tmp_path):
    cache = tmp_path / "tuning.json"
    args = [
        "tune",
        "--shape",
        "moe",
        "--scale",
        "0.02",
        "--k",
        "8",
        "--m",
        "8",
        "--budget",
        "5",
        "--repeats",
        "1",
        "--cache",
        str(cache),
    ]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["newly_measured"] == 5 and len(out["measured"]) == 5
    assert set(out["coef"]) >= {"tile_gemm", "calls"}
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    # the refitted model may rank other points first; those already measured are not re-run
    assert "gms tune moe-synthetic" in again.output and "points measured" in again.output
    blob = json.loads(cache.read_text())
    assert len(next(iter(blob["entries"].values()))["points"]) >= 5


def test_explain_lists_every_strategy_and_says_why(tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "explain",
            "--shape",
            "rgcn",
            "--scale",
            "0.02",
            "--k",
            "8",
            "--m",
            "8",
            "--cache",
            str(tmp_path / "t.json"),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert len(out["strategies"]) == 12
    assert all(r["measured_s"] > 0 and r["predicted_s"] > 0 for r in out["strategies"])
    predicted = [r["predicted_s"] for r in out["strategies"]]
    assert predicted == sorted(predicted)
    assert out["why"].startswith("selected: ") and "GEMM rows" in out["why"]


def test_tune_rejects_an_unknown_executor(tmp_path):
    result = CliRunner().invoke(
        app, ["tune", "--scale", "0.02", "--executor", "mpi", "--cache", str(tmp_path / "t")]
    )
    assert result.exit_code != 0
    assert "executor" in str(result.exception)
