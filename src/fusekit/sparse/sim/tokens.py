"""Stream tokens: coordinates, references and values are numbers; control tokens are types.

A stream of rank ``n`` nests fibers ``n`` deep. ``Stop(k)`` ends the innermost fiber and ``k``
enclosing ones (SAM's ``S_k``); ``DONE`` ends the stream; ``EMPTY`` stands for a reference or a
value that is absent (a unioner's missing side). Example: the fibers ``[[0, 1], [2]]`` stream as
``0, 1, S0, 2, S1, D``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Stop:
    """End of a fiber and of ``level`` enclosing fibers."""

    level: int

    def __repr__(self) -> str:
        return f"S{self.level}"


class _Done:
    """End of stream (a singleton)."""

    def __repr__(self) -> str:
        return "D"


class _Empty:
    """An absent reference or value (a singleton)."""

    def __repr__(self) -> str:
        return "N"


DONE = _Done()
EMPTY = _Empty()
Token = int | float | Stop | _Done | _Empty


def is_data(tok: Token) -> bool:
    """Whether ``tok`` is a coordinate, a reference, a value or ``EMPTY`` (not control)."""
    return not isinstance(tok, Stop | _Done)


def parse(text: str) -> list[Token]:
    """Tokens from text such as ``"0, 1, S0, N, 2, S1, D"`` (for tests)."""
    out: list[Token] = []
    for word in text.replace(",", " ").split():
        if word == "D":
            out.append(DONE)
        elif word == "N":
            out.append(EMPTY)
        elif word.startswith("S"):
            out.append(Stop(int(word[1:])))
        else:
            out.append(float(word) if "." in word else int(word))
    return out
