"""refine_dims: merged dims split so that reshapes become plain reads, same results."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fusekit.ir.expr import IBin, IConst, IVar
from fusekit.ir.interpret import interpret
from fusekit.ir.refine import Fixed, Piece, factors, pieces, refine_dims
from fusekit.ir.text import parse_graph
from fusekit.stitch.schemes import Unfusable, analyze

COLUMN_SUM = """
graph colsum
input x: float32[4,8,16]
input w: float32[16]
tensor m: float32[4,8,16]
tensor v: float32[32,16]
tensor c: float32[16]
m[b,s,h] = exp(x[b,s,h]) * w[h]
v[i,h] = m[i/8,i%8,h]
c[h] = sum_i v[i,h]
output c
"""


def _values(graph, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        n: torch.randn(tuple(int(s) for s in graph.tensor(n).shape), generator=g)
        for n in (*graph.inputs, *graph.params)
    }


def _same(a, b):
    values = _values(a)
    want, got = interpret(a, values), interpret(b, values)
    assert list(got) == list(want)
    for name in want:
        assert got[name].shape == want[name].shape
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-5)


def test_pieces_of_reshape_terms():
    ext = {"i": 32, "b": 4, "s": 8}
    i = IVar("i")
    assert pieces(IBin("/", i, IConst(8)), 4, ext) == [Piece("i", 8, 32)]
    assert pieces(IBin("%", i, IConst(8)), 8, ext) == [Piece("i", 1, 8)]
    flat = IBin("+", IBin("*", IVar("b"), IConst(8)), IVar("s"))
    assert pieces(flat, 32, ext) == [Piece("b", 1, 4), Piece("s", 1, 8)]
    assert pieces(IBin("%", IBin("/", i, IConst(2)), IConst(4)), 4, ext) == [Piece("i", 2, 8)]
    assert pieces(IBin("+", i, IConst(3)), 35, ext) is None  # an offset inside a digit
    assert pieces(IBin("+", i, IConst(32)), 64, ext) == [Fixed(1, 2), Piece("i", 1, 32)]
    assert pieces(IBin("*", i, IConst(2)), 64, ext) is None  # a step
    assert pieces(IBin("/", i, IConst(3)), 10, ext) is None  # not a divisor


def test_factors_from_breakpoints():
    assert factors(32, [8]) == (4, 8)
    assert factors(64, [4, 16]) == (4, 4, 4)
    assert factors(7, []) == (7,)


def test_a_column_sum_over_a_merged_dim_becomes_one_kernel():
    graph = parse_graph(COLUMN_SUM)
    with pytest.raises(Unfusable, match="computed index"):
        analyze(graph, [op.name for op in graph.ops])
    refined = refine_dims(graph)
    assert "v" not in refined.shapes  # a plain copy once split: its readers read m
    assert str(refined.op("c")) == "c[h] = sum_{i0,i1} m[i0,i1,h]"  # the copy is read through
    layout = analyze(refined, [op.name for op in refined.ops])
    assert layout.extents == (4, 8, 16)
    _same(graph, refined)


def test_inputs_and_outputs_keep_their_names_and_shapes():
    graph = parse_graph(
        """
        graph bridged
        input x: float32[32,16]
        tensor a: float32[32,16]
        tensor v: float32[4,8,16]
        tensor r: float32[4,8]
        a[i,h] = x[i,h] * 2.0
        v[b,s,h] = a[b*8 + s,h]
        r[b,s] = sum_h v[b,s,h]
        output a, r
        """
    )
    refined = refine_dims(graph)
    assert refined.inputs == graph.inputs and refined.outputs == graph.outputs
    assert refined.tensor("x").shape == (32, 16)  # an input is read at affine indices
    assert refined.tensor("a").shape == (32, 16)  # returned: a view of the split tensor
    assert refined.tensor("a_split").shape == (4, 8, 16)
    analyze(refined, ["a_split", "r"])  # the row sum and its producer share a kernel
    _same(graph, refined)


def test_incompatible_factorisations_leave_the_reshape_as_it_was():
    graph = parse_graph(
        """
        graph clash
        input x: float32[12]
        tensor a: float32[12]
        tensor p: float32[3,4]
        tensor q: float32[2,6]
        tensor s: float32[3]
        tensor t: float32[2]
        a[i] = x[i] * 2.0
        p[u,v] = a[u*4 + v]
        q[u,v] = a[u*6 + v]
        s[u] = sum_v p[u,v]
        t[u] = sum_v q[u,v]
        output s, t
        """
    )
    refined = refine_dims(graph)
    # 12 = 3 x 4 and 12 = 2 x 6 have no common refinement: one reshape splits a, the other is
    # refused and keeps reading at computed indices
    shape = refined.tensor("a").shape
    assert shape in ((3, 4), (2, 6))
    kept, refused = ("p", "q") if shape == (3, 4) else ("q", "p")
    assert kept not in refined.shapes  # a plain copy of a once split: its reader reads a
    assert "/" in str(refined.op(refused))
    _same(graph, refined)


def test_a_graph_without_reshapes_is_returned_unchanged():
    graph = parse_graph(
        """
        graph plain
        input x: float32[4,8]
        tensor y: float32[4,8]
        y[i,j] = x[i,j] + 1.0
        output y
        """
    )
    assert refine_dims(graph) is graph


@settings(max_examples=25, deadline=None)
@given(
    b=st.sampled_from([1, 2, 3, 4]),
    s=st.sampled_from([2, 4, 6]),
    h=st.sampled_from([1, 4, 5]),
    keep=st.booleans(),
)
def test_split_merge_chains_compute_what_the_graph_computes(b, s, h, keep):
    graph = parse_graph(
        f"""
        graph chain
        input x: float32[{b},{s},{h}]
        tensor m: float32[{b},{s},{h}]
        tensor v: float32[{b * s},{h}]
        tensor e: float32[{b * s},{h}]
        tensor u: float32[{b},{s * h}]
        tensor r: float32[{b}]
        tensor c: float32[{h}]
        m[i,j,k] = x[i,j,k] * 3.0
        v[i,k] = m[i/{s},i%{s},k]
        e[i,k] = v[i,k] + 1.0
        u[i,j] = e[i*{s} + j/{h},j%{h}]
        r[i] = sum_j u[i,j]
        c[k] = sum_i e[i,k]
        output r, c{", e" if keep else ""}
        """
    )
    _same(graph, refine_dims(graph))


def test_aligned_slices_of_a_split_dim_read_a_constant_digit():
    # a rotary backward: the halves of a computed tensor, -x1 written into the second half
    graph = parse_graph(
        """
        graph halves
        input x: float32[4,64]
        input w: float32[4,64]
        tensor m: float32[4,64]
        tensor lo: float32[4,32]
        tensor hi: float32[4,32]
        tensor y: float32[4,64]
        m[i,j] = x[i,j] * 2.0
        lo[i,j] = m[i,j]
        hi[i,j] = m[i,j + 32]
        y[i,j] = m[i,j] + hi[i,j%32] * lo[i,j%32] + w[i,j]
        output y
        """
    )
    refined = refine_dims(graph)
    assert refined.tensor("m").shape == (4, 2, 32)
    assert "m[i,1,j]" in str(refined.op("hi"))
    analyze(refined, ["m", "lo", "hi", "y_split" if "y_split" in refined.shapes else "y"])
    _same(graph, refined)
