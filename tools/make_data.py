"""Convert the real datasets of /work/shared/data into the npz files ``fusekit.data`` ships.

Run once (the outputs are committed as package data, so a clean clone needs neither the shared
folder nor this):

    .venv/bin/python tools/make_data.py [--shared /work/shared/data]

Writes into ``src/fusekit/data/files/``:

* ``aifb.npz``, ``mutag.npz``: the R-GCN entity-classification graphs as int32 triples
  ``head, relation, tail`` (ids of the sorted distinct N-Triples terms) plus ``num_nodes`` and
  ``num_relations``, and the labelled nodes of the published split: ``train_idx``, ``train_y``,
  ``test_idx``, ``test_y`` (classes numbered in sorted order of their label strings), read by
  ``fusekit.data.graphs.raw_arrays``.
* ``lidar_<scan>.npz``: ``coords``, the distinct 0.1 m voxels (int32 x, y, z) of the two Velodyne
  HDL-32E scans of ``lidar_scan_pair`` (251370668: 15,772 voxels, origin returns included).
* ``cora.npz``, ``citeseer.npz``: copied as they are (already plain arrays); ``cora_ml.npz``: the
  plain-array members of the Cora-ML file (adjacency, attributes, labels), without the three
  object members that only unpickling could read.

Sources and licences: see shared/data/README.md (AIFB, MUTAG: data terms unstated, redistributed
by DGL and PyG; the scan: BSD-2-Clause, koide3/ndt_omp).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np

from fusekit.data.graphs import raw_arrays


def convert_graph(folder: Path, target: Path) -> None:
    """One raw Entities folder into one npz."""
    arrays = raw_arrays(folder)
    np.savez_compressed(target, **arrays)
    print(
        f"{target.name}: {arrays['head'].shape[0]} triples, {arrays['num_nodes']} nodes, "
        f"{arrays['num_relations']} relations, {arrays['num_classes']} classes"
    )


def convert_scan(source: Path, target: Path, voxel_m: float = 0.1) -> None:
    """The distinct voxels of a binary PCD scan (x, y, z, intensity as float32)."""
    blob = source.read_bytes()
    header_end = blob.index(b"DATA binary") + len(b"DATA binary\n")
    points = np.frombuffer(blob[header_end:], dtype="<f4").reshape(-1, 4)[:, :3]
    coords = np.unique(np.floor(points / voxel_m).astype(np.int32), axis=0)
    np.savez_compressed(target, coords=coords)
    print(f"{target.name}: {len(points)} points, {len(coords)} voxels of {voxel_m} m")


def main() -> None:
    """Convert every dataset."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=Path("/work/shared/data"))
    args = parser.parse_args()
    here = Path(__file__).resolve().parents[1] / "src" / "fusekit" / "data" / "files"
    here.mkdir(parents=True, exist_ok=True)
    for name in ("aifb", "mutag"):
        convert_graph(args.shared / name, here / f"{name}.npz")
    for scan in ("251370668", "251371071"):
        convert_scan(args.shared / "lidar_scan_pair" / f"{scan}.pcd", here / f"lidar_{scan}.npz")
    for name in ("cora", "citeseer"):
        shutil.copyfile(args.shared / f"{name}_planetoid" / f"{name}.npz", here / f"{name}.npz")
    convert_plain(args.shared / "cora_ml" / "cora_ml.npz", here / "cora_ml.npz")


def convert_plain(source: Path, target: Path) -> None:
    """Keep the members of an npz that load without unpickling; drop object arrays."""
    data = np.load(source, allow_pickle=False)
    plain = {}
    for key in data.files:
        try:
            plain[key.replace(".", "_")] = data[key]
        except ValueError:  # an object array: loading it would unpickle
            continue
    np.savez_compressed(target, **plain)
    print(f"{target.name}: kept {sorted(plain)}")


if __name__ == "__main__":
    main()
