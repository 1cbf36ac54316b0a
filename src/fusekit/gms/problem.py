r"""A g-mm-s problem: its indices, validated once.

.. math::

    Y[d_e, m] \mathrel{\oplus}= c_e \sum_k X[g_e, k] \, W[s_e, k, m]
    \qquad \oplus \in \{\text{sum}, \text{mean}, \text{max}\}

for pairs ``e < E`` with gather row ``g_e < N_in``, segment ``s_e < S``, scatter row
``d_e < N_out`` and optional scale ``c_e``. ``mean`` divides by the number of pairs of each output
row; a row that no pair reaches is zero for every reduce. :func:`fusekit.gms.plan` turns a problem
into the plan every call reuses (:mod:`fusekit.gms.planning`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fusekit.errors import expected

#: How pairs reaching one output row combine.
REDUCES: tuple[str, ...] = ("sum", "mean", "max")
#: Largest size (rows, segments, tile rows, blocks) a plan accepts: an int64 index array of
#: 2**40 entries is 8 TiB, beyond any machine; the bound keeps every product below in int64.
MAX_SIZE = 2**40
#: Bound of sizes derived by multiplication (sort keys ``s * (n_out + 1) + d``, block
#: numbers ``pairs before a row * blocks``): int64 with a factor 2 to spare.
INDEX_LIMIT = 2**62
_INDEX_DTYPES = ("torch.int32", "torch.int64")


@dataclass(frozen=True, slots=True, eq=False)
class GMSProblem:
    """The indices of a g-mm-s problem, validated; operands ``x``, ``w`` and ``c`` come per call.

    Build it with :meth:`create`, which checks every index once.

    Attributes:
        gather: ``g[E]`` int64, rows of ``x``.
        segment: ``s[E]`` int64, which weight matrix.
        scatter: ``d[E]`` int64, rows of the output.
        n_out: output rows ``N_out``.
        n_in: rows ``x`` must have at least (given, or ``max(g) + 1``).
        num_segments: weight matrices ``w`` must have at least (given, or ``max(s) + 1``).
        reduce: ``"sum"``, ``"mean"`` or ``"max"``.
    """

    gather: torch.Tensor
    segment: torch.Tensor
    scatter: torch.Tensor
    n_out: int
    n_in: int
    num_segments: int
    reduce: str = "sum"

    @property
    def num_pairs(self) -> int:
        """``E``, the number of (gather, segment, scatter) pairs."""
        return int(self.gather.shape[0])

    @classmethod
    def create(
        cls,
        gather: torch.Tensor,
        segment: torch.Tensor,
        scatter: torch.Tensor,
        n_out: int,
        *,
        n_in: int | None = None,
        num_segments: int | None = None,
        reduce: str = "sum",
    ) -> GMSProblem:
        """Validate the indices of a problem.

        Args:
            gather: ``g[E]``, int32 or int64, values in ``[0, n_in)``.
            segment: ``s[E]``, values in ``[0, num_segments)``.
            scatter: ``d[E]``, values in ``[0, n_out)``.
            n_out: output rows.
            n_in: rows of ``x``, if known now (otherwise checked against ``x`` per call).
            num_segments: weight matrices, if known now.
            reduce: ``"sum"``, ``"mean"`` or ``"max"``.

        Returns:
            The problem, holding contiguous int64 copies of the indices.

        Raises:
            TypeError: an index is not an integer tensor, or a size is not an int.
            ValueError: lengths, dimensions or devices differ, a size is negative, an index is
                out of range, or ``reduce`` is unknown.
        """
        n_out = check_size("n_out", n_out)
        if n_in is not None:
            n_in = check_size("n_in", n_in)
        if num_segments is not None:
            num_segments = check_size("num_segments", num_segments)
        if reduce not in REDUCES:
            raise ValueError(expected("gms", "reduce", " or ".join(REDUCES), repr(reduce)))
        named = {"gather": gather, "segment": segment, "scatter": scatter}
        for name, index in named.items():
            if not isinstance(index, torch.Tensor):
                raise TypeError(expected("gms", name, "a torch.Tensor", type(index).__name__))
            if str(index.dtype) not in _INDEX_DTYPES:
                raise TypeError(
                    expected("gms", name, "an int32/int64 tensor", str(index.dtype).split(".")[-1])
                )
            if index.dim() != 1:
                raise ValueError(expected("gms", name, "1-D", f"shape {tuple(index.shape)}"))
            if index.shape[0] != gather.shape[0]:
                raise ValueError(
                    expected(
                        "gms",
                        name,
                        f"of length {gather.shape[0]} like 'gather'",
                        f"length {index.shape[0]}",
                    )
                )
            if index.device != gather.device:
                raise ValueError(
                    expected("gms", name, f"on {gather.device} like 'gather'", str(index.device))
                )
        g, s, d = (named[k].to(torch.int64).contiguous() for k in named)
        g_max = _check_range("gather", g, n_in, "n_in")
        s_max = _check_range("segment", s, num_segments, "num_segments")
        _check_range("scatter", d, n_out, "n_out")
        n_in = g_max + 1 if n_in is None else n_in
        num_segments = s_max + 1 if num_segments is None else num_segments
        rows = max(n_in, n_out) + 1
        check_product("num_segments * (max(n_in, n_out) + 1)", num_segments * rows)
        return cls(
            gather=g,
            segment=s,
            scatter=d,
            n_out=n_out,
            n_in=n_in,
            num_segments=num_segments,
            reduce=reduce,
        )


def check_size(name: str, value: Any) -> int:
    """Raise unless ``value`` is an int in ``[0, MAX_SIZE]``; return it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(expected("gms", name, "an int", type(value).__name__))
    if value < 0:
        raise ValueError(expected("gms", name, ">= 0", value))
    if value > MAX_SIZE:
        raise ValueError(expected("gms", name, f"<= 2**{MAX_SIZE.bit_length() - 1}", value))
    return value


def check_product(name: str, value: int) -> None:
    """Raise unless a size derived by multiplication stays clear of int64 overflow."""
    if value >= INDEX_LIMIT:
        raise ValueError(expected("gms", name, f"< 2**{INDEX_LIMIT.bit_length() - 1}", value))


def _check_range(name: str, index: torch.Tensor, bound: int | None, bound_name: str) -> int:
    """Raise on the first index outside ``[0, bound)``; return the largest index (-1 if empty)."""
    if index.numel() == 0:
        return -1
    low, high = torch.aminmax(index)
    lo, hi = int(low), int(high)
    limit = bound if bound is not None else None
    if lo < 0 or (limit is not None and hi >= limit):
        bad = index < 0 if lo < 0 else index >= limit  # type: ignore[operator]
        at = int(torch.nonzero(bad)[0, 0])
        span = f"[0, {limit})" if limit is not None else f"[0, {bound_name})"
        raise ValueError(
            expected("gms", name, f"indices in {span}", f"{int(index[at])} at pair {at}")
        )
    return hi
