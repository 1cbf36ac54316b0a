"""The G and S steps on their own: gather rows, and reduce rows into their destinations (numba).

Gather (the ``G`` of ``G-Mseg-S`` and ``G-(MS)seg``)::

    out[p, k] = x[index[p], k]

Reduce by destination (the ``S`` of ``G-Mseg-S`` and ``(GM)seg-S``, the second step of
transform-first and the first of aggregate-first)::

    out[i, m] (+= | max=) scale[p] * src[src_index[p], m]    for q in [ptr[i], ptr[i+1]), p = pos[q]

Each output row is owned by one thread (a CSR walk), so there are no atomics and the result does
not depend on the thread count. A ``max`` row with no entries is zero. Without an ``out`` to
accumulate into, the first entry of a row is stored rather than added (and a row with no entries
is written zero), so the result is allocated uninitialised and never read: for top-2 routing that
is two row reads and one row write per output row, nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numba
import numpy as np
import torch

from fusekit.errors import expected
from fusekit.gms.kernels.cpu.checks import check_count, check_index, check_rows_operand, check_scale
from fusekit.gms.kernels.cpu.tile import FASTMATH, nan_max

if TYPE_CHECKING:
    from fusekit.gms.planning.layout import GMSPlan


@numba.njit(parallel=True, cache=True)
def _gather_rows_kernel(x, index, out):  # type: ignore[no-untyped-def]
    # x: [N, K]; index: [E]; out: [E, K]
    n_rows = x.shape[0]
    bad = 0
    for p in numba.prange(index.shape[0]):
        q = index[p]
        if q < 0 or q >= n_rows:
            bad += 1
            continue
        for k in range(x.shape[1]):
            col = np.uint64(k)
            out[p, col] = x[q, col]
    return bad


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def _reduce_rows_kernel(  # type: ignore[no-untyped-def]
    # pointers: src [R, M], src_index [P], scale [P], ptr [N_out + 1], pos [Q], out [N_out, M]
    src,
    src_index,
    scale,
    ptr,
    pos,
    out,
    # sizes: positions p lie in [0, n_pairs)
    n_pairs,
    # flags
    has_index,
    has_scale,
    has_pos,
    reduce_max,
    overwrite,
):
    n_src = src.shape[0]
    # positions past an index or scale array are guarded, whatever n_pairs the caller gave
    if has_index:
        n_pairs = min(n_pairs, src_index.shape[0])
    if has_scale:
        n_pairs = min(n_pairs, scale.shape[0])
    n_ptr = pos.shape[0] if has_pos else n_pairs
    M = min(out.shape[1], src.shape[1])
    bad = 0
    for i in numba.prange(min(out.shape[0], ptr.shape[0] - 1)):
        lo = ptr[i]
        hi = ptr[i + 1]
        if lo < 0 or hi < lo or hi > n_ptr:
            bad += 1
            continue
        row = out[i]  # a view: no per-element index fix-up
        if hi == lo:
            if reduce_max or overwrite:
                for m in range(M):
                    row[np.uint64(m)] = 0
            continue
        first = overwrite
        for q in range(lo, hi):
            p = pos[q] if has_pos else q
            if p < 0 or p >= n_pairs:
                bad += 1
                break
            r = src_index[p] if has_index else p
            if r < 0 or r >= n_src:
                bad += 1
                break
            c = scale[p] if has_scale else scale[0]
            values = src[r]
            # unsigned column indices: no negative-index fix-up, so the loops vectorize
            if first:
                for m in range(M):
                    col = np.uint64(m)
                    row[col] = c * values[col]
                first = False
            elif reduce_max:
                for m in range(M):
                    col = np.uint64(m)
                    row[col] = nan_max(row[col], c * values[col])
            else:
                for m in range(M):
                    col = np.uint64(m)
                    row[col] += c * values[col]
    return bad


def gather_rows_cpu(
    x: torch.Tensor, index: torch.Tensor, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``out[p] = x[index[p]]`` with numba threads.

    Args:
        x: ``[N, K]`` float tensor on the CPU (contiguous).
        index: ``[E]`` int64 rows of ``x``.
        out: ``[E, K]`` contiguous tensor of the dtype of ``x`` to write into; new if None.

    Returns:
        ``out``, ``[E, K]`` in the dtype of ``x``.

    Raises:
        ValueError: an index lies outside ``[0, N)``.
    """
    check_rows_operand("x", x)
    check_index("index", index)
    if out is None:
        out = torch.empty(index.shape[0], x.shape[1], dtype=x.dtype)
    check_out(out, (index.shape[0], x.shape[1]), x.dtype)
    if index.shape[0]:
        bad = _gather_rows_kernel(numpy_of(x), numpy_of(index), numpy_of(out))
        raise_if_bad(bad, "gather index", f"rows in [0, {x.shape[0]})")
    return out


def reduce_rows_cpu(
    src: torch.Tensor,
    ptr: torch.Tensor,
    *,
    n_pairs: int,
    src_index: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    pos: torch.Tensor | None = None,
    reduce_max: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out[i] (+= | max=) scale[p] * src[src_index[p]]`` over the positions of row ``i``.

    Args:
        src: ``[R, M]`` rows to reduce (contiguous).
        ptr: ``[N_out + 1]`` CSR pointer into ``pos`` (or into positions, if ``pos`` is None).
        n_pairs: number of positions (the length of ``src_index`` and ``scale``).
        src_index: ``[n_pairs]`` the ``src`` row of each position; identity if None.
        scale: ``[n_pairs]`` factor of each position; 1 if None.
        pos: ``[Q]`` positions listed by output row; identity if None.
        reduce_max: ``max`` instead of ``sum``.
        out: accumulate into this ``[N_out, M]`` tensor; if None, a new tensor holds the
            reduction alone (each row written once, rows without entries zero).

    Returns:
        ``out``.

    Raises:
        ValueError: a pointer, position or row index lies out of range.
    """
    check_rows_operand("src", src)
    check_index("ptr", ptr)
    n_pairs = check_count("n_pairs", n_pairs)
    for name, index in (("src_index", src_index), ("pos", pos)):
        if index is not None:
            check_index(name, index)
    if src_index is not None and src_index.shape[0] < n_pairs:
        raise ValueError(
            expected("gms", "src_index", f"at least {n_pairs} long", src_index.shape[0])
        )
    if scale is not None:
        check_scale(scale[:n_pairs], n_pairs, None)
    n_out = max(ptr.shape[0] - 1, 0)
    overwrite = out is None
    if out is None:
        out = torch.empty(n_out, src.shape[1], dtype=src.dtype)
    check_out(out, (n_out, src.shape[1]), src.dtype)
    if n_out == 0:
        return out
    one = torch.ones(1, dtype=src.dtype)
    bad = _reduce_rows_kernel(
        numpy_of(src),
        numpy_of(src_index if src_index is not None else ptr[:1]),
        numpy_of(scale if scale is not None else one),
        numpy_of(ptr),
        numpy_of(pos if pos is not None else ptr[:1]),
        numpy_of(out),
        n_pairs,
        src_index is not None,
        scale is not None,
        pos is not None,
        reduce_max,
        overwrite,
    )
    raise_if_bad(bad, "CSR", f"pointers and positions in range of {n_pairs} pairs")
    return out


def numpy_of(t: torch.Tensor) -> np.ndarray:
    """The numpy view numba kernels take (no copy; the tensor must be on the CPU)."""
    return t.detach().numpy()


def plan_array(plan: GMSPlan, name: str) -> np.ndarray:
    """The numpy view of a plan field, made once per plan (kept in ``plan.derived.arrays``)."""
    view = plan.derived.arrays.get(name)
    if view is None:
        view = plan.derived.arrays[name] = numpy_of(getattr(plan, name))
    return view


def check_out(out: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """Raise unless ``out`` is a contiguous CPU tensor of this shape and dtype.

    Kernels write ``out`` without bounds checks, so its layout is checked before they run.
    """
    if (
        tuple(out.shape) != tuple(shape)
        or out.dtype != dtype
        or out.device.type != "cpu"
        or not out.is_contiguous()
    ):
        got = f"{str(out.dtype).split('.')[-1]} {tuple(out.shape)} on {out.device}"
        want = f"a contiguous CPU {str(dtype).split('.')[-1]} tensor of shape {tuple(shape)}"
        raise ValueError(expected("gms", "out", want, got))


def raise_if_bad(bad: int, what: str, expectation: str) -> None:
    """Raise the error a kernel's guards counted (``bad`` > 0), naming the plan array."""
    if bad:
        raise ValueError(
            expected("gms", f"plan {what}", expectation, f"{bad} guarded reads out of range")
        )
