import pytest
import torch

from fusekit.ir import interpret, parse_graph


def run(text, **values):
    return interpret(parse_graph(text), values)


def test_matmul_and_softmax_pieces():
    g = """
    input x: float32[4,6]
    input w: float32[6,3]
    tensor y: float32[4,3]
    y[i,j] = sum_k x[i,k] * w[k,j]
    tensor mx: float32[4]
    mx[i] = max_j y[i,j]
    tensor e: float32[4,3]
    e[i,j] = exp(y[i,j] - mx[i])
    tensor p: float32[4,3]
    p[i,j] = e[i,j] / sum_k e[i,k]
    output p
    """
    x, w = torch.randn(4, 6), torch.randn(6, 3)
    torch.testing.assert_close(run(g, x=x, w=w)["p"], torch.softmax(x @ w, -1))


def test_affine_layout_maps_match_view_and_permute():
    g = """
    input x: float32[4,6]
    tensor v: float32[2,2,6]
    v[i,j,k] = x[i*2 + j,k]
    tensor t: float32[6,4]
    t[i,j] = v[j/2,j%2,i]
    tensor s: float32[2,6]
    s[i,j] = x[i*2 + 1,j]
    tensor r: float32[8,6]
    r[i,j] = x[i%4,j]
    output v, t, s, r
    """
    x = torch.randn(4, 6)
    out = run(g, x=x)
    assert torch.equal(out["v"], x.view(2, 2, 6))
    assert torch.equal(out["t"], x.t())
    assert torch.equal(out["s"], x[1::2])
    assert torch.equal(out["r"], x.repeat(2, 1))


def test_gather_and_scatter_with_repeated_indices():
    g = """
    input x: float32[5,3]
    input g: int64[7]
    input d: int64[7]
    tensor rows: float32[7,3]
    rows[e,j] = x[g[e],j]
    tensor y: float32[4,3]
    y[d[e],j] += rows[e,j] * 2
    tensor c: float32[4]
    c[d[e]] += 1
    output y, c
    """
    x = torch.randn(5, 3)
    gi = torch.tensor([0, 4, 4, 1, 2, 2, 2])
    di = torch.tensor([3, 3, 0, 1, 1, 1, 2])
    out = run(g, x=x, g=gi, d=di)
    torch.testing.assert_close(out["y"], torch.zeros(4, 3).index_add_(0, di, x[gi] * 2))
    assert out["c"].tolist() == [1.0, 3.0, 1.0, 2.0]


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_sparse_operand_contraction_matches_dense(layout):
    g = """
    input a: float32[5,4] {dense,compressed}
    input b: float32[4,3]
    tensor y: float32[5,3]
    y[i,j] = sum_k a[i,k] * b[k,j]
    tensor col: float32[3]
    col[j] = sum_{i,k} a[i,k] * b[k,j]
    tensor t: float32[4,3]
    t[k,j] = sum_i a[i,k] * b[k,j]
    output y, col, t
    """
    dense = torch.randn(5, 4) * (torch.rand(5, 4) > 0.5)
    b = torch.randn(4, 3)
    sparse = dense.to_sparse(layout=layout)
    out = run(g, a=sparse, b=b)
    torch.testing.assert_close(out["y"], dense @ b)
    torch.testing.assert_close(out["col"], (dense @ b).sum(0))
    torch.testing.assert_close(out["t"], dense.sum(0)[:, None] * b)


def test_reductions_and_absent_variables():
    g = """
    input x: float32[3,4]
    tensor r: float32[3]
    r[i] = prod_j x[i,j] + min_j x[i,j] + mean_j x[i,j]
    tensor s: float32[3]
    s[i] = sum_{j,k} x[i,j] * y[k]
    input y: float32[5]
    output r, s
    """
    x, y = torch.randn(3, 4), torch.randn(5)
    out = run(g, x=x, y=y)
    torch.testing.assert_close(out["r"], x.prod(1) + x.amin(1) + x.mean(1))
    torch.testing.assert_close(out["s"], x.sum(1) * y.sum())
    # a bound variable that indexes nothing has no extent
    with pytest.raises(ValueError, match="index k"):
        run("input x: float32[3,4]\ntensor s: float32[3]\ns[i] = sum_{j,k} x[i,j]\noutput s\n", x=x)


def test_results_are_stored_in_the_declared_dtype():
    g = "input x: float32[3]\ntensor y: int64[3]\ny[i] = x[i] * 2\noutput y\n"
    out = run(g, x=torch.tensor([0.4, 1.6, -1.2]))
    assert out["y"].dtype == torch.int64 and out["y"].tolist() == [0, 3, -2]


def test_opaque_ops_call_their_aten_target():
    g = "input x: float32[3,4]\ntensor y: float32[3,4]\n"
    g += "y = opaque aten.cumsum.default(x, 1)\noutput y\n"
    x = torch.randn(3, 4)
    torch.testing.assert_close(run(g, x=x)["y"], x.cumsum(1))


def test_symbolic_sizes_bind_from_inputs():
    g = parse_graph(
        "input x: float32[N,4]\ninput w: float32[4,2]\ntensor y: float32[N,2]\n"
        "y[i,j] = sum_k x[i,k] * w[k,j]\noutput y\n"
    )
    w = torch.randn(4, 2)
    for n in (1, 7):
        x = torch.randn(n, 4)
        torch.testing.assert_close(interpret(g, {"x": x, "w": w})["y"], x @ w)
    everything = interpret(g, {"x": torch.randn(2, 4), "w": w}, keep_all=True)
    assert set(everything) == {"x", "w", "y"}


def test_bad_values_are_named():
    g = parse_graph(
        "input x: float32[N,4]\ninput z: float32[N]\ntensor y: float32[N]\n"
        "y[i] = sum_k x[i,k] + z[i]\noutput y\n"
    )
    with pytest.raises(ValueError, match="'z' to be given"):
        interpret(g, {"x": torch.randn(2, 4)})
    with pytest.raises(ValueError, match="'x' to be float32 \\(got float64\\)"):
        interpret(g, {"x": torch.randn(2, 4, dtype=torch.float64), "z": torch.randn(2)})
    with pytest.raises(ValueError, match="'x' to be of shape"):
        interpret(g, {"x": torch.randn(2, 5), "z": torch.randn(2)})
    with pytest.raises(ValueError, match="N=2"):
        interpret(g, {"x": torch.randn(2, 4), "z": torch.randn(3)})


def test_a_result_of_the_wrong_shape_is_caught():
    g = "input x: float32[4]\ntensor y: float32[3]\n"
    g += "y = opaque aten.cumsum.default(x, 0)\noutput y\n"
    with pytest.raises(ValueError, match="op y: expected 'result' to be of shape \\(3,\\)"):
        run(g, x=torch.randn(4))
