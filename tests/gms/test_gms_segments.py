"""The public segment API: the numba row kernels against the plain-torch reference."""

from __future__ import annotations

import pytest
import torch

from fusekit.gms import segments


def csr(n_out: int, n_pairs: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, n_out, (n_pairs,), generator=gen)
    pos = torch.argsort(rows, stable=True)
    ptr = torch.zeros(n_out + 1, dtype=torch.int64)
    ptr[1:] = torch.cumsum(torch.bincount(rows, minlength=n_out), 0)
    return ptr, pos


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduce_max", [False, True])
@pytest.mark.parametrize("accumulate", [False, True])
def test_reduce_rows_equals_reference(dtype, reduce_max, accumulate):
    gen = torch.Generator().manual_seed(1)
    src = torch.randn(30, 7, generator=gen, dtype=dtype)
    ptr, pos = csr(11, 40)
    src_index = torch.randint(0, 30, (40,), generator=gen)
    scale = torch.rand(40, generator=gen, dtype=dtype)
    start = torch.randn(11, 7, generator=gen, dtype=dtype)
    args = dict(src_index=src_index, scale=scale, pos=pos, reduce_max=reduce_max)
    got = segments.reduce_rows(
        src, ptr, n_pairs=40, out=start.clone() if accumulate else None, **args
    )
    want = segments.reduce_rows_reference(
        src, ptr, out=start.clone() if accumulate else None, **args
    )
    # float32: sums of up to ~10 products in another order
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_gather_rows_any_dtype():
    x = torch.arange(12.0).view(6, 2)
    index = torch.tensor([5, 0, 0, 3])
    assert torch.equal(segments.gather_rows(x, index), x[index])
    assert torch.equal(segments.gather_rows(x.half(), index), x.half()[index])
    assert segments.runs_on_cpu_kernels(x) and not segments.runs_on_cpu_kernels(x.half())


def test_gather_rows_refuses_rows_out_of_range():
    with pytest.raises(ValueError, match="gather"):
        segments.gather_rows(torch.zeros(3, 2), torch.tensor([0, 3]))
