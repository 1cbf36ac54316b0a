"""Hostile and careless user files: every one fails fast, as one line naming the file.

The loaders of hardware descriptions (``fusekit hw show``, ``fusekit accel explore --hw``),
COMET runs and fusekit's tree form (``fusekit accel explore --template``, ``eval``, ``comet``)
all read through :mod:`fusekit.files`. Alias bombs, deep nesting and recursive aliases
run the real command in a subprocess with a timeout, so that a hang or a crash is a failure and
not a stuck test session; the subprocess reports how long the command itself took.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
from importlib import resources
from pathlib import Path

import pytest

from fusekit.accel.comet import CometInputError
from fusekit.accel.comet import evaluate as comet_evaluate
from fusekit.cli import main
from fusekit.errors import ConfigError
from fusekit.files import (
    MAX_ALIAS_NODES,
    MAX_DEPTH,
    clip,
    load_json,
    load_yaml,
    load_yaml_mapping,
    parse_json,
    parse_yaml,
    read_text,
    short,
)
from fusekit.hw import load_file

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "src" / "fusekit" / "accel" / "comet" / "examples"
PRESETS = resources.files("fusekit.hw") / "presets"

#: The longest error line accepted (the issue saw a 2.8 MB one).
MAX_LINE = 300


def bomb(levels: int, width: int = 10) -> str:
    """A "billion laughs" document: ``width**levels`` leaves from ``levels`` short lines."""
    lines = [f"a0: &a0 [{', '.join(['lol'] * width)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join([*lines, f"kind: *a{levels - 1}", ""])


BAD_YAML = {
    "billion_laughs": bomb(9),
    "small_bomb": bomb(5),
    "deep_nesting": "kind: " + "[" * 5000 + "]" * 5000 + "\n",
    "recursive_alias": "kind: &a [1, *a]\n",
    "recursive_mapping": "kind: &a {x: *a}\n",
}
PROBLEMS = {
    "billion_laughs": "aliases expand",
    "small_bomb": "aliases expand",
    "deep_nesting": f"nested deeper than {MAX_DEPTH} levels",
    "recursive_alias": "recursive alias",
    "recursive_mapping": "recursive alias",
}


def run_cli(args: list[str], timeout: float = 30) -> tuple[int, str, float]:
    """``fusekit ARGS`` in a fresh interpreter: exit status, stderr, seconds inside ``main``.

    The time excludes starting Python and importing ``fusekit.cli``.
    """
    code = textwrap.dedent(
        f"""
        import sys, time
        from fusekit.cli import main
        start = time.perf_counter()
        try:
            main({args!r})
            status = 0
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else 1
        print(f"{{time.perf_counter() - start:.3f}}")
        sys.exit(status)
        """
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"fusekit {' '.join(args)} did not exit within {timeout} s")
    assert out.stdout.strip(), (out.returncode, out.stderr[-2000:])  # killed before printing
    return out.returncode, out.stderr, float(out.stdout.strip().splitlines()[-1])


def assert_one_line(status: int, stderr: str, name: Path | str, *words: str) -> str:
    """Exit status 2 and one short ``error:`` line naming the file and ``words``."""
    assert status == 2, (status, stderr[-2000:])
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr[-2000:]
    line = lines[0]
    assert line.startswith("error: ") and str(name) in line, line
    assert len(line) < MAX_LINE, f"{len(line)} characters: {line[:400]}"
    for word in words:
        assert word in line, line
    return line


def cli_in_process(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``fusekit ARGS`` in this process (files that cannot hang it): exit status and stderr."""
    with pytest.raises(SystemExit) as info:
        main(args)
    code = info.value.code
    return code if isinstance(code, int) else 1, capsys.readouterr().err


def comet_dir(tmp_path: Path, part: str, text: str) -> Path:
    """A copy of a shipped COMET run whose ``part``.yaml is ``text``."""
    case = tmp_path / "case"
    shutil.copytree(EXAMPLES / "gemm_edge", case)
    (case / f"{part}.yaml").write_text(text)
    return case


# ---- crash-type files through every command that reads a user file (subprocess, timeout) ----


def commands(tmp_path: Path, text: str) -> dict[str, tuple[list[str], Path]]:
    """The commands that read a user YAML file, each given ``text`` as that file."""
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    case = comet_dir(tmp_path, "mapping", text)
    return {
        "hw show": (["hw", "show", str(f)], f),
        "accel explore": (["accel", "explore", "--template", str(case)], case / "mapping.yaml"),
        "accel explore --hw": (["accel", "explore", "gemm", "--hw", str(f)], f),
        "accel eval": (["accel", "eval", str(f)], f),
        "accel comet tree": (["accel", "comet", str(f)], f),
        "accel comet run": (["accel", "comet", str(case)], case / "mapping.yaml"),
    }


@pytest.mark.parametrize(
    "command",
    [
        "hw show",
        "accel explore",
        "accel explore --hw",
        "accel eval",
        "accel comet tree",
        "accel comet run",
    ],
)
def test_billion_laughs_fails_fast_in_every_command(tmp_path, command):
    args, named = commands(tmp_path, BAD_YAML["billion_laughs"])[command]
    status, stderr, elapsed_s = run_cli(args, timeout=10)
    assert_one_line(status, stderr, named, "aliases expand")
    assert elapsed_s < 2, f"{command}: {elapsed_s:.2f} s"


@pytest.mark.parametrize("case", ["small_bomb", "deep_nesting", "recursive_alias"])
@pytest.mark.parametrize("command", ["hw show", "accel comet run"])
def test_crash_type_files_fail_fast(tmp_path, case, command):
    args, named = commands(tmp_path, BAD_YAML[case])[command]
    status, stderr, elapsed_s = run_cli(args, timeout=10)
    assert_one_line(status, stderr, named, PROBLEMS[case])
    assert elapsed_s < 2, f"{command}: {elapsed_s:.2f} s"


# ---- hardware files: numbers, keys, bytes (in process: these cannot hang) ----


def preset(name: str) -> str:
    return (PRESETS / f"{name}.yaml").read_text()


def edited(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


HW_CASES = [
    # (preset, old, new, words in the error line)
    ("h100", "mem_bw_bytes_per_s: 3.35 TB/s", "mem_bw_bytes_per_s: .inf", ["non-finite", "line"]),
    ("h100", "mem_bw_bytes_per_s: 3.35 TB/s", "mem_bw_bytes_per_s: .nan", ["non-finite"]),
    ("h100", "clock_hz: 1.98e9", "clock_hz: .inf", ["non-finite"]),
    ("h100", "clock_hz: 1.98e9", "clock_hz: 1.0e+400", ["non-finite"]),
    ("h100", "3.35 TB/s", "1e400 TB/s", ["mem_bw_bytes_per_s", "finite"]),
    ("h100", "3.35 TB/s", "18 EB/s", ["mem_bw_bytes_per_s"]),
    ("h100", "mem_bytes: 80 GB", "mem_bytes: 18000000000 TB", ["mem_bytes", "2**63"]),
    ("h100", "mem_bytes: 80 GB", "mem_bytes: 1e400 GB", ["mem_bytes", "finite"]),
    ("h100", "mem_bytes: 80 GB", "mem_bytes: 99999999999999999999999", ["64-bit"]),
    ("h100", "sm_count: 132", "sm_count: -132", ["sm_count", "greater than 0"]),
    ("h100", "clock_hz: 1.98e9", "clock_hz: -1.98e9", ["clock_hz", "greater than 0"]),
    ("h100", "fp32: 67.0e12", "fp32: 0", ["peak_flops_per_s.fp32"]),
    ("h100", "warp_size: 32", "warp_size: 32\ncolour: red", ["colour", "unknown field"]),
    ("edge", "clock_hz: 1.0e9", "clock_hz: 1.0e9\nword_bytes: 8", ["word_bytes", "unknown field"]),
    ("edge", "clock_hz: 1.0e9", "clock_hz: .inf", ["non-finite"]),
    ("edge", "meshX: 2,", "meshX: 0,", ["comet_arch", "'meshX'"]),
    ("edge", "bw: 25,", "bw: .nan,", ["non-finite"]),
    ("edge", "bw: 25,", "bw: -25,", ["comet_arch", "'bw'"]),
    ("edge", "type: GBuffer", "type: Nope", ["comet_arch", "unknown spec"]),
]


@pytest.mark.parametrize(("name", "old", "new", "words"), HW_CASES)
def test_bad_hardware_numbers_and_keys(tmp_path, capsys, name, old, new, words):
    f = tmp_path / "hw.yaml"
    f.write_text(edited(preset(name), old, new))
    with pytest.raises(ConfigError) as info:
        load_file(f)
    assert "\n" not in str(info.value) and len(str(info.value)) < MAX_LINE
    assert_one_line(*cli_in_process(["hw", "show", str(f)], capsys), f, *words)


def test_bad_hardware_names_only_the_first_problems(tmp_path, capsys):
    f = tmp_path / "hw.yaml"
    f.write_text("kind: gpu\n" + "".join(f"k{i}: {i}\n" for i in range(2000)))
    line = assert_one_line(*cli_in_process(["hw", "show", str(f)], capsys), f, "more")
    assert line.count(";") <= 6


BYTES_CASES = {
    "binary_garbage": (bytes(range(256)) * 8, "not UTF-8"),
    "empty": (b"", "empty file"),
    "only_a_comment": (b"# nothing here\n", "empty file"),
    "a_list": (b"- kind: gpu\n- name: x\n", "expected a mapping at top level (got list)"),
    "a_scalar": (b"42\n", "expected a mapping at top level (got int)"),
    "two_documents": (b"kind: gpu\n---\nkind: cpu\n", "not valid YAML"),
    "python_object": (b"kind: !!python/object/apply:os.system [ls]\n", "not valid YAML"),
    "duplicate_key": (b"kind: gpu\nkind: cpu\n", "duplicate key 'kind'"),
}


@pytest.mark.parametrize("case", sorted(BYTES_CASES))
@pytest.mark.parametrize(
    "command", ["hw show", "accel explore --hw", "accel eval", "accel comet tree"]
)
def test_unreadable_files_are_one_line(tmp_path, capsys, case, command):
    data, words = BYTES_CASES[case]
    f = tmp_path / "bad.yaml"
    f.write_bytes(data)
    args = {
        "hw show": ["hw", "show"],
        "accel explore --hw": ["accel", "explore", "gemm", "--hw"],
        "accel eval": ["accel", "eval"],
        "accel comet tree": ["accel", "comet"],
    }[command]
    assert_one_line(*cli_in_process([*args, str(f)], capsys), f, words)


@pytest.mark.parametrize("case", ["binary_garbage", "empty", "a_list", "duplicate_key"])
def test_unreadable_comet_file_is_one_line(tmp_path, capsys, case):
    data, words = BYTES_CASES[case]
    case_dir = tmp_path / "case"
    shutil.copytree(EXAMPLES / "gemm_edge", case_dir)
    (case_dir / "arch.yaml").write_bytes(data)
    status, stderr = cli_in_process(["accel", "comet", str(case_dir)], capsys)
    assert_one_line(status, stderr, case_dir / "arch.yaml", words.split(" (")[0])


# ---- accel files: unknown keys (top level and nested) and numbers ----


def tree_doc() -> dict:
    return load_yaml(EXAMPLES / "gemm_edge" / "tree.yaml")


def _first_tile_tensor(doc: dict) -> dict:
    assert "tile" in doc["tree"]
    return doc["tree"]["tensors"][0]


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda d: d.update(colour=1), ["unknown key 'colour'"]),
        (lambda d: d["tree"].update(colour=1), ["tree", "unknown key 'colour'"]),
        (lambda d: d["chain"].update(colour=1), ["chain", "unknown key"]),
        (lambda d: next(iter(d["hierarchy"].values())).update(colour=1), ["hierarchy"]),
        (lambda d: _first_tile_tensor(d).update(colour=1), ["tensors[0]", "unknown key"]),
        (lambda d: d["chain"]["dims"].update(M=0), ["chain.dims", "'M'", ">= 1"]),
        (lambda d: d["chain"]["dims"].update(M=-8), ["chain.dims", ">= 1"]),
        (lambda d: next(iter(d["hierarchy"].values()))["attrs"].update(bw=0), ["'bw'"]),
        (lambda d: _first_tile_tensor(d).update(bits=1.5), ["'bits'"]),
    ],
)
def test_bad_tree_form_files(tmp_path, capsys, edit, words):
    doc = tree_doc()
    edit(doc)
    f = tmp_path / "tree.yaml"
    f.write_text(json.dumps(doc))
    with pytest.raises(CometInputError):
        comet_evaluate(f)
    assert_one_line(*cli_in_process(["accel", "comet", str(f)], capsys), f, *words)


@pytest.mark.parametrize(
    ("part", "old", "new", "words"),
    [
        ("arch", "bw: 25,", "bw: 0,", ["arch.yaml", "'bw'", ">= 1"]),
        ("arch", "bw: 25,", "bw: -25,", ["arch.yaml", "'bw'", ">= 1"]),
        ("arch", "bw: 25,", "bw: abc,", ["arch.yaml", "'bw'"]),
        ("arch", "meshX: 2,", "meshX: 0,", ["arch.yaml", "'meshX'"]),
        ("arch", "parent_read_energy: 800,", "parent_read_energy: -800,", ["arch.yaml", "energy"]),
        ("arch", "bw: 25,", "bw: .inf,", ["arch.yaml", "non-finite"]),
        ("arch", "Hierarchy:", "Colour: red\nHierarchy:", ["arch.yaml", "unknown key 'Colour'"]),
        ("constants", "  N: 1024", "  N: 0", ["problem.yaml", "'constant N'", ">= 1"]),
        ("constants", "  N: 1024", "  N: 1.5", ["problem.yaml", "'constant N'", "integer"]),
        ("constants", "const:", "colour: red\nconst:", ["constants.yaml", "unknown key"]),
        ("mapping", "node_type: DataMovement_Tile", "node_type: DataMovement_Tile\n  colour: 1",
         ["mapping.yaml", "unknown key 'colour'"]),
        ("problem", "  operations:", "  colour: red\n  operations:",
         ["problem.yaml", "unknown key"]),
    ],
)  # fmt: skip
def test_bad_comet_runs(tmp_path, capsys, part, old, new, words):
    src = (EXAMPLES / "gemm_edge" / f"{part}.yaml").read_text()
    case = comet_dir(tmp_path, part, edited(src, old, new))
    with pytest.raises((CometInputError, ConfigError)):
        comet_evaluate(case)
    assert_one_line(*cli_in_process(["accel", "comet", str(case)], capsys), case, *words)


def test_shipped_files_still_load():
    """Every preset and COMET example passes the bounds (aliases, depth, numbers, keys)."""
    for f in sorted(Path(str(PRESETS)).glob("*.yaml")):
        assert load_file(f).name
    for d in sorted(p for p in EXAMPLES.iterdir() if p.is_dir()):
        assert comet_evaluate(d)["total_cycles"] == comet_evaluate(d / "tree.yaml")["total_cycles"]


# ---- fusekit.files itself ----


def test_short_and_clip_cut_long_text():
    assert short("abc") == "'abc'"
    long = short("x" * 1000)
    assert len(long) == 80 and long.endswith("...")
    assert clip("a\n b  " * 100).count("\n") == 0 and len(clip("a\n b  " * 100)) == 160


def test_read_text(tmp_path):
    f = tmp_path / "f.txt"
    f.write_text("héllo")
    assert read_text(f) == "héllo"
    with pytest.raises(ConfigError, match=r"f\.txt: larger than the limit of 3 bytes"):
        read_text(f, max_bytes=3)
    with pytest.raises(ConfigError, match=r"missing\.yaml: cannot read file"):
        read_text(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="cannot read file"):
        read_text(tmp_path)
    f.write_bytes(b"ok\xff\xfe")
    with pytest.raises(ConfigError, match=r"f\.txt: not UTF-8 text \(byte 0xff at offset 2\)"):
        read_text(f)


def test_a_billion_laughs_is_refused_before_it_is_expanded():
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"^b\.yaml: aliases expand to [\d,]+ more nodes"):
        parse_yaml(bomb(9), "b.yaml")
    assert time.perf_counter() - start < 1


def test_aliases_within_the_limit_are_shared_as_written():
    data = parse_yaml("a: &x {k: [1, 2]}\nb: *x\nc: {<<: *x, j: 3}\n", "a.yaml")
    assert data == {"a": {"k": [1, 2]}, "b": {"k": [1, 2]}, "c": {"k": [1, 2], "j": 3}}
    width = 10
    fits = f"a: &a [{', '.join(['1'] * (MAX_ALIAS_NODES // width - 1))}]\n"
    fits += f"b: [{', '.join(['*a'] * (width - 1))}]\n"
    assert len(parse_yaml(fits, "a.yaml")["b"]) == width - 1
    with pytest.raises(ConfigError, match="aliases expand"):
        parse_yaml(fits.replace("b: [", "b: [*a, *a, "), "a.yaml")
    assert parse_yaml("a: &x 1\nb: *x\n", "a.yaml") == {"a": 1, "b": 1}


def test_nesting_is_bounded_while_composing_and_after_aliases():
    ok = "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)
    assert parse_yaml(f"a: {ok}", "n.yaml") is not None  # the mapping is one more level
    with pytest.raises(ConfigError, match=rf"n\.yaml: nested deeper than {MAX_DEPTH} levels"):
        parse_yaml(f"a: [{ok}]", "n.yaml")
    with pytest.raises(ConfigError, match="nested deeper"):
        parse_yaml("[" * 100_000 + "]" * 100_000, "n.yaml")
    chain = "a0: &a0 " + "[" * 30 + "1" + "]" * 30 + "\n"
    chain += "".join(f"a{i}: &a{i} " + "[" * 30 + f"*a{i - 1}" + "]" * 30 + "\n" for i in (1, 2))
    with pytest.raises(ConfigError, match="nested deeper"):
        parse_yaml(chain, "n.yaml")


@pytest.mark.parametrize(
    "text", ["a: &a [*a]", "a: &a {b: *a}", "a: &a [1, [2, *a]]", "&a [*a]", "&a {*a : 1}"]
)
def test_recursive_aliases_are_refused(text):
    with pytest.raises(ConfigError, match=r"r\.yaml: recursive alias .* at line 1"):
        parse_yaml(text, "r.yaml")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("a: .inf", "non-finite number '.inf' at line 1, column 4"),
        ("a: -.Inf", "non-finite number"),
        ("a: .NaN", "non-finite number"),
        ("a: 1.0e+999", "non-finite number"),
        ("a: 9223372036854775808", "integer out of the 64-bit range"),
        ("a: -9223372036854775809", "integer out of the 64-bit range"),
        ("a: " + "9" * 5000, "integer out of the 64-bit range"),
        ("a: 1\nb: 2\na: 3", "duplicate key 'a' at line 3"),
        ("a: [unclosed", r"not valid YAML: .* at line 1"),
        ("a: !!python/name:os.system x", "not valid YAML"),
        ("a: 2024-13-45", "not valid YAML"),
        ("a: 1\n---\nb: 2", "not valid YAML"),
    ],
)
def test_yaml_problems_are_one_line(text, match):
    with pytest.raises(ConfigError, match=match) as info:
        parse_yaml(text, "y.yaml")
    message = str(info.value)
    assert message.startswith("y.yaml: ") and "\n" not in message and len(message) < MAX_LINE


def test_yaml_values_in_range_are_kept():
    data = parse_yaml("a: 9223372036854775807\nb: -1.5e+300\nc: 0x10\nd: 1e400\n", "y.yaml")
    assert data == {"a": 2**63 - 1, "b": -1.5e300, "c": 16, "d": "1e400"}
    assert parse_yaml("", "y.yaml") is None
    assert parse_yaml("# only a comment\n", "y.yaml") is None


def test_load_yaml_mapping(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("")
    with pytest.raises(ConfigError, match=r"m\.yaml: empty file"):
        load_yaml_mapping(f)
    f.write_text("- 1\n")
    with pytest.raises(ConfigError, match=r"m\.yaml: expected a mapping at top level \(got list"):
        load_yaml_mapping(f)
    f.write_text("a: 1\n")
    assert load_yaml_mapping(f) == {"a": 1}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"a": NaN}', "non-finite number NaN"),
        ('{"a": -Infinity}', "non-finite number -Infinity"),
        ('{"a": 1e400}', "non-finite number"),
        ('{"a": 99999999999999999999}', "integer out of the 64-bit range"),
        ('{"a": ' + "9" * 5000 + "}", "integer out of the 64-bit range"),
        ("[" * 100_000 + "]" * 100_000, "nested deeper than"),
        ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "nested deeper than"),
        ('{"a": 1', "not valid JSON: Expecting"),
    ],
)
def test_json_problems_are_one_line(text, match):
    with pytest.raises(ConfigError, match=match) as info:
        parse_json(text, "j.json")
    message = str(info.value)
    assert message.startswith("j.json: ") and "\n" not in message and len(message) < MAX_LINE


def test_load_json(tmp_path):
    f = tmp_path / "j.json"
    f.write_text('{"a": [1, 2.5, "x", null, true]}')
    assert load_json(f) == {"a": [1, 2.5, "x", None, True]}
    ok = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert parse_json(ok, "j.json") == json.loads(ok)
    f.write_bytes(b"\xff")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_json(f)
