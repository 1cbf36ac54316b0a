"""A schedule of a sparse program: region cuts, dataflow orders, storage orders, parallelism."""

from __future__ import annotations

from dataclasses import dataclass

from fusekit.errors import expected

#: The region cuts: every statement alone, one region per layer, one region for everything.
CUTS: tuple[str, ...] = ("unfused", "partial", "full")


@dataclass(frozen=True, slots=True)
class Schedule:
    """How a program runs on the streaming machine.

    Attributes:
        cut: ``unfused``, ``partial`` or ``full`` (a label of ``regions``).
        regions: the statements (by output name) of each region, regions in program order;
            regions run one after the other, the statements of a region as one pipeline.
        orders: ``(statement, dataflow order)`` for every statement.
        storage: ``(statement, tensor, mode order)``: a stored input re-stored offline in
            another mode order for that statement (CSC instead of CSR); absent means as given.
        par: ``(level, factor)``: the variable at position ``level`` of each region's root
            order, and everything below it, runs on ``factor`` lanes.
        block: the block size of block-sparse operands (a label; the program holds the data).
    """

    cut: str
    regions: tuple[tuple[str, ...], ...]
    orders: tuple[tuple[str, tuple[str, ...]], ...]
    storage: tuple[tuple[str, str, tuple[int, ...]], ...] = ()
    par: tuple[int, int] | None = None
    block: int | None = None

    def __post_init__(self) -> None:
        if self.par is not None and (self.par[0] < 0 or self.par[1] < 1):
            raise ValueError(expected("Schedule", "par", "(level >= 0, factor >= 1)", self.par))

    def order_of(self, statement: str) -> tuple[str, ...]:
        """The dataflow order of one statement."""
        return dict(self.orders)[statement]

    def label(self) -> str:
        """A one-line description: cut, orders, storage and parallelism."""
        orders = " ".join(
            f"{s}({''.join(o) if all(len(v) == 1 for v in o) else ','.join(o)})"
            for s, o in self.orders
        )
        store = "".join(f" {s}:{t}{''.join(map(str, o))}" for s, t, o in self.storage)
        par = f" par{self.par[0]}x{self.par[1]}" if self.par and self.par[1] > 1 else ""
        block = f" b{self.block}" if self.block else ""
        return f"{self.cut}: {orders}{store}{par}{block}"
