"""Sparse tensors stored level by level (TACO/SAM), built from SciPy, torch.sparse or numpy.

A tensor of rank ``r`` is stored in a mode order (the dimension held at each level) as ``r``
levels, outermost first. Every level maps a *parent position* ``p`` to a fiber of coordinates
and child positions::

    dense(d)          coords 0..d-1                 positions p*d + c
    compressed        coords crd[seg[p]:seg[p+1]]   positions seg[p] .. seg[p+1]-1
    singleton         coord  crd[p]                 position  p        (COO's inner levels)

The root has one position, 0; the values are indexed by the positions of the last level. The
named formats of a matrix ``A[i,j]``::

    dense   (dense, dense)                 csr   (dense, compressed)
    csc     (dense, compressed), order (1,0)
    dcsr    (compressed, compressed)       coo   (compressed non-unique, singleton)
    bcsr(b) a 4-D tensor A[I,J,ii,jj] = A[I*b+ii, J*b+jj]: (dense, compressed, dense, dense)

Inputs are validated, never repaired: a segment array that decreases, coordinates that are
unsorted or out of range, or values of the wrong length raise ``ValueError`` naming the tensor and
the level.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from fusekit.errors import expected

# scipy and torch are imported by the converters that use them: both are slow to load, and the
# simulators and the per-token machine store tensors without either.

#: The format names :func:`from_scipy`, :func:`from_dense` and :func:`from_torch` understand.
FORMATS: tuple[str, ...] = ("dense", "csr", "csc", "dcsr", "coo", "bcsr")


class LevelKind(StrEnum):
    """How one level stores its coordinates."""

    DENSE = "dense"
    COMPRESSED = "compressed"
    SINGLETON = "singleton"


@dataclass(frozen=True, eq=False)
class StoredLevel:
    """One level: its kind, its size and, when not dense, its segment and coordinate arrays.

    Attributes:
        kind: dense, compressed or singleton.
        size: the extent of the dimension stored here.
        seg: ``n_parent + 1`` non-decreasing offsets (compressed levels only).
        crd: the coordinates (compressed and singleton levels).
        unique: whether coordinates are strictly increasing within a fiber (False only for
            COO's first level).
    """

    kind: LevelKind
    size: int
    seg: np.ndarray | None = None
    crd: np.ndarray | None = None
    unique: bool = True

    def positions(self, n_parent: int) -> int:
        """The number of positions of this level given the parent's."""
        if self.kind is LevelKind.DENSE:
            return n_parent * self.size
        if self.kind is LevelKind.COMPRESSED:
            assert self.seg is not None
            return int(self.seg[-1])
        return n_parent

    def fibers(self, refs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Expand parent positions into their fibers, vectorised.

        Args:
            refs: parent positions, one per fiber.

        Returns:
            ``(owner, crd, pos)``: for each child, the index into ``refs`` of its parent, its
            coordinate and its position.
        """
        refs = np.asarray(refs, dtype=np.int64)
        if self.kind is LevelKind.DENSE:
            owner = np.repeat(np.arange(len(refs)), self.size)
            crd = np.tile(np.arange(self.size, dtype=np.int64), len(refs))
            return owner, crd, refs[owner] * self.size + crd
        if self.kind is LevelKind.SINGLETON:
            assert self.crd is not None
            return np.arange(len(refs)), self.crd[refs].astype(np.int64), refs
        assert self.seg is not None and self.crd is not None
        start, stop = self.seg[refs], self.seg[refs + 1]
        counts = (stop - start).astype(np.int64)
        owner = np.repeat(np.arange(len(refs)), counts)
        offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        pos = np.repeat(start, counts).astype(np.int64) + offsets
        return owner, self.crd[pos].astype(np.int64), pos


@dataclass(frozen=True, eq=False)
class SparseTensor:
    """A tensor stored per level.

    Attributes:
        name: the tensor's name (used in every error message).
        shape: the logical shape.
        order: the dimension stored at each level (``(1, 0)`` for CSC).
        levels: one :class:`StoredLevel` per dimension, outermost first.
        values: one value per position of the last level.
        format: the named format it was built as (``"csr"``, ...).
    """

    name: str
    shape: tuple[int, ...]
    order: tuple[int, ...]
    levels: tuple[StoredLevel, ...]
    values: np.ndarray
    format: str = "custom"

    def __post_init__(self) -> None:
        check(self)

    @property
    def rank(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    @property
    def nnz(self) -> int:
        """The number of stored values (explicit zeros included)."""
        return len(self.values)

    @property
    def is_dense(self) -> bool:
        """Whether every level is dense."""
        return all(lv.kind is LevelKind.DENSE for lv in self.levels)

    def level_of(self, dim: int) -> int:
        """The level that stores dimension ``dim``."""
        return self.order.index(dim)

    def coords(self) -> tuple[np.ndarray, np.ndarray]:
        """All stored coordinates, one row per value in storage order, and their values.

        Returns:
            ``(coords, values)`` with ``coords`` of shape ``[nnz, rank]`` in *logical* dimension
            order.
        """
        refs = np.zeros(1, dtype=np.int64)
        cols: list[np.ndarray] = []
        for level in self.levels:
            owner, crd, refs = level.fibers(refs)
            cols = [c[owner] for c in cols] + [crd]
        stored = np.stack(cols, axis=1) if cols else np.zeros((1, 0), dtype=np.int64)
        logical = np.empty_like(stored)
        logical[:, list(self.order)] = stored
        return logical, self.values[refs]

    def to_dense(self) -> np.ndarray:
        """The dense array (duplicates of a COO level add up)."""
        out = np.zeros(self.shape, dtype=self.values.dtype)
        coords, vals = self.coords()
        np.add.at(out, tuple(coords.T), vals)
        return out


def check(t: SparseTensor) -> None:
    """Validate a tensor's levels against its shape.

    Raises:
        ValueError: for a mode order that is not a permutation, a level whose size differs from
            its dimension, a segment array of the wrong length, not starting at 0 or decreasing,
            coordinates out of range or unsorted within a fiber, or values of the wrong length;
            the message names the tensor and the level.
    """
    where = f"sparse tensor {t.name}"
    if sorted(t.order) != list(range(len(t.shape))) or len(t.levels) != len(t.shape):
        raise ValueError(
            expected(where, "order", f"a permutation of 0..{len(t.shape) - 1}", t.order)
        )
    n_parent = 1
    for lvl, level in enumerate(t.levels):
        at = f"{where} level {lvl}"
        if level.size != t.shape[t.order[lvl]]:
            raise ValueError(
                expected(
                    at, "size", f"dimension {t.order[lvl]} = {t.shape[t.order[lvl]]}", level.size
                )
            )
        if level.kind is LevelKind.COMPRESSED:
            _check_segments(at, level, n_parent)
        if level.kind is not LevelKind.DENSE:
            _check_coordinates(at, level, n_parent)
        n_parent = level.positions(n_parent)
    if t.values.ndim != 1 or len(t.values) != n_parent:
        raise ValueError(
            expected(where, "values", f"{n_parent} values, one per position", t.values.shape)
        )


def _check_segments(at: str, level: StoredLevel, n_parent: int) -> None:
    seg = level.seg
    if seg is None or level.crd is None:
        raise ValueError(expected(at, "seg/crd", "arrays for a compressed level", None))
    if seg.ndim != 1 or len(seg) != n_parent + 1:
        raise ValueError(expected(at, "seg", f"{n_parent + 1} offsets", seg.shape))
    if seg[0] != 0 or np.any(np.diff(seg) < 0):
        bad = int(np.argmax(np.diff(seg) < 0)) if seg[0] == 0 else 0
        raise ValueError(
            expected(
                at,
                "seg",
                "non-decreasing from 0",
                f"seg[{bad}:{bad + 2}]={seg[bad : bad + 2].tolist()}",
            )
        )
    if seg[-1] != len(level.crd):
        raise ValueError(expected(at, "seg[-1]", f"len(crd) = {len(level.crd)}", int(seg[-1])))


def _check_coordinates(at: str, level: StoredLevel, n_parent: int) -> None:
    crd = level.crd
    assert crd is not None
    if level.kind is LevelKind.SINGLETON and len(crd) != n_parent:
        raise ValueError(expected(at, "crd", f"{n_parent} coordinates (singleton)", len(crd)))
    if len(crd) and (crd.min() < 0 or crd.max() >= level.size):
        raise ValueError(
            expected(at, "crd", f"in [0, {level.size})", f"[{crd.min()}, {crd.max()}]")
        )
    if level.kind is not LevelKind.COMPRESSED or len(crd) < 2:
        return
    assert level.seg is not None
    step = np.diff(crd.astype(np.int64))
    starts = np.zeros(len(crd), dtype=bool)
    starts[level.seg[:-1][level.seg[:-1] < len(crd)]] = True
    inside = ~starts[1:]
    bad = inside & ((step <= 0) if level.unique else (step < 0))
    if np.any(bad):
        k = int(np.argmax(bad))
        raise ValueError(
            expected(
                at,
                "crd",
                "sorted" + (" and unique" if level.unique else "") + " within each fiber",
                f"crd[{k}:{k + 2}]={crd[k : k + 2].tolist()}",
            )
        )


def _dense_level(size: int) -> StoredLevel:
    return StoredLevel(LevelKind.DENSE, size)


def _compressed(size: int, seg: Any, crd: Any, unique: bool = True) -> StoredLevel:
    return StoredLevel(
        LevelKind.COMPRESSED, size, np.asarray(seg, np.int64), np.asarray(crd, np.int64), unique
    )


def from_dense(name: str, array: Any, fmt: str = "dense", block: int = 1) -> SparseTensor:
    """Store a dense array (numpy or torch) in a named format, keeping only non-zeros.

    Args:
        name: the tensor's name.
        array: the values; 2-D unless ``fmt`` is ``"dense"``.
        fmt: one of :data:`FORMATS`.
        block: the block size of ``"bcsr"``.

    Raises:
        ValueError: for an unknown format or a shape the format cannot hold.
    """
    arr = np.asarray(array)
    if fmt == "dense":
        levels = tuple(_dense_level(int(s)) for s in arr.shape)
        return SparseTensor(
            name, tuple(arr.shape), tuple(range(arr.ndim)), levels, arr.reshape(-1), "dense"
        )
    import scipy.sparse as sp

    if arr.ndim != 2:
        raise ValueError(
            expected(f"sparse tensor {name}", "array", f"2-D for format {fmt!r}", arr.shape)
        )
    return from_scipy(name, sp.csr_matrix(arr), fmt, block)


def from_scipy(name: str, matrix: Any, fmt: str = "csr", block: int = 1) -> SparseTensor:
    """Store a SciPy sparse matrix in a named format.

    The matrix's own index arrays are used as they are (CSR and CSC) and validated: call
    ``sort_indices()`` on a matrix with unsorted indices first.

    Args:
        name: the tensor's name.
        matrix: any ``scipy.sparse`` matrix or array.
        fmt: one of :data:`FORMATS`.
        block: the block size of ``"bcsr"`` (must divide both dimensions).

    Raises:
        ValueError: for an unknown format, unsorted or out-of-range indices, or a block size
            that does not divide the shape.
    """
    import scipy.sparse as sp

    where = f"sparse tensor {name}"
    m, n = (int(s) for s in matrix.shape)
    if fmt == "csr":
        a = matrix if sp.issparse(matrix) and matrix.format == "csr" else sp.csr_matrix(matrix)
        levels = (_dense_level(m), _compressed(n, a.indptr, a.indices))
        return SparseTensor(name, (m, n), (0, 1), levels, np.asarray(a.data), "csr")
    if fmt == "csc":
        a = matrix if sp.issparse(matrix) and matrix.format == "csc" else sp.csc_matrix(matrix)
        levels = (_dense_level(n), _compressed(m, a.indptr, a.indices))
        return SparseTensor(name, (m, n), (1, 0), levels, np.asarray(a.data), "csc")
    if fmt == "dcsr":
        a = sp.csr_matrix(matrix)
        rows = np.flatnonzero(np.diff(a.indptr))
        seg_j = np.concatenate([[0], a.indptr[rows + 1]])
        levels = (_compressed(m, [0, len(rows)], rows), _compressed(n, seg_j, a.indices))
        return SparseTensor(name, (m, n), (0, 1), levels, np.asarray(a.data), "dcsr")
    if fmt == "coo":
        a = sp.coo_matrix(matrix)
        key = np.lexsort((a.col, a.row))
        rows, cols = a.row[key], a.col[key]
        levels = (
            _compressed(m, [0, len(rows)], rows, unique=False),
            StoredLevel(LevelKind.SINGLETON, n, None, np.asarray(cols, np.int64)),
        )
        return SparseTensor(name, (m, n), (0, 1), levels, np.asarray(a.data)[key], "coo")
    if fmt == "bcsr":
        if block < 1 or m % block or n % block:
            raise ValueError(expected(where, "block", f"a divisor of {m} and {n}", block))
        b = sp.bsr_matrix(sp.csr_matrix(matrix), blocksize=(block, block))
        b.sort_indices()
        blocked = (
            _dense_level(m // block),
            _compressed(n // block, b.indptr, b.indices),
            _dense_level(block),
            _dense_level(block),
        )
        shape = (m // block, n // block, block, block)
        return SparseTensor(
            name, shape, (0, 1, 2, 3), blocked, np.asarray(b.data).reshape(-1), "bcsr"
        )
    raise ValueError(expected(where, "fmt", "one of " + ", ".join(FORMATS), repr(fmt)))


def from_torch(name: str, tensor: Any, fmt: str | None = None) -> SparseTensor:
    """Store a torch tensor: COO, CSR and CSC layouts keep their format, strided ones are dense.

    Args:
        name: the tensor's name.
        tensor: a ``torch.Tensor`` of any layout.
        fmt: a format to convert to instead (one of :data:`FORMATS`).

    Raises:
        ValueError: for a layout that is not COO, CSR, CSC or strided.
    """
    import scipy.sparse as sp
    import torch

    t = tensor.detach().cpu()
    if t.layout == torch.strided:
        return from_dense(name, t.numpy(), fmt or "dense")
    if t.layout == torch.sparse_coo:
        t = t.coalesce()
        i = t.indices().numpy()
        mat = sp.coo_matrix((t.values().numpy(), (i[0], i[1])), shape=tuple(t.shape))
        return from_scipy(name, mat, fmt or "coo")
    if t.layout == torch.sparse_csr:
        mat = sp.csr_matrix(
            (t.values().numpy(), t.col_indices().numpy(), t.crow_indices().numpy()),
            shape=tuple(t.shape),
        )
        return from_scipy(name, mat, fmt or "csr")
    if t.layout == torch.sparse_csc:
        mat = sp.csc_matrix(
            (t.values().numpy(), t.row_indices().numpy(), t.ccol_indices().numpy()),
            shape=tuple(t.shape),
        )
        return from_scipy(name, mat, fmt or "csc")
    raise ValueError(
        expected(
            f"sparse tensor {name}",
            "layout",
            "strided, sparse_coo, sparse_csr or sparse_csc",
            t.layout,
        )
    )


def from_coords(
    name: str,
    shape: tuple[int, ...],
    coords: np.ndarray,
    values: np.ndarray,
    order: tuple[int, ...],
) -> SparseTensor:
    """Build a tensor from points sorted in storage order (``coords`` columns in storage order).

    A level is dense where every fiber is full, compressed otherwise.
    """
    levels: list[StoredLevel] = []
    n_parent = 1
    parent_id = np.zeros(len(coords), dtype=np.int64)
    for lvl, dim in enumerate(order):
        size = shape[dim]
        key = parent_id * size + coords[:, lvl]
        uniq, inverse = np.unique(key, return_inverse=True)
        if len(uniq) == n_parent * size:
            levels.append(StoredLevel(LevelKind.DENSE, size))
            parent_id = key
            n_parent = n_parent * size
        else:
            owner = uniq // size
            seg = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=n_parent))])
            levels.append(
                StoredLevel(
                    LevelKind.COMPRESSED, size, seg.astype(np.int64), (uniq % size).astype(np.int64)
                )
            )
            parent_id = inverse.astype(np.int64)
            n_parent = len(uniq)
    vals = np.zeros(n_parent, dtype=np.float64)
    vals[parent_id] = values
    return SparseTensor(
        name,
        shape,
        order,
        tuple(levels),
        vals,
        "dense" if all(lv.kind is LevelKind.DENSE for lv in levels) else "sparse",
    )


def restore(t: SparseTensor, order: tuple[int, ...]) -> SparseTensor:
    """Store ``t`` again in another mode order (levels dense where full, compressed otherwise)."""
    if tuple(order) == t.order:
        return t
    coords, vals = t.coords()
    stored = coords[:, list(order)]
    key = np.lexsort(stored.T[::-1])
    return from_coords(t.name, t.shape, stored[key], vals[key], tuple(order))
