r"""Pass 2 of a CPU kernel map: every hit of pass 1 written once, at its plan position.

Pass 1 (:func:`fusekit.gms.kmap.hits.find_hits`) leaves its result in a :class:`Hits`, the
record this module writes from. It counted the hits per (chunk of outputs, offset),
so each chunk knows where its pairs of each offset start; pass 2 then writes, in parallel over
chunks, every pair ``(k, i -> o)`` at its position in offset-major, output-ascending order, with
the CSRs by output row and (SubM) by input row:

* into plain arrays, giving a :class:`~fusekit.gms.kmap.kernel_map.KernelMap`
  (:meth:`Hits.kernel_map`);
* straight into the chosen configuration's packed gms plan (:meth:`Hits.plan`): the runs of each
  (offset, destination block) come from the counts, the tiles from them, and the map is views
  of the plan.

For SubM on sorted voxels pass 1 kept the 13 offsets before the centre only, and each such hit
writes itself and its mirror (:func:`_write_symmetric`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
import torch

from fusekit.gms.features import Features, features_of_counts
from fusekit.gms.kmap.kernel_map import KernelMap
from fusekit.gms.kmap.primitives import CHUNK, DEBRUIJN, KERNEL_VOLUME, lowest_bit, popcount
from fusekit.gms.planning.buffers import empty_plan_with_tiles
from fusekit.gms.planning.build import tiles_of_runs
from fusekit.gms.planning.layout import GMSPlan


@numba.njit(parallel=True, cache=True)
def _write_symmetric(  # type: ignore[no-untyped-def]
    # pass 1's lower hits and each chunk's first [chunks + 1], full bits [N], each chunk's
    # first position per offset [chunks, 27]
    hits,
    hit_ptr,
    mask,
    start,
    # offset pointer [28], CSR pointer by row [N + 1] (by output = by input for SubM)
    offset_ptr,
    ptr,
    debruijn,
    # out [E]: gather, scatter, dst_pos, src_pos
    gather,
    scatter,
    dst_pos,
    src_pos,
):
    """Pass 2 of a SubM map on sorted voxels: each lower hit writes itself and its mirror.

    Hit ``(k, i)`` of ``o`` goes to ``p = start[c, k] + `` (hits of ``k`` before it in chunk
    ``c``). Its mirror ``(26 - k, o -> i)`` takes the same rank in offset ``26 - k``:
    ``p' = offset_ptr[26 - k] + p - offset_ptr[k]``, since ``i`` is ``o`` shifted by one key
    difference, so sorting by ``i`` sorts by ``o``. The centre of ``o`` is
    ``offset_ptr[13] + o``. CSR slots: a pair ``(k, g -> d)`` is the
    ``popcount(mask[d] & (2^k - 1))``-th of row ``d`` and the ``popcount(mask[g] >> (27 - k))``-th
    of input ``g``.
    """
    n = mask.shape[0]
    for c in numba.prange(start.shape[0]):
        at = start[c].copy()
        h = hit_ptr[c]
        for o in range(c * CHUNK, min(n, (c + 1) * CHUNK)):
            full = mask[o]
            lower = full & 0x1FFF
            bits = lower
            t = 0
            while bits:
                k = lowest_bit(bits, debruijn)
                bits &= bits - 1
                i = hits[h]
                h += 1
                p = at[k]
                at[k] = p + 1
                gather[p] = i
                scatter[p] = o
                dst_pos[ptr[o] + t] = p
                src_pos[ptr[i] + popcount(mask[i] >> (KERNEL_VOLUME - k))] = p
                t += 1
                q = offset_ptr[26 - k] + p - offset_ptr[k]
                gather[q] = o
                scatter[q] = i
                dst_pos[ptr[i] + popcount(mask[i] & ((1 << (26 - k)) - 1))] = q
                src_pos[ptr[o] + popcount(full >> (k + 1))] = q
            p = offset_ptr[13] + o
            gather[p] = o
            scatter[p] = o
            dst_pos[ptr[o] + t] = p
            src_pos[ptr[o] + popcount(full >> 14)] = p


@numba.njit(parallel=True, cache=True)
def _fill_order_segment(order, segment, offset_ptr):  # type: ignore[no-untyped-def]
    """``order[p] = p`` and ``segment[p] = k`` on offset ``k``'s positions."""
    for k in numba.prange(offset_ptr.shape[0] - 1):
        for p in range(offset_ptr[k], offset_ptr[k + 1]):
            order[p] = p
            segment[p] = k


@numba.njit(parallel=True, cache=True)
def _write_pairs(  # type: ignore[no-untyped-def]
    # pass 1's hits and each chunk's first [chunks + 1], bits, each chunk's first position per
    # offset [chunks, 27]
    hits,
    hit_ptr,
    mask,
    start,
    # CSR pointers by output row and (SubM) by input row
    dst_ptr,
    src_ptr,
    subm,
    debruijn,
    # out [E]: the plan's gather, scatter, dst_pos and (SubM) src_pos
    gather,
    scatter,
    dst_pos,
    src_pos,
):
    """Pass 2: every hit written at its plan position ``p``, offset-major, outputs ascending.

    The hit ``(k, i)`` of output ``o`` goes to ``p = start[c, k] + `` (hits of ``k`` before it in
    chunk ``c``); ``dst_pos`` lists a row's positions in offset order. SubM maps also fill
    ``src_pos``: input ``i`` feeds through ``k`` exactly when bit ``26 - k`` of ``mask[i]`` is
    set, so pair ``(k, i)`` is the ``popcount(mask[i] >> (27 - k))``-th of input ``i``.
    """
    n_out = mask.shape[0]
    for c in numba.prange(start.shape[0]):
        at = start[c].copy()
        h = hit_ptr[c]
        for o in range(c * CHUNK, min(n_out, (c + 1) * CHUNK)):
            bits = mask[o]
            j = dst_ptr[o]
            while bits:
                k = lowest_bit(bits, debruijn)
                bits &= bits - 1
                i = hits[h]
                h += 1
                p = at[k]
                at[k] = p + 1
                gather[p] = i
                scatter[p] = o
                dst_pos[j] = p
                j += 1
                if subm:
                    src_pos[src_ptr[i] + popcount(mask[i] >> (KERNEL_VOLUME - k))] = p


@numba.njit(cache=True)
def _run_ptr(first_row, before, mask, offset_ptr):  # type: ignore[no-untyped-def]
    """``[27, B + 1]``: where the pairs of offset ``k`` with output row ``>= first_row[b]`` start.

    ``before[c, k]`` counts offset ``k``'s pairs in the chunks before ``c``; the rows of the
    block's first chunk before ``first_row[b]`` are added from their bits.
    """
    out = np.empty((KERNEL_VOLUME, first_row.shape[0]), np.int64)
    for b in range(first_row.shape[0]):
        row = first_row[b]
        c = row // CHUNK
        for k in range(KERNEL_VOLUME):
            out[k, b] = offset_ptr[k] + before[c, k]
        for o in range(c * CHUNK, row):
            for k in range(KERNEL_VOLUME):
                out[k, b] += (mask[o] >> k) & 1
    return out


@numba.njit(cache=True)
def _pad_tiles(run_ptr, tile_rows):  # type: ignore[no-untyped-def]
    """The ``"pad"`` tiles of :func:`fusekit.gms.planning.build.tiles_of_runs` (its reference).

    Each run ``(segment s, block b)`` of ``run_ptr [S, B + 1]`` is cut into tiles of
    ``tile_rows`` pairs, listed by (block, segment), one work item per tile: one pass over the
    tiles in place of that function's dozen numpy passes.
    """
    segments, b1 = run_ptr.shape
    n = 0
    for b in range(b1 - 1):
        for s in range(segments):
            n += (run_ptr[s, b + 1] - run_ptr[s, b] + tile_rows - 1) // tile_rows
    tile_segment = np.empty(n, np.int64)
    tile_start = np.empty(n, np.int64)
    tile_end = np.empty(n, np.int64)
    block_ptr = np.zeros(b1, np.int64)
    t = 0
    for b in range(b1 - 1):
        for s in range(segments):
            hi = run_ptr[s, b + 1]
            for lo in range(run_ptr[s, b], hi, tile_rows):
                tile_segment[t] = s
                tile_start[t] = lo
                tile_end[t] = min(lo + tile_rows, hi)
                t += 1
        block_ptr[b + 1] = t
    return tile_segment, tile_start, tile_end, block_ptr, np.arange(n + 1)


def _tiles(run_ptr: np.ndarray, tile_rows: int, schedule: str) -> dict[str, torch.Tensor]:
    """:func:`fusekit.gms.planning.build.tiles_of_runs`, by :func:`_pad_tiles` for ``"pad"``."""
    if schedule != "pad":
        return tiles_of_runs(torch.from_numpy(run_ptr), tile_rows, schedule)
    names = ("tile_segment", "tile_start", "tile_end", "block_ptr", "item_ptr")
    return dict(zip(names, map(torch.from_numpy, _pad_tiles(run_ptr, tile_rows)), strict=True))


def _block_rows(dst_ptr: np.ndarray, blocks: int) -> np.ndarray:
    r""":func:`fusekit.gms.planning.build.block_rows` (its reference) by one search per block.

    Row ``r`` is in block :math:`\min(\lfloor \text{dst\_ptr}[r] B / E \rfloor, B - 1)`, so
    block ``b < B`` starts at the first row with :math:`\text{dst\_ptr}[r] \ge \lceil b E / B
    \rceil` (``E`` read as 1 when 0), and ``first[B] = N_out``: ``B`` binary searches in place
    of a division per row.
    """
    e = max(int(dst_ptr[-1]), 1)
    first = np.empty(blocks + 1, np.int64)
    cut = -(-np.arange(blocks, dtype=np.int64) * e // blocks)  # ceil(b E / B)
    first[:blocks] = np.searchsorted(dst_ptr[:-1], cut)
    first[blocks] = len(dst_ptr) - 1
    return first


@numba.njit(cache=True)
def _ptr(counts):  # type: ignore[no-untyped-def]
    out = np.zeros(counts.shape[0] + 1, np.int64)
    for i in range(counts.shape[0]):
        out[i + 1] = out[i] + counts[i]
    return out


@numba.njit(cache=True)
def _counting_order(keys, n_keys):  # type: ignore[no-untyped-def]
    """Stable argsort of ``keys`` in ``[0, n_keys)`` and the CSR pointer of each key."""
    ptr = _ptr(np.bincount(keys, minlength=n_keys))
    at = ptr[:-1].copy()
    pos = np.empty(keys.shape[0], np.int64)
    for p in range(keys.shape[0]):
        pos[at[keys[p]]] = p
        at[keys[p]] += 1
    return ptr, pos


@dataclass(frozen=True, slots=True, eq=False)
class Hits:
    """Pass 1 of a CPU kernel map: every pair found, not yet written in plan order.

    Made by :func:`fusekit.gms.kmap.hits.find_hits`. The map's sizes and counts are known here,
    so the gms selector can choose the plan knobs (:meth:`features`) before pass 2 writes the
    pairs straight into the packed plan (:meth:`plan`), or into a :class:`KernelMap`
    (:meth:`kernel_map`).

    Attributes:
        hits: ``[H]`` int32 inputs in (output, offset) order (``H = E``, or when ``symmetric``
            the pairs of the 13 offsets before the centre).
        hit_ptr: ``[chunks + 1]`` where each chunk of 1024 outputs starts in ``hits``.
        mask: ``[N_out]`` int64 each output's offsets as bits (bit ``k``: offset ``k``).
        counts: ``[chunks, 27]`` hits per (chunk of 1024 outputs, offset).
        dst_ptr: ``[N_out + 1]`` pairs by output row.
        n_in: input voxels.
        out_coords: ``[N_out, 4]`` output voxels (the input tensor for SubM).
        out_shape: output spatial shape.
        subm: outputs are the inputs (then the pairs by input row follow from ``mask``).
        symmetric: ``hits`` holds the 13 offsets before the centre only, ``13`` per output
            (:func:`fusekit.gms.kmap.hits._find_lower`: SubM on voxels sorted by key).
    """

    hits: np.ndarray
    hit_ptr: np.ndarray
    mask: np.ndarray
    counts: np.ndarray
    dst_ptr: np.ndarray
    n_in: int
    out_coords: Any
    out_shape: tuple[int, int, int]
    subm: bool
    symmetric: bool = False

    @property
    def num_pairs(self) -> int:
        """``E``."""
        return int(self.dst_ptr[-1])

    @property
    def offset_ptr(self) -> np.ndarray:
        """``[28]`` where each offset's pairs start in plan order."""
        return np.concatenate([[0], np.cumsum(self.counts.sum(0))]).astype(np.int64)

    def features(self, k: int, m: int, dtype: torch.dtype) -> Features:
        """The gms selector's features of the map (``fusekit.gms.features`` of its plan).

        Raises:
            TypeError: a dtype gms does not run.
        """
        degree = np.diff(self.dst_ptr)
        sources = None if self.subm else np.bincount(self.hits, minlength=self.n_in)
        return features_of_counts(
            segment_pairs=tuple(int(n) for n in self.counts.sum(0)),
            degree=degree,
            sources=sources,
            n_in=self.n_in,
            k=k,
            m=m,
            dtype=dtype,
        )

    def _write(self, views: dict[str, np.ndarray]) -> None:
        """Pass 2 into ``views`` (numpy arrays of ``[E]``); the SubM src CSR is ``dst_ptr``."""
        counts, offset_ptr = self.counts, self.offset_ptr
        start = offset_ptr[:-1][None, :] + np.cumsum(counts, 0) - counts
        _fill_order_segment(views["order"], views["segment"], offset_ptr)
        pairs = (views["gather"], views["scatter"], views["dst_pos"], views["src_pos"])
        if self.symmetric:
            _write_symmetric(
                self.hits,
                self.hit_ptr,
                self.mask,
                start,
                offset_ptr,
                self.dst_ptr,
                DEBRUIJN,
                *pairs,
            )
        else:
            _write_pairs(
                self.hits,
                self.hit_ptr,
                self.mask,
                start,
                self.dst_ptr,
                self.dst_ptr,
                self.subm,
                DEBRUIJN,
                *pairs,
            )
        if not self.subm:  # pairs by input row: a counting sort of the gather rows
            src_ptr, src_pos = _counting_order(views["gather"], self.n_in)
            views["src_ptr"][:] = src_ptr
            views["src_pos"][:] = src_pos
        else:
            views["src_ptr"][:] = self.dst_ptr
        views["dst_ptr"][:] = self.dst_ptr

    def kernel_map(self) -> KernelMap:
        """Pass 2 into plain arrays: the :class:`KernelMap` (with its CSRs)."""
        e, n_out = self.num_pairs, self.mask.shape[0]
        views = {n: np.empty(e, np.int64) for n in ("order", "gather", "segment", "scatter")}
        views |= {"dst_pos": np.empty(e, np.int64), "src_pos": np.empty(e, np.int64)}
        views |= {
            "dst_ptr": np.empty(n_out + 1, np.int64),
            "src_ptr": np.empty(self.n_in + 1, np.int64),
        }
        self._write(views)
        gather, segment, scatter = (
            torch.from_numpy(views[n]) for n in ("gather", "segment", "scatter")
        )
        csr = tuple(views[n] for n in ("dst_ptr", "dst_pos", "src_ptr", "src_pos"))
        return self._kernel_map(gather, segment, scatter, csr)

    def plan(self, tile_rows: int, blocks: int, schedule: str) -> tuple[KernelMap, GMSPlan]:
        """Pass 2 straight into a packed gms plan with these knobs, and the map as its views.

        Equal to ``plan_kernel_map(self.kernel_map(), tile_rows, blocks, schedule)``: the runs
        of each (offset, destination block) come from the per-chunk counts (:func:`_run_ptr`),
        the tiles from :func:`fusekit.gms.planning.build.tiles_of_runs`, then every pair is
        written once, at its position in the buffer.
        """
        e, n_out = self.num_pairs, self.mask.shape[0]
        first_row = _block_rows(self.dst_ptr, blocks)
        before = np.zeros((self.counts.shape[0] + 1, KERNEL_VOLUME), np.int64)
        np.cumsum(self.counts, 0, out=before[1:])
        run_ptr = _run_ptr(first_row, before, self.mask, self.offset_ptr)
        out = empty_plan_with_tiles(
            _tiles(run_ptr, tile_rows, schedule),
            num_pairs=e,
            n_in=self.n_in,
            n_out=n_out,
            num_segments=KERNEL_VOLUME,
            num_blocks=blocks,
            tile_rows=tile_rows,
            schedule=schedule,
        )
        self._write({n: v.numpy() for n, v in out.views.items()})
        out.views["segment_ptr"].copy_(torch.from_numpy(self.offset_ptr))
        plan = out.plan()
        kmap = self._kernel_map(plan.gather, plan.segment, plan.scatter, csr=(None,) * 4)
        return kmap, plan

    def _kernel_map(
        self,
        gather: torch.Tensor,
        segment: torch.Tensor,
        scatter: torch.Tensor,
        csr: tuple[Any, ...],
    ) -> KernelMap:
        coords = self.out_coords
        return KernelMap(
            gather=gather,
            segment=segment,
            scatter=scatter,
            offset_ptr=torch.from_numpy(self.offset_ptr),
            n_in=self.n_in,
            out_coords=coords
            if isinstance(coords, torch.Tensor)
            else torch.from_numpy(coords).to(torch.int32),
            out_shape=self.out_shape,
            csr=csr,
        )
