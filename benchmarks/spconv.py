"""fusekit ``SubMConv3d`` side by side with spconv 2.3.8's CPU ``SubMConv3d``, in one process.

Scans: LiDAR-like scans of about 100k and 160k voxels (``fusekit.data.lidar_like``, 0.1 m voxels)
and the shipped real scan 251370668 (15,772 voxels, a sparse HDL-32E sweep); C_in = C_out in
{32, 64}, float32, no bias. Studies (every column is defined in ``benchmarks/README.md``):

* ``forward, map built``: a fresh tensor per call (spconv: a new ``SparseConvTensor``; fusekit: a
  new ``SparseTensor``), so each call builds the kernel map (and fusekit also selects and plans);
* ``forward, map reused``: the map cached by ``indice_key`` on the tensor (spconv's
  ``indice_dict``, fusekit's ``SparseTensor.maps``);
* ``forward+backward, map reused``: spconv 2.3.8's CPU backward is not usable (it asks for a CUDA
  stream and raises on a CPU-only torch), so the peer is spconv's native algorithm in plain torch
  (``index_select`` -> ``mm`` -> ``index_add`` per offset, ``fusekit.nn.conv.conv_reference``);
* ``phases``: fusekit's fresh-map forward split into the kernel map's pass 1 (``find_hits``:
  every pair found and counted), selection + plan (features from the counts, the selector, and
  pass 2 writing the pairs straight into the chosen configuration's packed plan), and the gms
  call, and ``floor: bare GEMMs``: the 27 per-offset GEMMs on rows gathered beforehand (no
  gather, no scatter), the roofline reference of every row.

Roofline ceiling: the per-offset GEMMs alone do ``FLOPs = 2 E C_in C_out`` (``E`` pairs), which
take at least ``bound_s = FLOPs / peak`` on this machine (``peak``: ``hw.detect(refresh=True)
.peak("fp32")``, about 68 GFLOP/s on the 2-core Zen 1 host), whatever the gather, scatter and map
cost. So no implementation can beat spconv by more than ``ceiling_speedup = spconv's median /
bound_s``, recorded on every row of the two forward studies (the same value on a problem's rows).

Before timing, fusekit's outputs are checked against spconv's (forward) and the plain-torch
peer's (gradients).

Run: ``chrt -f 10 .venv/bin/python benchmarks/spconv.py [--quick]``
-> ``benchmarks/results/spconv_cpu.json`` and ``spconv_cpu.png``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from fusekit.data.voxels import VoxelScan, lidar_like, lidar_scan
from fusekit.gms import kmap as km
from fusekit.hw import CPUTarget, detect
from fusekit.nn.conv import SparseTensor, SubMConv3d, conv_reference
from fusekit.report.records import Plot, Summary, run_metadata, write_results
from gms_kernels import FLOOR, bare_gemms, time_blocks
from peers import import_spconv

SPCONV = "spconv SubMConv3d"
FUSEKIT = "fusekit SubMConv3d"
FUSEKIT_VENDOR = "fusekit SubMConv3d (strategy=G-Mseg-S)"

#: What ``fusekit report build`` shows of the results file.
TITLE = (
    "fusekit's SubMConv3d against spconv's on LiDAR-like and real scans (forward with the "
    "kernel map built or reused, forward+backward), and where fusekit's time goes, on the CPU."
)
PLOTS = (
    Plot(title="Speedup of fusekit SubMConv3d over the peer", x="problem", y="speedup",
         hue="study", where={"impl": FUSEKIT}, ref=1.0),
    Plot(title="Where fusekit's forward time goes (map reused: gms call; built: all phases)",
         x="problem", y="median_s", hue="impl", where={"study": "phases"}),
)  # fmt: skip
TABLES = (
    Summary(title="Speedup of fusekit SubMConv3d over the peer", rows=["problem"],
            values=["speedup"], across="study", where={"impl": FUSEKIT}),
    Summary(title="Phases of fusekit's forward (median seconds)", rows=["problem"],
            values=["median_s"], across="impl", where={"study": "phases"}),
)  # fmt: skip
TORCH = "torch per-offset (spconv native algorithm)"


@dataclass(frozen=True, slots=True)
class Config:
    """One benchmarked problem: a scan and the channels (in = out)."""

    scan: VoxelScan
    channels: int

    @property
    def label(self) -> str:
        """E.g. ``"lidar-like-100000 C=32"``."""
        return f"{self.scan.name} C={self.channels}"


def configs(quick: bool) -> list[Config]:
    scans = [lidar_like(100_000), lidar_like(160_000), lidar_scan("251370668")]
    if quick:
        scans = scans[:1]
    return [Config(s, c) for s in scans for c in (32, 64)]


def inference(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` under ``torch.no_grad()``: forward studies time inference for both layers."""

    def run() -> object:
        with torch.no_grad():
            return fn()

    return run


def run_config(cfg: Config, target: CPUTarget, repeats: int) -> list[dict[str, object]]:
    spconv = import_spconv()

    scan, c = cfg.scan, cfg.channels
    coords, shape = scan.coords, scan.spatial_shape
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(scan.num_voxels, c, generator=gen)
    peer = spconv.SubMConv3d(c, c, 3, bias=False)
    peer_keyed = spconv.SubMConv3d(c, c, 3, bias=False, indice_key="subm")
    ours = SubMConv3d(c, c, 3, bias=False)
    ours_keyed = SubMConv3d(c, c, 3, bias=False, indice_key="subm")
    for layer in (peer_keyed, ours, ours_keyed):
        layer.load_state_dict(peer.state_dict())

    # map reused: spconv keeps it in the output's indice_dict, fusekit in SparseTensor.maps
    keyed = peer_keyed(spconv.SparseConvTensor(x, coords, list(shape), 1)).replace_feature(x)
    ours_tensor = SparseTensor(x, coords, shape, 1)
    ours_keyed(ours_tensor)
    kmap = ours_tensor.maps["subm"].kmap
    _, choice = ours_tensor.maps["subm"].plan_for(c, c, torch.float32, x.device)

    # forward+backward, map reused
    xg = x.clone().requires_grad_()
    grad = torch.randn(scan.num_voxels, c, generator=gen)
    grad_tensor = SparseTensor(xg, coords, shape, 1, ours_tensor.maps)

    def fusekit_fwd_bwd() -> None:
        ours_keyed(grad_tensor).features.backward(grad)

    ours_vendor = SubMConv3d(c, c, 3, bias=False, indice_key="subm", strategy="G-Mseg-S")
    ours_vendor.load_state_dict(peer.state_dict())

    def fusekit_vendor_fwd_bwd() -> None:
        ours_vendor(grad_tensor).features.backward(grad)

    def torch_fwd_bwd() -> None:
        conv_reference(xg, peer.weight, None, kmap).backward(grad)

    # phases of fusekit's fresh-map forward
    built: dict[str, object] = {}

    def phase_map() -> None:  # pass 1: every pair found, counted per offset and row
        built["hits"] = km.find_hits(coords, shape, 1)

    def phase_plan() -> None:  # features, selector, pass 2 written into the packed plan
        from fusekit.nn.conv import ConvMap

        entry = ConvMap(coords, hits=built["hits"])  # type: ignore[arg-type]
        entry.plan_for(c, c, torch.float32, x.device)

    w = peer.weight.detach().reshape(c, 27, c).permute(1, 2, 0).contiguous()
    pl, _ = ours_tensor.maps["subm"].plan_for(c, c, torch.float32, x.device)

    def phase_gms() -> torch.Tensor:
        from fusekit.gms import gms
        from fusekit.gms.launch import launch

        with launch(choice.launch):
            return gms(x, w, pl, None, choice.strategy)

    studies: dict[str, dict[str, Callable[[], object]]] = {
        "forward, map built": {
            SPCONV: inference(lambda: peer(spconv.SparseConvTensor(x, coords, list(shape), 1))),
            FUSEKIT: inference(lambda: ours(SparseTensor(x, coords, shape, 1))),
        },
        "forward, map reused": {
            SPCONV: inference(lambda: peer_keyed(keyed)),
            FUSEKIT: inference(lambda: ours_keyed(ours_tensor)),
        },
        "forward+backward, map reused": {
            TORCH: torch_fwd_bwd,
            FUSEKIT: fusekit_fwd_bwd,
            FUSEKIT_VENDOR: fusekit_vendor_fwd_bwd,
        },
        "phases": {
            "fusekit: kernel map": phase_map,
            "fusekit: select + plan": phase_plan,
            "fusekit: gms call": phase_gms,
            **bare_gemms(x.index_select(0, kmap.gather), w, kmap.offset_ptr),
        },
    }

    # same answers before any timing. spconv 2.3.8's CPU kernels race with more than one torch
    # thread (a few rows of a 100k-voxel scan come out wrong), so its answer is taken on one
    # thread; rows it gets wrong on all threads are counted in `spconv_wrong_rows`.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    expected = peer(spconv.SparseConvTensor(x, coords, list(shape), 1)).features
    torch.set_num_threads(threads)
    wrong = peer(spconv.SparseConvTensor(x, coords, list(shape), 1)).features - expected
    wrong_rows = int((wrong.abs() > 1e-3).any(1).sum())
    for name, fn in (("fresh", studies["forward, map built"][FUSEKIT]), ("keyed", None)):
        got = (fn() if fn else ours_keyed(ours_tensor)).features  # type: ignore[union-attr]
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4, msg=f"{cfg.label} {name}")
    fusekit_fwd_bwd()
    ours_grad = (xg.grad.clone(), ours_keyed.weight.grad.clone())  # type: ignore[union-attr]
    xg.grad, peer.weight.grad = None, None
    torch_fwd_bwd()
    torch.testing.assert_close(ours_grad[0], xg.grad, atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(ours_grad[1], peer.weight.grad, atol=1e-2, rtol=1e-4)
    torch_grad, xg.grad = xg.grad, None
    fusekit_vendor_fwd_bwd()
    torch.testing.assert_close(xg.grad, torch_grad, atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(ours_vendor.weight.grad, peer.weight.grad, atol=1e-2, rtol=1e-4)

    flops = 2 * kmap.num_pairs * c * c
    bound_s = flops / target.peak("fp32")  # the GEMMs at peak: no forward can take less
    records: list[dict[str, object]] = []
    floor_s = None
    for study, impls in studies.items():
        times = time_blocks(impls, repeats)
        if study == "phases":
            floor_s = min(t[0] for n, t in times.items() if n.startswith(FLOOR))
        peer_name = next(iter(impls))
        for name, (median, q10, q90) in times.items():
            records.append(
                {
                    "study": study,
                    "problem": cfg.label,
                    "voxels": scan.num_voxels,
                    "pairs": kmap.num_pairs,
                    "C": c,
                    "impl": name,
                    "median_s": median,
                    "q10_s": q10,
                    "q90_s": q90,
                    "speedup": times[peer_name][0] / median if study != "phases" else None,
                    "ceiling_speedup": times[SPCONV][0] / bound_s
                    if study in ("forward, map built", "forward, map reused")
                    else None,
                    "gemm_flops_per_s": flops / median,
                    "fraction_of_peak": flops / median / target.peak("fp32"),
                    "spconv_wrong_rows": wrong_rows,
                    "choice": f"{choice.strategy.name} tile_rows={choice.tile_rows} "
                    f"blocks={choice.blocks} threads={choice.launch.threads}",
                }
            )
    for r in records:
        r["over_floor"] = r["median_s"] / floor_s  # type: ignore[operator]
    return records


def plot(records: list[dict[str, object]], path: Path) -> Path:
    """Speedup of fusekit over the peer per problem, one bar per study."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in records if r["impl"] == FUSEKIT]
    problems = list(dict.fromkeys(str(r["problem"]) for r in rows))
    studies = list(dict.fromkeys(str(r["study"]) for r in rows))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(studies)
    for j, study in enumerate(studies):
        values = [
            next(float(r["speedup"]) for r in rows if r["problem"] == p and r["study"] == study)  # type: ignore[arg-type]
            for p in problems
        ]
        ax.bar([i + j * width for i in range(len(problems))], values, width, label=study)
    ax.axhline(3.0, color="grey", linestyle="--", linewidth=1, label="3x (acceptance)")
    ax.set_xticks([i + width * (len(studies) - 1) / 2 for i in range(len(problems))])
    ax.set_xticklabels(problems, rotation=15, fontsize=8)
    ax.set_ylabel("speedup over spconv CPU (fwd+bwd: over torch per-offset)")
    ax.set_title(f"fusekit SubMConv3d vs spconv 2.3.8 CPU ({torch.get_num_threads()} threads)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="calls per pass (2 passes)")
    parser.add_argument("--quick", action="store_true", help="one scan, 3 repeats")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "spconv_cpu.json"
    )
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    target = detect(refresh=True)
    if not isinstance(target, CPUTarget):
        raise SystemExit("spconv.py compares the CPU paths; detect() gave no CPU target")
    records: list[dict[str, object]] = []
    for cfg in configs(args.quick):
        start = time.perf_counter()
        rows = run_config(cfg, target, repeats)
        records += rows
        for study in ("forward, map built", "forward, map reused", "forward+backward, map reused"):
            peer, *ours = (r for r in rows if r["study"] == study)
            print(
                f"{cfg.label:26s} {study:30s} {peer['impl'][:18]:18s} "
                f"{1e3 * peer['median_s']:8.1f} ms  fusekit "
                + "  ".join(f"{1e3 * r['median_s']:8.1f} ms {r['speedup']:5.2f}x" for r in ours)
                + (
                    f"  (ceiling {peer['ceiling_speedup']:.2f}x)"
                    if peer["ceiling_speedup"] is not None
                    else ""
                ),
                flush=True,
            )
        phases = {r["impl"]: 1e3 * r["median_s"] for r in rows if r["study"] == "phases"}  # type: ignore[operator]
        print("   phases (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()))
        print(f"   ({time.perf_counter() - start:.0f} s)", flush=True)
    path = write_results(
        args.out,
        benchmark="spconv",
        title=TITLE,
        meta=run_metadata(target.to_dict()),
        plots=PLOTS,
        tables=TABLES,
        records=records,
    )
    print(f"wrote {path}")
    print(f"wrote {plot(records, args.out.with_suffix('.png'))}")


if __name__ == "__main__":
    main()
