"""Every named strategy and its autograd on CUDA (the Triton backend) against the reference on the
CPU. Skipped without a CUDA device (tests/conftest.py).

The Triton kernels must be compiled, not interpreted: the interpreted kernel tests
(tests/gms/kernels/test_triton_*.py) set ``TRITON_INTERPRET=1`` for their whole process, so when
they run in the same session these tests skip; run this file on its own
(``pytest tests/gms/test_gms_cuda.py``). The Triton kernels take float32, bfloat16 and float16,
not float64, so gradients are compared in float32 against float64 reference autograd.
"""

import pytest
import torch

from fusekit.gms import NAMED_STRATEGIES, Dataflow, GMSProblem, gms, plan
from fusekit.gms.backends import backend_for
from fusekit.gms.kernels.reference import gms_reference

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
CASES = [(s, r) for s in NAMED_STRATEGIES for r in ("sum", "mean", "max") if s.order.allows(r)]
#: Relative error allowed against the output's magnitude (sum of |terms|): float32 is a few
#: ulps of K-long sums; bfloat16 rounds operands, intermediates (aggregated or transformed rows)
#: and the output to 8 bits.
REL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}


@pytest.fixture(autouse=True)
def compiled_kernels():
    # Imported here, not at the top: importing the kernels before the interpreted test files
    # set TRITON_INTERPRET would make those run compiled (and fail on the CPU).
    from fusekit.gms.kernels.triton.gms_seg import INTERPRETED

    if INTERPRETED:
        pytest.skip("Triton's interpreter is on in this process; run this file on its own")


def problem(reduce, seed, e=240, n_in=50, n_out=40, segments=5, k=37, m=45):
    gen = torch.Generator().manual_seed(seed)
    g = torch.randint(0, n_in, (e,), generator=gen)
    s = torch.randint(0, segments, (e,), generator=gen)
    s[s == 1] = 0  # an empty segment
    d = torch.randint(0, n_out - 1, (e,), generator=gen)  # the last output row gets nothing
    pl = plan(
        GMSProblem.create(g, s, d, n_out, num_segments=segments, reduce=reduce),
        tile_rows=16,
        blocks=4,
    )
    x = torch.randn(n_in + 1, k, generator=gen)  # a row no pair gathers
    w = torch.randn(segments + 1, k, m, generator=gen)  # a weight no pair uses
    c = torch.rand(e, generator=gen) + 0.5
    return (g, s, d, n_out), pl, x, w, c


def reference(indices, x, w, c, reduce):
    g, s, d, n_out = indices
    f64 = torch.float64
    return gms_reference(
        x.to(f64), w.to(f64), g, s, d, n_out, None if c is None else c.to(f64), reduce
    )


@pytest.mark.parametrize("module", ["gms_seg", "gm_seg_s", "g_ms_seg", "g_mseg_s"])
def test_cuda_runs_the_triton_kernels(module):
    dev = torch.device(DEVICE)
    table = backend_for(dev)
    dataflow = next(d for d in Dataflow if d.module == module)
    assert table.dataflows[dataflow].__name__ == f"{module}_triton"
    for stem in ["gather_rows", "reduce_rows", "segment_products", "segment_outer", "pair_dot"]:
        assert getattr(table, stem).__name__ == f"{stem}_triton"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("strategy", "reduce"), CASES, ids=str)
def test_every_strategy_equals_the_reference(strategy, reduce, dtype):
    indices, pl, x, w, c = problem(reduce, seed=0)
    x, w, c = x.to(dtype), w.to(dtype), c.to(dtype)
    pl_dev = pl.to(DEVICE)
    for scale in (None, c):
        y = gms(
            x.to(DEVICE),
            w.to(DEVICE),
            pl_dev,
            None if scale is None else scale.to(DEVICE),
            strategy,
        )
        assert y.device.type == "cuda" and y.dtype == dtype and y.shape == (40, w.shape[2])
        want = reference(indices, x, w, scale, reduce)
        magnitude = reference(
            indices,
            x.abs(),
            w.abs(),
            None if scale is None else scale.abs(),
            "mean" if reduce == "mean" else "sum",
        )
        atol = REL[dtype] * float(magnitude.max())
        torch.testing.assert_close(y.cpu().double(), want, rtol=0, atol=atol)
        assert torch.equal(y[-1].cpu(), torch.zeros(w.shape[2], dtype=dtype))


@pytest.mark.parametrize(("strategy", "reduce"), CASES, ids=str)
def test_gradients_equal_the_reference_autograd(strategy, reduce):
    # float32 on the GPU against float64 autograd of the reference (fewer pairs and columns
    # for max, so that no two candidates of an output element lie within float32 round-off).
    sizes = {"e": 120, "m": 16} if reduce == "max" else {}
    indices, pl, x, w, c = problem(reduce, seed=1, **sizes)
    dy = torch.randn(indices[3], w.shape[2], generator=torch.Generator().manual_seed(2))
    ref = [t.double().requires_grad_() for t in (x, w, c)]
    g, s, d, n_out = indices
    gms_reference(*ref[:2], g, s, d, n_out, ref[2], reduce).backward(dy.double())
    dev = [t.to(DEVICE).requires_grad_() for t in (x, w, c)]
    gms(dev[0], dev[1], pl.to(DEVICE), dev[2], strategy).backward(dy.to(DEVICE))
    for name, got, want in zip(("x", "w", "scale"), dev, ref, strict=True):
        assert got.grad.dtype == torch.float32, name
        expected = want.grad
        atol = 1e-4 * float(expected.abs().max())
        torch.testing.assert_close(
            got.grad.cpu().double(), expected, rtol=1e-4, atol=atol, msg=name
        )
    assert torch.all(dev[0].grad[-1] == 0) and torch.all(dev[1].grad[1] == 0)
    assert torch.all(dev[1].grad[-1] == 0)
