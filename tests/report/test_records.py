import json

import pytest
from typer.testing import CliRunner

from fusekit.errors import ConfigError
from fusekit.report.commands import app
from fusekit.report.records import load_results, run_metadata, section_from_results, write_results


def test_write_and_load_round_trip(tmp_path):
    meta = {**run_metadata(), "plot": {"x": "case", "y": "ratio"}}
    records = [{"case": "a", "ratio": 2.0}, {"case": "b", "ratio": 0.5}]
    path = write_results(tmp_path / "r" / "bench.json", records, meta)
    loaded_meta, loaded = load_results(path)
    assert loaded == records
    assert loaded_meta["fusekit"] == meta["fusekit"] and "commit" in loaded_meta
    section = section_from_results("bench", loaded_meta, loaded)
    kinds = [type(b).__name__ for b in section.blocks]
    assert kinds == ["Text", "Figure", "Table"]


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{oops", "not valid JSON"),
        ('{"records": 3}', "expected a list of records"),
        ('{"records": [1]}', "every record to be a JSON object"),
        ('{"records": [], "meta": []}', "meta: expected an object"),
    ],
)
def test_bad_results_files(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=match):
        load_results(path)


def test_report_build_command(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(
        json.dumps(
            {"meta": {"plot": {"x": "case", "y": "t"}}, "records": [{"case": "a", "t": 1.0}]}
        )
    )
    result = CliRunner().invoke(app, ["build", str(path), "--out", str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "rep" / "index.html").read_text()
    assert "bench" in page and "data:image/png;base64," in page
