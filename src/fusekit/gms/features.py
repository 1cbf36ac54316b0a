r"""What the model, the cache and the selector know about a g-mm-s problem.

:func:`features` reads a planned problem once (``O(E)``, no kernel runs) and keeps the numbers
every later decision needs:

* sizes: pairs ``E``, segments ``S``, rows ``N_in`` and ``N_out``, widths ``K`` and ``M``;
* the GEMM rows of each order: ``E`` (pairwise), ``V`` distinct ``(s, g)`` (transform-first),
  ``U`` distinct ``(s, d)`` (aggregate-first);
* the rows actually touched: distinct gather rows and distinct scatter rows;
* skew: the pairs of every segment of each order's GEMM (tiles and their padding), their
  coefficient of variation, and the largest number of pairs reduced into one output row (the
  granularity of the CPU's destination blocks and the conflicts of GPU atomics).

:meth:`Features.vector` is the normalised form compared across problems (log2 of sizes and of
duplication ratios); :func:`signature` is the exact identity of a problem, the tuning cache's key.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fusekit.errors import expected

if TYPE_CHECKING:
    import numpy as np

    from fusekit.gms.planning.layout import GMSPlan
    from fusekit.gms.problem import GMSProblem

#: Short names of the operand dtypes (the keys of a target's ``peak_flops_per_s``).
DTYPE_NAMES = {"torch.float32": "fp32", "torch.float64": "fp64", "torch.bfloat16": "bf16"}
DTYPE_NAMES["torch.float16"] = "fp16"
#: Names of the entries of :meth:`Features.vector`.
VECTOR_NAMES: tuple[str, ...] = (
    "log2_pairs",
    "log2_segments",
    "log2_n_in",
    "log2_n_out",
    "log2_k",
    "log2_m",
    "log2_pairs_per_transform_row",
    "log2_pairs_per_aggregate_row",
    "log2_pairs_per_gather_row",
    "log2_pairs_per_scatter_row",
    "segment_cv",
    "log2_max_row_pairs",
)


@dataclass(frozen=True, slots=True)
class Features:
    """A planned problem seen by the cost model.

    Attributes:
        pairs: ``E``.
        segments: ``S``, weight matrices.
        n_in: rows of ``x``.
        n_out: rows of ``y``.
        k: columns of ``x``.
        m: columns of ``y``.
        dtype: operand dtype, ``"fp32"``, ``"bf16"``, ``"fp16"`` or ``"fp64"``.
        reduce: ``"sum"``, ``"mean"`` or ``"max"``.
        has_scale: whether pairs carry a factor ``c``.
        transform_rows: ``V``, distinct ``(segment, gather row)``.
        aggregate_rows: ``U``, distinct ``(segment, scatter row)``; None for max.
        gather_rows: distinct gather rows.
        scatter_rows: distinct scatter rows.
        max_row_pairs: most pairs reduced into one output row.
        segment_pairs: pairs of each segment (pairwise GEMM).
        transform_segment_rows: rows of each segment of the transform-first GEMM.
        aggregate_segment_rows: rows of each segment of the aggregate-first GEMM (empty: None).
    """

    pairs: int
    segments: int
    n_in: int
    n_out: int
    k: int
    m: int
    dtype: str
    reduce: str
    has_scale: bool
    transform_rows: int
    aggregate_rows: int | None
    gather_rows: int
    scatter_rows: int
    max_row_pairs: int
    segment_pairs: tuple[int, ...]
    transform_segment_rows: tuple[int, ...]
    aggregate_segment_rows: tuple[int, ...]

    @property
    def group(self) -> str:
        """What a problem must share exactly to reuse another's tuned answer: dtype, reduce."""
        return f"{self.dtype},{self.reduce}"

    @property
    def segment_cv(self) -> float:
        """Coefficient of variation of the non-empty segments' pair counts (0: balanced)."""
        sizes = [n for n in self.segment_pairs if n]
        if len(sizes) < 2:
            return 0.0
        mean = sum(sizes) / len(sizes)
        return math.sqrt(sum((n - mean) ** 2 for n in sizes) / len(sizes)) / mean

    def vector(self) -> tuple[float, ...]:
        """The normalised numbers of :data:`VECTOR_NAMES` (sizes as log2, ratios as log2)."""

        def lg(v: float) -> float:
            return math.log2(v + 1.0)

        e = self.pairs
        u = self.aggregate_rows if self.aggregate_rows is not None else e
        return (
            lg(e),
            lg(self.segments),
            lg(self.n_in),
            lg(self.n_out),
            lg(self.k),
            lg(self.m),
            lg(e) - lg(self.transform_rows),
            lg(e) - lg(u),
            lg(e) - lg(self.gather_rows),
            lg(e) - lg(self.scatter_rows),
            self.segment_cv,
            lg(self.max_row_pairs),
        )


def _segment_rows(plan: GMSPlan) -> tuple[int, ...]:
    return tuple(int(n) for n in (plan.segment_ptr[1:] - plan.segment_ptr[:-1]).tolist())


def features(plan: GMSPlan, k: int, m: int, dtype: torch.dtype, has_scale: bool) -> Features:
    """Read the features of a planned problem.

    Args:
        plan: a plan with its orders (``plan(problem)``, the default).
        k: columns of ``x``.
        m: columns of ``y``.
        dtype: the operands' dtype.
        has_scale: whether the calls pass a per-pair scale.

    Returns:
        The :class:`Features`.

    Raises:
        ValueError: the plan has no transform-first order (built with ``orders=False``), or a
            width is not positive.
        TypeError: the dtype is not a floating dtype gms runs.
    """
    if plan.transform is None:
        raise ValueError(expected("gms", "plan", "a plan with its orders", "orders=False"))
    agg = plan.aggregate.plan if plan.aggregate is not None else None
    return features_of_counts(
        segment_pairs=_segment_rows(plan),
        degree=plan.dst_ptr[1:] - plan.dst_ptr[:-1],
        sources=plan.src_ptr[1:] - plan.src_ptr[:-1],
        n_in=plan.n_in,
        k=k,
        m=m,
        dtype=dtype,
        reduce=plan.reduce,
        has_scale=has_scale,
        transform_segment_rows=_segment_rows(plan.transform.plan),
        aggregate_segment_rows=_segment_rows(agg) if agg is not None else None,
    )


def features_of_problem(
    problem: GMSProblem, k: int, m: int, dtype: torch.dtype, has_scale: bool
) -> Features:
    """:func:`features` of ``plan(problem)`` without planning: counts and two distinct-key sorts.

    ``V`` and ``U`` per segment are the distinct ``s N_in + g`` and ``s N_out + d`` keys counted
    by segment; the rest are bincounts. A caller that plans only once the selector has chosen
    the plan's knobs (``nn.engine.prepare``) plans once instead of twice.

    Raises:
        ValueError, TypeError: as :func:`features_of_counts`.
    """
    g, s, d = problem.gather, problem.segment, problem.scatter
    segments = problem.num_segments

    def per_segment(rows: int, index: torch.Tensor) -> tuple[int, ...]:
        keys = torch.unique(s * max(rows, 1) + index)
        segment_of = torch.div(keys, max(rows, 1), rounding_mode="floor")
        return tuple(torch.bincount(segment_of, minlength=segments).tolist())

    return features_of_counts(
        segment_pairs=tuple(torch.bincount(s, minlength=segments).tolist()),
        degree=torch.bincount(d, minlength=problem.n_out),
        sources=torch.bincount(g, minlength=problem.n_in),
        n_in=problem.n_in,
        k=k,
        m=m,
        dtype=dtype,
        reduce=problem.reduce,
        has_scale=has_scale,
        transform_segment_rows=per_segment(problem.n_in, g),
        aggregate_segment_rows=per_segment(problem.n_out, d) if problem.reduce != "max" else (),
    )


def features_of_counts(
    *,
    segment_pairs: tuple[int, ...],
    degree: torch.Tensor | np.ndarray,
    sources: torch.Tensor | np.ndarray | None,
    n_in: int,
    k: int,
    m: int,
    dtype: torch.dtype,
    reduce: str = "sum",
    has_scale: bool = False,
    transform_segment_rows: tuple[int, ...] | None = None,
    aggregate_segment_rows: tuple[int, ...] | None = None,
) -> Features:
    """The features from counts alone, for a builder that has them before any plan exists.

    ``E = sum(segment_pairs)``, ``N_out = len(degree)``; ``V`` and ``U`` are the sums of the
    per-segment rows of the transform-first and aggregate-first orders. Left out
    (``None``), every ``(s, g)`` and every ``(s, d)`` is taken to be one pair (a kernel map's
    case: ``V = U = E``, per segment equal to ``segment_pairs``); ``sources`` left out means
    it equals ``degree`` (outputs on the inputs: a submanifold map). Equal to
    :func:`features` of the plan of the same pairs.

    Args:
        segment_pairs: pairs of each segment.
        degree: ``[N_out]`` pairs of each output row (a tensor, or a numpy array: host
            counts stay off torch's thread pool).
        sources: ``[N_in]`` pairs of each input row (likewise), or ``None`` (same as
            ``degree``).
        n_in: rows of ``x``.
        k: columns of ``x``.
        m: columns of ``y``.
        dtype: the operands' dtype.
        reduce: the problem's reduce.
        has_scale: whether the calls pass a per-pair scale.
        transform_segment_rows: distinct ``(s, g)`` per segment, or ``None`` (pairs).
        aggregate_segment_rows: distinct ``(s, d)`` per segment, or ``None`` (pairs; for max,
            pass ``()``).

    Returns:
        The :class:`Features`.

    Raises:
        ValueError: a width is not positive.
        TypeError: the dtype is not a floating dtype gms runs.
    """
    for name, value in (("k", k), ("m", m)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(expected("gms", name, "a positive int", value))
    if str(dtype) not in DTYPE_NAMES:
        raise TypeError(expected("gms", "dtype", " or ".join(DTYPE_NAMES), str(dtype)))
    transform = segment_pairs if transform_segment_rows is None else transform_segment_rows
    aggregate = segment_pairs if aggregate_segment_rows is None else aggregate_segment_rows
    sources = degree if sources is None else sources
    return Features(
        pairs=sum(segment_pairs),
        segments=len(segment_pairs),
        n_in=n_in,
        n_out=len(degree),
        k=k,
        m=m,
        dtype=DTYPE_NAMES[str(dtype)],
        reduce=reduce,
        has_scale=bool(has_scale),
        transform_rows=sum(transform),
        aggregate_rows=sum(aggregate) if reduce != "max" else None,
        gather_rows=int((sources > 0).sum()),
        scatter_rows=int((degree > 0).sum()),
        max_row_pairs=int(degree.max()) if len(degree) else 0,
        segment_pairs=tuple(segment_pairs),
        transform_segment_rows=tuple(transform),
        aggregate_segment_rows=tuple(aggregate) if reduce != "max" else (),
    )


def signature(problem: GMSProblem, k: int, m: int, dtype: torch.dtype, has_scale: bool) -> str:
    """The exact identity of a problem: a hash of its indices, sizes, widths, dtype and scale.

    Two calls with equal indices and operand shapes get the same key (the tuning cache's);
    anything else gets another.
    """
    h = hashlib.blake2b(digest_size=12)
    for index in (problem.gather, problem.segment, problem.scatter):
        h.update(index.cpu().numpy().tobytes())
    sizes = (problem.n_in, problem.n_out, problem.num_segments, problem.reduce, k, m)
    h.update(repr((*sizes, str(dtype), bool(has_scale))).encode())
    return h.hexdigest()
