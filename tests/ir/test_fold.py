"""Constant folding: small values computed from params alone become params."""

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fusekit.ir.capture import capture_graph
from fusekit.ir.fold import constant_ops, fold_constants
from fusekit.ir.interpret import interpret


def _lerp_like(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # AdamW's lerp weight: computed from a literal alone, then read per element
    w = torch.full((), 0.1)
    w = torch.where(w.abs() >= 0.5, w - 1, w)
    big = torch.arange(64 * 128, dtype=torch.float32).reshape(64, 128) * 2.0  # too large
    return x + w * (y - x) + big[: x.shape[0], : x.shape[1]] * 0.0


def test_small_constant_ops_become_params_with_their_values() -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
    cap = capture_graph(make_fx(_lerp_like)(x, y), [x, y])
    folded_ops = constant_ops(cap.graph)
    assert folded_ops  # the full, abs, ge, sub and where
    assert all(cap.graph.tensor(n).numel() <= 4096 for n in folded_ops)
    folded = fold_constants(cap)
    names = {op.name for op in folded.graph.ops}
    assert not names & set(folded_ops)
    new = set(folded.graph.params) - set(cap.graph.params)
    assert new and new <= set(folded_ops) and all(folded.constants[p].dim() == 0 for p in new)
    # the arange of 8192 elements stays an op: a param that large would be read every call
    assert any(cap.graph.tensor(op.name).numel() > 4096 for op in folded.graph.ops)
    want = interpret(cap.graph, cap.values(x, y))
    got = interpret(folded.graph, folded.values(x, y))
    for name in cap.graph.outputs:
        torch.testing.assert_close(got[name], want[name])


def test_random_draws_and_returned_values_are_not_folded() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        noise = torch.rand(())  # a fresh draw every call
        return x * noise, torch.full((3,), 2.0) * 3.0  # returned: a fresh tensor every call

    x = torch.randn(5)
    cap = capture_graph(make_fx(fn)(x), [x])
    folded = constant_ops(cap.graph)
    returned = set(cap.graph.outputs)
    assert not returned & set(folded)
    opaque = [op.name for op in cap.graph.ops if "rand" in str(op.expr)]
    assert opaque and not set(opaque) & set(folded)
