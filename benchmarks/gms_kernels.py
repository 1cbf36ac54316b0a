"""Every gms strategy side by side with the ATen composition a user would write, on the CPU.

Problems (real where we have the data, see ``benchmarks/data/make_data.py``):

* RGCN: the AIFB and MUTAG knowledge graphs with inverse relations (58,086 pairs / 90 segments
  and 148,454 / 46), mean reduce, K = M in {16, 64};
* sparse convolution: the submanifold 3x3x3 kernel map of a real LiDAR scan voxelised at 0.1 m
  (86,724 pairs, 27 segments, sum), K = M in {32, 64};
* Mixture-of-Experts: 4,096 synthetic tokens routed top-2 of 8 experts with Zipf popularity,
  gate-weighted sum, K = M = 256 (GEMM-bound).

For each problem, in one process (see :func:`time_blocks` for the protocol): every strategy through
``fusekit.gms.gms`` (the custom op a model calls, plan built once beforehand), and the ATen
composition given the same segment-sorted indices: ``index_select`` -> ``torch._grouped_mm``
(or one ``torch.mm`` per segment) -> ``index_add_`` (-> divide by the degree for mean). The
faster of the two ATen variants is the baseline of ``speedup``. The last rows, ``floor: bare
GEMMs``, time the segment GEMMs alone on rows gathered beforehand (no gather, scale or scatter);
``over_floor`` of a row is its time over the faster of them. Every column is defined in
``benchmarks/README.md``.

``--backends`` adds the numba-vs-C++ study behind the CPU kernels: the ``(GMS)seg`` kernel
written in C++ (same plan, same 4x16 register tile, OpenMP over destination blocks), built with
``torch.utils.cpp_extension.load_inline`` (-O3 -march=native), timed against the numba kernel.

Run: ``.venv/bin/python benchmarks/gms_kernels.py [--quick] [--backends]``
-> ``benchmarks/results/gms_kernels_cpu.json``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numba
import torch

from fusekit.data import entities, lidar_scan
from fusekit.gms import GMSPlan, GMSProblem, enumerate_candidates, gms, plan
from fusekit.gms import workloads as W
from fusekit.gms.kernels.cpu.g_mseg_s import grouped_mm_supported
from fusekit.gms.kernels.cpu.gms_seg import gms_seg_cpu
from fusekit.gms.kernels.cpu.skeleton import dataflow_kernel
from fusekit.gms.kernels.cpu.tile import FASTMATH
from fusekit.gms.kernels.reference import gms_aten
from fusekit.hw import CPUTarget, detect
from fusekit.report.records import Plot, Summary, run_metadata, shown, write_results

#: What ``fusekit report build`` shows of the results file.
TITLE = (
    "Every gms strategy against the ATen composition (index_select, grouped or per-segment "
    "mm, index_add_) on real RGCN, sparse-convolution and MoE problems, on the CPU; speedup "
    "is over the faster ATen variant."
)
PLOTS = tuple(
    Plot(title=f"Speedup over ATen per implementation: {name}", x="impl", y="speedup",
         hue="problem", where={"study": study}, log_y=True, ref=1.0)
    for study, name in (("rgcn", "RGCN (AIFB, MUTAG)"), ("conv", "sparse convolution (LiDAR)"),
                        ("moe", "Mixture-of-Experts"))
)  # fmt: skip
TABLES = (
    Summary(title="Speedup over ATen per implementation and family (median over problems)",
            rows=["impl"], values=["speedup"], across="study"),
    Summary(title="Problems", rows=["study", "problem"],
            values=["pairs", "segments", "K", "M", "reduce", "plan_s"]),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Config:
    """One benchmarked problem: a workload and the operand widths."""

    family: str
    workload: W.Workload
    k: int
    m: int

    @property
    def label(self) -> str:
        """E.g. ``"aifb K=16 M=16"``."""
        return f"{self.workload.name} K={self.k} M={self.m}"


def rgcn(name: str) -> W.Workload:
    g = entities(name)  # each triple in both directions, inverse relations r + R
    src, dst = g.edge_index
    return W.Workload(
        name, src, g.edge_type, dst, g.num_nodes, g.num_nodes, g.num_relations, "mean"
    )


def lidar() -> W.Workload:
    return W.kernel_map("lidar-0.1m", lidar_scan().coords[:, 1:])


def configs(quick: bool) -> list[Config]:
    aifb, mutag, scan = rgcn("aifb"), rgcn("mutag"), lidar()
    moe = W.moe_shaped(seed=0, tokens=4_096, experts=8, top_k=2)
    out = [Config("rgcn", g, k, k) for g in (aifb, mutag) for k in (16, 64)]
    out += [Config("conv", scan, k, k) for k in (32, 64)]
    out += [Config("moe", moe, 256, 256)]
    return out[:1] + out[2:3] if quick else out


def time_blocks(
    impls: dict[str, Callable[[], object]], repeats: int, passes: int = 2
) -> dict[str, tuple[float, float, float]]:
    """(median, q10, q90) seconds per impl over ``passes`` passes of ``repeats`` calls each.

    Each pass times one implementation at a time (a warm-up call, then ``repeats`` calls in a
    row), the passes alternating forward and reverse order so that drift of a shared machine
    hits every implementation alike. Timing one implementation at a time keeps the allocator and
    the thread pools in its own steady state: interleaving calls made ATen's composition up to
    2.5x slower here (page faults of its intermediates, two OpenMP pools taking turns), which
    would flatter the fused kernels.
    """
    samples: dict[str, list[float]] = {name: [] for name in impls}
    names = list(impls)
    for p in range(passes):
        for name in names if p % 2 == 0 else names[::-1]:
            fn = impls[name]
            fn()
            for _ in range(repeats):
                start = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - start)
    out = {}
    for name, values in samples.items():
        q = statistics.quantiles(values, n=10)
        out[name] = (statistics.median(values), q[0], q[-1])
    return out


#: Rows that time the segment GEMMs alone, on rows gathered beforehand (not a baseline).
FLOOR = "floor: bare GEMMs"


def bare_gemms(
    rows: torch.Tensor, w: torch.Tensor, ptr: torch.Tensor
) -> dict[str, Callable[[], object]]:
    """The GEMMs of the problem and nothing else: ``P = rows[p] @ w[s]`` per segment.

    ``rows`` are ``x[g]`` gathered beforehand, contiguous and in segment order, so no gather,
    scale or scatter is timed: ``torch._grouped_mm`` where it applies, and one ``torch.mm`` per
    segment into one preallocated output. Every implementation runs these GEMMs (or the same
    FLOPs in its own kernel), so its time over the faster of the two is its overhead for
    routing, gather and scatter.
    """
    out = rows.new_empty(rows.shape[0], w.shape[2])
    starts, ends = ptr[:-1].tolist(), ptr[1:].tolist()
    bounds = [(s, lo, hi) for s, (lo, hi) in enumerate(zip(starts, ends, strict=True))]

    def per_segment() -> torch.Tensor:
        for s, lo, hi in bounds:
            if hi > lo:
                torch.mm(rows[lo:hi], w[s], out=out[lo:hi])
        return out

    impls: dict[str, Callable[[], object]] = {f"{FLOOR} (per-segment mm)": per_segment}
    if grouped_mm_supported(rows, w):
        offs = ptr[1:].to(torch.int32)
        impls[f"{FLOOR} (_grouped_mm)"] = lambda: torch._grouped_mm(rows, w, offs=offs)
    return impls


def problem_bytes(cfg: Config) -> int:
    """Least DRAM traffic of the problem: x, w, indices (and scale) read once, y written once."""
    wl = cfg.workload
    floats = wl.n_in * cfg.k + wl.num_segments * cfg.k * cfg.m + wl.n_out * cfg.m
    floats += wl.num_pairs if wl.scale is not None else 0
    return 4 * floats + 3 * 8 * wl.num_pairs


def run_config(cfg: Config, target: CPUTarget, repeats: int) -> list[dict[str, object]]:
    wl = cfg.workload
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(wl.n_in, cfg.k, generator=gen)
    w = torch.randn(wl.num_segments, cfg.k, cfg.m, generator=gen) / cfg.k**0.5
    problem = GMSProblem.create(
        wl.gather, wl.segment, wl.scatter, wl.n_out, num_segments=wl.num_segments, reduce=wl.reduce
    )
    start = time.perf_counter()
    pl: GMSPlan = plan(problem)
    plan_s = time.perf_counter() - start

    # ATen: the same segment-sorted indices, the degree division precomputed (plan-time work)
    ends = pl.segment_ptr[1:].to(torch.int32)
    scale = wl.scale[pl.order] if wl.scale is not None else None
    degree = torch.bincount(wl.scatter, minlength=wl.n_out).clamp(min=1).float()
    row_scale = 1.0 / degree if wl.reduce == "mean" else None

    def aten(grouped: bool) -> Callable[[], torch.Tensor]:
        return lambda: gms_aten(
            x, w, pl.gather, pl.scatter, ends, wl.n_out, scale, grouped=grouped, row_scale=row_scale
        )

    impls: dict[str, Callable[[], object]] = {"aten per-segment mm": aten(False)}
    if grouped_mm_supported(x, w):
        impls["aten _grouped_mm"] = aten(True)
    strategies = enumerate_candidates(wl.reduce)
    for s in strategies:
        impls[s.name] = lambda s=s: gms(x, w, pl, wl.scale, s)
    impls.update(bare_gemms(x.index_select(0, pl.gather), w, pl.segment_ptr))

    expected = impls["aten per-segment mm"]()
    for name, fn in impls.items():  # every impl computes the same thing
        if name.startswith(FLOOR):
            continue
        got = fn()
        assert isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor)
        torch.testing.assert_close(got, expected, atol=2e-4, rtol=2e-4, msg=f"{cfg.label} {name}")

    times = time_blocks(impls, repeats)
    aten_best = min(times[n][0] for n in impls if n.startswith("aten"))
    floor_s = min(times[n][0] for n in impls if n.startswith(FLOOR))
    flops = 2 * wl.num_pairs * cfg.k * cfg.m
    nbytes = problem_bytes(cfg)
    bound_s = max(flops / target.peak("fp32"), nbytes / target.mem_bw_bytes_per_s)
    records = []
    for name, (median, q10, q90) in times.items():
        records.append(
            {
                "study": cfg.family,
                "problem": cfg.label,
                "pairs": wl.num_pairs,
                "segments": wl.num_segments,
                "K": cfg.k,
                "M": cfg.m,
                "reduce": wl.reduce,
                "impl": name,
                "median_s": median,
                "q10_s": q10,
                "q90_s": q90,
                "speedup": aten_best / median,
                "flops_per_s": flops / median,
                "bytes_per_s": nbytes / median,
                "fraction_of_roofline": bound_s / median,
                "over_floor": median / floor_s,
                "plan_s": plan_s,
            }
        )
    return records


# ---- numba vs C++: the (GMS)seg kernel in C++, same plan and register tile ----

_CPP = r"""
#include <torch/extension.h>
#include <omp.h>
#include <algorithm>

// The numba kernel's 4 x 16 register tile: acc[r][j] = sum_k X[row r, k] * W[s, k, m0 + j],
// with GCC vector types so that the 8 accumulators certainly live in ymm registers.
typedef float v8 __attribute__((vector_size(32), aligned(4)));
static inline void tile(const float* __restrict__ r0, const float* __restrict__ r1,
                        const float* __restrict__ r2, const float* __restrict__ r3,
                        const float* __restrict__ ws, int64_t K, int64_t M,
                        float (&acc)[4][16]) {
  v8 c00 = {}, c01 = {}, c10 = {}, c11 = {}, c20 = {}, c21 = {}, c30 = {}, c31 = {};
  for (int64_t k = 0; k < K; ++k) {
    const v8 w0 = *reinterpret_cast<const v8*>(ws + k * M);
    const v8 w1 = *reinterpret_cast<const v8*>(ws + k * M + 8);
    const float a0 = r0[k], a1 = r1[k], a2 = r2[k], a3 = r3[k];
    c00 += a0 * w0; c01 += a0 * w1; c10 += a1 * w0; c11 += a1 * w1;
    c20 += a2 * w0; c21 += a2 * w1; c30 += a3 * w0; c31 += a3 * w1;
  }
  *reinterpret_cast<v8*>(acc[0]) = c00; *reinterpret_cast<v8*>(acc[0] + 8) = c01;
  *reinterpret_cast<v8*>(acc[1]) = c10; *reinterpret_cast<v8*>(acc[1] + 8) = c11;
  *reinterpret_cast<v8*>(acc[2]) = c20; *reinterpret_cast<v8*>(acc[2] + 8) = c21;
  *reinterpret_cast<v8*>(acc[3]) = c30; *reinterpret_cast<v8*>(acc[3] + 8) = c31;
}

// Y[d[p], m] += X[g[p], k] W[s, k, m]; destination block b on one thread (no atomics)
torch::Tensor gms_seg(torch::Tensor x, torch::Tensor w, torch::Tensor gather, torch::Tensor scatter,
                      torch::Tensor tile_segment, torch::Tensor tile_start, torch::Tensor tile_end,
                      torch::Tensor block_ptr, int64_t n_out) {
  const int64_t K = x.size(1), M = w.size(2), B = block_ptr.size(0) - 1;
  TORCH_CHECK(M % 16 == 0, "this study kernel needs M % 16 == 0");
  auto out = torch::zeros({n_out, M}, x.options());
  const float* X = x.data_ptr<float>();
  const float* W = w.data_ptr<float>();
  float* Y = out.data_ptr<float>();
  const int64_t *g = gather.data_ptr<int64_t>(), *d = scatter.data_ptr<int64_t>();
  const int64_t *ts = tile_segment.data_ptr<int64_t>(), *lo = tile_start.data_ptr<int64_t>();
  const int64_t *hi = tile_end.data_ptr<int64_t>(), *bp = block_ptr.data_ptr<int64_t>();
  #pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    float acc[4][16];
    for (int64_t t = bp[b]; t < bp[b + 1]; ++t) {
      const float* ws = W + ts[t] * K * M;
      for (int64_t e = lo[t]; e < hi[t]; e += 4) {
        const int64_t n = std::min<int64_t>(4, hi[t] - e);
        const float* r[4];
        for (int i = 0; i < 4; ++i) r[i] = X + g[e + (i < n ? i : 0)] * K;
        for (int64_t m0 = 0; m0 < M; m0 += 16) {
          tile(r[0], r[1], r[2], r[3], ws + m0, K, M, acc);
          for (int64_t i = 0; i < n; ++i) {
            float* __restrict__ y = Y + d[e + i] * M + m0;
            #pragma GCC unroll 16
            for (int j = 0; j < 16; ++j) y[j] += acc[i][j];
          }
        }
      }
    }
  }
  return out;
}
"""


def backend_study(target: CPUTarget, repeats: int) -> list[dict[str, object]]:
    """Build both kernels from scratch (timed) and run them on AIFB, K = M in {16, 64}.

    ``build_s``: the C++ extension compiled into a fresh folder (g++ with the torch headers);
    the numba kernel's Python function compiled again without its cache, on its first call
    (its ``(GMS)seg`` specialisation).
    """
    # setuptools and the build machinery: only this study needs them (half a second to import)
    from torch.utils.cpp_extension import load_inline

    with tempfile.TemporaryDirectory() as build_dir:
        start = time.perf_counter()
        module = load_inline(
            name="fusekit_gms_seg_cpp",
            cpp_sources=_CPP,
            functions=["gms_seg"],
            extra_cflags=["-O3", "-march=native", "-ffp-contract=fast", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            build_directory=build_dir,
        )
        cpp_build_s = time.perf_counter() - start
    fresh = numba.njit(parallel=True, cache=False, fastmath=FASTMATH)(dataflow_kernel.py_func)
    start = time.perf_counter()
    tiny = plan(GMSProblem.create(*(torch.arange(3),) * 3, 3))
    x, w, out, one = (
        t.numpy()
        for t in (torch.zeros(3, 4), torch.zeros(3, 4, 4), torch.zeros(3, 4), torch.ones(1))
    )
    gather, scatter = tiny.gather.numpy(), tiny.scatter.numpy()
    tiles = [t.numpy() for t in (tiny.tile_segment, tiny.tile_start, tiny.tile_end, tiny.block_ptr)]
    # the (GMS)seg specialisation: gather indices, no groups or scratch, a scatter
    fresh(x, w, out, gather, None, None, None, scatter, one, *tiles, False, False)
    numba_build_s = time.perf_counter() - start
    wl = rgcn("aifb")
    pl = plan(GMSProblem.create(wl.gather, wl.segment, wl.scatter, wl.n_out, reduce="sum"))
    records: list[dict[str, object]] = []
    for k in (16, 64):
        x, w = torch.randn(wl.n_in, k), torch.randn(wl.num_segments, k, k)
        impls = {
            "numba (GMS)seg": lambda x=x, w=w: gms_seg_cpu(x, w, pl, None),
            "C++ (GMS)seg": lambda x=x, w=w: module.gms_seg(
                x,
                w,
                pl.gather,
                pl.scatter,
                pl.tile_segment,
                pl.tile_start,
                pl.tile_end,
                pl.block_ptr,
                pl.n_out,
            ),
        }
        torch.testing.assert_close(
            impls["C++ (GMS)seg"](), impls["numba (GMS)seg"](), atol=1e-3, rtol=1e-4
        )
        flops = 2 * wl.num_pairs * k * k
        for name, (median, q10, q90) in time_blocks(impls, repeats).items():
            records.append(
                {
                    "study": "backend",
                    "problem": f"aifb K={k} M={k}",
                    "impl": name,
                    "median_s": median,
                    "q10_s": q10,
                    "q90_s": q90,
                    "flops_per_s": flops / median,
                    "build_s": cpp_build_s if name.startswith("C++") else numba_build_s,
                }
            )
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15, help="calls per pass (2 passes)")
    parser.add_argument("--quick", action="store_true", help="two problems, 5 repeats")
    parser.add_argument("--backends", action="store_true", help="add the numba-vs-C++ study")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "gms_kernels_cpu.json"
    )
    args = parser.parse_args()
    repeats = 5 if args.quick else args.repeats
    target = detect(refresh=True)
    if not isinstance(target, CPUTarget):
        raise SystemExit("gms_kernels.py measures the CPU kernels; detect() gave no CPU target")

    records: list[dict[str, object]] = []
    for cfg in configs(args.quick):
        rows = run_config(cfg, target, repeats)
        records += rows
        best = max(
            (r for r in rows if not str(r["impl"]).startswith(("aten", FLOOR))),
            key=lambda r: r["speedup"],
        )
        print(
            f"{cfg.label:28s} best {best['impl']:26s} {1e3 * best['median_s']:8.2f} ms "
            f"speedup {best['speedup']:.2f}x  roofline {best['fraction_of_roofline']:.2f}  "
            f"x floor {best['over_floor']:.2f}",
            flush=True,
        )
    if args.backends:
        records += backend_study(target, repeats)
    path = write_results(
        args.out,
        benchmark="gms_kernels",
        title=TITLE,
        meta=run_metadata(target.to_dict()),
        plots=shown(PLOTS, records),
        tables=shown(TABLES, records),
        records=records,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
