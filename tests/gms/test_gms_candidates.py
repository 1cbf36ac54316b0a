import pytest

from fusekit.gms.candidates import (
    NAMED_STRATEGIES,
    Dataflow,
    GemmRows,
    Order,
    Strategy,
    default_strategy,
    enumerate_candidates,
)


def test_dataflows_use_the_papers_spelling():
    assert [d.value for d in Dataflow] == ["G-Mseg-S", "(GM)seg-S", "G-(MS)seg", "(GMS)seg"]
    assert Dataflow.GM_SEG_S == "(GM)seg-S"
    assert [d.module for d in Dataflow] == ["g_mseg_s", "gm_seg_s", "g_ms_seg", "gms_seg"]


def test_six_named_strategies():
    names = [s.name for s in NAMED_STRATEGIES]
    assert names == [
        "G-Mseg-S",
        "(GM)seg-S",
        "G-(MS)seg",
        "(GMS)seg",
        "transform-first/(GMS)seg",
        "aggregate-first/(GMS)seg",
    ]


@pytest.mark.parametrize("strategy", [Strategy(o, d) for o in Order for d in Dataflow])
def test_parse_round_trips(strategy):
    assert Strategy.parse(strategy.name) == strategy
    assert Strategy.parse(strategy) is strategy


def test_parse_short_forms():
    assert Strategy.parse("aggregate-first") == Strategy(Order.AGGREGATE_FIRST, Dataflow.GMS_SEG)
    assert Strategy.parse(Dataflow.G_MSEG_S) == Strategy(Order.PAIRWISE, Dataflow.G_MSEG_S)
    assert Strategy.parse(Order.TRANSFORM_FIRST).dataflow is Dataflow.GMS_SEG
    assert str(Strategy()) == "(GMS)seg"


@pytest.mark.parametrize("bad", ["GMS", "aggregate-first/(GMS)", "first/(GMS)seg", ""])
def test_parse_rejects_unknown_names(bad):
    with pytest.raises(ValueError, match=r"'strategy' to be one of G-Mseg-S, .*aggregate-first"):
        Strategy.parse(bad)


def test_enumerate_respects_the_reduce_and_the_plan():
    assert len(enumerate_candidates("sum")) == 12
    maxes = enumerate_candidates("max")
    assert len(maxes) == 8 and all(s.order is not Order.AGGREGATE_FIRST for s in maxes)
    assert enumerate_candidates("max", named_only=True) == list(NAMED_STRATEGIES[:5])
    unplanned = GemmRows(pairwise=10, transform_first=None, aggregate_first=None)
    assert {s.order for s in enumerate_candidates("sum", unplanned)} == {Order.PAIRWISE}


def test_default_strategy_takes_the_fewest_gemm_rows():
    rows = GemmRows(pairwise=100, transform_first=60, aggregate_first=40)
    assert default_strategy("sum", rows) == Strategy(Order.AGGREGATE_FIRST)
    assert default_strategy("max", rows) == Strategy(Order.TRANSFORM_FIRST)
    assert default_strategy("sum", GemmRows(100, 100, 100)) == Strategy(Order.PAIRWISE)
    assert default_strategy("mean", GemmRows(100, None, None)).order is Order.PAIRWISE
