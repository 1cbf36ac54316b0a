"""tools/compare_results.py: ratios and fusekit's own times compared record by record."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def compare_results():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import compare_results as module

        yield module
    finally:
        sys.path.remove(str(ROOT / "tools"))


def _write(folder: Path, fusekit_s: float, peer_s: float) -> Path:
    folder.mkdir()
    records = [
        {"impl": "fusekit", "graph": "aifb", "median_s": fusekit_s, "speedup": peer_s / fusekit_s},
        {"impl": "pyg", "graph": "aifb", "median_s": peer_s, "speedup": 1.0},
    ]
    (folder / "rgcn.json").write_text(json.dumps({"records": records}))
    return folder


def test_ratios_move_with_the_peer_times_do_not(compare_results, tmp_path: Path) -> None:
    # fusekit's own time is unchanged; the peer got 2x faster between the sides.
    before = [_write(tmp_path / "b", fusekit_s=1.0, peer_s=4.0)]
    after = [_write(tmp_path / "a", fusekit_s=1.0, peer_s=2.0)]
    (ratio,) = compare_results.compare(before, after, 0.10)
    assert ratio["ratio"] == "speedup"
    assert ratio["after_over_before"] == pytest.approx(0.5)
    assert not ratio["ok"]
    (speed,) = compare_results.compare(before, after, 0.10, times=True)
    assert speed["ratio"] == "speed"
    assert speed["after_over_before"] == pytest.approx(1.0)
    assert speed["ok"]


def test_times_is_before_over_after(compare_results, tmp_path: Path) -> None:
    before = [_write(tmp_path / "b1", 2.0, 4.0), _write(tmp_path / "b2", 4.0, 4.0)]
    after = [_write(tmp_path / "a1", 1.0, 4.0)]
    (speed,) = compare_results.compare(before, after, 0.10, times=True)
    assert speed["before"] == pytest.approx(3.0)  # median of 2 and 4
    assert speed["after_over_before"] == pytest.approx(3.0)  # three times faster after
