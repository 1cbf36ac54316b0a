"""Tensors of the IR: shape (static or symbolic dims), dtype, storage format and statistics.

A tensor is plain data; its values live elsewhere (a ``torch.Tensor`` handed to the interpreter).
The storage format follows TACO: one level format per dimension, stored in a mode order::

    dense   X[i,j]                      levels (dense, dense)
    CSR     A[i,j]  rows dense, columns compressed    (dense, compressed)
    CSC     A[i,j]  same levels, mode order (1, 0)
    COO     A[i,j]  (compressed, singleton): a non-unique compressed level of row
                    coordinates and a singleton level of column coordinates
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

from fusekit.errors import expected

#: A dimension: a size, or the name of a symbolic size bound when the graph runs.
Dim = int | str

#: The element types a tensor may have (torch's names).
DTYPES: frozenset[str] = frozenset(
    {
        "float64",
        "float32",
        "float16",
        "bfloat16",
        "int64",
        "int32",
        "int16",
        "int8",
        "uint8",
        "bool",
        "complex64",
        "complex128",
    }
)

#: Reduction prefixes of the text form: a tensor name may not start with one of them.
RESERVED_PREFIXES: tuple[str, ...] = ("sum_", "max_", "min_", "prod_", "mean_")
#: Words of the text form that cannot name a tensor.
RESERVED_NAMES: frozenset[str] = frozenset(
    {"inf", "nan", "opaque", "torch", "None", "True", "False"}
)

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SYMBOL = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")


def check_tensor_name(name: str, where: str = "ir") -> str:
    """Check that ``name`` can name a tensor in the text form.

    Args:
        name: the candidate name.
        where: the caller, for the error message.

    Returns:
        ``name`` unchanged.

    Raises:
        ValueError: if ``name`` is not an identifier, is a reserved word or starts with a
            reduction prefix.
    """
    if (
        not isinstance(name, str)
        or not _IDENT.match(name)
        or name.startswith(RESERVED_PREFIXES)
        or name in RESERVED_NAMES
    ):
        raise ValueError(
            expected(
                where,
                "name",
                "an identifier, not a reserved word, not starting with sum_/max_/min_/prod_/mean_",
                repr(name),
            )
        )
    return name


class Level(StrEnum):
    """The storage of one tensor dimension (TACO level formats)."""

    DENSE = "dense"
    COMPRESSED = "compressed"
    SINGLETON = "singleton"


@dataclass(frozen=True, slots=True)
class Format:
    """Per-level storage of a tensor.

    Attributes:
        levels: one level format per stored level, outermost first.
        order: the dimension stored at each level (``(1, 0)`` stores columns first); ``None``
            means the identity order.
    """

    levels: tuple[Level, ...]
    order: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "levels", tuple(Level(level) for level in self.levels))
        if self.order is not None:
            if sorted(self.order) != list(range(len(self.levels))):
                raise ValueError(
                    expected(
                        "Format",
                        "order",
                        f"a permutation of 0..{len(self.levels) - 1}",
                        self.order,
                    )
                )
            if tuple(self.order) == tuple(range(len(self.levels))):
                object.__setattr__(self, "order", None)
        if Level.SINGLETON in self.levels[:1]:
            raise ValueError(expected("Format", "levels", "no singleton level first", self.levels))

    @classmethod
    def dense(cls, rank: int) -> Format:
        """All levels dense, in the identity order."""
        return cls((Level.DENSE,) * rank)

    @classmethod
    def csr(cls) -> Format:
        """Compressed sparse rows: dense rows, compressed columns."""
        return cls((Level.DENSE, Level.COMPRESSED))

    @classmethod
    def csc(cls) -> Format:
        """Compressed sparse columns: CSR levels in mode order (1, 0)."""
        return cls((Level.DENSE, Level.COMPRESSED), (1, 0))

    @classmethod
    def coo(cls, rank: int = 2) -> Format:
        """Coordinates: one compressed (non-unique) level, then singleton levels."""
        return cls((Level.COMPRESSED, *(Level.SINGLETON,) * (rank - 1)))

    @property
    def rank(self) -> int:
        """The number of levels."""
        return len(self.levels)

    @property
    def is_dense(self) -> bool:
        """Whether every level is dense."""
        return all(level is Level.DENSE for level in self.levels)


@dataclass(frozen=True, slots=True)
class TensorStats:
    """Optional statistics of a tensor's contents, used by cost models.

    Attributes:
        nnz: stored non-zeros of a sparse tensor.
        segment_sizes: sizes of the segments of a segmented index (pairs per relation or per
            expert; non-zeros per row of a sparse matrix).
    """

    nnz: int | None = None
    segment_sizes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.nnz is not None and (not isinstance(self.nnz, int) or self.nnz < 0):
            raise ValueError(expected("TensorStats", "nnz", "a non-negative int", self.nnz))
        if self.segment_sizes is not None:
            sizes = tuple(self.segment_sizes)
            if any(not isinstance(s, int) or s < 0 for s in sizes):
                raise ValueError(
                    expected("TensorStats", "segment_sizes", "non-negative ints", sizes)
                )
            object.__setattr__(self, "segment_sizes", sizes)


@dataclass(frozen=True, slots=True)
class Tensor:
    """A tensor of the graph: a name, a shape, an element type and a storage format.

    Attributes:
        name: identifier used by the ops' index expressions.
        shape: one :data:`Dim` per dimension (an int, or a symbol name such as ``"N"``).
        dtype: element type, one of :data:`DTYPES`.
        format: per-level storage; dense when not given.
        stats: optional statistics (non-zeros, segment sizes).
    """

    name: str
    shape: tuple[Dim, ...]
    dtype: str = "float32"
    format: Format = field(default=Format(()))
    stats: TensorStats | None = None

    def __post_init__(self) -> None:
        check_tensor_name(self.name, "Tensor")
        shape = tuple(self.shape)
        for dim in shape:
            ok_int = isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0
            ok_sym = isinstance(dim, str) and _SYMBOL.match(dim) is not None
            if not (ok_int or ok_sym):
                raise ValueError(
                    expected(
                        f"Tensor {self.name}",
                        "shape",
                        "non-negative ints or symbol names",
                        shape,
                    )
                )
        object.__setattr__(self, "shape", shape)
        if self.dtype not in DTYPES:
            raise ValueError(
                expected(
                    f"Tensor {self.name}",
                    "dtype",
                    "one of " + ", ".join(sorted(DTYPES)),
                    self.dtype,
                )
            )
        if self.format.rank == 0 and shape:
            object.__setattr__(self, "format", Format.dense(len(shape)))
        if self.format.rank != len(shape):
            raise ValueError(
                expected(
                    f"Tensor {self.name}",
                    "format",
                    f"{len(shape)} levels, one per dimension",
                    self.format.rank,
                )
            )

    @property
    def rank(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    @property
    def is_sparse(self) -> bool:
        """Whether some level is compressed or singleton."""
        return not self.format.is_dense

    @property
    def is_static(self) -> bool:
        """Whether every dimension is a known int."""
        return all(isinstance(d, int) for d in self.shape)

    def numel(self) -> int:
        """The number of elements of a static shape.

        Raises:
            ValueError: if some dimension is symbolic.
        """
        total = 1
        for dim in self.shape:
            if not isinstance(dim, int):
                raise ValueError(
                    expected(f"Tensor {self.name}", "shape", "static to count elements", self.shape)
                )
            total *= dim
        return total
