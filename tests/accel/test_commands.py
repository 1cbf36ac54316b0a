import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from fusekit.accel import Fusion, Mapping, gemm_softmax, to_tree
from fusekit.accel.commands import app
from fusekit.accel.mapping import tree_to_dict

runner = CliRunner()


def test_explore_json(tmp_path):
    plot = tmp_path / "pareto.png"
    args = ["explore", "gemm_softmax", "-M", "64", "-N", "64", "-K", "32", "--json"]
    result = runner.invoke(app, [*args, "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["best"]["latency_cycles"] > 0
    assert {"unfused", "fused_gb", "fused_cluster"} <= set(data["best_by_fusion"])
    assert any("all_reduce" in o["kind"] for o in data["best"]["ops"]) or data["best"]["ops"]
    assert plot.stat().st_size > 0


def test_explore_table():
    result = runner.invoke(app, ["explore", "attention", "-M", "16", "-N", "64", "-K", "16"])
    assert result.exit_code == 0, result.output
    assert "Pareto front" in result.output and "speedup vs unfused" in result.output


def test_eval_mapping_yaml(tmp_path):
    p = gemm_softmax(64, 64, 32)
    m = Mapping(Fusion.FUSED_GB, 1, 4, 8, 16, 32, ("m", "n", "k"))
    doc = {
        "problem": {"kind": "gemm_softmax", "M": 64, "N": 64, "K": 32},
        "accelerator": "edge",
        "mapping": tree_to_dict(to_tree(p, m)),
    }
    f = tmp_path / "mapping.yaml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = runner.invoke(app, ["eval", str(f), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["mapping"] == m.label()
    assert [o["name"] for o in data["ops"]][:3] == ["S", "X", "X.all_reduce(max)"]
    result = runner.invoke(app, ["eval", str(f)])
    assert result.exit_code == 0 and "Energy by part" in result.output


def test_eval_bad_mapping_names_the_node(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(
        "problem: {kind: gemm_softmax, M: 64, N: 64, K: 32}\n"
        "mapping: {tile: {level: dram, temporal: {m: 0}}, child: {op: S}}\n"
    )
    result = runner.invoke(app, ["eval", str(f)])
    assert result.exit_code != 0
    assert "mapping.tile.temporal" in str(result.exception)


def test_explore_writes_the_mapping_eval_reads(tmp_path):
    f = tmp_path / "best" / "m.yaml"
    args = ["explore", "gemm_layernorm", "-M", "64", "-N", "64", "-K", "32", "--json"]
    result = runner.invoke(app, [*args, "--write-mapping", str(f)])
    assert result.exit_code == 0, result.output
    best = json.loads(result.output)["best"]
    again = runner.invoke(app, ["eval", str(f), "--json"])
    assert again.exit_code == 0, again.output
    data = json.loads(again.output)
    assert data["mapping"] == best["mapping"]
    assert data["latency_cycles"] == best["latency_cycles"]
    assert data["energy_pj"] == best["energy_pj"]
    examples = Path(__file__).resolve().parents[2] / "src/fusekit/accel/examples"
    for op in ("gemm", "gemm_softmax", "gemm_layernorm", "attention"):  # one shipped per op
        shipped = runner.invoke(app, ["eval", str(examples / f"{op}_edge.yaml"), "--json"])
        assert shipped.exit_code == 0, shipped.output
        assert json.loads(shipped.output)["latency_cycles"] > 0
