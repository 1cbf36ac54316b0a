"""Voxel scans: the shipped real scans and the LiDAR-like generator."""

from __future__ import annotations

import pytest
import torch

from fusekit.data.voxels import LIDAR_SCANS, SCENE_SHAPE, lidar_like, lidar_scan


def _check(scan) -> None:
    c = scan.coords
    assert c.dtype == torch.int32 and c.dim() == 2 and c.shape[1] == 4
    assert len(torch.unique(c, dim=0)) == len(c)  # distinct
    assert int(c.min()) >= 0
    assert int(c[:, 0].max()) == scan.batch_size - 1
    for axis, size in enumerate(scan.spatial_shape):
        assert int(c[:, axis + 1].max()) < size


@pytest.mark.parametrize("name", LIDAR_SCANS)
def test_real_scans(name):
    scan = lidar_scan(name)
    _check(scan)
    assert scan.batch_size == 1 and 15_000 < scan.num_voxels < 17_000


def test_lidar_like_hits_the_count_and_has_ground_rings():
    scan = lidar_like(20_000, seed=1)
    _check(scan)
    assert abs(scan.num_voxels - 20_000) <= 600 and scan.spatial_shape == SCENE_SHAPE
    z = scan.coords[:, 1]
    ground = int(torch.mode(z).values)  # the most common height is the ground
    assert (z == ground).float().mean() > 0.2


def test_lidar_like_batches_and_seeds():
    two = lidar_like(20_000, seed=1, batch_size=2)
    _check(two)
    first = two.coords[two.coords[:, 0] == 0]
    assert torch.equal(first, lidar_like(20_000, seed=1).coords)
    assert not torch.equal(first[:, 1:], two.coords[two.coords[:, 0] == 1][:, 1:][: len(first)])


@pytest.mark.parametrize(
    ("kwargs", "match"), [({"voxels": 10}, "voxels"), ({"batch_size": 0}, "batch_size")]
)
def test_lidar_like_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        lidar_like(**kwargs)


def test_lidar_scan_bad_name():
    with pytest.raises(ValueError, match="name"):
        lidar_scan("nope")
