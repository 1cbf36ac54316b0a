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


def term_values(t: IndexTerm, grids: Mapping[str, Any]) -> Any:
    """Index term ``t`` over broadcastable integer ``grids`` of its variables (or integers).

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
    if any(n == 0 for n in out_shape):
        return None
    if all(_affine(t) for t in acc.indices):
        # offsets affine in y: the strides fitted at the unit points reproduce every offset
        point = dict.fromkeys(out_vars, 0)
        base = _offset(acc.indices, point, src_strides)
        return base, tuple(
            _offset(acc.indices, {**point, v: 1}, src_strides) - base if n > 1 else 0
            for v, n in zip(out_vars, out_shape, strict=True)
        )
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


def _affine(t: IndexTerm) -> bool:
    """Whether index term ``t`` is affine in its variables (``+``, ``-``, ``*`` by a constant)."""
    if isinstance(t, IVar | IConst):
        return True
    if not isinstance(t, IBin) or t.op in ("/", "%"):
        return False
    if not (_affine(t.left) and _affine(t.right)):
        return False
    return t.op != "*" or not (_has_var(t.left) and _has_var(t.right))


def _has_var(t: IndexTerm) -> bool:
    if isinstance(t, IVar):
        return True
    return isinstance(t, IBin) and (_has_var(t.left) or _has_var(t.right))


def _offset(terms: tuple[IndexTerm, ...], point: Mapping[str, int], steps: tuple[int, ...]) -> int:
    """The storage offset ``sum_e t_e(point) s_e`` of one element."""
    total = 0
    for t, s in zip(terms, steps, strict=True):
        total += int(term_values(t, point)) * s
    return total
