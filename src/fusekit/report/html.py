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
import tempfile
from collections.abc import Sequence
from pathlib import Path

from fusekit import __version__
from fusekit.console import fmt
from fusekit.report.document import Block, Figure, Section, Table, Text

_CSS = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em;
       color: #1b1b1b; line-height: 1.45; }
h1 { border-bottom: 2px solid #333; padding-bottom: .2em; }
h2 { margin-top: 2em; border-bottom: 1px solid #bbb; }
nav ul { columns: 2; }
table { border-collapse: collapse; margin: .6em 0 1.4em; font-size: .92em; }
caption { text-align: left; font-weight: 600; padding: .3em 0; }
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


def _render_block(block: Block) -> str:
    if isinstance(block, Text):
        return f"<p>{_esc(block.body)}</p>"
    if isinstance(block, Table):
        head = "".join(f"<th>{_esc(c)}</th>" for c in block.columns)
        body = "".join(
            "<tr>"
            + "".join(
                f'<td class="num">{_esc(fmt(cell))}</td>'
                if isinstance(cell, int | float) and not isinstance(cell, bool)
                else f"<td>{_esc(cell)}</td>"
                for cell in row
            )
            + "</tr>"
            for row in block.rows
        )
        note = f'<p class="note">{_esc(block.note)}</p>' if block.note else ""
        return (
            f"<table><caption>{_esc(block.title)}</caption><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>{note}"
        )
    if isinstance(block, Figure):
        data = base64.b64encode(block.png).decode("ascii")
        caption = f"<figcaption>{_esc(block.caption)}</figcaption>" if block.caption else ""
        return (
            f'<figure><img alt="{_esc(block.title)}" src="data:image/png;base64,{data}">'
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
