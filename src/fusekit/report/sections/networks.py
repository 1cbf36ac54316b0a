"""Tour section of whole networks: the peers' own entry points, run on gms.

A short version of ``benchmarks/networks.py``, on a laptop CPU in seconds:

* a Hugging Face Mixtral model (two layers, narrow) whose experts run through transformers'
  own ``set_experts_implementation("fusekit")``, against ``eager`` and ``grouped_mm``: greedy
  decoding, tokens checked equal, time per token;
* SECOND's ``VoxelBackBone8x`` built with spconv and converted by ``fusekit.nn.from_spconv``, on
  half of the shipped LiDAR scan: outputs checked against spconv, forward with maps built;
* PyG's AIFB entity-classification RGCN trained a few epochs with PyG's and fusekit's layers
  from the same parameters: the two loss curves and the time per epoch.

A part whose peer is not installed (the ``peers`` extra) is left out with a line saying so.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from fusekit.data import entities, lidar_scan
from fusekit.report.charts import bar_chart, line_chart
from fusekit.report.document import Section, Table, Text
from fusekit.report.tour import TourOptions
from fusekit.search.measure import time_call

#: The tour's Mixtral: two decoder layers, 8 experts of top-2, narrow enough for seconds.
MIXTRAL: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
}


def _installed(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


def _hf_rows(steps: int, repeats: int) -> list[dict[str, Any]]:
    import transformers

    import fusekit.nn.hf  # noqa: F401  (registers the "fusekit" experts implementation)

    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(transformers.MixtralConfig(**MIXTRAL))
    model.eval()  # type: ignore[no-untyped-call]
    prompt = torch.randint(0, MIXTRAL["vocab_size"], (1, 8))

    def decode(name: str) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            model.set_experts_implementation(name)
            with torch.no_grad():
                out = model.generate(
                    prompt, max_new_tokens=steps, min_new_tokens=steps, do_sample=False
                )
            return out  # type: ignore[no-any-return]

        return run

    want = decode("eager")()
    rows = []
    for name in ("fusekit", "grouped_mm", "eager"):
        try:
            same = bool(torch.equal(decode(name)(), want))
        except RuntimeError:  # a peer implementation this machine cannot run
            continue
        rows.append(
            {
                "network": "HF Mixtral, greedy decode",
                "impl": name,
                "median_s": time_call(decode(name), repeats).median_s / steps,
                "check": "same tokens" if same else "DIFFERENT tokens",
            }
        )
    return rows


def _backbone_rows(repeats: int) -> list[dict[str, Any]]:
    import spconv.pytorch as spconv

    from fusekit.nn import SparseTensor, from_spconv, voxel_backbone_8x

    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    scan = lidar_scan()
    x_mid = scan.coords[:, 3].float().median()
    coords = scan.coords[scan.coords[:, 3] < x_mid].int()  # the half of the scan left of centre
    torch.manual_seed(0)
    feats = torch.randn(len(coords), 4)
    shape = [max(scan.spatial_shape[0], 40) + 1, *scan.spatial_shape[1:]]
    net = voxel_backbone_8x(4, layers=spconv).eval()
    ours = from_spconv(net).eval()
    runs: dict[str, Callable[[], Any]] = {
        "spconv": lambda: net(spconv.SparseConvTensor(feats, coords, shape, 1)),
        "fusekit": lambda: ours(SparseTensor(feats, coords, shape, 1)),
    }
    with torch.no_grad():
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # spconv's CPU kernels race on several threads
        want = _sorted(runs["spconv"]())
        torch.set_num_threads(threads)
        got = _sorted(runs["fusekit"]())
        err = float((got - want).abs().max() / want.abs().max()) if len(want) else 0.0
        return [
            {
                "network": f"VoxelBackBone8x, {len(coords):,} voxels",
                "impl": name,
                "median_s": time_call(fn, repeats).median_s,
                "check": f"max rel. diff {err:.1e}" if name == "fusekit" else "",
            }
            for name, fn in runs.items()
        ]


def _sorted(t: Any) -> torch.Tensor:
    """Features in ``(b, z, y, x)`` order (spconv's CPU lists strided outputs as found)."""
    idx = t.indices.long()
    key = ((idx[:, 0] * 4096 + idx[:, 1]) * 4096 + idx[:, 2]) * 4096 + idx[:, 3]
    return t.features[torch.argsort(key)]  # type: ignore[no-any-return]


def _rgcn_rows(epochs: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from torch_geometric.nn import RGCNConv as PygRGCNConv

    from fusekit.nn import RGCNConv

    g = entities("aifb")
    rows, curves = [], []
    init = None
    for name, conv in (("pyg", PygRGCNConv), ("fusekit", RGCNConv)):
        torch.manual_seed(12345)
        net = torch.nn.ModuleList(
            [
                conv(g.num_nodes, 16, g.num_relations, num_bases=30),
                conv(16, g.num_classes, g.num_relations, num_bases=30),
            ]
        )
        init = init or {k: v.clone() for k, v in net.state_dict().items()}
        net.load_state_dict(init)
        opt = torch.optim.Adam(net.parameters(), lr=0.01, weight_decay=0.0005)
        times = []
        for epoch in range(1, epochs + 1):
            start = time.perf_counter()
            opt.zero_grad()
            h = torch.relu(net[0](None, g.edge_index, g.edge_type))
            out = net[1](h, g.edge_index, g.edge_type)
            loss = torch.nn.functional.cross_entropy(out[g.train_idx], g.train_y)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            times.append(time.perf_counter() - start)
            curves.append({"epoch": epoch, "impl": name, "loss": float(loss.detach())})
        rows.append(
            {
                "network": "RGCN on AIFB, one training epoch",
                "impl": name,
                "median_s": sorted(times)[len(times) // 2],
                "check": f"final loss {float(loss.detach()):.4f}",
            }
        )
    return rows, curves


def build(options: TourOptions) -> Section:
    """The networks section: HF MoE decoding, a sparse detection backbone, RGCN training."""
    repeats = 2 if options.quick else 5
    records: list[dict[str, Any]] = []
    blocks: list[Any] = [
        Text(
            "Whole networks through the entry points their users already use: transformers' "
            "experts interface (model.set_experts_implementation('fusekit'), the model's own "
            "modules and parameters untouched), an spconv network converted with "
            "fusekit.nn.from_spconv (same state_dict), and PyG's RGCN example with fusekit's "
            "RGCNConv. benchmarks/networks.py runs the full-size versions."
        )
    ]
    curves: list[dict[str, Any]] = []
    if _installed("transformers"):
        records += _hf_rows(8 if options.quick else 32, repeats)
    if _installed("spconv"):
        records += _backbone_rows(repeats)
    if _installed("torch_geometric"):
        rgcn, curves = _rgcn_rows(3 if options.quick else 20)
        records += rgcn
    if not records:
        blocks.append(Text("No peer is installed (pip install 'fusekit[peers]'): nothing to run."))
        return Section("networks: whole models on gms", "Needs the peers extra.", tuple(blocks))
    peers: dict[str, float] = {}
    for r in records:
        if r["impl"] != "fusekit":
            peers[r["network"]] = min(peers.get(r["network"], float("inf")), r["median_s"])
    for r in records:
        best = peers.get(r["network"])
        r["speedup_over_best_peer"] = best / r["median_s"] if best else None
    blocks.append(
        Table(
            "Median seconds (decode: per token) and fusekit's speedup over the best peer",
            ("network", "implementation", "median ms", "speedup", "check"),
            tuple(
                (
                    r["network"],
                    r["impl"],
                    round(1e3 * r["median_s"], 2),
                    round(r["speedup_over_best_peer"], 2) if r["impl"] == "fusekit" else "",
                    r["check"],
                )
                for r in records
            ),
        )
    )
    mine = [r for r in records if r["impl"] == "fusekit" and r["speedup_over_best_peer"]]
    if mine:
        blocks.append(
            bar_chart(
                "Speedup over the best peer", mine, x="network", y="speedup_over_best_peer", ref=1.0
            )
        )
    if curves:
        blocks.append(
            line_chart(
                "RGCN on AIFB: training loss per epoch, same initial parameters",
                curves,
                x="epoch",
                y="loss",
                hue="impl",
            )
        )
    return Section(
        title="networks: whole models on gms",
        summary=(
            "HF MoE decoding with the 'fusekit' experts implementation, SECOND's sparse "
            "backbone converted from spconv, and RGCN training, against the peers."
        ),
        blocks=tuple(blocks),
        records=tuple(records),
    )
