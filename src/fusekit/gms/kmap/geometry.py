r"""The geometry of a sparse 3-D convolution: kernel size, stride, padding, dilation, kind.

Offsets are numbered row-major over the kernel, as spconv 2.x numbers them (its weight
``[out, kz, ky, kx, in]`` reshaped to ``[out, V, in]``):

.. math::

    r = (r_z K_y + r_y) K_x + r_x, \qquad V = K_z K_y K_x,

and per axis (spconv's ``ConvOutLocIter``) the pairs ``(i, r, o)`` are

* regular: :math:`c_i = s\, c_o - p + d\, r` with
  ``0 <= c_o < floor((S + 2p - d (K - 1) - 1) / s) + 1``;
* submanifold: outputs on the inputs, ``s = 1``, ``p = (K // 2) d`` (odd ``K`` only: spconv
  refuses even submanifold kernels);
* transposed: :math:`c_o = s\, c_i - p + d\, r` with ``0 <= c_o < (S - 1) s - 2p + K``
  (spconv's deconvolution shape, which leaves the dilation out);
* inverse: the pairs of the regular convolution it inverts, input and output swapped.

A submanifold map of odd sizes is closed under mirroring: offset ``r`` reads the voxel
``-(r - r_c) d`` away that offset ``V - 1 - r`` reads ``+(r - r_c) d`` away.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fusekit.errors import expected

#: Largest kernel size per axis.
MAX_KERNEL = 7
#: Largest stride, padding or dilation per axis (coordinates are int32).
MAX_STEP = 2**31


def triple(where: str, name: str, value: Any, low: int, high: int) -> tuple[int, int, int]:
    """``value`` (an int or 3 ints) as 3 ints in ``[low, high]``, or a ValueError naming it."""
    what = f"an int in [{low}, {high}] or 3 of them"
    values = (value,) * 3 if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(values, tuple | list) or len(values) != 3:
        raise ValueError(expected(where, name, what, repr(value)))
    if any(isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high for v in values):
        raise ValueError(expected(where, name, what, repr(value)))
    return (int(values[0]), int(values[1]), int(values[2]))


@dataclass(frozen=True, slots=True)
class Geometry:
    """What a kernel map depends on besides the voxels.

    Attributes:
        kernel_size: ``(K_z, K_y, K_x)`` in ``[1, 7]``.
        stride: ``(s_z, s_y, s_x)`` (1 for submanifold maps).
        padding: ``(p_z, p_y, p_x)`` (``(K // 2) d`` for submanifold maps).
        dilation: ``(d_z, d_y, d_x)``.
        subm: outputs on the inputs.
        transposed: a transposed (deconvolution) map.
    """

    kernel_size: tuple[int, int, int] = (3, 3, 3)
    stride: tuple[int, int, int] = (1, 1, 1)
    padding: tuple[int, int, int] = (1, 1, 1)
    dilation: tuple[int, int, int] = (1, 1, 1)
    subm: bool = True
    transposed: bool = False

    @classmethod
    def create(
        cls,
        kernel_size: Any = 3,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        subm: bool = False,
        transposed: bool = False,
        where: str = "sparse conv",
    ) -> Geometry:
        """A checked geometry; submanifold maps get ``s = 1`` and ``p = (K // 2) d``.

        Raises:
            ValueError: a size outside ``[1, 7]``, a stride or dilation below 1, a negative
                padding (each naming its argument), an even submanifold kernel, or a map both
                submanifold and transposed.
        """
        k = triple(where, "kernel_size", kernel_size, 1, MAX_KERNEL)
        s = triple(where, "stride", stride, 1, MAX_STEP)
        p = triple(where, "padding", padding, 0, MAX_STEP)
        d = triple(where, "dilation", dilation, 1, MAX_STEP)
        if subm:
            if any(n % 2 == 0 for n in k):
                raise ValueError(
                    expected(where, "kernel_size", "odd sizes for a submanifold map (spconv)", k)
                )
            if transposed:
                raise ValueError(expected(where, "transposed", "False for a submanifold map", True))
            s, p = (1, 1, 1), (k[0] // 2 * d[0], k[1] // 2 * d[1], k[2] // 2 * d[2])
        return cls(k, s, p, d, bool(subm), bool(transposed))

    @property
    def volume(self) -> int:
        """``V = K_z K_y K_x`` offsets."""
        return self.kernel_size[0] * self.kernel_size[1] * self.kernel_size[2]

    @property
    def classic(self) -> bool:
        """A 3x3x3 kernel of dilation 1, not transposed: the fast builder's geometry."""
        return self.kernel_size == (3, 3, 3) and self.dilation == (1, 1, 1) and not self.transposed

    def output_shape(self, shape: Sequence[int]) -> tuple[int, int, int]:
        """The output grid of an input grid ``shape`` (spconv's sizes; may hold sizes < 1)."""
        if self.subm:
            return (int(shape[0]), int(shape[1]), int(shape[2]))
        k, s, p, d = self.kernel_size, self.stride, self.padding, self.dilation
        if self.transposed:
            return tuple((shape[a] - 1) * s[a] - 2 * p[a] + k[a] for a in range(3))  # type: ignore[return-value]
        return tuple((shape[a] + 2 * p[a] - d[a] * (k[a] - 1) - 1) // s[a] + 1 for a in range(3))  # type: ignore[return-value]

    def offsets(self) -> list[tuple[int, int, int]]:
        """``(r_z, r_y, r_x)`` of every offset, in offset order."""
        kz, ky, kx = self.kernel_size
        return [(a, b, c) for a in range(kz) for b in range(ky) for c in range(kx)]


#: The geometry the layers had before any other: SubM 3x3x3.
SUBM_3 = Geometry()
