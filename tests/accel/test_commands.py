import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fusekit.accel.comet import evaluate as comet_evaluate
from fusekit.accel.comet.space import Scored, Space, label
from fusekit.accel.commands import OPS, app
from fusekit.accel.compat import Compat
from fusekit.accel.mapper import explore, objective_key, op_chain, pareto
from fusekit.hw import load
from fusekit.hw.cpu_gpu import plain

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parents[2] / "src/fusekit/accel/comet/examples"
SMALL = ["-M", "64", "-N", "64", "-K", "32"]


def _edge() -> dict:
    return plain(load("edge").comet_arch)


def _s(cycles: int | None, energy: float | None) -> Scored:
    return Scored({"M": (cycles or 0,)}, cycles, energy)


def test_pareto_keeps_only_undominated_tilings():
    pts = [_s(10, 5.0), _s(12, 4.0), _s(12, 6.0), _s(9, 9.0), _s(20, 4.0), _s(None, None)]
    front = pareto(pts)
    assert [(s.total_cycles, s.total_energy_pj) for s in front] == [(9, 9.0), (10, 5.0), (12, 4.0)]
    for s in pts:
        if s.total_cycles is None or s in front:
            continue
        assert any(
            f.total_cycles <= s.total_cycles and f.total_energy_pj <= s.total_energy_pj
            for f in front
        )


def test_objective_keys_rank_by_their_term():
    a, b = _s(10, 8.0), _s(12, 4.0)
    assert min([a, b], key=objective_key("latency")) is a
    assert min([a, b], key=objective_key("energy")) is b
    assert min([a, b], key=objective_key("edp")) is b  # 48 < 80
    with pytest.raises(ValueError, match="objective"):
        objective_key("area")


def test_op_chain_names_ops_and_collectives_in_order():
    chain = op_chain(Space.builtin("gemm_softmax", _edge()).mapping_doc)
    assert chain == ("GEMM", "ROWMAX", "allreduce(max)", "SUB", "EXP1", "allreduce(add)",
                     "ROWSUM", "DIV")  # fmt: skip


def test_explore_front_best_and_the_unfused_baseline():
    dims = {"M": 64, "N": 64, "K": 32}
    sp = Space.builtin("gemm_softmax", _edge())
    ex = explore(sp, dims, "gemm_softmax", compiled=False)
    ok = [s for s in ex.result.scored if s.total_cycles is not None]
    assert ex.result.pruned == 0 and len(ok) + ex.result.rejected == ex.result.tilings
    assert ex.best.total_cycles == min(s.total_cycles for s in ok)
    assert ex.front[0].total_cycles == ex.best.total_cycles
    assert ex.front == pareto(ok)
    # the baseline: the kernels' sums at the best tiling, each kernel its own template
    g = Space.builtin("gemm", _edge()).score(ex.best.tiling, dims, Compat())
    s = Space.builtin("softmax", _edge()).score(ex.best.tiling, dims, Compat())
    assert ex.unfused_cycles == g.total_cycles + s.total_cycles
    assert ex.speedup == ex.unfused_cycles / ex.best.total_cycles
    # a latency search stopped at the lower bound finds the same best, without a front
    pruned = explore(sp, dims, "gemm_softmax", front=False, compiled=False)
    assert pruned.best == ex.best and pruned.front == () and pruned.result.pruned > 0
    energy = explore(sp, dims, "gemm_softmax", objective="energy", compiled=False)
    assert energy.best.total_energy_pj == min(s.total_energy_pj for s in ok)
    assert energy.best in energy.front


def test_explore_json_and_plot(tmp_path):
    plot = tmp_path / "pareto.png"
    result = runner.invoke(app, ["explore", "gemm_softmax", *SMALL, "--json", "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    best = data["best"]
    assert best["total_cycles"] == min(p["total_cycles"] for p in data["pareto"])
    assert {"GEMM", "ROWMAX", "ALLREDUCE-12"} <= set(best["cycles"])
    assert data["unfused"]["speedup"] == data["unfused"]["total_cycles"] / best["total_cycles"]
    assert [k["kernel"] for k in data["unfused"]["kernels"]] == ["gemm", "softmax"]
    assert data["chain"][0] == "GEMM" and plot.stat().st_size > 0


def test_explore_tables_and_errors():
    result = runner.invoke(app, ["explore", "attention", "-M", "16", "-N", "64", "-K", "16"])
    assert result.exit_code == 0, result.output
    assert "Fused against unfused" in result.output and "per-unit table" in result.output
    assert "Pareto front" not in result.output  # pruned: no front
    bad = runner.invoke(app, ["explore", "gemm", *SMALL, "--space", "fusekit"])
    assert "retired" in str(bad.exception)
    bad = runner.invoke(app, ["explore", "conv", *SMALL])
    assert "built-in op" in str(bad.exception)


def test_explore_writes_the_mapping_eval_reads(tmp_path):
    out = tmp_path / "best"
    args = ["explore", "gemm_layernorm", *SMALL, "--json", "--write-mapping", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    best = json.loads(result.output)["best"]
    own = yaml.safe_load((out / "fusekit.yaml").read_text())
    assert label({d: tuple(v) for d, v in own["tiling"].items()}) == best["tiling"]
    for path in (out, out / "tree.yaml"):
        again = runner.invoke(app, ["eval", str(path), "--json"])
        assert again.exit_code == 0, again.output
        data = json.loads(again.output)
        assert data["total_cycles"] == best["total_cycles"]
        assert data["total_energy_pj"] == pytest.approx(best["total_energy_pj"], rel=1e-12)


#: Every built-in op ships an example: the mapper's best tiling at decode shape 1x1024x128 on edge.
EXAMPLE_OPS = OPS


def test_shipped_examples_are_the_mappers_best():
    """`fusekit accel explore OP -M 1 -N 1024 -K 128 --write-mapping DIR` writes each again."""
    arch = _edge()
    for op in EXAMPLE_OPS:
        d = EXAMPLES / f"{op}_edge"
        own = yaml.safe_load((d / "fusekit.yaml").read_text())
        assert own["extents"] == {"M": 1, "N": 1024, "K": 128}
        best = Space.builtin(op, arch).search(own["extents"]).best
        assert {k: tuple(v) for k, v in own["tiling"].items()} == best.tiling, op
        assert comet_evaluate(d)["total_cycles"] == best.total_cycles


@pytest.mark.parametrize("op", EXAMPLE_OPS)
def test_shipped_example_per_op_evaluates(op):
    shipped = runner.invoke(app, ["eval", str(EXAMPLES / f"{op}_edge"), "--json"])
    assert shipped.exit_code == 0, shipped.output
    assert json.loads(shipped.output)["total_cycles"] > 0


def test_label_spelling_is_comets():
    assert label({"M": (1, 2), "N": (3, 4), "K": (5, 6)}) == "M=1x2 N=3x4 K=5x6"


@pytest.mark.parametrize("op", ["gemm", "gemm_softmax", "gemm_layernorm", "attention", "softmax"])
def test_formulas_follow_the_templates_chain(op):
    from fusekit.accel.comet.templates import formulas

    assert tuple(f[0] for f in formulas(op)) == op_chain(Space.builtin(op, _edge()).mapping_doc)


def test_an_extent_no_tiling_can_split_is_named():
    result = runner.invoke(app, ["explore", "gemm_softmax", "-M", "3", "-N", "5", "-K", "7"])
    assert "N=5 is not a multiple of 16" in str(result.exception)


def _best(args: list[str], dims: list[str] = SMALL) -> dict:
    result = runner.invoke(app, ["explore", *args, *dims, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["best"]


def test_hw_may_be_a_comet_arch_file_and_a_template_keeps_its_own(tmp_path):
    from fusekit.accel.comet.templates import write_template

    arch = tmp_path / "arch.yaml"
    arch.write_text(yaml.safe_dump(_edge(), sort_keys=False))
    assert _best(["gemm_softmax", "--hw", str(arch)]) == _best(["gemm_softmax", "--hw", "edge"])
    cloud = plain(load("cloud").comet_arch)
    run = write_template("gemm_softmax", tmp_path / "run", cloud)
    wide = ["-M", "8", "-N", "256", "-K", "8"]  # cloud splits N 256 ways
    assert _best(["--template", str(run)], wide) == _best(["gemm_softmax", "--hw", "cloud"], wide)
    assert _best(["--template", str(run), "--hw", "edge"], wide) == _best(["gemm_softmax"], wide)
    bad = tmp_path / "bad_arch.yaml"
    bad.write_text(arch.read_text().replace("meshX: 2", "meshX: 0", 1))
    result = runner.invoke(app, ["explore", "gemm", *SMALL, "--hw", str(bad)])
    assert "bad_arch.yaml" in str(result.exception) and "meshX" in str(result.exception)
    result = runner.invoke(app, ["explore", "gemm", *SMALL, "--hw", "h100"])
    assert "comet_arch, or a COMET arch.yaml" in str(result.exception)


def test_space_counts_its_tilings_without_building_them():
    from fusekit.accel.comet.space import arch_constraints

    sp = Space.builtin("gemm_softmax", _edge())
    for dims in ({"M": 64, "N": 64, "K": 32}, {"M": 3, "N": 5, "K": 7}):
        fixed = arch_constraints(sp.arch)
        assert sp.count(dims, fixed) == len(sp.tilings(dims, fixed))
