"""Strided views of index expressions: what a read's offsets are as ``base + sum y_d sigma_d``.

A read ``Y[y] = src[t_0(y), ..., t_{r-1}(y)]`` whose offsets into ``src`` are affine in ``y`` is a
strided view of ``src`` (no copy): :func:`fit_strides` finds its storage offset and strides or
says there are none. Stitch asks this of layout ops (views returned as they are), of candidate
groups (a folded read of a view) and of kernel operands.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fusekit.ir.expr import Access, IBin, IConst, IndexTerm, IVar


def term_values(t: IndexTerm, grids: Mapping[str, np.ndarray]) -> Any:
    """Index term ``t`` evaluated over broadcastable integer ``grids`` of its variables.

    ``/`` and ``%`` are floor division and remainder, as in the IR; an indirect index (a
    read) raises.
    """
    if isinstance(t, IVar):
        return grids[t.name]
    if isinstance(t, IConst):
        return t.value
    if isinstance(t, IBin):
        left, right = term_values(t.left, grids), term_values(t.right, grids)
        if t.op == "+":
            return left + right
        if t.op == "-":
            return left - right
        if t.op == "*":
            return left * right
        return left // right if t.op == "/" else left % right
    raise ValueError(f"ir: cannot evaluate index term {t!r} (an indirect index)")


def fit_strides(
    acc: Access, out_vars: tuple[str, ...], out_shape: tuple[int, ...], src_strides: tuple[int, ...]
) -> tuple[int, tuple[int, ...]] | None:
    r"""Storage offset and strides of ``Y[out_vars] = src[acc.indices]`` as a view, or ``None``.

    .. math:: \mathrm{off}(y) = \sum_e t_e(y) s_e = b + \sum_d y_d \sigma_d

    where :math:`t_e` are the read's index terms and :math:`s_e` the source strides; the view
    exists iff the fitted strides :math:`\sigma_d = \mathrm{off}(e_d) - b` reproduce every
    offset (checked over all elements, once per stride signature).
    """
    rank = len(out_vars)
    grids = {
        v: np.arange(n, dtype=np.int64).reshape([n if i == j else 1 for j in range(rank)])
        for i, (v, n) in enumerate(zip(out_vars, out_shape, strict=True))
    }
    off = np.zeros(out_shape, dtype=np.int64)
    for t, s in zip(acc.indices, src_strides, strict=True):
        off = off + np.asarray(term_values(t, grids), dtype=np.int64) * s
    off = np.broadcast_to(off, out_shape)
    if off.size == 0:
        return None
    base = int(off.reshape(-1)[0])
    strides = []
    for d, n in enumerate(out_shape):
        unit = tuple(1 if (k == d and n > 1) else 0 for k in range(rank))
        strides.append(int(off[unit]) - base)
    fitted = np.full(out_shape, base, dtype=np.int64)
    for d, s in enumerate(strides):
        fitted = fitted + grids[out_vars[d]] * s
    return (base, tuple(strides)) if np.array_equal(off, fitted) else None
