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
