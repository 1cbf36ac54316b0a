"""A persistent tuning cache: measured points per (hardware, problem), in one JSON file.

Layout of the file (``CACHE_FORMAT``, ``CACHE_VERSION``)::

    {"format": "fusekit-tuning-cache", "version": 1, "library": "0.1.0",
     "entries": {"<hardware>|<problem key>": {
         "hardware": "...", "key": "...", "group": "K=64,M=64,fp32,sum",
         "features": [..floats..], "points": {"<point key>": seconds, ...}}},
     "models": {"<hardware>|<model name>": {"coef": {...}, "fitted_on": n}}}

Guarantees:

* **Atomic writes.** A write goes to a temporary file in the same folder, then ``os.replace``;
  a reader sees the old or the new file, never half of one.
* **Two processes at once.** Every write re-reads the file under an exclusive ``flock`` on a
  side file and merges its points in, so concurrent tuners lose nothing.
* **Interrupted tunes.** :meth:`TuningCache.record` writes after every measured point; an
  interrupted tune loses only the point in flight.
* **Never trusted blindly.** A corrupt, truncated or foreign (other format, version or library
  version) file is ignored with a warning and rewritten by the next write.
* **Similar problems.** :meth:`TuningCache.nearest` answers a problem never tuned with the
  entry of the same group (equal ``K``, ``M``, dtype, reduce) whose feature vector is closest.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CACHE_FORMAT = "fusekit-tuning-cache"
CACHE_VERSION = 1


def default_tuning_path() -> Path:
    """``$XDG_CACHE_HOME/fusekit/tuning.json`` (``~/.cache`` when the variable is unset)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "fusekit" / "tuning.json"


def _library_version() -> str:
    from fusekit import __version__

    return __version__


@dataclass(frozen=True, slots=True)
class Entry:
    """The measured points of one problem on one piece of hardware.

    Attributes:
        hardware: the hardware key (see ``fusekit.gms.search.hardware_key``).
        key: the problem's signature (a hash of its indices and operand shapes).
        group: what a similar problem must share exactly to borrow this entry's answer.
        features: numbers compared by :meth:`TuningCache.nearest` (already normalised).
        points: point key -> measured median seconds.
        meta: details the writer kept (see :meth:`TuningCache.record`).
    """

    hardware: str
    key: str
    group: str
    features: tuple[float, ...]
    points: Mapping[str, float]
    meta: Mapping[str, Any] = field(default_factory=dict)

    def best(self) -> tuple[str, float]:
        """The fastest point's key and time."""
        key = min(self.points, key=lambda k: self.points[k])
        return key, self.points[key]


class TuningCache:
    """Measured points of tuned problems, shared by processes through one JSON file.

    Args:
        path: the file; :func:`default_tuning_path` when None.
    """

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else default_tuning_path()
        self._warned = False

    # ---- reading ----

    def _read(self) -> dict[str, Any]:
        """The file's content, or an empty cache (with one warning) when it cannot be trusted."""
        empty: dict[str, Any] = {"entries": {}, "models": {}}
        if not self.path.exists():
            return empty
        try:
            blob = json.loads(self.path.read_text())
            problem = None
            if not isinstance(blob, dict) or blob.get("format") != CACHE_FORMAT:
                problem = "not a fusekit tuning cache"
            elif blob.get("version") != CACHE_VERSION:
                problem = f"cache version {blob.get('version')!r}, expected {CACHE_VERSION}"
            elif blob.get("library") != _library_version():
                problem = f"written by fusekit {blob.get('library')!r}"
            elif not isinstance(blob.get("entries"), dict):
                problem = "no 'entries' mapping"
            if problem is None:
                blob.setdefault("models", {})
                content: dict[str, Any] = blob
                return content
        except (OSError, ValueError) as e:
            problem = f"unreadable ({type(e).__name__}: {e})"
        if not self._warned:
            log.warning("ignoring tuning cache %s: %s; it will be rewritten", self.path, problem)
            self._warned = True
        return empty

    def entries(self) -> list[Entry]:
        """Every valid entry of the file (malformed entries are skipped)."""
        out = []
        for raw in self._read()["entries"].values():
            try:
                out.append(
                    Entry(
                        hardware=str(raw["hardware"]),
                        key=str(raw["key"]),
                        group=str(raw["group"]),
                        features=tuple(float(f) for f in raw["features"]),
                        points={str(k): float(v) for k, v in raw["points"].items()},
                        meta=dict(raw.get("meta") or {}),
                    )
                )
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
        return [e for e in out if e.points]

    def lookup(self, hardware: str, key: str) -> Entry | None:
        """The entry of exactly this problem on this hardware, if measured."""
        for entry in self.entries():
            if entry.hardware == hardware and entry.key == key:
                return entry
        return None

    def nearest(
        self,
        hardware: str,
        group: str,
        features: Sequence[float],
        max_distance: float = math.inf,
    ) -> tuple[Entry, float] | None:
        """The entry of the same hardware and group whose features are closest (Euclidean).

        Args:
            hardware: the hardware key.
            group: must match exactly.
            features: the problem's feature vector (same normalisation as the entries').
            max_distance: entries farther than this are not answers.

        Returns:
            ``(entry, distance)``, or None when no entry qualifies.
        """
        best: tuple[Entry, float] | None = None
        for entry in self.entries():
            if entry.hardware != hardware or entry.group != group:
                continue
            if len(entry.features) != len(features):
                continue
            dist = math.dist(entry.features, features)
            if dist <= max_distance and (best is None or dist < best[1]):
                best = (entry, dist)
        return best

    def model(self, hardware: str, name: str) -> dict[str, float] | None:
        """Coefficients stored by :meth:`store_model`, or None."""
        raw = self._read()["models"].get(f"{hardware}|{name}")
        if not isinstance(raw, dict) or not isinstance(raw.get("coef"), dict):
            return None
        try:
            return {str(k): float(v) for k, v in raw["coef"].items()}
        except (TypeError, ValueError):
            return None

    # ---- writing ----

    def record(
        self,
        hardware: str,
        key: str,
        group: str,
        features: Sequence[float],
        points: Mapping[str, float],
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        """Merge measured points of one problem into the file (locked, atomic).

        Args:
            hardware: the hardware key.
            key: the problem's signature.
            group: what a similar problem must share exactly (see :meth:`nearest`).
            features: the normalised feature vector (see :meth:`nearest`).
            points: point key -> measured median seconds.
            meta: JSON-ready details kept with the entry (a model refits from them).
        """
        with self._locked() as blob:
            slot = blob["entries"].setdefault(
                f"{hardware}|{key}",
                {"hardware": hardware, "key": key, "group": group, "points": {}},
            )
            slot["features"] = [float(f) for f in features]
            if meta is not None:
                slot["meta"] = dict(meta)
            slot.setdefault("points", {}).update({k: float(v) for k, v in points.items()})

    def store_model(self, hardware: str, name: str, coef: Mapping[str, float], n: int) -> None:
        """Keep fitted model coefficients beside the points they were fitted on."""
        with self._locked() as blob:
            blob["models"][f"{hardware}|{name}"] = {"coef": dict(coef), "fitted_on": int(n)}

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        """Hold the side lock, yield the current content, then write it back atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                blob = self._read()
                yield blob
                blob.update(format=CACHE_FORMAT, version=CACHE_VERSION, library=_library_version())
                fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tuning-", suffix=".json")
                try:
                    with os.fdopen(fd, "w") as f:
                        json.dump(blob, f, separators=(",", ":"))
                    os.replace(tmp, self.path)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                    raise
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
