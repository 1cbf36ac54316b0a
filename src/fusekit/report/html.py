"""Render sections into one self-contained HTML file: inline CSS, figures as base64 PNG.

The file opens from disk with no network and no other files, so it can be attached to an issue
or a CI artefact as it is.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import os
import platform
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

from fusekit import __version__
from fusekit.report.document import Block, Figure, Section, Table, Text

#: Tables longer than this render folded (``<details>``), opened on demand.
MAX_VISIBLE_ROWS = 30

_CSS = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em;
       color: #1b1b1b; line-height: 1.45; }
h1 { border-bottom: 2px solid #333; padding-bottom: .2em; }
h2 { margin-top: 2em; border-bottom: 1px solid #bbb; }
nav ul { columns: 2; }
table { border-collapse: collapse; margin: .2em 0 1.4em; font-size: .92em; }
.wide { overflow-x: auto; max-width: 100%; }
.tabletitle, .figtitle { font-weight: 600; padding: .3em 0; margin-top: 1em; }
details { margin: .6em 0 1.2em; }
summary { cursor: pointer; font-weight: 600; }
th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f1f1f1; }
figure { margin: 1em 0 1.6em; }
figure img { max-width: 100%; }
figcaption, .note { color: #555; font-size: .9em; }
footer { margin-top: 3em; color: #777; font-size: .85em; }
"""


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def cell_text(cell: object) -> str:
    """A table cell as text: four significant digits, thousands separated; null as a dash.

    Lists show their items, or for more than four numbers their count and median.
    """
    if cell is None:
        return "\u2013"
    if isinstance(cell, bool) or isinstance(cell, str):
        return str(cell)
    if isinstance(cell, int):
        return f"{cell:,}"
    if isinstance(cell, float):
        if cell != cell:
            return "\u2013"
        if cell.is_integer() and abs(cell) < 1e15:
            return f"{cell:,.0f}"
        if 1e4 <= abs(cell) < 1e15:
            return f"{cell:,.0f}"
        return f"{cell:.4g}"
    if isinstance(cell, list | tuple):
        numbers = [v for v in cell if isinstance(v, int | float) and not isinstance(v, bool)]
        if len(cell) > 4 and len(numbers) == len(cell):
            return f"{len(cell)} values, median {cell_text(statistics.median(numbers))}"
        return ", ".join(cell_text(v) for v in cell)
    return str(cell)


def _numeric(cell: object) -> bool:
    return isinstance(cell, int | float) and not isinstance(cell, bool)


def _render_table(block: Table) -> str:
    # long key names may break after an underscore or a slash, so that headers wrap
    head = "".join(
        f"<th>{_esc(c).replace('_', '_<wbr>').replace('/', '/<wbr>')}</th>" for c in block.columns
    )
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{_esc(cell_text(cell))}</td>'
            if _numeric(cell)
            else f"<td>{_esc(cell_text(cell))}</td>"
            for cell in row
        )
        + "</tr>"
        for row in block.rows
    )
    note = f'<p class="note">{_esc(block.note)}</p>' if block.note else ""
    if block.collapsed or len(block.rows) > MAX_VISIBLE_ROWS:
        return (
            f"<details><summary>{_esc(block.title)} ({len(block.rows)} rows)</summary>"
            f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>'
            f"</table></div>{note}</details>"
        )
    return (
        f'<div class="tabletitle">{_esc(block.title)}</div><div class="wide"><table><thead>'
        f"<tr>{head}</tr></thead><tbody>{body}</tbody></table></div>{note}"
    )


def _render_block(block: Block) -> str:
    if isinstance(block, Text):
        return f"<p>{_esc(block.body)}</p>"
    if isinstance(block, Table):
        return _render_table(block)
    if isinstance(block, Figure):
        data = base64.b64encode(block.png).decode("ascii")
        caption = f"<figcaption>{_esc(block.caption)}</figcaption>" if block.caption else ""
        return (
            f'<figure><div class="figtitle">{_esc(block.title)}</div>'
            f'<img alt="{_esc(block.title)}" src="data:image/png;base64,{data}">'
            f"{caption}</figure>"
        )
    raise TypeError(f"report: expected 'block' to be Text, Table or Figure (got {type(block)})")


def _anchor(index: int) -> str:
    return f"s{index}"


def render(sections: Sequence[Section], title: str) -> str:
    """The HTML text of a report.

    Args:
        sections: the chapters, in order.
        title: the page title.

    Returns:
        A complete HTML document with a table of contents and a footer recording the machine,
        fusekit's version and the time of writing.
    """
    toc = "".join(
        f'<li><a href="#{_anchor(i)}">{_esc(s.title)}</a></li>' for i, s in enumerate(sections)
    )
    body = []
    for i, section in enumerate(sections):
        body.append(f'<section id="{_anchor(i)}"><h2>{_esc(section.title)}</h2>')
        if section.summary:
            body.append(f"<p>{_esc(section.summary)}</p>")
        body.extend(_render_block(block) for block in section.blocks)
        body.append("</section>")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{platform.node()} · {platform.machine()} · {os.cpu_count()} CPUs"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_esc(title)}</h1><nav><ul>{toc}</ul></nav>{''.join(body)}"
        f"<footer>fusekit {__version__} · {_esc(machine)} · written {stamp}</footer>"
        "</body></html>\n"
    )


def write_report(sections: Sequence[Section], out_dir: Path, title: str = "fusekit report") -> Path:
    """Write ``index.html`` into ``out_dir`` atomically.

    Args:
        sections: the chapters, in order.
        out_dir: the folder (created if missing).
        title: the page title.

    Returns:
        The path of ``index.html``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "index.html"
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".index-", suffix=".html")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(render(sections, title))
    os.chmod(tmp, 0o644)  # mkstemp makes the file private; a report is for reading
    os.replace(tmp, path)
    return path
