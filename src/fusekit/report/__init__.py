"""Reports: sections of text, tables and figures rendered into one self-contained HTML file.

Importing this package imports none of its modules: the names below load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusekit.lazy import lazy_getattr

if TYPE_CHECKING:
    from fusekit.report.document import Figure as Figure
    from fusekit.report.document import Section as Section
    from fusekit.report.document import Table as Table
    from fusekit.report.document import Text as Text
    from fusekit.report.html import render as render
    from fusekit.report.html import write_report as write_report

_WHERE = {
    "Figure": "document",
    "Section": "document",
    "Table": "document",
    "Text": "document",
    "render": "html",
    "write_report": "html",
}

__all__ = sorted(_WHERE)

__getattr__ = lazy_getattr(__name__, _WHERE)
