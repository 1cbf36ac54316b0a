"""``fusekit sparse sam``: output files, --json, and one-line errors with exit status 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse

from fusekit.cli import main

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "sam_graphs"

VEC_MUL = """digraph SAM {
    comment="x=s0,b=s0,c=s0"
    6 [comment="type=fiberlookup,index=i,tensor=b,mode=0,format=compressed,src=true,root=true"]
    5 [comment="type=fiberlookup,index=i,tensor=c,mode=0,format=compressed,src=true,root=true"]
    4 [comment="type=intersect,index=i"]
    3 [comment="type=arrayvals,tensor=b"]
    2 [comment="type=arrayvals,tensor=c"]
    7 [comment="type=mul"]
    1 [comment="type=fiberwrite,index=i,tensor=x,mode=0,format=compressed,sink=true"]
    0 [comment="type=fiberwrite,mode=vals,tensor=x,sink=true"]
    6 -> 4 [type="crd" comment="in-b"]
    6 -> 4 [type="ref" comment="in-b"]
    5 -> 4 [type="crd" comment="in-c"]
    5 -> 4 [type="ref" comment="in-c"]
    4 -> 1 [type="crd"]
    4 -> 3 [type="ref" comment="out-b"]
    4 -> 2 [type="ref" comment="out-c"]
    3 -> 7 [type="val"]
    2 -> 7 [type="val"]
    7 -> 0 [type="val"]
}
"""


def fusekit(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    """Run the ``fusekit`` entry point in-process; its exit status."""
    monkeypatch.setattr(sys, "argv", ["fusekit", *map(str, args)])
    monkeypatch.delenv("FUSEKIT_DEBUG", raising=False)
    with pytest.raises(SystemExit) as e:
        main()
    return int(e.value.code or 0)


@pytest.fixture
def vectors(tmp_path: Path) -> dict[str, Path]:
    b, c = np.array([1.0, 0.0, 2.0, 4.0]), np.array([3.0, 5.0, 0.0, 0.5])
    np.save(tmp_path / "b.npy", b)
    scipy.sparse.save_npz(tmp_path / "c.npz", scipy.sparse.csr_matrix(c[None, :]))
    np.save(tmp_path / "c.npy", c)
    (tmp_path / "vec.gv").write_text(VEC_MUL)
    return {"b": tmp_path / "b.npy", "c": tmp_path / "c.npy", "gv": tmp_path / "vec.gv"}


def test_json_and_output_file(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], vectors: dict[str, Path]
) -> None:
    out = vectors["gv"].parent / "x.npz"
    code = fusekit(
        monkeypatch, "sparse", "sam", vectors["gv"], "--input", f"b={vectors['b']}",
        "--input", f"c={vectors['c']}", "--out", out, "--json",
    )  # fmt: skip
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cycles"] > 0 and data["tokens"]["mul_7"] == 4  # 3, 8: two values, S0, D
    np.testing.assert_allclose(np.load(out)["output"], [3.0, 0.0, 0.0, 2.0])


@pytest.mark.skipif(not (DATA / "mat_elemmul.gv").exists(), reason=f"{DATA} is absent")
def test_scipy_sparse_inputs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rng = np.random.default_rng(3)
    mats = {t: scipy.sparse.random(5, 6, density=0.4, random_state=rng, format="csr") for t in "BC"}
    for t, m in mats.items():
        scipy.sparse.save_npz(tmp_path / f"{t}.npz", m)
    out = tmp_path / "X.npz"
    args = ["sparse", "sam", DATA / "mat_elemmul.gv", "--out", out]
    code = fusekit(monkeypatch, *args, "--input", f"B={tmp_path / 'B.npz'}",
                   "--input", f"C={tmp_path / 'C.npz'}")  # fmt: skip
    assert code == 0 and "cycles" in capsys.readouterr().out
    want = mats["B"].toarray() * mats["C"].toarray()
    np.testing.assert_allclose(np.load(out)["output"], want)


BAD = {
    "syntax": (VEC_MUL.replace("3 -> 7", "3 -> -> 7"), "node 3: line 18: expected a name"),
    "unknown type": (VEC_MUL.replace("type=mul", "type=fma"), "node 7: unknown node type 'fma'"),
    "no producer": (VEC_MUL.replace('    2 -> 7 [type="val"]\n', ""), "node 7: expected mul"),
    "no ref producer": (VEC_MUL.replace('    4 -> 3 [type="ref" comment="out-b"]\n', ""),
                        "node 3: input 'in_ref' of arrayvals has no producer"),
    "cycle": (VEC_MUL.replace('7 -> 0 [type="val"]', '7 -> 0 [type="val"]\n 7 -> 3 [type="val"]'),
              "node 3: a cycle without a FIFO: 3 -> 7 -> 3"),
    "rank": (VEC_MUL.replace("c=s0", "c=ss01"), "node 5: format c=ss01 has 2 levels"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_graph_is_one_line_exit_2(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    vectors: dict[str, Path],
    case: str,
) -> None:
    text, match = BAD[case]
    vectors["gv"].write_text(text)
    code = fusekit(
        monkeypatch, "sparse", "sam", vectors["gv"], "--input", f"b={vectors['b']}",
        "--input", f"c={vectors['c']}",
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert str(vectors["gv"]) in err and match in err, err


def test_missing_input_names_the_node(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], vectors: dict[str, Path]
) -> None:
    code = fusekit(monkeypatch, "sparse", "sam", vectors["gv"], "--input", f"b={vectors['b']}")
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert f"{vectors['gv']}: node 5: expected an input for tensor 'c'" in err


def test_simulate_writes_sam_graphs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from fusekit.sparse.sam import read_gv

    code = fusekit(
        monkeypatch, "sparse", "simulate", "autoencoder", "--cut", "full", "--gv", tmp_path,
        "--json",
    )  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["gv"] and all(line.startswith("wrote") for line in data["gv"])
    for path in sorted(tmp_path.glob("region*.gv")):
        graph = read_gv(path)
        assert graph.output == path.stem.split("_", 1)[1]
        assert any(n.type == "fiberwrite" and n.get("mode") == "vals" for n in graph.nodes.values())
