"""Level writers: the sinks that store an output level or its values (SAM's write scanners)."""

from __future__ import annotations

from fusekit.errors import expected
from fusekit.sparse.sim.base import Primitive
from fusekit.sparse.sim.channel import Channel
from fusekit.sparse.sim.tokens import DONE, EMPTY, Stop, is_data


class _Writer(Primitive):
    kind = "writer"

    def __init__(self, name: str, port: str, stream: Channel) -> None:
        super().__init__(name, {port: stream}, ())
        self.port = port

    def _fire(self, now: int) -> bool:
        tok = self.peek(self.port, now)
        if tok is None:
            return False
        self.pop(self.port)
        if tok is DONE:
            self.done = True
        elif isinstance(tok, Stop):
            self._stop()
        elif is_data(tok):
            self._data(tok)
        else:
            raise self._malformed("coordinates, values, stops and D", tok)
        return True

    def _stop(self) -> None:
        """A stop token arrived."""

    def _data(self, tok: object) -> None:
        """A data token arrived."""


class CompressedWriter(_Writer):
    """Stores a coordinate stream as a compressed level: ``crd_arr`` and ``seg_arr``.

    A stop that closes a non-empty fiber appends the running count to ``seg_arr`` (which starts
    ``[0]``): an empty fiber adds no entry, since SAM's coordinate droppers leave the empty inner
    fibers of dropped outer coordinates in the stream. ``N`` stores nothing.
    """

    def __init__(self, name: str, in_crd: Channel) -> None:
        super().__init__(name, "in_crd", in_crd)
        self.crd_arr: list[int] = []
        self.seg_arr: list[int] = [0]

    def _stop(self) -> None:
        if len(self.crd_arr) > self.seg_arr[-1]:
            self.seg_arr.append(len(self.crd_arr))

    def _data(self, tok: object) -> None:
        if tok is not EMPTY:
            self.crd_arr.append(int(tok))  # type: ignore[call-overload]


class UncompressedWriter(_Writer):
    """A dense output level of size ``dim``: nothing to store but the size; counts its fibers."""

    def __init__(self, name: str, dim: int, in_crd: Channel) -> None:
        super().__init__(name, "in_crd", in_crd)
        if dim < 0:
            raise ValueError(expected(name, "dim", ">= 0", dim))
        self.dim = dim
        self.coordinates = 0

    def _data(self, tok: object) -> None:
        self.coordinates += 1


class ValsWriter(_Writer):
    """Stores a value stream in order (``vals``); stops carry no value, ``N`` stores 0."""

    def __init__(self, name: str, in_val: Channel) -> None:
        super().__init__(name, "in_val", in_val)
        self.vals: list[float] = []

    def _data(self, tok: object) -> None:
        self.vals.append(0.0 if tok is EMPTY else tok)  # type: ignore[arg-type]
