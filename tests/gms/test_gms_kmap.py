"""Kernel maps: the numba hash against the torch reference and spconv's own indice pairs; the
O(E) plan of a map against ``fusekit.gms.plan``; its features against ``gms.features``."""

from __future__ import annotations

import pytest
import torch

from fusekit.gms import kmap as km
from fusekit.gms import plan
from fusekit.gms.features import features
from fusekit.gms.kmap import grid as km_grid
from fusekit.gms.kmap import hits as km_hits
from fusekit.gms.kmap import keys as km_keys
from fusekit.gms.kmap import pairs as km_pairs
from fusekit.gms.kmap import primitives as km_primitives
from fusekit.gms.planning.format import TENSOR_FIELDS
from fusekit.gms.planning.layout import GMSPlan

SHAPE = (9, 8, 10)
CASES = [  # subm, stride, padding
    (True, 1, 1),
    (False, 2, 1),
    (False, 2, 0),
    (False, 1, 1),
    (False, (2, 1, 2), (0, 1, 2)),
]


def voxels(n: int = 400, batches: int = 2, seed: int = 0) -> torch.Tensor:
    """Distinct random voxels in SHAPE, in random order."""
    gen = torch.Generator().manual_seed(seed)
    b = torch.randint(0, batches, (n, 1), generator=gen)
    zyx = torch.stack([torch.randint(0, s, (n,), generator=gen) for s in SHAPE], 1)
    idx = torch.unique(torch.cat([b, zyx], 1), dim=0).int()
    return idx[torch.randperm(len(idx), generator=gen)]


def triples(m: km.KernelMap) -> set[tuple[int, int, tuple[int, ...]]]:
    """(offset, input row, output voxel) of every pair."""
    out = m.out_coords.tolist()
    pairs = zip(m.segment.tolist(), m.gather.tolist(), m.scatter.tolist(), strict=True)
    return {(k, i, tuple(out[o])) for k, i, o in pairs}


def spconv_triples(idx: torch.Tensor, subm: bool, stride, padding) -> set:
    """The same triples from spconv's ``get_indice_pairs`` (its SubM tables hold the offsets
    before the centre; the rest are their mirrors and the centre is the identity)."""
    spconv = pytest.importorskip("spconv.pytorch")
    from spconv.pytorch import ops

    s3 = [stride] * 3 if isinstance(stride, int) else list(stride)
    p3 = [padding] * 3 if isinstance(padding, int) else list(padding)
    out, pairs, num = ops.get_indice_pairs(
        idx, 2, list(SHAPE), spconv.ConvAlgo.Native, [3] * 3, s3, p3, [1] * 3, [0] * 3, subm, False
    )
    out = out.tolist()
    found = set()
    for k in range(27):
        n = int(num[k]) if not subm or k < 13 else int(num[26 - k])
        if subm and k == 13:
            found |= {(13, i, tuple(out[i])) for i in range(len(out))}
            continue
        ins, outs = pairs[0, k, :n].tolist(), pairs[1, k, :n].tolist()
        found |= {(k, i, tuple(out[o])) for i, o in zip(ins, outs, strict=True)}
    return found


@pytest.mark.parametrize(("subm", "stride", "padding"), CASES)
def test_hash_equals_reference_and_spconv(subm, stride, padding):
    idx = voxels()
    s3 = (stride,) * 3 if isinstance(stride, int) else stride
    p3 = (padding,) * 3 if isinstance(padding, int) else padding
    fast = km.build(idx, SHAPE, 2, s3, p3, subm)
    ref = km.build_reference(idx, SHAPE, 2, s3, p3, subm)
    for name in ("gather", "segment", "scatter", "offset_ptr", "out_coords"):
        assert torch.equal(getattr(fast, name), getattr(ref, name)), name
    assert fast.out_shape == ref.out_shape == km.output_shape(SHAPE, s3, p3) or subm
    assert triples(fast) == spconv_triples(idx, subm, stride, padding)


def test_map_is_sorted_by_offset_then_output():
    m = km.build(voxels(), SHAPE, 2)
    key = m.segment * (m.n_out + 1) + m.scatter
    assert bool((key[1:] > key[:-1]).all())
    assert torch.equal(torch.bincount(m.segment, minlength=27), m.offset_ptr.diff())


def test_empty_and_isolated_voxels():
    lone = torch.tensor([[0, 0, 0, 0], [0, 5, 5, 5]], dtype=torch.int32)
    m = km.build(lone, SHAPE, 1)
    assert m.num_pairs == 2 and set(m.segment.tolist()) == {13}
    none = km.build(torch.zeros(0, 4, dtype=torch.int32), SHAPE, 1)
    assert none.num_pairs == 0 and none.n_out == 0


def _assert_plans_equal(a: GMSPlan, b: GMSPlan) -> None:
    for name in (*TENSOR_FIELDS, "num_pairs", "n_in", "n_out", "num_segments", "schedule"):
        x, y = getattr(a, name), getattr(b, name)
        assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y, name


@pytest.mark.parametrize(("subm", "stride"), [(True, 1), (False, 2)])
@pytest.mark.parametrize(("tile_rows", "blocks", "schedule"), [(64, 8, "pad"), (16, 3, "pack")])
def test_plan_of_map_equals_gms_plan(subm, stride, tile_rows, blocks, schedule):
    m = km.build(voxels(), SHAPE, 2, (stride,) * 3, (1, 1, 1), subm)
    fast = km.plan_kernel_map(m, tile_rows, blocks, schedule, orders=True)
    ref = plan(m.problem(), tile_rows=tile_rows, blocks=blocks, schedule=schedule)
    assert torch.equal(fast.packed, ref.packed)
    _assert_plans_equal(fast.transform.plan, ref.transform.plan)
    _assert_plans_equal(fast.aggregate.plan, ref.aggregate.plan)
    assert km.features_of(m, 8, 16, torch.float32) == features(ref, 8, 16, torch.float32, False)
    # without orders (the layers' path): written straight into the packed buffer when the map
    # carries its CSRs (SubM), else through gms's packing
    bare = km.plan_kernel_map(m, tile_rows, blocks, schedule, orders=False)
    ref_bare = plan(
        m.problem(), tile_rows=tile_rows, blocks=blocks, schedule=schedule, orders=False
    )
    assert torch.equal(bare.packed, ref_bare.packed)


def test_plan_of_map_rejects_unsorted_pairs():
    m = km.build(voxels(), SHAPE, 2)
    flipped = km.KernelMap(
        m.gather.flip(0),
        m.segment.flip(0),
        m.scatter.flip(0),
        m.offset_ptr,
        m.n_in,
        m.out_coords,
        m.out_shape,
    )
    with pytest.raises(ValueError, match="sorted"):
        km.plan_kernel_map(flipped)
    with pytest.raises(ValueError, match="kmap"):
        km.plan_kernel_map(flipped, orders=True)


# ---- pass 1 then pass 2 straight into the packed plan (the layers' path) ----


def sorted_voxels(idx: torch.Tensor, shape=SHAPE) -> torch.Tensor:
    """``idx`` sorted by linear key: SubM maps then search 13 offsets and mirror the rest."""
    z, y, x = shape
    key = ((idx[:, 0].long() * z + idx[:, 1]) * y + idx[:, 2]) * x + idx[:, 3]
    return idx[torch.argsort(key)]


@pytest.mark.parametrize(
    ("order", "subm", "stride"),
    [("sorted", True, 1), ("random", True, 1), ("random", False, 2), ("sorted", False, 1)],
)
@pytest.mark.parametrize(("tile_rows", "blocks", "schedule"), [(16, 8, "pad"), (5, 3, "pack")])
def test_fused_plan_equals_gms_plan_of_the_same_pairs(
    order, subm, stride, tile_rows, blocks, schedule
):
    idx = voxels() if order == "random" else sorted_voxels(voxels())
    s3, p3 = (stride,) * 3, (1, 1, 1)
    hits = km.find_hits(idx, SHAPE, 2, s3, p3, subm)
    assert hits.symmetric == (subm and order == "sorted")
    ref = km.build_reference(idx, SHAPE, 2, s3, p3, subm)
    features_before = hits.features(8, 16, torch.float32)
    m, fused = hits.plan(tile_rows, blocks, schedule)
    expected = plan(
        ref.problem(), tile_rows=tile_rows, blocks=blocks, schedule=schedule, orders=False
    )
    assert torch.equal(fused.packed, expected.packed)
    for name in ("gather", "segment", "scatter", "offset_ptr", "out_coords"):
        assert torch.equal(getattr(m, name), getattr(ref, name)), name
    assert features_before == features(plan(ref.problem()), 8, 16, torch.float32, False)
    # pass 2 into plain arrays gives the same map, and its own plan the same plan
    again = km.find_hits(idx, SHAPE, 2, s3, p3, subm).kernel_map()
    assert torch.equal(again.gather, ref.gather) and torch.equal(again.scatter, ref.scatter)
    bare = km.plan_kernel_map(again, tile_rows, blocks, schedule)
    assert torch.equal(bare.packed, expected.packed)


def _pairs(idx: torch.Tensor, shape, batches: int = 1) -> set[tuple[int, int, int]]:
    m = km.build(idx, shape, batches)
    ref = km.build_reference(idx, shape, batches)
    assert torch.equal(m.gather, ref.gather) and torch.equal(m.scatter, ref.scatter)
    assert torch.equal(m.segment, ref.segment)
    return set(zip(m.segment.tolist(), m.gather.tolist(), m.scatter.tolist(), strict=True))


@pytest.mark.parametrize("order", ["sorted", "reversed"])
def test_voxels_at_the_bounds_pair_only_inside(order):
    # the 8 corners of a 2x2x2 shape: every pair of them is a neighbour
    corners = torch.tensor([[0, z, y, x] for z in (0, 1) for y in (0, 1) for x in (0, 1)])
    idx = corners if order == "sorted" else corners.flip(0)
    pairs = _pairs(idx.int(), (2, 2, 2))
    assert len(pairs) == 64
    # a line along x at the far edge of a wide shape, and its neighbours across the border
    line = torch.tensor([[0, 4, 7, x] for x in (0, 1, 8, 9)] + [[0, 5, 0, 0]])
    pairs = _pairs(line.int(), (6, 8, 10))
    # x = 0 has no x - 1 and x = 9 no x + 1: 0-1 and 8-9 pair twice, plus five centres
    assert len(pairs) == 5 + 4
    # (4, 7, 9) and (5, 0, 0) are adjacent keys but not neighbours
    assert all(k == 13 or {i, o} != {3, 4} for k, i, o in pairs)


@pytest.mark.parametrize("order", ["sorted", "reversed"])
def test_batches_never_pair(order):
    # the same voxel in batches 0 and 2, and its x-neighbour in batch 1
    idx = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 2], [2, 1, 1, 1], [2, 1, 1, 2]], dtype=torch.int32)
    idx = idx if order == "sorted" else idx.flip(0)
    pairs = _pairs(idx, (3, 3, 3), batches=3)
    assert len(pairs) == 4 + 2  # four centres, the two batch-2 voxels both ways


def test_duplicates_raise_on_sorted_and_unsorted_input():
    dup = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 2], [0, 1, 1, 2]], dtype=torch.int32)
    for idx in (dup, dup.flip(0)):
        with pytest.raises(ValueError, match="repeated"):
            km.find_hits(idx, SHAPE, 1)


def test_empty_input_plans():
    none = torch.zeros(0, 4, dtype=torch.int32)
    for subm in (True, False):
        hits = km.find_hits(none, SHAPE, 1, (2, 2, 2), (1, 1, 1), subm)
        m, pl = hits.plan(16, 4, "pad")
        assert m.num_pairs == 0 and m.n_out == 0 and pl.num_tiles == 0
        assert hits.features(4, 4, torch.float32).pairs == 0


def test_many_chunks_of_a_sorted_scan():
    # 20k voxels: 20 chunks of 1024 outputs in 8 parts, mirrors reaching back across parts
    from fusekit.data.voxels import lidar_like

    scan = lidar_like(20_000)
    hits = km.find_hits(scan.coords, scan.spatial_shape, 1)
    assert hits.symmetric and len(hits.hit_ptr) > 9
    m, fused = hits.plan(16, 3, "pad")
    ref = km.build_reference(scan.coords, scan.spatial_shape, 1)
    for name in ("gather", "segment", "scatter", "offset_ptr"):
        assert torch.equal(getattr(m, name), getattr(ref, name)), name
    expected = plan(ref.problem(), tile_rows=16, blocks=3, orders=False)
    assert torch.equal(fused.packed, expected.packed)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_bounds_check_equals_reference(dtype):
    bounds = torch.tensor([2, *SHAPE])
    idx = voxels().to(dtype)
    cases = [idx, idx[:0], idx.flip(0)]
    for row, axis, value in ((0, 0, 2), (5, 1, -1), (len(idx) - 1, 3, SHAPE[2]), (9, 2, 7)):
        bad = idx.clone()
        bad[row, axis] = value
        cases.append(bad)
    for case in cases:
        got = km_grid._outside(case.numpy(), bounds.numpy())
        assert got == km_grid._outside_reference(case, bounds)


def test_row_runs_equal_key_runs():
    import numpy as np

    for idx in (voxels(), voxels(n=1), voxels(n=3000, batches=3, seed=2)):
        keys, rows, _ = km_keys.linear_keys(idx.numpy(), *SHAPE)
        order = np.argsort(keys, kind="stable")
        fast = km_keys.row_runs(rows[order], idx.numpy()[order, 3])
        for got, ref in zip(fast, km_keys.key_runs(keys[order], SHAPE[2]), strict=True):
            assert np.array_equal(got, ref)


def test_plan_buffers_are_reused_only_when_nothing_views_them():
    import gc

    from fusekit.data.voxels import lidar_like

    scan = lidar_like(20_000)
    args = (scan.coords, scan.spatial_shape, 1)
    _, held = km.find_hits(*args).plan(16, 3, "pad")
    kept = held.packed.clone()
    m, other = km.find_hits(*args).plan(16, 3, "pad")  # the first is alive: a new buffer
    ptr = other.packed.untyped_storage().data_ptr()
    assert ptr != held.packed.untyped_storage().data_ptr()
    gather = m.gather  # a view outliving its plan and map still pins the buffer
    del m, other
    gc.collect()
    _, third = km.find_hits(*args).plan(16, 3, "pad")
    assert third.packed.untyped_storage().data_ptr() != ptr
    del gather, third
    gc.collect()
    _, fourth = km.find_hits(*args).plan(16, 3, "pad")  # now nothing views it: reused
    assert fourth.packed.untyped_storage().data_ptr() == ptr
    assert torch.equal(fourth.packed, kept) and torch.equal(held.packed, kept)


def test_parallel_mirror_equals_serial():
    import numpy as np

    from fusekit.data.voxels import lidar_like

    scan = lidar_like(20_000)
    hits = km.find_hits(scan.coords, scan.spatial_shape, 1)
    assert hits.symmetric
    lower_mask = hits.mask & 0x1FFF  # pass 1's state: the 13 offsets before the centre
    lower_counts = hits.counts.copy()
    lower_counts[:, 13:] = 0
    mask, counts = lower_mask.copy(), lower_counts.copy()
    km_hits._mirror(hits.hits, hits.hit_ptr, mask, counts, km_primitives.DEBRUIJN)
    assert np.array_equal(mask, hits.mask) and np.array_equal(counts, hits.counts)
    for parts in (1, 2, 3, 7, 40):
        got_mask, got_counts = lower_mask.copy(), lower_counts.copy()
        km_hits._mirror_parallel(
            hits.hits, hits.hit_ptr, got_mask, got_counts, km_primitives.DEBRUIJN, parts
        )
        assert np.array_equal(got_mask, mask) and np.array_equal(got_counts, counts), parts


def test_block_rows_equal_reference():
    import numpy as np

    from fusekit.gms.planning.build import block_rows

    gen = np.random.default_rng(0)
    ptrs = [np.zeros(1, np.int64), np.zeros(6, np.int64)]
    ptrs += [np.concatenate([[0], np.cumsum(gen.integers(0, 9, n))]) for n in (1, 7, 1000)]
    for ptr in ptrs:
        for blocks in (1, 2, 3, 8, 32, 2000):
            ref = block_rows(torch.from_numpy(ptr), blocks).numpy()
            assert np.array_equal(km_pairs._block_rows(ptr, blocks), ref), (len(ptr), blocks)


def test_pad_tiles_equal_reference():
    import numpy as np

    from fusekit.gms.planning.build import tiles_of_runs

    gen = np.random.default_rng(1)
    for segments, blocks in ((1, 1), (27, 1), (27, 8), (3, 40)):
        sizes = gen.integers(0, 40, (segments, blocks)) * (gen.random((segments, blocks)) > 0.2)
        ends = np.cumsum(sizes.reshape(-1)).reshape(segments, blocks)
        run_ptr = np.concatenate([ends[:, :1] - sizes[:, :1], ends], 1)
        for tile_rows in (1, 4, 16, 64):
            ref = tiles_of_runs(torch.from_numpy(run_ptr), tile_rows, "pad")
            got = km_pairs._tiles(run_ptr, tile_rows, "pad")
            assert ref.keys() == got.keys()
            for name, value in ref.items():
                assert torch.equal(got[name], value), (name, segments, blocks, tile_rows)


# ---- every geometry: kernel sizes 1-7, dilation, transposed (kmap.general, kmap.reference) ----

GEOMETRIES = [  # kernel_size, stride, padding, dilation, subm, transposed
    (2, 1, 0, 1, False, False),
    (2, 2, 0, 1, False, False),
    ((3, 1, 1), (2, 1, 1), 0, 1, False, False),
    (3, 1, 2, 2, False, False),
    (3, 1, 1, 3, False, False),
    (7, 3, 2, 1, False, False),
    ((1, 4, 2), (1, 2, 3), (0, 1, 2), (2, 1, 1), False, False),
    (5, 1, 0, 1, True, False),
    (3, 1, 0, 2, True, False),
    ((1, 3, 5), 1, 0, (1, 2, 3), True, False),
    (7, 1, 0, 1, True, False),
    (2, 2, 0, 1, False, True),
    (3, 3, 1, 1, False, True),
    (3, 1, 2, 3, False, True),
    (1, 1, 0, 1, False, False),
]


def spconv_geometry_triples(idx, geometry) -> set:
    """spconv's ``get_indice_pairs`` of any geometry as (offset, input, output voxel) triples."""
    spconv = pytest.importorskip("spconv.pytorch")
    from spconv.pytorch import ops

    g = geometry
    out, pairs, num = ops.get_indice_pairs(
        idx,
        2,
        list(SHAPE),
        spconv.ConvAlgo.Native,
        list(g.kernel_size),
        list(g.stride),
        list(g.padding),
        list(g.dilation),
        [0] * 3,
        g.subm,
        g.transposed,
    )
    out, v, found = out.tolist(), g.volume, set()
    for k in range(v):
        if g.subm and k == v // 2:  # the centre: the identity
            found |= {(k, i, tuple(out[i])) for i in range(len(out))}
            continue
        n = int(num[k]) if not g.subm or k < v // 2 else int(num[v - 1 - k])
        ins, outs = pairs[0, k, :n].tolist(), pairs[1, k, :n].tolist()
        found |= {(k, i, tuple(out[o])) for i, o in zip(ins, outs, strict=True)}
    return found


@pytest.mark.parametrize(
    ("kernel", "stride", "padding", "dilation", "subm", "transposed"), GEOMETRIES
)
def test_every_geometry_numba_equals_reference_and_spconv(
    kernel, stride, padding, dilation, subm, transposed
):
    g = km.Geometry.create(kernel, stride, padding, dilation, subm, transposed)
    idx = voxels()
    fast = km.build(
        idx,
        SHAPE,
        2,
        stride,
        padding,
        subm,
        kernel_size=kernel,
        dilation=dilation,
        transposed=transposed,
    )
    ref = km.build_reference(
        idx,
        SHAPE,
        2,
        stride,
        padding,
        subm,
        kernel_size=kernel,
        dilation=dilation,
        transposed=transposed,
    )
    for name in ("gather", "segment", "scatter", "offset_ptr", "out_coords"):
        assert torch.equal(getattr(fast, name), getattr(ref, name)), name
    assert fast.out_shape == ref.out_shape == g.output_shape(SHAPE)
    assert fast.num_segments == g.volume
    assert triples(fast) == spconv_geometry_triples(idx, g)
    # the plan of a map of V offsets, against gms's own plan of the same pairs
    planned = km.plan_kernel_map(fast, 16, 3, "pad")
    expected = plan(fast.problem(), tile_rows=16, blocks=3, orders=False)
    assert torch.equal(planned.packed, expected.packed)


def test_general_builder_on_the_classic_geometry_equals_the_row_merge_builder():
    idx = voxels()
    for subm, stride, padding in ((True, 1, 1), (False, 2, 1), (False, (2, 1, 2), (0, 1, 2))):
        g = km.Geometry.create(3, stride, padding, 1, subm)
        classic = km.find_hits(idx, SHAPE, 2, g.stride, g.padding, subm).kernel_map()
        general = km.build_general(idx, SHAPE, 2, g)
        for name in ("gather", "segment", "scatter", "offset_ptr", "out_coords"):
            assert torch.equal(getattr(general, name), getattr(classic, name)), name


def test_inverse_map_is_the_forward_read_backwards():
    idx = voxels()
    forward = km.build(idx, SHAPE, 2, 2, 1, False, kernel_size=(3, 1, 2))
    inverse = forward.inverse(idx, SHAPE)
    assert inverse.n_in == forward.n_out and inverse.n_out == len(idx)
    assert torch.equal(inverse.out_coords, idx) and inverse.out_shape == SHAPE
    back = set(
        zip(
            inverse.segment.tolist(), inverse.scatter.tolist(), inverse.gather.tolist(), strict=True
        )
    )
    assert back == set(
        zip(
            forward.segment.tolist(), forward.gather.tolist(), forward.scatter.tolist(), strict=True
        )
    )
    key = inverse.segment * (inverse.n_out + 1) + inverse.scatter  # plan order again
    assert bool((key[1:] > key[:-1]).all())


def test_duplicates_raise_in_the_general_builder():
    dup = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 2], [0, 1, 1, 2]], dtype=torch.int32)
    with pytest.raises(ValueError, match="repeated"):
        km.build(dup, SHAPE, 1, kernel_size=5)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"kernel_size": 0}, "kernel_size"),
        ({"kernel_size": 8}, "kernel_size"),
        ({"kernel_size": (3, 3)}, "kernel_size"),
        ({"kernel_size": 2, "subm": True}, "kernel_size"),
        ({"dilation": 0}, "dilation"),
        ({"padding": -1}, "padding"),
        ({"stride": 0}, "stride"),
        ({"subm": True, "transposed": True}, "transposed"),
    ],
)
def test_bad_geometry_names_the_argument(kwargs, argument):
    with pytest.raises(ValueError, match=f"'{argument}'"):
        km.Geometry.create(**kwargs)


def test_slab_strided_outputs_equal_hashed():
    """The slab bitmap's outputs are the hashed reference's, any order, any batch, wide grids."""
    import numpy as np

    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(200):
        b, (z, y, x) = int(rng.integers(1, 4)), rng.integers(1, 24, 3)
        cells = b * z * y * x
        chosen = rng.choice(cells, size=min(int(rng.integers(0, 300)), cells), replace=False)
        coords = np.stack(np.unravel_index(chosen, (b, z, y, x)), 1).astype(np.int64)
        stride, padding = rng.integers(1, 4, 3), rng.integers(0, 3, 3)
        shape = np.array([z, y, x])
        out_shape = (shape + 2 * padding - 3) // stride + 1
        if (out_shape <= 0).any():
            continue
        grid = (shape, out_shape, stride, padding)
        got = km_keys.strided_outputs(coords, *grid)
        assert np.array_equal(got, km_keys.strided_outputs_hashed(coords, *grid))
        checked += 1
    assert checked > 100
    # a grid too wide for a slab bitmap takes the hashed path and gives the same keys
    wide = np.array([[0, 3, 5, 7], [0, 4, 70_000, 90_000], [1, 0, 0, 0]], np.int64)
    grid = (np.array([8, 100_000, 100_000]), np.array([4, 50_000, 50_000]),
            np.array([2, 2, 2]), np.array([1, 1, 1]))  # fmt: skip
    assert np.array_equal(km_keys.strided_outputs(wide, *grid),
                          km_keys.strided_outputs_hashed(wide, *grid))  # fmt: skip
