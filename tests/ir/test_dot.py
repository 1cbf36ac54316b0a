from fusekit.ir import parse_graph, to_dot


def test_dot_has_a_node_per_tensor_and_op_and_an_edge_per_read():
    g = parse_graph(
        "input x: float32[2]\nparam w: float32[2]\ntensor y: float32[2]\ny[i] = x[i] * w[i]\n"
        "output y\n"
    )
    dot = to_dot(g)
    assert dot.startswith('digraph "graph" {')
    assert '"x" -> "op:y";' in dot and '"w" -> "op:y";' in dot
    assert 'label="map: y[i] = x[i] * w[i]\\nfloat32[2]"' in dot
    assert '"op:y" -> "out0";' in dot
