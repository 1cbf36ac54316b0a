"""`fusekit tour`: run every part that exists on small built-in defaults and write one report.

Each part contributes a section through a module ``fusekit.report.sections.<part>`` that defines
``build(options: TourOptions) -> Section``. A part that is not built yet has no such module and is
simply absent from the report.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fusekit.errors import FusekitError, expected
from fusekit.report.document import Section, Text
from fusekit.report.html import write_report
from fusekit.threads import prefer_passive_wait

log = logging.getLogger(__name__)

#: Report order of the parts; each may or may not have a section module yet.
PARTS: tuple[str, ...] = ("hw", "ir", "gms", "nn", "networks", "stitch", "accel", "sparse")


@dataclass(frozen=True, slots=True)
class TourOptions:
    """Knobs every tour section understands.

    Attributes:
        seed: seed for every random workload, so that two tours give the same problems.
        quick: keep each section to a few seconds on a laptop CPU.
        parts: the parts whose sections to build, in report order; empty: every part.
    """

    seed: int = 0
    quick: bool = True
    parts: tuple[str, ...] = ()


SectionBuilder = Callable[[TourOptions], Section]


def available_sections() -> list[tuple[str, SectionBuilder]]:
    """The section builders of the parts that exist, in report order.

    Returns:
        ``(part, build)`` pairs; parts without a section module are left out.
    """
    found = []
    for part in PARTS:
        name = f"fusekit.report.sections.{part}"
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue
            raise
        found.append((part, module.build))
    return found


def run_tour(
    out_dir: Path,
    options: TourOptions | None = None,
    on_section: Callable[[str, int, int], None] | None = None,
) -> Path:
    """Build every available section and write the HTML report.

    Args:
        out_dir: folder that receives ``index.html`` (created if missing).
        options: tour knobs; defaults to :class:`TourOptions()`.
        on_section: called as ``on_section(part, index, total)`` before each section, for
            progress display.

    Returns:
        The path of the written ``index.html``.

    Raises:
        FusekitError: if ``options.parts`` names a part without a section.
    """
    options = options or TourOptions()
    builders = available_sections()
    if options.parts:
        known = [part for part, _ in builders]
        unknown = [p for p in options.parts if p not in known]
        if unknown:
            raise FusekitError(expected("tour", "parts", f"among {known}", unknown))
        builders = [(part, build) for part, build in builders if part in options.parts]
    prefer_passive_wait()  # numba's and torch's pools alternate (stitch): before either starts
    sections: list[Section] = []
    for i, (part, build) in enumerate(builders):
        if on_section is not None:
            on_section(part, i, len(builders))
        start = time.perf_counter()
        section = build(options)
        elapsed_s = time.perf_counter() - start
        log.info("tour section %s took %.2f s", part, elapsed_s)
        sections.append(
            Section(
                title=section.title,
                summary=section.summary,
                blocks=(*section.blocks, Text(f"Section built in {elapsed_s:.2f} s.")),
                records=section.records,
            )
        )
    return write_report(sections, out_dir, title="fusekit tour")
