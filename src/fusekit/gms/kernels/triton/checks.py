"""Launcher-side guards of the Triton kernels: plain torch checks of the plan arrays they read.

The kernels mask every load and store as well, so a plan that slipped past these checks still
cannot read or write out of bounds; the checks turn it into a ``ValueError`` instead of a silently
wrong result. A check that passed is remembered in ``plan.derived.passed`` (a plan changed with
``dataclasses.replace`` starts with an empty record, so it is checked again).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fusekit.errors import expected
from fusekit.gms.planning.derived import Check, Passed

if TYPE_CHECKING:
    from fusekit.gms.planning.layout import GMSPlan

#: Dtypes the kernels take (they accumulate in float32).
DTYPES = ("float32", "bfloat16", "float16")
#: Bound of what the kernels index in int32: a program's positions (``program_id * BLOCK``)
#: and offsets inside one weight matrix (``k * M + m``).
INT32_LIMIT = 2**31
#: The most programs a launch grid may have along each axis (CUDA's limits).
GRID_LIMITS = (2**31 - 1, 65535, 65535)


def check_grid(grid: tuple[int, ...]) -> None:
    """Raise unless the launch grid fits the device's limits.

    Raises:
        ValueError: too many programs along an axis (a very wide ``M`` or ``K``).
    """
    for axis, (size, limit) in enumerate(zip(grid, GRID_LIMITS, strict=False)):
        if size > limit:
            raise ValueError(expected("gms", f"launch grid axis {axis}", f"<= {limit}", size))


def check_operands(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, n: int) -> None:
    """Raise unless ``x[N, K]``, ``w[S, K, M]`` and ``scale[n]`` fit the kernels.

    Raises:
        ValueError: an unsupported dtype, mismatched shapes or devices, or sizes past the
            kernels' int32 offsets.
    """
    if str(x.dtype).removeprefix("torch.") not in DTYPES or w.dtype != x.dtype:
        raise ValueError(expected("gms", "x, w", f"one dtype of {DTYPES}", (x.dtype, w.dtype)))
    if x.dim() != 2 or w.dim() != 3 or x.shape[1] != w.shape[1] or w.device != x.device:
        shapes = (tuple(x.shape), tuple(w.shape))
        raise ValueError(expected("gms", "x, w", "[N, K] and [S, K, M] on one device", shapes))
    if scale is not None and (scale.shape != (n,) or scale.device != x.device):
        raise ValueError(expected("gms", "scale", f"[{n}] on {x.device}", tuple(scale.shape)))
    if n >= INT32_LIMIT or w.shape[1] * w.shape[2] >= INT32_LIMIT:
        got = f"{n} pairs, K * M = {w.shape[1] * w.shape[2]}"
        raise ValueError(expected("gms", "x, w", "fewer than 2**31 pairs and K * M < 2**31", got))


def check_index(plan: GMSPlan, name: str, high: int) -> None:
    """Raise unless the ``[E]`` plan array ``name`` lies in ``[0, high)``.

    Raises:
        ValueError: a wrong length or an index out of range.
    """
    key = Passed(Check.TRITON_INDEX, name, high)
    if key in plan.derived.passed:
        return
    index = getattr(plan, name)
    if index.shape != (plan.num_pairs,) or (
        index.numel() and bool(((index < 0) | (index >= high)).any())
    ):
        got = f"{tuple(index.shape)}, in [{_lo(index)}, {_hi(index)}]"
        raise ValueError(expected("gms", f"plan {name}", f"[{plan.num_pairs}] in [0, {high})", got))
    plan.derived.passed.add(key)


def check_rows(index: torch.Tensor, n: int, high: int, what: str) -> None:
    """Raise unless ``index`` has ``n`` entries, all in ``[0, high)`` (not memoised).

    Raises:
        ValueError: a wrong length or an index out of range.
    """
    if (
        index.dim() != 1
        or index.shape[0] != n
        or (index.numel() and bool((index.min() < 0) | (index.max() >= high)))
    ):
        got = f"{tuple(index.shape)}, in [{_lo(index)}, {_hi(index)}]"
        raise ValueError(expected("gms", f"plan {what}", f"[{n}] in [0, {high})", got))


def check_tiles(plan: GMSPlan, n_segments: int) -> None:
    """Raise unless every tile names a segment of ``w`` and positions inside ``[0, E]``.

    Raises:
        ValueError: tile arrays of different lengths or out of range.
    """
    key = Passed(Check.TRITON_TILES, bound=n_segments)
    if key in plan.derived.passed:
        return
    seg, lo, hi = plan.tile_segment, plan.tile_start, plan.tile_end
    ok = seg.shape == lo.shape == hi.shape and seg.dim() == 1
    if ok and seg.numel():
        ok = not bool(
            ((seg < 0) | (seg >= n_segments) | (lo < 0) | (hi < lo) | (hi > plan.num_pairs)).any()
        )
    if not ok:
        want = f"segments in [0, {n_segments}), 0 <= start <= end <= {plan.num_pairs}"
        got = f"segments in [{_lo(seg)}, {_hi(seg)}], starts >= {_lo(lo)}, ends <= {_hi(hi)}"
        raise ValueError(expected("gms", "plan tiles", want, got))
    plan.derived.passed.add(key)


def check_segment_ptr(plan: GMSPlan, n_segments: int) -> None:
    """Raise unless ``segment_ptr`` runs from 0 to ``E`` without decreasing, ``<= S_w`` segments.

    Raises:
        ValueError: a malformed pointer.
    """
    key = Passed(Check.TRITON_SEGMENT_PTR, bound=n_segments)
    if key in plan.derived.passed:
        return
    ptr = plan.segment_ptr
    if (
        ptr.dim() != 1
        or not 1 <= ptr.numel() <= n_segments + 1
        or int(ptr[0]) != 0
        or int(ptr[-1]) != plan.num_pairs
        or bool((ptr.diff() < 0).any())
    ):
        want = f"non-decreasing from 0 to {plan.num_pairs}, at most {n_segments + 1} values"
        raise ValueError(expected("gms", "plan segment_ptr", want, ptr[:8].tolist()))
    plan.derived.passed.add(key)


def check_dst_csr(plan: GMSPlan) -> None:
    """Raise unless ``dst_ptr[N_out + 1]`` is a CSR pointer into ``dst_pos``, positions in range.

    Raises:
        ValueError: a malformed pointer or a position out of ``[0, E)``.
    """
    key = Passed(Check.TRITON_DST_CSR)
    if key in plan.derived.passed:
        return
    ptr, pos, n = plan.dst_ptr, plan.dst_pos, plan.num_pairs
    ok = ptr.shape == (plan.n_out + 1,) and pos.dim() == 1
    ok = (
        ok and int(ptr[0]) >= 0 and int(ptr[-1]) <= pos.numel() and not bool((ptr.diff() < 0).any())
    )
    ok = ok and not (pos.numel() and bool(((pos < 0) | (pos >= n)).any()))
    if not ok:
        got = f"ptr in [{_lo(ptr)}, {_hi(ptr)}], positions in [{_lo(pos)}, {_hi(pos)}]"
        want = f"pointers into {pos.numel()} positions, positions in [0, {n})"
        raise ValueError(expected("gms", "plan dst_ptr/dst_pos", want, got))
    plan.derived.passed.add(key)


def empty_rows_to_zero(out: torch.Tensor, plan: GMSPlan) -> None:
    """Set the rows no pair reaches (still ``-inf`` after a max) to zero, as the CPU kernels do."""
    degree = plan.dst_ptr[1:] - plan.dst_ptr[:-1]
    out[degree == 0] = 0


def _lo(t: torch.Tensor) -> int | None:
    return int(t.min()) if t.numel() else None


def _hi(t: torch.Tensor) -> int | None:
    return int(t.max()) if t.numel() else None
