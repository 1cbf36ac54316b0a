"""Dealing work items to CPU threads (numba): longest processing time first, balanced splits.

Kernels whose items differ in cost (an expert hit by many tokens, a segment with many pairs)
run ``for th in prange(threads)`` over a deal made here instead of a static ``prange`` over
items, which splits by count.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True)
def lpt_schedule(costs, threads):  # type: ignore[no-untyped-def]
    """Items to threads, longest processing time first.

    Each item, dearest first, goes to the least loaded thread (within 4/3 of the best split).
    Returns ``(order, ptr, load)``: thread ``t`` runs ``order[ptr[t]:ptr[t + 1]]``, costing
    ``load[t]``. A static
    ``prange`` over items would split them by count, and one popular expert can cost as much as
    all the others together.
    """
    threads = max(1, threads)
    load = np.zeros(threads)
    owner = np.empty(costs.shape[0], dtype=np.int64)
    for i in np.argsort(-costs):
        t = np.argmin(load)
        owner[i] = t
        load[t] += costs[i]
    ptr = np.zeros(threads + 1, dtype=np.int64)
    for i in range(costs.shape[0]):
        ptr[owner[i] + 1] += 1
    for th in range(threads):
        ptr[th + 1] += ptr[th]
    fill = ptr[:-1].copy()
    order = np.empty(costs.shape[0], dtype=np.int64)
    for i in range(costs.shape[0]):
        order[fill[owner[i]]] = i
        fill[owner[i]] += 1
    return order, ptr, load


@numba.njit(cache=True)
def balanced_chunks(items: int, threads: int) -> int:
    """Column ranges per item: ``threads / gcd(items, threads)``.

    The fewest that give every thread the same number of (item, range) pairs (whole matrices
    stream best). Compiled, so kernels call it too.
    """
    threads = max(1, threads)
    a, b = items, threads
    while b:
        a, b = b, a % b
    return threads // max(a, 1)
