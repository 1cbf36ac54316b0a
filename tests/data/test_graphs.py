"""The shipped graphs carry their published statistics; generators and raw readers agree."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fusekit.data import ENTITY_STATS, entities, entities_shaped, planetoid, read_entities_raw


@pytest.mark.parametrize("name", ["aifb", "mutag"])
def test_entities_match_published_statistics(name):
    g = entities(name)
    nodes, edges, relations, classes = ENTITY_STATS[name]
    assert (g.num_nodes, g.num_edges, g.num_relations, g.num_classes) == (
        nodes,
        edges,
        relations,
        classes,
    )
    assert int(g.edge_index.max()) < nodes and int(g.edge_type.max()) < relations
    assert len(set(g.train_idx.tolist()) & set(g.test_idx.tolist())) == 0
    split = {"aifb": (140, 36), "mutag": (272, 68)}[name]
    assert (len(g.train_idx), len(g.test_idx)) == split
    assert int(g.train_y.max()) < classes


@pytest.mark.parametrize(
    ("name", "nodes", "edges", "features", "classes"),
    [
        ("cora", 2708, 10556, 1433, 7),
        ("citeseer", 3327, 9228, 3703, 6),
        ("cora_ml", 2995, 16316, 2879, 7),
    ],
)
def test_planetoid(name, nodes, edges, features, classes):
    g = planetoid(name)
    assert (g.num_nodes, g.num_edges, g.x.shape[1], int(g.y.max()) + 1) == (
        nodes,
        edges,
        features,
        classes,
    )
    adj = g.adjacency()
    assert adj.shape == (nodes, nodes) and adj.nnz == edges


@pytest.mark.parametrize("name", list(ENTITY_STATS))
def test_shaped_generators_scale(name):
    g = entities_shaped(name, seed=0, scale=0.01)
    nodes, edges, relations, _ = ENTITY_STATS[name]
    assert g.num_nodes == round(nodes * 0.01)
    assert abs(g.num_edges - edges * 0.01) <= 2
    assert g.num_relations == relations
    counts = torch.bincount(g.edge_type, minlength=relations)
    assert counts.max() > 5 * counts.float().median()  # Zipf: a few relations dominate


def test_raw_reader_equals_shipped_graph(tmp_path):
    shared = Path("/work/shared/data/aifb")
    if not shared.exists():
        pytest.skip("the shared data folder is not on this machine")
    raw = read_entities_raw(shared)
    g = entities("aifb")
    assert torch.equal(raw.edge_index, g.edge_index) and torch.equal(raw.edge_type, g.edge_type)
    assert torch.equal(raw.train_idx, g.train_idx) and torch.equal(raw.test_y, g.test_y)


def test_bad_names():
    with pytest.raises(ValueError, match="'name' to be 'aifb' or 'mutag'"):
        entities("bgs")
    with pytest.raises(ValueError, match="'name'"):
        planetoid("pubmed")
    with pytest.raises(ValueError, match="'folder'"):
        read_entities_raw(Path("/nonexistent"))


def test_raw_reader_on_a_tiny_folder(tmp_path):
    import gzip

    lines = [
        "<http://a/p1> <http://a/knows> <http://a/p2> .",
        "<http://a/p2> <http://a/knows> <http://a/p3> .",
        '<http://a/p1> <http://a/name> "Ann"@en .',
        "<http://a/p3> <http://a/likes> _:b0 .",
        "<http://a/p1> <http://a/knows> <http://a/p2> .",  # duplicate: dropped
    ]
    with gzip.open(tmp_path / "toy_stripped.nt.gz", "wt") as f:
        f.write("\n".join(lines) + "\n")
    (tmp_path / "completeDataset.tsv").write_text(
        "id\tperson\tlabel\n1\thttp://a/p1\tx\n2\thttp://a/p2\ty\n3\thttp://a/p3\tx\n"
    )
    (tmp_path / "trainingSet.tsv").write_text(
        "person\tid\tlabel\nhttp://a/p1\t1\tx\nhttp://a/p2\t2\ty\n"
    )
    (tmp_path / "testSet.tsv").write_text("person\tid\tlabel\nhttp://a/p3\t3\tx\n")
    g = read_entities_raw(tmp_path)
    assert g.name == "toy"
    assert (g.num_nodes, g.num_edges, g.num_relations, g.num_classes) == (5, 8, 6, 2)
    assert g.train_y.tolist() == [0, 1] and g.test_y.tolist() == [0]
