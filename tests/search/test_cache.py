import json
import logging
import multiprocessing

import pytest

from fusekit.search import TuningCache
from fusekit.search.cache import CACHE_VERSION

A, B, C = ('{"p":"a"}', '{"p":"b"}', '{"p":"c"}')  # point keys: compact JSON objects


def _record(cache: TuningCache, key: str = "p1", points=None, features=(1.0, 2.0)) -> None:
    cache.record("hw", key, "fp32,sum", features, points or {A: 2.0, B: 1.0}, {"n": 3})


def test_record_lookup_best_and_meta(tmp_path):
    cache = TuningCache(tmp_path / "t.json")
    assert cache.lookup("hw", "p1") is None
    _record(cache)
    _record(cache, points={C: 0.5})  # merged, not replaced
    entry = cache.lookup("hw", "p1")
    assert entry is not None
    assert dict(entry.points) == {A: 2.0, B: 1.0, C: 0.5}
    assert entry.best() == (C, 0.5)
    assert entry.meta == {"n": 3}
    assert cache.lookup("other-hw", "p1") is None


def test_nearest_answers_similar_problems_of_the_same_group(tmp_path):
    cache = TuningCache(tmp_path / "t.json")
    _record(cache, "near", features=(1.0, 1.0))
    _record(cache, "far", features=(5.0, 5.0))
    cache.record("hw", "max", "fp32,max", (1.0, 1.0), {A: 1.0})
    entry, dist = cache.nearest("hw", "fp32,sum", (1.5, 1.0))
    assert entry.key == "near" and dist == pytest.approx(0.5)
    assert cache.nearest("hw", "fp32,sum", (1.5, 1.0), max_distance=0.1) is None
    assert cache.nearest("hw", "bf16,sum", (1.0, 1.0)) is None


def test_models_are_stored_beside_points(tmp_path):
    cache = TuningCache(tmp_path / "t.json")
    assert cache.model("hw", "m") is None
    cache.store_model("hw", "m", {"x": 1.5}, n=10)
    _record(cache)
    assert cache.model("hw", "m") == {"x": 1.5}


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        '{"format": "fusekit-tuning-cache", "version": 1, "library": "0.1.0", "entr',  # truncated
        json.dumps({"format": "fusekit-tuning-cache", "version": CACHE_VERSION + 1, "entries": {}}),
        json.dumps(
            {
                "format": "fusekit-tuning-cache",
                "version": CACHE_VERSION,
                "library": "0.0.0-other",
                "entries": {"x": {}},
            }
        ),
        json.dumps({"format": "something-else"}),
        json.dumps([1, 2, 3]),
    ],
    ids=["corrupt", "truncated", "foreign-version", "foreign-library", "foreign-format", "list"],
)
def test_untrusted_files_are_ignored_with_a_warning_and_rewritten(tmp_path, caplog, content):
    path = tmp_path / "t.json"
    path.write_text(content)
    cache = TuningCache(path)
    with caplog.at_level(logging.WARNING):
        assert cache.entries() == []
    assert "ignoring tuning cache" in caplog.text
    _record(cache)
    blob = json.loads(path.read_text())
    assert blob["version"] == CACHE_VERSION and list(blob["entries"]) == ["hw|p1"]
    assert TuningCache(path).lookup("hw", "p1") is not None


def test_malformed_entries_are_skipped(tmp_path):
    cache = TuningCache(tmp_path / "t.json")
    _record(cache)
    blob = json.loads(cache.path.read_text())
    blob["entries"]["hw|bad"] = {"hardware": "hw", "points": "nope"}
    cache.path.write_text(json.dumps(blob))
    assert [e.key for e in cache.entries()] == ["p1"]


def _writer(path: str, worker: int, n: int) -> None:
    cache = TuningCache(path)
    for i in range(n):
        cache.record("hw", "shared", "g", (0.0,), {f'{{"w":"{worker}-{i}"}}': float(i + 1)})


def test_two_processes_recording_at_once_lose_nothing(tmp_path):
    path = str(tmp_path / "t.json")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, 15)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    entry = TuningCache(path).lookup("hw", "shared")
    assert entry is not None and len(entry.points) == 30
    json.loads((tmp_path / "t.json").read_text())  # a valid file
