import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fusekit.gms import NAMED_STRATEGIES, GMSProblem, enumerate_candidates, gms, plan
from fusekit.gms.kernels.reference import gms_reference


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_every_strategy_equals_the_reference(data, draw_case):
    case = draw_case(data)
    for strategy in enumerate_candidates(case.reduce):
        case.assert_matches(gms(case.x, case.w, case.plan, case.scale, strategy))


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_bfloat16(data, draw_case):
    case = draw_case(data, dtype=torch.bfloat16)
    for strategy in enumerate_candidates(case.reduce, named_only=True):
        case.assert_matches(gms(case.x, case.w, case.plan, case.scale, strategy))


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_gradients_equal_the_references(data, draw_case):
    case = draw_case(data, dtype=torch.float64, scale=True, kind="uniform")
    dy = torch.randn(case.n_out, case.w.shape[2], dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (case.x, case.w, case.scale)]
    torch.autograd.backward(
        gms_reference(
            leaves[0],
            leaves[1],
            case.gather,
            case.segment,
            case.scatter,
            case.n_out,
            leaves[2],
            case.reduce,
        ),
        dy,
    )
    expected = [t.grad for t in leaves]
    for strategy in enumerate_candidates(case.reduce, named_only=True):
        leaves = [t.clone().requires_grad_() for t in (case.x, case.w, case.scale)]
        gms(*leaves[:2], case.plan, leaves[2], strategy).backward(dy)
        for got, want in zip((t.grad for t in leaves), expected, strict=True):
            torch.testing.assert_close(got, want)


def gradcheck_problem(reduce, seed=0):
    gen = torch.Generator().manual_seed(seed)
    g = torch.randint(0, 6, (18,), generator=gen)
    s = torch.randint(0, 3, (18,), generator=gen)
    d = torch.randint(0, 5, (18,), generator=gen)
    pl = plan(GMSProblem.create(g, s, d, 5, reduce=reduce), tile_rows=4, blocks=2)
    x = torch.randn(7, 4, generator=gen)  # a row no pair gathers
    w = torch.randn(4, 4, 9, generator=gen)  # a segment no pair uses
    c = torch.rand(18, generator=gen) + 0.5
    return pl, *(t.double().requires_grad_() for t in (x, w, c))


@pytest.mark.parametrize(
    ("strategy", "reduce"),
    [(s, r) for s in NAMED_STRATEGIES for r in ("sum", "mean", "max") if s.order.allows(r)],
    ids=str,
)
def test_gradcheck(strategy, reduce):
    pl, x, w, c = gradcheck_problem(reduce)
    assert torch.autograd.gradcheck(
        lambda x, w, c: gms(x, w, pl, c, strategy), (x, w, c), fast_mode=True
    )


@pytest.mark.slow
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_gradcheck_every_strategy_full_jacobian(reduce):
    pl, x, w, c = gradcheck_problem(reduce, seed=1)
    for strategy in enumerate_candidates(reduce):
        assert torch.autograd.gradcheck(lambda x, w, c, s=strategy: gms(x, w, pl, c, s), (x, w, c))


def test_gradients_of_unused_rows_and_segments_are_zero():
    pl, x, w, c = gradcheck_problem("sum")
    gms(x, w, pl, c).sum().backward()
    assert torch.all(x.grad[6] == 0) and torch.all(w.grad[3] == 0)


def test_no_gradient_is_computed_for_a_constant_scale():
    pl, x, w, c = gradcheck_problem("mean")
    y = gms(x, w, pl, c.detach())
    y.sum().backward()
    assert x.grad is not None and w.grad is not None


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda pl, x, w: gms(x, w, (1, 2)), TypeError, r"'plan' to be a GMSPlan"),
        (
            lambda pl, x, w: gms(x.int(), w, pl),
            TypeError,
            r"'x' to be float32, float64 or bfloat16",
        ),
        (lambda pl, x, w: gms(x, w[:, :2], pl), ValueError, r"'w' to be of shape \[S, 4, M\]"),
        (lambda pl, x, w: gms(x, w, pl, strategy="fused"), ValueError, r"'strategy' to be one of"),
        (
            lambda pl, x, w: gms(x, w, pl, torch.ones(3)),
            ValueError,
            r"'scale' to be 1-D of length 18",
        ),
    ],
)
def test_bad_input(call, error, match):
    pl, x, w, _ = gradcheck_problem("sum")
    with pytest.raises(error, match=match):
        call(pl, x.detach().float(), w.detach().float())


def test_aggregate_first_is_refused_for_max():
    pl, x, w, _ = gradcheck_problem("max")
    with pytest.raises(ValueError, match=r"'strategy' to be an order valid for reduce='max'"):
        gms(x, w, pl, strategy="aggregate-first")


def test_an_order_needs_its_sub_plan():
    g = torch.arange(6)
    pl = plan(GMSProblem.create(g, g % 2, g, 6), orders=False)
    x, w = torch.randn(6, 3), torch.randn(2, 3, 4)
    assert gms(x, w, pl).shape == (6, 4)  # auto falls back to pairwise
    with pytest.raises(ValueError, match=r"'strategy' to be an order the plan holds"):
        gms(x, w, pl, strategy="transform-first")


def test_auto_picks_an_order_that_shrinks_the_gemm():
    d = torch.zeros(50, dtype=torch.long)  # every pair into one row, one segment
    pl = plan(GMSProblem.create(torch.arange(50) % 10, d, d, 1))
    x, w = torch.randn(10, 8), torch.randn(1, 8, 8)
    torch.testing.assert_close(
        gms(x, w, pl), gms_reference(x, w, torch.arange(50) % 10, d, d, 1), atol=1e-4, rtol=1e-4
    )
    assert pl.aggregate.plan.num_pairs == 1


def test_the_input_gradient_plan_swaps_gather_and_scatter_once():
    from fusekit.gms.dispatch import transposed_plan

    pl = gradcheck_problem("mean")[0]
    t_plan, perm = transposed_plan(pl)
    assert transposed_plan(pl)[0] is t_plan  # memoised on the plan
    assert torch.equal(t_plan.gather, pl.scatter[perm])
    assert torch.equal(t_plan.scatter, pl.gather[perm])
    assert torch.equal(t_plan.segment, pl.segment[perm])
    key = t_plan.segment * (t_plan.n_out + 1) + t_plan.scatter
    assert bool((key[1:] >= key[:-1]).all())
    assert (t_plan.n_in, t_plan.n_out) == (pl.n_out, pl.n_in)
    # its CSRs: the forward's, positions renumbered; every position once, grouped by row
    assert torch.equal(t_plan.dst_ptr, pl.src_ptr) and torch.equal(t_plan.src_ptr, pl.dst_ptr)
    for pos, rows in ((t_plan.dst_pos, t_plan.scatter), (t_plan.src_pos, t_plan.gather)):
        assert torch.equal(pos.sort().values, torch.arange(pl.num_pairs))
        assert bool((rows[pos][1:] >= rows[pos][:-1]).all())


def test_sorted_plan_with_more_blocks_than_rows_packs():
    from fusekit.gms.planning.build import plan_sorted

    one = torch.zeros(1, dtype=torch.int64)
    pl = plan_sorted(
        one, one, one, n_in=1, n_out=1, num_segments=1, tile_rows=1, blocks=2, schedule="pack"
    )
    assert pl.item_ptr.tolist() == [0, 1] and pl.block_ptr.tolist() == [0, 1, 1]


def test_an_in_place_edit_of_the_plan_drops_its_memo():
    # a transposed plan memoised on P must not serve P's buffer once it holds another problem
    torch.manual_seed(0)
    g, s, d = (
        torch.randint(0, 30, (200,)),
        torch.randint(0, 3, (200,)),
        torch.randint(0, 25, (200,)),
    )
    p = plan(GMSProblem.create(g, s, d, 25, n_in=30, num_segments=3))
    other = plan(GMSProblem.create(torch.randperm(30)[g], s, d, 25, n_in=30, num_segments=3))
    x = torch.randn(30, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 4, 5, dtype=torch.float64)

    def dx(pl):
        y = gms(x, w, pl, None, "(GMS)seg")
        return torch.autograd.grad(y, x, torch.ones_like(y))[0]

    dx(p)
    with torch.no_grad():
        p.buffer.copy_(other.buffer)
    torch.testing.assert_close(dx(p), dx(other))


@pytest.mark.parametrize("segments", [3, 4])
def test_a_mirrored_plan_runs_its_input_gradient_on_itself(segments):
    # pairs closed under (d, g, s) -> (g, d, 2 - s); w may have more matrices than the plan
    from fusekit.gms.dispatch import mirrored

    d, g, s = torch.tensor([0, 1, 0]), torch.tensor([1, 0, 0]), torch.tensor([0, 2, 1])
    pl = plan(GMSProblem.create(g, s, d, 2, n_in=2, num_segments=3))
    x = torch.randn(2, 2, dtype=torch.float64, requires_grad=True)
    w = torch.randn(segments, 2, 2, dtype=torch.float64)
    ones = torch.ones(2, 2, dtype=torch.float64)
    want = torch.autograd.grad(gms(x, w, pl, None, "G-Mseg-S"), x, ones)[0]
    assert mirrored(pl)
    got = torch.autograd.grad(gms(x, w, pl, None, "(GMS)seg"), x, ones)[0]
    assert pl.derived.transposed is None
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    ("d", "g", "s", "n_in"),
    [
        ([0, 1, 0], [1, 0, 1], [0, 2, 1], 2),  # segment 1's own pair is not its own mirror
        ([0, 1], [1, 0], [0, 1], 2),  # segments 0 and 2 of unequal lengths
        ([0, 1, 0], [1, 0, 0], [0, 2, 1], 3),  # mirrored pairs, but more inputs than outputs
    ],
)
def test_a_plan_whose_pairs_do_not_mirror_is_not_taken_as_mirrored(d, g, s, n_in):
    from fusekit.gms.dispatch import mirrored

    problem = GMSProblem.create(
        torch.tensor(g), torch.tensor(s), torch.tensor(d), 2, n_in=n_in, num_segments=3
    )
    pl = plan(problem)
    assert not mirrored(pl)
    x = torch.randn(n_in, 2, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 2, 2, dtype=torch.float64)
    ones = torch.ones(2, 2, dtype=torch.float64)
    want = torch.autograd.grad(gms(x, w, pl, None, "G-Mseg-S"), x, ones)[0]
    got = torch.autograd.grad(gms(x, w, pl, None, "(GMS)seg"), x, ones)[0]
    torch.testing.assert_close(got, want)


def test_max_gradient_recomputes_the_forward_products_to_the_bit():
    # G-Mseg-S forward: one torch.mm per segment; segments of a few rows would round otherwise
    # in the skinny kernel, and the max gradient would pick other winners than the forward's
    from fusekit.gms.candidates import Strategy
    from fusekit.gms.dispatch import forward, pair_values

    gen = torch.Generator().manual_seed(0)
    e, n_out, segments = 4000, 1600, 400
    g = torch.randint(0, 300, (e,), generator=gen)
    s = torch.randint(0, segments, (e,), generator=gen)
    d = torch.randint(0, n_out, (e,), generator=gen)
    pl = plan(GMSProblem.create(g, s, d, n_out, n_in=300, num_segments=segments, reduce="max"))
    x = torch.randn(300, 256, generator=gen)
    w = torch.randn(segments, 256, 32, generator=gen)
    strategy = Strategy.parse("G-Mseg-S")
    y = forward(strategy, x, w, pl, None)
    values = pair_values(strategy, x, w, pl)
    best = torch.full_like(y, float("-inf")).index_reduce_(0, pl.scatter, values, "amax")
    reached = torch.zeros(n_out, dtype=torch.bool)
    reached[pl.scatter] = True
    assert torch.equal(best[reached], y[reached])
