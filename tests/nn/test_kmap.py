"""Kernel maps: the numba hash against the torch reference and spconv's own indice pairs; the
O(E) plan of a map against ``fusekit.gms.plan``; its features against ``gms.features``."""

from __future__ import annotations

import pytest
import torch

from fusekit.gms import plan
from fusekit.gms.features import features
from fusekit.gms.problem import _TENSOR_FIELDS, GMSPlan
from fusekit.nn import kmap as km

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
    for name in (*_TENSOR_FIELDS, "num_pairs", "n_in", "n_out", "num_segments", "schedule"):
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
