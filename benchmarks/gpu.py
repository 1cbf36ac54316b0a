"""fusekit's Triton paths on a CUDA GPU, side by side with what a user would otherwise run.

Parts, each in this process, timed with CUDA events (median of ``--repeats`` calls after
warm-up calls, every call synchronised), each fusekit output checked against the peer's first:

* ``machine``: the GPU's copy bandwidth and GEMM FLOP/s per dtype (:func:`fusekit.hw.measure_gpu`),
  the ceilings of every roofline fraction below.
* ``rgcn``: one RGCN layer ``K -> K`` (per-relation mean, root weight, bias) forward and
  forward+backward on AIFB, MUTAG and the BGS-shaped graph, K in {16, 64, 256}: PyG's
  ``RGCNConv`` and ``FastRGCNConv``, the plain-ATen compositions of ``benchmarks/rgcn.py``, and
  ``fusekit.nn.RGCNConv`` with the selector's strategy and with every named gms strategy forced
  (the Triton kernels). ``roofline_fraction``: the layer's compulsory time (the larger of its
  compulsory bytes — features, weights, indices, output, each once — over the copy bandwidth and
  its fewest FLOPs over the fp32 GEMM rate) over the measured time.
* ``stitch``: the memory-bound subgraphs of :mod:`fusekit.stitch.workloads` on the GPU: eager,
  ``torch.compile`` (Inductor's Triton kernels) and fusekit's stitched Triton kernels from the
  ILP plan (``Stitched(..., backend="triton")``).
* ``spconv``: OpenPCDet's VoxelBackBone8x built from fusekit's layers, forward with every kernel
  map built, on the two shipped LiDAR scans and a 160k-voxel LiDAR-like scan: the gms strategy
  against spconv's per-offset algorithm in plain torch (``strategy="reference"``, the same maps).
* ``moe``: a two-layer Mixtral-shaped HF model (bf16) whose experts run through each registered
  experts implementation: prefill of 512 tokens and decode steps.

A part that fails is recorded with its error (``errors``) and the others go on.

Run: ``python benchmarks/gpu.py [--parts rgcn,stitch,spconv,moe] [--out FILE]``
-> ``benchmarks/results/gpu.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fusekit.report.records import Plot, Summary, run_metadata, write_results

#: What ``fusekit report build`` shows of the results file.
TITLE = (
    "fusekit's Triton kernels on a CUDA GPU against PyG, ATen compositions, torch.compile and "
    "transformers' experts implementations, with roofline fractions."
)
PLOTS = (
    Plot(title="RGCN layer on the GPU: speedup over PyG RGCNConv", x="problem",
         y="speedup_over_pyg", hue="impl", where={"part": "rgcn"}, log_y=True, ref=1.0),
    Plot(title="Stitched Triton kernels on the GPU: speedup over torch.compile", x="problem",
         y="speedup_over_compile", where={"part": "stitch", "impl": "fusekit"}, log_y=True,
         ref=1.0),
)  # fmt: skip
TABLES = (
    Summary(title="RGCN layer: speedup over PyG RGCNConv and roofline fraction",
            rows=["impl"], values=["speedup_over_pyg"], across="mode", where={"part": "rgcn"}),
    Summary(title="RGCN layer: fraction of the roofline", rows=["impl"],
            values=["roofline_fraction"], across="mode", where={"part": "rgcn"}),
    Summary(title="Stitched subgraphs", rows=["problem", "impl"],
            values=["median_s", "speedup_over_compile", "roofline_fraction"],
            where={"part": "stitch"}),
    Summary(title="VoxelBackBone8x forward, maps built", rows=["problem", "impl"],
            values=["median_s", "speedup_over_per_offset"], where={"part": "spconv"}),
    Summary(title="HF Mixtral experts implementations", rows=["problem", "impl"],
            values=["median_s", "max_rel_err"], where={"part": "moe"}),
)  # fmt: skip
DEVICE = torch.device("cuda")


def cuda_median_s(fn: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    """Median seconds of ``fn`` over ``repeats`` synchronised calls, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """``max |got - want| / max |want|`` in float64."""
    got, want = got.double(), want.double()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


# ---------------------------------------------------------------- machine


def machine_part() -> dict[str, Any]:
    """The GPU's name and measured ceilings."""
    from fusekit.hw.detect_gpu import _device_key, measure_gpu

    return {**_device_key(0), **measure_gpu(0)}


# ---------------------------------------------------------------- rgcn


def rgcn_part(machine: dict[str, Any], repeats: int, widths: tuple[int, ...]) -> list[dict]:
    """One layer forward and forward+backward per graph and width, every contender."""
    from fusekit.data import entities, entities_shaped

    graphs = [entities("aifb"), entities("mutag"), entities_shaped("bgs")]
    rows: list[dict[str, Any]] = []
    for g in graphs:
        for k in widths:
            try:
                rows += rgcn_problem(g, k, machine, repeats)
            except Exception as e:
                traceback.print_exc()
                rows.append({"part": "rgcn", "problem": f"{g.name} K={k}", "error": repr(e)})
            torch.cuda.empty_cache()
    return rows


def rgcn_problem(g: Any, k: int, machine: dict[str, Any], repeats: int) -> list[dict]:
    """Every contender on one graph and width, checked against PyG before timing."""
    from torch_geometric.nn import FastRGCNConv
    from torch_geometric.nn import RGCNConv as PygRGCNConv

    from fusekit.gms import NAMED_STRATEGIES
    from fusekit.nn.rgcn import RGCNConv
    from rgcn import aten_compositions  # benchmarks/rgcn.py

    torch.manual_seed(0)
    pyg = PygRGCNConv(k, k, g.num_relations).to(DEVICE)
    layers: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "pyg RGCNConv": lambda x: pyg(x, ei, et)
    }
    ei, et = g.edge_index.to(DEVICE), g.edge_type.to(DEVICE)
    if g.num_edges * k * k * 4 < 8e9:  # FastRGCNConv materialises an [E, K, M] weight
        fast = FastRGCNConv(k, k, g.num_relations).to(DEVICE)
        fast.load_state_dict(pyg.state_dict())
        layers["pyg FastRGCNConv"] = lambda x: fast(x, ei, et)
    layers.update(aten_compositions(dataclasses.replace(g, edge_index=ei, edge_type=et), pyg))
    for strategy in ["auto", *(str(s) for s in NAMED_STRATEGIES)]:
        ours = RGCNConv(k, k, g.num_relations, strategy=strategy).to(DEVICE)
        ours.load_state_dict(pyg.state_dict())
        layers[f"fusekit {strategy}"] = (lambda m: lambda x: m(x, ei, et))(ours)
    x = torch.randn(g.num_nodes, k, device=DEVICE)
    with torch.no_grad():
        want = layers["pyg RGCNConv"](x)
    errors: dict[str, str] = {}
    for name in list(layers):
        try:
            with torch.no_grad():
                err = relative_error(layers[name](x), want)
            if err > 1e-4:
                errors[name] = f"differs from PyG ({err:.2e})"
        except Exception as e:
            errors[name] = repr(e)[:300]
        if name in errors:
            print(f"  {g.name} K={k} {name}: left out: {errors[name]}", flush=True)
            layers.pop(name)
    xg = x.clone().requires_grad_(True)

    def fwd(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad():
                return fn(x)

        return run

    def fwd_bwd(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], object]:
        def run() -> object:
            out = fn(xg)
            out.backward(torch.ones_like(out))
            return out

        return run

    n, e, r = g.num_nodes, g.num_edges, g.num_relations
    compulsory_bytes = 4 * (2 * n * k + (r + 1) * k * k + k) + 8 * 3 * e
    fewest_flops = 2 * min(e, n * r) * k * k + 2 * n * k * k
    bw, peak = machine["copy_bytes_per_s"], machine["peak_flops_per_s"]["fp32"]
    rows: list[dict[str, Any]] = []
    for mode, wrap, factor in (("forward", fwd, 1), ("forward+backward", fwd_bwd, 3)):
        times = {name: cuda_median_s(wrap(fn), repeats) for name, fn in layers.items()}
        bound = max(factor * compulsory_bytes / bw, factor * fewest_flops / peak)
        for name, t in times.items():
            rows.append({
                "part": "rgcn", "problem": f"{g.name} K={k}", "mode": mode, "impl": name,
                "median_s": t, "speedup_over_pyg": times["pyg RGCNConv"] / t,
                "roofline_fraction": bound / t, "nodes": n, "edges": e, "relations": r,
            })  # fmt: skip
        print("    | " + ", ".join(f"{n} {t * 1e3:.3f}" for n, t in times.items()), flush=True)
        best = min((t, n) for n, t in times.items())
        print(f"  {g.name} K={k} {mode}: best {best[1]} {best[0] * 1e3:.3f} ms, fusekit auto "
              f"{times.get('fusekit auto', float('nan')) * 1e3:.3f} ms, pyg "
              f"{times['pyg RGCNConv'] * 1e3:.3f} ms", flush=True)  # fmt: skip
    rows += [{"part": "rgcn", "problem": f"{g.name} K={k}", "impl": name, "error": err}
             for name, err in errors.items()]  # fmt: skip
    return rows


# ---------------------------------------------------------------- stitch


def stitch_part(machine: dict[str, Any], repeats: int) -> list[dict]:
    """Eager, torch.compile and fusekit's stitched Triton kernels per workload."""
    from fusekit.stitch.workloads import NAMES

    rows: list[dict[str, Any]] = []
    for name in NAMES:
        try:
            rows += stitch_workload(name, machine, repeats)
        except Exception as e:
            traceback.print_exc()
            rows.append({"part": "stitch", "problem": name, "error": repr(e)[:300]})
    return rows


def _to(x: Any) -> Any:
    return x.to(DEVICE) if isinstance(x, torch.Tensor) else x


def _first(x: Any) -> torch.Tensor:
    return x[0] if isinstance(x, tuple) else x


def stitch_workload(name: str, machine: dict[str, Any], repeats: int) -> list[dict]:
    """One workload three ways, outputs checked against eager first."""
    from fusekit.hw import detect
    from fusekit.hw.detect_gpu import detect_gpu
    from fusekit.stitch.runner import Stitched
    from fusekit.stitch.workloads import load_workload

    w = load_workload(name)
    module = w.module.to(DEVICE)
    args = tuple(_to(a) for a in w.args)
    try:
        target = detect_gpu()
    except Exception:
        target = detect()
    with torch.no_grad():
        want = module(*args)
        torch._dynamo.reset()
        compiled = torch.compile(module)
        compiled(*args)
        stitched = Stitched(module, target, backend="triton")
        start = time.perf_counter()
        got = stitched(*args)
        plan_s = time.perf_counter() - start
        err = relative_error(_first(got), _first(want))
        fns = {"eager": lambda: module(*args), "compile": lambda: compiled(*args),
               "fusekit": lambda: stitched(*args)}  # fmt: skip
        times = {impl: cuda_median_s(fn, repeats) for impl, fn in fns.items()}
    _, planned = stitched.prepare(*args)
    fused_bytes = sum(gr.cost.dram_bytes for gr in planned.plan.groups)
    print(f"  {name}: eager {times['eager'] * 1e6:.1f} us, compile {times['compile'] * 1e6:.1f} "
          f"us, fusekit {times['fusekit'] * 1e6:.1f} us (err {err:.1e})", flush=True)  # fmt: skip
    return [
        {"part": "stitch", "problem": name, "impl": impl, "median_s": t,
         "speedup_over_compile": times["compile"] / t, "speedup_over_eager": times["eager"] / t,
         "roofline_fraction": fused_bytes / machine["copy_bytes_per_s"] / t,
         "kernels_fusekit": planned.plan.kernels, "max_rel_err": err, "first_call_s": plan_s}
        for impl, t in times.items()
    ]  # fmt: skip


# ---------------------------------------------------------------- spconv (a 3-D backbone)


def spconv_part(machine: dict[str, Any], repeats: int) -> list[dict]:
    """VoxelBackBone8x forward with every kernel map built, per scan: gms against per-offset."""
    import copy

    from fusekit.data.voxels import lidar_like, lidar_scan
    from fusekit.nn import SparseTensor, voxel_backbone_8x
    from networks import trained_looking  # benchmarks/networks.py

    torch.manual_seed(0)
    ours = trained_looking(voxel_backbone_8x(4)).to(DEVICE).eval()
    reference = copy.deepcopy(ours)
    for layer in reference.modules():
        if hasattr(layer, "strategy"):
            layer.strategy = "reference"
    rows: list[dict[str, Any]] = []
    for scan in [lidar_scan(n) for n in ("251370668", "251371071")] + [lidar_like(160_000)]:
        z, y, x = scan.spatial_shape
        shape = [max(z, 40) + 1, y, x]
        coords = scan.coords.int().to(DEVICE)
        feats = torch.randn(scan.num_voxels, 4, device=DEVICE)

        def forward(net: torch.nn.Module, inputs: tuple = (feats, coords, shape, scan.batch_size)
                    ) -> Callable[[], Any]:  # fmt: skip
            def run() -> Any:
                with torch.no_grad():
                    return net(SparseTensor(*inputs)).features

            return run

        fns = {"torch per-offset (spconv's algorithm)": forward(reference),
               "fusekit": forward(ours)}  # fmt: skip
        err = relative_error(fns["fusekit"](), fns["torch per-offset (spconv's algorithm)"]())
        times = {name: cuda_median_s(fn, repeats) for name, fn in fns.items()}
        base = times["torch per-offset (spconv's algorithm)"]
        print(f"  {scan.name}: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in times.items())
              + f" (err {err:.1e})", flush=True)  # fmt: skip
        rows += [{"part": "spconv", "problem": f"VoxelBackBone8x {scan.name}", "impl": name,
                  "median_s": t, "speedup_over_per_offset": base / t, "max_rel_err": err,
                  "voxels": scan.num_voxels} for name, t in times.items()]  # fmt: skip
    return rows


# ---------------------------------------------------------------- moe (HF experts)


def moe_part(repeats: int) -> list[dict]:
    """A 2-layer Mixtral-shaped model in bf16, prefill and decode per experts implementation."""
    import transformers

    import fusekit.nn.hf  # noqa: F401  (registers "fusekit")

    config = transformers.MixtralConfig(
        num_hidden_layers=2, vocab_size=32_000, hidden_size=4096, intermediate_size=14336,
        num_local_experts=8, num_experts_per_tok=2, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=4096,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(DEVICE):  # initialised on the GPU: seconds, not minutes
        model = transformers.MixtralForCausalLM(config).to(torch.bfloat16).eval()
    prompt = torch.randint(0, 32_000, (1, 512), device=DEVICE)
    rows: list[dict[str, Any]] = []
    with torch.no_grad():
        model.set_experts_implementation("eager")
        want = model(prompt).logits
        for impl in ("fusekit", "grouped_mm", "batched_mm", "eager"):
            try:
                model.set_experts_implementation(impl)
                err = relative_error(model(prompt).logits, want)
                prefill = cuda_median_s(lambda: model(prompt), repeats)
                out = model(prompt[:, :32], use_cache=True)
                cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)

                decode = cuda_median_s(
                    lambda t=token, c=cache: model(t, past_key_values=c, use_cache=True), repeats
                )
            except Exception as e:
                traceback.print_exc()
                rows.append({"part": "moe", "impl": impl, "error": repr(e)[:300]})
                continue
            print(f"  mixtral {impl}: prefill {prefill * 1e3:.2f} ms, decode {decode * 1e3:.2f} "
                  f"ms, err {err:.1e}", flush=True)  # fmt: skip
            rows += [{"part": "moe", "problem": f"Mixtral 2 layers bf16 {study}", "impl": impl,
                      "median_s": t, "max_rel_err": err}
                     for study, t in (("prefill 512", prefill), ("decode", decode))]  # fmt: skip
    return rows


# ---------------------------------------------------------------- main


def write(path: Path, records: list[dict[str, Any]], settings: dict[str, Any]) -> None:
    """The results file, with the plots whose part has records; the raw records beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".raw.json").write_text(json.dumps(records, default=str))
    parts = {r["part"] for r in records if "median_s" in r}
    plots = tuple(p for p in PLOTS if p.where["part"] in parts)
    tables = tuple(t for t in TABLES if t.where["part"] in parts)
    write_results(path, benchmark="gpu", title=TITLE, meta=run_metadata(), records=records,
                  settings=settings, plots=plots, tables=tables)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="rgcn,stitch,spconv,moe")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--widths", default="16,64,256")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "results" / "gpu.json")  # fmt: skip
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py: expected a CUDA device (torch sees none)")
    sys.path.insert(0, str(Path(__file__).parent))
    parts = args.parts.split(",")
    machine = machine_part()
    print(f"machine: {machine}", flush=True)
    records: list[dict[str, Any]] = []
    runs: dict[str, Callable[[], list[dict]]] = {
        "rgcn": lambda: rgcn_part(machine, args.repeats, tuple(map(int, args.widths.split(",")))),
        "stitch": lambda: stitch_part(machine, args.repeats),
        "moe": lambda: moe_part(args.repeats),
        "spconv": lambda: spconv_part(machine, args.repeats),
    }
    for part in parts:
        if part not in runs:
            continue
        print(f"== {part}", flush=True)
        try:
            records += runs[part]()
        except Exception as e:
            traceback.print_exc()
            records.append({"part": part, "error": repr(e)[:300]})
        write(args.out, records, {"machine": machine, "parts": parts, "repeats": args.repeats})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
