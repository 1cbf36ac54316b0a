"""CPU code generation: the interleave forced on groups that evaluate approximated functions."""

import pytest
import torch

from fusekit.hw import CPUTarget, detect
from fusekit.stitch.codegen.cpu import INTERLEAVE, CpuKernel, interleave_count
from fusekit.stitch.runner import Stitched, reference_group
from fusekit.stitch.workloads import MaskedSoftmax, load_workload


@pytest.fixture(scope="module")
def target() -> CPUTarget:
    return detect()


def _kernels(module: torch.nn.Module, args: tuple[torch.Tensor, ...], target: CPUTarget):  # type: ignore[no-untyped-def]
    cap, planned = Stitched(module, target).prepare(*args)
    env = dict(cap.values(*args))
    for group, kernel in zip(planned.plan.groups, planned.kernels, strict=True):
        yield planned.plan.graph, group, kernel, env
        env.update(kernel(env))


def test_interleave_only_for_approximated_functions_on_long_rows(target: CPUTarget) -> None:
    counts = {}
    for name in ("bias_gelu", "masked_softmax", "layernorm_fwd"):
        w = load_workload(name, small=True)
        for graph, _, kernel, _ in _kernels(w.module, w.args, target):
            if isinstance(kernel, CpuKernel):
                counts[name] = interleave_count(graph, kernel.layout)
    assert counts["bias_gelu"] == INTERLEAVE  # erf, rows of 160
    assert counts["masked_softmax"] == 0  # exp, but rows of 16: all in the scalar remainder
    assert counts["layernorm_fwd"] == 0  # no approximated function


def test_interleaved_softmax_matches_reference(target: CPUTarget) -> None:
    """Rows of 136: four interleaved vector iterations (32 lanes), then a remainder of 8."""
    g = torch.Generator().manual_seed(0)
    s = torch.randn(2, 3, 5, 136, generator=g)
    mask = torch.zeros(2, 1, 1, 136)
    mask[..., 100:] = -1e4
    module, args = MaskedSoftmax(0.125), (s, mask)
    seen = 0
    for graph, group, kernel, env in _kernels(module, args, target):
        if not isinstance(kernel, CpuKernel):
            continue
        assert kernel.interleave == INTERLEAVE
        assert f"-force-vector-interleave={INTERLEAVE}" in kernel.source
        for variant in (kernel, CpuKernel(graph, kernel.layout, serial=not kernel.serial)):
            got = variant(env)
            for k, v in reference_group(graph, group.ops, env).items():
                torch.testing.assert_close(got[k], v, rtol=1e-5, atol=1e-6)
        seen += 1
    assert seen == 1
    with torch.no_grad():
        torch.testing.assert_close(Stitched(module, target)(*args), module(*args))
