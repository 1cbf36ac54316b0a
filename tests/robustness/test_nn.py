"""Probes of the nn layers as a careless or hostile caller would use them.

Crash probes (a division by zero in the kernel-map builder, writes past an output, reads past
an array) run in a subprocess with a timeout, so that a crash is a failed test and not a dead
pytest: each must end in one clean ``TypeError`` / ``ValueError`` naming the argument. The
in-place edits that a tensor's version counter misses (``.data``, a numpy array sharing the
memory) must reach the layers' plan and kernel-map caches: the output after such an edit equals
a fresh layer's.
"""

from __future__ import annotations

import subprocess
import sys
from textwrap import dedent

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fusekit.gms.kmap.grid import MAX_AXIS, check_grid
from fusekit.nn.conv import SparseConv3d, SparseTensor, SubMConv3d
from fusekit.nn.engine import IndexCache, fingerprint, fingerprint_reference
from fusekit.nn.moe import MoE
from fusekit.nn.rgcn import RGCNConv

PROBE_TIMEOUT_S = 180

# ---- crash probes, each in a subprocess ----

_MOE = """
import torch
from fusekit.nn.moe import MoE
torch.manual_seed(0)
moe = MoE(16, 32, 4, 2)
x = torch.randn(3, 16)
"""

CRASHES = {
    # a (2^32, 2^32, 4) grid: Z Y wraps int64 to 0, then a division by it (SIGFPE)
    "grid of 2^66 cells": (
        dedent("""
        import torch
        from fusekit.nn import SubMConv3d, SparseTensor
        idx = torch.tensor([[0, 0, 0, 0], [0, 2**32 - 1, 5, 1]])
        SubMConv3d(4, 4)(SparseTensor(torch.randn(2, 4), idx, (2**32, 2**32, 4), 1))
        """),
        "ValueError",
        "'spatial_shape'",
    ),
    # B Z Y X = 2^64: keys wrap, distinct voxels collide (duplicates, wrong pairs)
    "keys past 2^63 through the builder": (
        dedent("""
        import torch
        from fusekit.gms import kmap
        idx = torch.tensor([[0, 0, 0, 0], [1, 0, 0, 0]])
        kmap.build(idx, (2**21, 2**21, 2**21), 2)
        """),
        "ValueError",
        "'spatial_shape'",
    ),
    # a strided map's output grid past the limits through a huge padding
    "output grid past the limits": (
        dedent("""
        import torch
        from fusekit.gms import kmap
        idx = torch.tensor([[0, 0, 0, 0]])
        kmap.build(idx, (8, 8, 8), 1, (1, 1, 1), (2**31, 2**31, 2**31), subm=False)
        """),
        "ValueError",
        "'padding'",
    ),
    # routing for 60 tokens, x of 3: the decode kernel wrote rows 3..59 of a [3, 16] output
    "moe routing rows > x rows, no autograd": (
        _MOE
        + dedent("""
        e, w = torch.randint(0, 4, (60, 2)), torch.rand(60, 2)
        with torch.no_grad():
            moe.experts(x, e, w)
        """),
        "ValueError",
        "'experts'",
    ),
    "moe routing rows > x rows, autograd": (
        _MOE
        + dedent("""
        e, w = torch.randint(0, 4, (60, 2)), torch.rand(60, 2)
        moe.experts(x, e, w).sum().backward()
        """),
        "ValueError",
        "'experts'",
    ),
    # weights of one element for 6 pairs: the kernels read 5 past its end
    "moe weights of the wrong shape, no autograd": (
        _MOE
        + dedent("""
        with torch.no_grad():
            moe.experts(x, torch.randint(0, 4, (3, 2)), torch.rand(1))
        """),
        "ValueError",
        "'weights'",
    ),
    "moe weights of the wrong shape, autograd": (
        _MOE
        + dedent("""
        w = torch.rand(1, requires_grad=True)
        moe.experts(x, torch.randint(0, 4, (3, 2)), w).sum().backward()
        """),
        "ValueError",
        "'weights'",
    ),
    # k = 0: the token reduce read pos[0] of an empty array
    "moe routing with no expert per token": (
        _MOE
        + dedent("""
        with torch.no_grad():
            moe.experts(x, torch.zeros(3, 0, dtype=torch.long), torch.rand(3, 0))
        """),
        "ValueError",
        "'experts'",
    ),
    # float ids were truncated (0.7 -> expert 0)
    "moe float expert ids": (
        _MOE
        + dedent("""
        with torch.no_grad():
            moe.experts(x, torch.full((3, 2), 0.7), torch.rand(3, 2))
        """),
        "TypeError",
        "'experts'",
    ),
    # the decode entry point on its own
    "experts_decode with routing rows > x rows": (
        _MOE
        + dedent("""
        from fusekit.gms.fused_experts import experts_decode
        e, w = torch.randint(0, 4, (40, 2)), torch.rand(40, 2)
        experts_decode(x, e, w, moe.w_gate_up, moe.w_down)
        """),
        "ValueError",
        "'experts'",
    ),
}


@pytest.mark.parametrize("name", list(CRASHES))
def test_crash_probe_ends_in_one_clean_error(name):
    code, kind, argument = CRASHES[name]
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_S,
    )
    # 1: an uncaught exception; a signal (SIGFPE, SIGSEGV, abort) is negative, 0 is no error
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{kind}: "), last
    assert argument in last, last


# ---- grid sizes (validation only: no kernel runs) ----


@pytest.mark.parametrize(
    ("shape", "batch", "kind", "argument"),
    [
        ((6.7, 8, 8), 1, TypeError, "spatial_shape"),
        ((6.0, 8, 8), 1, TypeError, "spatial_shape"),
        ((torch.tensor(6.5), 8, 8), 1, TypeError, "spatial_shape"),
        ((True, 8, 8), 1, TypeError, "spatial_shape"),
        ((8, 8), 1, ValueError, "spatial_shape"),
        (8, 1, TypeError, "spatial_shape"),
        ((0, 8, 8), 1, ValueError, "spatial_shape"),
        ((-8, 8, 8), 1, ValueError, "spatial_shape"),
        ((MAX_AXIS + 1, 1, 1), 1, ValueError, "spatial_shape"),
        ((8, 8, 8), -1, ValueError, "batch_size"),
        ((8, 8, 8), 0, ValueError, "batch_size"),
        ((8, 8, 8), 1.0, TypeError, "batch_size"),
        ((8, 8, 8), None, TypeError, "batch_size"),
        ((2**31, 2**31, 2), 1, ValueError, "2\\*\\*63"),
        ((2**21, 2**21, 2**21), 2, ValueError, "2\\*\\*63"),
    ],
)
def test_bad_grid_is_refused(shape, batch, kind, argument):
    idx = torch.zeros(0, 4, dtype=torch.int32)
    with pytest.raises(kind, match=argument):
        SparseTensor(torch.zeros(0, 2), idx, shape, batch)


def test_integer_sizes_of_other_types_are_accepted():
    import numpy as np

    shape, batch = check_grid((np.int64(4), torch.tensor(5), 6), np.int32(2))
    assert shape == (4, 5, 6) and batch == 2
    assert all(type(n) is int for n in (*shape, batch))


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"stride": 2**32}, "stride"),
        ({"stride": 0}, "stride"),
        ({"padding": -1}, "padding"),
        ({"padding": 1.5}, "padding"),
        ({"stride": (2, 2)}, "stride"),
    ],
)
def test_bad_stride_or_padding_is_refused(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        SparseConv3d(2, 2, **kwargs)


def test_no_output_voxel_on_an_axis_is_refused():
    x = SparseTensor(torch.randn(1, 2), torch.zeros(1, 4, dtype=torch.int32), (1, 8, 8), 1)
    with pytest.raises(ValueError, match="padding"):
        SparseConv3d(2, 2, padding=0)(x)


@pytest.mark.parametrize("device_builder", ["cpu", "reference"])
def test_voxels_near_the_largest_grid_convolve_as_at_the_origin(device_builder):
    """Keys near 2^62 (B Z Y X just under the limit) give the pairs of the same cluster at 0."""
    from fusekit.gms import kmap as km
    from fusekit.nn.conv import conv_reference

    gen = torch.Generator().manual_seed(0)
    small = torch.unique(torch.randint(0, 4, (40, 3), generator=gen), dim=0)
    big_shape = (2**31, 2**29, 4)  # B Z Y X = 2 x 2^62 x ... < 2^63 with batch 1
    corner = torch.tensor([big_shape[0] - 4, big_shape[1] - 4, 0])
    origin_idx = torch.cat([torch.zeros(len(small), 1, dtype=torch.long), small], 1)
    big_idx = origin_idx + torch.cat([torch.zeros(1, dtype=torch.long), corner])
    build = km.build if device_builder == "cpu" else km.build_reference
    weight = torch.randn(3, 3, 3, 3, 2, generator=gen)
    features = torch.randn(len(small), 2, generator=gen)
    ys = [
        conv_reference(features, weight, None, build(idx, shape, 1))
        for idx, shape in ((origin_idx, (4, 4, 4)), (big_idx, big_shape))
    ]
    torch.testing.assert_close(ys[0], ys[1])


# ---- layer arguments (validation only) ----


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: RGCNConv(4, 4, 3, num_blocks=0), "num_blocks"),  # was ZeroDivisionError
        (lambda: RGCNConv(4, 4, 3, num_bases=0), "num_bases"),
        (lambda: RGCNConv(4, 4, 3, num_bases=-1), "num_bases"),
        (lambda: RGCNConv(6.7, 4, 3), "in_channels"),
        (lambda: RGCNConv((4, -1), 4, 3), "in_channels"),
        (lambda: RGCNConv(4, True, 3), "out_channels"),
        (lambda: MoE(True, 8, 2, 1), "hidden_size"),
    ],
)
def test_bad_layer_arguments_name_the_argument(make, argument):
    with pytest.raises(ValueError, match=f"'{argument}'"):
        make()


@pytest.mark.parametrize(
    "target",
    [torch.tensor([0, 99]), torch.tensor([-1, 0]), torch.tensor([True, False]), torch.randn(2, 3)],
)
def test_rgcn_target_side_is_checked_before_the_root_weight_reads_it(target):
    edge_index = torch.tensor([[0, 5], [0, 1]])
    layer = RGCNConv((10, 4), 3, 2)
    with pytest.raises(ValueError, match="'x'"):
        layer((torch.randn(10, 10), target), edge_index, torch.tensor([0, 1]))


@pytest.mark.parametrize(
    ("rows", "dst", "scale", "argument"),
    [
        ([10**6, 3], [0, 0], None, "rows"),
        ([-1, 3], [0, 0], None, "rows"),
        ([1, 3], [0, 10**6], None, "dst"),
        ([1, 3], [0], None, "dst"),
        ([1, 3], [0, 0], [1.0], "scale"),
    ],
)
def test_gather_reduce_indices_are_checked(rows, dst, scale, argument):
    from fusekit.nn.rgcn import GatherReduce

    s = torch.tensor(scale) if scale is not None else None
    with pytest.raises(ValueError, match=f"'{argument}'"):
        GatherReduce(torch.tensor(rows), torch.tensor(dst), s, 1, 50)


def test_moe_scalar_input_names_hidden_states():
    with pytest.raises(ValueError, match="'hidden_states'"):
        MoE(4, 8, 2, 1)(torch.tensor(1.0))


# ---- caches that follow in-place edits ----


def _graph(seed: int = 0, nodes: int = 30, edges: int = 120, relations: int = 3):
    gen = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, nodes, (2, edges), generator=gen)
    edge_type = torch.randint(0, relations, (edges,), generator=gen)
    return edge_index, edge_type


def _fresh_rgcn(layer: RGCNConv, x, edge_index, edge_type, **kw) -> torch.Tensor:
    fresh = RGCNConv(layer.in_channels, layer.out_channels, layer.num_relations, **kw)
    fresh.load_state_dict(layer.state_dict())
    return fresh(x, edge_index.clone(), edge_type.clone())


def _shift_sources_via_data(edge_index: torch.Tensor, edge_type: torch.Tensor) -> None:
    edge_index.data[0, :10] = (edge_index[0, :10] + 1) % 30


def _retarget_via_numpy(edge_index: torch.Tensor, edge_type: torch.Tensor) -> None:
    edge_index.numpy()[1, 5:9] = 0


def _relabel_via_numpy(edge_index: torch.Tensor, edge_type: torch.Tensor) -> None:
    edge_type.numpy()[:20] = 2


def _swap_sources_via_numpy(edge_index: torch.Tensor, edge_type: torch.Tensor) -> None:
    """A permutation keeps every sum and count: only a position-dependent check sees it."""
    sources = edge_index.numpy()[0]
    sources[[0, 1]] = sources[[1, 0]]


EDITS = {
    "edge_index through .data": _shift_sources_via_data,
    "edge_index through numpy": _retarget_via_numpy,
    "edge_type through numpy": _relabel_via_numpy,
    "two edges swapped through numpy": _swap_sources_via_numpy,
}


@pytest.mark.parametrize("edit", list(EDITS))
@pytest.mark.parametrize("kw", [{}, {"num_blocks": 2}, {"aggr": "add"}])
def test_rgcn_plan_follows_edits_behind_the_version_counter(edit, kw):
    torch.manual_seed(0)
    layer = RGCNConv(4, 6, 3, **kw)
    x = torch.randn(30, 4)
    edge_index, edge_type = _graph()
    if edit == "two edges swapped through numpy":
        edge_index[0, :2] = torch.tensor([3, 17])  # two different sources
    with torch.no_grad():
        before = layer(x, edge_index, edge_type)
        versions = edge_index._version, edge_type._version
        EDITS[edit](edge_index, edge_type)
        assert (edge_index._version, edge_type._version) == versions  # the counter missed it
        after = layer(x, edge_index, edge_type)
        expected = _fresh_rgcn(layer, x, edge_index, edge_type, **kw)
    assert not torch.allclose(before, expected)  # the edit changes the answer ...
    torch.testing.assert_close(after, expected)  # ... and the layer follows it


def test_featureless_rgcn_follows_an_edit_of_its_node_indices():
    torch.manual_seed(0)
    layer = RGCNConv(30, 5, 3)
    edge_index, edge_type = _graph()
    nodes = torch.arange(30)
    with torch.no_grad():
        layer(nodes, edge_index, edge_type)
        nodes.data[:15] = nodes[15:].clone()
        after = layer(nodes, edge_index, edge_type)
        expected = _fresh_rgcn(layer, nodes.clone(), edge_index, edge_type)
    torch.testing.assert_close(after, expected)


def test_rgcn_plan_is_reused_while_the_contents_stay():
    layer = RGCNConv(4, 4, 3)
    x = torch.randn(30, 4)
    edge_index, edge_type = _graph()
    with torch.no_grad():
        layer(x, edge_index, edge_type)
        (entry,) = layer._plans._entries
        layer(x, edge_index, edge_type)
    assert len(layer._plans._entries) == 1 and layer._plans._entries[0] is entry


def test_index_cache_builds_once_per_content():
    cache = IndexCache()
    built: list[int] = []
    t = torch.arange(10)

    def get() -> int:
        return cache.get((t, None), "k", lambda: built.append(int(t.sum())) or len(built))

    assert get() == get() == 1
    t.numpy()[3] = 0
    assert get() == 2 and built == [45, 42]
    assert len(cache._entries) == 1  # the stale entry was dropped, not kept
    t.data[0] = 5
    assert get() == 3
    t[0] = 6  # a tracked edit
    assert get() == 4 and get() == 4


def _voxels(seed: int = 0, n: int = 120, shape=(6, 7, 8)) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    zyx = torch.stack([torch.randint(0, s, (n,), generator=gen) for s in shape], 1)
    idx = torch.unique(torch.cat([torch.zeros(n, 1, dtype=torch.long), zyx], 1), dim=0)
    return idx.int()


def _mirror_x_via_data(indices: torch.Tensor) -> None:
    indices.data[:, 3] = 7 - indices[:, 3]


def _mirror_x_via_numpy(indices: torch.Tensor) -> None:
    view = indices.numpy()
    view[:, 3] = 7 - view[:, 3]


VOXEL_EDITS = {
    "mirror x through .data": _mirror_x_via_data,
    "mirror x through numpy": _mirror_x_via_numpy,
}


@pytest.mark.parametrize("edit", list(VOXEL_EDITS))
def test_submconv_indice_key_map_follows_edits_behind_the_version_counter(edit):
    torch.manual_seed(0)
    idx = _voxels()
    features = torch.randn(len(idx), 4)
    x = SparseTensor(features, idx, (6, 7, 8), 1)
    first, second = SubMConv3d(4, 4, indice_key="k"), SubMConv3d(4, 4, indice_key="k")
    with torch.no_grad():
        before = second(first(x)).features
        version = idx._version
        VOXEL_EDITS[edit](idx)
        assert idx._version == version
        out = second(first(x)).features
        clean = SparseTensor(features, idx.clone(), (6, 7, 8), 1)
        fresh = [SubMConv3d(4, 4) for _ in range(2)]
        for f, layer in zip(fresh, (first, second), strict=True):
            f.load_state_dict(layer.state_dict())
        expected = fresh[1](fresh[0](clean)).features
    assert not torch.allclose(before, expected)
    torch.testing.assert_close(out, expected)
    assert x.maps["k"].fingerprint == fingerprint(idx)


def test_an_edit_that_breaks_the_voxels_is_caught_not_served_from_the_map():
    idx = _voxels()
    x = SparseTensor(torch.randn(len(idx), 4), idx, (6, 7, 8), 1)
    layer = SubMConv3d(4, 4, indice_key="k")
    with torch.no_grad():
        layer(x)
        idx.numpy()[5] = idx.numpy()[2]  # a duplicate voxel
        with pytest.raises(ValueError, match="distinct voxels"):
            layer(x)
        idx.numpy()[5, 1] = 99  # outside the grid
        with pytest.raises(ValueError, match="spatial_shape"):
            layer(x)


# ---- the content check itself ----


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 9000),
    seed=st.integers(0, 2**32 - 1),
    position=st.integers(0, 10**6),
    delta=st.integers(1, 2**64 - 1),
    int32=st.booleans(),
)
def test_fingerprint_sees_every_one_element_change(n, seed, position, delta, int32):
    gen = torch.Generator().manual_seed(seed)
    t = torch.randint(-(2**63), 2**63 - 1, (n,), generator=gen)
    if int32:
        t = t.to(torch.int32)  # wraps
    before = fingerprint(t)
    assert before[2:] == fingerprint_reference(t)  # numba equals torch, across 4096 blocks
    if n == 0:
        return
    i = position % n
    info = torch.iinfo(t.dtype)
    span = info.max - info.min + 1
    new = (int(t[i]) + delta - info.min) % span + info.min
    if new == int(t[i]):
        return
    edited = t.clone()
    edited[i] = new
    assert fingerprint(edited) != before


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.integers(0, 10**6), min_size=2, max_size=5000, unique=True),
    pair=st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)),
)
def test_fingerprint_sees_a_swap(values, pair):
    t = torch.tensor(values)
    i, j = pair[0] % len(values), pair[1] % len(values)
    if i == j:
        return
    swapped = t.clone()
    swapped[[i, j]] = t[[j, i]]
    assert fingerprint(swapped) != fingerprint(t)


def test_fingerprint_of_views_and_other_dtypes():
    t = torch.arange(24).reshape(4, 6)
    assert fingerprint(t.t()) != fingerprint(t)  # other shape and order
    assert fingerprint(t.t().contiguous()) == fingerprint(t.t())
    assert fingerprint(t.to(torch.int32))[2:] == fingerprint(t)[2:]
    assert fingerprint(t.to(torch.int32)) != fingerprint(t)  # the dtype is part of it
    mask = t % 3 == 0  # bool: the torch path
    assert fingerprint(mask)[2:] == fingerprint(mask.long())[2:]


# ---- MoE: good routing still runs after the checks ----


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("ids", [torch.int32, torch.int64])
def test_moe_experts_accept_int32_and_int64_routing(grad, ids):
    torch.manual_seed(0)
    moe = MoE(8, 16, 4, 2)
    x = torch.randn(5, 8)
    experts = torch.randint(0, 4, (5, 2))
    weights = torch.rand(5, 2)
    with torch.set_grad_enabled(grad):
        a = moe.experts(x, experts.to(ids), weights)
        b = moe.experts(x, experts, weights)
    torch.testing.assert_close(a, b)
