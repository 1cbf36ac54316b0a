import json
import subprocess
import sys
import textwrap

import pytest
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


FACTORIES = textwrap.dedent(
    """
    import numpy as np
    import scipy.sparse as sp
    import torch

    from fusekit.sparse.workloads import autoencoder


    class TinyGCN(torch.nn.Module):
        def __init__(self, adj):
            super().__init__()
            self.register_buffer("adj", adj)
            self.l1 = torch.nn.Linear(8, 4, bias=False)

        def forward(self, x):
            return torch.relu(torch.sparse.mm(self.adj, self.l1(x)))


    def module():  # what `fusekit ir` and `fusekit stitch` take: (module, args), float32
        torch.manual_seed(0)
        adj = ((torch.rand(10, 10) < 0.3).float() * torch.rand(10, 10)).to_sparse_csr()
        return TinyGCN(adj).eval(), (torch.randn(10, 8),)


    def workload():
        return autoencoder(batch=4, features=32, hidden=8)


    def program():
        return autoencoder(batch=4, features=32, hidden=8).program


    def nothing():
        return 3
    """
)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("factory", ["module", "workload", "program"])
def test_commands_take_a_file_factory(tmp_path, factory: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "mine.py"
    path.write_text(FACTORIES)
    runner = CliRunner()
    out = runner.invoke(app, ["simulate", f"{path}:{factory}", "--cut", "full", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["correct"] and data["cycles"] > 0
    out = runner.invoke(app, ["explore", f"{path}:{factory}", "--top", "1", "--json"])
    assert out.exit_code == 0, out.output
    assert all(r["correct"] for r in json.loads(out.output)["simulated"])


def test_a_factory_returning_something_else_is_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "mine.py"
    path.write_text(FACTORIES)
    out = CliRunner().invoke(app, ["simulate", f"{path}:nothing"])
    assert isinstance(out.exception, ValueError)
    message = str(out.exception)
    assert "'nothing()'" in message and "(module, args)" in message and "\n" not in message
    out = CliRunner().invoke(app, ["explore", f"{path}:missing"])
    assert isinstance(out.exception, ValueError) and "'factory'" in str(out.exception)
    # through the script: the message on one line, exit status 2
    run = subprocess.run(
        [sys.executable, "-m", "fusekit", "sparse", "explore", f"{path}:nothing"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert run.stderr.startswith("error: sparse: expected 'nothing()'")
