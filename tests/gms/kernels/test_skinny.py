"""The few-row weight-streaming GEMM against torch.mm."""

from __future__ import annotations

import pytest
import torch

from fusekit.gms.kernels.cpu.g_mseg_s import segment_mm
from fusekit.gms.kernels.cpu.skinny import SKINNY_ROWS, segment_skinny_mm


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
