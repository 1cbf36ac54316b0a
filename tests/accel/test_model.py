import dataclasses
import itertools

import pytest

from fusekit.accel import (
    Fusion,
    Mapping,
    MappingError,
    attention,
    check_mapping,
    evaluate,
    from_tree,
    gemm,
    gemm_layernorm,
    gemm_softmax,
    make_problem,
    to_tree,
)
from fusekit.accel.candidates import enumerate_mappings
from fusekit.accel.mapping import BindingKind
from fusekit.accel.model import pipelined, prepare
from fusekit.accel.nest import NestTensor, fills
from fusekit.accel.units import dram_fills, gemm_accesses, simd_cycles, systolic_cycles
from fusekit.hw import load

EDGE = load("edge")


def test_systolic_cycles_scalesim_form():
    # 128x128 weights on 32x32 arrays: 16 folds over 64 arrays -> 1 fold each; T = 8 rows
    assert systolic_cycles(8, 128, 128, EDGE) == 2 * 32 + 32 + 8 - 2
    # 256 x 1024: 8 * 32 = 256 folds -> 4 per array
    assert systolic_cycles(64, 256, 1024, EDGE) == 4 * (2 * 32 + 32 + 64 - 2)


def test_simd_cycles_per_op_type():
    p = gemm_softmax(8, 64, 8)
    x, e = p.stages[1], p.stages[2]
    # row_max over 16 lanes: ceil(log2 16) = 4 cycles per vector of 16
    assert simd_cycles(x, 1024, 16, EDGE) == 64 * 4
    # exp (3 cycles) + sub (1 cycle)
    assert simd_cycles(e, 1024, 1024, EDGE) == 64 * (3 + 1)


def test_pipelined_ramp_up_and_down():
    assert pipelined([10.0, 30.0, 5.0], 4, pipeline=True) == 45 + 3 * 30
    assert pipelined([10.0, 30.0, 5.0], 4, pipeline=False) == 4 * 45


def test_hand_computed_fused_gemm_softmax_latency():
    # M=N=64, K=32 on edge, 1x4 partition (columns split), row blocks of 8 rows: 8 steps.
    p = gemm_softmax(64, 64, 32)
    m = Mapping(Fusion.FUSED_GB, 1, 4, 8, 16, 32, ("m", "n", "k"))
    b = evaluate(p, EDGE, m)
    # 1 fold: 2*32 + 32 + 8 - 2 = 102 cycles with the weight preload (32), 70 without; the
    # weights stay in the PEs over the 8 row blocks, so they are preloaded once
    assert systolic_cycles(8, 32, 16, EDGE) == 102
    assert systolic_cycles(8, 32, 16, EDGE, preload=False) == 70
    gemm_step = (8 * 70 + 32) / 8
    points = 8 * 16  # per cluster per step -> 8 vectors of 16
    simd_step = 8 * 4 + 8 * (3 + 1) + 8 * 4 + 8 * 1  # row_max, sub+exp, row_sum, div
    # two all-reduces of 8 rows x 8 B among 4 clusters = the whole 2x2 mesh (mesh model):
    # reduce D (h + n beta) + broadcast D h + n beta, D=2, h=5, 64 B over 64 B/cycle links
    coll_step = 2 * ((2 * (5 + 64 / 64)) + (2 * 5 + 64 / 64))
    # DRAM per step: A 64x32 once (row-outermost, the A tile is per row block) + B once + Y
    dram_words = 64 * 32 + 32 * 64 + 64 * 64
    dram_step = dram_words / 8 / 25
    stages = [dram_step, gemm_step, simd_step + coll_step]
    assert points == 128
    assert b.dram_words == dram_words
    assert b.latency_cycles == pytest.approx(sum(stages) + 7 * max(stages))


def test_dram_fills_match_timeloop_counting():
    p = gemm(64, 64, 64)
    st = p.stages[0]
    for order in itertools.permutations("mnk"):
        m = Mapping(Fusion.UNFUSED, 2, 2, 8, 16, 16, order)
        steps = 64 // 16
        above = [(v, {"m": steps, "n": 2, "k": 4}[v]) for v in order]
        tile = {"m": 16, "n": 32, "k": 16}
        for t, dims in (("A", (("m",), ("k",))), ("B", (("k",), ("n",)))):
            want = fills(NestTensor(t, dims), above, tile)
            assert dram_fills(p, m, st, t, 16, 16, steps) == want


def _same_tiling(m: Mapping, fusion: Fusion) -> Mapping:
    return dataclasses.replace(m, fusion=fusion)


@pytest.mark.parametrize("make", [gemm_softmax, gemm_layernorm, attention])
@pytest.mark.parametrize("shape", [(64, 64, 32), (8, 256, 64), (128, 32, 32)])
def test_fused_never_moves_more_offchip_bytes(make, shape):
    p = make(*shape)
    fused = [m for m in enumerate_mappings(p, EDGE, (Fusion.FUSED_GB, Fusion.FUSED_CLUSTER))]
    assert fused
    for m in fused:
        unfused = evaluate(p, EDGE, _same_tiling(m, Fusion.UNFUSED))
        assert evaluate(p, EDGE, m).dram_words <= unfused.dram_words


def test_unfused_traffic_counts_every_intermediate_round_trip():
    p = gemm_softmax(64, 64, 32)
    m = Mapping(Fusion.UNFUSED, 1, 1, 64, 64, 32, ("m", "n", "k"))
    b = evaluate(p, EDGE, m)
    # A, B once; S written; X: S read, X written; E: S, X read, E written; Z: E read, Z written;
    # Y: E, Z read, Y written
    mn, m_ = 64 * 64, 64
    want = 64 * 32 * 2 + mn + (mn + m_) + (mn + m_ + mn) + (mn + m_) + (mn + m_ + mn)
    assert b.dram_words == want


def test_breakdown_explains_ops_and_collectives():
    p = gemm_softmax(64, 64, 32)
    b = evaluate(p, EDGE, Mapping(Fusion.FUSED_CLUSTER, 1, 4, 8, 16, 32, ("m", "n", "k")))
    kinds = [o.kind for o in b.ops]
    assert kinds.count("all_reduce") == 2
    assert b.energy_pj == pytest.approx(sum(b.energy_by_part_pj.values()))
    assert "X.all_reduce(max)" in b.explain()


def test_hand_computed_gemm_energy():
    # S[64,64] += A[64,32] B[32,64] on one edge cluster, row blocks of 16 (4 steps), one 32x64
    # tile per step: 1 x 2 folds of 32x32 in one round, so B stays in the PEs over the row loop
    # (loaded once) and each 16x32 A tile (512 <= 2048 IB words) is read once.
    m = Mapping(Fusion.UNFUSED, 1, 1, 16, 64, 32, ("m", "n", "k"))
    b = evaluate(gemm(64, 64, 32), EDGE, m)
    a_gb, a_ib, b_gb, ob = 4 * 16 * 32, 4 * 16 * 32, 32 * 64, 4 * 16 * 64 * 1
    dram = 64 * 32 + 32 * 64 + 64 * 64  # A and B read, S written: 8192 words
    want = {
        "dram": dram * 800,
        # operands read; A, B staged in from DRAM; S written then read out to DRAM
        "global": (a_gb + b_gb) * 474 + 4096 * 532 + 4096 * 532 + 4096 * 474,
        "buffers": a_gb * 60 + a_ib * 47 + b_gb * (60 + 47) + ob * (129 + 72),
        "mac": 64 * 64 * 32 * 0.2296,
    }
    for part, pj in want.items():
        assert b.energy_by_part_pj[part] == pytest.approx(pj), part
    assert b.energy_pj == pytest.approx(sum(want.values()))  # 12.846 uJ


def test_weights_stay_in_the_arrays_across_loops_that_do_not_index_them():
    # two contraction tiles and two column tiles per cluster, 4 row blocks
    p = gemm(64, 64, 64)
    st = p.stages[0]
    inner_m = Mapping(Fusion.UNFUSED, 1, 1, 16, 32, 32, ("n", "k", "m"))
    outer_m = Mapping(Fusion.UNFUSED, 1, 1, 16, 32, 32, ("m", "n", "k"))
    assert gemm_accesses(p, inner_m, st, 32, 32, 4, EDGE).b_gb_reads == 64 * 64  # once
    assert gemm_accesses(p, outer_m, st, 32, 32, 4, EDGE).b_gb_reads == 4 * 64 * 64
    # A is indexed by m and k: reloaded on every k step either way, kept over n only when n is
    # inside k
    assert gemm_accesses(p, outer_m, st, 32, 32, 4, EDGE).a_gb_reads == 2 * 64 * 64
    mkn = Mapping(Fusion.UNFUSED, 1, 1, 16, 32, 32, ("m", "k", "n"))
    assert gemm_accesses(p, mkn, st, 32, 32, 4, EDGE).a_gb_reads == 64 * 64


@pytest.mark.parametrize(
    ("binding", "want"),
    [
        # per row block: DRAM 2048/25 = 81.92, arrays (8 x 70 + 32) / 8 = 74 (weights preloaded
        # once), SIMD 96 cycles; 8 blocks
        (BindingKind.PARALLEL, 81.92 + 96 + 7 * 96),  # pipe(D, max(S, V))
        (BindingKind.PIPELINE, 81.92 + 74 + 96 + 7 * 96),  # pipe(D, S, V)
        (BindingKind.SHARING, 81.92 + 170 + 7 * 170),  # pipe(D, S + V)
        (BindingKind.SEQUENTIAL, 8 * (81.92 + 170)),
    ],
)
def test_hand_computed_bindings_of_independent_ops(binding, want):
    # a GEMM and an exp that share no data: S = A B on the arrays, T = exp(C) on the SIMD unit
    p = make_problem(
        "two", ["S[m,n] += A[m,k] * B[k,n]", "T[m,n] = exp(C[m,n])"], {"m": 64, "n": 64, "k": 32}
    )
    assert p.outputs == ("S", "T") and p.independent()
    m = Mapping(Fusion.FUSED_GB, 1, 1, 8, 64, 32, ("m", "n", "k"), binding)
    check_mapping(p, EDGE, m)
    assert systolic_cycles(8, 32, 64, EDGE) == 2 * 32 + 32 + 8 - 2  # 2 folds, one round
    assert simd_cycles(p.stages[1], 8 * 64, 8 * 64, EDGE) == 32 * 3  # 32 vectors of exp
    b = evaluate(p, EDGE, m)
    assert b.dram_words == 2048 + 2048 + 4096 + 4096 + 4096  # A, B, C read; S, T written
    assert b.latency_cycles == pytest.approx(want)
    assert from_tree(p, to_tree(p, m), EDGE) == m


def test_sharing_on_gemm_softmax_serialises_arrays_and_simd():
    p = gemm_softmax(64, 64, 32)
    m = Mapping(Fusion.FUSED_GB, 1, 4, 8, 16, 32, ("m", "n", "k"), BindingKind.SHARING)
    b = evaluate(p, EDGE, m)
    gemm_step = (8 * 70 + 32) / 8  # weights preloaded once (see the test above)
    simd_step = 8 * 4 + 8 * (3 + 1) + 8 * 4 + 8 * 1
    coll_step = 2 * ((2 * (5 + 64 / 64)) + (2 * 5 + 64 / 64))
    dram_step = (64 * 32 + 32 * 64 + 64 * 64) / 8 / 25
    work = gemm_step + simd_step + coll_step
    assert b.latency_cycles == pytest.approx(dram_step + work + 7 * max(dram_step, work))
    pipe = evaluate(p, EDGE, dataclasses.replace(m, binding=BindingKind.PIPELINE))
    assert pipe.energy_pj == b.energy_pj and pipe.latency_cycles < b.latency_cycles


def test_sharing_keeps_one_row_block_live_where_pipeline_needs_two():
    # fused in the cluster: the output buffer holds 8192 words (double-buffered 128 KiB)
    p = gemm_softmax(256, 1024, 64)
    m = Mapping(Fusion.FUSED_CLUSTER, 1, 1, 8, 256, 64, ("m", "n", "k"), BindingKind.SHARING)
    check_mapping(p, EDGE, m)  # 8 x 1024 words live
    with pytest.raises(MappingError, match=r"tile\[output\].*2 x 8x1024"):
        check_mapping(p, EDGE, dataclasses.replace(m, binding=BindingKind.PIPELINE))


def test_parallel_needs_independent_ops():
    m = Mapping(Fusion.FUSED_GB, 1, 1, 8, 64, 32, ("m", "n", "k"), BindingKind.PARALLEL)
    with pytest.raises(MappingError, match=r"bind.*independent.*op X reads S"):
        check_mapping(gemm_softmax(64, 64, 32), EDGE, m)
    p = gemm_softmax(64, 64, 32)
    assert {m.binding for m in enumerate_mappings(p, EDGE)} == {
        BindingKind.PIPELINE,
        BindingKind.SHARING,
    }


@pytest.mark.parametrize("hw", ["edge", "cloud"])
@pytest.mark.parametrize("make", [gemm_softmax, gemm_layernorm, attention, gemm])
def test_shared_stage_memo_gives_the_recipes_numbers(hw, make):
    # the mapper shares one prepare() over a chunk of mappings: every stage but the first GEMM
    # comes from the memo; each breakdown must equal the one computed from scratch, bit for bit
    accel = load(hw)
    p = make(128, 128, 64)
    shared = prepare(p, accel)
    mappings = list(enumerate_mappings(p, accel))
    for m in mappings[:: max(1, len(mappings) // 500)]:
        assert evaluate(p, accel, m, shared) == evaluate(p, accel, m), m.label()
    assert shared.stages or len(p.stages) == 1
