"""Convert the real datasets of /work/shared/data into the small npz files the gms benchmark reads.

Run once (the outputs are committed, so a clean clone needs neither the shared folder nor this):

    .venv/bin/python benchmarks/data/make_data.py [--shared /work/shared/data]

Writes, next to this script:

* ``aifb.npz``, ``mutag.npz``: the R-GCN entity-classification graphs as int32 triples
  ``head, relation, tail`` (ids of the sorted distinct N-Triples terms) plus ``num_nodes`` and
  ``num_relations``. Parsed with a regular expression for N-Triples (IRIs, blank nodes, literals
  with language tags or datatypes), deduplicated as a set of triples, as rdflib does: AIFB gives
  29,043 triples, 8,285 nodes, 45 relations; MUTAG 74,227 / 23,644 / 23 (the counts published in
  shared/data/README.md and by PyG's ``Entities``).
* ``lidar_voxels.npz``: ``coords``, the distinct 0.1 m voxels (int32 x, y, z) of the Velodyne
  HDL-32E scan ``lidar_scan_pair/251370668.pcd`` (15,772 voxels, origin returns included).

Sources and licences: see shared/data/README.md (AIFB, MUTAG: data terms unstated, redistributed
by DGL and PyG; the scan: BSD-2-Clause, koide3/ndt_omp).
"""

from __future__ import annotations

import argparse
import gzip
import re
from pathlib import Path

import numpy as np

_TERM = r'(<[^>]*>|_:\S+|"(?:[^"\\]|\\.)*"(?:@[A-Za-z0-9-]+|\^\^<[^>]*>)?)'
_TRIPLE = re.compile(rf"^\s*{_TERM}\s+(<[^>]*>)\s+{_TERM}\s*\.\s*$")


def read_triples(path: Path) -> list[tuple[str, str, str]]:
    """The distinct triples of a gzipped N-Triples file; raises on a line it cannot parse."""
    triples = set()
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            match = _TRIPLE.match(line)
            if match is None:
                raise ValueError(f"{path}:{number}: not an N-Triples line: {line[:80]!r}")
            triples.add(match.groups())
    return sorted(triples)


def convert_graph(source: Path, target: Path) -> None:
    triples = read_triples(source)
    nodes = {n: i for i, n in enumerate(sorted({t[0] for t in triples} | {t[2] for t in triples}))}
    relations = {r: i for i, r in enumerate(sorted({t[1] for t in triples}))}
    np.savez_compressed(
        target,
        head=np.array([nodes[h] for h, _, _ in triples], dtype=np.int32),
        relation=np.array([relations[r] for _, r, _ in triples], dtype=np.int32),
        tail=np.array([nodes[t] for _, _, t in triples], dtype=np.int32),
        num_nodes=np.int64(len(nodes)),
        num_relations=np.int64(len(relations)),
    )
    print(f"{target.name}: {len(triples)} triples, {len(nodes)} nodes, {len(relations)} relations")


def convert_scan(source: Path, target: Path, voxel_m: float = 0.1) -> None:
    blob = source.read_bytes()
    header_end = blob.index(b"DATA binary") + len(b"DATA binary\n")
    points = np.frombuffer(blob[header_end:], dtype="<f4").reshape(-1, 4)[:, :3]
    coords = np.unique(np.floor(points / voxel_m).astype(np.int32), axis=0)
    np.savez_compressed(target, coords=coords)
    print(f"{target.name}: {len(points)} points, {len(coords)} voxels of {voxel_m} m")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=Path("/work/shared/data"))
    args = parser.parse_args()
    here = Path(__file__).parent
    for name in ("aifb", "mutag"):
        convert_graph(args.shared / name / f"{name}_stripped.nt.gz", here / f"{name}.npz")
    convert_scan(args.shared / "lidar_scan_pair" / "251370668.pcd", here / "lidar_voxels.npz")


if __name__ == "__main__":
    main()
