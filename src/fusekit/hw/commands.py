"""``fusekit hw``: list, show and detect hardware descriptions."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from fusekit.console import binary_bytes, err_console, print_json, print_table, si
from fusekit.hw.accel import Accelerator
from fusekit.hw.cpu_gpu import CPUTarget, GPUTarget
from fusekit.hw.detect import detect as run_detect
from fusekit.hw.load import LOCAL_CPU, LOCAL_GPU, Hardware, load, preset_names

app = typer.Typer(
    help="Hardware descriptions: CPU/GPU targets and spatial accelerators.", no_args_is_help=True
)

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _summary_rows(hw: Hardware) -> list[tuple[str, str]]:
    """(field, value) rows of a description, with units people read."""
    rows = [
        ("name", hw.name),
        ("kind", hw.kind),
        ("description", hw.description),
        ("source", hw.source),
    ]
    if isinstance(hw, CPUTarget | GPUTarget):
        rows += [
            (f"peak {dtype}", si(flops, "FLOP/s")) for dtype, flops in hw.peak_flops_per_s.items()
        ]
        rows += [
            ("memory bandwidth", si(hw.mem_bw_bytes_per_s, "B/s")),
            ("memory", si(hw.mem_bytes, "B")),
            ("ridge point fp32", f"{hw.ridge_flops_per_byte('fp32'):.3g} FLOP/B"),
            ("launch overhead", si(hw.launch_overhead_s, "s")),
        ]
    if isinstance(hw, CPUTarget):
        rows += [
            ("cores (torch threads)", str(hw.cores)),
            ("hardware threads", str(hw.threads)),
            ("L1d / core", binary_bytes(hw.l1d_bytes)),
            ("L2 / core", binary_bytes(hw.l2_bytes)),
            ("L3", binary_bytes(hw.l3_bytes) if hw.l3_bytes else "none"),
            ("SIMD width", f"{hw.simd_width_bits} bit"),
        ]
    if isinstance(hw, GPUTarget):
        rows += [
            ("SMs", str(hw.sm_count)),
            ("shared memory / SM", binary_bytes(hw.shared_mem_per_sm_bytes)),
            ("L2", binary_bytes(hw.l2_bytes)),
            ("registers / SM", str(hw.registers_per_sm)),
            ("threads / SM", str(hw.max_threads_per_sm)),
            ("clock", si(hw.clock_hz, "Hz")),
        ]
    if isinstance(hw, Accelerator):
        s = hw.systolic
        net = hw.network
        rows += [
            ("clusters", f"{hw.mesh_rows}x{hw.mesh_cols} {net.topology}"),
            (
                "systolic arrays / cluster",
                f"{s.grid_rows}x{s.grid_cols} arrays of {s.pe_rows}x{s.pe_cols} PEs",
            ),
            ("SIMD width", str(hw.simd_width)),
            ("peak (2 FLOP/MAC)", si(hw.peak_flops_per_s, "FLOP/s")),
            ("clock", si(hw.clock_hz, "Hz")),
            (
                "network link",
                f"{net.link_bw_bytes_per_cycle:g} B/cycle, "
                f"{net.hop_latency_cycles} cycles/hop, {net.channel_bits}-bit",
            ),
            (
                "in-network broadcast / reduction",
                f"{net.in_network_broadcast} / {net.in_network_reduction}",
            ),
            ("MAC energy", f"{hw.mac_pj:g} pJ"),
            ("SIMD energy", ", ".join(f"{k} {v:g} pJ" for k, v in hw.simd_op_pj.items())),
            (
                "SIMD cycles",
                ", ".join(
                    f"{op} {hw.simd_cycles(op)}"
                    for op in [*hw.simd_op_cycles, "row_sum", "row_max"]
                ),
            ),
        ]
    return rows


def _level_rows(hw: Accelerator) -> list[tuple[Any, ...]]:
    return [
        (
            lv.name,
            binary_bytes(lv.size_bytes) if lv.size_bytes else "-",
            f"{lv.bw_bytes_per_cycle:g}" if lv.bw_bytes_per_cycle else "not limiting",
            f"{lv.read_pj:g} / {lv.write_pj:g}",
            "yes" if lv.double_buffered else "no",
        )
        for lv in hw.levels
    ]


def _show(hw: Hardware, as_json: bool) -> None:
    if as_json:
        print_json(hw.to_dict())
        return
    print_table(f"{hw.name}", ("field", "value"), _summary_rows(hw))
    if isinstance(hw, Accelerator):
        print_table(
            f"{hw.name} memory levels (per cluster; energy per {hw.word_bytes}-byte word)",
            ("level", "size", "B/cycle", "read / write pJ", "double-buffered"),
            _level_rows(hw),
        )


@app.command("list")
def list_(as_json: JsonOption = False) -> None:
    """List the hardware presets."""
    rows = []
    for name in preset_names():
        if name in (LOCAL_CPU, LOCAL_GPU):
            kind = "cpu" if name == LOCAL_CPU else "gpu"
            rows.append(
                {"name": name, "kind": kind, "description": f"this machine's {kind}, measured"}
            )
            continue
        hw = load(name)
        rows.append({"name": name, "kind": hw.kind, "description": hw.description})
    if as_json:
        print_json(rows)
    else:
        print_table(
            "hardware presets", ("name", "kind", "description"), [tuple(r.values()) for r in rows]
        )


@app.command()
def show(
    name: Annotated[
        str, typer.Argument(help="A preset name (see `fusekit hw list`) or a YAML file.")
    ],
    as_json: JsonOption = False,
) -> None:
    """Show one hardware description."""
    if name.lower() in (LOCAL_CPU, LOCAL_GPU):
        with err_console.status(f"measuring {name.lower()} (first time only)..."):
            hw = load(name)
    else:
        hw = load(name)
    _show(hw, as_json)


@app.command()
def detect(
    refresh: Annotated[bool, typer.Option(help="Measure again even if cached.")] = False,
    cache: Annotated[Path | None, typer.Option(help="Cache file to use.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Measure this machine's CPU (streaming copy, fp32 GEMM, op overhead) and show it."""
    with err_console.status("measuring this CPU..."):
        hw = run_detect(refresh=refresh, cache_path=cache)
    _show(hw, as_json)
