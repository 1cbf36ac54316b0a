r"""Voxel scans for sparse 3-D convolution: the shipped real LiDAR scans and a LiDAR-like generator.

Every scan is given as spconv gives it: ``coords`` ``[N, 4]`` int32 rows ``(b, z, y, x)`` of
distinct voxels, all inside ``spatial_shape = (Z, Y, X)``, plus the number of batches.

=================  =======  =================================================================
scan               voxels   source
=================  =======  =================================================================
``251370668``      15,772   Velodyne HDL-32E scan of koide3/ndt_omp, voxels of 0.1 m (shipped)
``251371071``      15,950   the same sensor, a second scan (shipped)
:func:`lidar_like`  20k-200k  a synthetic spinning 128-beam scan of a street, voxels of 0.1 m
=================  =======  =================================================================

The generator casts the rays of a spinning LiDAR (beam ``i`` at a fixed elevation
:math:`\epsilon_i`, azimuth :math:`\phi_j = 2\pi j / A`) from a sensor 1.73 m above the ground,
and keeps the nearest hit of each ray among the ground plane, a row of building walls on each
side of the street and random boxes (cars, poles, bushes)::

    direction  u_ij = (cos e_i cos p_j, cos e_i sin p_j, sin e_i)
    ground     t = h / -sin e_i                            (e_i < 0)
    box        t = max_axis min(t_lo, t_hi)  if  <= min_axis max(t_lo, t_hi)  (slab test)
    hit        p_ij = o + (min t + noise) u_ij,  kept if min t <= 70 m
    voxel      floor((p - corner) / 0.1 m)

The ground returns form the rings of a real scan (one ring per beam, denser near the sensor);
walls and boxes give vertical surfaces. The number of distinct voxels grows with the azimuth
steps ``A``, which :func:`lidar_like` chooses (a few secant steps in log-log) to land within 3%
of the requested count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import torch

from fusekit.errors import expected

FILES = Path(__file__).parent / "files"
#: The shipped real scans (Velodyne HDL-32E, koide3/ndt_omp), voxels of 0.1 m.
LIDAR_SCANS: tuple[str, ...] = ("251370668", "251371071")
#: Elevations of the generator's 128 beams, degrees: half of them within 8 degrees below the
#: horizon, where a real sensor packs its beams too (the far ground rings).
BEAM_ELEVATIONS_DEG = np.concatenate(
    [np.linspace(-25.0, -8.0, 32), np.linspace(-7.8, -0.5, 64), np.linspace(0.0, 15.0, 32)]
)
SENSOR_HEIGHT_M = 1.73
VOXEL_M = 0.1
#: Scene box of the generator, metres: x and y in [-51.2, 51.2), z in [-0.4, 12.4).
SCENE_LOW_M = (-51.2, -51.2, -0.4)
SCENE_SHAPE = (128, 1024, 1024)  # (Z, Y, X) voxels of 0.1 m
MAX_RANGE_M = 70.0


@dataclass(frozen=True, slots=True, eq=False)
class VoxelScan:
    """Voxel coordinates of one or several scans, in spconv's layout.

    Attributes:
        name: ``"lidar-251370668"``, ``"lidar-like-100000"``, ...
        coords: ``[N, 4]`` int32 rows ``(b, z, y, x)``, distinct, sorted.
        spatial_shape: ``(Z, Y, X)``; every ``(z, y, x)`` lies in ``[0, Z) x [0, Y) x [0, X)``.
        batch_size: scans; every ``b`` lies in ``[0, batch_size)``.
    """

    name: str
    coords: torch.Tensor
    spatial_shape: tuple[int, int, int]
    batch_size: int

    @property
    def num_voxels(self) -> int:
        """``N``."""
        return int(self.coords.shape[0])


def lidar_scan(name: str = LIDAR_SCANS[0]) -> VoxelScan:
    """A shipped real scan as one batch, shifted so that the smallest coordinate is 0.

    Args:
        name: one of :data:`LIDAR_SCANS`.

    Returns:
        The scan; ``spatial_shape`` is the extent of its voxels.

    Raises:
        ValueError: an unknown scan name.
    """
    if name not in LIDAR_SCANS:
        raise ValueError(expected("lidar_scan", "name", " or ".join(LIDAR_SCANS), repr(name)))
    xyz = _shipped(name)
    zyx = (xyz - xyz.min(0))[:, ::-1]
    shape = tuple(int(v) + 1 for v in zyx.max(0))
    return _scan(f"lidar-{name}", [zyx], shape)


@cache
def _shipped(name: str) -> np.ndarray:
    coords: np.ndarray = np.load(FILES / f"lidar_{name}.npz", allow_pickle=False)["coords"]
    return coords.astype(np.int64)


def lidar_like(
    voxels: int = 100_000,
    seed: int = 0,
    batch_size: int = 1,
    boxes: int = 40,
    noise_m: float = 0.02,
) -> VoxelScan:
    """A synthetic spinning-LiDAR scan of a street with about ``voxels`` distinct voxels per scan.

    Args:
        voxels: distinct voxels wanted per scan, 20,000 to 200,000 (the result is within 3%).
        seed: scene and noise seed; batch ``b`` uses ``seed + b``.
        batch_size: scans stacked with batch indices ``0 .. batch_size - 1``.
        boxes: random boxes (cars, poles, bushes) in the street besides the walls.
        noise_m: standard deviation of the range noise, metres.

    Returns:
        The scans in ``SCENE_SHAPE`` (128 x 1024 x 1024 voxels of 0.1 m).

    Raises:
        ValueError: ``voxels`` outside [20,000, 200,000], or ``batch_size`` < 1.
    """
    if not 20_000 <= voxels <= 200_000:
        raise ValueError(expected("lidar_like", "voxels", "in [20000, 200000]", voxels))
    if batch_size < 1:
        raise ValueError(expected("lidar_like", "batch_size", ">= 1", batch_size))
    scans = [_fit_azimuths(voxels, seed + b, boxes, noise_m) for b in range(batch_size)]
    return _scan(f"lidar-like-{voxels}", scans, SCENE_SHAPE)


def _fit_azimuths(voxels: int, seed: int, boxes: int, noise_m: float) -> np.ndarray:
    """Voxels of the scan whose azimuth count lands within 3% of ``voxels`` (secant in log-log)."""
    return _fit_cached(voxels, seed, boxes, noise_m).copy()


@cache
def _fit_cached(voxels: int, seed: int, boxes: int, noise_m: float) -> np.ndarray:
    scene = _scene(seed, boxes)
    # distinct voxels grow like A^a with a < 1 (the near rings saturate); start from a = 0.6
    a, az = 0.6, 1_000
    got = len(cells := _cast(scene, az, seed, noise_m))
    for _ in range(8):
        if abs(got - voxels) <= 0.03 * voxels:
            break
        az_next = max(64, round(az * (voxels / got) ** (1 / a)))
        cells = _cast(scene, az_next, seed, noise_m)
        got_next = len(cells)
        if az_next != az and got_next != got:
            a = min(1.0, max(0.1, math.log(got_next / got) / math.log(az_next / az)))
        az, got = az_next, got_next
    cells.flags.writeable = False
    return cells


def _scene(seed: int, boxes: int) -> np.ndarray:
    """``[B, 2, 3]`` axis-aligned boxes (low, high corners), metres, sensor at the origin."""
    rng = np.random.default_rng(seed)
    half_width = rng.uniform(15.0, 30.0)  # street: walls at y = +-half_width
    walls = []
    for side in (-1.0, 1.0):
        x = -60.0
        while x < 60.0:  # buildings with gaps
            length = rng.uniform(8.0, 25.0)
            near = side * (half_width + rng.uniform(0.0, 2.0))
            y0, y1 = sorted((near, near + side * 10.0))
            walls.append(((x, y0, 0.0), (x + length, y1, rng.uniform(4.0, 15.0))))
            x += length + rng.uniform(1.0, 6.0)
    sizes = np.array([(4.2, 1.8, 1.5), (0.3, 0.3, 4.0), (1.5, 1.5, 1.0)])
    kind = rng.integers(0, 3, boxes)
    centre = np.stack(
        [rng.uniform(-45, 45, boxes), rng.uniform(-0.85, 0.85, boxes) * half_width],
        axis=1,
    )
    centre = centre[np.hypot(centre[:, 0], centre[:, 1]) > 3.0]  # nothing on the sensor
    size = sizes[kind[: len(centre)]] * rng.uniform(0.8, 1.2, (len(centre), 3))
    low = np.column_stack([centre - size[:, :2] / 2, np.zeros(len(centre))])
    random_boxes = np.stack([low, low + size], axis=1)
    return np.concatenate([np.array(walls), random_boxes]).astype(np.float64)


def _cast(scene: np.ndarray, azimuths: int, seed: int, noise_m: float) -> np.ndarray:
    """Distinct ``(z, y, x)`` voxels hit by ``beams x azimuths`` rays (rows sorted).

    Rays form a ``[beams, azimuths]`` grid; each box is tested only against the azimuth columns
    its corners span (walls span tens of degrees, cars a few), which keeps a cast near linear in
    the rays.
    """
    rng = np.random.default_rng(seed + 1_000_003)
    elev = np.deg2rad(BEAM_ELEVATIONS_DEG)[:, None]
    phase = rng.uniform(0, 1)
    azim = (np.arange(azimuths) + phase) * (2 * np.pi / azimuths)
    u = np.stack(
        np.broadcast_arrays(np.cos(elev) * np.cos(azim), np.cos(elev) * np.sin(azim), np.sin(elev)),
        axis=-1,
    )
    origin = np.array([0.0, 0.0, SENSOR_HEIGHT_M])
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(u[..., 2] < 0, -SENSOR_HEIGHT_M / u[..., 2], np.inf)
        inv = 1.0 / u
        for low, high in scene:  # slab test on the columns the box spans
            cols = _columns(low, high, azimuths, phase)
            t0 = (low - origin) * inv[:, cols]
            t1 = (high - origin) * inv[:, cols]
            near = np.nanmax(np.minimum(t0, t1), axis=-1)
            far = np.nanmin(np.maximum(t0, t1), axis=-1)
            hit = (near <= far) & (near > 0) & (near < t[:, cols])
            t[:, cols] = np.where(hit, near, t[:, cols])
    t, u = t.reshape(-1), u.reshape(-1, 3)
    keep = t <= MAX_RANGE_M
    t = t[keep] + rng.normal(0.0, noise_m, int(keep.sum()))
    points = origin + t[:, None] * u[keep]
    cells = np.floor((points - np.array(SCENE_LOW_M)) / VOXEL_M).astype(np.int64)[:, ::-1]
    inside = np.all((cells >= 0) & (cells < np.array(SCENE_SHAPE)), axis=1)
    return np.unique(cells[inside], axis=0)


def _columns(low: np.ndarray, high: np.ndarray, azimuths: int, phase: float) -> np.ndarray:
    """Azimuth columns whose rays can meet the box (its corners' angular span, one column more)."""
    xs, ys = np.meshgrid([low[0], high[0]], [low[1], high[1]])
    angles = np.arctan2(ys, xs).ravel()
    centre = np.arctan2(ys.mean(), xs.mean())
    rel = np.angle(np.exp(1j * (angles - centre)))  # wrapped to (-pi, pi]
    step = 2 * np.pi / azimuths
    first = math.floor((centre + rel.min()) / step - phase) - 1
    last = math.ceil((centre + rel.max()) / step - phase) + 1
    return np.arange(first, last + 1) % azimuths


def _scan(name: str, scans: list[np.ndarray], shape: tuple[int, ...]) -> VoxelScan:
    rows = [np.column_stack([np.full(len(s), b), s]) for b, s in enumerate(scans)]
    coords = torch.from_numpy(np.ascontiguousarray(np.concatenate(rows)).astype(np.int32))
    z, y, x = shape
    return VoxelScan(name=name, coords=coords, spatial_shape=(z, y, x), batch_size=len(scans))
