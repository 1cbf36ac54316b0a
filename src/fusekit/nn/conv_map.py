"""A sparse convolution's kernel map with its gms plans, and the selector's choice per layer.

Per kernel map, once: the map (numba on the CPU: :mod:`fusekit.gms.kmap`), its features, the
gms selector's choice of strategy and configuration for the layer's widths and dtype, and the
plan. For 3x3x3 kernels of dilation 1 on the CPU the map starts as pass 1 of the row-merge
builder (:class:`fusekit.gms.kmap.Hits`), whose counts choose the configuration before pass 2
writes the pairs straight into the chosen packed plan; other geometries build the map first
(:func:`fusekit.gms.kmap.build_general`) and plan it in O(E)
(:func:`fusekit.gms.kmap.plan_kernel_map`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from fusekit.errors import expected
from fusekit.gms import GMSPlan
from fusekit.gms import kmap as km
from fusekit.gms.candidates import Config, Order, Strategy
from fusekit.gms.dispatch import mark_mirrored
from fusekit.gms.features import Features
from fusekit.gms.kmap.geometry import SUBM_3, Geometry
from fusekit.gms.selector import Constraints, select
from fusekit.gms.target import target_for

#: What a kernel map runs: pairwise only. It has one pair per (offset, input) and per
#: (offset, output), so the other orders run as many GEMM rows as pairwise plus a reduce pass.
KERNEL_MAP = Constraints(orders=frozenset({Order.PAIRWISE}))


@dataclass(eq=False)
class ConvMap:
    """A kernel map with its gms plans and choices, per (widths, dtype, device).

    On the CPU a 3x3x3 map starts as pass 1 of the numba builder
    (:class:`fusekit.gms.kmap.Hits`): the first :meth:`plan_for` selects the configuration from
    its counts and writes the pairs straight into that configuration's packed plan; the
    :class:`~fusekit.gms.kmap.KernelMap` is then views of that plan. Later widths, and maps of
    other geometries, plan from the map (:func:`kmap.plan_kernel_map`).

    Attributes:
        indices: the input coordinates it was built from.
        hits: pass 1 of the map, until the first plan writes it (``None`` after, or off CPU).
        subm: a submanifold map (outputs = inputs, offsets ``r`` and ``V - 1 - r`` mirror each
            other), so a layer's input gradient may run on its forward plan
            (:func:`fusekit.gms.dispatch.mark_mirrored`).
        built: the pairs, once written.
        fingerprint: :func:`fusekit.nn.engine.fingerprint` of ``indices`` when the map was
            built (set for maps cached under an ``indice_key``): a map whose indices no longer
            match it is built again.
        geometry: the convolution's kernel size, stride, padding, dilation and kind.
        in_shape: the input grid ``(Z, Y, X)`` (the output grid of the inverse convolution).
        inverse: the map of the inverse convolution (:class:`fusekit.nn.SparseInverseConv3d`),
            built on first use.
        plans: ``(K, M, dtype, device, constraints) -> (plan, config)``.
    """

    indices: torch.Tensor
    hits: km.Hits | None = None
    subm: bool = False
    built: km.KernelMap | None = None
    fingerprint: tuple[Any, ...] | None = None
    geometry: Geometry = SUBM_3
    in_shape: tuple[int, int, int] = (1, 1, 1)
    inverse: ConvMap | None = None
    plans: dict[tuple[int, int, torch.dtype, str, Constraints], tuple[GMSPlan, Config]] = field(
        default_factory=dict
    )

    @property
    def kmap(self) -> km.KernelMap:
        """The pairs (written by pass 2 now if no plan has been made yet)."""
        if self.built is None:
            if self.hits is None:
                raise ValueError(expected("ConvMap", "hits", "pass 1 or a built map", None))
            self.built, self.hits = self.hits.kernel_map(), None
        return self.built

    def inverted(self) -> ConvMap:
        """The map of the inverse convolution (cached): pairs swapped, outputs ``indices``."""
        if self.inverse is None:
            out_kmap = self.kmap
            inv = out_kmap.inverse(self.indices, self.in_shape)
            self.inverse = ConvMap(
                out_kmap.out_coords, built=inv, geometry=self.geometry, in_shape=out_kmap.out_shape
            )
        return self.inverse

    def plan_for(
        self,
        k: int,
        m: int,
        dtype: torch.dtype,
        device: torch.device,
        constraints: Constraints = KERNEL_MAP,
    ) -> tuple[GMSPlan, Config]:
        """The plan and configuration for operands of widths ``k``, ``m`` (cached).

        Args:
            k: input channels.
            m: output channels.
            dtype: the dtype gms computes in.
            device: where the features live.
            constraints: what the selector may answer (:func:`constraints_for` a layer).
        """
        key = (k, m, dtype, str(device), constraints)
        if key in self.plans:
            return self.plans[key]
        if self.hits is not None and device.type == "cpu":
            cfg = choose(self.hits.features(k, m, dtype), device, constraints)
            self.built, plan = self.hits.plan(*cfg.plan_knobs)
            self.hits = None
        else:
            cfg = choose(km.features_of(self.kmap, k, m, dtype), device, constraints)
            plan = self._planned(cfg, str(device))
            if plan is None:
                plan = km.plan_kernel_map(self.kmap, *cfg.plan_knobs)
                plan = plan.to(device) if device.type != "cpu" else plan
        if self.subm:  # offsets r and V - 1 - r mirror each other: dX runs on this plan
            mark_mirrored(plan)
        self.plans[key] = (plan, cfg)
        return plan, cfg

    def _planned(self, cfg: Config, device: str) -> GMSPlan | None:
        """A plan already made on ``device`` with ``cfg``'s knobs, or ``None``.

        A plan does not depend on the widths or dtype it runs with, so one map's layers of
        other widths (4 -> 16, then 16 -> 16) share it when the selector picks the same knobs.
        """
        for (_, _, _, where, _), (plan, other) in self.plans.items():
            if where == device and other.plan_knobs == cfg.plan_knobs:
                return plan
        return None


def build_map(
    indices: torch.Tensor,
    spatial_shape: tuple[int, int, int],
    batch_size: int,
    geometry: Geometry,
) -> ConvMap:
    """A fresh :class:`ConvMap`: pass 1 for 3x3x3 maps on the CPU, the built map otherwise."""
    common: dict[str, Any] = {
        "subm": geometry.subm,
        "geometry": geometry,
        "in_shape": spatial_shape,
    }
    if indices.device.type == "cpu" and geometry.classic:
        g = geometry
        hits = km.find_hits(indices, spatial_shape, batch_size, g.stride, g.padding, g.subm)
        return ConvMap(indices, hits=hits, **common)
    return ConvMap(
        indices, built=km.build_of(indices, spatial_shape, batch_size, geometry), **common
    )


def constraints_for(strategy: str, training: bool) -> Constraints:
    """What a layer with ``strategy`` may run: pairwise, a named dataflow alone, or training's.

    Under training (``"auto"`` only) the selector answers its training strategy.

    Args:
        strategy: ``"auto"`` or a gms dataflow name.
        training: whether autograd records the call.
    """
    if strategy == "auto":
        return Constraints(orders=KERNEL_MAP.orders, training=training)
    dataflow = Strategy.parse(strategy).dataflow
    return Constraints(orders=KERNEL_MAP.orders, dataflows=frozenset({dataflow}))


def choose(
    features: Features, device: torch.device, constraints: Constraints = KERNEL_MAP
) -> Config:
    """The gms selector's configuration for a map's features on ``device``'s measured target.

    ``select(features, target_for(device), constraints)``: the best configuration the layer may
    run (where the shipped tree answers another order or dataflow, the leaf's knobs run with the
    allowed strategy: :meth:`~fusekit.gms.selector.Constraints.run_as`).
    """
    return select(features, target_for(device), constraints).config
