"""Importing fusekit (and its CLI) must not import torch, triton or numba, nor touch CUDA."""

import subprocess
import sys


def test_import_fusekit_and_cli_loads_no_heavy_module():
    code = (
        "import sys, fusekit, fusekit.hw, fusekit.cli, fusekit.report\n"
        "heavy = ('torch', 'triton', 'numba', 'matplotlib')\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
