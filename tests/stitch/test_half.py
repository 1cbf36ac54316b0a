"""16-bit floats (float16, bfloat16) in stitched kernels: stored as they are, computed in float32.

The CPU kernels carry them as their bits (numba has neither type) and convert in the kernel; the
conversions must be torch's, bit for bit. Values are rounded where they are stored and where the
graph casts to a 16-bit float, as Inductor does, so a stitched model is at least as close to
the exact result as eager.
"""

import os

# Before triton is imported (as test_triton_codegen.py does): the Triton cases run under its
# interpreter.
os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch

import fusekit.stitch.dynamo  # noqa: F401  (registers the backend)
from fusekit.hw import CPUTarget, detect
from fusekit.stitch.codegen.cpu import CpuKernel
from fusekit.stitch.runner import Stitched

HALVES = [torch.float16, torch.bfloat16]


@pytest.fixture(scope="module")
def target() -> CPUTarget:
    return detect()


class Widen(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float() * 1.0


class Narrow(torch.nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 1.0).to(self.dtype)


def _same(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Bitwise equal, or both NaN."""
    bits = got.view(torch.int16 if got.element_size() == 2 else torch.int32)
    ref = want.view(torch.int16 if want.element_size() == 2 else torch.int32)
    return (bits == ref) | (got.isnan() & want.isnan())


def _one_cpu_kernel(stitched: Stitched, *args: torch.Tensor) -> None:
    _, planned = stitched.prepare(*args)
    assert [type(k) for k in planned.kernels] == [CpuKernel]


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_every_16_bit_pattern_widens_as_torch_does(dtype: torch.dtype, target: CPUTarget) -> None:
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype).reshape(256, 256)
    stitched = Stitched(Widen(), target)
    _one_cpu_kernel(stitched, x)
    assert _same(stitched(x), x.float()).all()


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_float32_rounds_to_16_bits_as_torch_does(dtype: torch.dtype, target: CPUTarget) -> None:
    g = torch.Generator().manual_seed(0)
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype).float()
    halfway = (every[1:] + every[:-1]) / 2  # ties: to even
    x = torch.cat([
        every, halfway[halfway.isfinite()],
        torch.randn(1 << 14, generator=g) * 1e3, torch.randn(1 << 14, generator=g) * 1e-6,
        torch.randint(-(1 << 31), 1 << 31, (1 << 14,), generator=g, dtype=torch.int64)
        .to(torch.int32).view(torch.float32),  # any bit pattern: NaN payloads, subnormals
        torch.tensor([65504.0, 65519.99, 65520.0, 1e9, -1e9, float("inf"), -float("inf"),
                      float("nan"), 2**-25, 2**-24, 3 * 2**-26, 2**-149]),
    ])  # fmt: skip
    x = torch.cat([x, torch.zeros(-x.numel() % 256)]).reshape(-1, 256)
    stitched = Stitched(Narrow(dtype), target)
    _one_cpu_kernel(stitched, x)
    got = stitched(x)
    assert got.dtype is dtype
    assert _same(got, x.to(dtype)).all()


class Block(torch.nn.Module):
    """Residual add, RMSNorm (computed in float32 and cast back, as Llama's), softmax, GELU."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(256).to(dtype))

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = x + r
        var = h.float().pow(2).mean(-1, keepdim=True)
        norm = self.w * (h.float() * torch.rsqrt(var + 1e-6)).to(h.dtype)
        return norm, torch.softmax(h, -1), torch.nn.functional.gelu(h).sum(-1)


def _errors(outs: tuple[torch.Tensor, ...], exact: tuple[torch.Tensor, ...]) -> list[float]:
    """Each output's largest error relative to the exact value (near zero: to 0.01)."""
    pairs = zip(outs, exact, strict=True)
    return [((o.double() - e).abs() / (e.abs() + 1e-2)).max().item() for o, e in pairs]


def check_block(dtype: torch.dtype, backend: str, target: CPUTarget) -> None:
    """Stitched (``backend``) is within one ulp of eager's distance to the exact result."""
    g = torch.Generator().manual_seed(0)
    module = Block(dtype)
    args = (torch.randn(8, 256, generator=g).to(dtype), torch.randn(8, 256, generator=g).to(dtype))
    with torch.no_grad():
        exact = module.double()(*(a.double() for a in args))
        module = module.to(dtype)
        eager = module(*args)
        got = Stitched(module, target, backend=backend)(*args)
    assert [o.dtype for o in got] == [o.dtype for o in eager]
    ulp = torch.finfo(dtype).eps
    for ours, theirs in zip(_errors(got, exact), _errors(eager, exact), strict=True):
        assert ours <= theirs + ulp


@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize("backend", ["cpu", "triton"])
def test_a_16_bit_block_is_as_close_to_exact_as_eager(
    dtype: torch.dtype, backend: str, target: CPUTarget
) -> None:
    if backend == "triton":
        pytest.importorskip("triton")  # the gpu extra
    check_block(dtype, backend, target)


@pytest.mark.parametrize(
    ("autocast", "dtype"),
    [
        pytest.param(False, torch.float16, id="cast-float16"),
        pytest.param(True, torch.bfloat16, id="autocast-bfloat16"),
        # the other two pairs compile the same kernels' other dtype: 20-30 s each, cold
        pytest.param(False, torch.bfloat16, id="cast-bfloat16", marks=pytest.mark.slow),
        pytest.param(True, torch.float16, id="autocast-float16", marks=pytest.mark.slow),
    ],
)
def test_torch_compile_trains_in_16_bits(dtype: torch.dtype, autocast: bool) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64), torch.nn.Linear(64, 10)
    )
    if not autocast:
        model = model.to(dtype)
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    x = x if autocast else x.to(dtype)

    def step(m: torch.nn.Module) -> tuple[torch.Tensor, list[torch.Tensor]]:
        m.zero_grad()
        with torch.autocast("cpu", dtype=dtype, enabled=autocast):
            loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        return loss.detach().float(), [p.grad.float() for p in m.parameters()]  # type: ignore[union-attr]

    want_loss, want_grads = step(model)
    got_loss, got_grads = step(torch.compile(model, backend="fusekit"))
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(got_loss, want_loss, rtol=4 * eps, atol=4 * eps)
    for got, want in zip(got_grads, want_grads, strict=True):
        assert got.dtype is want.dtype
        assert ((got - want).abs().max() / want.abs().max()).item() <= 4 * eps
