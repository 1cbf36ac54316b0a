"""Tour section of ``fusekit.hw``: the presets, the measured local CPU and their rooflines."""

from __future__ import annotations

import numpy as np
import torch

from fusekit.console import binary_bytes, si
from fusekit.hw import Accelerator, CPUTarget, GPUTarget, detect, load, preset_names
from fusekit.hw.load import LOCAL_CPU, LOCAL_GPU
from fusekit.report.charts import pyplot
from fusekit.report.document import Figure, Section, Table
from fusekit.report.tour import TourOptions


def _has_cuda() -> bool:
    return torch.cuda.is_available()


def _roofline_figure(targets: list[CPUTarget | GPUTarget]) -> Figure:
    """Attainable FLOP/s against arithmetic intensity, fp32 (solid) and bf16 (dashed)."""
    plt = pyplot()
    intensity = np.logspace(-2, 4, 200)  # FLOP per byte of DRAM traffic
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, target in enumerate(targets):
        color = f"C{i}"
        for dtype, style in (("fp32", "-"), ("bf16", "--")):
            if dtype not in target.peak_flops_per_s:
                continue
            attainable = np.minimum(target.peak(dtype), intensity * target.mem_bw_bytes_per_s)
            label = f"{target.name} {dtype}"
            ax.loglog(intensity, attainable, style, color=color, label=label)
    ax.set_xlabel("arithmetic intensity (FLOP / DRAM byte)")
    ax.set_ylabel("attainable FLOP/s")
    ax.grid(which="both", alpha=0.25)
    ax.legend(fontsize=7, ncol=2)
    return Figure.from_matplotlib(
        "Rooflines",
        fig,
        caption="min(peak, intensity x bandwidth); cpu-local is measured, the GPUs are datasheet.",
    )


def build(options: TourOptions) -> Section:
    """The hardware section: preset tables and a roofline plot."""
    local = detect()
    compute: list[CPUTarget | GPUTarget] = [local]
    accels: list[Accelerator] = []
    for name in preset_names():
        if name == LOCAL_CPU or (name == LOCAL_GPU and not _has_cuda()):
            continue
        hw = load(name)
        if isinstance(hw, Accelerator):
            accels.append(hw)
        else:
            compute.append(hw)

    targets = Table(
        "CPU and GPU targets",
        (
            "name",
            "kind",
            "peak fp32",
            "peak bf16",
            "bandwidth",
            "ridge fp32 (FLOP/B)",
            "LLC",
            "launch",
        ),
        tuple(
            (
                t.name,
                t.kind,
                si(t.peak("fp32"), "FLOP/s"),
                si(t.peak_flops_per_s["bf16"], "FLOP/s") if "bf16" in t.peak_flops_per_s else "-",
                si(t.mem_bw_bytes_per_s, "B/s"),
                round(t.ridge_flops_per_byte("fp32"), 2),
                binary_bytes(t.last_level_cache_bytes),
                si(t.launch_overhead_s, "s"),
            )
            for t in compute
        ),
        note=f"cpu-local: {local.description}; {local.source}.",
    )
    accel_table = Table(
        "Spatial accelerators (COMET's arch files, as the accel model reads them)",
        (
            "name",
            "spatial hierarchy",
            "MACs/cycle",
            "peak",
            "DRAM B/cycle",
            "global buffer",
            "GB link B/cycle",
        ),
        tuple(
            (
                a.name,
                a.spatial(),
                a.macs_per_cycle,
                si(a.peak_flops_per_s, "FLOP/s"),
                a.level("DRAM").bw_bytes_per_cycle,
                binary_bytes(a.level("GB").capacity_bytes),
                a.level("GB").link_bw_bytes_per_cycle,
            )
            for a in accels
        ),
        note="`fusekit hw show edge` lists every level: capacity, access width, energy per "
        "access, bandwidth, mesh and link; the clock (1 GHz) is assumed.",
    )
    records = tuple({"name": t.name, **t.to_dict()} for t in [*compute, *accels])
    return Section(
        title="Hardware",
        summary=(
            "The targets every cost model reads. The local CPU is measured (a streaming copy "
            "and an fp32 GEMM, cached per machine); GPUs and accelerators come from datasheets "
            "and the COMET paper, as fusekit hw show NAME prints them."
        ),
        blocks=(targets, _roofline_figure(compute), accel_table),
        records=records,
    )
