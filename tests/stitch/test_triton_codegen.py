"""The Triton backend (stitch/codegen/triton.py) against the interpreter reference, per group, on
the CPU under Triton's interpreter (small shapes: the interpreter is slow). The compiled kernels
on CUDA: tests/stitch/test_triton_cuda.py."""

import math
import os

# Before triton is imported: triton.jit reads it when the generated modules define kernels.
os.environ["TRITON_INTERPRET"] = "1"

import pytest

pytest.importorskip("triton")  # the gpu extra

import torch

from fusekit.hw import detect
from fusekit.ir import capture
from fusekit.stitch.codegen import approx
from fusekit.stitch.codegen import triton as backend
from fusekit.stitch.codegen.triton import TritonKernel
from fusekit.stitch.runner import Stitched, reference_group
from fusekit.stitch.schemes import Scheme, Unfusable, online_pairs, online_softmax
from fusekit.stitch.search import plan
from fusekit.stitch.workloads import load_workload


@pytest.fixture(scope="module")
def target():
    return detect()


def _kernels(module, args, target, device="cpu", tol=(1e-5, 1e-6), equal_nan=True):
    """Run every stitched group of ``module`` under the interpreter against the reference."""
    cap = capture(module, args)
    p = plan(cap.graph, target)
    env = {k: v.to(device) for k, v in cap.values(*args).items()}
    kernels = []
    for group in p.groups:
        want = reference_group(p.graph, group.ops, env)
        if group.layout is not None:
            kernel = TritonKernel(p.graph, group.layout)
            got = kernel(env)
            for k, v in want.items():
                torch.testing.assert_close(got[k], v, rtol=tol[0], atol=tol[1], equal_nan=equal_nan)
            kernels.append(kernel)
        env.update(want)
    return kernels


def _check_groups(name, target, device="cpu"):
    w = load_workload(name, small=True)
    kernels = _kernels(w.module, w.args, target, device, (1e-4, 1e-4), False)  # fp32, tree sums
    return {k.layout.scheme for k in kernels}


@pytest.mark.parametrize(
    ("name", "scheme"),
    [
        ("bias_gelu", Scheme.LOCAL),
        ("layernorm_fwd", Scheme.REGIONAL),
        ("sibling_reductions", Scheme.GLOBAL),
        ("layernorm_bwd", Scheme.GLOBAL),
    ],
)
def test_groups_match_reference(name, scheme, target):
    assert scheme in _check_groups(name, target)


@pytest.mark.parametrize("name", ["masked_softmax", "row_reduce_wide"])
def test_column_blocks_recompute_earlier_stages(name, target, monkeypatch):
    # rows longer than a block: each stage sweeps column blocks, earlier values are recomputed
    monkeypatch.setattr(backend, "MAX_BLOCK_Q", 8)
    _check_groups(name, target)


def test_column_reduction_needs_a_row_in_registers(target, monkeypatch):
    monkeypatch.setattr(backend, "MAX_BLOCK_Q", 8)
    w = load_workload("sibling_reductions", small=True)
    cap = capture(w.module, w.args)
    (group,) = plan(cap.graph, target).groups
    with pytest.raises(Unfusable, match="column reductions"):
        TritonKernel(cap.graph, group.layout)


def test_runner_with_triton_backend(target):
    w = load_workload("bias_dropout_res_ln", small=True)
    stitched = Stitched(w.module, target, backend="triton")
    with torch.no_grad():
        torch.testing.assert_close(stitched(*w.args), w.module(*w.args), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("power", [2.0, 3.0, 1.5, -0.5, 0.0])
def test_pow_matches_torch_for_every_sign_and_exponent(power, target):
    class Pow(torch.nn.Module):
        def forward(self, x):
            return (x.pow(power) + 1.0).sum(-1)

    x = torch.tensor([[-2.0, -1.0, 0.0, 0.5, 3.0, 1e-3, -0.25, 7.0]] * 4)
    cap = capture(Pow(), (x,))
    p = plan(cap.graph, target)
    env = dict(cap.values(x))
    for group in p.groups:
        want = reference_group(p.graph, group.ops, env)
        if group.layout is not None:
            got = TritonKernel(p.graph, group.layout)(env)
            for k, v in want.items():
                torch.testing.assert_close(got[k], v, rtol=1e-5, atol=1e-6, equal_nan=True)
        env.update(want)


def test_a_rotary_cat_group_matches_reference(target):
    # the cat's piece table (an int32 param) and -q2 recomputed at the cat's indices
    class Rotary(torch.nn.Module):
        def forward(self, q, cos, sin):
            q1, q2 = q[..., :8], q[..., 8:]
            return q * cos + torch.cat((-q2, q1), dim=-1) * sin

    args = (torch.randn(2, 3, 4, 16), torch.randn(4, 16), torch.randn(4, 16))
    cap = capture(Rotary(), args)
    p = plan(cap.graph, target)
    env = dict(cap.values(*args))
    for group in p.groups:
        want = reference_group(p.graph, group.ops, env)
        if group.layout is not None and any(not p.graph.op(o).is_layout for o in group.ops):
            got = TritonKernel(p.graph, group.layout)(env)
            for k, v in want.items():
                torch.testing.assert_close(got[k], v, rtol=1e-5, atol=1e-5)
        env.update(want)


class _Softmax(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x * 0.5, -1)


class _LogSumExp(torch.nn.Module):
    def forward(self, x):  # as the decompositions write it
        m = x.amax(-1, keepdim=True)
        return (x - m).exp().sum(-1).log() + m.squeeze(-1)


def _rows(n=40):
    x = torch.randn(4, n) * 4
    x[1, : n // 2] = float("-inf")  # masked blocks before the first finite value
    x[2, 3::5] = float("-inf")  # scattered mask
    x[3] = float("-inf")  # a row of -inf only: softmax is NaN, as eager
    return x


@pytest.mark.parametrize("module", [_Softmax(), _LogSumExp()], ids=["softmax", "logsumexp"])
def test_long_rows_sweep_max_and_sum_together(module, target, monkeypatch):
    # rows longer than a block: the row sum of exp(x - max) is swept with the max (online
    # max/sum), so a softmax reads its row twice, not three times
    monkeypatch.setattr(backend, "MAX_BLOCK_Q", 8)
    x = _rows()
    if isinstance(module, _LogSumExp):
        x = x[:3]  # eager's -inf row gives NaN here, the online sum -inf; both are documented
    (kernel,) = _kernels(module, (x,), target)
    assert len(kernel.layout.online) == 1 and "tl.exp(acc_" in kernel.source  # swept online
    sweeps = kernel.source.count("for q0 in range")
    assert sweeps == (2 if isinstance(module, _Softmax) else 1), kernel.source


def test_online_pairs_need_the_max_of_the_same_values(target, monkeypatch):
    class Other(torch.nn.Module):
        def forward(self, x):  # exp(2x - max x): the max is not the exponent's, no rewrite
            m = x.amax(-1, keepdim=True)
            return (x * 2.0 - m).exp().sum(-1)

    cap = capture(Other(), (torch.randn(3, 40),))
    (group,) = [g for g in plan(cap.graph, target).groups if g.layout is not None]
    assert online_pairs(group.layout) == {} and online_softmax(group.layout) is group.layout
    monkeypatch.setattr(backend, "MAX_BLOCK_Q", 8)
    (kernel,) = _kernels(Other(), (torch.randn(3, 40),), target)  # still right: two sweeps
    assert not kernel.layout.online and kernel.source.count("for q0 in range") == 2
    cap = capture(_Softmax(), (torch.randn(3, 40),))
    (group,) = [g for g in plan(cap.graph, target).groups if g.layout is not None]
    assert len(online_pairs(group.layout)) == 1
    assert len(online_softmax(group.layout).steps) < len(group.layout.steps)


def test_casts_convert_where_the_graph_casts(target):
    """An integer cast truncates before the ops that read it, and a bool cast is ``!= 0``."""

    class Casts(torch.nn.Module):
        def forward(self, x):
            t = ((x * 3.7).to(torch.int64).to(torch.float32) * 0.5 + x).sum(-1)
            b = torch.where((x * 2 - 1).to(torch.bool), x, -x) * 2
            return t, (x * 3.7).to(torch.int32) // 2 + 1, b

    x = torch.cat([torch.randn(3, 16), torch.full((1, 16), 0.5)])
    kernels = _kernels(Casts(), (x,), target)
    assert any(k.layout.ops and len(k.layout.ops) > 2 for k in kernels)


def test_a_group_whose_inputs_are_on_the_cpu_runs_its_cpu_kernel(target):
    # On a GPU, a group fed only CPU tensors (eager computes it on the CPU) cannot launch a
    # Triton kernel: it runs the kernel made by ``on_cpu`` instead. Outside the interpreter.
    from fusekit.stitch.codegen.cpu import CpuKernel

    w = load_workload("bias_gelu", small=True)
    cap = capture(w.module, w.args)
    p = plan(cap.graph, target)
    env = cap.values(*w.args)
    (group,) = [g for g in p.groups if g.layout is not None]
    want = reference_group(p.graph, group.ops, env)
    made = []

    def on_cpu():
        made.append(CpuKernel(p.graph, group.layout))
        return made[-1]

    kernel = TritonKernel(p.graph, group.layout, on_cpu=on_cpu)
    kernel(env)  # loads the module (interpreted here)
    kernel.interpreted = False  # as compiled for a GPU
    # the CPU kernel's GELU is x/2 (1 + ferf(x / sqrt 2)): x/2 times ferf's error, for |x| up
    # to where ferf clamps
    atol = 0.5 * approx.ERF_CLAMP * math.sqrt(2.0) * approx.ERF_MAX_ABS
    for _ in range(2):
        got = kernel(env)
        for k, v in want.items():
            torch.testing.assert_close(got[k], v, rtol=1e-5, atol=atol)
    assert len(made) == 1  # made once, at the first CPU call
    bare = TritonKernel(p.graph, group.layout)
    bare(env)
    bare.interpreted = False
    with pytest.raises(ValueError, match="on a GPU"):
        bare(env)
