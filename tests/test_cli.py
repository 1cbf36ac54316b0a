import subprocess
import sys

from typer.testing import CliRunner

from fusekit import __version__
from fusekit.cli import GROUPS, app


def test_help_lists_the_groups_that_exist():
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("hw", "tour", "report", "version"):
        assert command in result.output


def test_groups_are_in_the_declared_list():
    mounted = {group.name for group in app.registered_groups}
    assert mounted <= set(GROUPS)
    assert {"hw", "report"} <= mounted


def test_version_through_the_script_entry():
    out = subprocess.run(
        [sys.executable, "-m", "fusekit", "version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == __version__


def test_tour_command(tmp_path):
    # one part: the whole tour is tests/report/test_tour.py's (in process, every section)
    out = subprocess.run(
        [sys.executable, "-m", "fusekit", "tour", "--out", str(tmp_path), "--only", "hw"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert f"report written to {tmp_path / 'index.html'}" in out.stdout
    page = (tmp_path / "index.html").read_text()
    assert "<h2>Hardware</h2>" in page and "<h2>Stitched kernels" not in page


def test_tour_of_an_unknown_part_is_one_line(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "fusekit", "tour", "--out", str(tmp_path), "--only", "nope"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2, out.stderr
    assert "expected 'parts' to be among" in out.stderr and "nope" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
