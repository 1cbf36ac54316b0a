r"""Run transformers' own model tests with the "fusekit" experts implementation as the default.

transformers' tests are not shipped in its wheel: point this script at a checkout of
``huggingface/transformers`` whose version matches the installed package::

    python tools/hf_model_tests.py /path/to/transformers \
        tests/models/mixtral/test_modeling_mixtral.py

It runs pytest inside the checkout with a plugin that imports :mod:`fusekit.nn.hf` (registering
"fusekit") and makes "fusekit" what a model gets when nothing asks for another experts
implementation (transformers' default is "grouped_mm"); tests that ask for one explicitly keep
it. The last line printed is ``fusekit experts default: N passed, N failed, N skipped, N errors``,
one count per test (subtests fold into their test). docs/nn.md ("transformers' own tests") says how
a minimal checkout for the Mixtral tests was put together and what it gave.
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

#: Outcomes from mildest to worst; a test counts under the worst of its reports.
_SEVERITY = ("passed", "skipped", "failed", "errors")


class FusekitDefault:
    """A pytest plugin: "fusekit" is the default experts implementation; outcomes are counted."""

    def __init__(self) -> None:
        self.by_test: dict[str, str] = {}
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
        """Keep each test's worst outcome over its phases and subtests (errors > failed > skipped).

        A subtest (``self.subTest``, pytest's ``subtests``) reports a "call" of its own: a failed
        one fails its test; passed or skipped ones leave the test's own outcome as it is.
        """
        subtest = hasattr(report, "context")  # pytest's SubtestReport (and pytest-subtests')
        if report.failed:
            outcome = "failed" if report.when == "call" else "errors"
        elif subtest or not (report.skipped or report.when == "call"):
            return
        else:
            outcome = report.outcome
        previous = self.by_test.get(report.nodeid, "passed")
        self.by_test[report.nodeid] = max(previous, outcome, key=_SEVERITY.index)

    @property
    def outcomes(self) -> Counter[str]:
        """How many tests passed, failed, were skipped, or errored (in setup or teardown)."""
        return Counter(self.by_test.values())


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
