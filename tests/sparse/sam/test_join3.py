"""Joiners of three operands (SAM's ``mat_elemadd3`` builds one union of B, C and D)."""

from __future__ import annotations

import numpy as np
import pytest

from fusekit.sparse.sam import parse_gv, run


def three_way(join: str, op: str) -> str:
    """``X(i,j) = B(i,j) <op> C(i,j) <op> D(i,j)``, one ``join`` per level, in SAM's spelling."""
    lines = ["digraph SAM {", '    comment="X=ss01,B=ss01,C=ss01,D=ss01"']
    nid = iter(range(100, 200))
    ref: dict[str, int | None] = dict.fromkeys("BCD")
    for mode, var in enumerate("ij"):
        j = next(nid)
        lines.append(f'    {j} [comment="type={join},index={var}"]')
        for t in "BCD":
            s = next(nid)
            root = "true" if ref[t] is None else "false"
            lines.append(f'    {s} [comment="type=fiberlookup,index={var},tensor={t},mode={mode},'
                         f'format=compressed,src=true,root={root}"]')  # fmt: skip
            if ref[t] is not None:
                lines.append(f'    {ref[t]} -> {s} [type="ref" comment="out-{t}"]')
            lines.append(f'    {s} -> {j} [type="crd" comment="in-{t}"]')
            lines.append(f'    {s} -> {j} [type="ref" comment="in-{t}"]')
            ref[t] = j
        lines.append(f'    {j} -> {2 - mode} [type="crd"]')
        lines.append(f'    {2 - mode} [comment="type=fiberwrite,index={var},tensor=X,mode={mode},'
                     'format=compressed,sink=true"]')  # fmt: skip
    for k, t in enumerate("BCD"):
        lines.append(f'    {10 + k} [comment="type=arrayvals,tensor={t}"]')
        lines.append(f'    {ref[t]} -> {10 + k} [type="ref" comment="out-{t}"]')
    lines += [
        f'    20 [comment="type={op}"]', f'    21 [comment="type={op}"]',
        '    10 -> 20 [type="val"]', '    11 -> 20 [type="val"]',
        '    20 -> 21 [type="val"]', '    12 -> 21 [type="val"]',
        '    0 [comment="type=fiberwrite,mode=vals,tensor=X,sink=true"]',
        '    21 -> 0 [type="val"]', '}',
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("join", "op"), [("union", "add"), ("intersect", "mul")])
@pytest.mark.parametrize("density", [0.0, 0.3, 0.8])
def test_three_operands(join: str, op: str, density: float) -> None:
    rng = np.random.default_rng(int(density * 10))
    mats = {t: rng.uniform(-1, 1, (6, 7)) * (rng.random((6, 7)) < density) for t in "BCD"}
    mats["C"][2] = 0  # an empty row
    res = run(parse_gv(three_way(join, op), "three.gv"), mats, depth=2, latency=2)
    b, c, d = mats["B"], mats["C"], mats["D"]
    np.testing.assert_allclose(res.output, b + c + d if op == "add" else b * c * d)
