"""Test-wide settings: the ``gpu`` marker is skipped on machines without CUDA, and plans are
not read from the user's plan cache (a test that patches the planner must see it run;
tests/stitch/test_plancache.py turns the cache on in a folder of its own)."""

from __future__ import annotations

import os

import pytest

os.environ["FUSEKIT_PLAN_CACHE"] = "0"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any("gpu" in item.keywords for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
