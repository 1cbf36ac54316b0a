"""The four Triton dataflow kernels (kernels/triton/{g_mseg_s,gm_seg_s,g_ms_seg,gms_seg}.py)
against the reference, on the CPU under Triton's interpreter: the suite of test_cpu_dataflows.py
with small cases (the interpreter is slow)."""

import os

# Before triton is imported: triton.jit reads it when the kernel modules define their kernels.
os.environ["TRITON_INTERPRET"] = "1"

import dataclasses

import pytest

pytest.importorskip("triton")  # the gpu extra

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fusekit.gms import GMSProblem, plan
from fusekit.gms.dispatch import position_scale
from fusekit.gms.kernels.reference import gms_reference
from fusekit.gms.kernels.triton.g_ms_seg import g_ms_seg_triton
from fusekit.gms.kernels.triton.g_mseg_s import g_mseg_s_triton
from fusekit.gms.kernels.triton.gm_seg_s import gm_seg_s_triton
from fusekit.gms.kernels.triton.gms_seg import gms_seg_triton

KERNELS = [g_mseg_s_triton, gm_seg_s_triton, g_ms_seg_triton, gms_seg_triton]

#: The plan arrays each kernel dereferences: corrupting any of them must raise, not read or
#: write out of bounds.
PLAN_FIELDS_READ = {
    g_mseg_s_triton: ["gather", "segment_ptr", "dst_ptr", "dst_pos"],
    gm_seg_s_triton: ["gather", "tile_start", "tile_end", "tile_segment", "dst_ptr", "dst_pos"],
    g_ms_seg_triton: ["gather", "scatter", "tile_start", "tile_end", "tile_segment"],
    gms_seg_triton: ["gather", "scatter", "tile_start", "tile_end", "tile_segment"],
}

SMALL = {"max_pairs": 64, "max_width": 19}


def test_kernels_run_interpreted():
    # Guards the premise of this file: nothing imported triton's kernels before the variable.
    from fusekit.gms.kernels.triton.gms_seg import INTERPRETED

    assert INTERPRETED


def run(kernel, case):
    c = position_scale(case.plan, case.scale, case.x.dtype)
    return kernel(case.x, case.w, case.plan, c)


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_equals_reference_fp32(kernel, data, draw_case):
    case = draw_case(data, **SMALL)
    case.assert_matches(run(kernel, case))


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_equals_reference_bf16(kernel, data, draw_case):
    case = draw_case(data, dtype=torch.bfloat16, **SMALL)
    case.assert_matches(run(kernel, case))


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
@pytest.mark.parametrize("kind", ["empty_segments", "one_huge_segment", "one_output_row"])
@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_index_patterns(kernel, kind, reduce, draw_case):
    # Every named pattern and both epilogues, whatever hypothesis draws above.
    @settings(max_examples=1, deadline=None, database=None)
    @given(data=st.data())
    def check(data):
        case = draw_case(data, kind=kind, reduce=reduce, **SMALL)
        case.assert_matches(run(kernel, case))

    check()


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_zero_pairs_give_zero_rows(kernel, reduce):
    empty = torch.zeros(0, dtype=torch.int64)
    pl = plan(GMSProblem.create(empty, empty, empty, 4, num_segments=2, reduce=reduce))
    y = kernel(torch.randn(3, 5), torch.randn(2, 5, 7), pl, position_scale(pl, None, torch.float32))
    assert torch.equal(y, torch.zeros(4, 7))


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
def test_fp16_and_tiles_larger_than_a_block(kernel):
    gen = torch.Generator().manual_seed(3)
    g, s, d = (torch.randint(0, n, (150,), generator=gen) for n in (30, 3, 20))
    pl = plan(GMSProblem.create(g, s, d, 20, num_segments=3), tile_rows=64, blocks=2)
    x, w = torch.randn(30, 37, generator=gen), torch.randn(3, 37, 33, generator=gen)
    half = kernel(x.half(), w.half(), pl, None)
    assert half.dtype == torch.float16
    ref = gms_reference(x.half().double(), w.half().double(), g, s, d, 20)
    torch.testing.assert_close(half.double(), ref, atol=2e-3 * float(ref.abs().max()), rtol=0)


@pytest.mark.parametrize("value", [10**9, -5])
@pytest.mark.parametrize(
    ("kernel", "field"),
    [(kernel, field) for kernel, fields in PLAN_FIELDS_READ.items() for field in fields],
    ids=lambda p: getattr(p, "__name__", p),
)
def test_a_corrupted_plan_raises_instead_of_reading_out_of_bounds(kernel, field, value):
    g = torch.arange(40) % 9
    pl = plan(GMSProblem.create(g, g % 3, g % 5, 5), tile_rows=8, blocks=2)
    bad = getattr(pl, field).clone()
    bad[len(bad) // 2] = value
    corrupt = dataclasses.replace(pl, **{field: bad})
    with pytest.raises(ValueError, match="plan"):
        kernel(torch.randn(9, 4), torch.randn(3, 4, 6), corrupt, None)
