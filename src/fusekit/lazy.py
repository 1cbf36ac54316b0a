"""Lazy package attributes: a package names its public objects without importing their modules.

``import fusekit.nn`` must not import torch-heavy or numba-heavy modules (the CLI mounts every
part at start-up); a package lists where each name lives and loads the module on first use::

    _WHERE = {"MoE": "moe", "RGCNConv": "rgcn"}
    __getattr__ = lazy_getattr(__name__, _WHERE)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``package.<where[name]>`` and returns its ``name``."""

    def __getattr__(name: str) -> Any:
        if name in where:
            return getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
