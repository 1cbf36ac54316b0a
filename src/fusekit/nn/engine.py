"""What every nn layer shares: plan a g-mm-s problem once, choose its configuration, run it.

A layer calls :func:`prepare` when it sees new indices and keeps the :class:`Prepared` it returns
while the same index tensors come back (:class:`IndexCache`): the sort and tiling of
:func:`fusekit.gms.plan` and the selector's answer are paid once per graph, kernel map or
routing, never per forward.

The choice (``strategy="auto"``): the gms selector (:func:`fusekit.gms.selector.select`) on the
problem's features and the local target (:func:`fusekit.hw.detect` on the CPU, ``detect_gpu`` on
CUDA): the tuning cache when the problem was tuned, else the shipped decision tree, else the cost
model. A named strategy (``"(GMS)seg"``, ``"transform-first"``, ...) skips the selector and runs
with the default plan and launch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from fusekit.gms.candidates import Config
    from fusekit.gms.problem import GMSPlan, GMSProblem

log = logging.getLogger(__name__)

#: The dataflow the layers run under autograd when ``strategy="auto"``, per device type (the
#: selector models the forward only). CPU: ``(GMS)seg``, whose backward is (GMS)seg again on the
#: transposed plan for ``dX`` and the chunked segment outer products for ``dW``, with no
#: ``[E, K]`` pair buffer (measured forward+backward, 2 threads, against ``G-Mseg-S``'s vendor
#: GEMMs on gathered rows: RGCN AIFB / MUTAG K=16 8.2 / 18.2 ms against 24.3 / 36.8, K=64 43.5 /
#: 88.8 against 76.5 / 187; SubMConv3d 100k voxels C=32 90 against 393 ms). CUDA: ``G-Mseg-S``
#: (cuBLAS on the segments; the Triton backward has not run on a GPU).
TRAINING_STRATEGY = {"cpu": "(GMS)seg", "cuda": "G-Mseg-S"}


def needs_grad(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd records a call on ``tensors`` (``None`` entries are skipped)."""
    import torch

    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def strategy_for(strategy: str, *tensors: torch.Tensor | None) -> str:
    """``strategy``, or the device's :data:`TRAINING_STRATEGY` for ``"auto"`` under autograd."""
    if strategy != "auto" or not needs_grad(*tensors):
        return strategy
    device = next(t.device.type for t in tensors if t is not None)
    return TRAINING_STRATEGY.get(device, TRAINING_STRATEGY["cpu"])


@dataclass(frozen=True, slots=True, eq=False)
class Prepared:
    """A planned problem and the configuration it runs with.

    Attributes:
        problem: the validated indices.
        plan: the plan, built with the configuration's plan knobs, on the operands' device.
        strategy: the strategy name passed to :func:`fusekit.gms.gms`.
        config: the selected configuration (None when a strategy was named).
        source: where the choice came from (``"cache"``, ``"nearest"``, ``"tree"``,
            ``"model"`` or ``"named"``).
    """

    problem: GMSProblem
    plan: GMSPlan
    strategy: str
    config: Config | None
    source: str

    def __call__(
        self, x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``Y[d, m] (+)= c * X[g] @ W[s]`` with this plan, strategy and launch settings."""
        import contextlib

        from fusekit.gms.api import gms
        from fusekit.gms.launch import launch

        scope = launch(self.config.launch) if self.config is not None else contextlib.nullcontext()
        with scope:
            return gms(x, w, self.plan, scale, self.strategy)


def prepare(
    problem: GMSProblem,
    k: int,
    m: int,
    dtype: torch.dtype,
    *,
    has_scale: bool,
    device: torch.device,
    strategy: str = "auto",
) -> Prepared:
    """Plan ``problem`` for operands of width ``k`` -> ``m`` and choose how to run it.

    Args:
        problem: indices on ``device``.
        k: columns of ``x``.
        m: columns of the output.
        dtype: the operands' dtype.
        has_scale: whether the calls pass a per-pair scale.
        device: where the operands live.
        strategy: ``"auto"`` (the selector) or any strategy :func:`fusekit.gms.gms` accepts.

    Returns:
        The :class:`Prepared` problem.
    """
    from fusekit.gms.problem import plan

    if strategy != "auto":
        return Prepared(problem, plan(problem), strategy, None, "named")
    from fusekit.gms.features import features_of_problem
    from fusekit.gms.selector import select

    # features from counts (equal to those of the default plan), then one plan with the knobs
    choice = select(features_of_problem(problem, k, m, dtype, has_scale), local_target(device))
    cfg = choice.config
    chosen = plan(problem, tile_rows=cfg.tile_rows, blocks=cfg.blocks, schedule=cfg.schedule)
    log.info("nn: %s from %s for %d pairs", cfg.strategy.name, choice.source, problem.num_pairs)
    return Prepared(problem, chosen, cfg.strategy.name, cfg, choice.source)


_TARGETS: dict[str, Any] = {}


def local_target(device: torch.device) -> Any:
    """The measured local target of ``device`` (measured once per process and machine)."""
    key = f"{device.type}:{device.index or 0}"
    if key not in _TARGETS:
        if device.type == "cuda":
            from fusekit.hw.detect_gpu import detect_gpu

            _TARGETS[key] = detect_gpu(device.index or 0)
        else:
            from fusekit.hw.detect import detect

            _TARGETS[key] = detect()
    return _TARGETS[key]


@dataclass(slots=True)
class IndexCache:
    """Remembers what was built from the last few index tensors a layer saw.

    A hit needs the very same tensor objects (``is``) at the same version (no in-place change
    since), and equal extra keys (sizes, dtype). The cache holds references to the tensors, so
    their memory cannot be freed and reused by different indices under the same address.

    Attributes:
        size: entries kept (least recently used dropped first).
    """

    size: int = 4
    _entries: list[tuple[tuple[Any, ...], Hashable, Any]] = field(default_factory=list)

    def get(
        self, tensors: tuple[torch.Tensor | None, ...], extra: Hashable, build: Callable[[], Any]
    ) -> Any:
        """The value built for ``tensors`` and ``extra``, building it on a miss."""
        stamp = tuple((t, t._version) if t is not None else None for t in tensors)
        for i, (held, key, value) in enumerate(self._entries):
            if (
                key == extra
                and len(held) == len(stamp)
                and all(_same(a, b) for a, b in zip(held, stamp, strict=True))
            ):
                self._entries.append(self._entries.pop(i))
                return value
        value = build()
        self._entries.append((stamp, extra, value))
        if len(self._entries) > self.size:
            self._entries.pop(0)
        return value

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return a[0] is b[0] and a[1] == b[1]
