"""``fusekit hw``: list, show and detect hardware descriptions."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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
        rows += [
            ("spatial hierarchy", hw.spatial()),
            ("MACs / cycle", f"{hw.macs_per_cycle:,}"),
            ("peak (2 FLOP/MAC)", si(hw.peak_flops_per_s, "FLOP/s")),
            ("clock", f"{si(hw.clock_hz, 'Hz')} (assumed)"),
        ]
    return rows


def _level_tables(hw: Accelerator) -> None:
    """COMET's hierarchy in three tables: memories, compute units, networks."""
    print_table(
        f"{hw.name} memories (per instance; pJ per access of one block)",
        ("level", "under", "on chip", "size", "block", "B/cycle", "pJ read / write"),
        [(lv.name, lv.parent or "-", lv.instances,
          binary_bytes(lv.capacity_bytes) if lv.capacity_bytes else "unbounded",
          f"{lv.width_bytes} B", f"{lv.bw_bytes_per_cycle:g}", f"{lv.read_pj:g} / {lv.write_pj:g}")
         for lv in hw.levels if not lv.compute],
    )  # fmt: skip
    print_table(
        f"{hw.name} compute units",
        ("unit", "spec", "under", "on chip", "per instance"),
        [(lv.name, lv.spec, lv.parent, lv.instances,
          f"{lv.macs_per_cycle:,} MACs/cycle" if lv.macs_per_cycle else f"{lv.lanes} lanes")
         for lv in hw.levels if lv.compute],
    )  # fmt: skip
    print_table(
        f"{hw.name} networks (each level's instances under one parent)",
        ("level", "mesh", "link B/cycle", "cycles / hop"),
        [(lv.name, f"{lv.mesh[0]}x{lv.mesh[1]}", f"{lv.link_bw_bytes_per_cycle:g}",
          lv.hop_latency_cycles) for lv in hw.levels if lv.parent and lv.per_parent > 1],
    )  # fmt: skip


def _show(hw: Hardware, as_json: bool) -> None:
    if as_json:
        print_json(hw.to_dict())
        return
    print_table(f"{hw.name}", ("field", "value"), _summary_rows(hw))
    if isinstance(hw, Accelerator):
        _level_tables(hw)


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
