"""What the compiled twin's tests share: the COMET oracle's cases, the spaces compared, helpers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fusekit.accel.comet.space import Space
from fusekit.accel.compat import Compat
from fusekit.hw import load
from fusekit.hw.cpu_gpu import plain

ORACLE = Path(__file__).resolve().parents[2] / ".." / "shared" / "oracles" / "comet"
CASES = ORACLE / "cases"
needs_oracle = pytest.mark.skipif(
    not CASES.is_dir(), reason="COMET oracle (../shared/oracles/comet) absent"
)
#: Spaces whose random tilings are compared (the dims are in the names).
CASE_SPACES = (
    "im_cloud_gemm_softmax_fused_M256_N256_K512_ok0",
    "im_edge_gemm_softmax_fused_M256_N256_K128_ok0",
    "au_cloud_gemm_only_M256_N256_K512_ok0",
    "au_edge_softmax_only_M1_N1024_K128_ok0",
    "au_cloud_layernorm_only_M256_N256_K512_ok0",
    "au_edge_gemm_layernorm_fused_M256_N256_K128_ok0",
    "q_cloud_gemm_softmax_fused_M256_N256_K512_gbspatial4x2",
)
OPS = ("gemm", "gemm_softmax", "gemm_layernorm", "attention", "softmax", "layernorm")
SHAPES = {"edge": (256, 256, 128), "cloud": (256, 256, 512)}
COMPATS = {"comet": Compat(), "native": Compat.native()}


def case_dims(case: str) -> dict[str, int]:
    """The extents a case's name gives (``..._M256_N256_K512_...``)."""
    return {d: int(v) for d, v in re.findall(r"_([MNK])(\d+)", case)}


def case_space(case: str) -> tuple[Space, dict[str, int]]:
    """The space of a shared case's template, and its extents."""
    return Space(CASES / case), case_dims(case)


def builtin_space(op: str, hw: str) -> tuple[Space, dict[str, int]]:
    """The space of built-in op ``op`` on preset ``hw``, at that preset's shape."""
    sp = Space.builtin(op, plain(load(hw).comet_arch))  # type: ignore[attr-defined]
    return sp, dict(zip("MNK", SHAPES[hw], strict=True))
