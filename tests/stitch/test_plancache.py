"""The plan cache (fusekit.stitch.plancache): a graph planned once is rebuilt, not planned."""

import dataclasses
import json

import pytest
import torch

from fusekit.hw import detect
from fusekit.ir import capture
from fusekit.stitch import plancache
from fusekit.stitch import search as search_module
from fusekit.stitch.runner import PlannedGraph
from fusekit.stitch.search import plan
from fusekit.stitch.workloads import load_workload


@pytest.fixture(scope="module")
def target():
    return detect()  # before the cache folder moves: measured once, from the user's cache


@pytest.fixture
def cached(monkeypatch, tmp_path, target):
    """The plans' folder, in a temporary cache home, with the cache on."""
    monkeypatch.setenv("FUSEKIT_PLAN_CACHE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "fusekit" / "plans"


def _graph(name="layernorm_fwd"):
    w = load_workload(name, small=True)
    cap = capture(w.module, w.args)
    return w, cap


def test_a_second_plan_is_the_cached_one_and_runs_the_same(cached, target, monkeypatch):
    w, cap = _graph()
    first = plan(cap.graph, target)
    assert not first.cached
    assert len(list(cached.glob("*.json"))) == 1

    def no_search(*args, **kwargs):
        raise AssertionError("planned again")

    monkeypatch.setattr(search_module, "enumerate_candidates", no_search)
    second = plan(cap.graph, target)
    assert second.cached
    assert [g.ops for g in second.groups] == [g.ops for g in first.groups]
    assert [g.layout.scheme if g.layout else None for g in second.groups] == [
        g.layout.scheme if g.layout else None for g in first.groups
    ]
    assert second.objective_s == first.objective_s
    from fusekit.stitch.commands import plan_summary

    assert plan_summary(second)["cached"] and not plan_summary(first)["cached"]
    values = cap.values(*w.args)
    with torch.no_grad():
        want = w.module(*w.args)
        got = PlannedGraph(second, cap.constants).run(values)[cap.graph.outputs[0]]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_key_changes_with_the_graph_the_target_and_the_options(cached, target):
    _, a = _graph("layernorm_fwd")
    _, b = _graph("bias_gelu")
    plan(a.graph, target)
    plan(b.graph, target)
    plan(a.graph, target, top_k=2)
    slower = dataclasses.replace(target, mem_bw_bytes_per_s=target.mem_bw_bytes_per_s / 2)
    plan(a.graph, slower)
    plan(a.graph, target, method="greedy")
    assert len(list(cached.glob("*.json"))) == 5


@pytest.mark.parametrize(
    "entry",
    [
        "not json",
        json.dumps({"groups": [["no_such_op"]]}),  # figures missing: malformed
        "TWICE",  # a group listed twice: the plan would run its ops twice
        "UNKNOWN",  # a group of an op the graph lacks
        "TYPE",  # a figure of the wrong type
    ],
)
def test_a_bad_entry_is_ignored_and_the_graph_planned_again(cached, target, entry):
    _, cap = _graph()
    first = plan(cap.graph, target)
    (path,) = cached.glob("*.json")
    if entry == "TWICE":
        good = json.loads(path.read_text())
        good["groups"].append(good["groups"][0])
        entry = json.dumps(good)
    elif entry == "TYPE":
        good = json.loads(path.read_text())
        good["optimal"] = "yes"
        entry = json.dumps(good)
    elif entry == "UNKNOWN":
        good = json.loads(path.read_text())
        good["groups"][0] = ["no_such_op"]
        entry = json.dumps(good)
    path.write_text(entry)
    again = plan(cap.graph, target)
    assert not again.cached
    assert [g.ops for g in again.groups] == [g.ops for g in first.groups]
    assert json.loads(path.read_text())["groups"]  # written again


def test_off_by_environment(monkeypatch, tmp_path, target):
    monkeypatch.setenv("FUSEKIT_PLAN_CACHE", "0")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    _, cap = _graph()
    plan(cap.graph, target)
    assert not (tmp_path / "fusekit" / "plans").exists()
    assert not plancache.enabled()
