import pytest

from fusekit.ir import Access, Bin, Call, Const, IVar, Op, Opaque, OpKind, Reduce, parse_op


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("Y[i,j] = sum_k A[i,k] * B[k,j]", OpKind.CONTRACTION),
        ("Y[i,j] = sum_k A[i,k] * B[k,j] + C[j]", OpKind.CONTRACTION),
        ("Y[i] += A[i,k] * B[k]", OpKind.CONTRACTION),
        ("Y[i,j] = exp(S[i,j] - max_j S[i,j])", OpKind.REDUCE),
        ("M[i] = max_j S[i,j]", OpKind.REDUCE),
        ("Y[i] = sum_k A[i,k] * 2", OpKind.REDUCE),  # one input: a scaled sum, not a contraction
        ("Y[i,j] = A[i,j] * B[j]", OpKind.MAP),
        ("Y[i,j] = X[i/16, i%16, j]", OpKind.MAP),
        ("Y[e,k] = X[g[e],k]", OpKind.GATHER),
        ("Y[d[e],m] += X[e,m]", OpKind.SCATTER),
        ("Y[d[e],m] += X[g[e],k] * W[s[e],k,m]", OpKind.SCATTER),
        ("Y = opaque aten.cumsum.default(X, 1)", OpKind.OPAQUE),
    ],
)
def test_kind_is_derived_from_the_expression(text, kind):
    assert parse_op(text).kind is kind


def test_layout_ops_are_maps_without_arithmetic():
    assert parse_op("Y[i,j] = X[j,i]").is_layout
    assert parse_op("Y[i,j] = X[i*4 + j]").is_layout
    assert not parse_op("Y[i,j] = relu(X[i,j])").is_layout
    assert not parse_op("Y[e,k] = X[g[e],k]").is_layout


def test_inputs_list_index_tensors_in_first_read_order():
    op = parse_op("Y[d[e],m] += X[g[e],k] * W[s[e],k,m]")
    assert op.inputs == ("d", "X", "g", "W", "s")
    assert op.summed_vars == {"k"}


def test_extents_come_from_the_output_then_from_direct_reads():
    op = parse_op("Y[i,j] = sum_k A[i,k] * B[k,j]")
    shapes = {"Y": (4, 3), "A": (4, 5), "B": (5, 3)}
    assert op.extents(shapes) == {"i": 4, "j": 3, "k": 5}
    # a read of a prefix (a slice from 0) is allowed for output variables
    assert parse_op("Y[i] = X[i]").extents({"Y": (3,), "X": (8,)}) == {"i": 3}
    # symbolic sizes pass through
    assert op.extents({"Y": ("N", 3), "A": ("N", "K"), "B": ("K", 3)})["k"] == "K"


def test_extents_errors_name_the_index():
    op = parse_op("Y[i,j] = sum_k A[i,k] * B[k,j]")
    with pytest.raises(ValueError, match="index k"):
        op.extents({"Y": (4, 3), "A": (4, 5), "B": (6, 3)})
    with pytest.raises(ValueError, match="index i"):
        parse_op("Y[i] = X[i]").extents({"Y": (8,), "X": (3,)})
    with pytest.raises(ValueError, match="indexed by 3 terms"):
        op.extents({"Y": (4, 3), "A": (4, 5, 1), "B": (5, 3)})
    with pytest.raises(ValueError, match="index e"):
        parse_op("Y[i] += X[i*2 + e]").extents({"Y": (4,), "X": (8,)})


def test_ops_validate_their_structure():
    with pytest.raises(ValueError, match="'right side'"):
        Op(Access("Y", (IVar("i"),)), Access("X", (IVar("i"), IVar("j"))))
    with pytest.raises(ValueError, match="distinct index variables"):
        Op(Access("Y", (IVar("i"), IVar("i"))), Access("X", (IVar("i"),)))
    with pytest.raises(ValueError, match="its own output"):
        Op(Access("Y", (IVar("i"),)), Bin("+", Access("Y", (IVar("i"),)), Const(1)))
    with pytest.raises(ValueError, match="opaque"):
        Op(Access("Y", (IVar("i"),)), Opaque("aten.cumsum.default"))
    with pytest.raises(ValueError, match="called with 1 args"):
        Call("exp", (Const(1), Const(2)))
    with pytest.raises(ValueError, match="'function'"):
        Call("softmax", (Const(1),))
    with pytest.raises(ValueError, match="reduction vars"):
        Reduce("sum", ("k", "k"), Const(1))
    with pytest.raises(ValueError, match="index variable"):
        IVar("k_1")


def test_origin_is_not_part_of_equality():
    a = Op(Access("Y"), Const(1), origin="aten.ones.default (model.py:3)")
    b = Op(Access("Y"), Const(1))
    assert a == b and str(a) == "Y = 1"
