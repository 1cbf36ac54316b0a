r"""Fused against unfused in COMET's construction, for fusekit's own templates.

COMET's unfused baseline (the oracle's authored ``du_`` pairs) runs the chain as separate
kernels with the fused run's tiling constants: a GEMM kernel writing C to DRAM, then the
Softmax or LayerNorm kernel reading it back (:data:`fusekit.accel.comet.templates.ALONE`,
which reproduce COMET's authored ``*_only`` runs exactly, tested); its cycles and energy are the
kernels' sums,

.. math::

    t_{unfused} = \sum_{kernel} t_{kernel}, \qquad E_{unfused} = \sum_{kernel} E_{kernel}.

Attention adds a third kernel, ``O = H V``: a GEMM over ``(M, K, N)`` (rows, head width,
keys), whose tiling cannot be the fused one (its output columns are the head width, which the
fused tiling never splits), so the mapper gives it its own best tiling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fusekit.accel.comet.space import Space, Tiling
from fusekit.accel.compat import Compat

#: the kernels of each op's unfused baseline, in order (``pv``: attention's ``O = H V``)
KERNELS: dict[str, tuple[str, ...]] = {
    "gemm_softmax": ("gemm", "softmax"),
    "gemm_layernorm": ("gemm", "layernorm"),
    "attention": ("gemm", "softmax", "pv"),
}


@dataclass(frozen=True, slots=True)
class Kernel:
    """One kernel of an unfused baseline: its template, extents, tiling, cycles and energy."""

    name: str
    dims: dict[str, int]
    tiling: Tiling
    total_cycles: int
    total_energy_pj: float


def unfused(
    op: str, tiling: Tiling, dims: dict[str, int], arch_doc: dict[str, Any],
    compat: Compat | None = None,
) -> list[Kernel]:  # fmt: skip
    """The kernels of ``op``'s unfused baseline at the fused ``tiling`` (see the module docstring).

    Raises:
        ValueError: ``op`` has no unfused baseline, or a kernel's tiling fails the fit check.
    """
    if op not in KERNELS:
        raise ValueError(f"comet fusion: expected 'op' in {sorted(KERNELS)} (got {op!r})")
    compat = compat or Compat()
    out = []
    for name in KERNELS[op]:
        if name == "pv":
            pv = {"M": dims["M"], "N": dims["K"], "K": dims["N"]}
            best = Space.builtin("gemm", arch_doc).search(pv, sample=1, compat=compat).best
            out.append(Kernel(name, pv, best.tiling, best.total_cycles or 0,
                              best.total_energy_pj or 0.0))  # fmt: skip
            continue
        sc = Space.builtin(name, arch_doc).score(tiling, dims, compat)
        if sc.total_cycles is None or sc.total_energy_pj is None:
            raise ValueError(f"comet fusion: the {name} kernel of {op} fails the fit check")
        out.append(Kernel(name, dims, tiling, sc.total_cycles, sc.total_energy_pj))
    return out
