"""``fusekit report``: render benchmark result files into a self-contained HTML report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fusekit.errors import FusekitError
from fusekit.report.document import Section
from fusekit.report.html import write_report
from fusekit.report.records import load_results
from fusekit.report.results import section_from_results

app = typer.Typer(
    help="Render result files (benchmarks/results/*.json) as an HTML report.", no_args_is_help=True
)


@app.callback()
def _group() -> None:
    """Keep `build` a subcommand even while it is the only one."""


def build_sections(files: list[Path]) -> tuple[list[Section], list[str]]:
    """One section per readable results file, and one warning line per file left out.

    Args:
        files: the results files, in report order.

    Returns:
        ``(sections, warnings)``; a file that cannot be read or rendered gives a warning
        naming it instead of a section, and the others are still built.
    """
    sections, warnings = [], []
    for file in files:
        try:
            sections.append(section_from_results(load_results(file), file))
        except (FusekitError, ValueError, TypeError, KeyError) as e:
            text = str(e) if str(e).startswith(str(file)) else f"{file}: {e}"
            warnings.append(f"warning: {text.splitlines()[0] if text else file}; skipped")
    return sections, warnings


@app.command()
def build(
    files: Annotated[list[Path], typer.Argument(help="Results JSON files.")],
    out: Annotated[Path, typer.Option(help="Folder for index.html.")] = Path("fusekit-report"),
    title: Annotated[str, typer.Option(help="Page title.")] = "fusekit results",
) -> None:
    """One section per results file: the machine it ran on, its charts and compact tables.

    A file that cannot be read is named in one warning line on stderr and left out; the
    command fails (exit status 2) only when no file can be read.
    """
    sections, warnings = build_sections(files)
    for line in warnings:
        typer.echo(line, err=True)
    if not sections:
        raise FusekitError(f"report build: none of the {len(files)} results files could be read")
    print(f"report written to {write_report(sections, out, title=title)}")
