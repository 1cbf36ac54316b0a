"""The four CPU dataflow kernels (kernels/cpu/{g_mseg_s,gm_seg_s,g_ms_seg,gms_seg}.py) against the
reference: one suite, parametrised over the kernels, which share one signature."""

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fusekit.gms import GMSProblem, plan
from fusekit.gms.dispatch import position_scale
from fusekit.gms.kernels.cpu.g_ms_seg import g_ms_seg_cpu
from fusekit.gms.kernels.cpu.g_mseg_s import g_mseg_s_cpu
from fusekit.gms.kernels.cpu.gm_seg_s import gm_seg_s_cpu
from fusekit.gms.kernels.cpu.gms_seg import gms_seg_cpu
from fusekit.gms.kernels.reference import gms_reference

KERNELS = [g_mseg_s_cpu, gm_seg_s_cpu, g_ms_seg_cpu, gms_seg_cpu]

#: The plan arrays each kernel dereferences: corrupting any of them must raise, not read or
#: write out of bounds.
PLAN_FIELDS_READ = {
    g_mseg_s_cpu: ["gather", "segment_ptr", "dst_ptr", "dst_pos"],
    gm_seg_s_cpu: [
        "gather",
        "tile_start",
        "tile_end",
        "tile_segment",
        "item_ptr",
        "dst_ptr",
        "dst_pos",
    ],
    g_ms_seg_cpu: ["gather", "scatter", "tile_start", "tile_end", "tile_segment", "block_ptr"],
    gms_seg_cpu: ["gather", "scatter", "tile_start", "tile_end", "tile_segment", "block_ptr"],
}


def run(kernel, case):
    c = position_scale(case.plan, case.scale, case.x.dtype)
    return kernel(case.x, case.w, case.plan, c)


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_equals_reference_fp32(kernel, data, draw_case):
    case = draw_case(data)
    case.assert_matches(run(kernel, case))


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_equals_reference_fp64(kernel, data, draw_case):
    case = draw_case(data, dtype=torch.float64)
    case.assert_matches(run(kernel, case))


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
@pytest.mark.parametrize("k_m", [(16, 16), (64, 64), (13, 21)])
def test_larger_tiles(kernel, k_m):
    k, m = k_m
    gen = torch.Generator().manual_seed(k)
    g, s, d = (torch.randint(0, n, (3000,), generator=gen) for n in (500, 7, 400))
    pl = plan(GMSProblem.create(g, s, d, 400, num_segments=7), blocks=3)
    x, w = torch.randn(500, k, generator=gen), torch.randn(7, k, m, generator=gen)
    torch.testing.assert_close(
        kernel(x, w, pl, None), gms_reference(x, w, g, s, d, 400), atol=1e-4 * k, rtol=1e-4
    )


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


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
@pytest.mark.parametrize(("tokens", "k", "m"), [(300, 48, 40), (5, 33, 17), (0, 16, 16)])
def test_moe_routing(kernel, tokens, k, m):
    # top-2 of 6 experts, expert 5 never chosen (an empty segment), gate-weighted sum; M not a
    # multiple of the register tile's width, several column panels per tile
    gen = torch.Generator().manual_seed(tokens)
    logits = torch.randn(tokens, 6, generator=gen)
    logits[:, 5] = float("-inf")
    top = torch.topk(logits, 2, dim=1)
    gates = torch.softmax(top.values, dim=1).flatten()
    token = torch.arange(tokens).repeat_interleave(2)
    expert = top.indices.flatten()
    pl = plan(GMSProblem.create(token, expert, token, tokens, n_in=tokens, num_segments=6))
    x, w = torch.randn(tokens, k, generator=gen), torch.randn(6, k, m, generator=gen)
    got = kernel(x, w, pl, position_scale(pl, gates, x.dtype))
    expected = gms_reference(x, w, token, expert, token, tokens, gates)
    torch.testing.assert_close(got, expected, atol=1e-4 * k, rtol=1e-4)


@pytest.mark.parametrize("kernel", [g_mseg_s_cpu, gm_seg_s_cpu], ids=lambda k: k.__name__)
def test_scratch_buffers_never_leak_into_results(kernel):
    # G-Mseg-S and (GM)seg-S keep their intermediates in per-thread buffers between calls: a
    # result must stay unchanged by later calls, whatever their width M, concurrent calls on one
    # plan (each thread has its own buffers) must not mix, and the plan stays copyable
    import copy
    import pickle
    import threading

    gen = torch.Generator().manual_seed(3)
    g, s, d = (torch.randint(0, n, (900,), generator=gen) for n in (70, 5, 60))
    pl = plan(GMSProblem.create(g, s, d, 60, num_segments=5), blocks=3)
    x = torch.randn(70, 24, generator=gen)
    ws = [torch.randn(5, 24, m, generator=gen) for m in (16, 40, 8, 40)]
    expected = [gms_reference(x, w, g, s, d, 60) for w in ws]
    results = [kernel(x, w, pl, None) for w in ws]
    for got, want in zip(results, expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4 * 24, rtol=1e-4)
    for twin in (copy.deepcopy(pl), pickle.loads(pickle.dumps(pl))):
        torch.testing.assert_close(kernel(x, ws[1], twin, None), results[1])

    errors = []

    def worker(w, want):
        try:
            for _ in range(20):
                torch.testing.assert_close(kernel(x, w, pl, None), want, atol=1e-4 * 24, rtol=1e-4)
        except AssertionError as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(ws[i], expected[i])) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
