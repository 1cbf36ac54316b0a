"""Run every shell command of the README as written, in a scratch folder, and report each.

The README's ``sh``/``bash`` blocks are what a new user types. This script runs each line (the
comment after ``#`` dropped, ``make`` lines skipped: they are the set-up CI runs anyway) with
``.venv/bin`` first on ``PATH``, in a scratch folder that links ``src``, ``benchmarks`` and
``../shared`` as the repository sees them, so that relative paths resolve as they do for a user
in the checkout and nothing is written into it. Placeholders the README names as such
(``CASE_DIR``, ``GRAPH.gv`` and its ``B.npz``/``C.npz``, ``my-gpu.yaml``) are given real
files first. A command whose comment says ``exits N`` must exit with status N.

Run: ``.venv/bin/python tools/readme_commands.py [--timeout 300] [--only SUBSTRING]``; exit
status 1 when a command fails, with its last lines of output.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

#: placeholder -> the real file or folder it stands for in a scratch run
PLACEHOLDERS = {
    "CASE_DIR": "../shared/oracles/comet/cases/im_edge_gemm_softmax_fused_M256_N256_K128_ok0",
    "GRAPH.gv": "../shared/data/sam_graphs/mat_elemmul.gv",
}


def commands(readme: Path) -> list[tuple[str, int]]:
    """The command lines of the README's ``sh`` and ``bash`` blocks and their exit statuses.

    The comment after ``#`` is dropped; ``exits N`` in it sets the status expected (else 0).
    """
    out: list[tuple[str, int]] = []
    block = False
    for line in readme.read_text().splitlines():
        if line.startswith("```"):
            block = not block and line.strip() in ("```sh", "```bash")
            continue
        if not block:
            continue
        cmd = re.sub(r"\s+#\s.*$", "", line).strip()
        status = re.search(r"#.*\bexits (\d+)", line)
        if cmd and not cmd.startswith("#") and not cmd.startswith("make "):
            out.append((cmd, int(status.group(1)) if status else 0))
    return out


def scratch() -> Path:
    """A folder that sees ``src``, ``benchmarks`` and ``../shared`` as the checkout does."""
    base = Path(tempfile.mkdtemp(prefix="fusekit-readme-"))
    work = base / "repo"
    work.mkdir()
    for name in ("src", "benchmarks", "tools", "pyproject.toml"):
        (work / name).symlink_to(ROOT / name)
    if SHARED.exists():
        (base / "shared").symlink_to(SHARED)
    return work


def prepare(work: Path, env: dict[str, str]) -> None:
    """Real files behind the README's own placeholders."""
    hw = subprocess.run(["fusekit", "hw", "show", "h100", "--json"], cwd=work, env=env,
                        capture_output=True, text=True, check=True)  # fmt: skip
    import json

    import numpy as np
    import scipy.sparse as sp
    import yaml

    for k, name in enumerate("BC"):
        sp.save_npz(
            work / f"{name}.npz",
            sp.random(50, 40, density=0.1, format="csr", random_state=np.random.default_rng(k)),
        )
    doc = json.loads(hw.stdout)
    doc["name"] = "my-gpu"
    (work / "my-gpu.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def main() -> int:
    """Run the README's commands; 1 when any fails."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--only", default="", help="run only commands containing this text")
    args = parser.parse_args()
    env = dict(os.environ)
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("COLUMNS", "100")
    work = scratch()
    prepare(work, env)
    failed = 0
    todo = [(c, st) for c, st in commands(args.readme) if args.only in c]
    for i, (cmd, expect) in enumerate(todo, 1):
        run = cmd
        for name, real in PLACEHOLDERS.items():
            run = re.sub(rf"(?<![\w/.]){re.escape(name)}(?![\w/])", real, run)
        t0 = time.perf_counter()
        try:
            p = subprocess.run(run, shell=True, cwd=work, env=env, capture_output=True,
                               text=True, timeout=args.timeout)  # fmt: skip
            ok, tail = p.returncode == expect, (p.stdout + p.stderr).strip().splitlines()[-5:]
            status = f"exit {p.returncode} (expected {expect})"
        except subprocess.TimeoutExpired:
            ok, tail, status = False, [], f"timeout {args.timeout:.0f} s"
        dt = time.perf_counter() - t0
        print(f"[{i}/{len(todo)}] {'ok  ' if ok else 'FAIL'} {dt:6.1f} s  {cmd}", flush=True)
        if not ok:
            failed += 1
            print(f"      {status}; ran: {shlex.quote(run)}")
            for line in tail:
                print(f"      | {line[:200]}")
    print(f"{len(todo) - failed} of {len(todo)} commands ran; scratch folder {work}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
