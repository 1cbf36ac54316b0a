"""Result records → report sections: the long-format JSON the benchmarks write.

A results file is ``{"meta": {...}, "records": [{...}, ...]}``: ``meta`` records the hardware,
fusekit's version, the git commit and the time; each record is one measurement. An optional
``meta["plot"] = {"x": ..., "y": ..., "hue": ...}`` names the columns of a bar chart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fusekit.errors import ConfigError
from fusekit.report.document import Block, Figure, Record, Section, Table, Text


def bar_chart(
    title: str,
    records: Sequence[Record],
    x: str,
    y: str,
    hue: str | None = None,
    log_y: bool = False,
) -> Figure:
    """Grouped bar chart of ``y`` per ``x``, one bar colour per ``hue`` value.

    Args:
        title: the figure's heading.
        records: long-format rows holding the ``x``, ``y`` (numeric) and ``hue`` keys.
        x: the key along the horizontal axis.
        y: the numeric key plotted.
        hue: the key that splits bars within a group, if any.
        log_y: use a logarithmic vertical axis.

    Returns:
        The rendered figure.

    Raises:
        ValueError: a record lacks ``x`` or ``y``, or ``y`` is not a number.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for i, record in enumerate(records):
        if x not in record or not isinstance(record.get(y), int | float):
            raise ValueError(
                f"bar_chart: expected record {i} to have '{x}' and a numeric '{y}' "
                f"(got keys {sorted(record)})"
            )
    xs = list(dict.fromkeys(str(r[x]) for r in records))
    hues = list(dict.fromkeys(str(r.get(hue, "")) for r in records)) if hue else [""]
    width = 0.8 / len(hues)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(xs) * max(1, len(hues) / 2)), 3.4))
    for j, h in enumerate(hues):
        values = {str(r[x]): float(r[y]) for r in records if not hue or str(r.get(hue, "")) == h}
        positions = [i + (j - (len(hues) - 1) / 2) * width for i in range(len(xs))]
        heights = [values.get(v, 0.0) for v in xs]
        ax.bar(positions, heights, width=width, label=h or None)
    ax.set_xticks(range(len(xs)), xs, rotation=30 if len(xs) > 5 else 0, ha="right")
    ax.set_ylabel(y)
    if log_y:
        ax.set_yscale("log")
    if hue:
        ax.legend(title=hue, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return Figure.from_matplotlib(title, fig)


def section_from_results(title: str, meta: Mapping[str, Any], records: Sequence[Record]) -> Section:
    """A section holding a results file's records as a table, plus its chart if ``meta`` asks.

    Args:
        title: the section's heading.
        meta: the file's ``meta`` mapping (hardware, version, commit, time, optional ``plot``).
        records: the measurements.

    Returns:
        The section.
    """
    blocks: list[Block] = []
    described = {k: v for k, v in meta.items() if k != "plot"}
    if described:
        blocks.append(Text("; ".join(f"{k}: {v}" for k, v in described.items())))
    plot = meta.get("plot")
    if isinstance(plot, Mapping) and "x" in plot and "y" in plot:
        blocks.append(
            bar_chart(
                title,
                records,
                str(plot["x"]),
                str(plot["y"]),
                plot.get("hue"),
                bool(plot.get("log_y", False)),
            )
        )
    blocks.append(Table.from_records(f"{title}: {len(records)} records", records))
    return Section(title=title, summary="", blocks=tuple(blocks), records=tuple(records))


def load_results(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Read a results JSON file.

    Returns:
        ``(meta, records)``.

    Raises:
        ConfigError: the file is unreadable, not JSON, or not of the results form.
    """
    path = Path(path)
    try:
        blob = json.loads(path.read_text())
    except OSError as e:
        raise ConfigError(str(path), "", f"cannot read file ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(str(path), "", f"not valid JSON: {e.msg} at line {e.lineno}") from None
    if not isinstance(blob, dict) or not isinstance(blob.get("records"), list):
        raise ConfigError(str(path), "records", "expected a list of records under 'records'")
    if not all(isinstance(r, dict) for r in blob["records"]):
        raise ConfigError(str(path), "records", "expected every record to be a JSON object")
    meta = blob.get("meta", {})
    if not isinstance(meta, dict):
        raise ConfigError(str(path), "meta", f"expected an object (got {type(meta).__name__})")
    return meta, blob["records"]


def run_metadata(hardware: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What every results file records: fusekit's version, git commit, time, machine, torch.

    Args:
        hardware: the target the run measured on (``Target.to_dict()``), if any.

    Returns:
        A JSON-ready mapping.
    """
    import datetime as dt
    import os
    import platform
    import subprocess

    from fusekit import __version__

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
        import torch

        meta["torch"] = torch.__version__
        meta["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    if hardware is not None:
        meta["hardware"] = dict(hardware)
    return meta


def write_results(path: str | Path, records: Sequence[Record], meta: Mapping[str, Any]) -> Path:
    """Write a results file (``{"meta": ..., "records": [...]}``), creating its folder.

    Returns:
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"meta": dict(meta), "records": list(records)}, indent=2, default=str) + "\n"
    )
    return path
