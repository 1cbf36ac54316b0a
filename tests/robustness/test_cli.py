"""The ``fusekit`` command as a careless user meets it, each run in its own process.

Every bad option value, usage error or failing user file ends with exit status 2 and one line on
stderr (no traceback); every ``--json`` prints JSON and nothing else on stdout; tables fit 80
columns. Each run has a timeout, so a hang is a failure and not a stuck test session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMET_CASE = ROOT / "src" / "fusekit" / "accel" / "comet" / "examples" / "gemm_edge"


def fusekit(*args: object, timeout: float = 120, columns: int = 80) -> subprocess.CompletedProcess:
    """``python -m fusekit ARGS`` with ``COLUMNS`` set, as a user's shell would run it."""
    env = {k: v for k, v in os.environ.items() if k != "FUSEKIT_DEBUG"}
    env["COLUMNS"] = str(columns)
    return subprocess.run(
        [sys.executable, "-m", "fusekit", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def assert_one_line_error(out: subprocess.CompletedProcess, *words: str) -> str:
    """Exit status 2, one ``error: ...`` line on stderr naming ``words``, nothing on stdout."""
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr[-2000:]
    assert lines[0].startswith("error: "), lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    assert out.stdout == ""
    return lines[0]


# ---- usage errors: one line instead of typer's panel, for every subcommand ----


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["gms", "plan", "--bogus"], ["gms plan", "--bogus"]),
        (["stitch", "plan"], ["stitch plan", "model"]),
        (["hw", "show"], ["hw show", "name"]),
        (["sparse", "explore", "--top"], ["--top"]),
        (["nosuchgroup"], ["nosuchgroup"]),
        (["accel", "explore", "-M", "many"], ["-M", "integer"]),
    ],
)
def test_usage_errors_are_one_line(args, words):
    assert_one_line_error(fusekit(*args, timeout=60), *words)


# ---- option values: finite, in range, named in the one line ----


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["gms", "plan", "--scale", "inf"], "--scale"),
        (["gms", "plan", "--scale", "1e9"], "--scale"),
        (["gms", "plan", "--scale", "nan"], "--scale"),
        (["gms", "plan", "--scale", "-1"], "--scale"),
        (["gms", "plan", "--seed", "-1"], "--seed"),
        (["gms", "run", "--k", "0"], "--k"),
        (["gms", "tune", "--budget", "inf"], "--budget"),
        (["gms", "tune", "--budget", "nan"], "--budget"),
        (["gms", "tune", "--budget", "2.5"], "--budget"),
        (["gms", "tune", "--repeats", "0"], "--repeats"),
        (["gms", "explain", "--scale", "inf"], "--scale"),
        (["stitch", "plan", "bias_gelu", "--time-limit", "-1"], "--time-limit"),
        (["stitch", "plan", "bias_gelu", "--time-limit", "nan"], "--time-limit"),
        (["stitch", "plan", "bias_gelu", "--time-limit", "inf"], "--time-limit"),
        (["stitch", "bench", "bias_gelu", "--repeats", "0"], "--repeats"),
        (["accel", "explore", "--top", "-1"], "--top"),
        (["accel", "explore", "--workers", "0"], "--workers"),
        (["accel", "explore", "-K", "0"], "-K"),
        (["sparse", "explore", "--top", "-1"], "--top"),
        (["sparse", "explore", "--par-factor", "0"], "--par-factor"),
        (["sparse", "simulate", "--par-factor", "-1"], "--par-factor"),
        (["sparse", "explore", "--par-level", "-1"], "--par-level"),
        (["sparse", "simulate", "--fifo-depth", "0"], "--fifo-depth"),
    ],
)
def test_bad_option_values_are_one_line_naming_the_option(args, option):
    assert_one_line_error(fusekit(*args, timeout=60), f"'{option}'")


def test_out_of_range_par_level_is_one_line():
    out = fusekit("sparse", "simulate", "autoencoder", "--par-level", "9", "--par-factor", "2")
    assert_one_line_error(out, "'--par-level'", "autoencoder", "9")


# ---- user files: file.py:factory that does not import or whose factory raises ----

USER_FILES = {
    "syntax": ("def factory(:\n    pass\n", "SyntaxError"),
    "import": ("import fusekit_no_such_module\n\n\ndef factory():\n    pass\n", "fusekit_no_such"),
    "raises": (
        "def factory():\n    raise RuntimeError('no model here\\nsecond line')\n",
        "RuntimeError: no model here",
    ),
    "exits": ("import sys\n\nsys.exit(3)\n", "SystemExit"),
}


#: Every failure on ``ir show``; the loader is shared, so two of them on the other commands.
USER_FILE_RUNS = [("ir show", kind) for kind in USER_FILES] + [
    (command, kind)
    for command in ("stitch plan", "sparse simulate")
    for kind in ("syntax", "raises")
]


@pytest.mark.parametrize(("command", "kind"), USER_FILE_RUNS)
def test_failing_user_file_is_one_line_naming_it(tmp_path, command, kind):
    text, word = USER_FILES[kind]
    path = tmp_path / f"user_{kind}.py"
    path.write_text(text)
    line = assert_one_line_error(fusekit(*command.split(), f"{path}:factory"), str(path), word)
    if kind == "raises":  # a multi-line message is joined into the one line
        assert line.endswith("no model here / second line"), line


def test_unknown_stitch_model_lists_what_exists():
    line = assert_one_line_error(fusekit("stitch", "plan", "softmax_typo"), "softmax_typo")
    assert "layernorm_bwd" in line and "bert" in line and "file.py:factory" in line


# ---- --json: stdout parses, whatever the command printed on the way ----

VEC_MUL_GV = ROOT.parent / "shared" / "data" / "sam_graphs" / "vec_elemmul.gv"  # x = b * c


def _sam_graph(tmp: Path) -> list[str]:
    import numpy as np

    np.save(tmp / "b.npy", np.array([1.0, 0.0, 2.0, 4.0]))
    np.save(tmp / "c.npy", np.array([3.0, 5.0, 0.0, 0.5]))
    if not VEC_MUL_GV.exists():
        pytest.skip("needs ../shared/data/sam_graphs")
    return [str(VEC_MUL_GV), "--input", f"b={tmp / 'b.npy'}", "--input", f"c={tmp / 'c.npy'}"]


def _vectors(tmp: Path) -> list[str]:
    (tmp / "vectors.json").write_text("[]")
    return [str(tmp / "vectors.json")]


SLOW = pytest.mark.slow
GMS_SMALL = "--scale 0.02 --k 8 --m 8"
#: One run of every command that has --json, small sizes; the slow ones run with -m slow.
JSON_RUNS = {
    "hw list": "hw list",
    "hw show": "hw show h100",
    "hw detect": pytest.param("hw detect", marks=SLOW),
    "ir list": "ir list",
    "ir show": pytest.param("ir show rgcn", marks=SLOW),
    "gms plan": "gms plan --scale 0.02",
    "gms run": pytest.param(f"gms run {GMS_SMALL} --repeats 1", marks=SLOW),
    "gms tune": pytest.param(
        f"gms tune {GMS_SMALL} --budget 2 --repeats 1 --cache {{tmp}}/tuning.json", marks=SLOW
    ),
    "gms explain": pytest.param(
        f"gms explain {GMS_SMALL} --no-measure --cache {{tmp}}/tuning.json", marks=SLOW
    ),
    "stitch plan": "stitch plan bias_gelu",  # the HiGHS banner used to land on stdout here
    "stitch bench": pytest.param("stitch bench bias_gelu --repeats 1", marks=SLOW),
    "accel explore": "accel explore -M 64 -N 64 -K 32",
    "accel eval": f"accel eval {COMET_CASE / 'tree.yaml'}",
    "accel comet": f"accel comet {COMET_CASE}",
    "sparse simulate": pytest.param("sparse simulate autoencoder", marks=SLOW),
    "sparse explore": pytest.param("sparse explore autoencoder --top 1", marks=SLOW),
    "sparse sam": "sparse sam {sam}",
    "sparse sam-replay": "sparse sam-replay {vectors}",
}


def _expand(args: str, tmp: Path) -> list[str]:
    out: list[str] = []
    for a in args.split():
        if a == "{sam}":
            out += _sam_graph(tmp)
        elif a == "{vectors}":
            out += _vectors(tmp)
        else:
            out.append(a.replace("{tmp}", str(tmp)))
    return out


@pytest.mark.parametrize("args", list(JSON_RUNS.values()), ids=list(JSON_RUNS))
def test_json_output_parses(tmp_path, args):
    out = fusekit(*_expand(args, tmp_path), "--json", timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    json.loads(out.stdout)  # nothing but JSON on stdout (no solver banner, no log line)


def test_every_json_command_is_covered():
    """A new command with --json joins JSON_RUNS (so that its output is checked too)."""
    import typer

    from fusekit.cli import app

    def with_json(command: object, path: str) -> set[str]:
        subcommands = getattr(command, "commands", None)
        if subcommands is not None:  # a group
            return set().union(
                *(with_json(c, f"{path} {n}".strip()) for n, c in subcommands.items())
            )
        params = getattr(command, "params", [])
        return {path} if any("--json" in getattr(p, "opts", ()) for p in params) else set()

    assert with_json(typer.main.get_command(app), "") == set(JSON_RUNS)


# ---- tables: 80 columns unless --wide ----


#: Every strategy's long name, no timing.
GMS_EXPLAIN = f"gms explain {GMS_SMALL} --no-measure --cache {{tmp}}/tuning.json"
TABLE_RUNS = {
    "hw show": "hw show edge",
    "hw list": "hw list",
    "accel explore": "accel explore -M 64 -N 64 -K 32",
    "stitch plan": "stitch plan layernorm_bwd",  # one kernel of 16 ops
    "gms explain": GMS_EXPLAIN,
    "sparse fusion tables": "sparse simulate gcn-cora --cut full --table",
    "gms run": pytest.param(
        f"gms run {GMS_SMALL} --repeats 1 --strategy transform-first/G-Mseg-S", marks=SLOW
    ),
    "sparse explore": pytest.param("sparse explore gcn-cora --top 1", marks=SLOW),
}


@pytest.mark.parametrize("args", list(TABLE_RUNS.values()), ids=list(TABLE_RUNS))
def test_tables_fit_80_columns(tmp_path, args):
    out = fusekit(*_expand(args, tmp_path), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    long = [line for line in out.stdout.splitlines() if len(line) > 80]
    assert not long, "\n".join(long)
    assert "\u2026" not in out.stdout  # wrapped or folded, never cut with an ellipsis


@pytest.mark.slow
def test_wide_prints_full_names_and_the_default_a_legend(tmp_path):
    narrow = fusekit(*_expand(GMS_EXPLAIN, tmp_path), timeout=300)
    assert narrow.returncode == 0, narrow.stderr[-2000:]
    assert "tf/(GMS)seg" in narrow.stdout and "tf: transform-first" in narrow.stdout
    wide = fusekit(*_expand(GMS_EXPLAIN, tmp_path), "--wide", timeout=300)
    assert wide.returncode == 0, wide.stderr[-2000:]
    assert "transform-first/(GMS)seg" in wide.stdout and "tf/" not in wide.stdout
    assert max(len(line) for line in wide.stdout.splitlines()) > 80  # one line per row


@pytest.mark.slow
def test_stitch_plan_names_every_op_with_wide():
    narrow = fusekit("stitch", "plan", "layernorm_bwd", timeout=300)
    wide = fusekit("stitch", "plan", "layernorm_bwd", "--wide", timeout=300)
    assert narrow.returncode == wide.returncode == 0, narrow.stderr + wide.stderr
    assert "more (--wide)" in narrow.stdout and "more (--wide)" not in wide.stdout


# ---- progress and optional dependencies ----


def test_progress_count_never_shows_none():
    from rich.progress import Progress

    from fusekit.console import _Count

    with Progress(disable=True) as bar:
        task = bar.add_task("x", total=None)
        assert str(_Count().render(bar.tasks[0])) == "0"
        bar.update(task, completed=3, total=7)
        assert str(_Count().render(bar.tasks[0])) == "3/7"


def test_missing_scikit_learn_is_one_line():
    code = (
        "import sys; sys.modules['sklearn'] = None\n"
        "from fusekit.cli import main\n"
        "from fusekit.gms.selector import train_tree\n"
        "try:\n"
        "    train_tree([], cores=1)\n"
        "except ImportError as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == (
        "MissingExtra train_tree: needs the 'sklearn' package (pip install 'fusekit[train]')"
    )


def test_selection_works_without_scikit_learn():
    code = (
        "import sys; sys.modules['sklearn'] = None\n"
        "import torch\n"
        "from fusekit.gms import plan\n"
        "from fusekit.gms import workloads as W\n"
        "from fusekit.gms.features import features\n"
        "from fusekit.gms.selector import select\n"
        "from fusekit.hw import detect\n"
        "wl = W.make('rgcn', 0, 0.02)\n"
        "f = features(plan(wl.problem()), 8, 8, torch.float32, False)\n"
        "print(select(f, detect()).source)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() in ("tree", "model")


def test_missing_ray_is_one_line(tmp_path):
    code = "import sys; sys.modules['ray'] = None\nfrom fusekit.cli import main\nmain()\n"
    args = ["gms", "tune", "--executor", "ray", "--scale", "0.02", "--k", "8", "--m", "8"]
    args += ["--budget", "1", "--cache", str(tmp_path / "tuning.json")]
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )
    assert_one_line_error(out, "ray", "fusekit[distributed]")
