from collections import Counter

import pytest

from fusekit.ir import Graph, OpKind, Tensor, parse_graph, parse_op

# x -> a -> b ----> d -> e
#        \-> c --/
DIAMOND = """\
input x: float32[4]
tensor a: float32[4]
a[i] = exp(x[i])
tensor b: float32[4]
b[i] = a[i] * 2
tensor c: float32[4]
c[i] = a[i] + 1
tensor d: float32[4]
d[i] = b[i] + c[i]
tensor e: float32[]
e = sum_i d[i]
output e, b
"""


@pytest.fixture
def g():
    return parse_graph(DIAMOND)


def test_ops_given_out_of_order_are_sorted_topologically(g):
    shuffled = Graph(g.tensors, tuple(reversed(g.ops)), g.inputs, outputs=g.outputs)
    assert shuffled.topological_order() == ("a", "c", "b", "d", "e")
    assert g.topological_order() == ("a", "b", "c", "d", "e")


def test_in_order_lists_named_ops_in_graph_order_without_unknown_names(g):
    assert [op.name for op in g.in_order({"e", "b", "a"})] == ["a", "b", "e"]
    assert [op.name for op in g.in_order(["d", "x", "nope"])] == ["d"]  # x: an input
    shuffled = Graph(g.tensors, tuple(reversed(g.ops)), g.inputs, outputs=g.outputs)
    assert [op.name for op in shuffled.in_order({"c", "b", "a"})] == ["a", "c", "b"]


def test_producers_consumers_and_neighbours(g):
    assert g.producer("x") is None
    assert g.producer("a") == parse_op("a[i] = exp(x[i])")
    assert [op.name for op in g.consumers("a")] == ["b", "c"]
    assert g.consumers("e") == ()
    assert g.predecessors("d") == ("b", "c")
    assert g.predecessors("a") == ()
    assert g.successors("a") == ("b", "c")
    assert g.kinds() == Counter({OpKind.MAP: 4, OpKind.REDUCE: 1})


def test_ancestors_and_descendants(g):
    assert g.ancestors(["d"]) == {"a", "b", "c"}
    assert g.descendants(["a"]) == {"b", "c", "d", "e"}
    assert g.descendants(["e"]) == set()


@pytest.mark.parametrize(
    ("ops", "convex"),
    [
        ({"a", "d"}, False),  # a -> b -> d leaves the set and comes back
        ({"a", "e"}, False),
        ({"a", "b", "c", "d"}, True),
        ({"b", "c"}, True),
        ({"b"}, True),
        ({"a", "b", "d"}, False),  # through c
    ],
)
def test_convexity(g, ops, convex):
    assert g.is_convex(ops) is convex


def test_subgraph_has_boundary_inputs_and_outputs(g):
    sub = g.subgraph({"b", "c", "d"})
    assert sub.inputs == ("a",)
    assert sub.outputs == ("b", "d")  # b is a graph output, d is read by e outside
    assert sub.topological_order() == ("b", "c", "d")
    assert sub.tensor("a") == Tensor("a", (4,))
    with pytest.raises(ValueError, match="convex"):
        g.subgraph({"a", "d"})


def test_subgraph_keeps_params_as_params():
    g = parse_graph(
        "input x: float32[2,3]\nparam w: float32[3,4]\ntensor y: float32[2,4]\n"
        "y[i,j] = sum_k x[i,k] * w[k,j]\ntensor z: float32[2,4]\nz[i,j] = relu(y[i,j])\n"
        "output z\n"
    )
    sub = g.subgraph({"y"})
    assert (sub.inputs, sub.params, sub.outputs) == (("x",), ("w",), ("y",))


def test_quotient_cycle_of_a_partition(g):
    assert g.find_quotient_cycle([{"a", "d"}]) == (frozenset({"a", "d"}), frozenset({"b"}))
    assert g.find_quotient_cycle([{"a", "b"}, {"c", "d"}]) is None
    assert g.find_quotient_cycle([{"b", "c"}]) is None
    assert g.find_quotient_cycle([]) is None
    with pytest.raises(ValueError, match="disjoint"):
        g.find_quotient_cycle([{"a", "b"}, {"b"}])
    with pytest.raises(KeyError, match="'op'"):
        g.find_quotient_cycle([{"zz"}])


def test_cycles_between_ops_are_rejected_with_the_cycle():
    text = (
        "input x: float32[4]\ntensor p: float32[4]\np[i] = q[i] + x[i]\n"
        "tensor q: float32[4]\nq[i] = p[i] * 2\noutput q\n"
    )
    with pytest.raises(ValueError, match="cycle p -> q -> p"):
        parse_graph(text)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("input x: float32[4]\ntensor y: float32[4]\ny[i] = z[i]\noutput y\n", "'z'"),
        ("input x: float32[4]\ny[i] = x[i]\noutput y\n", "'y' to be a declared tensor"),
        ("input x: float32[4]\nx[i] = 1\noutput x\n", "written once"),
        ("input x: float32[4]\ntensor y: float32[3]\ny[i] = x[i] + x[i+1]\noutput y\n", None),
        ("input x: float32[4]\ntensor y: float32[5]\ny[i] = x[i]\noutput y\n", "index i"),
        ("input x: float32[4]\ninput x: float32[4]\noutput x\n", "declared once"),
    ],
)
def test_inconsistent_graphs_are_rejected(text, match):
    if match is None:  # a valid graph (x[i+1] is an affine read, in bounds for i < 3)
        parse_graph(text)
        return
    with pytest.raises(ValueError, match=match):
        parse_graph(text)


def test_lookup_errors(g):
    with pytest.raises(KeyError, match="'tensor'"):
        g.tensor("nope")
    with pytest.raises(KeyError, match="'op'"):
        g.op("x")  # an input, not an op
