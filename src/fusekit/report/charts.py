"""Charts of long-format records: grouped bars and lines, laid out to stay readable.

Bars turn horizontal when the category labels are long or many, so that no label overlaps
another; legends list only the series that have a point and sit beside the axes, not on the
data; several records of one category and series combine by a statistic (median by default).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fusekit.report.document import Figure, Record

if TYPE_CHECKING:
    from matplotlib.axes import Axes

STATS: dict[str, Callable[[list[float]], float]] = {
    "median": statistics.median,
    "mean": statistics.fmean,
    "min": min,
    "max": max,
}

#: Horizontal bars past this many categories or bars, or labels longer than this many characters.
_MAX_UPRIGHT_CATEGORIES = 12
_MAX_UPRIGHT_BARS = 36
_MAX_UPRIGHT_LABEL = 18


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (files only, no display)."""
    # matplotlib loads when a chart is drawn, not at CLI start-up (which imports fusekit.report)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def collect(
    where: str,
    records: Sequence[Record],
    x: str,
    ys: Sequence[str],
    hues: Sequence[str] = (),
    stat: str = "median",
) -> tuple[list[Any], dict[str, dict[Any, float]], bool]:
    """Group records into series of points: ``series -> x value -> stat of y``.

    Args:
        where: the caller's name, for messages.
        records: long-format rows.
        x: the key of the category or abscissa.
        ys: the numeric keys; several make one series each.
        hues: keys whose joined values name the series (with one ``y``).
        stat: ``median``, ``mean``, ``min`` or ``max``.

    Returns:
        The x values in first-seen order (those with a point), and the series in first-seen
        order, each holding only the x values where it has a point; and whether some point
        combines several records.

    Raises:
        ValueError: a record lacks ``x``, a ``y`` is neither a number nor null, or no record
            has a number under any ``y``.
    """
    if stat not in STATS:
        raise ValueError(f"{where}: expected 'stat' to be one of {sorted(STATS)} (got {stat!r})")
    cells: dict[str, dict[Any, list[float]]] = {}
    xs: dict[Any, None] = {}
    for i, record in enumerate(records):
        if x not in record:
            raise ValueError(
                f"{where}: expected record {i} to have '{x}' (got keys {sorted(record)})"
            )
        for y in ys:
            value = record.get(y)
            if value is None:
                continue
            if not _number(value):
                raise ValueError(f"{where}: expected record {i}'s '{y}' to be a number or null "
                                 f"(got {value!r})")  # fmt: skip
            name = y if len(ys) > 1 else " / ".join(str(record.get(h, "")) for h in hues)
            xs.setdefault(record[x])
            cells.setdefault(name, {}).setdefault(record[x], []).append(float(value))
    if not cells:
        keys = sorted({k for r in records for k in r})
        raise ValueError(
            f"{where}: expected a record with a numeric {' or '.join(map(repr, ys))} "
            f"(got keys {keys})"
        )
    combine = STATS[stat]
    series = {name: {k: combine(v) for k, v in points.items()} for name, points in cells.items()}
    combined = any(len(v) > 1 for points in cells.values() for v in points.values())
    return list(xs), series, combined


def _legend(ax: Axes, title: str | None) -> None:
    ax.legend(title=title, fontsize=8, title_fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)  # fmt: skip


def _value_label(ys: Sequence[str], stat: str, combined: bool) -> str:
    label = ys[0] if len(ys) == 1 else "value"
    return f"{label}, {stat}" if combined else label


def _short(value: float) -> str:
    """A bar's label: three significant digits, with k, M, G for thousands and beyond."""
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{prefix}"
    return f"{value:.3g}"


def _wide_range(values: Sequence[float]) -> bool:
    """Whether a log axis helps: positive values spanning a factor of 3 or more."""
    return min(values) > 0 and max(values) >= 3 * min(values)


def _log_scale(axis: Any) -> None:
    """A logarithmic axis labelled in plain numbers (0.5, 1, 2, 50M), not powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # see pyplot

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: _short(v)))
    axis.set_minor_formatter(NullFormatter())


def _keys(key: str | Sequence[str] | None) -> tuple[str, ...]:
    """One key, several, or none, as a tuple."""
    return () if key is None else ((key,) if isinstance(key, str) else tuple(key))


def bar_chart(
    title: str,
    records: Sequence[Record],
    x: str,
    y: str | Sequence[str],
    hue: str | Sequence[str] | None = None,
    log_y: bool = False,
    stat: str = "median",
    ref: float | None = None,
    label: str | None = None,
    caption: str = "",
) -> Figure:
    """Grouped bars of ``stat(y)`` per ``x``, one colour per series.

    A series is a value of ``hue`` (several keys are joined with " / "), or one of several
    ``y`` keys. Each category holds bars only for the series that have a point there; bars
    run horizontally when the categories are many or their labels long.

    Args:
        title: the figure's heading.
        records: long-format rows; those without a number under ``y`` are left out.
        x: the category key.
        y: the numeric key, or several (one series each).
        hue: the key(s) that split series.
        log_y: a logarithmic value axis, where the values are positive and span a factor of
            3 or more (a narrower range reads better on a linear one).
        stat: how several records of one category and series combine.
        ref: a reference value drawn as a dashed line (1.0 for a speedup).
        label: the value axis' name; by default the ``y`` key.
        caption: a line under the figure.

    Returns:
        The rendered figure.

    Raises:
        ValueError: see :func:`collect`.
    """
    ys, hues = _keys(y), _keys(hue)
    categories, series, combined = collect("bar_chart", records, x, ys, hues, stat)
    labels = [str(c) for c in categories]
    present = [[s for s in series if c in series[s]] for c in categories]
    n_bars = sum(len(p) for p in present)
    longest = max(len(lb) for lb in labels)
    horizontal = (
        len(categories) > _MAX_UPRIGHT_CATEGORIES
        or longest > _MAX_UPRIGHT_LABEL
        or n_bars > _MAX_UPRIGHT_BARS
    )
    plt = pyplot()
    if horizontal:
        size = (7.5, max(2.2, 0.26 * n_bars + 0.12 * len(categories) + 0.9))
    else:
        size = (min(11.0, max(5.0, 0.55 * n_bars + 1.5)), 3.6)
    fig, ax = plt.subplots(figsize=size)
    cmap = plt.get_cmap("tab20" if len(series) > 10 else "tab10")
    colour = {name: cmap(i % cmap.N) for i, name in enumerate(series)}
    drawn: set[str] = set()
    values = [v for points in series.values() for v in points.values()]
    for i, (category, names) in enumerate(zip(categories, present, strict=True)):
        width = 0.8 / max(len(names), 1)
        for j, name in enumerate(names):
            offset = i + (j - (len(names) - 1) / 2) * width
            legend_name = name if name not in drawn else None
            drawn.add(name)
            value = series[name][category]
            draw = ax.barh if horizontal else ax.bar
            bars = draw(offset, value, width * 0.92, color=colour[name], label=legend_name)
            if n_bars <= (40 if horizontal else 24):  # labels of crowded upright bars collide
                ax.bar_label(bars, labels=[_short(value)], fontsize=7, padding=2)
    ticks = range(len(categories))
    value_label = label or _value_label(ys, stat, combined)
    log = _wide_range(values) if log_y else False
    if horizontal:
        ax.set_yticks(ticks, labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(value_label)
        ax.set_ylabel(x)
        if log:
            ax.set_xscale("log")
            _log_scale(ax.xaxis)
        if ref is not None:
            ax.axvline(ref, color="0.3", lw=0.8, ls="--")
        ax.grid(axis="x", alpha=0.3)
    else:
        tilted = longest > 8 or len(categories) > 6
        ax.set_xticks(ticks, labels, fontsize=8, rotation=30 if tilted else 0,
                      ha="right" if tilted else "center", rotation_mode="anchor")  # fmt: skip
        ax.set_ylabel(value_label)
        ax.set_xlabel(x)
        if log:
            ax.set_yscale("log")
            _log_scale(ax.yaxis)
        if ref is not None:
            ax.axhline(ref, color="0.3", lw=0.8, ls="--")
        ax.grid(axis="y", alpha=0.3)
    ax.margins(x=0.12 if horizontal else 0.02, y=0.02 if horizontal else 0.12)
    if len(series) > 1:
        _legend(ax, " / ".join(hues) if hues else None)
    return Figure.from_matplotlib(title, fig, caption=caption)


def line_chart(
    title: str,
    records: Sequence[Record],
    x: str,
    y: str | Sequence[str],
    hue: str | Sequence[str] | None = None,
    log_y: bool = False,
    stat: str = "median",
    ref: float | None = None,
    label: str | None = None,
    caption: str = "",
) -> Figure:
    """Lines of ``stat(y)`` against a numeric ``x``, one per series (see :func:`bar_chart`).

    The abscissa is logarithmic when its values are positive and span a factor of 8 or more.

    Raises:
        ValueError: see :func:`collect`; or an ``x`` value is not a number.
    """
    ys, hues = _keys(y), _keys(hue)
    xs, series, combined = collect("line_chart", records, x, ys, hues, stat)
    if not all(_number(v) for v in xs):
        bad = next(v for v in xs if not _number(v))
        raise ValueError(f"line_chart: expected every '{x}' to be a number (got {bad!r})")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    markers = "osD^v<>pXh"
    for i, (name, points) in enumerate(series.items()):
        px = sorted(points)
        ax.plot(px, [points[v] for v in px], marker=markers[i % len(markers)], ms=4, label=name)
    values = [v for points in series.values() for v in points.values()]
    if min(xs) > 0 and max(xs) >= 8 * min(xs):
        ax.set_xscale("log", base=2 if all(float(v).is_integer() for v in xs) else 10)
        if all(float(v).is_integer() for v in xs):
            ax.set_xticks(sorted(set(xs)), [f"{v:g}" for v in sorted(set(xs))])
    if log_y and _wide_range(values):
        ax.set_yscale("log")
        _log_scale(ax.yaxis)
    if ref is not None:
        ax.axhline(ref, color="0.3", lw=0.8, ls="--")
    ax.set_xlabel(x)
    ax.set_ylabel(label or _value_label(ys, stat, combined))
    ax.grid(alpha=0.3)
    if len(series) > 1:
        _legend(ax, " / ".join(hues) if hues else None)
    return Figure.from_matplotlib(title, fig, caption=caption)
