import re

import pytest

from fusekit.report import Figure, Section, Table, Text, render, write_report
from fusekit.report.charts import bar_chart, line_chart

RECORDS = [
    {"shape": "rgcn", "dataflow": "G-Mseg-S", "median_s": 0.012, "ratio": 1.0},
    {"shape": "rgcn", "dataflow": "(GMS)seg", "median_s": 0.004, "ratio": 3.0},
    {"shape": "moe", "dataflow": "G-Mseg-S", "median_s": 0.020, "ratio": 1.0},
    {"shape": "moe", "dataflow": "(GMS)seg", "median_s": 0.010, "ratio": 2.0},
]


def test_table_from_records_keeps_order_and_fills_gaps():
    table = Table.from_records("t", [{"a": 1, "b": 2}, {"b": 3, "c": 4}])
    assert table.columns == ("a", "b", "c")
    assert table.rows == ((1, 2, ""), ("", 3, 4))


def test_table_rejects_ragged_rows():
    with pytest.raises(ValueError, match="expected row 1 to have 2 cells"):
        Table("t", ("a", "b"), ((1, 2), (3,)))


def test_render_is_self_contained_and_escaped():
    figure = bar_chart("speed", RECORDS, x="shape", y="ratio", hue="dataflow")
    assert figure.png.startswith(b"\x89PNG")
    section = Section(
        title="gms <kernels>",
        summary="a & b",
        blocks=(Text("x < y"), Table.from_records("runs", RECORDS), figure),
    )
    page = render([section], title="report")
    assert "gms &lt;kernels&gt;" in page and "a &amp; b" in page and "x &lt; y" in page
    assert page.count("data:image/png;base64,") == 1
    # nothing is fetched from elsewhere: no http(s) sources, no external stylesheets
    assert not re.search(r"(src|href)=\"(https?:)?//", page)
    assert page.count("<tr>") == 1 + len(RECORDS)
    assert '<td class="num">0.012</td>' in page


def test_write_report(tmp_path):
    path = write_report([Section("s", "", (Text("hello"),))], tmp_path / "out")
    assert path == tmp_path / "out" / "index.html"
    assert "hello" in path.read_text()
    assert path.stat().st_mode & 0o044 == 0o044  # readable by others


def test_bar_chart_rejects_missing_columns():
    with pytest.raises(ValueError, match="expected a record with a numeric 'speed'"):
        bar_chart("t", RECORDS, x="shape", y="speed")
    with pytest.raises(ValueError, match="expected record 0 to have 'size'"):
        bar_chart("t", RECORDS, x="size", y="ratio")
    with pytest.raises(ValueError, match="'dataflow' to be a number or null"):
        bar_chart("t", RECORDS, x="shape", y="dataflow")


def test_charts_leave_series_without_points_out_of_the_legend():
    records = [*RECORDS, {"shape": "moe", "dataflow": "empty", "ratio": None}]
    for draw in (bar_chart, line_chart):
        figure = draw(
            "t",
            [{**r, "n": i} for i, r in enumerate(records)],
            x="n" if draw is line_chart else "shape",
            y="ratio",
            hue="dataflow",
        )
        assert figure.png.startswith(b"\x89PNG")
    from fusekit.report.charts import collect

    _, series, _ = collect("t", records, "shape", ("ratio",), ("dataflow",))
    assert list(series) == ["G-Mseg-S", "(GMS)seg"]  # "empty" has no point


def test_long_tables_fold_and_cells_read_well():
    table = Table("long", ("n", "x"), tuple((i, None) for i in range(40)))
    page = render([Section("s", "", (table, Table("short", ("a",), ((12345.6,), ([1, 2],)))))],
                  title="t")  # fmt: skip
    assert "<details><summary>long (40 rows)</summary>" in page
    assert ">12,346<" in page and ">1, 2<" in page and ">\u2013<" in page


def test_unknown_block_type():
    with pytest.raises(TypeError, match="expected 'block'"):
        render([Section("s", "", ("raw string",))], title="t")  # type: ignore[arg-type]


def test_figure_from_matplotlib():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    figure = Figure.from_matplotlib("line", fig, caption="c")
    assert figure.png.startswith(b"\x89PNG")
    assert not plt.get_fignums()  # closed
