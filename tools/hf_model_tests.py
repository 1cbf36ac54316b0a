r"""Run transformers' own model tests with the "fusekit" experts implementation as the default.

transformers' tests are not shipped in its wheel: point this script at a checkout of
``huggingface/transformers`` whose version matches the installed package::

    python tools/hf_model_tests.py /path/to/transformers \
        tests/models/mixtral/test_modeling_mixtral.py

It runs pytest inside the checkout with a plugin that imports :mod:`fusekit.nn.hf` (registering
"fusekit") and makes "fusekit" what a model gets when nothing asks for another experts
implementation (transformers' default is "grouped_mm"); tests that ask for one explicitly keep
it. The last line printed is ``fusekit experts default: N passed, N failed, N skipped, N errors``.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from transformers.modeling_utils import PreTrainedModel

import fusekit.nn.hf  # noqa: F401  (registers "fusekit")


class FusekitDefault:
    """A pytest plugin: "fusekit" is the default experts implementation; outcomes are counted."""

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.restore: Callable[[], None] | None = None

    def pytest_configure(self, config: pytest.Config) -> None:
        """Make "fusekit" (registered on import) transformers' default."""
        original = PreTrainedModel.get_correct_experts_implementation

        def default_fusekit(self: Any, requested: str | None) -> str:
            return original(self, "fusekit" if requested is None else requested)  # type: ignore[no-any-return]

        PreTrainedModel.get_correct_experts_implementation = default_fusekit  # type: ignore[method-assign]

        def restore() -> None:
            PreTrainedModel.get_correct_experts_implementation = original  # type: ignore[method-assign]

        self.restore = restore

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """Put transformers' default back."""
        if self.restore is not None:
            self.restore()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Count each test once: its call phase, or the phase that failed or skipped it."""
        if report.when == "call" or report.outcome != "passed":
            failed_setup = report.when != "call" and report.outcome == "failed"
            self.outcomes["errors" if failed_setup else report.outcome] += 1


def main(argv: list[str] | None = None) -> int:
    """Run the tests; return pytest's exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path, help="root of a huggingface/transformers checkout")
    parser.add_argument(
        "tests", nargs="*", default=["tests/models/mixtral/test_modeling_mixtral.py"]
    )
    parser.add_argument("--pytest-args", default="-q -p no:cacheprovider", help="extra pytest args")
    args = parser.parse_args(argv)
    root = args.checkout.resolve()
    if not (root / "tests").is_dir():
        parser.error(f"expected 'checkout' to hold a tests/ folder (got {root})")
    plugin = FusekitDefault()
    sys.path.insert(0, str(root))
    paths = [str(root / t) for t in args.tests]
    code = int(pytest.main([*args.pytest_args.split(), "--rootdir", str(root), *paths], [plugin]))
    counts = ", ".join(
        f"{plugin.outcomes[k]} {k}" for k in ("passed", "failed", "skipped", "errors")
    )
    print(f"fusekit experts default: {counts}")
    return code


if __name__ == "__main__":
    sys.exit(main())
