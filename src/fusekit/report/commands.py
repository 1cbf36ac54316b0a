"""``fusekit report``: render benchmark result files into a self-contained HTML report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fusekit.report.html import write_report
from fusekit.report.records import load_results, section_from_results

app = typer.Typer(
    help="Render result files (benchmarks/results/*.json) as an HTML report.", no_args_is_help=True
)


@app.callback()
def _group() -> None:
    """Keep `build` a subcommand even while it is the only one."""


@app.command()
def build(
    files: Annotated[list[Path], typer.Argument(help="Results JSON files.")],
    out: Annotated[Path, typer.Option(help="Folder for index.html.")] = Path("fusekit-report"),
    title: Annotated[str, typer.Option(help="Page title.")] = "fusekit results",
) -> None:
    """One section per file: its metadata, chart (if it names one) and table of records."""
    sections = []
    for file in files:
        meta, records = load_results(file)
        sections.append(section_from_results(file.stem, meta, records))
    print(f"report written to {write_report(sections, out, title=title)}")
