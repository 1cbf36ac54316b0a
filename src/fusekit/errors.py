"""Errors raised by fusekit, and helpers that format them in one style.

Every message names the argument, what was expected and what was received, in PyG's form::

    gms: expected 'index' to be int32/int64 (got float32)
"""

from __future__ import annotations

import importlib
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


class MissingExtra(FusekitError, ImportError):
    """An optional dependency is not installed; the message names the extra that installs it."""


def require(module: str, what: str, extra: str) -> Any:
    """Import an optional dependency, or say in one line which extra installs it.

    Args:
        module: the module to import, e.g. ``"sklearn.tree"``.
        what: the feature that needs it, e.g. ``"train_tree"``.
        extra: fusekit's extra that installs it, e.g. ``"train"``.

    Returns:
        The imported module.

    Raises:
        MissingExtra: ``"{what}: needs the '{package}' package (pip install 'fusekit[{extra}]')"``.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        package = module.partition(".")[0]
        raise MissingExtra(
            f"{what}: needs the '{package}' package (pip install 'fusekit[{extra}]')"
        ) from e
