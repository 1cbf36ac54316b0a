"""Checks of option values shared by every part's commands.

Typer parses ``--scale inf`` and ``--time-limit nan`` as floats without complaint; the callbacks
here reject them at parse time, so that a bad value ends as one line naming the option
(``error: fusekit gms plan: Invalid value for '--scale': ...``), exit status 2, before any
work starts. Integer ranges use typer's own ``min=``/``max=``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import typer

#: Largest ``--seed`` (torch generators take 64-bit seeds).
MAX_SEED = 2**63 - 1
#: Largest ``--scale`` of the synthetic g-mm-s problems (100x the default is ~6M pairs).
MAX_SCALE = 100.0


def finite(
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    integer_from: float | None = None,
) -> Callable[[float | None], float | None]:
    """A typer callback accepting finite floats in ``[low, high]`` (``(low, high]``: low_open).

    Args:
        low: smallest value, or None for no bound.
        high: largest value, or None for no bound.
        low_open: exclude ``low`` itself.
        integer_from: values at or above this must be whole numbers (a count, not a share).

    Returns:
        The callback; it returns the value unchanged or raises :class:`typer.BadParameter`.
    """
    lower = "-inf" if low is None else f"{low:g}"
    upper = "inf" if high is None else f"{high:g}"
    span = f"{'(' if low_open else '['}{lower}, {upper}{']' if high is not None else ')'}"

    def check(value: float | None) -> float | None:
        if value is None:
            return value
        if not math.isfinite(value):
            raise typer.BadParameter(f"expected a finite number in {span} (got {value})")
        too_low = low is not None and (value <= low if low_open else value < low)
        if too_low or (high is not None and value > high):
            raise typer.BadParameter(f"expected a number in {span} (got {value:g})")
        if integer_from is not None and value >= integer_from and value != int(value):
            raise typer.BadParameter(
                f"expected a whole number at or above {integer_from:g} (got {value:g})"
            )
        return value

    return check


#: ``--scale`` of the synthetic problems: finite, in (0, MAX_SCALE].
scale = finite(0.0, MAX_SCALE, low_open=True)
#: A positive finite time limit in seconds (at most a day).
seconds = finite(0.0, 86_400.0, low_open=True)
