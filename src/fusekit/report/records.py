"""Results files: the one schema every benchmark writes and ``fusekit report build`` reads.

A results file is one JSON object::

    {
      "schema": "fusekit-results/1",
      "benchmark": "gms_kernels",      # the script that wrote it: benchmarks/<benchmark>.py
      "title": "...",                  # one line: what the benchmark compares
      "meta": {...},                   # the run: fusekit, commit, written, machine, torch,
                                       #   torch_threads, hardware (what run_metadata() returns)
      "settings": {...},               # the run's options and summary numbers, free form
      "plots": [{...}],                # charts of the records (:class:`Plot`)
      "tables": [{...}],               # compact tables of the records (:class:`Summary`)
      "records": [{...}, ...],         # long format: one measurement per record
      "data": {...}                    # optional bulk data other scripts read; not rendered
    }

A record's values are JSON scalars (string, finite number, boolean, null) or lists of them. A
plot's or table's ``where`` keeps the records whose value under each key equals the one given
(or is one of a list of values). :func:`load_results` checks all of it, including that every key
a plot or table names is present in the records it selects, and raises one
:class:`~fusekit.errors.ConfigError` line naming the file and the field.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fusekit import __version__
from fusekit.errors import ConfigError

#: The value of every results file's ``schema`` key.
SCHEMA: Final = "fusekit-results/1"

Scalar = str | int | float | bool | None
Cell = Scalar | list[Scalar]
Stat = Literal["median", "mean", "min", "max"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Plot(_Strict):
    """A chart of some records: ``stat`` of ``y`` per ``x``, one series per ``hue`` value.

    Attributes:
        title: the chart's heading.
        x: the key along the category (bar) or numeric (line) axis.
        y: the numeric key plotted, or several keys (one series each; then no ``hue``).
        hue: the key (or keys, joined) whose values split the records into series.
        where: which records the chart shows (key -> value or list of values).
        kind: ``bar`` (grouped bars, categories along ``x``) or ``line`` (numeric ``x``).
        log_y: a logarithmic value axis.
        stat: how several records of one ``x`` and series combine.
        ref: a reference value drawn as a line (1.0 for a speedup).
        label: the value axis' name (by default the ``y`` key, or "value" for several).
    """

    title: str
    x: str
    y: str | list[str]
    hue: str | list[str] | None = None
    where: dict[str, Scalar | list[Scalar]] = Field(default_factory=dict)
    kind: Literal["bar", "line"] = "bar"
    log_y: bool = False
    stat: Stat = "median"
    ref: float | None = None
    label: str | None = None

    @property
    def ys(self) -> tuple[str, ...]:
        """The plotted keys."""
        return (self.y,) if isinstance(self.y, str) else tuple(self.y)

    @property
    def hues(self) -> tuple[str, ...]:
        """The keys that split series (none when several ``y`` keys are the series)."""
        if self.hue is None:
            return ()
        return (self.hue,) if isinstance(self.hue, str) else tuple(self.hue)


class Summary(_Strict):
    """A compact table: one row per group of records, ``stats`` of each of ``values``.

    Attributes:
        title: the table's caption.
        rows: the keys whose values make a row (the group).
        values: the keys summarised per group: numbers by each stat, booleans as a count of
            true, strings as the value (or how many distinct values).
        across: a key whose values become columns, each holding ``values[0]`` (one value).
        where: which records the table shows.
        stats: the statistics of numeric values.
        note: a line printed under the table.
    """

    title: str
    rows: list[str] = Field(min_length=1)
    values: list[str] = Field(min_length=1)
    across: str | None = None
    where: dict[str, Scalar | list[Scalar]] = Field(default_factory=dict)
    stats: list[Stat] = Field(default_factory=lambda: list[Stat](["median"]), min_length=1)
    note: str = ""


class Meta(_Strict):
    """Where and when a benchmark ran (:func:`run_metadata`)."""

    fusekit: str
    commit: str
    written: str
    machine: str
    torch: str | None = None
    torch_threads: int | None = None
    hardware: dict[str, Any] | None = None


class Results(_Strict):
    """One results file (see the module docstring)."""

    schema_: Literal["fusekit-results/1"] = Field(default=SCHEMA, alias="schema")
    benchmark: str = Field(min_length=1)
    title: str
    meta: Meta
    settings: dict[str, Any] = Field(default_factory=dict)
    plots: list[Plot] = Field(default_factory=list)
    tables: list[Summary] = Field(default_factory=list)
    records: list[dict[str, Cell]]
    data: dict[str, Any] | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True)


#: A plot or a table of a results file.
PlotOrSummary = TypeVar("PlotOrSummary", Plot, Summary)


def select(
    records: Sequence[Mapping[str, Any]], where: Mapping[str, Any]
) -> list[Mapping[str, Any]]:
    """The records matching every ``key: value`` (or ``key: [values]``) of ``where``."""

    def keep(record: Mapping[str, Any]) -> bool:
        for key, want in where.items():
            value = record.get(key)
            if value != want and not (isinstance(want, list) and value in want):
                return False
        return True

    return [r for r in records if keep(r)]


def shown(
    views: Sequence[PlotOrSummary], records: Sequence[Mapping[str, Any]]
) -> list[PlotOrSummary]:
    """The ``views`` that select some record: what a partial run (``--quick``, ``--parts``) draws.

    A results file refuses a view that selects nothing (a misspelt ``where``), so a script that
    may leave a study out passes its views through this first.
    """
    return [view for view in views if select(records, view.where)]


def is_number(value: object) -> bool:
    """A JSON number that can be plotted: int or float, not bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_views(results: Results, source: str) -> None:
    """Every key a plot or table names is in the records it selects; ``y`` has numbers."""
    named_views: tuple[tuple[str, Sequence[Plot | Summary]], ...] = (
        ("plots", results.plots),
        ("tables", results.tables),
    )
    for kind, views in named_views:
        for i, view in enumerate(views):
            chosen = select(results.records, view.where)
            if not chosen:
                raise ConfigError(source, f"{kind}[{i}].where", "selects no record")
            if isinstance(view, Plot):
                named = {"x": (view.x,), "hue": view.hues}
                numeric = {"y": view.ys}
            else:
                across = (view.across,) if view.across else ()
                named = {"rows": tuple(view.rows), "values": tuple(view.values), "across": across}
                numeric = {}
                if view.across and len(view.values) != 1:
                    raise ConfigError(source, f"{kind}[{i}].values", "expected one key with across")
            for field, keys in named.items():
                for key in keys:
                    if not any(key in r for r in chosen):
                        raise ConfigError(source, f"{kind}[{i}].{field}", f"no record has {key!r}")
            for field, keys in numeric.items():
                for key in keys:
                    if not any(is_number(r.get(key)) for r in chosen):
                        problem = f"no record has a number under {key!r}"
                        raise ConfigError(source, f"{kind}[{i}].{field}", problem)


def _non_finite(value: object, where: str) -> tuple[str, float] | None:
    """The first NaN or infinity inside ``value``, as ``(field path, value)``."""
    if isinstance(value, float) and not math.isfinite(value):
        return where, value
    if isinstance(value, dict):
        items: Any = ((f"{where}.{k}" if where else str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for inner, v in items:
        found = _non_finite(v, inner)
        if found is not None:
            return found
    return None


def _location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validate_results(blob: object, source: str) -> Results:
    """Check a parsed results file against the schema.

    Args:
        blob: the parsed JSON.
        source: the file's name, for messages.

    Returns:
        The results.

    Raises:
        ConfigError: the first problem, as one line naming ``source`` and the field.
    """
    if not isinstance(blob, dict):
        raise ConfigError(source, "", f"expected a JSON object (got {type(blob).__name__})")
    if blob.get("schema") != SCHEMA:
        got = blob.get("schema", "no 'schema' key")
        raise ConfigError(source, "schema", f"expected {SCHEMA!r} (got {str(got)[:60]!r})")
    try:
        results = Results.model_validate(blob)
    except ValidationError as e:
        err = e.errors()[0]
        shown = repr(err.get("input"))
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        where = _location(tuple(err["loc"]))
        raise ConfigError(source, where, f"{err['msg']} (got {shown})") from None
    try:
        bad = _non_finite(blob, "")
    except RecursionError:
        raise ConfigError(source, "", "nested too deeply") from None
    if bad is not None:
        raise ConfigError(source, bad[0], f"expected a finite number (got {bad[1]})")
    _check_views(results, source)
    return results


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def load_results(path: str | Path) -> Results:
    """Read and check a results file.

    Returns:
        The results.

    Raises:
        ConfigError: the file is unreadable, not UTF-8 JSON, or not of the results schema.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(str(path), "", f"cannot read file ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(str(path), "", f"not UTF-8 text (byte {e.start})") from None
    try:
        blob = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ConfigError(str(path), "", f"not valid JSON: {e.msg} at line {e.lineno}") from None
    except (ValueError, RecursionError) as e:
        raise ConfigError(str(path), "", f"not valid JSON: {e}") from None
    return validate_results(blob, str(path))


def run_metadata(hardware: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What every results file records: fusekit's version, git commit, time, machine, torch.

    Args:
        hardware: the target the run measured on (``Target.to_dict()``), or a mapping of
            name -> target for several (modelled accelerators), if any.

    Returns:
        A JSON-ready mapping (the ``meta`` of :class:`Results`).
    """
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    meta: dict[str, Any] = {
        "fusekit": __version__,
        "commit": commit,
        "written": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}",
    }
    try:
        import torch  # not at import: the CLI loads fusekit.report at start-up

        meta["torch"] = torch.__version__
        meta["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    if hardware is not None:
        meta["hardware"] = dict(hardware)
    return meta


def _plain(value: object) -> object:
    """A numpy scalar as a Python number; anything else is an error."""
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"write_results: expected JSON data (got {type(value).__name__})")


def write_results(
    path: str | Path,
    *,
    benchmark: str,
    title: str,
    meta: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
    settings: Mapping[str, Any] | None = None,
    plots: Sequence[Plot] = (),
    tables: Sequence[Summary] = (),
    data: Mapping[str, Any] | None = None,
    indent: int | None = 2,
) -> Path:
    """Check a results file against the schema and write it atomically, creating its folder.

    Args:
        path: the file to write.
        benchmark: the script's name (``benchmarks/<benchmark>.py``).
        title: one line: what the benchmark compares.
        meta: :func:`run_metadata`'s mapping.
        records: the measurements, one mapping each.
        settings: the run's options and summary numbers.
        plots: the charts the report draws.
        tables: the compact tables the report shows.
        data: bulk data for other scripts (not rendered).
        indent: JSON indentation; None writes the most compact form (for bulk ``data``).

    Returns:
        The path written.

    Raises:
        ConfigError: the file would break the schema (a plot names a missing key, a NaN).
        TypeError: a value is not JSON data.
    """
    path = Path(path)
    blob: dict[str, Any] = {
        "schema": SCHEMA,
        "benchmark": benchmark,
        "title": title,
        "meta": dict(meta),
        "settings": dict(settings or {}),
        "plots": [p.model_dump(exclude_defaults=True) for p in plots],
        "tables": [t.model_dump(exclude_defaults=True) for t in tables],
        "records": [dict(r) for r in records],
    }
    if data is not None:
        blob["data"] = dict(data)
    blob = json.loads(json.dumps(blob, default=_plain))  # numpy scalars -> Python numbers
    validate_results(blob, str(path))
    separators = (",", ":") if indent is None else None
    text = json.dumps(blob, indent=indent, separators=separators, allow_nan=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path
