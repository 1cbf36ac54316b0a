"""COMET's front end against the COMET binary's own outputs (../shared/oracles/comet).

One test per case family; each compares every run of the family in the shared folder:
completed runs to the cycle (total and per unit), total energy within 0.5 %, every per-unit
cycle part and per-level energy within 1 %; rejected runs rejected with the same levels.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fusekit.accel.comet import (
    DEVIATIONS,
    CometFitError,
    CometInputError,
    CometModelError,
    Compat,
    MeshShapeError,
    evaluate,
    templates,
)
from fusekit.accel.comet.files import read_arch, read_case, read_mapping, read_problem, walk_nodes
from fusekit.accel.comet.fusion import unfused
from fusekit.accel.comet.space import Space, arch_constraints, read_constraints
from fusekit.accel.comet.templates import write_template
from fusekit.accel.commands import OPS, app
from fusekit.accel.tree import TreeInputError, TreeMapping, tree_to_dict
from fusekit.accel.tree_model import analyse
from fusekit.hw import load
from fusekit.hw.cpu_gpu import plain

ORACLE = Path(__file__).resolve().parents[2] / ".." / "shared" / "oracles" / "comet"
pytestmark = pytest.mark.skipif(
    not (ORACLE / "summary.csv").exists(), reason="COMET oracle (../shared/oracles/comet) absent"
)
runner = CliRunner()


def _rows() -> dict[str, dict[str, str]]:
    if not (ORACLE / "summary.csv").exists():
        return {}
    with open(ORACLE / "summary.csv") as f:
        return {r["case"]: r for r in csv.DictReader(f) if (ORACLE / "cases" / r["case"]).is_dir()}


ROWS = _rows()


def _check_completed(case: str) -> None:
    row = ROWS[case]
    out = evaluate(ORACLE / "cases" / case)
    assert out["total_cycles"] == int(row["total_cycles"]), case
    assert out["total_energy_pj"] == pytest.approx(float(row["total_energy_pJ"]), rel=5e-3), case
    cycles, energy = out["cycles"], out["energy_pj"]
    for key, value in row.items():
        if value != "" and key.startswith("ideal_") and key != "ideal_Total":
            assert out["ideal_cycles"][key[6:]] == int(value), (case, key)
        if value != "" and key.startswith("util_") and key != "util_Total":
            assert out["utilisation"][key[5:]] == pytest.approx(float(value), abs=0.0051), key
        if value == "" or not key.startswith(("cyc_", "E_")):
            continue
        if key.startswith("E_"):
            assert energy[key[2:]] == pytest.approx(float(value), rel=1e-2, abs=1e-6), (case, key)
            continue
        unit, part = key[4:], "total"
        for p in ("_CS", "_OS", "_TMW"):
            if unit.endswith(p):
                unit, part = unit[: -len(p)], p[1:]
        assert cycles[unit][part] == pytest.approx(float(value), rel=1e-2), (case, key)
    # no unit or energy row COMET does not print
    assert {f"cyc_{u}" for u in cycles} <= {k for k, v in row.items() if v != ""}, case
    assert {f"E_{e}" for e in energy} <= {k for k, v in row.items() if v != ""}, case


def _check_rejected(case: str) -> None:
    want = ROWS[case]["status"].removeprefix("rejected: ").split("; ")
    with pytest.raises(CometFitError) as info:
        evaluate(ORACLE / "cases" / case)
    assert [f"Tensors do not fit in {lv} | Capacity: {c} Bytes | Requested: {r} Bytes"
            for lv, c, r in info.value.overflows] == want  # fmt: skip
    assert "\n" not in str(info.value)


FAMILIES = {
    "example_run": ("ex_example_run_", ""),
    "edge_gemm_softmax_fused": ("im_edge_gemm_softmax_fused_", "_ok"),
    "cloud_gemm_softmax_fused": ("im_cloud_gemm_softmax_fused_", "_ok"),
    "gemm_layernorm_fused": ("au_", "_gemm_layernorm_fused_"),
    "gemm_only": ("au_", "_gemm_only_"),
    "softmax_only": ("au_", "_softmax_only_"),
    "layernorm_only": ("au_", "_layernorm_only_"),
    "mesh_probe_4x1": ("q_", "gbspatial4x1"),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_completed_family_matches_comet(family):
    prefix, part = FAMILIES[family]
    cases = [c for c in ROWS if c.startswith(prefix) and part in c and ROWS[c]["status"] == "ok"]
    assert cases, family
    for case in cases:
        _check_completed(case)


def test_rejected_tilings_are_rejected_with_the_same_levels():
    cases = [c for c in ROWS if ROWS[c]["status"].startswith("rejected")]
    assert cases
    for case in cases:
        _check_rejected(case)


def test_mesh_probe_3x3_is_a_clear_error_or_a_generalised_value():
    case = ORACLE / "cases" / "q_cloud_gemm_softmax_fused_M256_N256_K512_gbspatial4x2"
    with pytest.raises(MeshShapeError, match=r"DataMovementTileNode::4: a 3x3 sub-mesh"):
        evaluate(case)
    native = evaluate(case, compat=False)  # hops and data 2(n-1) on an n x n sub-mesh
    assert native["total_cycles"] > 0
    result = runner.invoke(app, ["comet", str(case)])
    assert result.exit_code != 0 and isinstance(result.exception, MeshShapeError)


def test_cli_json_and_rejection():
    case = ORACLE / "cases" / "im_edge_gemm_softmax_fused_M256_N256_K128_ok0"
    result = runner.invoke(app, ["comet", str(case), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["total_cycles"] == 53964
    assert data["cycles"]["ALLREDUCE-21"] == {"OS": 30880, "total": 30880}
    assert data["energy_pj"]["GEMMEngine-GEMM"] == pytest.approx(1926024.38, rel=1e-6)
    rej = ORACLE / "cases" / "im_edge_gemm_softmax_fused_M1024_N1024_K256_rej0"
    result = runner.invoke(app, ["comet", str(rej)])
    assert isinstance(result.exception, CometFitError)
    assert "IB | Capacity: 32768" in str(result.exception)


def _copy(tmp_path: Path, case: str = "im_edge_gemm_softmax_fused_M256_N256_K128_ok0") -> Path:
    dst = tmp_path / "case"
    shutil.copytree(ORACLE / "cases" / case, dst)
    return dst


@pytest.mark.parametrize(
    ("file", "old", "new", "error", "match"),
    [
        ("mapping.yaml", "type:              exp", "type:              expo",
         CometInputError, r"mapping.yaml: .*unknown operation type 'expo'"),
        ("mapping.yaml", "type:         allreduce", "type:         allreduse",
         CometInputError, r"collectiveoperation node 12\): unknown collective type"),
        ("constants.yaml", "  M_SE: 32\n", "", CometInputError, r"missing constant 'M_SE'"),
        ("problem.yaml", "out: C", "out: Q", CometInputError, r"problem.yaml: .*GEMM"),
    ],
)  # fmt: skip
def test_bad_files_give_one_line_naming_file_and_node(tmp_path, file, old, new, error, match):
    d = _copy(tmp_path)
    p = d / file
    text = p.read_text()
    assert old in text
    p.write_text(text.replace(old, new, 1))
    with pytest.raises(error, match=match) as info:
        evaluate(d)
    assert "\n" not in str(info.value)


def test_tree_shape_that_crashes_comet_is_named(tmp_path):
    d = _copy(tmp_path, "au_edge_gemm_only_M256_N256_K128_ok0")
    p = d / "mapping.yaml"
    text = p.read_text()
    # [binding, tile] under one node: COMET dereferences a missing sibling
    marker = "     - node_type:   DataMovement_Tile\n       target:      [GB,GB,GB]\n"
    assert marker in text
    p.write_text(text.replace(marker, "     - node_type: inter_tile_binding\n"
                              "       binding: sequential\n" + marker, 1))  # fmt: skip
    with pytest.raises(CometModelError, match=r"DataMovementTileNode::\d+: no binding node"):
        evaluate(d)


def test_each_deviation_switches_off_alone():
    case = ORACLE / "cases" / "im_edge_gemm_softmax_fused_M256_N256_K128_ok1"
    comet = evaluate(case)
    assert comet["total_cycles"] == int(ROWS[case.name]["total_cycles"])
    root = evaluate(case, compat=Compat().without("unit_sum_total"))
    assert root["total_cycles"] == comet["root_cycles"] != comet["total_cycles"]
    for name in DEVIATIONS:  # every switch runs; energy depends on tag_instances only
        out = evaluate(case, compat=Compat().without(name))
        if name != "tag_instances":
            assert out["total_energy_pj"] == comet["total_energy_pj"], name
    with pytest.raises(ValueError, match="'name'"):
        Compat().without("no_such_quirk")


def test_native_simd_energy_counts_every_unit():
    """README quirk 9: the fused mapping's GB-spatial node lists only D for ROWMAX."""
    fused = ORACLE / "cases" / "im_edge_gemm_softmax_fused_M256_N256_K128_ok0"
    alone = ORACLE / "cases" / "au_edge_softmax_only_M256_N256_K128_ok0"
    comet = evaluate(fused)["energy_pj"]
    native = evaluate(fused, compat=Compat().without("tag_instances"))
    assert comet["SE-ROWMAX"] * 4 == pytest.approx(native["energy_pj"]["SE-ROWMAX"], rel=1e-6)
    assert native["energy_pj"]["SE-ROWMAX"] == evaluate(alone)["energy_pj"]["SE-ROWMAX"]
    # 256 x 256 exponentials at 3.86 pJ each, every one charged once
    assert native["energy_pj"]["SE-EXP1"] == pytest.approx(256 * 256 * 3.86, rel=1e-6)
    assert native["total_cycles"] == evaluate(fused)["total_cycles"]


@pytest.mark.parametrize("hw", ["edge", "cloud"])
def test_presets_carry_comets_arch_files(hw):
    ship = "arch.yaml" if hw == "edge" else "arch_cloud.yaml"
    doc = yaml.safe_load((ORACLE / "shipped_inputs/iterative_mapper" / ship).read_text())
    preset = read_arch(plain(load(hw).comet_arch), hw)
    assert preset == read_arch(doc, ship)  # every level, spec figure, instance count and network
    cases = [
        c for c in ROWS if c.startswith((f"im_{hw}_", f"au_{hw}_")) and ROWS[c]["status"] == "ok"
    ]
    for case in cases:  # the same numbers on the preset as on the run's arch.yaml
        assert evaluate(ORACLE / "cases" / case, hw=hw) == evaluate(ORACLE / "cases" / case)


@pytest.mark.parametrize(
    ("hw", "case", "dims"),
    [
        ("edge", "im_edge_gemm_softmax_fused_M1_N1024_K128_ok0", (1, 1024, 128)),
        ("cloud", "im_cloud_gemm_softmax_fused_M1_N4096_K512_ok0", (1, 4096, 512)),
    ],
)
def test_comet_space_beats_the_shared_tilings_and_writes_the_mapping(tmp_path, hw, case, dims):
    sp = Space(ORACLE / "cases" / case)
    ship = "constraints.yaml" if hw == "edge" else "constraints_cloud.yaml"
    fixed = read_constraints(ORACLE / "shipped_inputs/iterative_mapper" / ship)
    ours = arch_constraints(sp.arch)
    assert {d: fixed[d] for d in ours} == ours  # the shipped constraints, read off the arch
    m, n, k = dims
    result = sp.search({"M": m, "N": n, "K": k})
    shape = f"_M{m}_N{n}_K{k}_"
    shared = [int(r["total_cycles"]) for c, r in ROWS.items()
              if c.startswith(f"im_{hw}_") and shape in c and r["status"] == "ok"]  # fmt: skip
    assert shared and result.best.total_cycles <= min(shared)
    assert result.sample_median_cycles >= result.best.total_cycles
    out = sp.write(tmp_path / "best", result.best.tiling, {"M": m, "N": n, "K": k}, hw)
    assert evaluate(out)["total_cycles"] == result.best.total_cycles  # COMET's four files
    assert (out / "fusekit.yaml").exists()


def test_loop_nest_report():
    case = ORACLE / "cases" / "im_edge_gemm_softmax_fused_M256_N256_K128_ok0"
    nest = evaluate(case)["nest"]
    gemm_tile = next(r for r in nest if r["node"] == "DataMovementTileNode::5")
    assert gemm_tile["type"] == "temporal" and gemm_tile["cycles"] == 826
    assert {a["level"] for a in gemm_tile["accesses"]} == {"IB", "WB", "OB", "GEMMEngine"}
    col = next(r for r in nest if r["node"] == "CollectiveOpNode::21")
    assert (col["type"], col["tensor"], col["cycles"], col["iterations"]) == (
        "allreduce",
        "F",
        3860,
        8,
    )
    result = runner.invoke(app, ["comet", str(case), "--nest"])
    assert result.exit_code == 0 and "Loop nest" in result.output


def test_builtin_templates_are_the_shared_mappings(tmp_path):
    ops = {"im_": "gemm_softmax", "_gemm_layernorm_fused_": "gemm_layernorm",
           "_gemm_only_": "gemm"}  # fmt: skip
    n = 0
    for case, row in ROWS.items():
        op = next((v for k, v in ops.items() if k in case), None)
        if op is None or row["status"] != "ok" or "gbspatial" in case:
            continue
        arch = yaml.safe_load((ORACLE / "cases" / case / "arch.yaml").read_text())
        d = write_template(op, tmp_path / case, arch)
        shutil.copy(ORACLE / "cases" / case / "constants.yaml", d / "constants.yaml")
        mine, theirs = evaluate(d), evaluate(ORACLE / "cases" / case)
        assert (mine["cycles"], mine["energy_pj"]) == (theirs["cycles"], theirs["energy_pj"]), case
        n += 1
    assert n >= 20
    result = runner.invoke(app, ["explore", "gemm_layernorm", "--space", "comet", "--hw", "edge",
                                 "-M", "1", "-N", "1024", "-K", "128", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    best = json.loads(result.output)["best"]["total_cycles"]
    shared = [int(r["total_cycles"]) for c, r in ROWS.items()
              if c.startswith("au_edge_gemm_layernorm_fused_M1_N1024_K128")]  # fmt: skip
    assert best <= min(shared)


EXAMPLE_OPS = OPS  # every built-in op ships an example


def test_fusekit_tree_form_round_trips(tmp_path):
    for case in ("im_edge_gemm_softmax_fused_M256_N256_K128_ok0",
                 "au_cloud_layernorm_only_M256_N256_K512_ok1",
                 "ex_example_run_gemm_softmax_fused_M256_N1024_K4096_noc"):  # fmt: skip
        f = tmp_path / f"{case}.yaml"
        f.write_text(yaml.safe_dump(tree_to_dict(read_case(ORACLE / "cases" / case))))
        mine, theirs = evaluate(f), evaluate(ORACLE / "cases" / case)
        assert (mine["cycles"], mine["energy_pj"]) == (theirs["cycles"], theirs["energy_pj"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("tree: {id: 0}\n")
    with pytest.raises(TreeInputError, match=r"bad\.yaml: -: not a fusekit mapping tree"):
        evaluate(bad)
    examples = Path(__file__).resolve().parents[2] / "src/fusekit/accel/comet/examples"
    for op in EXAMPLE_OPS:
        d = examples / f"{op}_edge"
        assert evaluate(d / "tree.yaml")["total_cycles"] == evaluate(d)["total_cycles"]


def test_native_mac_energy_follows_the_unit_class():
    """README quirk 6: example_run names its mac-class tile GEMM, which COMET charges per unit."""
    case = ORACLE / "cases" / "ex_example_run_gemm_softmax_fused_M256_N1024_K4096"
    comet = evaluate(case)
    native = evaluate(case, compat=Compat().without("energy_by_name"))
    assert comet["energy_pj"]["macengine-GEMM"] == float(ROWS[case.name]["E_macengine-GEMM"])
    # every one of the 256 x 1024 x 4096 MACs once, at 0.2296 pJ
    assert native["energy_pj"]["macengine-GEMM"] == pytest.approx(256 * 1024 * 4096 * 0.2296,
                                                                   rel=1e-6)  # fmt: skip
    assert native["total_cycles"] == comet["total_cycles"]


def test_native_reads_simd_costs_from_the_arch(tmp_path):
    """README quirk 10: COMET's SIMD costs are constants; native reads the arch's where given."""
    case = ORACLE / "cases" / "im_edge_gemm_softmax_fused_M256_N256_K128_ok1"
    mine = tmp_path / "case"
    shutil.copytree(case, mine)
    arch = yaml.safe_load((mine / "arch.yaml").read_text())

    tiles = [node for node in walk_nodes(arch) if node.get("name") == "VSIMD"]
    assert tiles
    for t in tiles:
        t.setdefault("attributes", {}).update(op_cycles={"exp": 6}, op_energy_pj={"exp": 7.72})
    (mine / "arch.yaml").write_text(yaml.safe_dump(arch))
    comet, given = evaluate(case), evaluate(mine)
    assert given["total_cycles"] == comet["total_cycles"]  # COMET ignores them
    assert given["energy_pj"] == comet["energy_pj"]
    native = Compat().without("simd_constants")
    base, own = evaluate(case, compat=native), evaluate(mine, compat=native)
    assert base["energy_pj"] == comet["energy_pj"]  # no arch costs: COMET's constants
    assert own["energy_pj"]["SE-EXP1"] == pytest.approx(2 * base["energy_pj"]["SE-EXP1"], rel=1e-6)
    assert own["energy_pj"]["SE-DIV"] == base["energy_pj"]["SE-DIV"]
    exp_units = [u for u in own["cycles"] if "EXP" in u]
    assert exp_units
    for u in exp_units:  # twice the cycles per instruction: twice the compute (TMW) part
        assert own["cycles"][u]["TMW"] == 2 * base["cycles"][u]["TMW"]


def test_attention_template_adds_pv_and_its_all_reduce():
    """Attention: the softmax chain, then O = H V reduced over the split N, then reduce(O)."""
    arch = plain(load("edge").comet_arch)
    dims = {"M": 256, "N": 256, "K": 128}
    tiling = {"M": (2, 1, 1, 4, 1, 1, 1, 32), "N": (1, 2, 2, 1, 2, 2, 1, 16),
              "K": (1, 1, 1, 1, 1, 1, 1, 128)}  # fmt: skip
    att = analyse(Space.builtin("attention", arch).inputs(tiling, dims), True, Compat.native())
    sm = analyse(Space.builtin("gemm_softmax", arch).inputs(tiling, dims), True, Compat.native())
    e = att["energy_pj"]
    macs = 256 * 256 * 128 * 0.2296  # each GEMM: M x N x K MACs, charged once natively
    assert e["GEMMEngine-GEMM"] == pytest.approx(macs, rel=1e-6)
    assert e["GEMMEngine-GEMM2"] == pytest.approx(macs, rel=1e-6)
    assert "GEMMEngine-GEMM2" not in sm["energy_pj"]
    assert len([u for u in att["cycles"] if u.startswith("ALLREDUCE-")]) == 2
    assert [u for u in att["cycles"] if u.startswith("REDUCTION-")]  # O's partial sums
    assert att["cycles"]["GEMM2"]["TMW"] > 0
    assert att["total_cycles"] > sm["total_cycles"]
    assert att["total_energy_pj"] > sm["total_energy_pj"]


@pytest.mark.parametrize("family", ["gemm_only", "softmax_only", "layernorm_only",
                                    "gemm_softmax_fused", "gemm_layernorm_fused"])  # fmt: skip
def test_templates_are_comets_files(family):
    """fusekit's templates, given a run's constants, give that run's numbers exactly."""
    op = family.replace("_only", "").replace("_fused", "")
    cases = [c for c in sorted((ORACLE / "cases").glob(f"*_{family}_*"))
             if c.name.startswith(("im_", "au_")) and "rej" not in c.name]  # fmt: skip
    assert cases
    for case in cases:
        const = yaml.safe_load((case / "constants.yaml").read_text())["const"]
        arch = read_arch(yaml.safe_load((case / "arch.yaml").read_text()), "arch.yaml")
        prob = read_problem(templates.problem(op), const, "problem.yaml")
        root = read_mapping(templates.mapping(op), prob, arch, const, "mapping.yaml")
        ours = analyse(TreeMapping(arch, prob, root, const, "mapping.yaml"), True, Compat())
        assert ours["total_cycles"] == int(ROWS[case.name]["total_cycles"]), case.name
        assert ours["total_energy_pj"] == pytest.approx(float(ROWS[case.name]["total_energy_pJ"]),
                                                        rel=1e-6), case.name  # fmt: skip


def test_unfused_baseline_sums_its_kernels():
    """COMET's construction: GEMM and chain kernels at the fused tiling; attention adds PV."""
    arch = plain(load("edge").comet_arch)
    case = ORACLE / "cases" / "im_edge_gemm_softmax_fused_M256_N256_K128_ok0"

    const = yaml.safe_load((case / "constants.yaml").read_text())["const"]
    dims = {"M": 256, "N": 256, "K": 128}
    tiling = {"M": (const["M_A_DRAM_temporal"], 1, 1, const["M_A_GB_temporal"], 1, 1,
                    const["M_Core_temporal"], const["M_Compute"]),
              "N": (1, const["N_DRAM_spatial_X"], const["N_DRAM_spatial_Y"], 1,
                    const["N_GB_spatial_X"], const["N_GB_spatial_Y"], const["N_Core_temporal"],
                    const["N_Compute"]),
              "K": (1, 1, 1, 1, 1, 1, const["K_Core_temporal"], const["K_Compute"])}  # fmt: skip
    ks = unfused("gemm_softmax", tiling, dims, arch)
    assert [k.name for k in ks] == ["gemm", "softmax"]
    # the shared du_ pair: gemm-only 16,136 + softmax-only 45,360 cycles (oracle README)
    assert sum(k.total_cycles for k in ks) == 16136 + 45360
    fused = Space.builtin("gemm_softmax", arch).score(tiling, dims, Compat())
    assert fused.total_cycles == 53964
    att = unfused("attention", tiling, dims, arch)
    assert [k.name for k in att] == ["gemm", "softmax", "pv"]
    assert att[2].dims == {"M": 256, "N": 128, "K": 256} and att[2].total_cycles > 0
    with pytest.raises(ValueError, match="'op'"):
        unfused("gemm", tiling, dims, arch)
