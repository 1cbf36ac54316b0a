"""Tour section of ``fusekit.nn``: the drop-in layers against the peers users run today.

A short version of ``benchmarks/rgcn.py`` and ``benchmarks/moe.py`` (and of
``benchmarks/spconv.py`` when the sparse-convolution layers are present): each layer checked
equal to its peer, then timed side by side in this process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from fusekit.data import entities, lidar_scan
from fusekit.data.tokens import moe_batch
from fusekit.nn import MoE, RGCNConv, SparseTensor, SubMConv3d
from fusekit.report.charts import bar_chart
from fusekit.report.document import Section, Table, Text
from fusekit.report.tour import TourOptions
from fusekit.search.measure import time_call


def _rgcn_rows(repeats: int) -> list[dict[str, Any]]:
    g = entities("aifb")
    torch.manual_seed(0)
    x = torch.randn(g.num_nodes, 16)
    ours = RGCNConv(16, 16, g.num_relations)
    impls: dict[str, Callable[[], torch.Tensor]] = {
        "fusekit RGCNConv": lambda: ours(x, g.edge_index, g.edge_type)
    }
    try:
        from torch_geometric.nn import RGCNConv as PygRGCNConv  # the optional 'peers' extra
    except ImportError:
        pyg = None
    else:
        pyg = PygRGCNConv(16, 16, g.num_relations)
        pyg.load_state_dict(ours.state_dict())
        impls["pyg RGCNConv"] = lambda: pyg(x, g.edge_index, g.edge_type)
    rows = []
    with torch.no_grad():
        expected = impls["pyg RGCNConv"]() if pyg is not None else None
        for name, fn in impls.items():
            err = float((fn() - expected).abs().max()) if expected is not None else None
            t = time_call(
                fn, repeats if name.startswith("fusekit") else max(1, repeats // 4)
            ).median_s
            rows.append({"layer": "RGCN (AIFB, K=M=16)", "impl": name, "median_s": t, "err": err})
    return rows


def _hf_experts(moe: Any) -> Any:
    """HF's ``MixtralExperts`` with ``moe``'s weights, or None without transformers."""
    try:
        from transformers import MixtralConfig  # the optional 'peers' extra
        from transformers.models.mixtral.modeling_mixtral import MixtralExperts
    except ImportError:
        return None
    # transformers warns about a standalone experts module, which is what is wanted here
    logging.getLogger("transformers").setLevel(logging.ERROR)
    config = MixtralConfig(
        hidden_size=moe.hidden_size,
        intermediate_size=moe.ffn_size,
        num_local_experts=moe.num_experts,
    )
    hf = MixtralExperts(config)
    with torch.no_grad():
        hf.gate_up_proj.copy_(moe.w_gate_up.transpose(1, 2))
        hf.down_proj.copy_(moe.w_down.transpose(1, 2))
    return hf


def _moe_rows(repeats: int) -> list[dict[str, Any]]:
    hidden, ffn, experts, top_k = 512, 1024, 8, 2
    rows = []
    for tokens in (1, 256):
        batch = moe_batch(tokens, hidden, experts, top_k, skew=1.0, seed=tokens)
        weights, chosen = batch.route()
        moe = MoE(hidden, ffn, experts, top_k)
        impls: dict[str, Callable[[], torch.Tensor]] = {
            "fusekit MoE": partial(moe.experts, batch.x, chosen, weights)
        }
        hf = _hf_experts(moe)
        if hf is not None:
            impls["HF Mixtral experts loop"] = partial(hf, batch.x, chosen, weights)
        with torch.no_grad():
            expected = impls.get("HF Mixtral experts loop", impls["fusekit MoE"])()
            for name, fn in impls.items():
                err = float((fn() - expected).abs().max())
                t = time_call(fn, repeats).median_s
                rows.append(
                    {
                        "layer": f"MoE 8x2 h{hidden} f{ffn}, {tokens} tokens",
                        "impl": name,
                        "median_s": t,
                        "err": err,
                    }
                )
    return rows


def _moe_train_rows(repeats: int, tokens: int = 16) -> list[dict[str, Any]]:
    """A training step of the experts: fusekit's own backward against autograd through HF's loop.

    Gradients of ``x``, the routing weights and the expert weights; the rows' ``err`` compares
    the first two.
    """
    hidden, ffn, experts, top_k = 512, 1024, 8, 2
    batch = moe_batch(tokens, hidden, experts, top_k, skew=1.0, seed=tokens)
    weights, chosen = batch.route()
    moe = MoE(hidden, ffn, experts, top_k)
    x = batch.x.clone().requires_grad_()
    w = weights.clone().requires_grad_()
    dy = torch.randn_like(x)
    modules: dict[str, torch.nn.Module] = {"fusekit MoE": moe}
    steps: dict[str, Callable[[], object]] = {
        "fusekit MoE": lambda: moe.experts(x, chosen, w).backward(dy)
    }
    hf = _hf_experts(moe)
    if hf is not None:
        modules["HF Mixtral experts loop"] = hf
        steps["HF Mixtral experts loop"] = lambda: hf(x, chosen, w).backward(dy)

    def fresh(name: str) -> Callable[[], object]:
        def step() -> object:  # every step from grad = None, as after zero_grad()
            for t in (x, w, *modules[name].parameters()):
                t.grad = None
            return steps[name]()

        return step

    grads = {}
    for name in steps:
        fresh(name)()
        grads[name] = torch.cat([x.grad.reshape(-1), w.grad.reshape(-1)])  # type: ignore[union-attr]
    expected = grads.get("HF Mixtral experts loop", grads["fusekit MoE"])
    return [
        {
            "layer": f"MoE 8x2 h{hidden} f{ffn}, {tokens} tokens, forward+backward",
            "impl": name,
            "median_s": time_call(fresh(name), repeats).median_s,
            "err": float((grads[name] - expected).abs().max()),
        }
        for name in steps
    ]


def _conv_rows(repeats: int) -> list[dict[str, Any]]:
    scan = lidar_scan()
    torch.manual_seed(0)
    x = torch.randn(scan.coords.shape[0], 32)
    ours = SubMConv3d(32, 32, 3, bias=False)
    impls: dict[str, Callable[[], torch.Tensor]] = {
        "fusekit SubMConv3d": lambda: (
            ours(SparseTensor(x, scan.coords, scan.spatial_shape, 1)).features
        )
    }
    try:
        import spconv.pytorch as spconv  # the optional 'peers' extra
    except ImportError:
        peer = None
    else:
        # spconv asks torch.fx whether it is tracing, and torch logs a notice about that API
        logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
        peer = spconv.SubMConv3d(32, 32, 3, bias=False)
        peer.load_state_dict(ours.state_dict())
        impls["spconv SubMConv3d"] = lambda: (
            peer(spconv.SparseConvTensor(x, scan.coords, list(scan.spatial_shape), 1)).features
        )
    rows = []
    with torch.no_grad():
        if peer is None:
            expected = impls["fusekit SubMConv3d"]()
        else:  # spconv's CPU kernels race on several threads: its 1-thread answer
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            expected = impls["spconv SubMConv3d"]()
            torch.set_num_threads(threads)
        for name, fn in impls.items():
            err = float((fn() - expected).abs().max())
            rows.append(
                {
                    "layer": f"SubMConv3d (real scan, {scan.coords.shape[0]} voxels, C=32)",
                    "impl": name,
                    "median_s": time_call(fn, repeats).median_s,
                    "err": err,
                }
            )
    return rows


def build(options: TourOptions) -> Section:
    """The nn section: RGCN, sparse-convolution and MoE layers beside PyG, spconv and HF."""
    repeats = 3 if options.quick else 9
    records = (
        _rgcn_rows(repeats) + _conv_rows(repeats) + _moe_rows(repeats) + _moe_train_rows(repeats)
    )
    peers = {r["layer"]: r["median_s"] for r in records if not str(r["impl"]).startswith("fusekit")}
    for r in records:
        r["speedup_over_peer"] = peers[r["layer"]] / r["median_s"] if r["layer"] in peers else None
    table = Table(
        "Median time per layer and implementation (forward unless named, fp32, this machine)",
        ("layer", "implementation", "median ms", "speedup over the peer", "max |diff| vs peer"),
        tuple(
            (
                r["layer"],
                r["impl"],
                round(1e3 * r["median_s"], 3),
                round(r["speedup_over_peer"], 2) if r["speedup_over_peer"] else "",
                f"{r['err']:.1e}" if r["err"] is not None else "",
            )
            for r in records
        ),
        note=(
            "Peers: torch_geometric's RGCNConv (its relation loop; no pyg-lib), spconv 2.3.8's "
            "CPU SubMConv3d (map built per call for both; compared with its one-thread answer, "
            "since its CPU kernels race on several threads) and the expert loop of "
            "transformers' MixtralExperts on the same routing. Timings on a shared machine are "
            "noisy; benchmarks/rgcn.py, spconv.py and moe.py give the full runs."
        ),
    )
    fused = [r for r in records if str(r["impl"]).startswith("fusekit") and r["speedup_over_peer"]]
    blocks: tuple[Any, ...] = (
        Text(
            "fusekit.nn.RGCNConv takes PyG's parameters (a PyG state_dict loads as it is) and "
            "runs the whole relation sum as one g-mm-s chosen by the gms selector; SubMConv3d and "
            "SparseConv3d take spconv's weights and build their kernel maps with a numba hash; "
            "fusekit.nn.MoE "
            "runs Mixtral's router and SwiGLU experts over expert segments, or at decode-sized "
            "batches in one fused call; the same kernels run the experts of HF models through "
            "set_experts_implementation('fusekit') (the networks section)."
        ),
        table,
    )
    if fused:
        blocks += (
            bar_chart("Speedup over the peer", fused, x="layer", y="speedup_over_peer", ref=1.0),
        )
    return Section(
        title="nn: RGCN, sparse convolution and MoE layers",
        summary=(
            "Drop-in PyTorch layers on the gms engine, equal to PyG's RGCNConv, spconv's "
            "sparse convolutions and HF Mixtral's sparse MoE block."
        ),
        blocks=blocks,
        records=tuple(records),
    )
