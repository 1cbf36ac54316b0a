import pytest

from fusekit.accel.collectives import (
    CollectiveKind,
    Group,
    byte_hops,
    collective_cost,
    group_on_mesh,
)
from fusekit.hw import load

K = CollectiveKind
ALL = list(CollectiveKind)

# edge: 64 B/cycle links, 5-cycle hops, in-network broadcast, no in-network reduction.
# 2x2 group, n = 1024 B: p = 4, D = 2, n*beta = 16 cycles.
EDGE_2X2 = {
    "mesh": {K.BROADCAST: 2 * 5 + 16, K.REDUCE: 2 * (5 + 16), K.ALL_REDUCE: 42 + 26,
             K.SCATTER: 10 + 0.75 * 16, K.GATHER: 22, K.ALL_GATHER: 22, K.REDUCE_SCATTER: 22},
    # ring: the 2x2 has a Hamiltonian cycle, one hop per step: (p-1)(5 + 256/64) = 27
    "ring": {K.BROADCAST: 54, K.REDUCE: 54, K.ALL_REDUCE: 54,
             K.SCATTER: 27, K.GATHER: 27, K.ALL_GATHER: 27, K.REDUCE_SCATTER: 27},
    # tree: log2 4 = 2 steps spanning D = 2 hops
    "tree": {K.BROADCAST: 10 + 2 * 16, K.REDUCE: 42, K.ALL_REDUCE: 2 * 10 + 2 * 0.75 * 16,
             K.SCATTER: 22, K.GATHER: 22, K.ALL_GATHER: 22, K.REDUCE_SCATTER: 22},
}  # fmt: skip
# cloud: 256 B/cycle links; 4x4 group, n = 4096 B: p = 16, D = 6, n*beta = 16 cycles.
CLOUD_4X4 = {
    "mesh": {K.BROADCAST: 30 + 16, K.REDUCE: 6 * (5 + 16), K.ALL_REDUCE: 126 + 46,
             K.SCATTER: 30 + 15, K.GATHER: 45, K.ALL_GATHER: 45, K.REDUCE_SCATTER: 45},
    # ring: 15 (5 + 4096/16/256 = 1) = 90
    "ring": {K.BROADCAST: 180, K.REDUCE: 180, K.ALL_REDUCE: 180,
             K.SCATTER: 90, K.GATHER: 90, K.ALL_GATHER: 90, K.REDUCE_SCATTER: 90},
    "tree": {K.BROADCAST: 30 + 4 * 16, K.REDUCE: 94, K.ALL_REDUCE: 60 + 2 * 15,
             K.SCATTER: 45, K.GATHER: 45, K.ALL_GATHER: 45, K.REDUCE_SCATTER: 45},
}  # fmt: skip


@pytest.mark.parametrize("model", ["mesh", "ring", "tree"])
@pytest.mark.parametrize("kind", ALL)
def test_closed_form_2x2_edge(model, kind):
    net = load("edge").network
    cost = collective_cost(kind, 1024, Group(2, 2), net, model)
    assert cost.cycles == pytest.approx(EDGE_2X2[model][kind])


@pytest.mark.parametrize("model", ["mesh", "ring", "tree"])
@pytest.mark.parametrize("kind", ALL)
def test_closed_form_4x4_cloud(model, kind):
    net = load("cloud").network
    cost = collective_cost(kind, 4096, Group(4, 4), net, model)
    assert cost.cycles == pytest.approx(CLOUD_4X4[model][kind])


def test_byte_hops():
    assert byte_hops(K.BROADCAST, 1024, Group(2, 2)) == 3 * 1024
    assert byte_hops(K.ALL_REDUCE, 1024, Group(2, 2)) == 6 * 1024
    # scatter from a corner: distances 0,1,1,2 on 2x2 (sum 4); sum 48 on 4x4
    assert byte_hops(K.SCATTER, 1024, Group(2, 2)) == 1024 / 4 * 4
    assert byte_hops(K.GATHER, 4096, Group(4, 4)) == 4096 / 16 * 48


def test_ring_on_a_line_takes_two_hops_per_step():
    net = load("cloud").network
    cost = collective_cost(K.ALL_GATHER, 4096, Group(1, 4), net, "ring")
    assert cost.cycles == pytest.approx(3 * (2 * 5 + 1024 / 256))


def test_single_cluster_costs_nothing():
    net = load("edge").network
    assert collective_cost(K.ALL_REDUCE, 1024, Group(1, 1), net).cycles == 0


def test_bad_arguments():
    net = load("edge").network
    with pytest.raises(ValueError, match="kind"):
        collective_cost("allreduce", 8, Group(2, 2), net)
    with pytest.raises(ValueError, match="model"):
        collective_cost(K.REDUCE, 8, Group(2, 2), net, "butterfly")
    with pytest.raises(ValueError, match="rows"):
        Group(0, 2)


def test_group_on_mesh():
    assert group_on_mesh(2, 4, 4) == Group(1, 2)
    assert group_on_mesh(8, 4, 4) == Group(2, 4)
    with pytest.raises(ValueError, match="sub-mesh"):
        group_on_mesh(3, 2, 2)
