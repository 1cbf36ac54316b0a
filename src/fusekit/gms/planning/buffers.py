"""Packed plans allocated empty, for builders that write their pairs in plan order in place.

A builder that already has its pairs in plan order (a kernel map, written offset by offset)
allocates the plan with :func:`empty_plan`, fills :attr:`PlanBuffer.views` directly, and skips
:func:`fusekit.gms.plan`'s sorts and :func:`~fusekit.gms.planning.layout.pack`'s copy. Host
buffers come from :data:`fusekit.gms.memory.PLAN_POOL`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from fusekit.errors import expected
from fusekit.gms.memory import plan_storage
from fusekit.gms.planning.format import MAGIC, META_LENGTH, PLAN_PARTS, SCHEDULES, TENSOR_FIELDS
from fusekit.gms.planning.layout import GMSPlan, built
from fusekit.gms.problem import REDUCES, check_size


@dataclass(frozen=True, slots=True, eq=False)
class PlanBuffer:
    """An allocated packed plan, its header and meta written, its tensors to be filled in place.

    Attributes:
        buffer: the int64 buffer :attr:`GMSPlan.packed` will be.
        views: every tensor field of :class:`GMSPlan` (``"order"``, ``"gather"``, ...,
            ``"src_pos"``) as a view into ``buffer``, uninitialised (``norm`` as int64 bits).
    """

    buffer: torch.Tensor
    views: dict[str, torch.Tensor]

    def plan(self) -> GMSPlan:
        """The plan, once every view is filled (the layout checked, the values trusted).

        The plan is sealed here (:func:`fusekit.gms.integrity.admit`): writing into a view
        afterwards is an edit, which the next call detects.
        """
        return built(self.buffer)


def empty_plan(
    *,
    num_pairs: int,
    n_in: int,
    n_out: int,
    num_segments: int,
    num_tiles: int,
    num_blocks: int,
    num_items: int,
    tile_rows: int,
    schedule: str,
    reduce: str = "sum",
    device: torch.device | str = "cpu",
) -> PlanBuffer:
    """Allocate a packed plan without orders for a builder that writes its tensors in place.

    Lengths: ``E`` for ``order, gather, segment, scatter, dst_pos, src_pos`` (and ``norm`` for
    mean), ``S + 1`` for ``segment_ptr``, ``T`` for the tiles, ``B + 1``, ``I + 1``,
    ``N_out + 1`` and ``N_in + 1`` for the pointers.

    Raises:
        TypeError, ValueError: a size is not a non-negative int; ``reduce`` or ``schedule``
            unknown; ``tile_rows`` or ``num_blocks`` not positive.
    """
    sizes = {
        "num_pairs": num_pairs,
        "n_in": n_in,
        "n_out": n_out,
        "num_segments": num_segments,
        "num_tiles": num_tiles,
        "num_items": num_items,
    }
    e, n_in, n_out, s, t, items = (check_size(k, v) for k, v in sizes.items())
    for name, value in (("tile_rows", tile_rows), ("num_blocks", num_blocks)):
        if check_size(name, value) == 0:
            raise ValueError(expected("gms", name, "> 0", value))
    if reduce not in REDUCES:
        raise ValueError(expected("gms", "reduce", " or ".join(REDUCES), repr(reduce)))
    if schedule not in SCHEDULES:
        raise ValueError(expected("gms", "schedule", " or ".join(SCHEDULES), repr(schedule)))
    lengths = {
        "order": e,
        "gather": e,
        "segment": e,
        "scatter": e,
        "norm": e if reduce == "mean" else 0,
        "segment_ptr": s + 1,
        "tile_segment": t,
        "tile_start": t,
        "tile_end": t,
        "block_ptr": num_blocks + 1,
        "item_ptr": items + 1,
        "dst_ptr": n_out + 1,
        "dst_pos": e,
        "src_ptr": n_in + 1,
        "src_pos": e,
    }
    if tuple(lengths) != TENSOR_FIELDS:
        raise RuntimeError(f"gms: GMSPlan fields changed: {TENSOR_FIELDS}")
    parts = [META_LENGTH, *lengths.values()] + [0] * (2 * (1 + len(PLAN_PARTS)))
    head = [MAGIC, len(parts), *parts]
    buffer = plan_storage(len(head) + sum(parts), device)
    meta = [MAGIC, e, n_in, n_out, s, REDUCES.index(reduce), tile_rows]
    buffer[: len(head) + META_LENGTH] = torch.tensor([*head, *meta, SCHEDULES.index(schedule)])
    fields = torch.split(buffer[len(head) + META_LENGTH :], parts[1 : len(PLAN_PARTS)])
    return PlanBuffer(buffer, dict(zip(TENSOR_FIELDS, fields, strict=False)))


def empty_plan_with_tiles(
    tiles: Mapping[str, torch.Tensor],
    *,
    num_pairs: int,
    n_in: int,
    n_out: int,
    num_segments: int,
    num_blocks: int,
    tile_rows: int,
    schedule: str,
    device: torch.device | str = "cpu",
) -> PlanBuffer:
    """:func:`empty_plan` sized by ``tiles`` (:func:`~.build.tiles_of_runs`), tiles written."""
    out = empty_plan(
        num_pairs=num_pairs,
        n_in=n_in,
        n_out=n_out,
        num_segments=num_segments,
        num_tiles=len(tiles["tile_start"]),
        num_blocks=num_blocks,
        num_items=len(tiles["item_ptr"]) - 1,
        tile_rows=tile_rows,
        schedule=schedule,
        device=device,
    )
    for name, value in tiles.items():
        out.views[name].copy_(value)
    return out
