"""The memory gms keeps between calls: the parse memo, the plan pool, what a plan derives."""

import dataclasses
import gc
import weakref

import torch

from fusekit.gms import GMSProblem, plan, release_buffers
from fusekit.gms.memory import PARSED, PLAN_POOL, PlanPool
from fusekit.gms.planning.buffers import empty_plan
from fusekit.gms.planning.derived import Check, Passed
from fusekit.gms.planning.format import PART_NAMES, TENSOR_FIELDS
from fusekit.gms.planning.layout import GMSPlan


def small_plan():
    g = torch.arange(12) % 5
    return plan(GMSProblem.create(g, torch.arange(12) % 3, (torch.arange(12) * 7) % 4, 4))


def test_the_packed_format_names_every_tensor_field_of_a_plan():
    tensors = [
        f.name
        for f in dataclasses.fields(GMSPlan)
        if f.type in ("torch.Tensor",) and f.name not in ("meta", "buffer")
    ]
    assert tuple(tensors) == TENSOR_FIELDS
    assert len(PART_NAMES) == 3 * (1 + len(TENSOR_FIELDS)) + 2


def test_a_lease_ends_when_the_storage_dies_not_when_the_plan_dies():
    pool = PlanPool(kept=2)
    first = pool.take(1000)
    address = first.untyped_storage().data_ptr()
    view = first[10:20]  # outlives the tensor it came from
    del first
    gc.collect()
    assert pool.take(1000).untyped_storage().data_ptr() != address  # still viewed
    del view
    gc.collect()
    again = pool.take(900)  # at most twice the request: the freed buffer
    assert again.untyped_storage().data_ptr() == address
    assert pool.take(100).untyped_storage().data_ptr() != address  # too large to lend
    pool.clear()
    assert len(pool) == 0 and again.shape == (900,)
    assert pool.owns(again)  # still lent: its plan stays a pooled one
    del again
    gc.collect()
    assert not pool.owns(torch.empty(900, dtype=torch.int64))


def test_the_memo_holds_pooled_plans_weakly_and_others_strongly():
    release_buffers()
    pooled = empty_plan(
        num_pairs=0,
        n_in=1,
        n_out=1,
        num_segments=1,
        num_tiles=0,
        num_blocks=1,
        num_items=0,
        tile_rows=4,
        schedule="pad",
    )
    for view in pooled.views.values():
        view.zero_()
    built = pooled.plan()
    assert PLAN_POOL.owns(built.buffer)
    buffer = built.buffer
    assert PARSED.get(buffer) is built
    del built
    gc.collect()
    assert PARSED.get(buffer) is None  # nothing held the plan: the memo let it go
    held = small_plan()
    packed, ref = held.packed, weakref.ref(held)
    del held
    gc.collect()
    assert ref() is not None and GMSPlan.from_packed(packed) is ref()  # kept strongly
    release_buffers()
    gc.collect()
    assert ref() is None and PARSED.get(packed) is None


def test_what_a_plan_derived_is_dropped_when_its_buffer_changes():
    pl = small_plan()
    pl.derived.mirrored = False
    pl.derived.passed.add(Passed(Check.TRITON_INDEX, "gather", 5))
    assert pl.packed is pl.buffer and pl.derived.mirrored is False
    with torch.no_grad():
        pl.buffer[-1] += 0  # an in-place edit moves the version counter
    assert pl.packed is pl.buffer  # remembering the plan stamps the new version
    assert pl.derived.mirrored is None and not pl.derived.passed
    assert pl.derived.buffer_version == pl.buffer._version
    replaced = dataclasses.replace(pl, tile_rows=pl.tile_rows)
    assert replaced.derived.buffer_version is None and not replaced.parsed
