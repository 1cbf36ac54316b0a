import json

from typer.testing import CliRunner

from fusekit.sparse.commands import app


def test_simulate_and_explore_commands(tmp_path) -> None:  # type: ignore[no-untyped-def]
    runner = CliRunner()
    out = runner.invoke(app, ["simulate", "autoencoder", "--cut", "full", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["correct"] and data["cycles"] > 0
    plot = tmp_path / "explore.png"
    out = runner.invoke(
        app, ["explore", "bigbird-b16", "--quick", "--top", "1", "--plot", str(plot)]
    )
    assert out.exit_code == 0, out.output
    assert plot.exists() and "Best per cut" in out.output
