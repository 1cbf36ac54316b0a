"""GEMM epilogues: the bias add split off for the planner, put back when it stays alone."""

import torch

from fusekit.hw import detect
from fusekit.ir import capture
from fusekit.ir.op import OpKind
from fusekit.stitch.alone import AtenContraction
from fusekit.stitch.codegen.cpu import CpuKernel
from fusekit.stitch.epilogue import merged_addend, split_epilogues
from fusekit.stitch.runner import Stitched


class LinearGelu(torch.nn.Module):
    def __init__(self, gelu: bool) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(32, 48)
        self.gelu = gelu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return torch.nn.functional.gelu(y) if self.gelu else y


def _x() -> torch.Tensor:
    return torch.randn(16, 32, generator=torch.Generator().manual_seed(0))


def test_the_addend_is_split_off_and_merges_back():
    torch.manual_seed(0)
    graph = capture(LinearGelu(True).eval(), (_x(),)).graph
    split = split_epilogues(graph)
    assert split_epilogues(split) is split  # nothing left to split
    (gemm,) = [op for op in split.ops if op.kind is OpKind.CONTRACTION]
    (add,) = split.consumers(gemm.name)
    assert gemm.name.endswith("_mm") and add.kind is not OpKind.CONTRACTION
    assert add.name in {op.name for op in graph.ops}  # the add keeps the linear's name
    merged = merged_addend(split, gemm.name, add.name)
    assert merged is not None and merged == graph.op(add.name)
    assert merged_addend(split, gemm.name, next(iter(split.consumers(add.name))).name) is None


def test_the_bias_add_is_stitched_into_its_consumer():
    torch.manual_seed(0)
    model = LinearGelu(True).eval()
    stitched = Stitched(model, detect())
    _, planned = stitched.prepare(_x())
    with torch.no_grad():
        torch.testing.assert_close(stitched(_x()), model(_x()), rtol=1e-5, atol=1e-6)
    (kernel,) = [k for k in planned.kernels if isinstance(k, CpuKernel)]
    written = {name for name, *_ in kernel._outs}
    assert {op.name for op in planned.graph.ops if op.kind is OpKind.CONTRACTION} == {"linear_mm"}
    assert written == {"gelu"}  # the bias add runs inside GELU's kernel, never written


def test_a_bias_add_left_alone_runs_as_one_aten_call():
    torch.manual_seed(0)
    model = LinearGelu(False).eval()
    stitched = Stitched(model, detect())
    _, planned = stitched.prepare(_x())
    with torch.no_grad():
        torch.testing.assert_close(stitched(_x()), model(_x()), rtol=1e-5, atol=1e-6)
    (kernel,) = planned.kernels
    assert isinstance(kernel, AtenContraction) and kernel.bias is not None


class LinearHeads(torch.nn.Module):
    """A query projection split into heads, as attention does before its BMM."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(32, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.fc(x).view(4, 4, 3, 16).transpose(1, 2)  # [batch, heads, seq, dim]
        return q @ q.transpose(-1, -2)


def test_a_bias_add_before_a_head_split_stays_in_the_gemm_call():
    from fusekit.stitch.alone import LayoutViews
    from fusekit.stitch.epilogue import epilogue_gemm
    from fusekit.stitch.model import estimate, estimate_epilogue

    torch.manual_seed(0)
    model = LinearHeads().eval()
    stitched = Stitched(model, detect())
    _, planned = stitched.prepare(_x())
    graph, target = planned.graph, detect()
    (gemm,) = [op.name for op in graph.ops if op.name.endswith("_mm")]
    (add,) = [op.name for op in graph.consumers(gemm)]
    assert epilogue_gemm(graph, add) == gemm
    # alone, the add costs addmm's broadcast of the bias into Y: a pass over Y less than its
    # own kernel, which reads the product too
    inside, kernel = estimate_epilogue(graph, gemm, add, target), estimate(graph, [add], target)
    assert kernel.dram_bytes - inside.dram_bytes == 4 * 16 * 48 and inside.launches == 0
    # so the head split is not stitched to the add (a kernel writing the transposed copy)
    # but left a view of the GEMM call's output
    assert frozenset({add}) in {g.ops for g in planned.plan.groups}
    assert not [k for k in planned.kernels if isinstance(k, CpuKernel)]
    assert any(isinstance(k, LayoutViews) for k in planned.kernels)
    with torch.no_grad():
        torch.testing.assert_close(stitched(_x()), model(_x()), rtol=1e-5, atol=1e-5)
