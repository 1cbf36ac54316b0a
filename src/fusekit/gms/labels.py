"""Labels of strategies and tuning points for tables that fit 80 columns.

``fusekit gms run/tune/explain`` print strategy names short (``tf/(GM)seg-S`` for
``transform-first/(GM)seg-S``) with :data:`LEGEND` under the table, and a point's knobs as
``key=value`` text instead of its JSON key; ``--wide`` prints the full names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Short spellings of the orders that prefix a strategy's name.
ORDER_ABBREVIATIONS: dict[str, str] = {"transform-first": "tf", "aggregate-first": "af"}
#: The line printed under a table that uses the short spellings.
LEGEND = "tf: transform-first, af: aggregate-first (--wide: full names)"
#: Short names of the CPU knobs (the Triton knobs are short already); "" shows the value alone.
KNOB_ABBREVIATIONS: dict[str, str] = {
    "tile_rows": "tile",
    "blocks_per_thread": "blk/thr",
    "schedule": "",
    "threads": "thr",
    "chunk": "",
}


def strategy_label(name: str, wide: bool = False) -> str:
    """``"tf/(GM)seg-S"`` for ``"transform-first/(GM)seg-S"`` (unchanged when ``wide``)."""
    order, slash, dataflow = name.partition("/")
    if wide or not slash or order not in ORDER_ABBREVIATIONS:
        return name
    return f"{ORDER_ABBREVIATIONS[order]}/{dataflow}"


def point_label(point: Mapping[str, Any], wide: bool = False) -> str:
    """A point's knobs other than its strategy as ``key=value`` text.

    E.g. ``"tile=256 blk/thr=1 pad thr=2 static"`` for a CPU point (the schedule: pad or pack
    the segments; static or dynamic chunks), ``"tile_rows=256 blocks_per_thread=1
    schedule=pad threads=2 chunk=0"`` with ``wide``.
    """
    parts = []
    for key, value in point.items():
        if key == "strategy":
            continue
        if wide:
            parts.append(f"{key}={value}")
            continue
        if key == "chunk" and value in (0, 1):
            value = "dynamic" if value else "static"
        name = KNOB_ABBREVIATIONS.get(key, key)
        parts.append(f"{name}={value}" if name else str(value))
    return " ".join(parts)
