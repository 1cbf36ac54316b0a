"""The sparse conv layers' configurations: the selector's answer under the layers' constraints.

Before the selector took constraints, the layers edited its answer: a named dataflow replaced the
answer's, an order other than pairwise became pairwise, both keeping the answer's knobs (and
under autograd the training dataflow replaced the answer's). On the shipped tree the
constrained answer is that edited answer, for kernel maps whose leaves rank pairwise first and
for those whose leaves rank aggregate-first (20k voxels, stride 2, C=64) or transform-first
(160k voxels, stride 1) first.
"""

from dataclasses import replace

import pytest
import torch

from fusekit.data.voxels import lidar_like
from fusekit.gms import Dataflow, Order, Strategy
from fusekit.gms import kmap as km
from fusekit.gms.selector import TRAINING, load_tree, select
from fusekit.nn.conv import constraints_for

from ..gms.helpers_tuning import TARGET


def edited(features, tree, strategy):
    """The configuration as the layers chose it before: the answer, edited."""
    cfg = select(features, TARGET, tree=tree).config
    if strategy != "auto":
        cfg = replace(cfg, strategy=Strategy.parse(strategy))
    if cfg.strategy.order is not Order.PAIRWISE:
        cfg = replace(cfg, strategy=Strategy(Order.PAIRWISE, cfg.strategy.dataflow))
    return cfg


@pytest.mark.parametrize(("voxels", "stride"), [(20_000, 1), (20_000, 2), (160_000, 1)])
def test_constrained_answers_are_the_answers_the_layers_edited(voxels, stride):
    tree = load_tree()
    if tree is None:
        pytest.skip("no shipped tree (benchmarks/gms_select.py --train writes it)")
    scan = lidar_like(voxels)
    subm = stride == 1
    pad = (0, 0, 0) if subm else (1, 1, 1)
    hits = km.find_hits(scan.coords, scan.spatial_shape, 1, (stride,) * 3, pad, subm)
    for c in (16, 64):
        f = hits.features(c, c, torch.float32)
        for strategy in ("auto", *(d.value for d in Dataflow)):
            want = edited(f, tree, strategy)
            got = select(f, TARGET, constraints_for(strategy, False), tree=tree).config
            assert got == want, (c, strategy)
        training = select(f, TARGET, constraints_for("auto", True), tree=tree).config
        assert training == edited(f, tree, TRAINING["cpu"].name)


# ---- every geometry: the selector still chooses per layer, every dataflow agrees ----

GEOMETRY_LAYERS = [  # layer, kwargs
    ("SubMConv3d", {"kernel_size": 5}),
    ("SubMConv3d", {"kernel_size": (3, 1, 5), "dilation": 2}),
    ("SparseConv3d", {"kernel_size": (3, 1, 1), "stride": (2, 1, 1)}),
    ("SparseConvTranspose3d", {"kernel_size": 2, "stride": 2}),
]


def _voxels(n: int = 300, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randint(0, s, (n,), generator=gen) for s in (2, 9, 8, 10)], 1)
    idx = torch.unique(idx, dim=0).int()
    return idx[torch.randperm(len(idx), generator=gen)]


@pytest.mark.parametrize(("name", "kwargs"), GEOMETRY_LAYERS)
def test_every_geometry_plans_with_the_selectors_constrained_answer(name, kwargs):
    import fusekit.nn as fnn
    from fusekit.gms.target import target_for
    from fusekit.nn.sparse_tensor import SparseTensor

    idx = _voxels()
    x = SparseTensor(torch.randn(len(idx), 4), idx, (9, 8, 10), 2)
    for strategy in ("auto", "G-Mseg-S"):
        layer = getattr(fnn, name)(4, 6, indice_key=f"k{strategy}", strategy=strategy, **kwargs)
        with torch.no_grad():
            layer(x)
        entry = x.maps[f"k{strategy}"]
        ((plan, cfg),) = entry.plans.values()
        assert plan.num_segments == layer.geometry.volume
        want = select(
            km.features_of(entry.kmap, 4, 6, torch.float32),
            target_for(torch.device("cpu")),
            constraints_for(strategy, False),
        ).config
        assert cfg == want
        if strategy != "auto":
            assert cfg.strategy.dataflow is Dataflow.G_MSEG_S


@pytest.mark.parametrize(("name", "kwargs"), GEOMETRY_LAYERS)
def test_every_dataflow_gives_the_same_answer_on_every_geometry(name, kwargs):
    import fusekit.nn as fnn
    from fusekit.nn.conv import conv_reference
    from fusekit.nn.sparse_tensor import SparseTensor

    idx = _voxels()
    torch.manual_seed(0)
    f = torch.randn(len(idx), 4, dtype=torch.float64)
    ref_layer = getattr(fnn, name)(4, 6, indice_key="k", **kwargs).double()
    x = SparseTensor(f, idx, (9, 8, 10), 2)
    kmap = ref_layer._map(x).kmap
    grad = None
    for dataflow in Dataflow:
        layer = getattr(fnn, name)(4, 6, strategy=dataflow.value, **kwargs).double()
        layer.load_state_dict(ref_layer.state_dict())
        xf = f.clone().requires_grad_()
        out = layer(SparseTensor(xf, idx, (9, 8, 10), 2))
        xr = f.clone().requires_grad_()
        ref = conv_reference(xr, layer.weight, layer.bias, kmap)
        torch.testing.assert_close(out.features, ref)
        grad = torch.randn_like(ref) if grad is None else grad
        (out.features * grad).sum().backward()
        (ref * grad).sum().backward()
        torch.testing.assert_close(xf.grad, xr.grad)
