import pytest
import torch

from fusekit.gms import workloads as W


def test_rgcn_pairs_go_both_ways():
    wl = W.rgcn_from_triples(
        "t", torch.tensor([0, 1]), torch.tensor([0, 1]), torch.tensor([2, 0]), 3
    )
    assert wl.gather.tolist() == [0, 1, 2, 0] and wl.scatter.tolist() == [2, 0, 0, 1]
    assert wl.segment.tolist() == [0, 1, 2, 3] and wl.num_segments == 4


def test_kernel_map_of_a_line():
    coords = torch.tensor([[0, 0, 0], [1, 0, 0], [2, 0, 0], [5, 5, 5]])
    wl = W.kernel_map("line", coords)
    assert wl.num_segments == 27
    pairs = set(zip(wl.gather.tolist(), wl.segment.tolist(), wl.scatter.tolist(), strict=True))
    centre = 13  # offset (0, 0, 0)
    assert {(i, centre, i) for i in range(4)} <= pairs
    assert len(pairs) == 4 + 4  # plus the two neighbour links of the line, both directions
    for g, s, d in pairs:
        offset = torch.tensor([s // 9 - 1, s // 3 % 3 - 1, s % 3 - 1])
        assert torch.equal(coords[g], coords[d] + offset)


@pytest.mark.parametrize("shape", W.SHAPES)
def test_synthetic_families(shape):
    wl = W.make(shape, seed=3, scale=0.05)
    assert wl.num_pairs > 0
    assert int(wl.gather.max()) < wl.n_in and int(wl.scatter.max()) < wl.n_out
    assert int(wl.segment.max()) < wl.num_segments
    if shape == "moe":
        gates = torch.zeros(wl.n_out).index_add_(0, wl.scatter, wl.scale)
        torch.testing.assert_close(gates, torch.ones(wl.n_out))


def test_make_rejects_unknown_shapes_and_sizes():
    with pytest.raises(ValueError, match="'shape' to be rgcn or conv or moe"):
        W.make("gnn")
    with pytest.raises(ValueError, match="'scale' to be > 0"):
        W.make("rgcn", scale=0)
    with pytest.raises(ValueError, match="'coords'"):
        W.kernel_map("bad", torch.zeros(4, 2))
