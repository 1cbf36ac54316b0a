import json

import pytest
from typer.testing import CliRunner

from fusekit.ir.commands import app

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
runner = CliRunner()


def test_list_prints_the_builtin_models():
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0
    assert "gpt_moe" in result.output and "aten.topk.default" in result.output
    records = json.loads(runner.invoke(app, ["list", "--json"]).output)
    assert [r["name"] for r in records] == ["bert", "gpt_moe", "gcn", "rgcn"]


def test_show_json_has_ops_kinds_and_chains():
    result = runner.invoke(app, ["show", "rgcn", "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    assert record["model"] == "rgcn" and record["method"] == "export"
    assert record["kinds"] == {"contraction": 2, "gather": 3, "map": 11, "scatter": 2}
    assert len(record["ops"]) == 18
    first = record["inputs"][0]
    assert first == {
        "name": "x",
        "dtype": "float32",
        "shape": [64, 16],
        "format": ["dense"] * 2,
        "nnz": None,
    }
    (chain,) = record["gms_chains"]
    assert chain["source"] == "x" and chain["weights"][0]["index"] == "edge_type"


def test_show_prints_a_table_and_writes_dot(tmp_path):
    dot = tmp_path / "gcn.dot"
    result = runner.invoke(app, ["show", "gcn", "--dot", str(dot)])
    assert result.exit_code == 0, result.output
    assert "contraction" in result.output and "{dense,compressed}" in result.output
    assert "linear[i,j] =" in result.output  # indices are not eaten as rich markup
    assert dot.read_text().startswith('digraph "gcn"')


def test_show_text_prints_the_graph_text_form():
    result = runner.invoke(app, ["show", "gcn", "--text"])
    assert result.exit_code == 0
    assert "_sparse_mm[i,j] = sum_k adj[i,k] * linear[k,j]" in result.output


def test_show_a_model_from_a_file(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "import torch\ndef make():\n    return torch.nn.Softmax(-1), (torch.randn(2, 3),)\n"
    )
    result = runner.invoke(app, ["show", f"{path}:make", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["kinds"] == {"map": 2, "reduce": 2}


def test_show_unknown_model_fails_with_the_choices():
    result = runner.invoke(app, ["show", "resnet"])
    assert result.exit_code != 0
    assert "expected 'model' to be one of bert, gpt_moe, gcn, rgcn" in str(result.exception)
