"""The fast simulator on whole models: functional equality and the FuseFlow trends."""

import dataclasses

import numpy as np
import pytest

from fusekit.sparse.machine import Machine
from fusekit.sparse.program import reference
from fusekit.sparse.schedule import Schedule
from fusekit.sparse.simulate import simulate
from fusekit.sparse.workloads import autoencoder, bigbird, gcn

GCN_ORDERS = {
    "unfused": ({"XW1": "lnm", "H1": "inl", "XW2": "lcn", "Y": "icl"}, ()),
    "partial": (
        {"XW1": "nlm", "H1": "nli", "XW2": "cln", "Y": "cli"},
        (("H1", "A", (1, 0)), ("Y", "A", (1, 0))),
    ),
    "full": ({"XW1": "lnm", "H1": "iln", "XW2": "lnc", "Y": "lci"}, (("Y", "A", (1, 0)),)),
}


@pytest.fixture(scope="module")
def cora() -> tuple:  # type: ignore[type-arg]
    w = gcn("cora")
    return w, reference(w.program)["Y"]


def _schedule(w, cut: str) -> Schedule:  # type: ignore[no-untyped-def]
    orders, storage = GCN_ORDERS[cut]
    regions = {
        "unfused": tuple((s.out,) for s in w.program.statements),
        "partial": w.layers,
        "full": (tuple(s.out for s in w.program.statements),),
    }[cut]
    return Schedule(cut, regions, tuple((k, tuple(v)) for k, v in orders.items()), storage)


def test_gcn_cora_cuts_match_reference_and_trends(cora) -> None:  # type: ignore[no-untyped-def]
    w, expected = cora
    results = {cut: simulate(w.program, _schedule(w, cut)) for cut in GCN_ORDERS}
    for r in results.values():
        np.testing.assert_allclose(r.outputs["Y"], expected, rtol=1e-9, atol=1e-12)
    assert results["partial"].cycles < results["unfused"].cycles < results["full"].cycles
    assert results["full"].flops > 2 * results["unfused"].flops


def test_parallel_factor_divides_cycles(cora) -> None:  # type: ignore[no-untyped-def]
    w, _ = cora
    s = _schedule(w, "partial")
    base = simulate(w.program, s, Machine(memory=None)).cycles
    four = simulate(w.program, dataclasses.replace(s, par=(0, 4)), Machine(memory=None)).cycles
    assert 3.5 < base / four <= 4.0


def test_bigbird_full_fusion_is_fastest_and_exact() -> None:
    w = bigbird(tokens=128, block=16)
    expected = reference(w.program)["O"]
    orders = {
        "S": ("I", "ii", "J", "jj", "d"),
        "Mx": ("I", "ii", "J", "jj"),
        "E": ("I", "ii", "J", "jj"),
        "Z": ("I", "ii", "J", "jj"),
        "P": ("I", "ii", "J", "jj"),
        "O": ("I", "ii", "J", "jj", "d"),
    }
    names = tuple(orders)
    full = Schedule("full", (names,), tuple(orders.items()), (("S", "M", (0, 2, 1, 3)),))
    unfused = Schedule(
        "unfused", tuple((n,) for n in names), tuple(orders.items()), (("S", "M", (0, 2, 1, 3)),)
    )
    rf, ru = simulate(w.program, full), simulate(w.program, unfused)
    for r in (rf, ru):
        np.testing.assert_allclose(r.outputs["O"], expected, rtol=1e-9, atol=1e-12)
    assert rf.cycles < ru.cycles / 1.5
    # with FIFOs too small to hold a softmax row, the fused score stream is replayed instead
    small = simulate(w.program, full, Machine(fifo_depth=16))
    assert small.flops > rf.flops and small.cycles > rf.cycles


def test_autoencoder_and_illegal_orders() -> None:
    w = autoencoder(features=64, hidden=16)
    expected = reference(w.program)["Y"]
    s = Schedule("full", (("H", "Y"),), (("H", ("b", "h", "f")), ("Y", ("b", "h", "g"))))
    np.testing.assert_allclose(simulate(w.program, s).outputs["Y"], expected, rtol=1e-9)
    bad = Schedule("unfused", (("H",), ("Y",)), (("H", ("f", "b", "h")), ("Y", ("b", "h", "g"))))
    with pytest.raises(ValueError, match="order of X level 1"):
        simulate(w.program, bad)
    unfusable = Schedule("full", (("H", "Y"),), (("H", ("b", "f", "h")), ("Y", ("h", "b", "g"))))
    with pytest.raises(ValueError, match="order of H"):
        simulate(w.program, unfusable)
