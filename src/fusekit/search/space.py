"""Configuration spaces: named knobs with legal values, and constraints between them.

A point of a space is a plain ``dict`` from knob name to value; :func:`point_key` gives it a
canonical text form for caches and tables::

    space = Space((Knob("tile_rows", (16, 64, 256)), Knob("threads", (1, 2))),
                  constraints=(lambda p: p["tile_rows"] >= 32 or p["threads"] == 1,))
    len(space)        # 4 of the 6 combinations are legal
    space.points()    # in knob order, the last knob varying fastest

Any part can build its space from these pieces; ``fusekit.gms.candidates`` builds the g-mm-s
spaces.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fusekit.errors import expected

Point = dict[str, Any]
Constraint = Callable[[Mapping[str, Any]], bool]


@dataclass(frozen=True, slots=True)
class Knob:
    """One dimension of a space.

    Attributes:
        name: the key of the knob in a point.
        values: its legal values, in the order they are enumerated.
        doc: what the knob changes, for tables and ``--help``.
    """

    name: str
    values: tuple[Any, ...]
    doc: str = ""

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError(expected("Knob", "values", "at least one value", self.values))
        if len(set(map(repr, self.values))) != len(self.values):
            raise ValueError(expected("Knob", "values", "distinct values", self.values))


@dataclass(frozen=True, slots=True)
class Space:
    """The legal points of a product of knobs.

    Attributes:
        knobs: the dimensions, with distinct names.
        constraints: predicates a point must satisfy to be legal.
    """

    knobs: tuple[Knob, ...]
    constraints: tuple[Constraint, ...] = ()

    def __post_init__(self) -> None:
        names = [k.name for k in self.knobs]
        if len(set(names)) != len(names):
            raise ValueError(expected("Space", "knobs", "distinct names", names))

    @property
    def names(self) -> tuple[str, ...]:
        """Knob names in order."""
        return tuple(k.name for k in self.knobs)

    def points(self) -> list[Point]:
        """Every legal point, the last knob varying fastest."""
        out = []
        for values in itertools.product(*(k.values for k in self.knobs)):
            point = dict(zip(self.names, values, strict=True))
            if all(ok(point) for ok in self.constraints):
                out.append(point)
        return out

    def __len__(self) -> int:
        return len(self.points())

    def contains(self, point: Mapping[str, Any]) -> bool:
        """Whether ``point`` names every knob with a legal value and meets the constraints."""
        if set(point) != set(self.names):
            return False
        if any(point[k.name] not in k.values for k in self.knobs):
            return False
        return all(ok(point) for ok in self.constraints)


def point_key(point: Mapping[str, Any]) -> str:
    """Canonical text of a point: compact JSON with sorted keys."""
    return json.dumps(dict(point), sort_keys=True, separators=(",", ":"), default=str)


def top_k(points: Sequence[Point], predicted_s: Sequence[float], k: int) -> list[Point]:
    """The ``k`` points with the smallest predicted times (ties keep enumeration order).

    Args:
        points: candidates.
        predicted_s: a model's time for each candidate.
        k: how many to keep (``>= 1``; more than ``len(points)`` keeps all).

    Returns:
        The kept points, best first.

    Raises:
        ValueError: lengths differ or ``k < 1``.
    """
    if len(points) != len(predicted_s):
        raise ValueError(
            expected("top_k", "predicted_s", f"{len(points)} values", len(predicted_s))
        )
    if k < 1:
        raise ValueError(expected("top_k", "k", ">= 1", k))
    order = sorted(range(len(points)), key=lambda i: (predicted_s[i], i))
    return [points[i] for i in order[:k]]
