import numpy as np
import pytest

from fusekit.gms.kernels.cpu.tile import MR, NR, load_rows, tile_product


@pytest.mark.parametrize(("m0", "nc"), [(0, NR), (NR, NR), (2 * NR, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tile_product_is_a_block_of_the_gemm(m0, nc, dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((11, 5)).astype(dtype)
    w = rng.standard_normal((2, 5, 2 * NR + 3)).astype(dtype)
    rows = np.array([3, 0, 10, 10, 7, 1, 2, 4][:MR], dtype=np.int64)
    acc = np.full((MR, NR), np.nan, dtype=dtype)
    tile_product(a, rows, w, 1, m0, nc, acc)
    expected = a[rows] @ w[1, :, m0 : m0 + nc]
    np.testing.assert_allclose(acc[:, :nc], expected, rtol=1e-5)


def test_load_rows_pads_with_the_first_row_and_flags_bad_indices():
    rows = np.zeros(MR, dtype=np.int64)
    index = np.array([9, 4, 2, 7], dtype=np.int64)
    assert load_rows(index, 1, 2, 10, rows)
    assert rows.tolist() == [4, 2] + [4] * (MR - 2)
    assert not load_rows(index, 0, 4, 8, rows)  # 9 is outside [0, 8)
    assert not load_rows(np.array([-1], dtype=np.int64), 0, 1, 8, rows)
