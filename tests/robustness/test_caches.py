"""Caches are untrusted input: corrupt, implausible or planted parts are ignored, never used.

Covers the tuning cache (``fusekit.search.cache`` read through the gms checks), the hardware
detect cache (``fusekit.hw.detect``), the generated stitch kernels
(``fusekit.stitch.codegen.render``) and the Ray executor's one-point-per-host rule. Every
command-line probe runs in a subprocess with a timeout and ``XDG_CACHE_HOME`` in a temporary
folder: it must exit 0 with one warning line (or 2 with one error line), never a traceback.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fusekit import __version__
from fusekit.gms import GMSProblem
from fusekit.gms.features import signature
from fusekit.gms.search import checked, hardware_key, refit, tune
from fusekit.search import TuningCache, point_key
from fusekit.search.cache import CACHE_FORMAT, CACHE_VERSION

from ..gms.helpers_tuning import TARGET

detect_module = importlib.import_module("fusekit.hw.detect")

HW = hardware_key(TARGET)
#: two points of every CPU space of a 2-core target (legal for every reduce)
FAST = {
    "strategy": "(GMS)seg",
    "tile_rows": 64,
    "blocks_per_thread": 1,
    "schedule": "pad",
    "threads": 2,
    "chunk": 0,
}
SLOW = {**FAST, "strategy": "G-Mseg-S", "tile_rows": 16}
FAKE = detect_module.Measurements(2e10, 1e11, 1024, 2e-6, 0.1)
TIMEOUT_S = 120


def _problem() -> GMSProblem:
    gen = torch.Generator().manual_seed(0)
    g, s = torch.randint(0, 40, (120,), generator=gen), torch.randint(0, 5, (120,), generator=gen)
    d = torch.randint(0, 30, (120,), generator=gen)
    return GMSProblem(g, s, d, n_in=40, n_out=30, num_segments=5)


def _blob(entries=None, models=None) -> dict:
    return {
        "format": CACHE_FORMAT,
        "version": CACHE_VERSION,
        "library": __version__,
        "entries": {} if entries is None else entries,
        "models": {} if models is None else models,
    }


def _entry(key: str, points: dict, hw: str = HW, **over) -> dict:
    return {"hardware": hw, "key": key, "group": "fp32,sum", "features": [1.0], "points": points,
            **over}  # fmt: skip


GOOD_KEY = point_key(FAST)
GOOD = {f"{HW}|good": _entry("good", {GOOD_KEY: 1e-3})}


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# ---- tuning cache: the whole file ----


@pytest.mark.parametrize(
    "content",
    ["null", '"a string"', "[1, 2]", json.dumps(_blob(GOOD))[:70], "[" * 100_000, "\udcff"],
    ids=["null", "string", "list", "truncated", "deep-nesting", "undecodable"],
)
def test_an_untrusted_tuning_file_is_ignored_once_and_rewritten(tmp_path, caplog, content):
    path = tmp_path / "tuning.json"
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    cache = checked(TuningCache(path))
    with caplog.at_level(logging.WARNING):
        assert cache.entries() == [] and cache.model(HW, "gms-model") is None
        assert cache.lookup(HW, "good") is None
    assert len(_warnings(caplog)) == 1 and "ignoring tuning cache" in caplog.text
    cache.record(HW, "p", "fp32,sum", (1.0,), {GOOD_KEY: 2e-3})
    caplog.clear()
    assert checked(TuningCache(path)).lookup(HW, "p").points == {GOOD_KEY: 2e-3}
    assert _warnings(caplog) == []


# ---- tuning cache: one corrupt part beside a good one ----

NAN = float("nan")
CORRUPT_PARTS = {
    "entries-a-list": {"entries": [1, 2]},
    "entries-null": {"entries": None},
    "entry-a-string": {"entries": {**GOOD, f"{HW}|bad": "text"}},
    "points-a-list": {"entries": {**GOOD, f"{HW}|bad": _entry("bad", [1.0])}},
    "point-key-not-json": {"entries": {**GOOD, f"{HW}|bad": _entry("bad", {"{nope": 1e-3})}},
    "point-key-a-json-list": {"entries": {**GOOD, f"{HW}|bad": _entry("bad", {"[1]": 1e-3})}},
    "unknown-strategy": {
        "entries": {
            **GOOD,
            f"{HW}|bad": _entry("bad", {point_key({**FAST, "strategy": "X"}): 1e-3}),
        }
    },
    "unknown-knob": {
        "entries": {**GOOD, f"{HW}|bad": _entry("bad", {point_key({**FAST, "evil": 1}): 1e-3})}
    },
    "illegal-knob-value": {
        "entries": {**GOOD, f"{HW}|bad": _entry("bad", {point_key({**FAST, "tile_rows": 0}): 1e-3})}
    },
    "negative-time": {"entries": {**GOOD, f"{HW}|bad": _entry("bad", {GOOD_KEY: -1.0})}},
    "zero-time": {"entries": {**GOOD, f"{HW}|bad": _entry("bad", {GOOD_KEY: 0.0})}},
    "nan-time": {"entries": {**GOOD, f"{HW}|bad": _entry("bad", {GOOD_KEY: NAN})}},
    "string-time": {"entries": {**GOOD, f"{HW}|bad": _entry("bad", {GOOD_KEY: "1e-3"})}},
    "bool-time": {"entries": {**GOOD, f"{HW}|bad": _entry("bad", {GOOD_KEY: True})}},
    "nan-feature": {
        "entries": {**GOOD, f"{HW}|bad": _entry("bad", {GOOD_KEY: 1.0}, features=[NAN])}
    },
    "hardware-not-text": {"entries": {**GOOD, f"{HW}|bad": _entry("bad", {GOOD_KEY: 1.0}, hw=3)}},
    "misfiled-entry": {"entries": {**GOOD, f"{HW}|bad": _entry("other", {GOOD_KEY: 1.0})}},
    "models-a-list": {"entries": GOOD, "models": [1, 2]},
    "model-a-string": {"entries": GOOD, "models": {f"{HW}|gms-model": "x"}},
    "nan-coefficient": {"entries": GOOD, "models": {f"{HW}|gms-model": {"coef": {"calls": NAN}}}},
    "negative-coefficient": {
        "entries": GOOD,
        "models": {f"{HW}|gms-model": {"coef": {"calls": -3.0}, "fitted_on": 4}},
    },
    "unknown-term": {
        "entries": GOOD,
        "models": {f"{HW}|gms-model": {"coef": {"evil": 1.0}, "fitted_on": 4}},
    },
    "coef-a-list": {"entries": GOOD, "models": {f"{HW}|gms-model": {"coef": [1.0]}}},
}


@pytest.mark.parametrize("part", list(CORRUPT_PARTS.values()), ids=list(CORRUPT_PARTS))
def test_a_corrupt_part_is_ignored_with_one_warning_and_rewritten(tmp_path, caplog, part):
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({**_blob(), **part}))
    cache = checked(TuningCache(path))
    with caplog.at_level(logging.WARNING):
        entries = cache.entries()
        coef = cache.model(HW, "gms-model")
        cache.lookup(HW, "bad")
    assert len(_warnings(caplog)) == 1 and "corrupt part" in caplog.text
    assert coef is None
    assert [e.key for e in entries] == (["good"] if isinstance(part["entries"], dict) else [])
    for entry in entries:
        assert all(t > 0 for t in entry.points.values())
    cache.record(HW, "new", "fp32,sum", (1.0,), {GOOD_KEY: 2e-3})  # the next save
    caplog.clear()
    again = checked(TuningCache(path))
    assert {e.key for e in again.entries()} >= {"new"} and again.lookup(HW, "bad") is None
    assert _warnings(caplog) == []  # rewritten without the corrupt part
    blob = json.loads(path.read_text())
    assert isinstance(blob["entries"], dict) and isinstance(blob["models"], dict)


def test_writes_refuse_what_reads_would_ignore(tmp_path):
    cache = checked(TuningCache(tmp_path / "t.json"))
    for points in (
        {GOOD_KEY: -1.0},
        {GOOD_KEY: NAN},
        {"nope": 1.0},
        {point_key({"strategy": "X"}): 1.0},
    ):
        with pytest.raises(ValueError, match="points"):
            cache.record(HW, "p", "g", (1.0,), points)
    with pytest.raises(ValueError, match="coef"):
        cache.store_model(HW, "gms-model", {"calls": NAN}, 3)
    assert not cache.path.exists()


# ---- tuning cache: what the tuner and the selector do with it ----


def _features_and_key(problem: GMSProblem):
    from fusekit.gms import plan
    from fusekit.gms.features import features

    return features(plan(problem), 8, 8, torch.float32, False), signature(
        problem, 8, 8, torch.float32, False
    )


def test_a_negative_time_never_wins_the_selection(tmp_path):
    from fusekit.gms.selector import select

    problem = _problem()
    f, key = _features_and_key(problem)
    path = tmp_path / "t.json"
    entry = _entry(key, {point_key(SLOW): -1.0, GOOD_KEY: 5e-3}, features=list(f.vector()))
    path.write_text(json.dumps(_blob({f"{HW}|{key}": {**entry, "group": f.group}})))
    choice = select(f, TARGET, key=key, cache=TuningCache(path))
    assert choice.source == "cache" and choice.point == FAST
    # only the bad point: the cache does not answer at all
    entry["points"] = {point_key(SLOW): -1.0}
    path.write_text(json.dumps(_blob({f"{HW}|{key}": {**entry, "group": f.group}})))
    assert select(f, TARGET, key=key, cache=TuningCache(path)).source != "cache"


def test_a_point_outside_the_problems_space_is_never_selected(tmp_path):
    from fusekit.gms.selector import select

    problem = _problem()
    f, key = _features_and_key(problem)
    path = tmp_path / "t.json"
    many_threads = {**FAST, "threads": 4096}  # a legal knob, but not on this 2-core target
    entry = _entry(key, {point_key(many_threads): 1e-9}, features=list(f.vector()))
    path.write_text(json.dumps(_blob({f"{HW}|{key}": {**entry, "group": f.group}})))
    choice = select(f, TARGET, key=key, cache=TuningCache(path))
    assert choice.source not in ("cache", "nearest") and choice.point["threads"] <= 2


def test_tune_and_refit_use_only_valid_measurements(tmp_path, caplog):
    problem = _problem()
    f, key = _features_and_key(problem)
    path = tmp_path / "t.json"
    bad_meta = {"features": {"pairs": "many"}}
    entries = {
        f"{HW}|{key}": _entry(key, {GOOD_KEY: -1.0, "{bad": 1.0}, group=f.group),
        f"{HW}|x": _entry("x", {GOOD_KEY: 1e-3}, meta=bad_meta),
    }
    models = {f"{HW}|gms-model": {"coef": {"calls": NAN}, "fitted_on": 1}}
    path.write_text(json.dumps(_blob(entries, models)))
    cache = TuningCache(path)
    with caplog.at_level(logging.WARNING):
        result = tune(problem, 8, 8, target=TARGET, budget=2, repeats=1, cache=cache)
        coef = refit(cache, TARGET)
    assert len(_warnings(caplog)) == 1
    assert result.best_s > 0 and all(t > 0 for t in result.measured.values())
    assert all(c > 0 for c in coef.values())
    blob = json.loads(path.read_text())
    assert all(t > 0 for e in blob["entries"].values() for t in e["points"].values())


# ---- hardware-detect cache ----


def _valid_hw_cache(path: Path, monkeypatch) -> dict:
    monkeypatch.setattr(detect_module, "measure", lambda: FAKE)
    detect_module.detect(refresh=True, cache_path=path)
    return json.loads(path.read_text())


def _set(*keys_value):
    """An edit of a cache blob: set the value at a key path, return the blob."""
    *keys, value = keys_value

    def edit(blob):
        node = blob
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
        return blob

    return edit


HW_CORRUPTIONS = {
    "list": lambda b: [1, 2],
    "null": lambda b: None,
    "string": lambda b: "cpu",
    "no-key": lambda b: {"version": b["version"], "target": b["target"]},
    "target-a-list": _set("target", [1]),
    "zero-cores": _set("target", "cores", 0),
    "zero-bandwidth": _set("target", "mem_bw_bytes_per_s", 0.0),
    "negative-launch": _set("target", "launch_overhead_s", -1e-6),
    "nan-bandwidth": _set("target", "mem_bw_bytes_per_s", NAN),
    "inf-peak": _set("target", "peak_flops_per_s", "fp32", float("inf")),
    "zero-peak": _set("target", "peak_flops_per_s", "fp32", 0.0),
    "string-cores": _set("target", "cores", "4"),
    "float-cores": _set("target", "cores", 4.5),
    "bool-threads": _set("target", "threads", True),
    "peak-a-list": _set("target", "peak_flops_per_s", [1e11]),
    "unknown-field": _set("target", "evil", 1),
    "wrong-kind": _set("target", "kind", "gpu"),
    "name-not-text": _set("target", "name", 7),
}


@pytest.mark.parametrize("corrupt", list(HW_CORRUPTIONS.values()), ids=list(HW_CORRUPTIONS))
def test_a_corrupt_hw_cache_is_ignored_with_one_warning_and_remeasured(
    tmp_path, monkeypatch, caplog, corrupt
):
    path = tmp_path / "hw-detect.json"
    blob = _valid_hw_cache(path, monkeypatch)
    path.write_text(json.dumps(corrupt(copy.deepcopy(blob))))
    monkeypatch.setattr(detect_module, "measure", lambda: FAKE)
    with caplog.at_level(logging.INFO, logger="fusekit.hw.detect"):
        target = detect_module.detect(cache_path=path)
    assert len(_warnings(caplog)) == 1 and "ignoring hw-detect cache" in caplog.text
    assert target.cores >= 1 and target.mem_bw_bytes_per_s == 2e10
    assert json.loads(path.read_text()) == blob  # rewritten with the measurement

    def no_measuring():
        raise AssertionError("the rewritten cache should have been used")

    monkeypatch.setattr(detect_module, "measure", no_measuring)
    assert detect_module.detect(cache_path=path) == target


def test_a_truncated_hw_cache_is_ignored(tmp_path, monkeypatch, caplog):
    path = tmp_path / "hw-detect.json"
    _valid_hw_cache(path, monkeypatch)
    path.write_text(path.read_text()[:50])
    with caplog.at_level(logging.WARNING):
        assert detect_module.detect(cache_path=path).mem_bw_bytes_per_s == 2e10
    assert len(_warnings(caplog)) == 1


def test_another_machines_hw_cache_is_remeasured_without_a_warning(tmp_path, monkeypatch, caplog):
    path = tmp_path / "hw-detect.json"
    blob = _valid_hw_cache(path, monkeypatch)
    blob["key"]["cpu_model"] = "another CPU"
    blob["target"]["cores"] = 0  # never looked at: the key does not match
    path.write_text(json.dumps(blob))
    with caplog.at_level(logging.WARNING):
        assert detect_module.detect(cache_path=path).cores >= 1
    assert _warnings(caplog) == []


# ---- the command line, in subprocesses ----


def _run(args: list[str], xdg: Path, patch_measure: bool = True) -> subprocess.CompletedProcess:
    """``fusekit ARGS`` with the cache folder in ``xdg`` (and a fake hw measurement)."""
    code = (
        "import importlib, sys\n"
        + (
            "d = importlib.import_module('fusekit.hw.detect')\n"
            "d.measure = lambda: d.Measurements(2e10, 1e11, 1024, 2e-6, 0.1)\n"
            if patch_measure
            else ""
        )
        + f"sys.argv = ['fusekit', *{args!r}]\n"
        "from fusekit.cli import main\n"
        "main()\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(xdg), "COLUMNS": "200"}
    env.pop("FUSEKIT_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=TIMEOUT_S
    )


def _warning_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("WARNING")]


def _prime(xdg: Path) -> dict:
    """Write a valid hw cache into ``xdg`` from a fresh process (its machine key is the CLI's).

    Returns:
        ``hw`` (the tuning cache's hardware key), ``cores``, ``key`` (the signature of the
        problem of ``SMALL``).
    """
    code = (
        "import importlib, json, torch\n"
        "d = importlib.import_module('fusekit.hw.detect')\n"
        "d.measure = lambda: d.Measurements(2e10, 1e11, 1024, 2e-6, 0.1)\n"
        "from fusekit.gms import workloads\n"
        "from fusekit.gms.features import signature\n"
        "from fusekit.gms.search import hardware_key\n"
        "t = d.detect(refresh=True)\n"
        "wl = workloads.make('rgcn', 0, 0.02)\n"
        "key = signature(wl.problem(), 8, 8, torch.float32, wl.scale is not None)\n"
        "print(json.dumps({'hw': hardware_key(t), 'cores': t.cores, 'key': key}))\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(xdg)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=TIMEOUT_S
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize(
    "content",
    [
        "[1, 2]",
        pytest.param("null", marks=pytest.mark.slow),
        pytest.param('"cpu"', marks=pytest.mark.slow),
        pytest.param("zeros", marks=pytest.mark.slow),
    ],
)
def test_hw_show_with_a_corrupt_cache_warns_once_and_rewrites_it(tmp_path, content):
    path = tmp_path / "fusekit" / "hw-detect.json"
    if content == "zeros":
        _prime(tmp_path)
        blob = json.loads(path.read_text())
        blob["target"].update(cores=0, mem_bw_bytes_per_s=0.0, l1d_bytes=0)
        content = json.dumps(blob)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    out = _run(["hw", "show", "cpu-local", "--json"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert "ignoring hw-detect cache" in line
    shown = json.loads(out.stdout)
    assert shown["cores"] >= 1 and shown["mem_bw_bytes_per_s"] == 2e10
    assert json.loads(path.read_text())["target"]["mem_bw_bytes_per_s"] == 2e10


def test_an_rgcn_forward_survives_a_corrupt_hw_cache_in_process(tmp_path, monkeypatch, caplog):
    from fusekit.gms import target
    from fusekit.nn import RGCNConv

    path = tmp_path / "fusekit" / "hw-detect.json"
    path.parent.mkdir(parents=True)
    path.write_text('"a string"')
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(target, "_TARGETS", {})
    monkeypatch.setattr(detect_module, "measure", lambda: FAKE)
    torch.manual_seed(0)
    conv = RGCNConv(4, 3, 2)
    with caplog.at_level(logging.WARNING), torch.no_grad():  # inference: the selector chooses
        out = conv(torch.randn(4, 4), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]),
                   torch.tensor([0, 1, 0, 1]))  # fmt: skip
    assert out.shape == (4, 3) and bool(torch.isfinite(out).all())
    assert len(_warnings(caplog)) == 1 and "ignoring hw-detect cache" in caplog.text
    assert json.loads(path.read_text())["target"]["mem_bw_bytes_per_s"] == 2e10


@pytest.mark.slow
def test_an_rgcn_forward_survives_a_corrupt_hw_cache(tmp_path):
    path = tmp_path / "fusekit" / "hw-detect.json"
    path.parent.mkdir(parents=True)
    path.write_text("null")
    code = (
        "import importlib, torch\n"
        "d = importlib.import_module('fusekit.hw.detect')\n"
        "d.measure = lambda: d.Measurements(2e10, 1e11, 1024, 2e-6, 0.1)\n"
        "from fusekit.nn import RGCNConv\n"
        "torch.manual_seed(0)\n"
        "conv = RGCNConv(4, 3, 2)\n"
        "edge_index = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])\n"
        "with torch.no_grad():  # inference: the selector, and so detect(), chooses\n"
        "    out = conv(torch.randn(4, 4), edge_index, torch.tensor([0, 1, 0, 1]))\n"
        "assert out.shape == (4, 3) and bool(torch.isfinite(out).all())\n"
        "print('ok')\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=TIMEOUT_S
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert "Traceback" not in out.stderr and "ignoring hw-detect cache" in out.stderr


def _cli_tuning_cache(tmp_path: Path) -> Path:
    """A valid hw cache, and a tuning cache with corrupt parts for the CLI's problem."""
    primed = _prime(tmp_path)
    hw, key = primed["hw"], primed["key"]
    cheat = {**FAST, "threads": primed["cores"]}  # a point of the space, at -1 s
    entries = {
        f"{hw}|{key}": _entry(key, {point_key(cheat): -1.0, "{bad": 1.0}, hw=hw),
        f"{hw}|x": [1],
    }
    models = {f"{hw}|gms-model": {"coef": {"calls": NAN, "stream": "fast"}, "fitted_on": 2}}
    path = tmp_path / "fusekit" / "tuning.json"
    path.write_text(json.dumps(_blob(entries, models)))
    return path


SMALL = ["--shape", "rgcn", "--scale", "0.02", "--k", "8", "--m", "8"]


def test_gms_explain_with_a_corrupt_tuning_cache_warns_once(tmp_path):
    _cli_tuning_cache(tmp_path)
    explain = _run(["gms", "explain", *SMALL, "--no-measure", "--json"], tmp_path)
    assert explain.returncode == 0, explain.stderr
    assert "Traceback" not in explain.stderr and len(_warning_lines(explain.stderr)) == 1
    out = json.loads(explain.stdout)
    assert "by the cache" not in out["why"]  # the -1 s point does not answer
    assert all(r["predicted_s"] > 0 for r in out["strategies"])  # NaN coefficients unused


@pytest.mark.slow
def test_gms_tune_with_a_corrupt_tuning_cache_warns_once_and_rewrites(tmp_path, caplog):
    path = _cli_tuning_cache(tmp_path)
    tuned = _run(["gms", "tune", *SMALL, "--budget", "2", "--repeats", "1", "--json"], tmp_path)
    assert tuned.returncode == 0, tuned.stderr
    assert "Traceback" not in tuned.stderr and len(_warning_lines(tuned.stderr)) == 1
    result = json.loads(tuned.stdout)
    assert result["best_s"] > 0 and all(t > 0 for t in result["measured"].values())
    assert all(c > 0 for c in result["coef"].values())
    # the save rewrote the file: every part valid, nothing to warn about
    with caplog.at_level(logging.WARNING):
        entries = checked(TuningCache(path)).entries()
    assert _warnings(caplog) == [] and len(json.loads(path.read_text())["entries"]) == 1
    assert all(t > 0 for e in entries for t in e.points.values())


@pytest.mark.slow
def test_gms_tune_with_a_null_tuning_cache_warns_once_and_rewrites(tmp_path):
    path = tmp_path / "fusekit" / "tuning.json"
    path.parent.mkdir(parents=True)
    path.write_text("null")
    tuned = _run(["gms", "tune", *SMALL, "--budget", "1", "--repeats", "1", "--json"], tmp_path)
    assert tuned.returncode == 0, tuned.stderr
    (warning,) = _warning_lines(tuned.stderr)
    assert "ignoring tuning cache" in warning and "Traceback" not in tuned.stderr
    assert json.loads(path.read_text())["format"] == CACHE_FORMAT


# ---- generated stitch kernels ----


def _generated(tmp_path: Path, monkeypatch, source: str, prefix: str = "probe") -> Path:
    from fusekit.stitch.codegen import render

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(render, "_MODULES", {})
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    return render.cache_dir() / f"{prefix}_{digest}.py"


def test_a_planted_kernel_file_is_replaced_not_imported(tmp_path, monkeypatch, caplog):
    from fusekit.stitch.codegen.render import load_generated

    marker = tmp_path / "planted-code-ran"
    source = f"# probe {tmp_path}\nVALUE = 1\n"
    path = _generated(tmp_path, monkeypatch, source)
    path.parent.mkdir(parents=True)
    path.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('x')\nVALUE = 2\n")
    with caplog.at_level(logging.WARNING):
        module = load_generated(source, "probe")
    assert module.VALUE == 1 and not marker.exists()
    assert path.read_text() == source
    assert len(_warnings(caplog)) == 1 and "does not match" in caplog.text


def test_a_truncated_kernel_file_is_regenerated(tmp_path, monkeypatch, caplog):
    from fusekit.stitch.codegen.render import load_generated

    source = f"# probe {tmp_path}\ndef kernel(a, b):\n    return a + b\n"
    path = _generated(tmp_path, monkeypatch, source)
    path.parent.mkdir(parents=True)
    path.write_text(source[: len(source) // 2])  # a SyntaxError if it were imported
    with caplog.at_level(logging.WARNING):
        assert load_generated(source, "probe").kernel(2, 3) == 5
    assert path.read_text() == source and len(_warnings(caplog)) == 1


def test_a_stitched_cpu_kernel_survives_its_truncated_file(tmp_path, monkeypatch):
    from fusekit.stitch.codegen.cpu import compile_source, generate_cpu
    from fusekit.stitch.runner import Stitched
    from fusekit.stitch.workloads import load_workload

    w = load_workload("layernorm_fwd", small=True)
    _, planned = Stitched(w.module, TARGET).prepare(*w.args)
    kernel = next(k for k in planned.kernels if hasattr(k, "layout"))
    source = generate_cpu(planned.plan.graph, kernel.layout)
    path = _generated(tmp_path, monkeypatch, source, "k")
    compile_source(source)
    assert path.read_text() == source
    path.write_text(source[:100])
    monkeypatch.setattr(importlib.import_module("fusekit.stitch.codegen.render"), "_MODULES", {})
    chunk, finish = compile_source(source)  # the C entry points of the recompiled module
    assert chunk > 0 and finish > 0
    assert path.read_text() == source


# ---- the Ray executor: one point per host at a time ----


def test_ray_timing_on_one_host_is_refused_before_ray_starts():
    from fusekit.errors import FusekitError
    from fusekit.search import RayExecutor

    with pytest.raises(FusekitError, match="'workers' to be at most 1"):
        RayExecutor(workers=2, one_per_host=True)
    assert RayExecutor(one_per_host=True).workers == 1  # a private instance: one host
    assert RayExecutor(workers=2).workers == 2  # not timing: no rule


def test_ray_hosts_are_counted_by_address(monkeypatch):
    ray = pytest.importorskip("ray")
    from fusekit.errors import FusekitError
    from fusekit.search import RayExecutor

    nodes = [
        {"Alive": True, "NodeManagerAddress": "10.0.0.1", "NodeID": "a", "Resources": {"CPU": 8}},
        {"Alive": True, "NodeManagerAddress": "10.0.0.1", "NodeID": "b", "Resources": {"CPU": 8}},
        {"Alive": True, "NodeManagerAddress": "10.0.0.2", "NodeID": "c", "Resources": {"CPU": 8}},
        {"Alive": False, "NodeManagerAddress": "10.0.0.3", "NodeID": "d", "Resources": {"CPU": 8}},
    ]
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    assert RayExecutor(address="cluster", one_per_host=True).workers == 2
    with pytest.raises(FusekitError, match="at most 2"):
        RayExecutor(workers=3, address="cluster", one_per_host=True).map(abs, [1])


class _FakeRay:
    """Just enough of ray for ``RayExecutor._one_per_node``: tasks finish in submission order."""

    def __init__(self):
        self.in_flight: dict[str, int] = {}
        self.most = 0
        self.at_once = 0

    def wait(self, refs, num_returns):
        ref = refs[0]
        self.in_flight[ref[0]] -= 1
        return [ref], refs[1:]

    def get(self, ref):
        return [x * x for x in ref[1]]


class _FakeTask:
    def __init__(self, ray: _FakeRay):
        self.ray = ray

    def options(self, scheduling_strategy):
        ray, node = self.ray, scheduling_strategy.node_id

        class Pinned:
            @staticmethod
            def remote(fn_ref, chunk):
                ray.in_flight[node] = ray.in_flight.get(node, 0) + 1
                ray.most = max(ray.most, ray.in_flight[node])
                ray.at_once = max(ray.at_once, sum(ray.in_flight.values()))
                return (node, tuple(chunk))  # hashable, as an ObjectRef is

        return Pinned


def test_ray_runs_at_most_one_task_per_node():
    pytest.importorskip("ray")
    from fusekit.search import RayExecutor

    ex = RayExecutor(workers=1, one_per_host=True)
    ex._nodes = [c * 56 for c in "abc"]  # node ids: 28 bytes in hex
    fake = _FakeRay()
    chunks = [[i] for i in range(10)]
    assert ex._one_per_node(fake, _FakeTask(fake), None, chunks) == [[i * i] for i in range(10)]
    assert fake.most == 1 and fake.at_once == 3


@pytest.mark.parametrize("executor", ["ray", "local"])
def test_gms_tune_refuses_parallel_timing_on_one_host(tmp_path, executor):
    args = ["gms", "tune", *SMALL, "--executor", executor, "--workers", "2"]
    out = _run(args, tmp_path, patch_measure=False)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: ") and "workers" in line and "side by side" in line
    assert not (tmp_path / "fusekit" / "tuning.json").exists()


def test_gms_tune_help_says_why():
    out = subprocess.run(
        [sys.executable, "-m", "fusekit", "gms", "tune", "--help"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert out.returncode == 0
    assert "one point per Ray host" in out.stdout and "never timed side by side" in out.stdout


@pytest.mark.slow
def test_gms_tune_on_a_private_ray_instance_records_in_the_driver(tmp_path):
    pytest.importorskip("ray")
    args = ["gms", "tune", *SMALL, "--budget", "2", "--repeats", "1", "--executor", "ray"]
    out = _run([*args, "--json"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["newly_measured"] == 2
    cache = checked(TuningCache(tmp_path / "fusekit" / "tuning.json"))
    assert len(cache.entries()[0].points) == 2
