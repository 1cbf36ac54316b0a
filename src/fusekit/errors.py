"""Errors raised by fusekit, and helpers that format them in one style.

Every message names the argument, what was expected and what was received, in PyG's form::

    gms: expected 'index' to be int32/int64 (got float32)
"""

from __future__ import annotations

from typing import Any


class FusekitError(Exception):
    """Base class of the errors fusekit raises on its own account."""


class ConfigError(FusekitError, ValueError):
    """A configuration file (YAML, JSON cache) is malformed.

    The message is one line naming the file, the field path and the problem, so that the CLI can
    print it as it is, without a traceback.
    """

    def __init__(self, source: str, path: str, problem: str) -> None:
        self.source = source
        self.path = path
        self.problem = problem
        where = f"{source}: {path}" if path else source
        super().__init__(f"{where}: {problem}")


def expected(where: str, arg: str, expectation: str, got: Any) -> str:
    """Format the house error message.

    Args:
        where: the function or part raising, e.g. ``"gms"``.
        arg: the argument's name.
        expectation: what the argument should have been, e.g. ``"int64 on cpu"``.
        got: what it was.

    Returns:
        ``"{where}: expected '{arg}' to be {expectation} (got {got})"``.
    """
    return f"{where}: expected '{arg}' to be {expectation} (got {got})"
