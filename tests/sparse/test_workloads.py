import numpy as np

from fusekit.sparse.search import explore
from fusekit.sparse.workloads import bigbird_mask, by_name, graphsage


def test_bigbird_mask_has_window_random_and_global_blocks() -> None:
    m = bigbird_mask(1024, 64, seed=3)
    assert m.shape == (16, 16)
    assert m[:2].all() and m[:, :2].all()  # two global blocks: rows and columns
    for i in range(2, 16):
        assert m[i, max(0, i - 1) : i + 2].all()  # a window of one block each side
        assert 3 + 2 <= m[i].sum() <= 3 + 2 + 2  # window, global and up to 2 random blocks


def test_graphsage_cuts_are_exact_and_partial_wins() -> None:
    ex = explore(graphsage("cora"), top=1)
    assert all(p.correct for p in ex.simulated)
    unfused, partial, full = (ex.best(c).result for c in ("unfused", "partial", "full"))
    assert partial is not None and unfused is not None and full is not None
    assert partial.cycles < unfused.cycles < full.cycles
    assert full.flops > 3 * unfused.flops


def test_by_name() -> None:
    assert by_name("bigbird-b16", quick=True).program.inputs["M"].shape == (16, 16, 16, 16)
    assert np.isclose(by_name("autoencoder").program.inputs["X"].nnz / (32 * 784), 0.1, atol=0.02)
