"""Choose a strategy and a configuration for a problem in microseconds, without measuring.

Two selectors, compared in ``benchmarks/gms_select.py`` (the more accurate one is the default):

* **tree** (:class:`TreeSelector`): a multi-output regression tree (scikit-learn) over the
  problem's feature vector. It is trained on tuned problems: for every training problem and every
  candidate configuration (the configurations that were best or near-best on some problem), the
  target is ``log2(time / best time)``; the tree groups problems whose candidates rank alike, and
  a leaf answers the candidate with the smallest mean slowdown that is legal for the problem's
  reduce. Inference walks the exported arrays in plain Python (no scikit-learn, no pickle):
  a few microseconds.
* **model** (:func:`select_by_model`): the argmin of the performance model over the whole space
  (``fusekit.gms.model``); works for any target, GPUs included, with no training at all.

:func:`select` answers, in this order: the tuning cache's measured best for exactly this problem,
the measured best of the nearest tuned problem of the same dtype and reduce (within
:data:`NEAREST_DISTANCE`), the tree (CPU targets, when one is trained for the problem's dtype),
the model. Every answer is the best one the caller's :class:`Constraints` allow (orders,
dataflows, training): the first legal candidate of the tree's leaf, the model's argmin over the
legal configurations, the fastest legal measured point; callers never edit the answer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fusekit.errors import expected, require
from fusekit.gms import model
from fusekit.gms.candidates import Config, Dataflow, Order, Strategy, config_of
from fusekit.gms.features import VECTOR_NAMES, Features
from fusekit.gms.search import MODEL_NAME, checked, hardware_key, space_configs, space_keys
from fusekit.hw import CPUTarget, GPUTarget
from fusekit.search.space import Point, point_key

if TYPE_CHECKING:
    from fusekit.search.cache import Entry, TuningCache

#: The shipped tree, trained by ``benchmarks/gms_select.py --train`` on this project's CPU.
DEFAULT_TREE = "selector_tree.json"
TREE_FORMAT = "fusekit-gms-selector-tree"
#: How far (Euclidean, in the log2 units of ``Features.vector``) a tuned problem may be from a
#: new one for its measured best to answer it: about one doubling of one size or ratio.
NEAREST_DISTANCE = 1.0

#: The strategy that runs under autograd, per target kind (the model ranks forwards only): the
#: backward known to be fast there (CPU: no [E, K] pair buffer; GPU: the vendor segment GEMM).
TRAINING: Mapping[str, Strategy] = {
    "cpu": Strategy(Order.PAIRWISE, Dataflow.GMS_SEG),
    "gpu": Strategy(Order.PAIRWISE, Dataflow.G_MSEG_S),
}


@dataclass(frozen=True, slots=True)
class Constraints:
    """What a caller allows the selector to answer (every answer is legal for it).

    The reduce's own rule (aggregating before the GEMM needs a linear reduce, see
    :meth:`~fusekit.gms.candidates.Order.allows`) always applies, from the features' reduce.

    A source that ranks configurations (the model, measured points) answers the best legal one.
    The tree knows only its candidates: a ranked candidate whose strategy the caller cannot run
    runs as :meth:`run_as` (the allowed strategy, the knobs the leaf ranked), so that a kernel
    map runs the leaf's dataflow and knobs pairwise.

    Attributes:
        orders: the orders the caller may run (a kernel map: :attr:`Order.PAIRWISE` only).
        dataflows: the dataflows it may run (one: a strategy the caller named).
        training: the backward runs too: only the target kind's :data:`TRAINING` strategy.
    """

    orders: frozenset[Order] = frozenset(Order)
    dataflows: frozenset[Dataflow] = frozenset(Dataflow)
    training: bool = False

    def run_as(self, strategy: Strategy, kind: str) -> Strategy | None:
        """What the caller runs in place of ``strategy`` on a target of ``kind``, if anything.

        ``strategy`` itself when allowed; under training the kind's :data:`TRAINING` strategy;
        an order not allowed becomes pairwise (every order computes what pairwise computes);
        a dataflow not allowed becomes the one allowed dataflow. None when neither applies.
        """
        if self.training:
            strategy = TRAINING[kind]
        order, dataflow = strategy.order, strategy.dataflow
        if order not in self.orders and Order.PAIRWISE in self.orders:
            order = Order.PAIRWISE
        if dataflow not in self.dataflows and len(self.dataflows) == 1:
            dataflow = next(iter(self.dataflows))
        if order not in self.orders or dataflow not in self.dataflows:
            return None
        return Strategy(order, dataflow)

    def allows(self, strategy: Strategy, reduce: str, kind: str) -> bool:
        """Whether ``strategy`` is legal for a problem of ``reduce`` on a target of ``kind``."""
        return self.run_as(strategy, kind) == strategy and strategy.order.allows(reduce)


#: No constraint beyond the reduce's own rule.
ANY = Constraints()


def _allows(constraints: Constraints, point: Mapping[str, Any], reduce: str, kind: str) -> bool:
    return constraints.allows(Strategy.parse(point["strategy"]), reduce, kind)


@dataclass(frozen=True, slots=True)
class Choice:
    """A selected configuration.

    Attributes:
        config: what to plan and launch.
        point: the same as a space point.
        source: ``"cache"`` (this problem was tuned), ``"nearest"`` (a similar one was),
            ``"tree"`` or ``"model"``.
        predicted_s: the model's time for it (always given, for ``explain``).
    """

    config: Config
    point: Point
    source: str
    predicted_s: float


def _for_target(point: Mapping[str, Any], cores_trained: int, cores: int) -> Point:
    """A trained point on another CPU: "all cores" stays all cores, and never more than it has."""
    out = dict(point)
    if "threads" in out:
        out["threads"] = (
            cores if int(out["threads"]) >= cores_trained else min(int(out["threads"]), cores)
        )
    return out


@dataclass(frozen=True, slots=True)
class TreeSelector:
    """A trained regression tree, as plain arrays (see the module docstring).

    Attributes:
        candidates: the configurations a leaf may answer.
        feature: ``[nodes]`` index into :data:`~fusekit.gms.features.VECTOR_NAMES`, -1 at leaves.
        threshold: ``[nodes]`` go left when ``vector[feature] <= threshold``.
        left: ``[nodes]`` left child.
        right: ``[nodes]`` right child.
        value: ``[nodes][candidates]`` mean ``log2`` slowdown of each candidate at the node.
        dtype: the dtype it was trained on.
        cores: the CPU cores of the machine it was trained on.
        trained_on: training problems.
    """

    candidates: tuple[Point, ...]
    feature: tuple[int, ...]
    threshold: tuple[float, ...]
    left: tuple[int, ...]
    right: tuple[int, ...]
    value: tuple[tuple[float, ...], ...]
    dtype: str
    cores: int
    trained_on: int
    _memo: dict[tuple[int, str, Constraints], tuple[int, str] | None] = field(
        default_factory=dict, compare=False, repr=False
    )

    def leaf(self, vector: Sequence[float]) -> int:
        """The leaf a feature vector falls into."""
        node = 0
        while self.feature[node] >= 0:
            go_left = vector[self.feature[node]] <= self.threshold[node]
            node = self.left[node] if go_left else self.right[node]
        return node

    def choose(self, f: Features, constraints: Constraints = ANY) -> Point | None:
        """The leaf's candidate with the least mean slowdown that is legal, as the caller runs it.

        Candidates are taken in rank order, each with its strategy replaced by
        :meth:`Constraints.run_as` (on a CPU: the tree's candidates are CPU points); the first
        whose strategy the caller can run and ``f.reduce`` allows is the answer. None when no
        candidate of the leaf is.
        """
        node = self.leaf(f.vector())
        key = (node, f.reduce, constraints)
        if key not in self._memo:
            self._memo[key] = None
            for i in sorted(range(len(self.candidates)), key=lambda i: self.value[node][i]):
                runs = constraints.run_as(Strategy.parse(self.candidates[i]["strategy"]), "cpu")
                if runs is not None and runs.order.allows(f.reduce):
                    self._memo[key] = (i, runs.name)
                    break
        hit = self._memo[key]
        return {**self.candidates[hit[0]], "strategy": hit[1]} if hit is not None else None

    def to_json(self) -> dict[str, Any]:
        """Plain data (the file format of :func:`load_tree`)."""
        return {
            "format": TREE_FORMAT,
            "vector": list(VECTOR_NAMES),
            "dtype": self.dtype,
            "cores": self.cores,
            "trained_on": self.trained_on,
            "candidates": [dict(c) for c in self.candidates],
            "feature": list(self.feature),
            "threshold": list(self.threshold),
            "left": list(self.left),
            "right": list(self.right),
            "value": [list(v) for v in self.value],
        }

    @classmethod
    def from_json(cls, blob: Mapping[str, Any], source: str = "tree") -> TreeSelector:
        """Read :meth:`to_json`'s form.

        Raises:
            ValueError: another format, another feature vector, or inconsistent arrays.
        """
        if blob.get("format") != TREE_FORMAT or list(blob.get("vector", [])) != list(VECTOR_NAMES):
            raise ValueError(expected("selector", source, f"a {TREE_FORMAT} file", "another"))
        n = len(blob["feature"])
        if not all(len(blob[k]) == n for k in ("threshold", "left", "right", "value")):
            raise ValueError(expected("selector", source, "arrays of one length per node", "not"))
        return cls(
            candidates=tuple(dict(c) for c in blob["candidates"]),
            feature=tuple(int(v) for v in blob["feature"]),
            threshold=tuple(float(v) for v in blob["threshold"]),
            left=tuple(int(v) for v in blob["left"]),
            right=tuple(int(v) for v in blob["right"]),
            value=tuple(tuple(float(x) for x in row) for row in blob["value"]),
            dtype=str(blob["dtype"]),
            cores=int(blob["cores"]),
            trained_on=int(blob["trained_on"]),
        )


def train_tree(
    problems: Sequence[tuple[Features, Mapping[str, float]]],
    cores: int,
    max_candidates: int = 48,
    min_samples_leaf: int = 2,
    max_depth: int = 6,
) -> TreeSelector:
    """Train the tree on tuned problems.

    Args:
        problems: ``(features, measured)`` per problem, ``measured`` mapping point keys to
            seconds; every candidate should be measured on every problem (exhaustive tunes).
            A candidate not measured on a problem counts as the problem's slowest point.
        cores: cores of the machine the measurements come from.
        max_candidates: keep the configurations with the smallest geometric-mean slowdown
            among those that were within 5% of the best on some problem (or of the best that
            a max reduce may run: aggregate-first is not one).
        min_samples_leaf: fewest training problems per leaf.
        max_depth: deepest split.

    Returns:
        The trained :class:`TreeSelector`.

    Raises:
        ValueError: no problems, or problems of several dtypes.
        MissingExtra: scikit-learn is not installed (the ``train`` extra).
    """
    DecisionTreeRegressor = require("sklearn.tree", "train_tree", "train").DecisionTreeRegressor

    if not problems:
        raise ValueError(expected("train_tree", "problems", "at least one", 0))
    dtypes = {f.dtype for f, _ in problems}
    if len(dtypes) != 1:
        raise ValueError(expected("train_tree", "problems", "one dtype", sorted(dtypes)))
    near: set[str] = set()
    for _, measured in problems:
        # the near-best points, and the near-best of those that a max reduce may run
        for allowed in (
            measured,
            {k: v for k, v in measured.items() if _allows(ANY, json.loads(k), "max", "cpu")},
        ):
            if allowed:
                best = min(allowed.values())
                near |= {k for k, v in allowed.items() if v <= 1.05 * best}
    keys = sorted(near)

    def slowdowns(measured: Mapping[str, float]) -> list[float]:
        best, worst = min(measured.values()), max(measured.values())
        return [math.log2(measured.get(k, worst) / best) for k in keys]

    y = np.array([slowdowns(m) for _, m in problems])
    keep = np.argsort(y.mean(0), kind="stable")[:max_candidates]
    keys, y = [keys[i] for i in keep], y[:, keep]
    x = np.array([f.vector() for f, _ in problems])
    tree = DecisionTreeRegressor(
        min_samples_leaf=min_samples_leaf, max_depth=max_depth, random_state=0
    ).fit(x, y)
    t = tree.tree_
    return TreeSelector(
        candidates=tuple(json.loads(k) for k in keys),
        feature=tuple(int(v) if v >= 0 else -1 for v in t.feature),
        threshold=tuple(float(v) for v in t.threshold),
        left=tuple(int(v) for v in t.children_left),
        right=tuple(int(v) for v in t.children_right),
        value=tuple(tuple(float(x) for x in row[:, 0]) for row in t.value),
        dtype=next(iter(dtypes)),
        cores=cores,
        trained_on=len(problems),
    )


def load_tree(path: Path | str | None = None) -> TreeSelector | None:
    """The tree at ``path``, or the shipped one; None when the shipped one does not exist."""
    if path is None:
        ref = resources.files("fusekit.gms").joinpath(DEFAULT_TREE)
        if not ref.is_file():
            return None
        return TreeSelector.from_json(json.loads(ref.read_text()), DEFAULT_TREE)
    return TreeSelector.from_json(json.loads(Path(path).read_text()), str(path))


def select_by_model(
    f: Features,
    target: CPUTarget | GPUTarget,
    coef: Mapping[str, float] | None = None,
    constraints: Constraints = ANY,
) -> Choice:
    """The performance model's best legal point of the whole space (any target, no training).

    Raises:
        ValueError: ``constraints`` allow no point of the space.
    """
    points, configs = space_configs(f, target)
    legal = [
        i
        for i, cfg in enumerate(configs)
        if constraints.allows(cfg.strategy, f.reduce, target.kind)
    ]
    if not legal:
        raise ValueError(
            expected("select", "constraints", "some legal configuration", repr(constraints))
        )
    if len(legal) == len(configs):
        predicted = model.predict(f, configs, target, coef)
    else:
        predicted = np.full(len(configs), np.inf)
        predicted[legal] = model.predict(f, [configs[i] for i in legal], target, coef)
    i = int(predicted.argmin())
    return Choice(configs[i], points[i], "model", float(predicted[i]))


_TREE: list[TreeSelector | None] = []


def select(
    f: Features,
    target: CPUTarget | GPUTarget,
    constraints: Constraints = ANY,
    *,
    key: str | None = None,
    cache: TuningCache | None = None,
    tree: TreeSelector | None = None,
    coef: Mapping[str, float] | None = None,
    method: str = "auto",
) -> Choice:
    """Choose a configuration without measuring: the best one ``constraints`` allow.

    Args:
        f: the problem's features.
        target: where it runs (:func:`fusekit.gms.target.target_for` of the device).
        constraints: what the caller may run (orders, dataflows, training).
        key: the problem's signature; with ``cache``, a tuned problem gets its measured best.
        cache: the tuning cache (exact and nearest answers, fitted coefficients).
        tree: a trained tree; the shipped one when None.
        coef: model coefficients (for the model and for ``predicted_s``).
        method: ``"auto"`` (cache, nearest, tree, model), ``"tree"`` or ``"model"``.

    Returns:
        The :class:`Choice`.

    Raises:
        ValueError: unknown ``method``; ``"tree"`` with no tree for this problem or no legal
            candidate in its leaf; constraints that allow no configuration.
    """
    if method not in ("auto", "tree", "model"):
        raise ValueError(expected("select", "method", "auto, tree or model", repr(method)))
    cache = checked(cache) if cache is not None else None
    hw = hardware_key(target) if cache is not None else ""
    if coef is None and cache is not None:
        coef = cache.model(hw, MODEL_NAME)
    if method == "auto" and cache is not None:
        entry = cache.lookup(hw, key) if key is not None else None
        point = _measured_best(entry, f, target, constraints) if entry is not None else None
        if point is not None:
            return _choice(point, "cache", f, target, coef)
        near = cache.nearest(hw, f.group, f.vector(), max_distance=NEAREST_DISTANCE)
        point = _measured_best(near[0], f, target, constraints) if near is not None else None
        if point is not None:
            return _choice(point, "nearest", f, target, coef)
    if method != "model" and isinstance(target, CPUTarget):
        if tree is None:
            if not _TREE:
                _TREE.append(load_tree())
            tree = _TREE[0]
        point = tree.choose(f, constraints) if tree is not None and tree.dtype == f.dtype else None
        if tree is not None and point is not None:
            return _choice(_for_target(point, tree.cores, target.cores), "tree", f, target, coef)
    if method == "tree":
        raise ValueError(expected("select", "tree", f"a tree for {f.dtype} on a CPU", "none"))
    return select_by_model(f, target, coef, constraints)


def _measured_best(
    entry: Entry, f: Features, target: CPUTarget | GPUTarget, constraints: Constraints
) -> Point | None:
    """The fastest measured point of ``entry`` that is a legal point of ``f``'s space, if any."""
    legal = space_keys(f, target)
    times = {k: t for k, t in entry.points.items() if k in legal}
    ranked = sorted(times, key=lambda k: times[k])
    for k in ranked:
        point: Point = json.loads(k)
        if _allows(constraints, point, f.reduce, target.kind):
            return point
    return None


def _choice(
    point: Point,
    source: str,
    f: Features,
    target: CPUTarget | GPUTarget,
    coef: Mapping[str, float] | None,
) -> Choice:
    cfg = config_of(point)
    if cfg.strategy.order is Order.AGGREGATE_FIRST and f.aggregate_rows is None:
        raise ValueError(expected("select", "point", "legal for the reduce", point_key(point)))
    return Choice(cfg, point, source, model.estimate(f, cfg, target, coef).total_s)
