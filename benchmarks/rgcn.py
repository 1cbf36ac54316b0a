"""RGCN side by side on the CPU: PyG's RGCNConv and FastRGCNConv, ATen compositions, fusekit.

Graphs: the real AIFB and MUTAG knowledge graphs shipped in ``fusekit.data`` (with inverse
relations: 58,086 edges / 90 relations and 148,454 / 46), and a BGS-shaped synthetic graph
(333,845 nodes, 1,832,398 edges, 206 relations; :func:`fusekit.data.entities_shaped`).

Parts (each in one process, one implementation timed at a time, medians):

* ``layer``: one layer ``K -> M`` (``K = M`` in {16, 64}, per-relation mean, root weight, bias)
  forward, and forward+backward, on AIFB and MUTAG; also the featureless first layer
  (``x = None``, 16 outputs). Contenders: PyG ``RGCNConv`` (its relation loop; pyg-lib is not
  installed, as on a plain ``pip install torch_geometric``), PyG ``FastRGCNConv``, the best of
  three plain-ATen compositions a user would write (``index_select`` -> ``torch._grouped_mm`` or
  one ``mm`` per relation -> scale -> ``index_add_``; transform-first ``x @ [W_1 .. W_R]`` ->
  gather -> scale -> ``index_add_``), and ``fusekit.nn.RGCNConv`` (gms selector). All load the
  same parameters and are checked equal before timing.
* ``bgs``: a 2-layer RGCN (learned 16-wide node embeddings -> 16 -> 2) forward+backward on the
  BGS-shaped graph, each implementation in its own subprocess so that its peak RSS (``VmHWM``
  of ``/proc/self/status``) is its own.
* ``train``: the 2-layer entity-classification RGCN of PyG's example (featureless first layer,
  30 bases, hidden 16, Adam 0.01, weight decay 5e-4) on the real AIFB split, 50 epochs, fusekit
  and PyG from the same initial parameters and seed: test accuracy and seconds per epoch.

Run: ``.venv/bin/python benchmarks/rgcn.py [--quick] [--parts layer,bgs,train]``
-> ``benchmarks/results/rgcn_cpu.json`` and ``rgcn_cpu.png``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from fusekit.data import EntityGraph, entities
from fusekit.hw import CPUTarget, detect
from fusekit.nn.rgcn import RGCNConv
from fusekit.report.records import Plot, Summary, run_metadata, shown, write_results
from fusekit.search.measure import time_call

#: What ``fusekit report build`` shows of the results file.
TITLE = (
    "fusekit's RGCNConv against PyG's RGCNConv and FastRGCNConv and an ATen composition on "
    "AIFB and MUTAG (layer forward and forward+backward), a BGS-sized graph, and training to "
    "the same accuracy, on the CPU."
)
PLOTS = tuple(
    Plot(title=f"Speedup over PyG RGCNConv, one layer, {mode}", x="problem",
         y="speedup_over_pyg", hue="impl", where={"part": "layer", "mode": mode}, log_y=True,
         ref=1.0)
    for mode in ("forward", "forward+backward")
)  # fmt: skip
TABLES = (
    Summary(title="Speedup over PyG RGCNConv per implementation (over the layer problems)",
            rows=["impl"], values=["speedup_over_pyg"], across="mode",
            where={"part": "layer"}),
    Summary(title="BGS-sized graph and training runs", rows=["part", "problem", "impl"],
            values=["median_s", "peak_rss_bytes", "final_loss", "test_accuracy"],
            where={"part": ["bgs", "train"]}),
)  # fmt: skip


def time_impls(
    impls: dict[str, Callable[[], object]], repeats: int, budget_s: float
) -> dict[str, float]:
    """Median seconds per impl: one impl at a time, a warm-up call, then up to ``repeats``."""
    return {
        name: time_call(fn, repeats, max_total_s=budget_s).median_s for name, fn in impls.items()
    }


def aten_compositions(
    g: EntityGraph, conv: torch.nn.Module
) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """The plain-ATen compositions of one mean-aggregated RGCN layer, with ``conv``'s weights."""
    src, dst = g.edge_index
    rel = g.edge_type
    relations = g.num_relations
    key = dst * relations + rel
    scale = 1.0 / torch.bincount(key, minlength=g.num_nodes * relations)[key].float()
    order = torch.argsort(rel, stable=True)
    ends = torch.cumsum(torch.bincount(rel, minlength=relations), 0).to(torch.int32)
    gather, scatter, scale_sorted = src[order], dst[order], scale[order]
    n = g.num_nodes

    def finish(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out + x @ conv.root + conv.bias

    bounds = [0, *ends.tolist()]

    def gathered(grouped: bool) -> Callable[[torch.Tensor], torch.Tensor]:
        def run(x: torch.Tensor) -> torch.Tensor:
            rows = x.index_select(0, gather)
            if grouped:
                products = torch._grouped_mm(rows, conv.weight, offs=ends)
            else:
                products = torch.cat(
                    [
                        rows[a:b] @ conv.weight[r]
                        for r, (a, b) in enumerate(itertools.pairwise(bounds))
                    ]
                )
            products = products * scale_sorted[:, None]
            return finish(x, x.new_zeros(n, products.shape[1]).index_add_(0, scatter, products))

        return run

    def transform_first(x: torch.Tensor) -> torch.Tensor:
        k, m = conv.weight.shape[1:]
        h = (x @ conv.weight.permute(1, 0, 2).reshape(k, relations * m)).view(-1, m)
        rows = h.index_select(0, src * relations + rel) * scale[:, None]
        return finish(x, x.new_zeros(n, m).index_add_(0, dst, rows))

    return {
        "aten gather-grouped_mm-scatter": gathered(True),
        "aten gather-mm per relation-scatter": gathered(False),
        "aten transform-first": transform_first,
    }


def layer_part(
    graphs: list[EntityGraph], widths: tuple[int, ...], repeats: int, budget_s: float
) -> list[dict[str, object]]:
    """One layer forward and forward+backward, every contender, per graph and width."""
    rows: list[dict[str, object]] = []
    for g in graphs:
        for k in (*widths, 0):
            rows += layer_problem(g, k, repeats, budget_s)
    return rows


def layer_problem(g: EntityGraph, k: int, repeats: int, budget_s: float) -> list[dict[str, object]]:
    """Every contender on one graph and width (``k = 0``: the featureless layer)."""
    from torch_geometric.nn import FastRGCNConv
    from torch_geometric.nn import RGCNConv as PygRGCNConv

    featureless = k == 0
    k_in, m = (g.num_nodes, 16) if featureless else (k, k)
    torch.manual_seed(0)
    pyg = PygRGCNConv(k_in, m, g.num_relations)
    fast = FastRGCNConv(k_in, m, g.num_relations)
    ours = RGCNConv(k_in, m, g.num_relations)
    fast.load_state_dict(pyg.state_dict())
    ours.load_state_dict(pyg.state_dict())
    x = None if featureless else torch.randn(g.num_nodes, k)
    ei, et = g.edge_index, g.edge_type
    layers: dict[str, Callable[[torch.Tensor | None], torch.Tensor]] = {
        "pyg RGCNConv": lambda x: pyg(x, ei, et),
        "pyg FastRGCNConv": lambda x: fast(x, ei, et),
        "fusekit RGCNConv": lambda x: ours(x, ei, et),
    }
    if not featureless:
        for name, fn in aten_compositions(g, pyg).items():
            layers[name] = fn  # type: ignore[assignment]
    if featureless or g.num_edges * k_in * m > 2e9:
        layers.pop("pyg FastRGCNConv")  # materialises an [E, K, M] weight: too large
    expected = layers["pyg RGCNConv"](x).detach()
    for name, fn in layers.items():
        got = fn(x).detach()
        err = float((got - expected).abs().max() / expected.abs().max())
        if err > 1e-4:
            raise SystemExit(f"{g.name} K={k}: {name} differs from PyG ({err:.2e})")
    params = list(pyg.parameters())
    xg = None if x is None else x.clone().requires_grad_(True)

    def fwd(fn: Callable[..., torch.Tensor]) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad():
                return fn(x)

        return run

    def fwd_bwd(fn: Callable[..., torch.Tensor]) -> Callable[[], object]:
        def run() -> object:
            out = fn(xg)
            out.sum().backward()
            for p in (*params, *ours.parameters(), *fast.parameters()):
                p.grad = None
            return out

        return run

    rows: list[dict[str, object]] = []
    label = f"{g.name} {'featureless' if featureless else f'K=M={k}'}"
    for mode, wrap in (("forward", fwd), ("forward+backward", fwd_bwd)):
        times = time_impls({n: wrap(f) for n, f in layers.items()}, repeats, budget_s)
        aten = min((t for n, t in times.items() if n.startswith("aten")), default=None)
        for name, t in times.items():
            rows.append(
                {
                    "part": "layer",
                    "problem": label,
                    "mode": mode,
                    "impl": name,
                    "median_s": t,
                    "speedup_over_pyg": times["pyg RGCNConv"] / t,
                    "speedup_over_best_aten": aten / t if aten else None,
                    "selected": ours._plans._entries[-1][3][0].strategy
                    if name == "fusekit RGCNConv" and not featureless
                    else None,
                }
            )
        ours_t = times["fusekit RGCNConv"]
        print(
            f"{label:22s} {mode:17s} pyg {1e3 * times['pyg RGCNConv']:9.2f} ms  "
            f"best aten {1e3 * aten if aten else float('nan'):8.2f} ms  "
            f"fusekit {1e3 * ours_t:8.2f} ms  x{times['pyg RGCNConv'] / ours_t:.1f} "
            f"over pyg" + (f", x{aten / ours_t:.2f} over aten" if aten else ""),
            flush=True,
        )
    return rows


_BGS_CHILD = r"""
import json, sys, time, torch
from fusekit.data import entities_shaped
def hwm():  # this process's peak RSS in bytes (VmHWM; ru_maxrss keeps the parent's across exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
impl, scale = sys.argv[1], float(sys.argv[2])
g = entities_shaped("bgs", seed=0, scale=scale)
if impl == "pyg RGCNConv":
    from torch_geometric.nn import RGCNConv
else:
    from fusekit.nn import RGCNConv
torch.manual_seed(0)
emb = torch.nn.Parameter(torch.randn(g.num_nodes, 16))
l1, l2 = RGCNConv(16, 16, g.num_relations), RGCNConv(16, 2, g.num_relations)
def step():
    h = torch.relu(l1(emb, g.edge_index, g.edge_type))
    out = l2(h, g.edge_index, g.edge_type)
    loss = torch.nn.functional.cross_entropy(out[g.train_idx], g.train_y)
    loss.backward()
    return float(loss)
base = hwm()
times = []
for _ in range(3):
    t = time.perf_counter(); loss = step(); times.append(time.perf_counter() - t)
peak = hwm()
print(json.dumps({"times_s": times, "loss": loss, "peak_rss_bytes": peak,
                  "rss_before_bytes": base, "nodes": g.num_nodes, "edges": g.num_edges}))
"""


def bgs_part(scale: float) -> list[dict[str, object]]:
    """2-layer RGCN forward+backward on the BGS-shaped graph, one subprocess per impl."""
    rows: list[dict[str, object]] = []
    for impl in ("fusekit RGCNConv", "pyg RGCNConv"):
        done = subprocess.run(
            [sys.executable, "-c", _BGS_CHILD, impl, str(scale)],
            capture_output=True,
            text=True,
            check=True,
        )
        result = json.loads(done.stdout.strip().splitlines()[-1])
        median = statistics.median(result["times_s"][1:])
        rows.append(
            {
                "part": "bgs",
                "problem": f"bgs-shaped x{scale} 2-layer 16-16-2",
                "mode": "forward+backward",
                "impl": impl,
                "median_s": median,
                "peak_rss_bytes": result["peak_rss_bytes"],
                "rss_before_bytes": result["rss_before_bytes"],
                "nodes": result["nodes"],
                "edges": result["edges"],
                "loss": result["loss"],
            }
        )
        print(
            f"bgs x{scale} {impl:18s} fwd+bwd {median:7.2f} s  peak RSS "
            f"{result['peak_rss_bytes'] / 2**30:5.2f} GiB (before the first step "
            f"{result['rss_before_bytes'] / 2**30:5.2f} GiB)",
            flush=True,
        )
    return rows


def train_part(epochs: int) -> list[dict[str, object]]:
    """PyG's AIFB example (featureless, 30 bases, hidden 16) with PyG and fusekit layers."""
    from torch_geometric.nn import RGCNConv as PygRGCNConv

    g = entities("aifb")
    rows: list[dict[str, object]] = []
    torch.manual_seed(12345)
    init = None
    for impl, conv in (("pyg RGCNConv", PygRGCNConv), ("fusekit RGCNConv", RGCNConv)):
        torch.manual_seed(12345)
        net = torch.nn.ModuleList(
            [
                conv(g.num_nodes, 16, g.num_relations, num_bases=30),
                conv(16, g.num_classes, g.num_relations, num_bases=30),
            ]
        )
        if init is None:
            init = {k: v.clone() for k, v in net.state_dict().items()}
        net.load_state_dict(init)
        opt = torch.optim.Adam(net.parameters(), lr=0.01, weight_decay=0.0005)
        times = []
        for _ in range(epochs):
            start = time.perf_counter()
            net.train()
            opt.zero_grad()
            h = torch.relu(net[0](None, g.edge_index, g.edge_type))
            out = net[1](h, g.edge_index, g.edge_type)
            loss = torch.nn.functional.cross_entropy(out[g.train_idx], g.train_y)
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - start)
        with torch.no_grad():
            h = torch.relu(net[0](None, g.edge_index, g.edge_type))
            pred = net[1](h, g.edge_index, g.edge_type).argmax(-1)
        acc = float((pred[g.test_idx] == g.test_y).float().mean())
        train_acc = float((pred[g.train_idx] == g.train_y).float().mean())
        rows.append(
            {
                "part": "train",
                "problem": f"aifb 2-layer featureless, 30 bases, {epochs} epochs",
                "mode": "train",
                "impl": impl,
                "median_s": statistics.median(times),
                "test_accuracy": acc,
                "train_accuracy": train_acc,
                "final_loss": float(loss.detach()),
            }
        )
        print(
            f"train aifb {impl:18s} {1e3 * statistics.median(times):8.1f} ms/epoch  "
            f"test acc {acc:.3f}  train acc {train_acc:.3f}  loss {float(loss.detach()):.4f}",
            flush=True,
        )
    return rows


def plot(records: list[dict[str, object]], path: Path) -> None:
    """Speedup over PyG RGCNConv per problem, forward and forward+backward."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layer = [r for r in records if r["part"] == "layer"]
    problems = list(dict.fromkeys(str(r["problem"]) for r in layer))
    impls = [i for i in dict.fromkeys(str(r["impl"]) for r in layer) if i != "pyg RGCNConv"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    for ax, mode in zip(axes, ("forward", "forward+backward"), strict=True):
        width = 0.8 / len(impls)
        for i, impl in enumerate(impls):
            ys = []
            for p in problems:
                hit = [
                    r
                    for r in layer
                    if r["problem"] == p and r["mode"] == mode and r["impl"] == impl
                ]
                ys.append(float(hit[0]["speedup_over_pyg"]) if hit else 0.0)
            ax.bar([j + i * width for j in range(len(problems))], ys, width, label=impl)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(problems))], problems, rotation=30)
        ax.set_yscale("log")
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.set_title(f"{mode}: speedup over PyG RGCNConv")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="layer,bgs,train")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--budget", type=float, default=4.0, help="seconds per impl and problem")
    parser.add_argument("--quick", action="store_true", help="AIFB K=16 only, BGS x0.1, 5 epochs")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "rgcn_cpu.json"
    )
    args = parser.parse_args()
    target = detect(refresh=True)
    if not isinstance(target, CPUTarget):
        raise SystemExit("rgcn.py measures the CPU; detect() gave no CPU target")
    parts = set(args.parts.split(","))
    records: list[dict[str, object]] = []
    if "layer" in parts:
        graphs = [entities("aifb")] if args.quick else [entities("aifb"), entities("mutag")]
        widths = (16,) if args.quick else (16, 64)
        records += layer_part(graphs, widths, 3 if args.quick else args.repeats, args.budget)
    if "bgs" in parts:
        records += bgs_part(0.1 if args.quick else 1.0)
    if "train" in parts:
        records += train_part(5 if args.quick else 50)
    path = write_results(
        args.out,
        benchmark="rgcn",
        title=TITLE,
        meta=run_metadata(target.to_dict()),
        settings={"threads": torch.get_num_threads(), "pyg_lib": False},
        plots=shown(PLOTS, records),
        tables=shown(TABLES, records),
        records=records,
    )
    if any(r["part"] == "layer" for r in records):
        plot(records, args.out.with_suffix(".png"))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
