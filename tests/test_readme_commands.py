"""The README's shell commands run as written (tools/readme_commands.py), behind ``slow``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_commands_are_found():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from readme_commands import commands
    finally:
        sys.path.remove(str(ROOT / "tools"))
    found = commands(ROOT / "README.md")
    assert len(found) >= 30
    assert ("fusekit --help", 0) in found
    assert not any(c.startswith("make ") for c, _ in found)
    assert any(status == 2 for _, status in found)  # the rejected COMET run


@pytest.mark.slow
@pytest.mark.skipif(not (ROOT.parent / "shared").exists(), reason="needs ../shared")
def test_every_readme_command_runs():
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "readme_commands.py"), "--timeout", "300"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
