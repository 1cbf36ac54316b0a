"""Cross-check the COMET front end against a COMET binary on random tilings of any shape.

For each case family of ``../shared/oracles/comet`` (fused GEMM-Softmax and GEMM-LayerNorm, and
the GEMM-, Softmax- and LayerNorm-only kernels) on ``edge`` and ``cloud``, and each shape of the
oracle's sweeps (shared and held back), a seeded sample of tilings COMET's generator allows is
written as a run (the family's arch, problem and mapping files, the generator's constants), run
through the binary and through ``fusekit.accel.comet.evaluate``, and compared: total cycles and
every per-unit total equal, every energy row within 1e-3, rejected tilings rejected with the same
levels. The binary is built from d-matrix-ai/comet as the oracle's README describes.

Run: ``.venv/bin/python tools/comet_crosscheck.py --binary PATH/TO/comet [--per-shape 6]``.
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import subprocess
import tempfile
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import yaml

from fusekit.accel.comet.run import CometFitError, evaluate
from fusekit.accel.comet.space import Space, arch_constraints, constants

ORACLE = Path(__file__).resolve().parents[1] / ".." / "shared" / "oracles" / "comet"
FAMILIES = {
    "softmax_fused": "im_{a}_gemm_softmax_fused_{s}_ok0",
    "layernorm_fused": "au_{a}_gemm_layernorm_fused_{s}_ok0",
    "gemm_only": "au_{a}_gemm_only_{s}_ok0",
    "softmax_only": "au_{a}_softmax_only_{s}_ok0",
    "layernorm_only": "au_{a}_layernorm_only_{s}_ok0",
}
TEMPLATE_SHAPE = {"edge": "M256_N256_K128", "cloud": "M256_N256_K512"}
SHAPES = {
    "edge": [(256, 256, 128), (1024, 1024, 256), (1, 1024, 128), (1, 512, 256), (1, 2048, 256),
             (512, 256, 128)],
    "cloud": [(256, 256, 512), (2048, 2048, 256), (1, 4096, 512), (1024, 1024, 512),
              (1, 8192, 128), (1, 16384, 128)],
}  # fmt: skip


def parse(text: str) -> dict[str, Any]:
    """Status, total cycles, per-unit totals and energy rows of a COMET output."""
    if "do not fit" in text:
        pat = r"Tensors do not fit in (\w+) \| Capacity: (\d+) Bytes \| Requested: (\d+) Bytes"
        return {"status": "rejected", "levels": [tuple(m) for m in re.findall(pat, text)]}
    totals = re.findall(r"➤ Total Cycles = (\d+)", text)
    if not totals:
        return {"status": "crash"}
    table = text.split("Detailed Cycles Breakdown (Table)")[1].split("➤ Total Cycles")[0]
    units = {}
    for line in table.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[-1].isdigit() and not line.startswith("Unit"):
            units[parts[0]] = int(parts[-1])
    rows = text.split("Energy Breakdown by Arch Level (pJ)")[1].split("Access Count")[0]
    energy = {}
    for line in rows.splitlines():
        parts = line.split()
        if len(parts) == 2 and re.fullmatch(r"[\d.]+", parts[1]):
            energy[parts[0]] = float(parts[1])
    return {"status": "ok", "cycles": int(totals[-1]), "units": units, "energy": energy}


def check(job: tuple[str, str, str, tuple[int, int, int], dict[str, tuple[int, ...]]]) -> str:
    """Run one tiling through both; '' when they agree, else what differs."""
    binary, family, arch, shape, tiling = job
    template = ORACLE / "cases" / FAMILIES[family].format(a=arch, s=TEMPLATE_SHAPE[arch])
    d = Path(tempfile.mkdtemp(prefix="comet_xcheck_"))
    try:
        for f in ("arch.yaml", "problem.yaml", "mapping.yaml"):
            shutil.copy(template / f, d / f)
        dims = {"M": shape[0], "N": shape[1], "K": shape[2]}
        const = {"const": constants(tiling, dims)}
        (d / "constants.yaml").write_text(yaml.safe_dump(const, sort_keys=False))
        args = [binary, "--constants_file", "constants.yaml", "--arch_file", "arch.yaml",
                "--problem_file", "problem.yaml", "--mapping_file", "mapping.yaml",
                "--calc_noc_energy"]  # fmt: skip
        out = subprocess.run(args, cwd=d, capture_output=True, text=True, timeout=900)
        ref = parse(out.stdout + out.stderr)
        where = f"{family} {arch} {shape} {tiling}"
        try:
            mine = evaluate(d)
        except CometFitError as e:
            got = [(lv, str(c), str(r)) for lv, c, r in e.overflows]
            ok = ref["status"] == "rejected" and ref["levels"] == got
            return "" if ok else f"{where}: rejected, COMET {ref['status']}"
        if ref["status"] != "ok":
            return f"{where}: evaluated, COMET {ref['status']}"
        bad = [u for u, v in ref["units"].items() if mine["cycles"].get(u, {}).get("total") != v]
        bad += [k for k, v in ref["energy"].items() if k != "Total"
                and abs(mine["energy_pj"].get(k, -1.0) - v) > 1e-3 * max(v, 1.0)]  # fmt: skip
        if mine["total_cycles"] != ref["cycles"] or bad:
            return f"{where}: cycles {mine['total_cycles']} vs {ref['cycles']}, differ: {bad}"
        return ""
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    """Sample tilings of every family and shape, run both, print what differs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True, help="the COMET binary")
    parser.add_argument("--per-shape", type=int, default=6, help="tilings sampled per shape")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    rnd = random.Random(args.seed)
    jobs = []
    for arch, shapes in SHAPES.items():
        space = Space(ORACLE / "cases" / FAMILIES["softmax_fused"].format(
            a=arch, s=TEMPLATE_SHAPE[arch]))  # fmt: skip
        for shape in shapes:
            dims = {"M": shape[0], "N": shape[1], "K": shape[2]}
            tilings = space.tilings(dims, arch_constraints(space.arch))
            for tiling in rnd.sample(tilings, min(args.per_shape, len(tilings))):
                jobs += [(args.binary, fam, arch, shape, tiling) for fam in FAMILIES]
    with Pool(args.workers) as pool:
        problems = [p for p in pool.imap_unordered(check, jobs) if p]
    for p in problems:
        print(p)
    print(f"{len(jobs) - len(problems)} of {len(jobs)} runs agree")


if __name__ == "__main__":
    main()
