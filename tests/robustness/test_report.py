"""Probes of the report front door: `fusekit report build` over what the benchmarks write.

Every results file under benchmarks/results/ must be read and rendered; a file that cannot be read
must cost one warning line and leave the others in the report; no table longer than the page
shows at once may be left unfolded; and the page must render in a real browser. Commands run in
a subprocess with a timeout, so that a crash or a hang is recorded as a failure.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fusekit.report.charts import collect
from fusekit.report.document import Figure
from fusekit.report.html import MAX_VISIBLE_ROWS, render
from fusekit.report.records import Plot, load_results, run_metadata, select, write_results
from fusekit.report.results import section_from_results, summary_table

ROOT = Path(__file__).resolve().parents[2]
RESULTS = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
FUSEKIT = [sys.executable, "-c", "from fusekit.cli import main; main()"]


def _writers() -> set[str]:
    """The benchmark scripts that call write_results (the names they must write under)."""
    names = set()
    for script in (ROOT / "benchmarks").glob("*.py"):
        tree = ast.parse(script.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "write_results":
                names |= {
                    kw.value.value
                    for kw in node.keywords
                    if kw.arg == "benchmark" and isinstance(kw.value, ast.Constant)
                }
    return names


def _run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FUSEKIT, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def _visible_rows(page: str) -> list[int]:
    """Rows of each table the reader sees without opening a <details>."""
    shown = re.sub(r"<details>.*?</details>", "", page, flags=re.S)
    return [t.count("<tr>") - 1 for t in re.findall(r"<table>.*?</table>", shown, flags=re.S)]


def _small_results(path: Path) -> Path:
    records = [{"case": c, "ratio": r} for c, r in (("a", 2.0), ("b", 0.5))]
    return write_results(
        path,
        benchmark="probe",
        title="A small valid results file.",
        meta=run_metadata(),
        plots=[Plot(title="ratio per case", x="case", y="ratio")],
        records=records,
    )


def test_every_benchmark_has_a_results_file():
    writers = _writers()
    assert len(writers) >= 10  # the scripts' write_results calls were found
    written = {load_results(p).benchmark for p in RESULTS}
    assert writers <= written, f"no results file from {writers - written}"


@pytest.mark.parametrize("path", RESULTS, ids=[p.name for p in RESULTS])
def test_every_results_file_is_read_and_every_view_applies(path):
    results = load_results(path)
    assert results.records, path
    for plot in results.plots:
        chosen = select(results.records, plot.where)
        xs, series, _ = collect(plot.title, chosen, plot.x, plot.ys, plot.hues, plot.stat)
        assert xs and series
    for spec in results.tables:
        table = summary_table(spec, results.records)
        assert table.rows and len(table.rows) <= MAX_VISIBLE_ROWS, spec.title


def test_the_report_of_every_file_folds_long_tables(monkeypatch):
    """The whole report's HTML, with blank figures (drawing is what the slow test adds)."""
    import fusekit.report.results as results_module

    def blank(title: str, *args: object, **kwargs: object) -> Figure:
        return Figure(title=title, png=b"")

    monkeypatch.setattr(results_module, "bar_chart", blank)
    monkeypatch.setattr(results_module, "line_chart", blank)
    sections = [section_from_results(load_results(p), p) for p in RESULTS]
    page = render(sections, title="t")
    rows = _visible_rows(page)
    assert rows and max(rows) <= MAX_VISIBLE_ROWS
    assert page.count("<details>") >= len(RESULTS)  # every file's records, folded
    for path in RESULTS:
        assert f"({path.name})</h2>" in page


@pytest.mark.slow
def test_report_build_over_every_results_file(tmp_path):
    """The README's command, as written, over every file the benchmarks write."""
    done = _run(["report", "build", *map(str, RESULTS), "--out", str(tmp_path)], timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == ""
    page = (tmp_path / "index.html").read_text()
    for path in RESULTS:
        results = load_results(path)
        assert f"{results.benchmark} ({path.name})" in page
    plots = sum(len(load_results(p).plots) for p in RESULTS)
    assert page.count("data:image/png;base64,") == plots
    assert max(_visible_rows(page)) <= MAX_VISIBLE_ROWS


BAD_FILES = {
    "corrupt.json": b'{"schema": "fusekit-results/1", "records": [',
    "legacy.json": json.dumps({"meta": {}, "records": [{"a": 1}]}).encode(),
    "unknown.json": json.dumps({"hello": "world"}).encode(),
    "binary.json": bytes(range(256)),
    "nan.json": b'{"schema": "fusekit-results/1", "x": NaN}',
    "deep.json": b"[" * 100_000 + b"]" * 100_000,
}


def test_unreadable_files_give_one_warning_each_and_the_rest_builds(tmp_path):
    good = _small_results(tmp_path / "good.json")
    bad = []
    for name, content in BAD_FILES.items():
        bad.append(tmp_path / name)
        bad[-1].write_bytes(content)
    bad.append(tmp_path / "missing.json")
    files = [*bad[:3], good, *bad[3:]]
    done = _run(["report", "build", *map(str, files), "--out", str(tmp_path / "out")])
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == len(bad), done.stderr
    for line, path in zip(lines, bad, strict=True):
        assert line.startswith(f"warning: {path}: ") and line.endswith("; skipped"), line
        assert len(line) < 300
    page = (tmp_path / "out" / "index.html").read_text()
    assert "probe (good.json)" in page and page.count("<h2>") == 1


def test_no_readable_file_is_one_error_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{oops")
    done = _run(["report", "build", str(path), "--out", str(tmp_path / "out")])
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: report build: none of the 1")
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out" / "index.html").exists()


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (apt-get install)")
def test_screenshot_script_renders_a_report(tmp_path):
    out = tmp_path / "out"
    built = _run(["report", "build", str(_small_results(tmp_path / "r.json")), "--out", str(out)])
    assert built.returncode == 0, built.stderr
    png = tmp_path / "page.png"
    script = ROOT / "tools" / "screenshot.py"
    done = subprocess.run(
        [sys.executable, str(script), str(out / "index.html"), str(png), "--height", "900"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    import matplotlib.image as mpimg

    image = mpimg.imread(png)
    assert image.shape[:2] == (900, 1280)
    dark = (image[..., :3] < 0.5).any(axis=-1).mean()
    assert 0.001 < dark < 0.5  # text and a chart drawn, not a blank or black page
