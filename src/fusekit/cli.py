"""The ``fusekit`` command.

Each part registers its own commands in ``fusekit/<part>/commands.py`` (a ``typer.Typer`` called
``app``); this module mounts the ones that exist and adds ``tour``. Errors that fusekit raises on
bad input are printed as one line on stderr, with exit status 2 and no traceback; set
``FUSEKIT_DEBUG=1`` for the traceback. Before any command runs, ``OMP_WAIT_POLICY`` is set to
``PASSIVE`` when unset (:func:`fusekit.threads.prefer_passive_wait`).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from fusekit import __version__, options
from fusekit.console import progress
from fusekit.errors import FusekitError
from fusekit.report.tour import TourOptions, available_sections, run_tour
from fusekit.threads import prefer_passive_wait

#: Command groups in help order; a part not built yet has no commands module and is absent.
GROUPS: tuple[str, ...] = ("hw", "ir", "gms", "nn", "stitch", "accel", "sparse", "report")

app = typer.Typer(
    help="fusekit: decide how to fuse, order and tile deep-learning computations, "
    "explain why, and run or simulate the result.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _mount_groups() -> None:
    for group in GROUPS:
        name = f"fusekit.{group}.commands"
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name in (name, f"fusekit.{group}"):  # the part is not built yet
                continue
            raise
        app.add_typer(module.app, name=group)


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress.")] = False,
) -> None:
    prefer_passive_wait()  # before a command loads torch or numba, whose OpenMP pools alternate
    debug = verbose or bool(os.environ.get("FUSEKIT_DEBUG"))
    logging.basicConfig(
        level=logging.INFO if debug else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )


@app.command()
def version() -> None:
    """Print fusekit's version."""
    print(__version__)


@app.command()
def tour(
    out: Annotated[Path, typer.Option(help="Folder for index.html.")] = Path("fusekit-report"),
    seed: Annotated[
        int, typer.Option(help="Seed of every random workload.", min=0, max=options.MAX_SEED)
    ] = 0,
    only: Annotated[
        list[str] | None,
        typer.Option(help="Build only this part's section (repeatable); default: every part."),
    ] = None,
) -> None:
    """Run every part that exists on small built-in defaults and write an HTML report."""
    parts = tuple(only or ())
    total = len(parts) or len(available_sections())
    with progress("tour", total=total) as bar:

        def on_section(part: str, index: int, _total: int) -> None:
            bar.update(0, completed=index, description=f"tour: {part}")  # type: ignore[arg-type]

        path = run_tour(out, TourOptions(seed=seed, parts=parts), on_section=on_section)
        bar.update(0, completed=total)  # type: ignore[arg-type]
    print(f"report written to {path}")


_mount_groups()


def _one_line(message: object) -> str:
    """``message`` on one line: a multi-line message (a user's exception) has its lines joined."""
    return " / ".join(line.strip() for line in str(message).splitlines() if line.strip())


def _usage_error(e: Exception) -> str:
    """A click usage error (unknown option, bad value, missing argument) as one line."""
    ctx = getattr(e, "ctx", None)
    where = f"{ctx.command_path}: " if ctx is not None else ""
    return f"{where}{e.format_message()}"  # type: ignore[attr-defined]


#: The base of click's errors; typer >= 0.2x vendors click, so it is found through typer.
_CLICK_ERROR: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"
)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``fusekit`` script.

    Every failure a user can cause ends as one line on stderr, ``error: ...``, with exit status
    2: usage errors (an unknown option, a missing argument, an option value out of range) and
    the errors fusekit raises on bad input or files. ``FUSEKIT_DEBUG=1`` shows the traceback.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).
    """
    try:
        code = app(args=argv, prog_name="fusekit", standalone_mode=False)
    except _CLICK_ERROR as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # the help is printed already
            sys.exit(2)
        if os.environ.get("FUSEKIT_DEBUG"):
            raise
        print(f"error: {_one_line(_usage_error(e))}", file=sys.stderr)
        sys.exit(2)
    except typer.Abort:
        print("error: aborted", file=sys.stderr)
        sys.exit(1)
    except (FusekitError, ValueError, TypeError, KeyError, OSError) as e:
        if os.environ.get("FUSEKIT_DEBUG"):
            raise
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"error: {_one_line(message)}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)
