import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fusekit.gms import GMSProblem, plan
from fusekit.gms.features import (
    VECTOR_NAMES,
    features,
    features_of_counts,
    features_of_problem,
    signature,
)


def _problem(reduce="sum"):
    # pairs (g, s, d): (s=0, g=0) twice, (s=0, d=1) twice; segment 2 empty
    g = torch.tensor([0, 0, 1, 2, 2])
    s = torch.tensor([0, 0, 1, 1, 3])
    d = torch.tensor([1, 1, 0, 3, 3])
    return GMSProblem.create(g, s, d, 5, n_in=4, num_segments=4, reduce=reduce)


def test_features_count_rows_of_every_order_and_skew():
    f = features(plan(_problem()), 8, 16, torch.float32, has_scale=True)
    assert (f.pairs, f.segments, f.n_in, f.n_out, f.k, f.m) == (5, 4, 4, 5, 8, 16)
    assert f.transform_rows == 4  # distinct (s, g): (0,0) (1,1) (1,2) (3,2)
    assert f.aggregate_rows == 4  # distinct (s, d): (0,1) (1,0) (1,3) (3,3)
    assert f.gather_rows == 3 and f.scatter_rows == 3
    assert f.max_row_pairs == 2
    assert f.segment_pairs == (2, 2, 0, 1)
    assert sum(f.transform_segment_rows) == 4 and sum(f.aggregate_segment_rows) == 4
    assert f.dtype == "fp32" and f.reduce == "sum" and f.has_scale
    assert f.group == "fp32,sum"
    assert len(f.vector()) == len(VECTOR_NAMES)
    # segment sizes 2, 2, 1: mean 5/3, population std sqrt(2/9)
    assert f.segment_cv == pytest.approx((2 / 9) ** 0.5 / (5 / 3))


def test_max_has_no_aggregate_order():
    f = features(plan(_problem("max")), 8, 8, torch.bfloat16, has_scale=False)
    assert f.aggregate_rows is None and f.aggregate_segment_rows == ()
    assert f.dtype == "bf16" and f.vector()[VECTOR_NAMES.index("log2_pairs_per_aggregate_row")] == 0


def test_features_reject_bad_arguments():
    pl = plan(_problem())
    with pytest.raises(ValueError, match="'k'"):
        features(pl, 0, 8, torch.float32, False)
    with pytest.raises(TypeError, match="dtype"):
        features(pl, 8, 8, torch.int32, False)
    with pytest.raises(ValueError, match="orders"):
        features(plan(_problem(), orders=False), 8, 8, torch.float32, False)


def test_signature_is_stable_and_tells_problems_apart():
    p = _problem()
    key = signature(p, 8, 8, torch.float32, False)
    assert key == signature(_problem(), 8, 8, torch.float32, False)
    assert key != signature(p, 8, 16, torch.float32, False)
    assert key != signature(p, 8, 8, torch.float32, True)
    assert key != signature(_problem("mean"), 8, 8, torch.float32, False)


def test_features_of_counts_equal_planned_features():
    pl = plan(_problem())
    got = features_of_counts(
        segment_pairs=(2, 2, 0, 1),
        degree=pl.dst_ptr.diff(),
        sources=pl.src_ptr.diff(),
        n_in=4,
        k=8,
        m=16,
        dtype=torch.float32,
        has_scale=True,
        transform_segment_rows=(1, 2, 0, 1),
        aggregate_segment_rows=(1, 2, 0, 1),
    )
    assert got == features(pl, 8, 16, torch.float32, has_scale=True)
    # left out: every (s, g) and (s, d) one pair, sources = degree (a submanifold kernel map)
    g = torch.tensor([0, 1, 1, 0])
    s = torch.tensor([0, 0, 1, 1])
    distinct = plan(GMSProblem.create(g, s, g.flip(0), 2, n_in=2))
    got = features_of_counts(
        segment_pairs=(2, 2), degree=distinct.dst_ptr.diff(), sources=None, n_in=2, k=4, m=4,
        dtype=torch.float64,
    )  # fmt: skip
    assert got == features(distinct, 4, 4, torch.float64, has_scale=False)
    with pytest.raises(ValueError, match="'m'"):
        features_of_counts(
            segment_pairs=(1,), degree=torch.ones(1), sources=None, n_in=1, k=1, m=0,
            dtype=torch.float32,
        )  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_features_of_problem_equal_planned_features(data, draw_case):
    case = draw_case(data)
    problem = GMSProblem.create(
        case.gather,
        case.segment,
        case.scatter,
        case.n_out,
        n_in=case.plan.n_in,
        num_segments=case.plan.num_segments,
        reduce=case.reduce,
    )
    want = features(case.plan, 8, 4, torch.float32, has_scale=case.scale is not None)
    assert features_of_problem(problem, 8, 4, torch.float32, case.scale is not None) == want
