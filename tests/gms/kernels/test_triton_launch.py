"""The Triton segment GEMM with tuned tiles (``fusekit.gms.launch``), under the interpreter."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest

pytest.importorskip("triton")  # the gpu extra

import torch

from fusekit.gms import GMSProblem, plan
from fusekit.gms.kernels.reference import gms_reference
from fusekit.gms.kernels.triton.gms_seg import gms_seg_triton
from fusekit.gms.launch import Launch, launch


@pytest.mark.parametrize(
    "settings",
    [
        Launch(block_e=32, block_k=16, block_m=32, num_warps=2, num_stages=2),
        Launch(block_e=16, block_k=32, block_m=16, num_warps=8, num_stages=4),
    ],
)
def test_gms_seg_with_tuned_tiles_equals_the_reference(settings):
    gen = torch.Generator().manual_seed(0)
    e, n, s, k, m = 50, 13, 3, 20, 37
    g, seg, d = (torch.randint(0, hi, (e,), generator=gen) for hi in (n, s, n))
    x, w = torch.randn(n, k, generator=gen), torch.randn(s, k, m, generator=gen)
    pl = plan(GMSProblem.create(g, seg, d, n, n_in=n, num_segments=s), tile_rows=32, blocks=1)
    with launch(settings):
        got = gms_seg_triton(x, w, pl, None)
    torch.testing.assert_close(got, gms_reference(x, w, g, seg, d, n), atol=1e-4, rtol=1e-4)
