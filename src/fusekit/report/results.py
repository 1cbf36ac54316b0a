"""One benchmark's results file as a report section.

The section reads, top to bottom: what the benchmark compares, the machine it ran on, its
charts, its compact tables (one row per group of records, medians by default), the run's
settings and summary numbers, and every record in a folded table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fusekit.console import si
from fusekit.report.charts import STATS, bar_chart, line_chart
from fusekit.report.document import Block, Figure, Section, Table, Text
from fusekit.report.html import MAX_VISIBLE_ROWS
from fusekit.report.records import Meta, Plot, Results, Summary, is_number, select


def _target_text(target: Mapping[str, Any]) -> str:
    """One target's description and headline numbers."""
    facts = []
    peak = target.get("peak_flops_per_s")
    if isinstance(peak, Mapping):
        facts += [f"{si(v, 'FLOP/s')} {k}" for k, v in peak.items() if is_number(v)]
    if is_number(target.get("mem_bw_bytes_per_s")):
        facts.append(f"{si(target['mem_bw_bytes_per_s'], 'B/s')} memory")
    if is_number(target.get("cores")):
        facts.append(f"{target['cores']} cores")
    if is_number(target.get("mesh_rows")) and is_number(target.get("mesh_cols")):
        facts.append(f"{target['mesh_rows']}x{target['mesh_cols']} clusters")  # older records
    if is_number(target.get("macs_per_cycle")):
        facts.append(f"{target['macs_per_cycle']:,} MACs/cycle")
    if is_number(target.get("clock_hz")):
        facts.append(f"{si(target['clock_hz'], 'Hz')} clock")
    name = str(target.get("description") or target.get("name") or "unnamed target")
    return f"{name} ({', '.join(facts)})" if facts else name


def machine_text(meta: Meta) -> str:
    """The machine record of a results file as one sentence."""
    parts = [f"Ran on {meta.machine}"]
    hardware = meta.hardware or {}
    if "kind" in hardware:
        parts.append(f"{hardware.get('kind')} target {_target_text(hardware)}")
    elif hardware:
        modelled = [_target_text(t) for t in hardware.values() if isinstance(t, Mapping)]
        parts.append("modelled targets: " + "; ".join(modelled))
    if meta.torch:
        threads = f" on {meta.torch_threads} threads" if meta.torch_threads else ""
        parts.append(f"torch {meta.torch}{threads}")
    parts.append(f"fusekit {meta.fusekit} at commit {meta.commit[:10]}, written {meta.written}")
    return "; ".join(parts) + "."


def _flatten(settings: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            rows += _flatten(value, f"{name}.")
        else:
            rows.append((name, value))
    return rows


def _summarise(values: list[Any], stat: str) -> Any:
    """One cell: a statistic of numbers, a count of true booleans, or the common string."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    if all(isinstance(v, bool) for v in present):
        return f"{sum(present)} of {len(present)}"
    numbers = [float(v) for v in present if is_number(v)]
    if len(numbers) == len(present):
        return STATS[stat](numbers) if len(numbers) > 1 else present[0]
    distinct = list(dict.fromkeys(str(v) for v in present))
    return distinct[0] if len(distinct) == 1 else f"{len(distinct)} values"


def summary_table(spec: Summary, records: Sequence[Mapping[str, Any]]) -> Table:
    """The compact table a :class:`Summary` asks for.

    Args:
        spec: the rows, values, statistics and selection.
        records: every record of the file.

    Returns:
        One row per group of ``spec.rows`` values, in first-seen order.
    """
    chosen = select(records, spec.where)
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for record in chosen:
        groups.setdefault(tuple(record.get(k) for k in spec.rows), []).append(record)
    if spec.across is not None:
        across = list(dict.fromkeys(r.get(spec.across) for r in chosen))
        value, stat = spec.values[0], spec.stats[0]
        cells = [
            [[r for r in g if r.get(spec.across) == a] for a in across] for g in groups.values()
        ]
        columns = [*spec.rows, *(f"{spec.across}={a}" for a in across)]
        rows = [
            (*key, *(_summarise([r.get(value) for r in cell], stat) for cell in row))
            for key, row in zip(groups, cells, strict=True)
        ]
        several = any(len(cell) > 1 for row in cells for cell in row)
        note = f"cells: {value}" + (f", {stat} of the records" if several else "")
    else:
        several = any(len(g) > 1 for g in groups.values())
        numeric = {v: any(is_number(r.get(v)) for r in chosen) for v in spec.values}
        pairs = [(v, s) for v in spec.values for s in (spec.stats if numeric[v] else ["median"])]
        named = len(spec.stats) > 1
        columns = [*spec.rows, *(["records"] if several else [])]
        columns += [f"{s} {v}" if named and numeric[v] else v for v, s in pairs]
        rows = [
            (*key, *([len(g)] if several else []),
             *(_summarise([r.get(v) for r in g], s) for v, s in pairs))
            for key, g in groups.items()
        ]  # fmt: skip
        averaged = several and not named and any(numeric.values())
        note = f"numbers: {spec.stats[0]} of each group's records" if averaged else ""
    note = "; ".join(n for n in (spec.note, note) if n)
    return Table(spec.title, tuple(columns), tuple(tuple(r) for r in rows), note=note)


def chart(spec: Plot, records: Sequence[Mapping[str, Any]]) -> Figure:
    """The figure a :class:`Plot` asks for, over the records it selects."""
    draw = line_chart if spec.kind == "line" else bar_chart
    return draw(
        spec.title,
        select(records, spec.where),
        spec.x,
        spec.ys,
        spec.hues or None,
        log_y=spec.log_y,
        stat=spec.stat,
        ref=spec.ref,
        label=spec.label,
    )


def section_from_results(results: Results, source: str | Path) -> Section:
    """A report section for one results file.

    Args:
        results: the checked file (:func:`fusekit.report.records.load_results`).
        source: the file's path; its name titles the section.

    Returns:
        The section: machine, charts, compact tables, settings, and every record folded.
    """
    records = results.records
    blocks: list[Block] = [Text(machine_text(results.meta))]
    blocks += [chart(p, records) for p in results.plots]
    blocks += [summary_table(t, records) for t in results.tables]
    full = Table.from_records(f"All {len(records)} records", records, collapsed=True)
    if not results.tables and len(records) <= MAX_VISIBLE_ROWS:
        full = Table.from_records(f"{len(records)} records", records)
    settings = _flatten(results.settings)
    if settings:
        blocks.append(
            Table("Settings and summary numbers", ("setting", "value"), tuple(settings),
                  collapsed=len(settings) > 12)
        )  # fmt: skip
    blocks.append(full)
    name = Path(source).name
    summary = results.title
    if results.data is not None:
        summary += f" The file also holds data for other scripts ({', '.join(results.data)})."
    return Section(
        title=f"{results.benchmark} ({name})",
        summary=summary,
        blocks=tuple(blocks),
        records=tuple(records),
    )
