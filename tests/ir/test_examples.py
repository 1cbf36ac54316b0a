import pytest
import torch

from fusekit.ir.examples import EXAMPLES, Example, load_example, load_model

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")


def test_registry_and_seeds():
    assert list(EXAMPLES) == ["bert", "gpt_moe", "gcn", "rgcn"]
    a, b = load_example("rgcn", seed=1), load_example("rgcn", seed=1)
    assert torch.equal(a.args[1], b.args[1])
    assert not torch.equal(a.args[1], load_example("rgcn", seed=2).args[1])
    assert not load_example("bert").module.training


def test_load_model_from_a_file(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(
        "import torch\n"
        "def pair():\n    return torch.nn.Linear(3, 2), (torch.randn(4, 3),)\n"
        "def bad():\n    return 3\n"
    )
    example = load_model(f"{path}:pair")
    assert isinstance(example, Example) and example.name == "pair"
    with pytest.raises(ValueError, match=r"'bad\(\)' to be an Example"):
        load_model(f"{path}:bad")
    with pytest.raises(ValueError, match="'factory'"):
        load_model(f"{path}:missing")
    with pytest.raises(ValueError, match="'model'"):
        load_model(f"{tmp_path / 'nope.py'}:pair")
    with pytest.raises(ValueError, match="one of bert, gpt_moe, gcn, rgcn"):
        load_model("resnet")
