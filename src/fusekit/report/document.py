"""The pieces a report is made of: sections holding text, tables and figures.

A part's tour section (``fusekit/report/sections/<part>.py``) builds a :class:`Section` from its
result records; :func:`fusekit.report.html.write_report` renders a list of sections into one
self-contained HTML file. Records are plain dicts in long format (one row per measurement), the
same rows the benchmarks write to JSON.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure as MplFigure

Record = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Text:
    """A paragraph of plain text (no markup is interpreted)."""

    body: str


@dataclass(frozen=True, slots=True)
class Table:
    """A table: column names and rows of cells (numbers are formatted when rendered).

    A table longer than the report shows at once, or one marked ``collapsed``, renders folded
    under its title (an HTML ``<details>``), to be opened on demand.
    """

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    note: str = ""
    collapsed: bool = False

    def __post_init__(self) -> None:
        for i, row in enumerate(self.rows):
            if len(row) != len(self.columns):
                raise ValueError(
                    f"Table {self.title!r}: expected row {i} to have {len(self.columns)} cells "
                    f"(got {len(row)})"
                )

    @classmethod
    def from_records(
        cls,
        title: str,
        records: Sequence[Record],
        columns: Sequence[str] | None = None,
        note: str = "",
        collapsed: bool = False,
    ) -> Table:
        """Build a table from long-format records.

        Args:
            title: the table's caption.
            records: one dict per row.
            columns: the keys to show, in order; by default every key, in first-seen order.
            note: a line printed under the table.
            collapsed: fold the table under its title.

        Returns:
            The table; a key missing from a record renders as an empty cell.
        """
        if columns is None:
            seen: dict[str, None] = {}
            for record in records:
                seen.update(dict.fromkeys(record))
            columns = list(seen)
        rows = tuple(tuple(record.get(c, "") for c in columns) for record in records)
        return cls(title=title, columns=tuple(columns), rows=rows, note=note, collapsed=collapsed)


@dataclass(frozen=True, slots=True)
class Figure:
    """A plot, stored as PNG bytes so that the report embeds it."""

    title: str
    png: bytes
    caption: str = ""

    @classmethod
    def from_matplotlib(cls, title: str, fig: MplFigure, caption: str = "") -> Figure:
        """Render a matplotlib figure to PNG and close it.

        Args:
            title: the figure's heading in the report.
            fig: the matplotlib figure (closed after rendering).
            caption: a line printed under the figure.

        Returns:
            The figure with its PNG bytes.
        """
        import matplotlib.pyplot as plt  # not at import: the CLI loads fusekit.report at start-up

        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        return cls(title=title, png=buf.getvalue(), caption=caption)


Block = Text | Table | Figure


@dataclass(frozen=True, slots=True)
class Section:
    """One part's chapter of the report, with the records it was built from."""

    title: str
    summary: str
    blocks: tuple[Block, ...]
    records: tuple[Record, ...] = field(default=())
