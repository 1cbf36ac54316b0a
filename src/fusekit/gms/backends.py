"""The kernels each device runs, as one explicit table per backend.

A :class:`Backend` lists, by field, every launcher :mod:`fusekit.gms.dispatch` calls::

    dataflows[d](x, w, plan, scale) -> Y     one launcher per Dataflow, the GEMM of every order
    aggregate_gms_seg(x, w, plan, scale)     aggregate-first (GMS)seg fused (A never in memory)
    gather_rows, reduce_rows                 the G and S steps of the orders and gradients
    segment_products                         X[g[p]] @ W[s[p]] per pair (gradients, max)
    segment_outer, pair_dot                  dW and dscale
    vendor_gemm                              G-Mseg-S's segment GEMMs, for its gradients too
    transposed_input_gradient                dX as (GMS)seg on the transposed plan

:data:`CPU` is built from ``kernels/cpu`` (numba, and torch's GEMM for the vendor entries);
the Triton table from ``kernels/triton`` on first CUDA use (Triton is the optional ``gpu``
extra). :func:`backend_for` maps a device to its table.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

import torch

from fusekit.errors import expected, require
from fusekit.gms.candidates import Dataflow
from fusekit.gms.kernels.cpu.agg_gms_seg import agg_gms_seg_cpu
from fusekit.gms.kernels.cpu.backward import pair_dot_cpu, segment_outer_cpu
from fusekit.gms.kernels.cpu.g_ms_seg import g_ms_seg_cpu
from fusekit.gms.kernels.cpu.g_mseg_s import (
    g_mseg_s_cpu,
    per_segment_mm,
    segment_mm,
    segment_outer_mm,
)
from fusekit.gms.kernels.cpu.gm_seg_s import gm_seg_s_cpu, segment_products_cpu
from fusekit.gms.kernels.cpu.gms_seg import gms_seg_cpu
from fusekit.gms.kernels.cpu.rows import gather_rows_cpu, reduce_rows_cpu
from fusekit.gms.planning.layout import GMSPlan

Tensor = torch.Tensor

#: ``Y[N_out, M]`` of ``x[N_in, K]``, ``w[S, K, M]``, a plan and the per-position scale.
DataflowLauncher = Callable[[Tensor, Tensor, GMSPlan, Tensor | None], Tensor]
#: ``out[p] = x[index[p]]``.
GatherRows = Callable[[Tensor, Tensor], Tensor]
#: ``P[p] = a[a_index[p]] @ w[s[p]]`` per plan position: ``(a, a_index, w, plan)``.
SegmentProducts = Callable[[Tensor, Tensor, Tensor, GMSPlan], Tensor]
#: ``dW[s] = sum_p scale[p] a[a_index[p]]^T b[b_index[p]]`` over segment ``s``:
#: ``(a, a_index, b, b_index, scale, plan, n_segments)``.
SegmentOuter = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor | None, GMSPlan, int], Tensor]
#: ``dot[p] = b[b_index[p]] . (a[a_index[p]] @ w[s[p]])``: ``(a, a_index, w, b, b_index, plan)``.
PairDot = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, GMSPlan], Tensor]
#: ``P[p] = rows[p] @ w[s]`` for the rows ``p`` of segment ``s``: ``(rows, w, segment_ptr)``.
SegmentMM = Callable[[Tensor, Tensor, Tensor], Tensor]
#: ``dW[s] = a[P_s]^T @ b[P_s]`` for the rows ``P_s`` of segment ``s``:
#: ``(a, b, segment_ptr, n_segments)``.
SegmentOuterMM = Callable[[Tensor, Tensor, Tensor, int], Tensor]
#: :data:`SegmentMM` into ``out``, with the segment bounds as a list: ``(rows, w, bounds, out)``.
PerSegmentMM = Callable[[Tensor, Tensor, list[int], Tensor], Tensor]


class ReduceRows(Protocol):
    """``out[i] (+= | max=) scale[p] * src[src_index[p]]`` over the CSR positions of row ``i``."""

    def __call__(
        self,
        src: Tensor,
        ptr: Tensor,
        /,
        *,
        n_pairs: int,
        src_index: Tensor | None = None,
        scale: Tensor | None = None,
        pos: Tensor | None = None,
        reduce_max: bool = False,
        out: Tensor | None = None,
    ) -> Tensor:
        """Rows of ``src`` (or ``src[src_index]``) reduced by the CSR ``ptr`` (``pos``)."""
        ...


@dataclass(frozen=True, slots=True)
class VendorGemm:
    """``G-Mseg-S``'s segment GEMMs, which its gradients and max pair values reuse.

    Attributes:
        segment_mm: the products of gathered rows, ``dX`` by ``dY[d] @ W[s]^T``.
        segment_outer_mm: ``dW`` from gathered rows.
        per_segment_mm: the max gradient's pair values, as the forward computed them.
    """

    segment_mm: SegmentMM
    segment_outer_mm: SegmentOuterMM
    per_segment_mm: PerSegmentMM


@dataclass(frozen=True, slots=True)
class Backend:
    """The launchers of one backend (see the module docstring for their maths).

    Attributes:
        name: ``"cpu"`` or ``"triton"``.
        dataflows: the launcher of each :class:`~fusekit.gms.candidates.Dataflow`.
        aggregate_gms_seg: aggregate-first ``(GMS)seg`` fused, or None (then the order runs as
            ``reduce_rows`` followed by the ``(GMS)seg`` launcher).
        gather_rows: ``out[p] = x[index[p]]``.
        reduce_rows: rows reduced by a CSR.
        segment_products: pair products (gradients, max pair values).
        segment_outer: ``dW``.
        pair_dot: ``dscale``.
        vendor_gemm: ``G-Mseg-S``'s own segment GEMMs for its gradients, or None (then the
            gradients of ``G-Mseg-S`` run like those of the other dataflows).
        transposed_input_gradient: ``dX`` of ``sum``/``mean`` runs ``(GMS)seg`` on the
            transposed plan (or on the plan itself when its pairs mirror), without an ``[E, K]``
            pair buffer; otherwise pair products reduced by gather row.
        bfloat16: the kernels compute in bfloat16 (else bfloat16 operands run in float32).
    """

    name: str
    dataflows: Mapping[Dataflow, DataflowLauncher]
    aggregate_gms_seg: DataflowLauncher | None
    gather_rows: GatherRows
    reduce_rows: ReduceRows
    segment_products: SegmentProducts
    segment_outer: SegmentOuter
    pair_dot: PairDot
    vendor_gemm: VendorGemm | None
    transposed_input_gradient: bool
    bfloat16: bool


#: numba kernels; torch's GEMM for G-Mseg-S; float32 for bfloat16 (numba has no bfloat16).
CPU = Backend(
    name="cpu",
    dataflows=MappingProxyType(
        {
            Dataflow.G_MSEG_S: g_mseg_s_cpu,
            Dataflow.GM_SEG_S: gm_seg_s_cpu,
            Dataflow.G_MS_SEG: g_ms_seg_cpu,
            Dataflow.GMS_SEG: gms_seg_cpu,
        }
    ),
    aggregate_gms_seg=agg_gms_seg_cpu,
    gather_rows=gather_rows_cpu,
    reduce_rows=reduce_rows_cpu,
    segment_products=segment_products_cpu,
    segment_outer=segment_outer_cpu,
    pair_dot=pair_dot_cpu,
    vendor_gemm=VendorGemm(segment_mm, segment_outer_mm, per_segment_mm),
    transposed_input_gradient=True,
    bfloat16=False,
)


@functools.cache
def triton_backend() -> Backend:
    """The Triton table, built on first use (Triton is the optional ``gpu`` extra).

    Raises:
        MissingExtra: Triton is not installed.
    """
    require("triton", "gms on cuda", "gpu")
    # the optional gpu extra: imported only once it is known to be installed
    from fusekit.gms.kernels.triton.backward import pair_dot_triton, segment_outer_triton
    from fusekit.gms.kernels.triton.g_ms_seg import g_ms_seg_triton
    from fusekit.gms.kernels.triton.g_mseg_s import g_mseg_s_triton
    from fusekit.gms.kernels.triton.gm_seg_s import gm_seg_s_triton, segment_products_triton
    from fusekit.gms.kernels.triton.gms_seg import gms_seg_triton
    from fusekit.gms.kernels.triton.rows import gather_rows_triton, reduce_rows_triton

    return Backend(
        name="triton",
        dataflows=MappingProxyType(
            {
                Dataflow.G_MSEG_S: g_mseg_s_triton,
                Dataflow.GM_SEG_S: gm_seg_s_triton,
                Dataflow.G_MS_SEG: g_ms_seg_triton,
                Dataflow.GMS_SEG: gms_seg_triton,
            }
        ),
        aggregate_gms_seg=None,
        gather_rows=gather_rows_triton,
        reduce_rows=reduce_rows_triton,
        segment_products=segment_products_triton,
        segment_outer=segment_outer_triton,
        pair_dot=pair_dot_triton,
        vendor_gemm=None,
        transposed_input_gradient=False,
        bfloat16=True,
    )


def _cpu_backend() -> Backend:
    return CPU


#: Device type -> the table that serves its tensors (a test may point ``"cpu"`` at
#: :func:`triton_backend` to run the Triton kernels interpreted on CPU tensors).
BY_DEVICE_TYPE: dict[str, Callable[[], Backend]] = {"cpu": _cpu_backend, "cuda": triton_backend}


def backend_for(device: torch.device, kernel: str = "gms") -> Backend:
    """The kernel table of ``device``.

    Args:
        device: where the operands live.
        kernel: what the caller is about to run, named in the error.

    Returns:
        :data:`CPU` for CPU tensors, :func:`triton_backend` for CUDA tensors.

    Raises:
        ValueError: no backend serves this device type.
        MissingExtra: a CUDA device without Triton (the ``gpu`` extra).
    """
    make = BY_DEVICE_TYPE.get(device.type)
    if make is None:
        have = ", ".join(BY_DEVICE_TYPE)
        raise ValueError(
            expected("gms", "x", f"on a device with a {kernel} kernel ({have})", str(device))
        )
    return make()
