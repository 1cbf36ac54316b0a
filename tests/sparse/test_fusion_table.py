from fusekit.sparse.fusion_table import fusion_table, unify
from fusekit.sparse.schedule import Schedule
from fusekit.sparse.workloads import autoencoder


def test_fusion_table_unifies_and_points_at_producers() -> None:
    w = autoencoder(features=32, hidden=8)
    s = Schedule("full", (("H", "Y"),), (("H", ("b", "h", "f")), ("Y", ("b", "h", "g"))))
    rename, rows = unify(w.program, ("H", "Y"), dict(s.orders))
    assert rename["H"]["b"] == rename["Y"]["b"] and rename["H"]["h"] == rename["Y"]["h"]
    assert rows == ["b", "h", "f", "g"]  # the producer's reduction f runs under h, before g
    t = fusion_table(w.program, s)
    cell = dict(zip(t.columns, t.cells[t.rows.index("h")], strict=True))
    assert cell["Y:H"] == "-> H"
    assert dict(zip(t.columns, t.cells[t.rows.index("f")], strict=True))["H:X"] == "scan"
    assert t.cells[-1][t.columns.index("Y:out")].startswith("alu mul")
    assert "value" in t.format()
