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
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

console = Console()
err_console = Console(stderr=True)
#: Wide enough for any table: ``--wide`` output is never wrapped or folded.
WIDE_COLUMNS = 10_000


def print_json(data: Any) -> None:
    """Print machine-readable JSON to stdout (no colour, no wrapping)."""
    print(json.dumps(data, indent=2, default=str))


def print_table(
    title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], *, wide: bool = False
) -> None:
    """Print a rich table; cells are turned to text with :func:`fmt`.

    The table fits the terminal (80 columns when stdout is not one): cells wrap at spaces and
    fold inside long words, so nothing is cut. ``wide`` prints every cell on one line instead,
    however long the lines get (the ``--wide`` flag of the commands).
    """
    table = Table(title=Text(title), title_justify="left")
    for column in columns:
        table.add_column(Text(column), overflow="fold", no_wrap=wide)
    for row in rows:
        table.add_row(*(Text(fmt(cell)) for cell in row))
    if wide:
        Console(width=WIDE_COLUMNS).print(table, crop=False)
    else:
        console.print(table)


def print_text(text: str, *, wide: bool = False) -> None:
    """Print plain text to stdout, wrapped at spaces to the terminal's width unless ``wide``."""
    if wide:
        print(text)
    else:
        console.print(text, markup=False, highlight=False, overflow="fold")


class _Count(ProgressColumn):
    """``done/total``, or ``done`` while the total is not known yet (never ``0/None``)."""

    def render(self, task: Task) -> Text:
        done = int(task.completed)
        return Text(f"{done}/{int(task.total)}" if task.total is not None else f"{done}")


@contextmanager
def progress(description: str, total: int | None) -> Iterator[Progress]:
    """A progress bar on stderr for work longer than about 2 s.

    With ``total=None`` the bar pulses until the caller sets a total. Nothing is drawn when
    stderr is not a terminal, so that logs and the one-line errors of the CLI stay clean.

    Yields:
        The rich Progress; the caller advances task 0.
    """
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        _Count(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=not err_console.is_terminal,
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
