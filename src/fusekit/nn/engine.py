"""What every nn layer shares: plan a g-mm-s problem once, choose its configuration, run it.

A layer calls :func:`prepare` when it sees new indices and keeps the :class:`Prepared` it returns
while the same index tensors come back with the same contents (:class:`IndexCache`: identity,
version counter and :func:`fingerprint`): the sort and tiling of :func:`fusekit.gms.plan` and
the selector's answer are paid once per graph, kernel map or routing, never per forward.

The choice (``strategy="auto"``): :func:`fusekit.gms.select` on the problem's features, the
device's measured target (:func:`fusekit.gms.target_for`) and the layer's
:class:`~fusekit.gms.Constraints` (``training=True`` under autograd, :func:`needs_grad`): the
tuning cache when the problem was tuned, else the shipped decision tree, else the cost model.
A named strategy (``"(GMS)seg"``, ``"transform-first"``, ...) skips the selector and runs with
the default plan and launch.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np
import torch

from fusekit.gms import GMSPlan, GMSProblem, plan
from fusekit.gms.api import gms
from fusekit.gms.candidates import Config
from fusekit.gms.features import features_of_problem
from fusekit.gms.launch import launch
from fusekit.gms.selector import Constraints, select
from fusekit.gms.target import target_for

log = logging.getLogger(__name__)


def needs_grad(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd records a call on ``tensors`` (``None`` entries are skipped)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


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
    constraints: Constraints | None = None,
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
        constraints: what the selector may answer for ``"auto"`` (any legal configuration
            when None).

    Returns:
        The :class:`Prepared` problem.
    """
    if strategy != "auto":
        return Prepared(problem, plan(problem), strategy, None, "named")
    # features from counts (equal to those of the default plan), then one plan with the knobs
    features = features_of_problem(problem, k, m, dtype, has_scale)
    choice = select(features, target_for(device), constraints or Constraints())
    cfg = choice.config
    chosen = plan(problem, tile_rows=cfg.tile_rows, blocks=cfg.blocks, schedule=cfg.schedule)
    log.info("nn: %s from %s for %d pairs", cfg.strategy.name, choice.source, problem.num_pairs)
    return Prepared(problem, chosen, cfg.strategy.name, cfg, choice.source)


#: Columns of the ``[n / B, B]`` view :func:`fingerprint_reference` reduces.
FINGERPRINT_BLOCK = 4096


def fingerprint(t: torch.Tensor) -> tuple[Any, ...]:
    r"""A cheap content check of an index tensor: its dtype, shape and two sums mod :math:`2^{64}`.

    With :math:`v_i` the elements in row-major order, as int64,

    .. math::

        \Big(\sum_i v_i,\; \sum_i (2 i + 1)\, v_i\Big) \bmod 2^{64}

    Any change of one element changes the second sum (:math:`2 i + 1` is odd, so invertible
    mod :math:`2^{64}`), and so does any swap of two different values unless
    :math:`2 (v_i - v_j)(j - i)` is a multiple of :math:`2^{64}`. Unlike ``t._version`` it sees
    edits made through ``t.data``, a numpy array or a DLPack capsule sharing the memory.

    One serial numba pass over CPU int32/int64 tensors (a parallel torch reduction waits for its
    thread pool, which on a busy host costs more than the pass), :func:`fingerprint_reference`
    on other devices and dtypes.

    Args:
        t: an integer (or bool) tensor.

    Returns:
        ``(dtype, shape, sum, weighted sum)``, comparable with ``==``.
    """
    v = t.detach().reshape(-1)
    if v.device.type == "cpu" and v.dtype in (torch.int32, torch.int64):
        sums = tuple(int(s) for s in _weighted_sums(v.numpy()))
    else:
        sums = fingerprint_reference(v)
    return (t.dtype, tuple(t.shape), *sums)


@numba.njit(cache=True)  # serial: a parallel launch costs more than the pass
def _weighted_sums(v):  # type: ignore[no-untyped-def]
    """``(sum_i v_i, sum_i (2 i + 1) v_i)`` in wrapping int64 arithmetic."""
    total = np.int64(0)
    weighted = np.int64(0)
    for i in range(v.shape[0]):
        x = np.int64(v[i])
        total += x
        weighted += x * (2 * i + 1)
    return total, weighted


def fingerprint_reference(v: torch.Tensor) -> tuple[int, int]:
    """The two sums of :func:`fingerprint` in torch ops, on any device (``v`` flat).

    From the column and row sums of the ``[n / B, B]`` view (:math:`2 i + 1 = (2c + 1) + 2 B r`
    for :math:`i = B r + c`): two memory-bound reductions and no weight tensor of ``n``.
    """
    n, b = v.numel(), FINGERPRINT_BLOCK
    full = n - n % b
    i64 = torch.int64
    head = v[:full].view(-1, b)
    tail = v[full:].to(i64)
    cols = torch.arange(b, dtype=i64, device=v.device)
    rows = torch.arange(full // b, dtype=i64, device=v.device)
    col_sums, row_sums = head.sum(0, dtype=i64), head.sum(1, dtype=i64)
    tail_weights = 2 * (full + cols[: n - full]) + 1
    sums = torch.stack(
        [
            col_sums.sum() + tail.sum(),
            ((2 * cols + 1) * col_sums).sum()
            + ((2 * b) * rows * row_sums).sum()
            + (tail_weights * tail).sum(),
        ]
    )
    total, weighted = sums.tolist()
    return total, weighted


@dataclass(slots=True)
class IndexCache:
    """Remembers what was built from the last few index tensors a layer saw.

    A hit needs the very same tensor objects (``is``) at the same version and with the same
    :func:`fingerprint` (no in-place change since, including changes the version counter
    misses: through ``.data`` or a numpy array sharing the memory), and equal extra keys
    (sizes, dtype). An entry whose tensors changed is dropped and built again. The cache holds
    references to the tensors, so their memory cannot be freed and reused by different
    indices under the same address.

    Attributes:
        size: entries kept (least recently used dropped first).
    """

    size: int = 4
    _entries: list[tuple[tuple[Any, ...], tuple[Any, ...], Hashable, Any]] = field(
        default_factory=list
    )

    def get(
        self, tensors: tuple[torch.Tensor | None, ...], extra: Hashable, build: Callable[[], Any]
    ) -> Any:
        """The value built for ``tensors`` and ``extra``, building it on a miss."""
        stamp = tuple((t, t._version) if t is not None else None for t in tensors)
        prints = None
        for i, (held, held_prints, key, value) in enumerate(self._entries):
            if (
                key == extra
                and len(held) == len(stamp)
                and all(_same(a, b) for a, b in zip(held, stamp, strict=True))
            ):
                # the same versions: the contents decide
                pairs = zip(held, stamp, strict=True)
                if all(a is None or (b is not None and a[1] == b[1]) for a, b in pairs):
                    prints = _prints(tensors)
                    if prints == held_prints:
                        self._entries.append(self._entries.pop(i))
                        return value
                self._entries.pop(i)  # the tensors changed since: build again
                break
        prints = _prints(tensors) if prints is None else prints
        value = build()
        self._entries.append((stamp, prints, extra, value))
        if len(self._entries) > self.size:
            self._entries.pop(0)
        return value

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()


def _prints(tensors: tuple[torch.Tensor | None, ...]) -> tuple[Any, ...]:
    return tuple(fingerprint(t) if t is not None else None for t in tensors)


def _same(a: Any, b: Any) -> bool:
    """Whether two stamps hold the same tensor object (or are both None)."""
    if a is None or b is None:
        return a is b
    return a[0] is b[0]
