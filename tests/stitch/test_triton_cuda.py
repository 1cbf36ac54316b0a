"""The stitched Triton kernels compiled on CUDA against the interpreter reference, per group and
through the runner. Skipped without a CUDA device (tests/conftest.py).

The kernels must be compiled, not interpreted: tests/stitch/test_triton_codegen.py sets
``TRITON_INTERPRET=1`` for its whole process, so when it runs in the same session these tests
skip; run this file on its own (``pytest -m gpu tests/stitch/test_triton_cuda.py``, or
``make test-gpu``).
"""

import os

import pytest
import torch

from fusekit.hw import detect
from fusekit.ir import capture
from fusekit.stitch.runner import Stitched, reference_group
from fusekit.stitch.search import plan
from fusekit.stitch.workloads import NAMES, load_workload

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def compiled_kernels():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("Triton's interpreter is on in this process; run this file on its own")


@pytest.mark.parametrize("name", NAMES)
def test_groups_match_reference(name):
    from fusekit.stitch.codegen.triton import TritonKernel

    w = load_workload(name, small=True)
    cap = capture(w.module, w.args)
    p = plan(cap.graph, detect())
    env = {k: v.to("cuda") for k, v in cap.values(*w.args).items()}
    for group in p.groups:
        want = reference_group(p.graph, group.ops, env)
        if group.layout is not None:
            got = TritonKernel(p.graph, group.layout)(env)
            for k, v in want.items():
                torch.testing.assert_close(got[k], v, rtol=1e-4, atol=1e-4)  # fp32, tree sums
        env.update(want)


@pytest.mark.parametrize("name", NAMES)
def test_runner_equals_eager(name):
    w = load_workload(name, small=True)
    module = w.module.to("cuda")
    args = tuple(a.to("cuda") if isinstance(a, torch.Tensor) else a for a in w.args)
    stitched = Stitched(module, detect(), backend="triton")
    with torch.no_grad():
        got, want = stitched(*args), module(*args)
    for g, e in zip(
        got if isinstance(got, tuple) else (got,),
        want if isinstance(want, tuple) else (want,),
        strict=True,
    ):
        assert g.device.type == "cuda"
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)


def test_the_torch_compile_backend_trains_on_cuda():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.GELU(), torch.nn.Linear(64, 8)
    ).cuda()
    x = torch.randn(16, 32, device="cuda")
    torch._dynamo.reset()
    loss = torch.compile(model, backend="fusekit")(x).square().mean()
    loss.backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    want = model(x).square().mean()
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    for g, p in zip(got, model.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-5)


class _Rotary(torch.nn.Module):
    """Positions made in the forward (``arange`` on the input's device) as HF's rotary makes them.

    The cast of the positions is a group of its own, fed by the ``arange`` alone.
    """

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", torch.rand(16, 1))

    def forward(self, x):
        pos = torch.arange(x.shape[1], device=x.device)
        return x * (self.inv_freq @ pos.float()[None, :]).t().cos()


def test_positions_made_in_the_forward_stay_on_the_gpu():
    # the whole-model failure: arange lost its device in capture, so the cast of the positions
    # was a Triton group fed only CPU tensors
    model = _Rotary().cuda()
    x = torch.randn(4, 96, 16, device="cuda")
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend="fusekit")(x)
    assert got.device.type == "cuda"
    torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
