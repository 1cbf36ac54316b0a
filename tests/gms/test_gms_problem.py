import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fusekit.gms import GMSPlan, GMSProblem, plan
from fusekit.gms.operands import check_operands
from fusekit.gms.planning.buffers import empty_plan
from fusekit.gms.planning.build import block_rows, plan_sorted, tiles_of_runs
from fusekit.gms.planning.layout import pack


def small_problem(reduce="sum", e=12):
    g = torch.arange(e) % 5
    s = torch.arange(e) % 3
    d = (torch.arange(e) * 7) % 4
    return GMSProblem.create(g, s, d, 4, reduce=reduce)


# ---- GMSProblem.create: every bad index names the argument, the expectation and the value ----


def test_create_infers_sizes_and_copies_to_int64():
    p = GMSProblem.create(
        torch.tensor([0, 4], dtype=torch.int32), torch.tensor([2, 0]), torch.tensor([1, 1]), 3
    )
    assert (p.n_in, p.num_segments, p.n_out, p.num_pairs) == (5, 3, 3, 2)
    assert p.gather.dtype == torch.int64


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"gather": torch.tensor([0.0, 1.0])},
            TypeError,
            r"'gather' to be an int32/int64 tensor \(got float32\)",
        ),
        ({"segment": [0, 1]}, TypeError, r"'segment' to be a torch.Tensor \(got list\)"),
        ({"scatter": torch.zeros(2, 1, dtype=torch.long)}, ValueError, r"'scatter' to be 1-D"),
        (
            {"segment": torch.tensor([0, 1, 2])},
            ValueError,
            r"'segment' to be of length 2 like 'gather' \(got length 3\)",
        ),
        (
            {"gather": torch.tensor([0, -1])},
            ValueError,
            r"'gather' to be indices in \[0, n_in\) \(got -1 at pair 1\)",
        ),
        (
            {"scatter": torch.tensor([0, 3])},
            ValueError,
            r"'scatter' to be indices in \[0, 3\) \(got 3 at pair 1\)",
        ),
        ({"n_in": 1}, ValueError, r"'gather' to be indices in \[0, 1\) \(got 1 at pair 1\)"),
        (
            {"num_segments": 1},
            ValueError,
            r"'segment' to be indices in \[0, 1\) \(got 1 at pair 1\)",
        ),
        ({"n_out": -1}, ValueError, r"'n_out' to be >= 0 \(got -1\)"),
        ({"n_out": True}, TypeError, r"'n_out' to be an int \(got bool\)"),
        ({"reduce": "min"}, ValueError, r"'reduce' to be sum or mean or max \(got 'min'\)"),
        (
            {"segment": torch.tensor([0, 1], device="meta")},
            ValueError,
            r"'segment' to be on cpu like 'gather' \(got meta\)",
        ),
    ],
)
def test_create_rejects_bad_indices(kwargs, error, match):
    args = {
        "gather": torch.tensor([0, 1]),
        "segment": torch.tensor([0, 1]),
        "scatter": torch.tensor([0, 1]),
        "n_out": 3,
    }
    args.update(kwargs)
    with pytest.raises(error, match=match):
        GMSProblem.create(**args)


def test_plan_rejects_bad_arguments():
    p = small_problem()
    with pytest.raises(ValueError, match="'tile_rows' to be > 0"):
        plan(p, tile_rows=0)
    with pytest.raises(ValueError, match="'blocks' to be > 0"):
        plan(p, blocks=0)
    with pytest.raises(ValueError, match="'schedule' to be pad or pack"):
        plan(p, schedule="greedy")
    with pytest.raises(TypeError, match="'problem' to be a GMSProblem"):
        plan((p.gather, p.segment, p.scatter))


# ---- plan invariants, on random problems ----


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_plan_invariants(data, draw_case):
    case = draw_case(data)
    pl = case.plan
    e = case.gather.shape[0]
    # order is a permutation; arrays in plan order; sorted by segment
    assert sorted(pl.order.tolist()) == list(range(e))
    assert torch.equal(pl.gather, case.gather[pl.order])
    assert torch.equal(pl.segment, case.segment[pl.order])
    assert torch.equal(pl.scatter, case.scatter[pl.order])
    assert torch.all(pl.segment[1:] >= pl.segment[:-1])
    assert torch.equal(
        pl.segment_ptr,
        torch.cat(
            [
                torch.zeros(1, dtype=torch.long),
                torch.cumsum(torch.bincount(case.segment, minlength=pl.num_segments), 0),
            ]
        ),
    )
    # tiles cover every position once, within one segment, at most tile_rows long
    covered = torch.zeros(e, dtype=torch.long)
    for s, lo, hi in zip(
        pl.tile_segment.tolist(), pl.tile_start.tolist(), pl.tile_end.tolist(), strict=True
    ):
        assert 0 < hi - lo <= pl.tile_rows
        assert torch.all(pl.segment[lo:hi] == s)
        covered[lo:hi] += 1
    assert torch.all(covered == 1)
    # blocks: every tile in exactly one block, and no output row written by two blocks
    assert pl.block_ptr[0] == 0 and pl.block_ptr[-1] == pl.num_tiles
    owner = {}
    for b in range(pl.num_blocks):
        for t in range(int(pl.block_ptr[b]), int(pl.block_ptr[b + 1])):
            for row in pl.scatter[pl.tile_start[t] : pl.tile_end[t]].tolist():
                assert owner.setdefault(row, b) == b
    # work items partition the tile list in order
    assert pl.item_ptr[0] == 0 and pl.item_ptr[-1] == pl.num_tiles
    assert torch.all(pl.item_ptr[1:] > pl.item_ptr[:-1])
    # CSRs by scatter row and by gather row
    for ptr, pos, rows in (
        (pl.dst_ptr, pl.dst_pos, pl.scatter),
        (pl.src_ptr, pl.src_pos, pl.gather),
    ):
        assert sorted(pos.tolist()) == list(range(e))
        for i in range(len(ptr) - 1):
            assert torch.all(rows[pos[ptr[i] : ptr[i + 1]]] == i)
    if case.reduce == "mean":
        degree = torch.bincount(case.scatter, minlength=case.n_out)
        assert torch.allclose(pl.norm, 1.0 / degree[pl.scatter].double())


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_order_sub_plans_group_equal_pairs(data, draw_case):
    case = draw_case(data)
    pl = case.plan
    if case.reduce == "max":
        assert pl.aggregate is None
    else:
        ptr, sub = pl.aggregate.index, pl.aggregate.plan
        assert ptr[0] == 0 and ptr[-1] == pl.num_pairs and sub.num_pairs == len(ptr) - 1
        for u in range(sub.num_pairs):
            lo, hi = int(ptr[u]), int(ptr[u + 1])
            at = (sub.order == u).nonzero().item()
            assert torch.all(pl.segment[lo:hi] == sub.segment[at])
            assert torch.all(pl.scatter[lo:hi] == sub.scatter[at])
        pairs = set(zip(pl.segment.tolist(), pl.scatter.tolist(), strict=True))
        assert len(pairs) == sub.num_pairs
    index, sub = pl.transform.index, pl.transform.plan
    rows = {}
    for p in range(pl.num_pairs):
        key = (int(pl.segment[p]), int(pl.gather[p]))
        assert rows.setdefault(key, int(index[p])) == int(index[p])
    assert len(rows) == sub.num_pairs
    by_row = sub.order.argsort()  # sub.scatter is the identity in original order
    for (s, g), v in rows.items():
        assert (int(sub.segment[by_row[v]]), int(sub.gather[by_row[v]])) == (s, g)


def test_pack_schedule_joins_small_tiles():
    g = torch.arange(40) % 7
    s = torch.arange(40) % 10  # ten segments of four pairs
    p = GMSProblem.create(g, s, g, 7)
    padded = plan(p, tile_rows=16, blocks=1, schedule="pad")
    packed = plan(p, tile_rows=16, blocks=1, schedule="pack")
    assert padded.num_tiles == packed.num_tiles == 10
    assert len(padded.item_ptr) - 1 == 10
    assert len(packed.item_ptr) - 1 < 10


def test_zero_pairs_plan():
    empty = torch.zeros(0, dtype=torch.long)
    pl = plan(GMSProblem.create(empty, empty, empty, 3, n_in=2, num_segments=2))
    assert (pl.num_pairs, pl.num_tiles, pl.n_out) == (0, 0, 3)
    assert pl.transform.plan.num_pairs == 0 and pl.aggregate.plan.num_pairs == 0


# ---- the packed form ----


def test_packed_round_trip_is_views_of_one_buffer():
    pl = plan(small_problem("mean"))
    again = GMSPlan._parse(pl.packed)
    for field in dataclasses.fields(GMSPlan):
        a, b = getattr(pl, field.name), getattr(again, field.name)
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b)
            assert a.untyped_storage().data_ptr() == pl.packed.untyped_storage().data_ptr()
    assert again.aggregate.plan.num_pairs == pl.aggregate.plan.num_pairs
    assert GMSPlan.from_packed(pl.packed) is GMSPlan.from_packed(pl.packed)


def test_from_packed_rejects_other_tensors():
    pl = plan(small_problem())
    with pytest.raises(ValueError, match=r"'plan' to be GMSPlan\.packed"):
        GMSPlan.from_packed(torch.arange(100))
    with pytest.raises(ValueError, match=r"'plan' to be GMSPlan\.packed"):
        GMSPlan.from_packed(pl.packed.double())
    with pytest.raises(ValueError, match="'plan' to be a consistent packed plan"):
        GMSPlan.from_packed(pl.packed[:-3].clone())
    with pytest.raises(ValueError, match="'plan' to be a consistent packed plan"):
        GMSPlan.from_packed(torch.cat([pl.packed, torch.zeros(2, dtype=torch.long)]))


def test_from_packed_reparses_after_in_place_edit():
    pl = plan(small_problem())
    packed = pl.packed.clone()
    first = GMSPlan.from_packed(packed)
    packed[-1] += 0  # bumps the version counter
    assert GMSPlan.from_packed(packed) is not first


def test_to_device_keeps_the_plan():
    pl = plan(small_problem())
    assert pl.to("cpu").num_tiles == pl.num_tiles


# ---- operands ----


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (
            {"x": torch.zeros(5, 3, dtype=torch.int64)},
            TypeError,
            r"'x' to be float32, float64 or bfloat16 \(got int64\)",
        ),
        (
            {"w": torch.zeros(3, 3, 2, dtype=torch.float64)},
            TypeError,
            r"'w' to be float32 like 'x' \(got float64\)",
        ),
        ({"x": torch.zeros(5)}, ValueError, r"'x' to be 2-D \[N_in, K\] \(got shape \(5,\)\)"),
        (
            {"w": torch.zeros(3, 4, 2)},
            ValueError,
            r"'w' to be of shape \[S, 3, M\] \(K of 'x'\) \(got shape \(3, 4, 2\)\)",
        ),
        (
            {"x": torch.zeros(4, 3)},
            ValueError,
            r"'x' to be at least 5 rows \(max gather \+ 1\) \(got 4\)",
        ),
        ({"w": torch.zeros(2, 3, 2)}, ValueError, r"'w' to be at least 3 segments"),
        (
            {"scale": torch.ones(11)},
            ValueError,
            r"'scale' to be 1-D of length 12 \(got shape \(11,\)\)",
        ),
        (
            {"scale": torch.ones(12, dtype=torch.float64)},
            TypeError,
            r"'scale' to be float32 like 'x'",
        ),
        (
            {"w": torch.zeros(3, 3, 2, device="meta")},
            ValueError,
            r"'w' to be on cpu like 'x' \(got meta\)",
        ),
        (
            {"x": torch.zeros(3, 5).t()},
            ValueError,
            r"'x' to be contiguous \(got strides \(1, 5\)\)",
        ),
        ({"x": [[0.0]]}, TypeError, r"'x' to be a torch.Tensor \(got list\)"),
    ],
)
def test_check_operands(change, error, match):
    pl = plan(small_problem())
    args = {"x": torch.zeros(5, 3), "w": torch.zeros(3, 3, 2), "scale": None}
    args.update(change)
    with pytest.raises(error, match=match):
        check_operands(args["x"], args["w"], args["scale"], pl)


def test_check_operands_accepts_extra_rows_and_segments():
    pl = plan(small_problem())
    check_operands(torch.zeros(9, 3), torch.zeros(6, 3, 2), torch.ones(12), pl)


# ---- plans of pairs already in plan order, and packing by hand ----


def _sorted_problem(seed: int, e: int = 300, n: int = 40, segments: int = 6) -> GMSProblem:
    """Random pairs sorted by (segment, scatter row); one segment left empty."""
    gen = torch.Generator().manual_seed(seed)
    s = torch.randint(0, segments, (e,), generator=gen)
    s[s == 2] = 3
    d = torch.randint(0, n, (e,), generator=gen)
    by = torch.argsort(s * n + d, stable=True)
    g = torch.randint(0, n + 5, (e,), generator=gen)
    return GMSProblem.create(g, s[by], d[by], n, n_in=n + 5, num_segments=segments)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(("tile_rows", "blocks", "schedule"), [(64, 4, "pad"), (5, 3, "pack")])
def test_plan_sorted_equals_plan(seed, tile_rows, blocks, schedule):
    p = _sorted_problem(seed)
    knobs = {"tile_rows": tile_rows, "blocks": blocks, "schedule": schedule}
    ref = plan(p, orders=False, **knobs)
    n = {"n_in": p.n_in, "n_out": p.n_out, "num_segments": p.num_segments}
    got = plan_sorted(p.gather, p.segment, p.scatter, **n, **knobs)
    assert torch.equal(got.packed, ref.packed)
    csr = (ref.dst_ptr, ref.dst_pos, ref.src_ptr, ref.src_pos)
    given = plan_sorted(p.gather, p.segment, p.scatter, **n, **knobs, csr=csr)
    assert torch.equal(given.packed, ref.packed)


def test_plan_sorted_rejects_unsorted_pairs_and_handles_none():
    p = _sorted_problem(0)
    with pytest.raises(ValueError, match="sorted by"):
        plan_sorted(p.gather, p.segment.flip(0), p.scatter, n_in=45, n_out=40, num_segments=6)
    empty = torch.zeros(0, dtype=torch.long)
    got = plan_sorted(empty, empty, empty, n_in=2, n_out=3, num_segments=2)
    ref = plan(GMSProblem.create(empty, empty, empty, 3, n_in=2, num_segments=2), orders=False)
    assert torch.equal(got.packed, ref.packed)


def test_pack_round_trips():
    p = _sorted_problem(3)
    for orders in (False, True):
        pl = plan(p, tile_rows=8, blocks=2, orders=orders)
        again = pack(pl)
        assert torch.equal(again.packed, pl.packed)
        assert again.packed is not pl.packed
        parsed = GMSPlan.from_packed(again.packed.clone())
        assert torch.equal(parsed.packed, pl.packed)
        assert (parsed.transform is None) == (not orders)
    # a plan whose tensors are not views of one buffer (a sub-plan) packs into one
    sub = plan(p).transform.plan
    assert sub.buffer is None and pack(sub).buffer is not None
    assert torch.equal(pack(sub).gather, sub.gather)


def test_empty_plan_views_fill_into_a_plan():
    p = _sorted_problem(4)
    ref = plan(p, tile_rows=16, blocks=3, orders=False)
    out = empty_plan(
        num_pairs=p.num_pairs,
        n_in=p.n_in,
        n_out=p.n_out,
        num_segments=p.num_segments,
        num_tiles=ref.num_tiles,
        num_blocks=ref.num_blocks,
        num_items=len(ref.item_ptr) - 1,
        tile_rows=16,
        schedule="pad",
    )
    for name, view in out.views.items():
        view.copy_(getattr(ref, name).view(torch.int64))
    assert torch.equal(out.plan().packed, ref.packed)
    with pytest.raises(ValueError, match="'num_blocks' to be > 0"):
        empty_plan(
            num_pairs=0, n_in=0, n_out=0, num_segments=1, num_tiles=0, num_blocks=0,
            num_items=0, tile_rows=4, schedule="pad",
        )  # fmt: skip
    with pytest.raises(ValueError, match="schedule"):
        empty_plan(
            num_pairs=0, n_in=0, n_out=0, num_segments=1, num_tiles=0, num_blocks=1,
            num_items=0, tile_rows=4, schedule="greedy",
        )  # fmt: skip


def test_block_rows_and_tiles_of_runs_by_hand():
    # rows with 3, 0, 1, 4 pairs (E = 8), 2 blocks: pairs before each row 0, 3, 3, 4
    # -> blocks floor(before * 2 / 8) = 0, 0, 0, 1: block 1 starts at row 3
    dst_ptr = torch.tensor([0, 3, 3, 4, 8])
    assert block_rows(dst_ptr, 2).tolist() == [0, 3, 4]
    # segment 0 has positions [0, 5) in block 0 and [5, 6) in block 1; segment 1 [6, 8) in 1
    run_ptr = torch.tensor([[0, 5, 6], [6, 6, 8]])
    tiles = tiles_of_runs(run_ptr, 2, "pad")
    assert tiles["tile_start"].tolist() == [0, 2, 4, 5, 6]
    assert tiles["tile_end"].tolist() == [2, 4, 5, 6, 8]
    assert tiles["tile_segment"].tolist() == [0, 0, 0, 0, 1]
    assert tiles["block_ptr"].tolist() == [0, 3, 5]
    assert tiles["item_ptr"].tolist() == [0, 1, 2, 3, 4, 5]
