"""Launcher-side checks of the CPU kernels, and the checksum that seals a plan (numba).

The numba kernels bounds-check every index they read from a plan (counting what they skip), but
they trust the shapes of their operands: a ``w`` with a shorter ``K`` than ``x``, a ``scale``
shorter than the pairs, a ``b`` narrower than ``M`` would be read past its end. So every
launcher checks its operands here first and raises ``ValueError``/``TypeError`` naming the
argument, whoever calls it (the op, a layer, a test).
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from fusekit.errors import expected

#: Dtypes the numba kernels compute in (the op upcasts bfloat16 to float32 first).
DTYPES = ("float32", "float64")


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def check_rows_operand(name: str, t: object, dtype: torch.dtype | None = None) -> None:
    """Raise unless ``t`` is a 2-D float32/float64 CPU tensor (of ``dtype``, if given).

    Raises:
        TypeError: not a tensor, or the wrong dtype.
        ValueError: not 2-D, or not on the CPU.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(expected("gms", name, "a torch.Tensor", type(t).__name__))
    if _dtype(t) not in DTYPES or (dtype is not None and t.dtype != dtype):
        want = f"{str(dtype).removeprefix('torch.')}" if dtype is not None else "float32/float64"
        raise TypeError(expected("gms", name, want, _dtype(t)))
    if t.dim() != 2 or t.device.type != "cpu":
        raise ValueError(
            expected("gms", name, "a 2-D CPU tensor", f"{tuple(t.shape)} on {t.device}")
        )


def check_index(name: str, index: object, length: int | None = None) -> None:
    """Raise unless ``index`` is a 1-D integer CPU tensor (of ``length`` entries, if given).

    Raises:
        TypeError: not an integer tensor.
        ValueError: not 1-D, on another device, or of another length.
    """
    if not isinstance(index, torch.Tensor) or index.dtype not in (torch.int32, torch.int64):
        got = _dtype(index) if isinstance(index, torch.Tensor) else type(index).__name__
        raise TypeError(expected("gms", name, "an int32/int64 tensor", got))
    if index.dim() != 1 or index.device.type != "cpu":
        raise ValueError(expected("gms", name, "1-D on the CPU", f"{tuple(index.shape)}"))
    if length is not None and index.shape[0] != length:
        raise ValueError(expected("gms", name, f"of length {length}", index.shape[0]))


def check_operands(
    x: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor | None,
    n_pairs: int,
    n_segments: int = 0,
    *,
    x_name: str = "x",
) -> None:
    """Raise unless ``x[N, K]``, ``w[S, K, M]`` and ``scale[n_pairs]`` fit the CPU kernels.

    Args:
        x: the rows the kernel reads (``x``, gathered rows, ``dY``...).
        w: the weights, ``S >= n_segments``.
        scale: per-position factors, or None.
        n_pairs: the positions the kernel runs (the length ``scale`` must have).
        n_segments: the segments the plan names.
        x_name: the name of ``x`` in messages.

    Raises:
        TypeError: an operand is not a tensor or has the wrong dtype.
        ValueError: a shape or device is wrong.
    """
    check_rows_operand(x_name, x)
    if not isinstance(w, torch.Tensor) or w.dtype != x.dtype:
        got = _dtype(w) if isinstance(w, torch.Tensor) else type(w).__name__
        raise TypeError(expected("gms", "w", f"{_dtype(x)} like '{x_name}'", got))
    if w.dim() != 3 or w.shape[1] != x.shape[1] or w.device.type != "cpu":
        want = f"[S, {x.shape[1]}, M] on the CPU (K of '{x_name}')"
        raise ValueError(expected("gms", "w", want, f"{tuple(w.shape)} on {w.device}"))
    if w.shape[0] < n_segments:
        raise ValueError(expected("gms", "w", f"at least {n_segments} segments", tuple(w.shape)))
    check_scale(scale, n_pairs, x.dtype)


def check_scale(scale: torch.Tensor | None, n_pairs: int, dtype: torch.dtype | None) -> None:
    """Raise unless ``scale`` is None or a ``[n_pairs]`` CPU tensor of ``dtype``.

    ``dtype`` None: any of :data:`DTYPES`.

    Raises:
        TypeError: the wrong type or dtype.
        ValueError: the wrong shape or device.
    """
    if scale is None:
        return
    ok = isinstance(scale, torch.Tensor) and (
        scale.dtype == dtype if dtype is not None else _dtype(scale) in DTYPES
    )
    if not ok:
        got = _dtype(scale) if isinstance(scale, torch.Tensor) else type(scale).__name__
        want = str(dtype).removeprefix("torch.") if dtype is not None else "float32/float64"
        raise TypeError(expected("gms", "scale", want, got))
    if scale.shape != (n_pairs,) or scale.device.type != "cpu":
        got = f"shape {tuple(scale.shape)} on {scale.device}"
        raise ValueError(expected("gms", "scale", f"1-D of length {n_pairs} on the CPU", got))


def check_count(name: str, value: object) -> int:
    """Raise unless ``value`` is an int >= 0; return it.

    Raises:
        TypeError: not an int.
        ValueError: negative.
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(expected("gms", name, "an int", type(value).__name__))
    if value < 0:
        raise ValueError(expected("gms", name, ">= 0", value))
    return int(value)


@numba.njit(cache=True)
def range_checksum(values, starts, ends):  # type: ignore[no-untyped-def]
    """A position-dependent checksum of ``values[starts[r]:ends[r]]`` over all ranges ``r``.

    Fletcher's: the sum ``a`` of the values and the sum ``b`` of the running sums, in wrapping
    64-bit arithmetic, so a changed value or two values swapped change it (a value ``v`` at
    ``i`` of ``n`` counts ``v`` in ``a`` and ``(n - i) v`` in ``b``). It detects edits, not
    attacks. Two dependent adds per value.
    """
    first = 0
    second = 0
    n = values.shape[0]
    for r in range(starts.shape[0]):
        for i in range(max(starts[r], 0), min(ends[r], n)):
            first += values[i]
            second += first
    return first ^ (second * -7046029254386353131)  # 0x9E3779B97F4A7C15 as int64


def check_segment_ptr(segment_ptr: torch.Tensor, n_rows: int) -> None:
    """Raise unless ``segment_ptr`` runs from 0 to ``n_rows`` without decreasing."""
    ptr = segment_ptr
    if (
        ptr.dim() != 1
        or ptr.dtype.is_floating_point
        or ptr.numel() == 0
        or int(ptr[0]) != 0
        or int(ptr[-1]) != n_rows
        or bool((ptr.diff() < 0).any())
    ):
        raise ValueError(
            expected(
                "gms", "plan segment_ptr", f"non-decreasing from 0 to {n_rows}", ptr[:8].tolist()
            )
        )
