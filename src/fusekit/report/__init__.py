"""Reports: sections of text, tables and figures rendered into one self-contained HTML file."""

from fusekit.report.document import Figure as Figure
from fusekit.report.document import Section as Section
from fusekit.report.document import Table as Table
from fusekit.report.document import Text as Text
from fusekit.report.html import render as render
from fusekit.report.html import write_report as write_report

__all__ = ["Figure", "Section", "Table", "Text", "render", "write_report"]
