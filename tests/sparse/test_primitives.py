"""Token-exact tests of the streaming primitives on small literal streams, and backpressure."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusekit.sparse.formats import LevelKind, StoredLevel
from fusekit.sparse.sim.base import Primitive, Sink
from fusekit.sparse.sim.channel import Channel
from fusekit.sparse.sim.engine import Network, run
from fusekit.sparse.sim.fiber_acc import FiberAccumulator
from fusekit.sparse.sim.primitives import (
    ALU,
    ArrayRead,
    CompressedScanner,
    CompressedWriter,
    CrdDrop,
    Intersect,
    Locator,
    Reduce,
    Repeat,
    Union,
    level_scanner,
)
from fusekit.sparse.sim.tokens import ADVANCE, REPEAT, Stop, Token, from_sam, parse, to_sam


def _sink(net: Network, prim: Primitive, port: str) -> Channel:
    ch = net.wire(prim, port)
    net.add(Sink(f"sink {prim.name}.{port}", ch))
    return ch


def test_tokens_spell_as_sam() -> None:
    for word in ("S0", "S3", "D", "N", "R", "S"):
        assert to_sam(from_sam(word)) == word
    assert from_sam("S") is ADVANCE and from_sam("R") is REPEAT and from_sam("S2") == Stop(2)
    with pytest.raises(ValueError, match="S<k>"):
        from_sam("X1")


def test_dense_scanner_gold() -> None:
    net = Network(depth=2)
    sc = net.add(
        level_scanner(
            "scan", StoredLevel(LevelKind.DENSE, 3), net.source("in", parse("0 1 2 3 S0 D"))
        )
    )
    crd, ref = _sink(net, sc, "out_crd"), _sink(net, sc, "out_ref")
    run(net)
    assert crd.log == parse("0 1 2 S0 0 1 2 S0 0 1 2 S0 0 1 2 S1 D")
    assert ref.log == parse("0 1 2 S0 3 4 5 S0 6 7 8 S0 9 10 11 S1 D")


def test_compressed_scanner_empty_fiber_costs_one_cycle() -> None:
    level = StoredLevel(LevelKind.COMPRESSED, 5, np.array([0, 2, 2, 3]), np.array([1, 4, 0]))
    net = Network(depth=None)
    sc = net.add(level_scanner("scan", level, net.source("in", parse("0 1 2 D"))))
    crd, ref = _sink(net, sc, "out_crd"), _sink(net, sc, "out_ref")
    run(net)
    assert crd.log == parse("1 4 S0 S0 0 S0 D")
    assert ref.log == parse("0 1 S0 S0 2 S0 D")
    assert crd.times == list(range(1, 8))  # one token per cycle, no idle cycle for the empty fiber


def test_scanner_absent_reference_emits_n_then_stop() -> None:
    level = StoredLevel(LevelKind.COMPRESSED, 5, np.array([0, 2]), np.array([1, 4]))
    net = Network()
    sc = net.add(level_scanner("scan", level, net.source("in", parse("N 0 S0 D"))))
    crd = _sink(net, sc, "out_crd")
    _sink(net, sc, "out_ref")
    run(net)
    assert crd.log == parse("N S0 1 4 S1 D")


def test_reduce_gold() -> None:
    net = Network()
    red = net.add(Reduce("red", net.source("in", parse("5 5 S0 S0 4 8 S0 4 3 S0 4 3 S1 D"))))
    out = _sink(net, red, "out_val")
    run(net)
    assert out.log == parse("10 0 12 7 7 S0 D")


def test_coordinate_dropper_passes_inner_unchanged() -> None:
    net = Network()
    inner = parse("1 S0 1 S0 S0 1 S1 D")
    drop = net.add(
        CrdDrop("drop", net.source("o", parse("0 1 2 3 S0 D")), net.source("i", list(inner)))
    )
    outer, inner_out = _sink(net, drop, "out_outer_crd"), _sink(net, drop, "out_inner_crd")
    run(net)
    assert outer.log == parse("0 1 3 S0 D")
    assert inner_out.log == inner


def test_coordinate_dropper_empty_outer_fiber() -> None:
    for depth in (1, None):
        net = Network(depth=depth, latency=2)
        drop = net.add(
            CrdDrop("drop", net.source("o", parse("S0 D")), net.source("i", parse("S1 D")))
        )
        outer, inner = _sink(net, drop, "out_outer_crd"), _sink(net, drop, "out_inner_crd")
        run(net)
        assert (outer.log, inner.log) == (parse("S0 D"), parse("S1 D"))


def test_value_dropper_drops_zeros() -> None:
    net = Network()
    drop = net.add(
        CrdDrop(
            "drop", net.source("o", parse("0 1 2 S0 D")), net.source("v", parse("3 0 5 S0 D")), True
        )
    )
    outer, vals = _sink(net, drop, "out_outer_crd"), _sink(net, drop, "out_inner_crd")
    run(net)
    assert (outer.log, vals.log) == (parse("0 2 S0 D"), parse("3 5 S0 D"))


def test_repeat_reads_a_crd_stream_as_signals() -> None:
    net = Network()
    rep = net.add(
        Repeat(
            "rep", net.source("ref", parse("7 8 S0 D")), net.source("sig", parse("0 1 S0 2 S1 D"))
        )
    )
    out = _sink(net, rep, "out_ref")
    run(net)
    assert out.log == parse("7 7 S0 8 S1 D")


def test_locator_gold() -> None:
    net = Network()
    loc = net.add(
        Locator(
            "loc",
            10,
            net.source("ref", parse("1 2 S0 D")),
            net.source("sig", parse("3 4 S0 5 S1 D")),
        )
    )
    out = _sink(net, loc, "out_ref")
    run(net)
    assert out.log == parse("13 14 S0 25 S1 D")


def test_intersect_and_union_gold() -> None:
    for join, crd_gold, ra_gold, rb_gold in (
        (Intersect, "1 4 S0 D", "10 12 S0 D", "21 22 S0 D"),
        (Union, "0 1 3 4 S0 D", "N 10 11 12 S0 D", "20 21 N 22 S0 D"),
    ):
        net = Network()
        j = net.add(
            join(
                "join",
                net.source("ca", parse("1 3 4 S0 D")),
                net.source("ra", parse("10 11 12 S0 D")),
                net.source("cb", parse("0 1 4 S0 D")),
                net.source("rb", parse("20 21 22 S0 D")),
            )
        )
        crd, ra, rb = _sink(net, j, "out_crd"), _sink(net, j, "out_ref1"), _sink(net, j, "out_ref2")
        run(net)
        assert (crd.log, ra.log, rb.log) == (parse(crd_gold), parse(ra_gold), parse(rb_gold))


def test_joiners_take_absent_fibers_as_empty() -> None:
    net = Network()
    u = net.add(
        Union(
            "u",
            net.source("ca", parse("N S0 2 S1 D")),
            net.source("ra", parse("N S0 5 S1 D")),
            net.source("cb", parse("1 3 S0 S1 D")),
            net.source("rb", parse("0 1 S0 S1 D")),
        )
    )
    crd, ra = _sink(net, u, "out_crd"), _sink(net, u, "out_ref1")
    _sink(net, u, "out_ref2")
    run(net)
    assert (crd.log, ra.log) == (parse("1 3 S0 2 S1 D"), parse("N N S0 5 S1 D"))


def test_array_and_alu_gold() -> None:
    net = Network()
    arr = net.add(
        ArrayRead("arr", np.array([0.5, 1.5, 2.5]), net.source("ref", parse("2 N S0 0 S1 D")))
    )
    alu = net.add(
        ALU("mul", "mul", net.wire(arr, "out_val"), net.source("b", parse("2 3 S0 4 S1 D")))
    )
    out = _sink(net, alu, "out_val")
    run(net)
    assert out.log == parse("5.0 0 S0 2.0 S1 D")


def test_alu_patch_for_a_value_against_a_stop() -> None:
    """SAM's adder sends a value met by a stop and keeps the stop; its multiplier sends 0."""
    for op, gold in (("sub", "-5 S0 D"), ("mul", "0 S0 D")):
        net = Network()
        alu = net.add(ALU(op, op, net.source("a", parse("S0 D")), net.source("b", parse("5 S0 D"))))
        out = _sink(net, alu, "out_val")
        run(net)
        assert out.log == parse(gold)
    net = Network()
    alu = net.add(
        ALU("max", "max", net.source("a", parse("1 S0 D")), net.source("b", parse("S0 D")))
    )
    _sink(net, alu, "out_val")
    with pytest.raises(ValueError, match="aligned"):
        run(net)


def test_fiber_accumulator_gold() -> None:
    # two rows; row 0 sums fibers {j1: 1, j3: 2} and {j1: 4}; row 1 has one fiber {j0: 5}
    net = Network()
    acc = net.add(
        FiberAccumulator(
            "acc",
            net.source("c", parse("1 3 S0 1 S1 0 S2 D")),
            net.source("v", parse("1 2 S0 4 S1 5 S2 D")),
        )
    )
    crd, val = _sink(net, acc, "out_crd"), _sink(net, acc, "out_val")
    run(net)
    assert crd.log == parse("1 3 S0 0 S1 D")
    assert val.log == parse("5.0 2.0 S0 5.0 S1 D")


def test_compressed_writer_skips_empty_fibers() -> None:
    net = Network()
    w = net.add(CompressedWriter("w", net.source("c", parse("1 S0 S0 2 S1 D"))))
    run(net)
    assert isinstance(w, CompressedWriter)
    assert (w.crd_arr, w.seg_arr) == ([1, 2], [0, 1, 2])


def test_bounded_fifo_backpressure_costs_cycles() -> None:
    def cycles(depth: int) -> int:
        net = Network(depth=depth, latency=2)  # a token in flight holds its slot for 2 cycles
        sc = net.add(
            level_scanner(
                "scan", StoredLevel(LevelKind.DENSE, 6), net.source("in", parse("0 1 2 S0 D"))
            )
        )
        _sink(net, sc, "out_crd")
        _sink(net, sc, "out_ref")
        return run(net)

    assert cycles(1) > cycles(2) == cycles(8)


def _csr(rows: list[list[int]]) -> tuple[list[int], list[int]]:
    seg, crd = [0], []
    for r in rows:
        crd += sorted(r)
        seg.append(len(crd))
    return seg, crd


def _intersect_rows(
    a: list[list[int]], b: list[list[int]], skip: bool, depth: int = 4, latency: int = 1
) -> tuple[list[Token], int]:
    """Row-by-row intersection of two CSR matrices; ``skip`` wires the skip loop."""
    net = Network(depth=depth, latency=latency)
    refs = parse(" ".join(str(i) for i in range(len(a))) + " S0 D")
    fb1, fb2 = (net.channel(f"skip{k}") if skip else None for k in (1, 2))
    scans = []
    for k, m in enumerate((a, b)):
        seg, crd = _csr(m)
        src = net.source(f"rows{k}", list(refs))
        scans.append(net.add(CompressedScanner(f"scan{k}", seg, crd, src, fb1 if k == 0 else fb2)))
    ins = [net.wire(s, p) for s in scans for p in ("out_crd", "out_ref")]
    join = net.add(Intersect("join", *ins))
    crd = _sink(net, join, "out_crd")
    _sink(net, join, "out_ref1")
    _sink(net, join, "out_ref2")
    if fb1 is not None and fb2 is not None:
        join.connect("out_crd_skip1", fb1)
        join.connect("out_crd_skip2", fb2)
    return crd.log, run(net, until=lambda: join.done and not len(crd))


_rows = st.lists(st.lists(st.integers(0, 60), unique=True).map(sorted), min_size=1, max_size=4)


@settings(max_examples=120, deadline=None)
@given(
    data=st.data(),
    a=_rows,
    depth=st.sampled_from([1, 2, 4]),
    latency=st.sampled_from([1, 2]),
)
def test_skip_loop_keeps_the_intersection(
    data: st.DataObject, a: list[list[int]], depth: int, latency: int
) -> None:
    """Scanners and intersecter with the skip loop closed: same intersection, no deadlock."""
    b = data.draw(
        st.lists(
            st.lists(st.integers(0, 60), unique=True).map(sorted), min_size=len(a), max_size=len(a)
        )
    )
    plain = _intersect_rows(a, b, False, depth, latency)[0]
    skipped = _intersect_rows(a, b, True, depth, latency)[0]
    assert skipped == plain


def test_skip_loop_keeps_the_intersection_and_saves_cycles() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        n_rows = int(rng.integers(1, 5))
        a = [
            sorted(rng.choice(200, int(rng.integers(0, 40)), replace=False).tolist())
            for _ in range(n_rows)
        ]
        b = [
            sorted(rng.choice(200, int(rng.integers(0, 5)), replace=False).tolist())
            for _ in range(n_rows)
        ]
        plain, plain_cycles = _intersect_rows(a, b, skip=False)
        skipped, skip_cycles = _intersect_rows(a, b, skip=True)
        assert skipped == plain
        assert skip_cycles <= plain_cycles
    dense, sparse = [list(range(100))], [[3, 50, 97]]
    assert _intersect_rows(dense, sparse, True)[1] < _intersect_rows(dense, sparse, False)[1] / 3
