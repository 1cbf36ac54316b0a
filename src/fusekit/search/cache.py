"""A persistent tuning cache: measured points per (hardware, problem), in one JSON file.

Layout of the file (``CACHE_FORMAT``, ``CACHE_VERSION``)::

    {"format": "fusekit-tuning-cache", "version": 1, "library": "0.1.0",
     "entries": {"<hardware>|<problem key>": {
         "hardware": "...", "key": "...", "group": "K=64,M=64,fp32,sum",
         "features": [..floats..], "points": {"<point key>": seconds, ...}}},
     "models": {"<hardware>|<model name>": {"coef": {...}, "fitted_on": n}}}

Guarantees:

* **Atomic writes.** A write goes to a temporary file in the same folder, then ``os.replace``;
  a reader sees the old or the new file, never half of one (:func:`fusekit.paths.write_atomic`).
* **Two processes at once.** Every write re-reads the file under an exclusive lock on a side
  file (:func:`fusekit.paths.locked`) and merges its points in, so concurrent tuners lose nothing.
* **Interrupted tunes.** A tuner records points as they are measured; an interrupted tune loses
  only the points in flight.
* **Never trusted.** The file is untrusted input: a corrupt, truncated or foreign (other format,
  version or library version) file is ignored with a warning; inside a valid file every part is
  schema-checked (entries and models are mappings, point keys JSON objects, measured times
  finite and > 0, features and coefficients finite, plus the checks its user passes in:
  ``check_point``, ``check_model``) and a part that fails is ignored with one warning line.
  The next write rewrites the file without what was ignored.
* **Similar problems.** :meth:`TuningCache.nearest` answers a problem never tuned with the
  entry of the same group (equal ``K``, ``M``, dtype, reduce) whose feature vector is closest.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fusekit import __version__
from fusekit.errors import expected
from fusekit.paths import cache_dir, locked, write_atomic

log = logging.getLogger(__name__)

CACHE_FORMAT = "fusekit-tuning-cache"
CACHE_VERSION = 1

#: Raises ``ValueError``/``TypeError``/``KeyError`` when a decoded point key is not a point of
#: its user's spaces (e.g. an unknown strategy).
PointCheck = Callable[[Mapping[str, Any]], None]
#: Raises ``ValueError``/``TypeError``/``KeyError`` when stored coefficients are not plausible.
ModelCheck = Callable[[Mapping[str, float]], None]


def default_tuning_path() -> Path:
    """``tuning.json`` in fusekit's cache folder (``$XDG_CACHE_HOME/fusekit`` on Linux)."""
    return cache_dir("tuning.json")


@dataclass(frozen=True, slots=True)
class Entry:
    """The measured points of one problem on one piece of hardware.

    Attributes:
        hardware: the hardware key (see ``fusekit.gms.search.hardware_key``).
        key: the problem's signature (a hash of its indices and operand shapes).
        group: what a similar problem must share exactly to borrow this entry's answer.
        features: numbers compared by :meth:`TuningCache.nearest` (already normalised).
        points: point key -> measured median seconds (finite, > 0).
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


# ---- the schema: what a part must be to be used ----


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def point_problem(key: Any, seconds: Any, check: PointCheck | None = None) -> str | None:
    """Why a measured point cannot be used, or None when it can.

    Args:
        key: the point key (compact JSON of the point's knobs).
        seconds: its measured time.
        check: the user's check of the decoded point.
    """
    if not _finite(seconds) or seconds <= 0:
        return f"measured time {_short(seconds)} is not a finite number of seconds > 0"
    if not isinstance(key, str):
        return f"point key {_short(key)} is not text"
    try:
        point = json.loads(key)
    except (ValueError, RecursionError):
        return "point key is not JSON"
    if not isinstance(point, dict):
        return "point key is not a JSON object"
    if check is not None:
        try:
            check(point)
        except (ValueError, TypeError, KeyError) as e:
            return str(e.args[0] if isinstance(e, KeyError) and e.args else e)
    return None


def _clean_entry(
    slot: str, raw: Any, check: PointCheck | None, problems: list[str]
) -> dict[str, Any] | None:
    """A schema-checked copy of one entry (bad points dropped), or None for a bad entry."""
    where = f"entries[{_short(slot)}]"
    if not isinstance(raw, dict):
        problems.append(f"{where}: not a mapping")
        return None
    for name in ("hardware", "key", "group"):
        if not isinstance(raw.get(name), str):
            problems.append(f"{where}.{name}: not text")
            return None
    if slot != f"{raw['hardware']}|{raw['key']}":
        problems.append(f"{where}: filed under another hardware or key")
        return None
    features, meta, points = raw.get("features"), raw.get("meta", {}), raw.get("points")
    if not isinstance(features, list) or not all(_finite(f) for f in features):
        problems.append(f"{where}.features: not a list of finite numbers")
        return None
    if not isinstance(meta, dict) or not isinstance(points, dict):
        problems.append(f"{where}: 'meta' or 'points' is not a mapping")
        return None
    kept = {}
    for key, seconds in points.items():
        why = point_problem(key, seconds, check)
        if why is None:
            kept[key] = float(seconds)
        else:
            problems.append(f"{where}.points[{_short(key)}]: {why}")
    if not kept:
        return None
    return {
        "hardware": raw["hardware"],
        "key": raw["key"],
        "group": raw["group"],
        "features": [float(f) for f in features],
        "meta": meta,
        "points": kept,
    }


def _clean_model(
    slot: str, raw: Any, check: ModelCheck | None, problems: list[str]
) -> dict[str, Any] | None:
    """A schema-checked copy of one model's coefficients, or None."""
    where = f"models[{_short(slot)}]"
    coef = raw.get("coef") if isinstance(raw, dict) else None
    fitted_on = raw.get("fitted_on", 0) if isinstance(raw, dict) else None
    if not isinstance(coef, dict) or not all(_finite(v) for v in coef.values()):
        problems.append(f"{where}.coef: not a mapping of finite numbers")
        return None
    if not isinstance(fitted_on, int) or isinstance(fitted_on, bool) or fitted_on < 0:
        problems.append(f"{where}.fitted_on: not a count")
        return None
    if check is not None:
        try:
            check(coef)
        except (ValueError, TypeError, KeyError) as e:
            problems.append(f"{where}.coef: {e}")
            return None
    return {"coef": {str(k): float(v) for k, v in coef.items()}, "fitted_on": fitted_on}


def _clean_part(
    blob: dict[str, Any],
    name: str,
    clean: Callable[[str, Any, list[str]], dict[str, Any] | None],
    problems: list[str],
) -> dict[str, Any]:
    raw = blob.get(name, {})
    if not isinstance(raw, dict):
        problems.append(f"{name}: not a mapping")
        return {}
    out = {}
    for slot, value in raw.items():
        kept = clean(slot, value, problems)
        if kept is not None:
            out[slot] = kept
    return out


class TuningCache:
    """Measured points of tuned problems, shared by processes through one JSON file.

    Args:
        path: the file; :func:`default_tuning_path` when None.
        check_point: the user's check of a decoded point key (a point that fails is ignored).
        check_model: the user's check of stored coefficients (a model that fails is ignored).
    """

    def __init__(
        self,
        path: Path | str | None = None,
        *,
        check_point: PointCheck | None = None,
        check_model: ModelCheck | None = None,
    ) -> None:
        self.path = Path(path) if path is not None else default_tuning_path()
        self.check_point = check_point
        self.check_model = check_model
        self._warned: set[str] = set()

    def with_checks(self, check_point: PointCheck, check_model: ModelCheck) -> TuningCache:
        """The same file read with these checks (``self`` when it already has them).

        Both views share their warnings, so a problem is reported once.
        """
        if self.check_point is check_point and self.check_model is check_model:
            return self
        other = TuningCache(self.path, check_point=check_point, check_model=check_model)
        other._warned = self._warned
        return other

    # ---- reading ----

    def _warn(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning(message)

    def _read(self) -> dict[str, Any]:
        """The file's schema-checked content; untrusted parts left out, with one warning."""
        empty: dict[str, Any] = {"entries": {}, "models": {}}
        try:
            blob = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return empty
        except (OSError, ValueError, RecursionError) as e:
            problem = f"unreadable ({type(e).__name__}: {_short(str(e))})"
        else:
            if not isinstance(blob, dict) or blob.get("format") != CACHE_FORMAT:
                problem = "not a fusekit tuning cache"
            elif blob.get("version") != CACHE_VERSION:
                problem = f"cache version {_short(blob.get('version'))}, expected {CACHE_VERSION}"
            elif blob.get("library") != __version__:
                problem = f"written by fusekit {_short(blob.get('library'))}"
            else:
                return self._clean(blob)
        self._warn(f"ignoring tuning cache {self.path}: {problem}; it will be rewritten")
        return empty

    def _clean(self, blob: dict[str, Any]) -> dict[str, Any]:
        problems: list[str] = []
        entries = _clean_part(
            blob, "entries", lambda s, r, p: _clean_entry(s, r, self.check_point, p), problems
        )
        models = _clean_part(
            blob, "models", lambda s, r, p: _clean_model(s, r, self.check_model, p), problems
        )
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            self._warn(
                f"ignoring {len(problems)} corrupt part(s) of tuning cache {self.path}: "
                f"{problems[0]}{more}; the next save rewrites it without them"
            )
        return {**blob, "entries": entries, "models": models}

    def entries(self) -> list[Entry]:
        """Every valid entry of the file (invalid parts are left out, see the module notes)."""
        return [
            Entry(
                hardware=raw["hardware"],
                key=raw["key"],
                group=raw["group"],
                features=tuple(raw["features"]),
                points=raw["points"],
                meta=raw["meta"],
            )
            for raw in self._read()["entries"].values()
        ]

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
        """Coefficients stored by :meth:`store_model` (and passing the checks), or None."""
        raw = self._read()["models"].get(f"{hardware}|{name}")
        return dict(raw["coef"]) if raw is not None else None

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

        Raises:
            ValueError: a point would not pass the reader's checks (a time that is not finite
                and > 0, a key that is not a JSON object or fails ``check_point``), or a
                feature is not finite.
        """
        for point, seconds in points.items():
            why = point_problem(point, seconds, self.check_point)
            if why is not None:
                raise ValueError(expected("TuningCache.record", "points", "usable", why))
        if not all(_finite(f) for f in features):
            raise ValueError(expected("TuningCache.record", "features", "finite", features))
        with self._locked() as blob:
            slot = blob["entries"].setdefault(
                f"{hardware}|{key}",
                {"hardware": hardware, "key": key, "group": group, "points": {}},
            )
            slot["features"] = [float(f) for f in features]
            if meta is not None:
                slot["meta"] = dict(meta)
            slot["points"].update({k: float(v) for k, v in points.items()})

    def store_model(self, hardware: str, name: str, coef: Mapping[str, float], n: int) -> None:
        """Keep fitted model coefficients beside the points they were fitted on.

        Raises:
            ValueError: the coefficients are not finite or fail ``check_model``.
        """
        problems: list[str] = []
        model = _clean_model(name, {"coef": dict(coef), "fitted_on": n}, self.check_model, problems)
        if model is None:
            raise ValueError(expected("TuningCache.store_model", "coef", "usable", problems[0]))
        with self._locked() as blob:
            blob["models"][f"{hardware}|{name}"] = model

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        """Hold the side lock, yield the checked content, then write it back atomically."""
        with locked(self.path):
            blob = self._read()
            yield blob
            blob.update(format=CACHE_FORMAT, version=CACHE_VERSION, library=__version__)
            write_atomic(self.path, json.dumps(blob, separators=(",", ":"), allow_nan=False))
