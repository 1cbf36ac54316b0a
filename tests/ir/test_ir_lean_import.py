import subprocess
import sys


def test_importing_fusekit_ir_does_not_import_torch():
    code = "import sys, fusekit.ir\nprint('torch' in sys.modules, 'typer' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
