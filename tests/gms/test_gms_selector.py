import json

import pytest
import torch

from fusekit.gms import Dataflow, Order, Strategy, model, plan
from fusekit.gms.candidates import config_of
from fusekit.gms.features import features, signature
from fusekit.gms.search import hardware_key, space_of
from fusekit.gms.selector import (
    TRAINING,
    Constraints,
    TreeSelector,
    load_tree,
    select,
    select_by_model,
    train_tree,
)
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


# ---- constraints: what a caller allows (kernel maps: pairwise; training; a named dataflow) ----

PAIRWISE_ONLY = Constraints(orders=frozenset({Order.PAIRWISE}))


def test_constraints_run_as_keeps_what_is_allowed_and_replaces_the_rest():
    af = Strategy.parse("aggregate-first/(GM)seg-S")
    assert Constraints().run_as(af, "cpu") == af
    assert PAIRWISE_ONLY.run_as(af, "cpu") == Strategy.parse("(GM)seg-S")
    named = Constraints(dataflows=frozenset({Dataflow.G_MSEG_S}))
    assert named.run_as(af, "cpu") == Strategy.parse("aggregate-first/G-Mseg-S")
    assert Constraints(training=True).run_as(af, "cpu") == TRAINING["cpu"]
    assert Constraints(training=True).run_as(af, "gpu") == TRAINING["gpu"]
    nothing = Constraints(orders=frozenset({Order.TRANSFORM_FIRST}))
    assert nothing.run_as(Strategy(), "cpu") is None
    assert not PAIRWISE_ONLY.allows(af, "sum", "cpu")
    assert not Constraints().allows(af, "max", "cpu")  # the reduce's own rule


def test_tree_runs_the_leafs_knobs_with_an_allowed_strategy():
    tree = _tree()
    narrow = features(plan(small_problem(seed=9)), 8, 8, torch.float32, False)
    assert tree.choose(narrow) == FAST  # aggregate-first
    assert tree.choose(narrow, PAIRWISE_ONLY) == {**FAST, "strategy": "(GMS)seg"}
    assert tree.choose(narrow, Constraints(training=True)) == {**FAST, "strategy": "(GMS)seg"}
    named = Constraints(orders=PAIRWISE_ONLY.orders, dataflows=frozenset({Dataflow.G_MS_SEG}))
    assert tree.choose(narrow, named) == {**FAST, "strategy": "G-(MS)seg"}
    choice = select(narrow, TARGET, PAIRWISE_ONLY, tree=tree)
    assert choice.source == "tree" and choice.config.strategy == Strategy.parse("(GMS)seg")


def test_model_answers_its_best_legal_configuration():
    f = features(plan(small_problem()), 8, 8, torch.float32, False)
    points = space_of(f, TARGET).points()
    configs = [config_of(p) for p in points]
    predicted = model.predict(f, configs, TARGET)
    for constraints in (PAIRWISE_ONLY, Constraints(training=True)):
        legal = [
            t for c, t in zip(configs, predicted, strict=True)
            if constraints.allows(c.strategy, f.reduce, "cpu")
        ]  # fmt: skip
        choice = select_by_model(f, TARGET, constraints=constraints)
        assert constraints.allows(choice.config.strategy, f.reduce, "cpu")
        assert choice.predicted_s == pytest.approx(min(legal))
    with pytest.raises(ValueError, match="constraints"):
        select_by_model(f, TARGET, constraints=Constraints(orders=frozenset()))


def test_a_tuned_problem_answers_its_fastest_legal_point(tmp_path):
    problem = small_problem()
    f = features(plan(problem), 8, 8, torch.float32, False)
    key = signature(problem, 8, 8, torch.float32, False)
    cache = TuningCache(tmp_path / "t.json")
    times = {point_key(FAST): 1e-3, point_key(THIRD): 2e-3}
    cache.record(hardware_key(TARGET), key, f.group, f.vector(), times)
    assert select(f, TARGET, key=key, cache=cache).point == FAST
    pairwise = select(f, TARGET, PAIRWISE_ONLY, key=key, cache=cache)
    assert pairwise.source == "cache" and pairwise.point == THIRD
