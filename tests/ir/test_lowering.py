"""Each ATen op the capture lowers, checked by interpreting its IR against eager PyTorch."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fusekit.ir import OpKind, capture


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


IDX = torch.tensor([2, 0, 2, 3, 1])
CASES = {
    # elementwise and broadcasting
    "add_alpha": (lambda a, b: torch.add(a, b, alpha=0.5), (x(2, 3, 4), x(4, seed=1))),
    "sub_scalar": (lambda a: a - 1.5, (x(3, 4),)),
    "rsub": (lambda a: 2 - a, (x(3, 4),)),
    "mul_div": (lambda a, b: a * b / (b.abs() + 1), (x(3, 1), x(1, 4, seed=1))),
    "floor_div": (lambda a: torch.div(a, 0.7, rounding_mode="floor"), (x(5),)),
    "unary": (
        lambda a: (
            a.exp()
            + a.abs().log()
            + a.tanh()
            + a.sigmoid()
            + a.relu()
            + a.abs().sqrt()
            + a.abs().add(1).rsqrt()
            + a.neg()
            + a.sin()
            + torch.erf(a)
            + a.reciprocal()
        ),
        (x(4, 5),),
    ),
    "gelu_silu": (lambda a: F.gelu(a) + F.gelu(a, approximate="tanh") + F.silu(a), (x(6),)),
    "pow_clamp": (lambda a: a.pow(2) + a.clamp(-0.5, 0.5) + a.clamp(min=0.1), (x(6),)),
    "where_masked_fill": (
        lambda a, b: torch.where(a > 0, a, b).masked_fill(b < 0, float("-inf")),
        (x(3, 4), x(3, 4, seed=1)),
    ),
    "maximum_compare": (lambda a, b: torch.maximum(a, b) + (a >= b).float(), (x(4), x(4, seed=1))),
    "fills": (
        lambda a: torch.zeros_like(a) + torch.ones(3, 4) + torch.full((4,), 2.5) + a.new_ones(3, 1),
        (x(3, 4),),
    ),
    "cast": (lambda a: (a * 10).to(torch.int64).float() + a.double().float(), (x(5),)),
    "dropout_eval": (lambda a: F.dropout(a, 0.3, training=False) + 1, (x(5),)),
    # reductions and composites
    "sum_mean_keepdim": (
        lambda a: a.sum(1, keepdim=True) + a.mean((0, 2), keepdim=True) + a.sum(),
        (x(2, 3, 4),),
    ),
    "max_min_values": (lambda a: a.max(-1).values.sum() + a.amin(0) + a.max(), (x(3, 4),)),
    "prod": (lambda a: a.prod(1), (x(3, 4),)),
    "var_std": (
        lambda a: a.var(1) + a.std(0, keepdim=True).sum() + torch.var(a, 1, correction=0),
        (x(3, 5),),
    ),
    "var_mean": (
        lambda a: (
            sum(torch.var_mean(a, -1, keepdim=True, correction=0))
            + sum(torch.var_mean(a, (0, 2))).sum()
            + torch.var_mean(a)[0]
        ),
        (x(2, 3, 5),),
    ),
    "softmax_dims": (lambda a: torch.softmax(a, 0) + torch.log_softmax(a, -1), (x(3, 4),)),
    "layer_norm": (
        lambda a, w, b: F.layer_norm(a, (4,), w, b) + F.layer_norm(a, (3, 4)),
        (x(2, 3, 4), x(4, seed=1), x(4, seed=2)),
    ),
    "rms_norm": (
        lambda a, w: F.rms_norm(a, (4,), w, eps=1e-6) + F.rms_norm(a, (4,)),
        (x(3, 4), x(4)),
    ),
    # layout
    "view_reshape": (lambda a: a.view(6, 4).reshape(2, 12).flatten() + 0, (x(2, 3, 4),)),
    "unflatten_squeeze": (
        lambda a: a.unflatten(1, (2, 6)).unsqueeze(0).squeeze(0).reshape(3, 2, 2, 3).sum(),
        (x(3, 12),),
    ),
    "permute_transpose_t": (
        lambda a: a.permute(2, 0, 1).transpose(0, 2).sum(1) + a.sum(0).t().t(),
        (x(2, 3, 4),),
    ),
    "expand": (lambda a: a.expand(3, 4, 5) * 1, (x(4, 1),)),
    "slice_select_narrow": (
        lambda a: a[:, 1:5:2] + a[:, -2:] + a.select(1, 3)[:, None] + a.narrow(1, 2, 2),
        (x(3, 6),),
    ),
    "split_chunk_unbind": (
        lambda a: sum(a.split(2, -1)[1:]) + a.chunk(3, -1)[0] + a.unbind(0)[1][:2],
        (x(2, 6),),
    ),
    "repeat": (lambda a: a.repeat(2, 1, 3), (x(2, 3),)),
    "cat_rotary_halves": (
        lambda q: q * 0.5 + torch.cat((-q[..., 4:], q[..., :4]), dim=-1) * 2.0,
        (x(2, 3, 8),),
    ),
    "cat_unequal_pieces_and_dim_0": (
        lambda a, b: torch.cat((a, b * 2, a[:1]), dim=0).sum(0) + torch.cat((a, b), 1)[:, 2:7],
        (x(2, 5), x(2, 5, seed=1)),
    ),
    "slice_scatter": (
        lambda a, b: (
            torch.slice_scatter(a * 2, b + 1, dim=1, start=2, end=5) * 3
            + torch.slice_scatter(a, b, dim=1, start=3)  # aligned: a block of the split dim
        ),
        (x(2, 6, 3), x(2, 3, 3, seed=1)),
    ),
    "cat_with_an_empty_1d_tensor": (
        lambda a: torch.cat((torch.empty(0), a * 3), dim=1),  # legacy: the empty one is skipped
        (x(2, 5),),
    ),
    # contractions
    "linear": (nn.Linear(4, 3), (x(2, 5, 4),)),
    "linear_nobias_1d": (lambda a, w: F.linear(a, w), (x(4), x(3, 4))),
    "matmul_broadcast": (lambda a, b: a @ b, (x(2, 1, 3, 4), x(5, 4, 2))),
    "matmul_vectors": (lambda a, v: (a @ v) + (v @ a.t()).sum() + v @ v, (x(3, 4), x(4))),
    "mm_bmm": (
        lambda a, b: torch.bmm(a, b).sum(0) + torch.mm(a[0], b[0]),
        (x(2, 3, 4), x(2, 4, 5)),
    ),
    "addmm_baddbmm": (
        lambda c, a, b: (
            torch.addmm(c, a, b, beta=0.5, alpha=2.0) + torch.baddbmm(c, a[None], b[None])
        ),
        (x(3, 5), x(3, 4), x(4, 5)),
    ),
    "einsum": (
        lambda a, b: torch.einsum("bij,bjk->bik", a, b) + torch.einsum("bij->j", a).sum(),
        (x(2, 3, 4), x(2, 4, 5)),
    ),
    "sdpa": (
        lambda q, k, v: (
            F.scaled_dot_product_attention(q, k, v)
            + F.scaled_dot_product_attention(q, k, v, is_causal=True)
        ),
        (x(2, 2, 5, 4), x(2, 2, 5, 4, seed=1), x(2, 2, 5, 3, seed=2)),
    ),
    "sdpa_masks": (
        lambda q, k, v, m: (
            F.scaled_dot_product_attention(q, k, v, attn_mask=m > 0, scale=0.3)
            + F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        ),
        (x(2, 5, 4), x(2, 6, 4, seed=1), x(2, 6, 3, seed=2), x(5, 6, seed=3).abs() + 0.1),
    ),
    # gathers and scatters
    "embedding": (nn.Embedding(7, 3), (torch.tensor([[1, 6], [0, 1]]),)),
    "index_select": (lambda a, i: a.index_select(1, i) + 0, (x(3, 4), IDX[:4].clamp(max=3))),
    "gather": (
        lambda a, i: torch.gather(a, 1, i),
        (x(3, 4), torch.tensor([[0, 3], [1, 1], [2, 0]]).repeat(1, 2)),
    ),
    "advanced_index": (lambda a, i: a[i] + a[:, i[:4]].sum(), (x(5, 4), IDX)),
    "index_add": (
        lambda a, i, s: a.index_add(0, i, s, alpha=2.0) + torch.zeros(5, 3).index_add_(0, i, s),
        (x(5, 3), IDX, x(5, 3, seed=1)),
    ),
    "scatter_add": (
        lambda a, i, s: a.scatter_add(0, i, s),
        (x(4, 3), torch.tensor([[0, 1, 3], [3, 3, 0]]), x(2, 3, seed=1)),
    ),
    "index_put_accumulate": (
        lambda a, i, s: a.index_put((i,), s, accumulate=True),
        (x(4, 3), IDX.clamp(max=3), x(5, 3, seed=1)),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_lowered_op_matches_eager(name):
    fn, args = CASES[name]
    module = (fn if isinstance(fn, nn.Module) else Fn(fn)).eval()
    captured = capture(module, args)
    kinds = {op.kind for op in captured.graph.ops}
    assert OpKind.OPAQUE not in kinds, [
        str(op) for op in captured.graph.ops if op.kind is OpKind.OPAQUE
    ]
    with torch.no_grad():
        expected = module(*args)
    (got,) = captured.run(*args)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_layer_norm_splits_into_mean_centre_variance_and_scale():
    captured = capture(nn.LayerNorm(4).eval(), (x(3, 4),))
    assert [str(op) for op in captured.graph.ops] == [
        "layer_norm_mean[i] = mean_j input[i,j]",
        "layer_norm_cent[i,j] = input[i,j] - layer_norm_mean[i]",
        "layer_norm_var[i] = mean_j layer_norm_cent[i,j] * layer_norm_cent[i,j]",
        "layer_norm[i,j] = layer_norm_cent[i,j] * rsqrt(layer_norm_var[i] + 1e-05) * p_weight[j] "
        "+ p_bias[j]",
    ]


def test_softmax_splits_into_max_exp_sum_divide():
    captured = capture(Fn(lambda a: torch.softmax(a, -1)), (x(2, 3),))
    assert [str(op) for op in captured.graph.ops] == [
        "softmax_max[i] = max_j args_0[i,j]",
        "softmax_exp[i,j] = exp(args_0[i,j] - softmax_max[i])",
        "softmax_sum[i] = sum_j softmax_exp[i,j]",
        "softmax[i,j] = softmax_exp[i,j] / softmax_sum[i]",
    ]
    assert [op.kind.value for op in captured.graph.ops] == ["reduce", "map", "reduce", "map"]


def test_reshape_is_an_affine_layout_map():
    captured = capture(Fn(lambda a: a.view(2, 3, 4).transpose(0, 1).reshape(3, 8)), (x(6, 4),))
    assert [str(op) for op in captured.graph.ops] == [
        "view[i,j,k] = args_0[i*3 + j,k]",
        "transpose[i,j,k] = view[j,i,k]",
        "reshape[i,j] = transpose[i,j/4,j%4]",
    ]
    assert all(op.is_layout for op in captured.graph.ops)


def test_gather_and_scatter_ops_read_and_write_indirectly():
    captured = capture(
        Fn(lambda a, i, s: torch.zeros(5, 3).index_add_(0, i, s) + a.index_select(0, i)[:5]),
        (x(5, 3), IDX, x(5, 3, seed=1)),
    )
    texts = {op.kind.value: str(op) for op in captured.graph.ops}
    assert texts["scatter"] == "index_add[args_1[i],j] += args_2[i,j]"
    assert texts["gather"] == "index_select[i,j] = args_0[args_1[i],j]"


def test_sdpa_splits_into_scores_softmax_and_values():
    q, k, v = x(1, 3, 4), x(1, 3, 4, seed=1), x(1, 3, 4, seed=2)
    captured = capture(Fn(lambda q, k, v: F.scaled_dot_product_attention(q, k, v)), (q, k, v))
    first = str(captured.graph.ops[0])
    scale = 1 / math.sqrt(4)
    name = "scaled_dot_product_attention_scores"
    assert first == f"{name}[i,j,k] = sum_l args_0[i,j,l] * args_1[i,k,l] * {scale!r}"
    assert str(captured.graph.ops[-1]).startswith("scaled_dot_product_attention[i,j,k] = sum_l")


def test_bitwise_and_or_of_integers_are_not_logical():
    """``y & 5`` on int64 is a bitwise and; the IR's ``and``/``or`` are logical, so integer
    operands run by their ATen call while bool ones (masks) stay maps."""
    y = torch.arange(-8, 8).reshape(4, 4)
    and_, or_ = torch.bitwise_and, torch.bitwise_or
    module = Fn(lambda y: and_(y, 5) + or_(y, 2) + and_(y > 0, y < 5) + or_(y > 3, y < -5))
    captured = capture(module, (y,))
    opaque = {op.expr.target for op in captured.graph.ops if op.kind is OpKind.OPAQUE}
    assert opaque == {"aten.bitwise_and.Scalar", "aten.bitwise_or.Scalar"}, opaque
    (got,) = captured.run(y)
    assert torch.equal(got, module(y))
