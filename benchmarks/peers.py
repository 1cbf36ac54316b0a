"""What the benchmark scripts share to load their peers."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def import_spconv() -> Any:
    """``spconv.pytorch``, the package: the script ``benchmarks/spconv.py`` would shadow it."""
    here = Path(__file__).resolve().parent
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    try:
        import spconv.pytorch
    finally:
        sys.path[:] = saved
    return spconv.pytorch
