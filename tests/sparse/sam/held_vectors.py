"""SAM's primitive unit-test vectors beyond the shared 22, written out from the upstream tests.

The shared oracle (``shared/oracles/sam/vectors.json``) holds 22 of SAM's 93 vectors; these are
the others, as facts (input and expected streams) read from the unit tests of weiya711/sam at
commit 6e477d14 (``sam/sim/test/primitives/``), in the oracle's record format. Streams that the
upstream tests build from a formula over a parameter are expanded here.
"""

from __future__ import annotations

from typing import Any

Record = dict[str, Any]


def _rec(
    primitive: str,
    source: str,
    params: dict[str, Any],
    inputs: dict[str, list[Any]],
    expected: dict[str, list[Any]],
    cycle_exact: bool = False,
) -> Record:
    return {
        "primitive": primitive,
        "source": f"sam/sim/test/primitives/{source}",
        "params": params,
        "inputs": inputs,
        "expected": expected,
        "cycle_exact": cycle_exact,
        "timing_sensitive": False,
    }


def _uncompressed() -> list[Record]:
    out = []
    for dim in (1, 2, 4, 16, 32, 100):
        cnt = list(range(dim))
        crd1 = [*cnt, "S0", "D"]
        crd2 = [*cnt, "S0"] * 3 + cnt + ["S1", "D"]
        ref2 = [x + k * dim for k in range(4) for x in [*cnt, None] if x is not None]
        ref2_tokens: list[Any] = []
        for k in range(4):
            ref2_tokens += [k * dim + x for x in cnt] + (["S0"] if k < 3 else ["S1", "D"])
        crd3 = (
            [*cnt, "S0"] * 2
            + cnt
            + ["S1"]
            + cnt
            + ["S0"]
            + cnt
            + ["S1"]
            + cnt
            + ["S0"]
            + cnt
            + ["S2", "D"]
        )
        stops3 = ["S0", "S0", "S1", "S0", "S1", "S0", "S2"]
        ref3: list[Any] = []
        for k in range(7):
            ref3 += [k * dim + x for x in cnt] + [stops3[k]]
        ref3.append("D")
        del ref2
        cases = [
            ("1d", [0, "D"], crd1, crd1),
            ("2d", [0, 1, 2, 3, "S0", "D"], crd2, ref2_tokens),
            ("3d", [0, 1, 2, "S0", 3, 4, "S0", 5, 6, "S1", "D"], crd3, ref3),
        ]
        for tag, in_ref, crd, ref in cases:
            out.append(
                _rec(
                    "uncompressed_level_scanner",
                    f"test_rd_scanner.py::test_rd_scan_u_direct_{tag}[{dim}]",
                    {"dim": dim},
                    {"in_ref": in_ref},
                    {"out_crd": crd, "out_ref": ref},
                    True,
                )
            )
    return out


def _compressed() -> list[Record]:
    out = [
        _rec(
            "compressed_level_scanner",
            "test_rd_scanner.py::test_rd_scan_c_direct_1d",
            {"seg": [0, 3], "crd": [0, 1, 3]},
            {"in_ref": [0, "D"]},
            {"out_crd": [0, 1, 3, "S0", "D"], "out_ref": [0, 1, 2, "S0", "D"]},
            True,
        )
    ]
    nd = [
        (
            [0, 2, 3, 4],
            [0, 2, 2, 2],
            [0, 1, 2, "S0", "D"],
            [0, 2, "S0", 2, "S0", 2, "S1", "D"],
            [0, 1, "S0", 2, "S0", 3, "S1", "D"],
        ),
        (
            [0, 3, 4, 6],
            [0, 2, 3, 0, 2, 3],
            [0, 0, "S0", 1, "S0", 2, "S1", "D"],
            [0, 2, 3, "S0", 0, 2, 3, "S1", 0, "S1", 2, 3, "S2", "D"],
            [0, 1, 2, "S0", 0, 1, 2, "S1", 3, "S1", 4, 5, "S2", "D"],
        ),
        ([0, 4], [0, 1, 2, 3], [0, "D"], [0, 1, 2, 3, "S0", "D"], [0, 1, 2, 3, "S0", "D"]),
        (
            [0, 1],
            [28],
            [0, "S0", "S0", 0, "S0", "D"],
            [28, "S1", "S1", 28, "S1", "D"],
            [0, "S1", "S1", 0, "S1", "D"],
        ),
        (
            [0, 1],
            [28],
            [0, "S0", "", "", "S0", "", "", 0, "", "", "S0", "", "", "D"],
            [28, "S1", "S1", 28, "S1", "D"],
            [0, "S1", "S1", 0, "S1", "D"],
        ),
    ]
    for k, (seg, crd, in_ref, ocrd, oref) in enumerate(nd):
        out.append(
            _rec(
                "compressed_level_scanner",
                f"test_rd_scanner.py::test_rd_scan_c_direct_nd[arrs{k}]",
                {"seg": seg, "crd": crd},
                {"in_ref": in_ref},
                {"out_crd": ocrd, "out_ref": oref},
            )
        )
    zero = [
        (
            [0, 2, 3, 4],
            [0, 1, 2, 3],
            [0, 1, "N", 2, "N", "S0", "D"],
            [0, 1, "S0", 2, "S0", "N", "S0", 3, "S0", "N", "S1", "D"],
            [0, 1, "S0", 2, "S0", "N", "S0", 3, "S0", "N", "S1", "D"],
        ),
        (
            [0, 3, 4, 6],
            [0, 2, 3, 0, 2, 3],
            [0, "N", 1, "N", 2, "S0", "D"],
            [0, 2, 3, "S0", "N", "S0", 0, "S0", "N", "S0", 2, 3, "S1", "D"],
            [0, 1, 2, "S0", "N", "S0", 3, "S0", "N", "S0", 4, 5, "S1", "D"],
        ),
        (
            [0, 4, 5, 5, 7, 10, 11],
            list(range(11)),
            [0, 1, "N", "N", "S0", 2, 3, "S0", "N", "N", "S0", 4, 5, "S0", "N", "N", "S1", "D"],
            [
                0,
                1,
                2,
                3,
                "S0",
                4,
                "S0",
                "N",
                "S0",
                "N",
                "S1",
                "S0",
                5,
                6,
                "S1",
                "N",
                "S0",
                "N",
                "S1",
                7,
                8,
                9,
                "S0",
                10,
                "S1",
                "N",
                "S0",
                "N",
                "S2",
                "D",
            ],
            [
                0,
                1,
                2,
                3,
                "S0",
                4,
                "S0",
                "N",
                "S0",
                "N",
                "S1",
                "S0",
                5,
                6,
                "S1",
                "N",
                "S0",
                "N",
                "S1",
                7,
                8,
                9,
                "S0",
                10,
                "S1",
                "N",
                "S0",
                "N",
                "S2",
                "D",
            ],
        ),
    ]
    for k, (seg, crd, in_ref, ocrd, oref) in enumerate(zero):
        out.append(
            _rec(
                "compressed_level_scanner",
                f"test_rd_scanner.py::test_rd_scan_direct_c_0tkn_nd[arrs{k}]",
                {"seg": seg, "crd": crd},
                {"in_ref": in_ref},
                {"out_crd": ocrd, "out_ref": oref},
                True,
            )
        )
    return out


def _joiners() -> list[Record]:
    out = [
        _rec(
            "intersect2",
            "test_intersect.py::test_intersect_direct_2d",
            {},
            {
                "in_crd1": [0, "S0", 0, 1, 2, "S1", "D"],
                "in_ref1": [0, "S0", 1, 2, 3, "S1", "D"],
                "in_crd2": [0, 1, 2, "S0", 0, 1, 2, "S1", "D"],
                "in_ref2": [0, 1, 2, "S0", 0, 1, 2, "S1", "D"],
            },
            {
                "out_crd": [0, "S0", 0, 1, 2, "S1", "D"],
                "out_ref1": [0, "S0", 1, 2, 3, "S1", "D"],
                "out_ref2": [0, "S0", 0, 1, 2, "S1", "D"],
            },
        )
    ]
    crd2 = [0, 2, 4, 15, 17, 25, 31, 32, 50, 63]
    for n in (4, 16, 32, 64):
        gold = [x for x in crd2 if x < n]
        out.append(
            _rec(
                "intersect2",
                f"test_intersect.py::test_intersect_1d[{n}]",
                {},
                {
                    "in_crd1": [*range(n), "S0", "D"],
                    "in_ref1": [*range(n), "S0", "D"],
                    "in_crd2": [*crd2, "S0", "D"],
                    "in_ref2": [*range(10), "S0", "D"],
                },
                {
                    "out_crd": [*gold, "S0", "D"],
                    "out_ref1": [*gold, "S0", "D"],
                    "out_ref2": [*range(len(gold)), "S0", "D"],
                },
            )
        )
    unions = [
        (
            [0, 1, 3, 5, "S0", "D"],
            [0, 2, 3, 4, "S0", "D"],
            [0, 1, 2, 3, "S0", "D"],
            [0, 1, 2, 3, "S0", "D"],
            [0, 1, 2, 3, 4, 5, "S0", "D"],
            [0, 1, "N", 2, "N", 3, "S0", "D"],
            [0, "N", 1, 2, 3, "N", "S0", "D"],
        ),
        (
            [0, 1, "S0", 2, 3, "S0", "S0", 4, 5, "S1", "D"],
            [1, 2, 3, "S0", "S0", 0, 1, 2, "S0", "S1", "D"],
            [0, 1, "S0", 2, 3, "S0", "S0", 4, 5, "S1", "D"],
            [0, 1, 2, "S0", "S0", 2, 3, 4, "S0", "S1", "D"],
            [0, 1, 2, 3, "S0", 2, 3, "S0", 0, 1, 2, "S0", 4, 5, "S1", "D"],
            [0, 1, "N", "N", "S0", 2, 3, "S0", "N", "N", "N", "S0", 4, 5, "S1", "D"],
            ["N", 0, 1, 2, "S0", "N", "N", "S0", 2, 3, 4, "S0", "N", "N", "S1", "D"],
        ),
    ]
    for k, (c1, c2, r1, r2, gc, g1, g2) in enumerate(unions):
        out.append(
            _rec(
                "union2",
                f"test_union.py::test_union_direct_nd[arrs{k}]",
                {},
                {"in_crd1": c1, "in_ref1": r1, "in_crd2": c2, "in_ref2": r2},
                {"out_crd": gc, "out_ref1": g1, "out_ref2": g2},
            )
        )
    return out


def _values() -> list[Record]:
    out = [
        _rec(
            "reduce",
            "test_reduce.py::test_reduce_direct_nd[arrs0]",
            {},
            {"in_val": [5, 5, "S0", 5, "S0", 4, 8, "S0", 4, 3, "S0", 4, 3, "S1", "D"]},
            {"out_val": [10, 5, 12, 7, 7, "S0", "D"]},
        ),
        _rec(
            "reduce",
            "test_reduce.py::test_reduce_direct_nd[arrs1]",
            {},
            {"in_val": [1, 2, 3, 4, 5, 6, 7, 8, 9, "S2", "D"]},
            {"out_val": [45, "S1", "D"]},
        ),
        _rec(
            "compressed_level_writer",
            "test_wr_scanner.py::test_comp_wr_scan_direct",
            {"size": 1001, "seg_size": 1001, "fill": 0},
            {"in_crd": [0, 2, 3, "S0", 0, 2, 3, "S1", "D"]},
            {"crd_arr": [0, 2, 3, 0, 2, 3], "seg_arr": [0, 3, 6]},
        ),
    ]
    arrays = [
        ([0, 1, "N", 2, "N", 3, "S0", "D"], [1, 2, 3, 4], [1, 2, 0, 3, 0, 4, "S0", "D"]),
        ([0, "N", 1, 2, 3, "N", "S0", "D"], [1, 2, 3, 4], [1, 0, 2, 3, 4, 0, "S0", "D"]),
        (
            [0, 1, "S0", 2, 3, "S0", "N", "S0", 4, 5, "S1", "D"],
            [1, 2, 3, 4, 5, 6],
            [1, 2, "S0", 3, 4, "S0", 0, "S0", 5, 6, "S1", "D"],
        ),
        (
            [0, 1, 2, "S0", "N", "S0", 2, 3, "N", 4, "N", "S0", "N", "S1", "D"],
            [1, 2, 3, 4, 5],
            [1, 2, 3, "S0", 0, "S0", 3, 4, 0, 5, 0, "S0", 0, "S1", "D"],
        ),
        (
            [0, 1, "N", "N", "S0", 2, 3, "S0", "N", "N", "N", "S0", 4, 5, "S1", "D"],
            [1, 2, 3, 4, 5, 6],
            [1, 2, 0, 0, "S0", 3, 4, "S0", 0, 0, 0, "S0", 5, 6, "S1", "D"],
        ),
        (
            ["N", 0, 1, 2, "S0", "N", "N", "S0", 2, 3, 4, "S0", "N", "N", "S1", "D"],
            [1, 2, 3, 4, 5],
            [0, 1, 2, 3, "S0", 0, 0, "S0", 3, 4, 5, "S0", 0, 0, "S1", "D"],
        ),
    ]
    for k, (ref, arr, gold) in enumerate(arrays):
        out.append(
            _rec(
                "array_read",
                f"test_array.py::test_arr_load_direct_0tkn[arrs{k}]",
                {"arr": arr},
                {"in_ref": ref},
                {"out_val": gold},
                True,
            )
        )
    for n in (4, 16, 32, 64):
        in1, in2 = [*range(n), "S0", "D"], [*(2 * x for x in range(n)), "S0", "D"]
        for neg1 in (True, False):
            for neg2 in (True, False):
                s1, s2 = (-1 if neg1 else 1), (-1 if neg2 else 1)
                gold = [s1 * x + s2 * 2 * x for x in range(n)]
                out.append(
                    _rec(
                        "add2",
                        f"test_compute.py::test_add_1d[{neg2}-{neg1}-{n}]",
                        {"neg1": neg1, "neg2": neg2},
                        {"in1": in1, "in2": in2},
                        {"out_val": [*gold, "S0", "D"]},
                    )
                )
        out.append(
            _rec(
                "multiply2",
                f"test_compute.py::test_mul_1d[{n}]",
                {},
                {"in1": in1, "in2": in2},
                {"out_val": [*(2 * x * x for x in range(n)), "S0", "D"]},
            )
        )
    return out


def _managers() -> list[Record]:
    out = []
    drops = [
        ([0, 1, "S0", "D"], [1, "S0", "S1", "D"], [0, "S0", "D"]),
        ([0, 1, "S0", "D"], [1, "S0", 1, "S1", "D"], [0, 1, "S0", "D"]),
        ([0, 1, 2, 3, "S0", "D"], [1, "S0", 1, "S0", "S0", 1, "S1", "D"], [0, 1, 3, "S0", "D"]),
        (["S0", "D"], ["S1", "D"], ["S0", "D"]),
    ]
    for k, (o, i, gold) in enumerate(drops):
        out.append(
            _rec(
                "coordinate_dropper",
                f"test_crd_drop.py::test_crd_drop_1d[arrs{k}]",
                {},
                {"in_outer_crd": o, "in_inner_crd": i},
                {"out_outer_crd": gold, "out_inner_crd": [x for x in i if x != ""]},
            )
        )
    icrd = ["", "", "", 1, "", "", "S0", "", "", "S1", "D"]
    out.append(
        _rec(
            "coordinate_dropper",
            "test_crd_drop.py::test_crd_drop_emptystr_1d[arrs0]",
            {},
            {"in_outer_crd": ["", 0, 1, "", "", "S0", "D", "", "", "", ""], "in_inner_crd": icrd},
            {"out_outer_crd": [0, "S0", "D"], "out_inner_crd": [x for x in icrd if x != ""]},
        )
    )
    holds = [
        (
            [0, 1, 2, "S0", "D"],
            [0, 2, "S0", 2, "S0", 2, "S1", "D"],
            [0, 0, "S0", 1, "S0", 2, "S1", "D"],
        ),
        (
            [0, 1, 2, 5, "S0", "D"],
            [1, 2, 5, "S0", 2, "S0", 2, "S0", 2, 3, 4, 5, "S1", "D"],
            [0, 0, 0, "S0", 1, "S0", 2, "S0", 5, 5, 5, 5, "S1", "D"],
        ),
        (
            [0, 2, "S0", 3, "S0", 4, "S1", "D"],
            [0, 2, 3, "S0", 0, 2, 3, "S1", 0, "S1", 2, 3, "S2", "D"],
            [0, 0, 0, "S0", 2, 2, 2, "S1", 3, "S1", 4, 4, "S2", "D"],
        ),
    ]
    for k, (o, i, gold) in enumerate(holds):
        out.append(
            _rec(
                "coordinate_holder",
                f"test_crd_hold.py::test_crd_hold_nd[arrs{k}]",
                {},
                {"in_outer_crd": o, "in_inner_crd": i},
                {"out_outer_crd": gold},
            )
        )
    return out


def held_vectors() -> list[Record]:
    """The 71 vectors of SAM's primitive tests that the shared oracle keeps back."""
    return _uncompressed() + _compressed() + _joiners() + _values() + _managers()
