"""Graphs: the real entity and citation graphs fusekit ships, and generators of their shape.

Also a reader for the raw files of PyG's ``Entities`` datasets that a user already has.

=========  =========  ===========  =========  =======  ========================================
graph      nodes      edges        relations  classes  source
=========  =========  ===========  =========  =======  ========================================
AIFB       8,285      58,086       90         4        shipped (shared/data/aifb)
MUTAG      23,644     148,454      46         2        shipped (shared/data/mutag)
BGS        333,845    1,832,398    206        2        :func:`entities_shaped` only
AM         1,666,764  11,976,642   266        11       :func:`entities_shaped` only
Cora       2,708      10,556       1          7        shipped (shared/data/cora_planetoid)
CiteSeer   3,327      9,228        1          6        shipped (shared/data/citeseer_planetoid)
Cora-ML    2,995      16,316       1          7        shipped (shared/data/cora_ml)
=========  =========  ===========  =========  =======  ========================================

Edges and relations count inverses, as R-GCN (Schlichtkrull et al., ESWC 2018) and PyG's
``Entities`` do: every triple ``(h, r, t)`` gives ``h -> t`` with relation ``r`` and ``t -> h``
with ``r + R``. The entity statistics are those of PyG's ``Entities`` table. Citation edges are
directed, both directions of each undirected edge (Cora-ML's stored matrix is symmetrised).
"""

from __future__ import annotations

import gzip
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import torch

from fusekit.errors import expected

# scipy (slow to load) is imported by the citation graphs only: the entity graphs need none.

FILES = Path(__file__).parent / "files"

#: Published statistics of the R-GCN entity-classification graphs (PyG ``Entities``), inverses in.
ENTITY_STATS: dict[str, tuple[int, int, int, int]] = {
    # name: (nodes, edges, relations, classes)
    "aifb": (8_285, 58_086, 90, 4),
    "mutag": (23_644, 148_454, 46, 2),
    "bgs": (333_845, 1_832_398, 206, 2),
    "am": (1_666_764, 11_976_642, 266, 11),
}


@dataclass(frozen=True, slots=True, eq=False)
class EntityGraph:
    """A relational graph with node labels, in PyG's ``edge_index``/``edge_type`` form.

    Attributes:
        name: ``"aifb"``, ``"mutag"``, ``"bgs-shaped"``, ...
        edge_index: ``[2, E]`` int64, row 0 the source, row 1 the target.
        edge_type: ``[E]`` int64 in ``[0, num_relations)``.
        num_nodes: nodes (featureless: layers index their first weight by node id).
        num_relations: relations including inverses.
        num_classes: label classes.
        train_idx, train_y, test_idx, test_y: the labelled nodes and their classes.
    """

    name: str
    edge_index: torch.Tensor
    edge_type: torch.Tensor
    num_nodes: int
    num_relations: int
    num_classes: int
    train_idx: torch.Tensor
    train_y: torch.Tensor
    test_idx: torch.Tensor
    test_y: torch.Tensor

    @property
    def num_edges(self) -> int:
        """``E``."""
        return int(self.edge_type.shape[0])


@dataclass(frozen=True, slots=True, eq=False)
class CitationGraph:
    """A single-relation graph with sparse node features (Planetoid form).

    Attributes:
        name: ``"cora"``, ``"citeseer"`` or ``"cora_ml"``.
        x: ``[N, F]`` node features as a SciPy CSR matrix (float32).
        edge_index: ``[2, E]`` int64, both directions of every undirected edge.
        y: ``[N]`` int64 classes.
        train_idx, val_idx, test_idx: the split (Planetoid's; Cora-ML: none, empty tensors).
    """

    name: str
    x: object
    edge_index: torch.Tensor
    y: torch.Tensor
    train_idx: torch.Tensor
    val_idx: torch.Tensor
    test_idx: torch.Tensor

    @property
    def num_nodes(self) -> int:
        """``N``."""
        return int(self.y.shape[0])

    @property
    def num_edges(self) -> int:
        """``E`` (directed)."""
        return int(self.edge_index.shape[1])

    def adjacency(self) -> object:
        """The ``[N, N]`` float32 CSR adjacency, ``A[dst, src] = 1`` (rows are targets)."""
        import scipy.sparse as sp

        src, dst = self.edge_index.numpy()
        ones = np.ones(src.shape[0], dtype=np.float32)
        return sp.csr_matrix((ones, (dst, src)), shape=(self.num_nodes, self.num_nodes))


def entities(name: str) -> EntityGraph:
    """The shipped AIFB or MUTAG graph with its published train/test split."""
    if name not in ("aifb", "mutag"):
        raise ValueError(expected("data.entities", "name", "'aifb' or 'mutag'", repr(name)))
    return _entities(name)


@cache
def _entities(name: str) -> EntityGraph:
    d = np.load(FILES / f"{name}.npz", allow_pickle=False)
    return _from_triples(
        name,
        d["head"],
        d["relation"],
        d["tail"],
        int(d["num_nodes"]),
        int(d["num_relations"]),
        int(d["num_classes"]),
        (d["train_idx"], d["train_y"], d["test_idx"], d["test_y"]),
    )


def _from_triples(
    name: str,
    head: np.ndarray,
    relation: np.ndarray,
    tail: np.ndarray,
    nodes: int,
    relations: int,
    classes: int,
    split: tuple[np.ndarray, ...],
) -> EntityGraph:
    h, r, t = (torch.from_numpy(np.asarray(a, dtype=np.int64)) for a in (head, relation, tail))
    train_idx, train_y, test_idx, test_y = (
        torch.from_numpy(np.asarray(a, np.int64)) for a in split
    )
    return EntityGraph(
        name=name,
        edge_index=torch.stack([torch.cat([h, t]), torch.cat([t, h])]),
        edge_type=torch.cat([r, r + relations]),
        num_nodes=nodes,
        num_relations=2 * relations,
        num_classes=classes,
        train_idx=train_idx,
        train_y=train_y,
        test_idx=test_idx,
        test_y=test_y,
    )


def entities_shaped(name: str, seed: int = 0, scale: float = 1.0) -> EntityGraph:
    """A synthetic graph with the published size of AIFB, MUTAG, BGS or AM (times ``scale``).

    Relation sizes follow a Zipf law (exponent 1.2: the largest relation of AIFB and MUTAG holds
    about 15% of the triples) and triple endpoints a power law over nodes (exponent 0.8), with
    node ids shuffled so that popular nodes are not the low ids. Labels are random: 10% of the
    nodes, split 80/20, for timing and memory runs rather than accuracy.
    """
    if name not in ENTITY_STATS:
        raise ValueError(
            expected("data.entities_shaped", "name", f"one of {list(ENTITY_STATS)}", repr(name))
        )
    if not scale > 0:
        raise ValueError(expected("data.entities_shaped", "scale", "> 0", scale))
    nodes, edges, relations, classes = ENTITY_STATS[name]
    nodes = max(2, round(nodes * scale))
    triples = max(1, round(edges * scale / 2))
    rng = np.random.default_rng(seed)
    relation = zipf(relations // 2, triples, 1.2, rng)
    perm = rng.permutation(nodes)
    head = perm[zipf(nodes, triples, 0.8, rng)]
    tail = perm[zipf(nodes, triples, 0.8, rng)]
    labelled = rng.choice(nodes, size=max(2, nodes // 10), replace=False)
    y = rng.integers(0, classes, size=(labelled.shape[0],))
    cut = int(0.8 * labelled.shape[0])
    split = (labelled[:cut], y[:cut], labelled[cut:], y[cut:])
    return _from_triples(
        f"{name}-shaped", head, relation, tail, nodes, relations // 2, classes, split
    )


def zipf(n: int, count: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """``count`` draws from ``{0..n-1}`` with ``P(i) ∝ (i + 1) ** -exponent``."""
    weights = np.arange(1, n + 1, dtype=np.float64) ** -exponent
    return rng.choice(n, size=count, p=weights / weights.sum())


def planetoid(name: str) -> CitationGraph:
    """The shipped Cora, CiteSeer (Planetoid split) or Cora-ML graph."""
    if name not in ("cora", "citeseer", "cora_ml"):
        raise ValueError(
            expected("data.planetoid", "name", "'cora', 'citeseer' or 'cora_ml'", repr(name))
        )
    return _planetoid(name)


@cache
def _planetoid(name: str) -> CitationGraph:
    import scipy.sparse as sp

    d = np.load(FILES / f"{name}.npz", allow_pickle=False)
    empty = torch.zeros(0, dtype=torch.int64)
    if name == "cora_ml":
        x = sp.csr_matrix(
            (d["attr_matrix_data"], d["attr_matrix_indices"], d["attr_matrix_indptr"]),
            shape=tuple(d["attr_matrix_shape"]),
        )
        adj = sp.csr_matrix(
            (d["adj_matrix_data"], d["adj_matrix_indices"], d["adj_matrix_indptr"]),
            shape=tuple(d["adj_matrix_shape"]),
        )
        adj = ((adj + adj.T) > 0).tocoo()  # the stored matrix is directed; use both directions
        edge_index = torch.from_numpy(np.stack([adj.row, adj.col]).astype(np.int64))
        return CitationGraph(
            name, x, edge_index, torch.from_numpy(d["labels"]), empty, empty, empty
        )
    x = sp.csr_matrix((d["x_data"], d["x_indices"], d["x_indptr"]), shape=tuple(d["x_shape"]))
    return CitationGraph(
        name,
        x,
        torch.from_numpy(d["edge_index"].astype(np.int64)),
        torch.from_numpy(d["y"].astype(np.int64)),
        torch.from_numpy(d["train_index"]),
        torch.from_numpy(d["val_index"]),
        torch.from_numpy(d["test_index"]),
    )


_TERM = r'(<[^>]*>|_:\S+|"(?:[^"\\]|\\.)*"(?:@[A-Za-z0-9-]+|\^\^<[^>]*>)?)'
_TRIPLE = re.compile(rf"^\s*{_TERM}\s+(<[^>]*>)\s+{_TERM}\s*\.\s*$")


def read_entities_raw(folder: str | Path, name: str | None = None) -> EntityGraph:
    """Read the raw files of a PyG ``Entities`` dataset (``{root}/{name}/raw``).

    That folder holds ``{name}_stripped.nt.gz`` and ``trainingSet.tsv``/``testSet.tsv``/
    ``completeDataset.tsv``, exactly as PyG and DGL download them. Nodes are the sorted distinct
    N-Triples terms and relations the sorted predicates (PyG orders them differently, so ids differ
    from PyG's but the graph is the same).
    """
    arrays = raw_arrays(folder)
    split = tuple(arrays[k] for k in ("train_idx", "train_y", "test_idx", "test_y"))
    label = name or next(Path(folder).glob("*_stripped.nt.gz")).name.removesuffix("_stripped.nt.gz")
    return _from_triples(
        label,
        arrays["head"],
        arrays["relation"],
        arrays["tail"],
        int(arrays["num_nodes"]),
        int(arrays["num_relations"]),
        int(arrays["num_classes"]),
        split,
    )


def raw_arrays(folder: str | Path) -> dict[str, np.ndarray]:
    """The arrays of the shipped entity npz files, from a raw ``Entities`` folder.

    Triples are deduplicated as a set, as rdflib does (AIFB: 29,043 triples, 8,285 nodes, 45
    relations; MUTAG: 74,227 / 23,644 / 23); classes are numbered in sorted order of their labels.
    """
    folder = Path(folder)
    graphs = sorted(folder.glob("*_stripped.nt.gz"))
    if not graphs:
        raise ValueError(
            expected("data.read_entities_raw", "folder", "a folder with *_stripped.nt.gz", folder)
        )
    triples = sorted(_read_triples(graphs[0]))
    nodes = {n: i for i, n in enumerate(sorted({t[0] for t in triples} | {t[2] for t in triples}))}
    rels = {r: i for i, r in enumerate(sorted({t[1] for t in triples}))}
    complete = _rows(folder / "completeDataset.tsv")
    classes = {c: i for i, c in enumerate(sorted({label for _, label in complete}))}
    train_idx, train_y = _split(folder / "trainingSet.tsv", nodes, classes)
    test_idx, test_y = _split(folder / "testSet.tsv", nodes, classes)
    return {
        "head": np.array([nodes[h] for h, _, _ in triples], dtype=np.int32),
        "relation": np.array([rels[r] for _, r, _ in triples], dtype=np.int32),
        "tail": np.array([nodes[t] for _, _, t in triples], dtype=np.int32),
        "num_nodes": np.array(len(nodes), dtype=np.int64),
        "num_relations": np.array(len(rels), dtype=np.int64),
        "num_classes": np.array(len(classes), dtype=np.int64),
        "train_idx": train_idx,
        "train_y": train_y,
        "test_idx": test_idx,
        "test_y": test_y,
    }


def _read_triples(path: Path) -> set[tuple[str, ...]]:
    triples: set[tuple[str, ...]] = set()
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            match = _TRIPLE.match(line)
            if match is None:
                raise ValueError(f"{path}:{number}: not an N-Triples line: {line[:80]!r}")
            triples.add(match.groups())
    return triples


def _rows(path: Path) -> list[list[str]]:
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    header = lines[0].split("\t")
    entity = 1 if header[0] == "id" else 0
    return [
        [cells[entity], _label(cells[-1])]
        for cells in ([c.strip() for c in line.split("\t")] for line in lines[1:])
    ]


def _label(cell: str) -> str:
    try:
        return str(int(float(cell)))  # MUTAG writes 0 / 1 in one file and 0.0 / 1.0 in others
    except ValueError:
        return cell


def _split(
    path: Path, nodes: dict[str, int], classes: dict[str, int]
) -> tuple[np.ndarray, np.ndarray]:
    rows = _rows(path)
    idx = np.array([nodes[f"<{uri}>"] for uri, _ in rows], dtype=np.int64)
    y = np.array([classes[label] for _, label in rows], dtype=np.int64)
    return idx, y
