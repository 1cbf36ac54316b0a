"""The SAM .gv reader and writer: the DOT subset's quirks, and write -> read round trips."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fusekit.sparse.sam import SamEdge, SamGraph, SamGraphError, SamNode, parse_gv, run, write_gv

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "sam_graphs"
GRAPHS = sorted(DATA.glob("*.gv")) if DATA.exists() else []

QUIRKY = r"""digraph SAM {
    comment="x=s0,b=s0,c=s0"
    5 [comment="type=fiberlookup,index=i,tensor=b,mode=0,format=compressed,src=true,root=true"
       label="FiberLookup i: b0\ncompressed" color=green4 shape=box style=filled
       type="fiberlookup" index="i" tensor="b" mode="0" format="compressed" src="true" root="true"]
    4 [comment="type=fiberlookup,index=i,tensor=c,mode=0,format=compressed,src=true,root=true"]
    4 [comment="type=fiberlookup,index=i,tensor=c,mode=0,format=compressed,src=true,root=true"]
    3 [comment="type=add,sub=0" label="Add
sum \"both\"" type="add" sub="0"]
    6 [comment="type=union,index=i" type="union" index="i"]
    2 [comment="type=arrayvals,tensor=b" type="arrayvals" tensor="b"]
    7 [comment="type=arrayvals,tensor=c" type="arrayvals"]
    1 [comment="type=fiberwrite,index=i,tensor=x,mode=0,format=compressed,sink=true"]
    0 [comment="type=fiberwrite,mode=vals,tensor=x,sink=true" type="fiberwrite"];
    5->6 [label="crd_in-b" style=dashed type="crd" comment="in-b"]
    5 -> 6 [type="ref" comment="in-b"]
    4 -> 6 [type="crd" comment="in-c"]
    4 -> 6 [type="ref" comment="in-c"]
    6 -> 1 [type="crd"]
    6 -> 2 [type="ref" comment="out-b"]
    6 -> 7 [type="ref" comment="out-c"]
    2 -> 3 [type="val"]
    7 -> 3 [type="val"]
    3 -> 0 [type="val"]
}
"""


def test_quirks_are_read() -> None:
    g = parse_gv(QUIRKY, "quirky.gv")
    assert g.formats == {"x": "s0", "b": "s0", "c": "s0"} and g.output == "x"
    assert g.nodes[4] == SamNode(
        4,
        "fiberlookup",
        {
            "index": "i",
            "tensor": "c",
            "mode": "0",
            "format": "compressed",
            "src": "true",
            "root": "true",
        },
    )
    assert g.nodes[3].attrs == {"sub": "0"}  # the label (a literal newline, \") is drawing only
    assert g.nodes[7].get("tensor") == "c"  # from the packed comment
    assert g.edges[0] == SamEdge(5, 6, "crd", "in-b") and g.edges[4] == SamEdge(6, 1, "crd", "")
    res = run(g, {"b": np.array([1.0, 0.0, 2.0]), "c": np.array([0.0, 0.0, 5.0])})
    np.testing.assert_allclose(res.output, [1.0, 0.0, 7.0])


def test_write_then_read_is_the_same_graph() -> None:
    g = parse_gv(QUIRKY)
    text = write_gv(g)
    assert text.splitlines()[1] == '    comment="x=s0,b=s0,c=s0"'
    assert parse_gv(text) == g
    odd = SamGraph(
        {"x": "none", "B": "ss10"},
        {0: SamNode(0, "fiberwrite", {"mode": "vals", "note": 'a "quoted", odd=value'})},
        (),
    )
    assert parse_gv(write_gv(odd)) == odd


@pytest.mark.skipif(not GRAPHS, reason=f"{DATA} is absent")
@pytest.mark.parametrize("path", GRAPHS, ids=[p.stem for p in GRAPHS])
def test_shared_graph_round_trips(path: Path) -> None:
    g = parse_gv(path.read_text(), str(path))
    assert parse_gv(write_gv(g)) == g


@pytest.mark.skipif(not GRAPHS, reason=f"{DATA} is absent")
def test_written_graph_runs_the_same() -> None:
    path = DATA / "mat_elemmul.gv"
    g = parse_gv(path.read_text(), str(path))
    rng = np.random.default_rng(0)
    inputs = {t: rng.random((4, 5)) * (rng.random((4, 5)) < 0.5) for t in "BC"}
    a, b = run(g, inputs), run(parse_gv(write_gv(g)), inputs)
    np.testing.assert_array_equal(a.output, b.output)
    assert a.cycles == b.cycles and a.tokens == b.tokens


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('digraph SAM {\n comment="x=s0"\n 0 [type="mul"\n}', r"line 4: expected"),
        ('digraph SAM {\n comment="x=s0"\n 0 [type="mul"]\n', "expected '}'"),
        ('graph SAM { comment="x=s0" }', "expected 'digraph'"),
        ('digraph SAM {\n 0 [type="mul"]\n}', "graph comment"),
        ('digraph SAM {\n comment="x=q7"\n}', "name=format"),
        ('digraph SAM {\n comment="x=s0"\n 0 [label="a"]\n}', "node 0: expected a 'type'"),
        ('digraph SAM {\n comment="x=s0"\n 0 [type="mul"]\n 0 -> 9 [type="val"]\n}', "node 9"),
        ('digraph SAM {\n comment="x=s0"\n a [type="mul"]\n}', "integer node id"),
        ('digraph SAM {\n comment="x=s0"\n 0 [type="mul"] @\n}', "unexpected character"),
    ],
)
def test_syntax_errors_name_the_place(text: str, match: str) -> None:
    with pytest.raises(SamGraphError, match=match) as e:
        parse_gv(text, "bad.gv")
    assert str(e.value).startswith("bad.gv") and "\n" not in str(e.value)
