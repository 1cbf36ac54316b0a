"""The few-row weight-streaming GEMMs against torch.mm and numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fusekit.gms.kernels.cpu.g_mseg_s import lazy_zeros, segment_mm, segment_outer_mm
from fusekit.gms.kernels.cpu.skinny import (
    SKINNY_ROWS,
    rows_times_w,
    rows_times_wt,
    segment_skinny_mm,
    weight_layout,
)


@pytest.mark.parametrize("rows", [1, 2, 3, 7, SKINNY_ROWS])
@pytest.mark.parametrize(("k", "m"), [(64, 40), (37, 9), (3, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_skinny_equals_mm(rows, k, m, dtype):
    torch.manual_seed(rows * 100 + k)
    a, w = torch.randn(rows, k, dtype=dtype), torch.randn(k, m, dtype=dtype)
    out = torch.empty(rows, m, dtype=dtype)
    segment_skinny_mm(a, w[None], torch.tensor([0, rows]), [0], out)
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(out, a @ w, rtol=tol, atol=tol)


def test_segment_mm_mixes_skinny_and_mm_segments():
    torch.manual_seed(0)
    counts = [0, 1, 5, SKINNY_ROWS + 3, 2]
    ptr = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()])
    rows = torch.randn(int(ptr[-1]), 24)
    w = torch.randn(len(counts), 24, 10)
    out = segment_mm(rows, w, ptr, out=torch.empty(rows.shape[0], 10))
    ref = torch.cat([rows[ptr[s] : ptr[s + 1]] @ w[s] for s in range(len(counts))])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, SKINNY_ROWS])
@pytest.mark.parametrize(("k", "c0", "c1"), [(293, 0, 144), (19, 5, 90)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_times_w_equals_the_product(rows, k, c0, c1, dtype):
    # gathered rows (repeats, out of order), K not a multiple of the 4-deep unroll, column ranges
    # that start inside the matrix; 4, 2 and 1 row blocks
    rng = np.random.default_rng(rows + k)
    a = rng.standard_normal((rows + 5, k)).astype(dtype)
    w = rng.standard_normal((k, c1 + 3)).astype(dtype)
    a_rows = rng.integers(0, rows + 5, rows)
    start = rng.standard_normal((rows, c1 - c0)).astype(dtype)
    expected = start + a[a_rows] @ w[:, c0:c1]
    tol = 1e-4 if dtype == np.float32 else 1e-10
    acc = start.copy()
    rows_times_w(a, a_rows, w, c0, c1, acc)
    np.testing.assert_allclose(acc, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("rows", [1, 2, 3, 5])
@pytest.mark.parametrize(("k", "c0", "c1"), [(64, 0, 40), (37, 3, 12), (3, 0, 5), (8, 1, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_times_wt_equals_the_product_with_the_transpose(rows, k, c0, c1, dtype):
    # w given as w^T [M, K]: k not a multiple of the lanes, odd rows, column ranges not of 4
    rng = np.random.default_rng(rows * 7 + k)
    a = rng.standard_normal((rows + 4, k)).astype(dtype)
    wt = rng.standard_normal((c1 + 2, k)).astype(dtype)
    a_rows = rng.integers(0, rows + 4, rows)
    start = rng.standard_normal((rows, c1 - c0)).astype(dtype)
    acc = start.copy()
    rows_times_wt(a, a_rows, wt, c0, c1, acc)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(acc, start + a[a_rows] @ wt[c0:c1].T, rtol=tol, atol=tol)


@pytest.mark.parametrize("out_given", [True, False])
def test_segment_mm_reads_a_transposed_weight_view_without_a_copy(out_given):
    torch.manual_seed(1)
    counts = [0, 1, 5, SKINNY_ROWS + 3, 2]
    ptr = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()])
    rows = torch.randn(int(ptr[-1]), 24)
    wt = torch.randn(len(counts), 10, 24)  # stored [S, M, K], used as w = wt^T
    w = wt.transpose(1, 2)
    assert weight_layout(w) == "transposed" and not w.is_contiguous()
    out = segment_mm(rows, w, ptr, out=torch.empty(rows.shape[0], 10) if out_given else None)
    ref = torch.cat([rows[ptr[s] : ptr[s + 1]] @ wt[s].T for s in range(len(counts))])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_skinny_rejects_a_weight_it_cannot_stream():
    w = torch.randn(2, 8, 6)[:, ::2]  # strided rows: neither layout
    assert weight_layout(w) is None
    with pytest.raises(ValueError, match=r"segment_skinny_mm.*w"):
        segment_skinny_mm(torch.randn(3, 4), w, torch.tensor([0, 1, 3]), [0, 1], torch.empty(3, 6))


@pytest.mark.parametrize(
    ("counts", "n_segments"),
    [([4, 8, 4], 3), ([0, 5, 0, 3], 4), ([2, 1], 4)],  # all filled; empty ones; extra matrices
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_segment_outer_mm_is_the_weight_gradient(counts, n_segments, dtype):
    torch.manual_seed(len(counts))
    ptr = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()])
    a = torch.randn(int(ptr[-1]), 6, dtype=dtype)
    b = torch.randn(int(ptr[-1]), 5, dtype=dtype)
    got = segment_outer_mm(a, b, ptr, n_segments)
    want = torch.zeros(n_segments, 6, 5, dtype=dtype)
    for s, (lo, hi) in enumerate(zip(ptr[:-1].tolist(), ptr[1:].tolist(), strict=True)):
        want[s] = a[lo:hi].T @ b[lo:hi]
    torch.testing.assert_close(got, want)
    assert got.dtype == dtype and got.is_contiguous()


def test_lazy_zeros_are_zeros_of_the_dtype():
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        z = lazy_zeros((3, 4), torch.empty(0, dtype=dtype))
        assert z.dtype == dtype and z.shape == (3, 4) and not z.any()
