import numpy as np
import pytest
import torch

from fusekit.sparse.frontend import from_module, from_text
from fusekit.sparse.program import reference
from fusekit.sparse.search import explore
from fusekit.sparse.workloads import Workload


class TinyGCN(torch.nn.Module):
    def __init__(self, adj: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("adj", adj)
        self.l1 = torch.nn.Linear(8, 4, bias=False)
        self.l2 = torch.nn.Linear(4, 3, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(torch.sparse.mm(self.adj, self.l1(x)))
        return torch.sparse.mm(self.adj, self.l2(h))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_captured_sparse_model_simulates_exactly() -> None:
    torch.manual_seed(0)
    adj = ((torch.rand(10, 10) < 0.3).float() * torch.rand(10, 10)).to_sparse_csr()
    model, x = TinyGCN(adj).eval(), torch.randn(10, 8)
    program = from_module(model, (x,))
    assert [s.combine for s in program.statements] == ["mul", "mul", "copy", "mul", "mul"]
    expected = model(x).detach().numpy()
    np.testing.assert_allclose(reference(program)[program.outputs[0]], expected, atol=1e-5)
    layers = tuple((s.out,) for s in program.statements)
    ex = explore(Workload("tiny", program, layers), top=1)
    for p in ex.simulated:
        assert p.result is not None
        np.testing.assert_allclose(p.result.outputs[program.outputs[0]], expected, atol=1e-5)


def test_from_text_and_unsupported_ops() -> None:
    import scipy.sparse as sp

    a = sp.random(4, 4, density=0.5, random_state=0, format="csr")
    text = """graph spmm
param A: float32[4,4] {dense,compressed}
input B: float32[4,2]
tensor C: float32[4,2]
C[i,j] = relu(sum_k A[i,k] * B[k,j])
output C"""
    b = np.arange(8.0).reshape(4, 2) - 3
    p = from_text(text, {"A": a, "B": b})
    np.testing.assert_allclose(reference(p)["C"], np.maximum(a.toarray() @ b, 0))
    bad = text.replace("relu(sum_k A[i,k] * B[k,j])", "sum_k A[i,k] * B[k,j] + 1")
    with pytest.raises(ValueError, match="op C"):
        from_text(bad, {"A": a, "B": b})
