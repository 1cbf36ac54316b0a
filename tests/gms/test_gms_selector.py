import json

import pytest
import torch

from fusekit.gms import model, plan
from fusekit.gms.features import features, signature
from fusekit.gms.search import hardware_key, space_of
from fusekit.gms.selector import TreeSelector, load_tree, select, select_by_model, train_tree
from fusekit.search import TuningCache, point_key

from .helpers_tuning import TARGET, small_problem

FAST = {
    "strategy": "aggregate-first/(GMS)seg",
    "tile_rows": 64,
    "blocks_per_thread": 4,
    "schedule": "pad",
    "threads": 2,
    "chunk": 0,
}
OTHER = {**FAST, "strategy": "(GM)seg-S", "tile_rows": 16}
THIRD = {**FAST, "strategy": "(GMS)seg", "chunk": 1}


def _training():
    """Narrow problems (K = 8) prefer FAST, wide ones (K = 128) OTHER; THIRD is second."""
    out = []
    for seed in range(4):
        for k, best in ((8, FAST), (128, OTHER)):
            f = features(plan(small_problem(seed=seed)), k, 8, torch.float32, False)
            times = {point_key(FAST): 2.0, point_key(OTHER): 2.0, point_key(THIRD): 1.5}
            times[point_key(best)] = 1.0
            out.append((f, times))
    return out


def _tree():
    """The tree trained on :func:`_training` (skipped without scikit-learn, the train extra)."""
    pytest.importorskip("sklearn")
    return train_tree(_training(), cores=2, min_samples_leaf=1)


def test_tree_learns_which_configuration_wins_where():
    tree = _tree()
    narrow = features(plan(small_problem(seed=9)), 8, 8, torch.float32, False)
    wide = features(plan(small_problem(seed=9)), 128, 8, torch.float32, False)
    assert tree.choose(narrow) == FAST
    assert tree.choose(wide) == OTHER
    # max cannot aggregate first: the leaf's next best legal candidate
    maxed = features(plan(small_problem(seed=9, reduce="max")), 8, 8, torch.float32, False)
    assert tree.choose(maxed) == THIRD


def test_tree_round_trips_through_json(tmp_path):
    tree = _tree()
    path = tmp_path / "tree.json"
    path.write_text(json.dumps(tree.to_json()))
    again = load_tree(path)
    f = features(plan(small_problem(seed=9)), 8, 8, torch.float32, False)
    assert again.choose(f) == tree.choose(f)
    with pytest.raises(ValueError, match="selector-tree file"):
        TreeSelector.from_json({"format": "other"})


def test_tree_points_follow_the_targets_cores():
    from dataclasses import replace

    tree = _tree()
    f = features(plan(small_problem(seed=9)), 8, 8, torch.float32, False)
    big = replace(TARGET, cores=8)
    assert select(f, big, tree=tree, method="tree").point["threads"] == 8


def test_select_by_model_is_the_models_argmin():
    f = features(plan(small_problem()), 8, 8, torch.float32, False)
    choice = select_by_model(f, TARGET)
    points = space_of(f, TARGET).points()
    from fusekit.gms.candidates import config_of

    predicted = model.predict(f, [config_of(p) for p in points], TARGET)
    assert choice.source == "model" and choice.predicted_s == pytest.approx(predicted.min())


def test_select_prefers_a_tuned_answer_then_the_tree_then_the_model(tmp_path):
    problem = small_problem()
    f = features(plan(problem), 8, 8, torch.float32, False)
    key = signature(problem, 8, 8, torch.float32, False)
    cache = TuningCache(tmp_path / "t.json")
    tree = _tree()
    assert select(f, TARGET, key=key, cache=cache, tree=tree).source == "tree"
    cache.record(hardware_key(TARGET), key, f.group, f.vector(), {point_key(THIRD): 1e-3})
    tuned = select(f, TARGET, key=key, cache=cache, tree=tree)
    assert tuned.source == "cache" and tuned.point == THIRD
    similar = features(plan(small_problem(seed=1)), 8, 8, torch.float32, False)
    near = select(similar, TARGET, cache=cache, tree=tree)
    assert near.source == "nearest" and near.point == THIRD
    wide = features(plan(small_problem(seed=1)), 128, 8, torch.float32, False)  # 4 doublings
    assert select(wide, TARGET, cache=cache, tree=tree).source == "tree"
    assert select(f, TARGET, tree=tree, method="model").source == "model"
    bf16 = features(plan(problem), 8, 8, torch.bfloat16, False)
    assert select(bf16, TARGET, tree=tree).source == "model"  # the tree knows fp32 only
    with pytest.raises(ValueError, match="tree"):
        select(bf16, TARGET, tree=tree, method="tree")
    with pytest.raises(ValueError, match="method"):
        select(f, TARGET, method="fastest")


def test_shipped_tree_loads_when_present():
    tree = load_tree()
    if tree is None:
        pytest.skip("no shipped tree (benchmarks/gms_select.py --train writes it)")
    assert tree.dtype == "fp32" and tree.trained_on >= 30
