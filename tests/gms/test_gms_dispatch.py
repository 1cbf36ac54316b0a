import pytest
import torch

from fusekit.gms import Dataflow, GMSProblem, Strategy, plan
from fusekit.gms.backends import backend_for
from fusekit.gms.dispatch import forward, gemm_rows, position_scale, resolve
from fusekit.gms.kernels.cpu.gms_seg import gms_seg_cpu


def small_plan(reduce="sum"):
    g = torch.tensor([0, 1, 1, 2, 0, 1])
    s = torch.tensor([0, 0, 0, 1, 1, 1])
    d = torch.tensor([0, 0, 0, 1, 1, 2])
    return plan(GMSProblem.create(g, s, d, 3, reduce=reduce), blocks=2)


def test_kernels_are_found_by_name():
    assert backend_for(torch.device("cpu")).dataflows[Dataflow.GMS_SEG] is gms_seg_cpu


def test_a_device_without_kernels_is_named():
    with pytest.raises(
        ValueError, match=r"'x' to be on a device with a gms_seg kernel .* \(got meta\)"
    ):
        backend_for(torch.device("meta"), "gms_seg")


def test_gemm_rows_count_the_distinct_pairs():
    rows = gemm_rows(small_plan())
    assert (rows.pairwise, rows.aggregate_first, rows.transform_first) == (6, 3, 5)
    assert gemm_rows(small_plan("max")).aggregate_first is None


def test_resolve():
    pl = small_plan()
    assert resolve("auto", pl) == Strategy.parse("aggregate-first")
    assert resolve("G-Mseg-S", pl) == Strategy.parse("G-Mseg-S")


def test_position_scale_folds_in_the_mean_weights():
    pl = small_plan("mean")
    c = torch.arange(6, dtype=torch.float32) + 1
    expected = c[pl.order] / torch.tensor([3.0, 2, 1])[pl.scatter]
    torch.testing.assert_close(position_scale(pl, c, torch.float32), expected)
    assert position_scale(small_plan(), None, torch.float32) is None


def test_forward_keeps_the_dtype_of_x():
    pl = small_plan()
    x, w = torch.randn(3, 4, dtype=torch.bfloat16), torch.randn(2, 4, 5, dtype=torch.bfloat16)
    assert forward(Strategy(), x, w, pl, None).dtype == torch.bfloat16
