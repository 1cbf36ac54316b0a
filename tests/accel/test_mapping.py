import pytest
import yaml

from fusekit.accel import Fusion, Mapping, MappingError, attention, check_mapping, gemm_softmax
from fusekit.accel.mapping import from_tree, to_tree, tree_from_dict, tree_to_dict
from fusekit.errors import ConfigError
from fusekit.hw import load

EDGE = load("edge")
P = gemm_softmax(64, 64, 32)


@pytest.mark.parametrize("fusion", list(Fusion))
@pytest.mark.parametrize("split", [(1, 4), (2, 2), (4, 1)])
def test_tree_round_trip(fusion, split):
    m = Mapping(fusion, *split, 8, 16, 32, ("m", "n", "k"), collective="ring")
    tree = to_tree(P, m)
    again = tree_from_dict(yaml.safe_load(yaml.safe_dump(tree_to_dict(tree), sort_keys=False)))
    assert again == tree
    want = m if split[1] > 1 else Mapping(fusion, *split, 8, 16, 32, ("m", "n", "k"))
    assert from_tree(P, again, EDGE) == want


def test_attention_tree_has_reduce_scatter():
    m = Mapping(Fusion.FUSED_GB, 1, 4, 8, 16, 32, ("m", "n", "k"))
    text = yaml.safe_dump(tree_to_dict(to_tree(attention(64, 64, 32), m)))
    assert "reduce_scatter" in text and "all_reduce" in text


@pytest.mark.parametrize(
    ("change", "node", "match"),
    [
        ({"spatial_row": 3}, r"tile\[spatial\]", "do not fit"),
        ({"tile_row": 48}, r"tile\[dram\]", "do not divide m=64"),
        ({"tile_col": 32}, r"tile\[gemm\]", "do not divide n=64"),
        ({"order": ("n", "m", "k"), "fusion": Fusion.FUSED_GB}, r"tile\[dram\]", "outermost"),
    ],
)
def test_errors_name_node_and_constraint(change, node, match):
    base = {"fusion": Fusion.UNFUSED, "spatial_row": 1, "spatial_col": 4, "tile_row": 8,
            "tile_col": 16, "tile_red": 32, "order": ("m", "n", "k")}  # fmt: skip
    with pytest.raises(MappingError, match=f"{node}.*{match}"):
        check_mapping(P, EDGE, Mapping(**{**base, **change}))


def test_tiles_must_fit_buffers():
    big = gemm_softmax(1024, 1024, 64)
    with pytest.raises(MappingError, match="output buffer"):
        check_mapping(big, EDGE, Mapping(Fusion.UNFUSED, 1, 1, 512, 1024, 64, ("m", "n", "k")))
    with pytest.raises(MappingError, match=r"tile\[output\].*exceeds the output buffer"):
        check_mapping(big, EDGE, Mapping(Fusion.FUSED_CLUSTER, 4, 1, 8, 64, 64, ("m", "n", "k")))


def test_missing_collective_is_an_error():
    tree = tree_to_dict(to_tree(P, Mapping(Fusion.FUSED_GB, 1, 4, 8, 16, 32, ("m", "n", "k"))))
    children = tree["child"]["child"]["children"]
    tree["child"]["child"]["children"] = [c for c in children if "collective" not in c]
    with pytest.raises(MappingError, match="needs a all_reduce"):
        from_tree(P, tree_from_dict(tree), EDGE)


def test_illegal_collective_is_an_error():
    tree = tree_to_dict(to_tree(P, Mapping(Fusion.FUSED_GB, 4, 1, 8, 16, 32, ("m", "n", "k"))))
    tree["child"]["child"]["children"].insert(
        2, {"collective": "all_reduce", "tensor": "X", "over": "n", "reduce": "max"}
    )
    with pytest.raises(MappingError, match=r"children\[2\].*not legal"):
        from_tree(P, tree_from_dict(tree), EDGE)


def test_wrong_collective_kind_is_an_error():
    tree = tree_to_dict(to_tree(P, Mapping(Fusion.FUSED_GB, 1, 4, 8, 16, 32, ("m", "n", "k"))))
    tree["child"]["child"]["children"][2]["collective"] = "broadcast"
    with pytest.raises(MappingError, match="expected all_reduce"):
        from_tree(P, tree_from_dict(tree), EDGE)


def test_factors_must_divide():
    tree = tree_to_dict(to_tree(P, Mapping(Fusion.FUSED_GB, 1, 4, 8, 16, 32, ("m", "n", "k"))))
    tree["tile"]["temporal"]["m"] = 3
    with pytest.raises(MappingError, match="factors of m multiply to 3"):
        from_tree(P, tree_from_dict(tree), EDGE)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"tile": {"level": "l9"}, "child": {"op": "S"}}, r"root.tile.level: unknown level"),
        ({"op": "S", "bind": "pipeline"}, "exactly one of"),
        ({"bind": "zigzag", "children": [{"op": "S"}]}, r"root.bind: expected one of"),
        ({"tile": {"level": "dram", "temporal": {"m": 0}}, "child": {"op": "S"}}, "temporal"),
        ({"collective": "all_reduce", "tensor": "X", "over": "n", "model": "x"}, "model"),
    ],
)
def test_yaml_errors_name_the_path(data, match):
    with pytest.raises(ConfigError, match=match):
        tree_from_dict(data, "m.yaml")
