"""Stream tokens, with SAM's spelling.

Coordinates, references and values are numbers; control tokens are types. A stream of rank ``n``
nests fibers ``n`` deep. ``Stop(k)`` ends the innermost fiber and ``k`` enclosing ones (SAM's
``S_k``); ``DONE`` ends the stream; ``EMPTY`` is SAM's empty-fiber token ``N`` (an absent
reference, such as a unioner's missing side, or the value it reads as). Repeat-signal streams
carry ``REPEAT`` (``R``: emit the held reference once more) and ``ADVANCE`` (``S``: move to the
next reference). Example: the fibers ``[[0, 1], [2]]`` stream as ``0, 1, S0, 2, S1, D``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Stop:
    """End of a fiber and of ``level`` enclosing fibers."""

    level: int

    def __repr__(self) -> str:
        return f"S{self.level}"


class _Control:
    """A control token without a payload (a singleton per spelling)."""

    __slots__ = ("spelling",)

    def __init__(self, spelling: str) -> None:
        self.spelling = spelling

    def __repr__(self) -> str:
        return self.spelling


DONE = _Control("D")
EMPTY = _Control("N")
REPEAT = _Control("R")
ADVANCE = _Control("S")
Token = int | float | Stop | _Control
SamToken = int | float | str


def is_data(tok: Token) -> bool:
    """Whether ``tok`` is a coordinate, a reference, a value or ``EMPTY`` (not control)."""
    return not isinstance(tok, Stop) and tok is not DONE and tok is not ADVANCE


def is_number(tok: Token) -> bool:
    """Whether ``tok`` is a coordinate, a reference or a value (not ``EMPTY`` or control)."""
    return not isinstance(tok, Stop | _Control)


def to_sam(tok: Token) -> SamToken:
    """SAM's JSON spelling: numbers stay numbers, ``S<k>``, ``D``, ``N``, ``R``, ``S``."""
    if isinstance(tok, Stop):
        return f"S{tok.level}"
    if isinstance(tok, _Control):
        return tok.spelling
    return tok


_CONTROL = {"D": DONE, "N": EMPTY, "R": REPEAT, "S": ADVANCE}


def from_sam(x: SamToken) -> Token:
    """The token SAM spells ``x`` (a number, ``S<k>``, ``D``, ``N``, ``R`` or ``S``).

    Raises:
        ValueError: for any other string, or a bool.
    """
    if isinstance(x, bool):
        raise ValueError(f"SAM token: expected a number or a token name, got {x!r}")
    if isinstance(x, int | float):
        return x
    if x in _CONTROL:
        return _CONTROL[x]
    if len(x) >= 2 and x[0] == "S" and x[1:].isdigit():
        return Stop(int(x[1:]))
    raise ValueError(f"SAM token: expected a number, S<k>, D, N, R or S, got {x!r}")


def parse(text: str) -> list[Token]:
    """Tokens from text such as ``"0, 1, S0, N, 2, S1, D"`` (for tests)."""
    out: list[Token] = []
    for word in text.replace(",", " ").split():
        if word in _CONTROL or word[0] == "S":
            out.append(from_sam(word))
        else:
            out.append(float(word) if "." in word or "e" in word else int(word))
    return out
