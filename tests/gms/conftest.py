"""Random g-mm-s problems for property tests, drawn with hypothesis.

Tests take the ``draw_case`` fixture and call it with ``st.data()``'s object, so that every test
module (at any depth under tests/gms) shares one generator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from hypothesis import strategies as st

from fusekit.gms import GMSPlan, GMSProblem, plan
from fusekit.gms.kernels.reference import gms_reference

#: Index patterns the acceptance names, plus plain uniform indices.
KINDS = (
    "uniform",
    "empty_segments",
    "one_huge_segment",
    "one_output_row",
    "duplicates",
    "zero_pairs",
)


@dataclass
class Case:
    kind: str
    x: torch.Tensor
    w: torch.Tensor
    gather: torch.Tensor
    segment: torch.Tensor
    scatter: torch.Tensor
    scale: torch.Tensor | None
    n_out: int
    reduce: str
    plan: GMSPlan

    def reference(self) -> torch.Tensor:
        """The reference output, computed in float64 from the (possibly rounded) operands."""
        f64 = torch.float64
        return gms_reference(
            self.x.to(f64),
            self.w.to(f64),
            self.gather,
            self.segment,
            self.scatter,
            self.n_out,
            None if self.scale is None else self.scale.to(f64),
            self.reduce,
        )

    def output_scale(self) -> float:
        """Largest sum of |terms| an output element adds up: the scale tolerances refer to."""
        f64 = torch.float64
        magnitude = gms_reference(
            self.x.to(f64).abs(),
            self.w.to(f64).abs(),
            self.gather,
            self.segment,
            self.scatter,
            self.n_out,
            None if self.scale is None else self.scale.to(f64).abs(),
            "mean" if self.reduce == "mean" else "sum",
        )
        return float(magnitude.max()) if magnitude.numel() else 0.0

    def assert_matches(self, y: torch.Tensor) -> None:
        # fp32: a few ulps of the output scale (K and the row degree are < 200 here);
        # bf16: the output is rounded to 8 bits of mantissa (inputs are the same on both sides).
        # float64: round-off only.
        rel = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float64: 1e-12}[self.x.dtype]
        assert y.dtype == self.x.dtype
        assert y.shape == (self.n_out, self.w.shape[2])
        atol = rel * self.output_scale() + 1e-30
        torch.testing.assert_close(y.to(torch.float64), self.reference(), rtol=0, atol=atol)


def _indices(data, kind: str, n_in: int, n_out: int, s: int, e: int, gen: torch.Generator):
    def rand(high: int, n: int) -> torch.Tensor:
        return torch.randint(0, high, (n,), generator=gen)

    g, seg, d = rand(n_in, e), rand(s, e), rand(n_out, e)
    if kind == "empty_segments":  # only the first and last segments hold pairs
        seg = torch.where(rand(2, e) == 0, 0, s - 1)
    elif kind == "one_huge_segment":  # nearly every pair in one segment
        seg = torch.where(rand(20, e) == 0, seg, s // 2)
    elif kind == "one_output_row":
        d = torch.full((e,), n_out - 1)
    elif kind == "duplicates":  # few distinct pairs, each repeated
        distinct = max(1, e // 6)
        pick = rand(distinct, e)
        g, seg, d = g[:distinct][pick], seg[:distinct][pick], d[:distinct][pick]
    return g, seg, d


@pytest.fixture(scope="session")
def draw_case() -> Callable[..., Case]:
    def draw(
        data,
        *,
        reduce: str | None = None,
        dtype: torch.dtype = torch.float32,
        scale: bool | None = None,
        max_pairs: int = 160,
        max_width: int = 19,
        kind: str | None = None,
    ) -> Case:
        kind = kind or data.draw(st.sampled_from(KINDS), label="kind")
        reduce = reduce or data.draw(st.sampled_from(("sum", "mean", "max")), label="reduce")
        n_in = data.draw(st.integers(1, 20), label="n_in")
        n_out = data.draw(st.integers(1, 20), label="n_out")
        s = data.draw(st.integers(1, 6), label="segments")
        e = 0 if kind == "zero_pairs" else data.draw(st.integers(1, max_pairs), label="pairs")
        k = data.draw(st.integers(1, max_width), label="K")
        m = data.draw(st.integers(1, max_width), label="M")
        with_scale = data.draw(st.booleans(), label="scale") if scale is None else scale
        gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), label="seed"))
        g, seg, d = _indices(data, kind, n_in, n_out, s, e, gen)
        problem = GMSProblem.create(g, seg, d, n_out, num_segments=s, reduce=reduce)
        built = plan(
            problem,
            tile_rows=data.draw(st.sampled_from((1, 3, 8, 64)), label="tile_rows"),
            blocks=data.draw(st.sampled_from((1, 2, 5)), label="blocks"),
            schedule=data.draw(st.sampled_from(("pad", "pack")), label="schedule"),
        )
        x = torch.randn(n_in, k, generator=gen).to(dtype)
        w = torch.randn(s, k, m, generator=gen).to(dtype)
        c = torch.rand(e, generator=gen).to(dtype) + 0.5 if with_scale else None
        return Case(kind, x, w, g, seg, d, c, n_out, reduce, built)

    return draw
