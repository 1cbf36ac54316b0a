import pytest

from fusekit.ir import GmsChain, Weight, capture, find_gms_chains, parse_graph
from fusekit.ir.examples import load_example

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")

CHAIN = """\
input x: float32[10,4]
input g: int64[6]
input d: int64[6]
input c: float32[6]
param w: float32[4,3]
tensor xg: float32[6,4]
xg[e,k] = x[g[e],k]
tensor h: float32[6,3]
h[e,m] = sum_k xg[e,k] * w[k,m]
tensor r: float32[6,3]
r[e,m] = relu(h[e,m]) * c[e]
tensor y: float32[10,3]
y[d[e],m] += r[e,m]
output y
"""


def test_hand_built_chain_is_reported_with_its_shapes():
    assert find_gms_chains(parse_graph(CHAIN)) == [
        GmsChain(
            gather="xg",
            source="x",
            source_shape=(10, 4),
            gather_index="g",
            pairs=6,
            matmuls=("h",),
            weights=(Weight("w", (4, 3)),),
            scales=("c",),
            scatter="y",
            scatter_index="d",
            target_shape=(10, 3),
            ops=("xg", "h", "r", "y"),
        )
    ]


def test_no_chain_without_a_matmul_or_through_a_reduction():
    no_matmul = CHAIN.replace("h[e,m] = sum_k xg[e,k] * w[k,m]", "h[e,m] = xg[e,m] * 2").replace(
        "param w: float32[4,3]\n", ""
    )
    assert find_gms_chains(parse_graph(no_matmul)) == []
    through_reduce = CHAIN.replace("r[e,m] = relu(h[e,m]) * c[e]", "r[e,m] = h[e,m] - max_j h[e,j]")
    assert find_gms_chains(parse_graph(through_reduce)) == []


def test_gathered_weights_are_not_row_gathers_but_weight_indices():
    text = CHAIN.replace("param w: float32[4,3]", "param w: float32[2,4,3]\ninput s: int64[6]")
    text = text.replace(
        "tensor h: float32[6,3]",
        "tensor ws: float32[6,4,3]\nws[e,k,m] = w[s[e],k,m]\ntensor h: float32[6,3]",
    ).replace("h[e,m] = sum_k xg[e,k] * w[k,m]", "h[e,m] = sum_k xg[e,k] * ws[e,k,m]")
    (chain,) = find_gms_chains(parse_graph(text))
    assert chain.gather == "xg" and chain.weights == (Weight("w", (2, 4, 3), "s"),)


def test_rgcn_chain_gathers_sources_and_scatters_to_destinations():
    example = load_example("rgcn")
    (chain,) = find_gms_chains(capture(example.module, example.args).graph)
    assert (chain.source, chain.source_shape, chain.pairs) == ("x", (64, 16), 256)
    assert chain.weights == (Weight("p_weight", (4, 16, 16), "edge_type"),)
    assert chain.target_shape == (64, 16) and len(chain.matmuls) == 1
    assert "x[64, 16]" in chain.describe()


def test_moe_chain_has_two_per_expert_matmuls_and_a_gate():
    example = load_example("gpt_moe")
    (chain,) = find_gms_chains(capture(example.module, example.args).graph)
    assert chain.source_shape == (32, 64) and chain.pairs == 64
    assert [w.shape for w in chain.weights] == [(4, 64, 128), (4, 128, 64)]
    assert all(w.index is None for w in chain.weights)  # per-expert batch, not gathered
    assert len(chain.matmuls) == 2 and len(chain.scales) == 1
    assert chain.gather_index == chain.scatter_index
