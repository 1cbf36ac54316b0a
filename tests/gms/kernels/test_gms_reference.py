import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fusekit.gms.kernels.reference import gms_aten, gms_reference


def brute_force(x, w, g, s, d, n_out, c, reduce):
    """One pair at a time, in Python: the definition itself."""
    m = w.shape[2]
    rows = [[] for _ in range(n_out)]
    for e in range(len(g)):
        value = x[g[e]] @ w[s[e]]
        rows[d[e]].append(value * (1 if c is None else c[e]))
    out = torch.zeros(n_out, m, dtype=x.dtype)
    for i, values in enumerate(rows):
        if values:
            stacked = torch.stack(values)
            out[i] = {"sum": stacked.sum(0), "mean": stacked.mean(0), "max": stacked.max(0).values}[
                reduce
            ]
    return out


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_reference_is_the_definition(data, draw_case):
    case = draw_case(data, dtype=torch.float64)
    expected = brute_force(
        case.x, case.w, case.gather, case.segment, case.scatter, case.n_out, case.scale, case.reduce
    )
    torch.testing.assert_close(case.reference(), expected)


@pytest.mark.parametrize("grouped", [True, False])
def test_aten_composition_equals_reference(grouped):
    gen = torch.Generator().manual_seed(0)
    g = torch.randint(0, 30, (200,), generator=gen)
    s = torch.randint(0, 5, (200,), generator=gen)
    d = torch.randint(0, 25, (200,), generator=gen)
    c = torch.rand(200, generator=gen)
    x, w = torch.randn(30, 16, generator=gen), torch.randn(5, 16, 8, generator=gen)
    order = torch.argsort(s, stable=True)
    ends = torch.cumsum(torch.bincount(s, minlength=5), 0).to(torch.int32)
    y = gms_aten(x, w, g[order], d[order], ends, 25, c[order], grouped=grouped)
    torch.testing.assert_close(y, gms_reference(x, w, g, s, d, 25, c), atol=1e-4, rtol=1e-5)
