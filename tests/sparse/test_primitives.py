"""Token-exact tests of the streaming primitives (literal gold streams, as in SAM)."""

import numpy as np

from fusekit.sparse.formats import LevelKind, StoredLevel
from fusekit.sparse.sim.engine import Network, run
from fusekit.sparse.sim.primitives import (
    ALU,
    Array,
    CoordDropper,
    Joiner,
    LevelScanner,
    LevelWriter,
    Locator,
    Reducer,
    Repeater,
    SparseAccumulator,
)
from fusekit.sparse.sim.tokens import parse


def _sink(net: Network, prim, port: str):  # type: ignore[no-untyped-def]
    ch = net.wire(prim, port)
    net.add(LevelWriter(f"sink {prim.name}.{port}", ch))
    return ch


def test_dense_scanner_gold() -> None:
    net = Network(depth=2)
    sc = net.add(
        LevelScanner(
            "scan", StoredLevel(LevelKind.DENSE, 3), net.source("in", parse("0 1 2 3 S0 D"))
        )
    )
    crd, ref = _sink(net, sc, "crd"), _sink(net, sc, "ref")
    run(net)
    assert crd.log == parse("0 1 2 S0 0 1 2 S0 0 1 2 S0 0 1 2 S1 D")
    assert ref.log == parse("0 1 2 S0 3 4 5 S0 6 7 8 S0 9 10 11 S1 D")


def test_compressed_scanner_gold() -> None:
    level = StoredLevel(LevelKind.COMPRESSED, 5, np.array([0, 2, 2, 3]), np.array([1, 4, 0]))
    net = Network()
    sc = net.add(LevelScanner("scan", level, net.source("in", parse("0 1 2 D"))))
    crd, ref = _sink(net, sc, "crd"), _sink(net, sc, "ref")
    run(net)
    assert crd.log == parse("1 4 S0 S0 0 S0 D")
    assert ref.log == parse("0 1 S0 S0 2 S0 D")


def test_reducer_gold() -> None:
    net = Network()
    red = net.add(Reducer("red", net.source("in", parse("5 5 S0 5 S0 4 8 S0 4 3 S0 4 3 S1 D"))))
    out = _sink(net, red, "val")
    run(net)
    assert out.log == parse("10 5 12 7 7 S0 D")


def test_coordinate_dropper_gold() -> None:
    net = Network()
    drop = net.add(
        CoordDropper(
            "drop",
            net.source("o", parse("0 1 2 3 S0 D")),
            net.source("i", parse("1 S0 1 S0 S0 1 S1 D")),
        )
    )
    outer, inner = _sink(net, drop, "outer"), _sink(net, drop, "inner")
    run(net)
    assert outer.log == parse("0 1 3 S0 D")
    assert inner.log == parse("1 S0 1 S0 1 S1 D")


def test_repeater_gold() -> None:
    net = Network()
    rep = net.add(
        Repeater(
            "rep", net.source("ref", parse("7 8 S0 D")), net.source("sig", parse("0 1 S0 2 S1 D"))
        )
    )
    out = _sink(net, rep, "ref")
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
    out = _sink(net, loc, "ref")
    run(net)
    assert out.log == parse("13 14 S0 25 S1 D")


def test_intersecter_and_unioner_gold() -> None:
    for union, crd_gold, ra_gold, rb_gold in (
        (False, "1 4 S0 D", "10 12 S0 D", "21 22 S0 D"),
        (True, "0 1 3 4 S0 D", "N 10 11 12 S0 D", "20 21 N 22 S0 D"),
    ):
        net = Network()
        j = net.add(
            Joiner(
                "join",
                union,
                net.source("ca", parse("1 3 4 S0 D")),
                net.source("ra", parse("10 11 12 S0 D")),
                net.source("cb", parse("0 1 4 S0 D")),
                net.source("rb", parse("20 21 22 S0 D")),
            )
        )
        crd, ra, rb = _sink(net, j, "crd"), _sink(net, j, "ref_a"), _sink(net, j, "ref_b")
        run(net)
        assert (crd.log, ra.log, rb.log) == (parse(crd_gold), parse(ra_gold), parse(rb_gold))


def test_array_and_alu_gold() -> None:
    net = Network()
    arr = net.add(
        Array("arr", np.array([0.5, 1.5, 2.5]), net.source("ref", parse("2 N S0 0 S1 D")))
    )
    alu = net.add(
        ALU(
            "mul", lambda a, b: a * b, net.wire(arr, "val"), net.source("b", parse("2 3 S0 4 S1 D"))
        )
    )
    out = _sink(net, alu, "val")
    run(net)
    assert out.log == parse("5.0 0.0 S0 2.0 S1 D")


def test_sparse_accumulator_gold() -> None:
    # two rows; row 0 sums fibers {j1: 1, j3: 2} and {j1: 4}; row 1 has one fiber {j0: 5}
    net = Network()
    acc = net.add(
        SparseAccumulator(
            "acc",
            net.source("c", parse("1 3 S0 1 S1 0 S2 D")),
            net.source("v", parse("1 2 S0 4 S1 5 S2 D")),
        )
    )
    crd, val = _sink(net, acc, "crd"), _sink(net, acc, "val")
    run(net)
    assert crd.log == parse("1 3 S0 0 S1 D")
    assert val.log == parse("5.0 2.0 S0 5.0 S1 D")


def test_bounded_fifo_backpressure_costs_cycles() -> None:
    def cycles(depth: int) -> int:
        net = Network(depth=depth, latency=2)  # a token in flight holds its slot for 2 cycles
        sc = net.add(
            LevelScanner(
                "scan", StoredLevel(LevelKind.DENSE, 6), net.source("in", parse("0 1 2 S0 D"))
            )
        )
        _sink(net, sc, "crd")
        _sink(net, sc, "ref")
        return run(net)

    assert cycles(1) > cycles(2) == cycles(8)
