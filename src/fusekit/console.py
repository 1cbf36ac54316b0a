"""Terminal output shared by every part's commands: tables, JSON, progress and units.

Library code logs; only command modules (``fusekit/<part>/commands.py``) print, through these.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

console = Console()
err_console = Console(stderr=True)


def print_json(data: Any) -> None:
    """Print machine-readable JSON to stdout (no colour, no wrapping)."""
    print(json.dumps(data, indent=2, default=str))


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print a rich table; cells are turned to text with :func:`fmt`."""
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(fmt(cell) for cell in row))
    console.print(table)


@contextmanager
def progress(description: str, total: int | None) -> Iterator[Progress]:
    """A progress bar on stderr for work longer than about 2 s.

    Yields:
        The rich Progress; the caller advances task 0.
    """
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    )
    with bar:
        bar.add_task(description, total=total)
        yield bar


_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_BINARY = ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))


def si(value: float, unit: str) -> str:
    """``si(4.8e12, "B/s") == "4.8 TB/s"``: decimal prefixes, three significant digits."""
    for scale, prefix in _SI:
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    if 0 < abs(value) < 1e-3:
        return f"{value * 1e6:.3g} µ{unit}"
    if 0 < abs(value) < 1:
        return f"{value * 1e3:.3g} m{unit}"
    return f"{value:.3g} {unit}"


def binary_bytes(value: int) -> str:
    """``binary_bytes(229376) == "224 KiB"``: sizes of caches and buffers."""
    for scale, unit in _BINARY:
        if value >= scale:
            return f"{value / scale:.4g} {unit}"
    return f"{value} B"


def fmt(cell: Any) -> str:
    """A table cell as text: floats to four significant digits, the rest with ``str``."""
    if isinstance(cell, float):
        if math.isnan(cell):
            return "-"
        return f"{cell:.4g}"
    return str(cell)
