"""SAM (the Sparse Abstract Machine, Hsu et al., ASPLOS 2023) on fusekit's per-token machine.

- :mod:`.gv`: SAM's Graphviz graphs in (:func:`read_gv`, :func:`parse_gv`) and out
  (:func:`write_gv`), as :class:`SamGraph` data;
- :mod:`.runner`: :func:`run` binds dense inputs to SAM level storage, runs a graph on the
  per-token primitives and returns the dense output with cycles and per-block token counts;
- :mod:`.export`: the lowered graph of one statement as a :class:`SamGraph`;
- :mod:`.vectors`: SAM's primitive test vectors replayed through the primitives.

Names load on first use.
"""

from __future__ import annotations

from fusekit.lazy import lazy_getattr

_WHERE = {
    "SamEdge": "gv",
    "SamGraph": "gv",
    "SamGraphError": "gv",
    "SamNode": "gv",
    "parse_gv": "gv",
    "read_gv": "gv",
    "write_gv": "gv",
    "SamResult": "runner",
    "run": "runner",
    "replay": "vectors",
}

__all__ = sorted(_WHERE)

__getattr__ = lazy_getattr(__name__, _WHERE)
