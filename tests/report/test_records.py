import json

import pytest
from typer.testing import CliRunner

from fusekit.errors import ConfigError
from fusekit.report.commands import app
from fusekit.report.records import (
    Plot,
    Summary,
    load_results,
    run_metadata,
    shown,
    write_results,
)
from fusekit.report.results import section_from_results, summary_table

RECORDS = [
    {"case": "a", "impl": "x", "ratio": 2.0, "ok": True},
    {"case": "a", "impl": "y", "ratio": 1.0, "ok": False},
    {"case": "b", "impl": "x", "ratio": 0.5, "ok": True},
]


def _write(path, records=RECORDS, **views):
    return write_results(
        path, benchmark="bench", title="A test benchmark.", meta=run_metadata(),
        records=records, **views,
    )  # fmt: skip


def test_write_and_load_round_trip(tmp_path):
    plots = [Plot(title="ratio", x="case", y="ratio", hue="impl", ref=1.0)]
    path = _write(tmp_path / "r" / "bench.json", plots=plots, settings={"seed": 3})
    results = load_results(path)
    assert results.records == RECORDS and results.plots == plots
    assert results.meta.fusekit and results.meta.commit and results.settings == {"seed": 3}
    section = section_from_results(results, path)
    kinds = [type(b).__name__ for b in section.blocks]
    assert kinds == ["Text", "Figure", "Table", "Table"]
    assert section.title == "bench (bench.json)" and "Ran on" in section.blocks[0].body


def test_a_partial_run_keeps_only_the_views_it_has_records_for(tmp_path):
    plots = [
        Plot(title="a", x="impl", y="ratio", where={"case": "a"}),
        Plot(title="c", x="impl", y="ratio", where={"case": "c"}),
    ]
    tables = [Summary(title="t", rows=["impl"], values=["ratio"], where={"case": ["b", "c"]})]
    with pytest.raises(ConfigError, match="selects no record"):
        _write(tmp_path / "all.json", plots=plots)
    assert [p.title for p in shown(plots, RECORDS)] == ["a"]
    assert shown(tables, RECORDS) == tables
    results = load_results(_write(tmp_path / "part.json", plots=shown(plots, RECORDS)))
    assert [p.title for p in results.plots] == ["a"]


def test_summary_table_groups_and_pivots():
    by_case = summary_table(Summary(title="t", rows=["case"], values=["ratio", "ok"]), RECORDS)
    assert by_case.columns == ("case", "records", "ratio", "ok")
    assert by_case.rows == (("a", 2, 1.5, "1 of 2"), ("b", 1, 0.5, "1 of 1"))
    pivot = summary_table(
        Summary(title="t", rows=["case"], values=["ratio"], across="impl"), RECORDS
    )
    assert pivot.columns == ("case", "impl=x", "impl=y")
    assert pivot.rows == (("a", 2.0, 1.0), ("b", 0.5, None))


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{oops", "not valid JSON"),
        ('{"a": NaN}', "not valid JSON: NaN"),
        ("[1]", "expected a JSON object"),
        ('{"meta": {}, "records": []}', "schema: expected 'fusekit-results/1'"),
    ],
)
def test_bad_results_files(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=match):
        load_results(path)


def _blob(tmp_path, **changes):
    blob = json.loads(_write(tmp_path / "good.json").read_text())
    blob.update(changes)
    path = tmp_path / "changed.json"
    path.write_text(json.dumps(blob))
    return path


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"records": 3}, "records: Input should be a valid list"),
        ({"records": [{"a": {"b": 1}}]}, r"records\[0\]\.a"),
        ({"extra": 1}, "extra: Extra inputs are not permitted"),
        ({"plots": [{"title": "t", "x": "case", "y": "nope"}]}, r"plots\[0\]\.y: no record"),
        ({"plots": [{"title": "t", "x": "case", "y": "case"}]}, "a number under 'case'"),
        ({"tables": [{"title": "t", "rows": ["zz"], "values": ["ratio"]}]}, r"tables\[0\]\.rows"),
        ({"tables": [{"title": "t", "rows": ["case"], "values": ["ratio"],
                      "where": {"case": "c"}}]}, "selects no record"),
    ],
)  # fmt: skip
def test_schema_problems_name_the_field(tmp_path, changes, match):
    with pytest.raises(ConfigError, match=match) as e:
        load_results(_blob(tmp_path, **changes))
    assert str(e.value).startswith(str(tmp_path / "changed.json")) and "\n" not in str(e.value)


def test_write_refuses_what_it_could_not_read_back(tmp_path):
    with pytest.raises(ConfigError, match="expected a finite number"):
        _write(tmp_path / "nan.json", records=[{"case": "a", "ratio": float("nan")}])
    assert not (tmp_path / "nan.json").exists()


def test_report_build_command(tmp_path):
    path = _write(tmp_path / "bench.json", plots=[Plot(title="r", x="case", y="ratio")])
    result = CliRunner().invoke(app, ["build", str(path), "--out", str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "rep" / "index.html").read_text()
    assert "bench" in page and "data:image/png;base64," in page
