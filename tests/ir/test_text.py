import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusekit.ir import (
    Access,
    Bin,
    Call,
    Const,
    IBin,
    IConst,
    IVar,
    Op,
    ParseError,
    Reduce,
    format_expr,
    format_graph,
    format_op,
    parse_expr,
    parse_graph,
    parse_op,
)

CANONICAL = [
    "Y[i,j] = sum_k A[i,k] * B[k,j]",
    "Y[i,j] = exp(S[i,j] - max_j S[i,j])",
    "Y[d[e],m] += X[g[e],k] * W[s[e],k,m]",
    "Y[i,j] = X[i/16,i%16,j]",
    "Y[i,j,k] = X[i*16 + j,k]",
    "Y[i] = X[(i + 1)*2 - 3]",
    "Y = opaque aten.topk.default(X, 4, dim=-1, sorted=True)[1]",
    "Y = opaque aten.cumsum.default(X, 1, dtype=torch.float64)",
    "Y = opaque aten.pad.default(X, [1, 2], 'constant', None)",
    "Y[i,j] = -(sum_k A[i,k]) * 2",
    "Y[i] = -(2)",
    "Y[i] = --2",
    "Y[i] = a[i] - -2.0 * -inf",
    "Y[i,j] = sum_{k,l} (A[i,k] + B[k,l]) * C[l,j]",
    "Y[i*16 + j] += X[i,j]",
    "Y = sum_i max_j X[i,j]",
    "Y[i] = where(gt(X[i], 0), X[i], 1e-05 * X[i])",
    "Y[i] = A[i] - (B[i] - C[i])",
    "Y[i] = A[i] / (B[i] * C[i])",
    "Y[i] = (sum_j X[i,j]) / 64",
    "Y[i] = mean_j X[i,j] + prod_j X[i,j]",
    "Y[i] = X[n[]]",
    "Y = s + 1",
]


@pytest.mark.parametrize("text", CANONICAL)
def test_canonical_text_prints_back_unchanged(text):
    op = parse_op(text)
    assert format_op(op) == text
    assert parse_op(format_op(op)) == op


def test_reduction_binds_the_following_product():
    assert parse_expr("sum_k A[k] * B[k] + C") == Bin(
        "+",
        Reduce("sum", ("k",), Bin("*", Access("A", (IVar("k"),)), Access("B", (IVar("k"),)))),
        Access("C"),
    )
    assert parse_expr("-2 * x") == Bin("*", Const(-2), Access("x"))
    assert parse_expr("-(2)") == Call("neg", (Const(2),))


def test_whitespace_and_comments_are_ignored():
    assert parse_op("  Y [ i , j ]=A[i,j]   # a copy") == parse_op("Y[i,j] = A[i,j]")


@pytest.mark.parametrize(
    ("text", "message", "column"),
    [
        ("Y[i,j] = A[i,,j]", "expected an index variable", 14),
        ("Y[i,j] = foo(A[i,j])", "unknown function 'foo'", 10),
        ("Y[i,j] = A[i,j", "expected ',' or ']'", 15),
        ("Y[i,j] = exp(A[i,j], 2)", "called with 1 args", 10),
        ("Y[i] = sum_k", "expected a tensor", 13),
        ("Y[i,j] = A[i] $ 2", "unexpected character '\\$'", 15),
        ("Y[i] = X[i,j]", "free only in the left's variables", 6),
        ("Y[i] X[i]", "expected '=' or '\\+='", 6),
        ("Y[i] = X[i] )", "expected end of text", 13),
        ("Y[i] = X[1.5]", "integer index", 10),
        ("Y[i] = sum_k_1 X[i]", "index variable", 8),
        ("Y = opaque aten.foo.default(x=1, X)", "keyword argument", 34),
    ],
)
def test_malformed_text_fails_with_the_column(text, message, column):
    with pytest.raises(ParseError, match=f"{message}.* at column {column}:") as info:
        parse_op(text)
    assert info.value.position == column - 1


GRAPH = """\
graph mlp
input x: float32[B,64]
param w: float32[64,32]
param adj: float32[6,6] {dense,compressed} nnz=7
param csc: float32[6,6] {dense,compressed}(1,0) segments=[1,2,3]
tensor y: float32[B,32]
y[i,j] = sum_k x[i,k] * w[k,j]
tensor z: float32[B,32]
z[i,j] = relu(y[i,j])
output z
"""


def test_graph_text_round_trips():
    graph = parse_graph(GRAPH)
    assert format_graph(graph) == GRAPH
    assert parse_graph(format_graph(graph)) == graph
    assert graph.tensor("adj").stats.nnz == 7
    assert graph.tensor("csc").format.order == (1, 0)


def test_graph_text_errors_give_line_and_column():
    bad = GRAPH.replace("tensor z: float32[B,32]", "tensor z: float32[B,32")
    with pytest.raises(ParseError, match="at column 23 of line 8"):
        parse_graph(bad)
    bad = GRAPH.replace("{dense,compressed} nnz=7", "{dense,sparse}")
    with pytest.raises(ParseError, match="line 4"):
        parse_graph(bad)


# -- property: every expression the printer writes parses back to itself ----------------------
VARS = st.sampled_from(["i", "j", "k"])
TENSORS = st.sampled_from(["A", "B", "g"])
consts = st.one_of(
    st.integers(-5, 5).map(Const),
    st.floats(allow_nan=False, width=32).map(Const),
)
index_terms = st.recursive(
    st.one_of(VARS.map(IVar), st.integers(-3, 9).map(IConst)),
    lambda sub: st.one_of(
        st.builds(IBin, st.sampled_from(["+", "-", "*", "/", "%"]), sub, sub),
        st.builds(lambda t, idx: Access(t, (idx,)), TENSORS, sub),
    ),
    max_leaves=4,
)
accesses = st.builds(
    lambda t, idx: Access(t, tuple(idx)), TENSORS, st.lists(index_terms, max_size=3)
)
exprs = st.recursive(
    st.one_of(consts, accesses),
    lambda sub: st.one_of(
        st.builds(Bin, st.sampled_from(["+", "-", "*", "/"]), sub, sub),
        st.builds(lambda f, a: Call(f, (a,)), st.sampled_from(["exp", "neg", "relu"]), sub),
        st.builds(lambda a, b: Call("max", (a, b)), sub, sub),
        st.builds(
            lambda op, vs, body: Reduce(op, tuple(dict.fromkeys(vs)), body),
            st.sampled_from(["sum", "max", "mean"]),
            st.lists(VARS, min_size=1, max_size=2),
            sub,
        ),
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(exprs)
def test_printed_expressions_parse_back_equal(expr):
    assert parse_expr(format_expr(expr)) == expr


@settings(max_examples=100, deadline=None)
@given(exprs)
def test_printed_scatter_ops_parse_back_equal(expr):
    op = Op(Access("Y", (Access("d", (IVar("i"),)), IVar("j"))), expr, accumulate=True)
    assert parse_op(format_op(op)) == op
