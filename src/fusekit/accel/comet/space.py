r"""COMET's mapping space: the 8-level tilings its generator enumerates, scored by the tree model.

A tiling gives each dimension a factor at each of 8 levels (DRAM temporal, DRAM spatial X/Y, GB
temporal, GB spatial X/Y, core temporal, compute tile) whose product is the dimension; a
constraints file fixes some of them (COMET's ``constraints*.yaml``: ``target``, ``type``, one
``factors`` line, or two for the spatial X and Y levels). Without a file the constraints are the
shipped ones, read off the hierarchy: N split over the global buffers (DRAM spatial) and over
the cores under each (GB spatial), M and K never split spatially, N and K whole at the DRAM and
GB temporal levels. Each tiling becomes the ``constants`` COMET's generator writes for its
mapping template (``M_SE = M_core M_compute``, ``red_factor = M_compute``, ...), and the run is
evaluated by the tree model (:mod:`fusekit.accel.tree_model`): the fit check first, then cycles
and energy.

The search prunes by a lower bound (:meth:`Space.lower_bound`): the ops' ideal compute cycles,

.. math::

    LB = \sum_{op} \frac{(|op| / |prim_{op}|) \, t_{prim}(prim_{op})}{n_{unit}},

each op's iteration space over its compute primitive, times one primitive's cycles on its unit,
over the unit's instances across the chip (what COMET's report calls ideal compute cycles). The
total cannot be smaller: every op's primitives run somewhere, at most ``n_unit`` at a time, and
COMET's total adds each op's compute time (TMW) to the transfers' exposed cycles. It depends only
on the constants the ``Operation`` nodes name (compute tile, reduction factors), so it is
computed once per distinct compute tile, not per tiling. Tilings are scored in the order of
their bound; the search stops at the first whose bound exceeds the best cycles found, which
gives the same best tiling as scoring every one (tested).
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import random
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from fusekit.accel.comet import templates
from fusekit.accel.comet.files import (
    MappingTemplate,
    compile_mapping,
    instance_keys,
    load_document,
    read_arch,
    read_problem,
    walk_nodes,
)
from fusekit.accel.compat import Compat
from fusekit.accel.tree import Chain, Hierarchy, TreeMapping, release, tree_to_dict
from fusekit.accel.tree_model.compute import ideal_op_cycles
from fusekit.accel.tree_model.fit import fit_check
from fusekit.accel.tree_model.records import FitError
from fusekit.accel.tree_model.stages import analyse

if TYPE_CHECKING:
    from fusekit.accel.tree_model import compiled as cc

#: A search of at least this many tilings scores them by the compiled evaluator by default; a
#: smaller one by the reference, which costs less than a first compile of the evaluator (about
#: a minute, once per install: numba keeps it on disk).
COMPILED_MIN_TILINGS = 2000

LEVELS = ("DRAM_temporal", "DRAM_spatial_X", "DRAM_spatial_Y", "GB_temporal", "GB_spatial_X",
          "GB_spatial_Y", "Core_temporal", "Compute")  # fmt: skip

Tiling = dict[str, tuple[int, ...]]


def read_constraints(path: str | Path) -> dict[str, dict[int, int]]:
    """Fixed factors (dim -> level index -> factor) of a COMET constraints file."""
    doc = load_document(Path(path))
    out: dict[str, dict[int, int]] = {}
    for entry in doc.get("mapping_constraints") or []:
        lines = entry["factors"]
        for i, line in enumerate(lines):
            name = f"{entry['target']}_{entry['type']}"
            if len(lines) > 1:
                name += "_X" if i == 0 else "_Y"
            level = LEVELS.index(name)
            for item in str(line).split():
                dim, value = item.split("=")
                out.setdefault(dim, {})[level] = int(value)
    return out


def arch_constraints(arch: Hierarchy) -> dict[str, dict[int, int]]:
    """The shipped constraints, read off the hierarchy (see the module docstring)."""
    gb = next(lv for lv in arch.levels.values() if lv.name == "GB")
    core = next(lv for lv in arch.levels.values() if lv.name == "IB")
    net_gb = arch.levels["DRAM"].child_nets["GB"]
    net_core = gb.child_nets["IB"]
    del core
    return {
        "N": {0: 1, 1: net_gb.dims[0], 2: net_gb.dims[1], 3: 1, 4: net_core.dims[0],
              5: net_core.dims[1]},
        "M": {1: 1, 2: 1, 4: 1, 5: 1},
        "K": {0: 1, 1: 1, 2: 1, 3: 1, 4: 1, 5: 1},
    }  # fmt: skip


def factor_sets(n: int, fixed: dict[int, int]) -> list[tuple[int, ...]]:
    """Every 8-level factor tuple of ``n`` with the ``fixed`` levels' factors."""
    rest = n
    for v in fixed.values():
        if rest % v:
            return []
        rest //= v
    free = [i for i in range(len(LEVELS)) if i not in fixed]
    divisors = [d for d in range(1, rest + 1) if rest % d == 0]
    out = []
    for combo in itertools.product(divisors, repeat=len(free)):
        if math.prod(combo) == rest:
            t = [fixed.get(i, 0) for i in range(len(LEVELS))]
            for i, v in zip(free, combo, strict=True):
                t[i] = v
            out.append(tuple(t))
    return out


def constants(tiling: Tiling, dims: dict[str, int]) -> dict[str, Any]:
    """The constants COMET's generator writes for a tiling of the shipped mapping template."""
    m, n, k = tiling["M"], tiling["N"], tiling["K"]
    return {
        **dims,
        "M_A_DRAM_temporal": m[0], "M_H_DRAM_temporal": m[0],
        "N_DRAM_spatial_X": n[1], "N_DRAM_spatial_Y": n[2],
        "K_A_GB_temporal": k[3], "M_A_GB_temporal": m[3], "M_D_GB_temporal": m[3],
        "M_F_GB_temporal": m[3], "M_H_GB_temporal": m[3], "N_A_GB_temporal": n[3],
        "N_GB_spatial_X": n[4], "N_GB_spatial_Y": n[5],
        "M_Core_temporal": m[6], "N_Core_temporal": n[6], "K_Core_temporal": k[6],
        "M_Compute": m[7], "N_Compute": n[7], "K_Compute": k[7],
        "M_SE": m[6] * m[7], "N_SE": n[6], "K_SE": 1, "M_SM": 1, "N_SM": n[7],
        "K_SM": dims["K"], "red_dim_simd": "K", "red_dim_simd_val": dims["K"],
        "red_dim": "M", "red_factor": m[7], "red_dim_pv": "N", "red_factor_pv": n[7],
    }  # fmt: skip


@dataclass(frozen=True, slots=True)
class Scored:
    """One tiling and its evaluation (``None`` when the fit check rejects it)."""

    tiling: Tiling
    total_cycles: int | None
    total_energy_pj: float | None


@dataclass(frozen=True, slots=True)
class SpaceResult:
    """The search: the tilings scored, the best, and the median of a seeded sample.

    ``scored`` holds the rejected tilings (cycles ``None``) and those scored exactly; the
    ``pruned`` ones, whose lower bound exceeds the best cycles, are counted, not scored.
    """

    scored: tuple[Scored, ...]
    best: Scored
    sample_median_cycles: float
    sample_size: int
    tilings: int = 0
    rejected: int = 0
    pruned: int = 0


def _op_constant_names(doc: Any) -> set[str]:
    """Names the ``Operation`` nodes of a mapping document read (primitive, steps, attributes)."""
    out: set[str] = set()
    for node in walk_nodes(doc):
        if str(node.get("node_type", "")).lower() == "operation":
            for key in ("TilePrimitive", "TileSteps", "compute_attributes"):
                out.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", str(node.get(key, ""))))
    return out


def label(tiling: Tiling) -> str:
    """COMET's oracle spelling: ``M=1x1x1x8x1x1x4x8 N=... K=...``."""
    return " ".join(f"{d}={'x'.join(map(str, tiling[d]))}" for d in ("M", "N", "K"))


class Space:
    """A mapping template (arch, problem, mapping files) whose tilings are searched."""

    def __init__(self, template: str | Path, arch_doc: dict[str, Any] | None = None) -> None:
        d = Path(template)
        self.arch_doc = arch_doc if arch_doc is not None else load_document(d / "arch.yaml")
        self.problem_doc = load_document(d / "problem.yaml")
        self.mapping_doc = load_document(d / "mapping.yaml")
        self.arch = read_arch(self.arch_doc, "arch")
        self.mapping_file = str(d / "mapping.yaml")
        self._bounds: dict[tuple[Any, ...], int] = {}
        self._op_names: list[str] | None = None
        self._memo: dict[tuple[Any, ...], dict[tuple[Any, ...], Any]] = {}
        self._template: MappingTemplate | None = None
        self._chains: dict[tuple[Any, ...], Chain] = {}
        self._size_keys = instance_keys(self.problem_doc)
        self._compiled: dict[tuple[Any, ...], tuple[cc.CompiledTemplate | None, int]] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Pickled for worker processes without the leaf memo, compiled mapping and problems.

        Each worker grows its own; the template holds the compile step's failed checks, which
        need not pickle.
        """
        return {**self.__dict__, "_memo": {}, "_template": None, "_chains": {}, "_compiled": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @classmethod
    def builtin(cls, op: str, arch_doc: dict[str, Any]) -> Space:
        """The space of built-in op ``op`` (:mod:`.templates`) on the arch ``arch_doc``."""
        sp = cls.__new__(cls)
        sp.arch_doc, sp.problem_doc, sp.mapping_doc = (
            arch_doc,
            templates.problem(op),
            templates.mapping(op),
        )
        sp.arch = read_arch(arch_doc, "arch")
        sp.mapping_file = f"<{op} template>/mapping.yaml"
        sp._bounds, sp._op_names, sp._memo = {}, None, {}
        sp._template, sp._chains = None, {}
        sp._size_keys = instance_keys(sp.problem_doc)
        sp._compiled = {}
        return sp

    def inputs(self, tiling: Tiling, dims: dict[str, int]) -> TreeMapping:
        """The tree of one tiling.

        The same tree as reading the files with the tiling's constants: the mapping document is
        compiled once (:func:`compile_mapping`) and each tiling builds fresh nodes from it; the
        problem is read once per values of the constants its sizes name.
        """
        const = constants(tiling, dims)
        prob = self._problem(const)
        if self._template is None:
            self._template = compile_mapping(self.mapping_doc, prob, self.arch, "mapping.yaml")
        root = self._template.build(const)
        return TreeMapping(self.arch, prob, root, const, self.mapping_file)

    def _problem_key(self, const: dict[str, Any]) -> tuple[Any, ...]:
        """The values of the constants the problem's sizes read (its cache key)."""
        return tuple((k in const, type(v := const.get(k)), v) for k in self._size_keys)

    def _problem(self, const: dict[str, Any]) -> Chain:
        """The problem read with ``const``, kept per values of the constants its sizes read."""
        key = self._problem_key(const)
        try:
            hit = self._chains.get(key)
        except TypeError:  # an unhashable constant: read it each time
            return read_problem(self.problem_doc, const, "problem.yaml")
        if hit is None:
            hit = read_problem(self.problem_doc, const, "problem.yaml")
            self._chains[key] = hit
        return hit

    def tilings(self, dims: dict[str, int], fixed: dict[str, dict[int, int]]) -> list[Tiling]:
        """Every tiling of ``dims`` under the constraints ``fixed``."""
        sets = {d: factor_sets(v, fixed.get(d, {})) for d, v in dims.items()}
        return [dict(zip(sets, combo, strict=True)) for combo in itertools.product(*sets.values())]

    def count(self, dims: dict[str, int], fixed: dict[str, dict[int, int]]) -> int:
        """How many tilings :meth:`tilings` gives, without building them."""
        return math.prod(len(factor_sets(v, fixed.get(d, {}))) for d, v in dims.items())

    def fits(self, tiling: Tiling, dims: dict[str, int], compat: Compat) -> bool:
        """Whether COMET's fit check accepts the tiling (stage 1 only)."""
        try:
            fit_check(self.inputs(tiling, dims), compat)
        except FitError:
            return False
        return True

    def lower_bound(
        self, tiling: Tiling, dims: dict[str, int], compat: Compat | None = None
    ) -> int:
        """Cycles no evaluation of ``tiling`` can go below (see the module docstring).

        Cached per values of the constants the ``Operation`` nodes read, so a tree is built
        once per distinct compute tile of a search. ``compat``: as :meth:`score` is given (the
        native model reads SIMD cycles from the arch where it gives them).
        """
        arch_costs = compat is not None and not compat.simd_constants
        const = constants(tiling, dims)
        if self._op_names is None:
            self._op_names = sorted(_op_constant_names(self.mapping_doc) & set(const))
        key = (arch_costs, tuple(sorted(dims.items())), *(const[n] for n in self._op_names))
        hit = self._bounds.get(key)
        if hit is None:
            hit = sum(ideal_op_cycles(self.inputs(tiling, dims), arch_costs).values())
            self._bounds[key] = hit
        return hit

    def score(
        self,
        tiling: Tiling,
        dims: dict[str, int],
        compat: Compat,
        memo: bool = True,
        fold: bool = True,
        compiled: bool = False,
    ) -> Scored:
        """Fit check, then cycles and energy.

        ``compiled``: by the compiled evaluator (:meth:`score_many`, the same numbers, tested),
        unless ``memo`` or ``fold`` is ``False``; ``False`` (the default): by the reference
        (:func:`~fusekit.accel.tree_model.stages.analyse`).
        ``memo``: reuse the leaves other tilings of the same dims and ``compat`` already gave
        (``analyse``'s ``memo``; the same numbers, tested); ``False`` evaluates every node.
        ``fold``: fold leaves whose costs repeat (``analyse``'s ``fold``; the same numbers).
        The tiling's tree is released after (:func:`fusekit.accel.tree.release`).
        """
        if compiled and memo and fold:
            return self.score_many([tiling], dims, compat)[0]
        cache = self._memo.setdefault((tuple(sorted(dims.items())), compat), {}) if memo else None
        if cache is not None and len(cache) > 200_000:
            cache.clear()  # bound the memory of very long sweeps
        inp = self.inputs(tiling, dims)
        try:
            out = analyse(inp, compat=compat, memo=cache, fold=fold, detail=False)
        except FitError:
            return Scored(tiling, None, None)
        finally:
            release(inp.mapping)
        return Scored(tiling, int(out["total_cycles"]), float(out["total_energy_pj"]))

    def score_many(
        self, tilings: list[Tiling], dims: dict[str, int], compat: Compat
    ) -> list[Scored]:
        """:meth:`score` of each tiling, by the compiled evaluator where it can.

        The tilings of one problem share a :class:`~fusekit.accel.tree_model.compiled.
        CompiledTemplate` (built on first use from a tiling the reference evaluates); a tiling
        it cannot give (an error other than the fit check's, a shape-changing constant, a
        template it cannot compile) is scored by the reference, which raises as ever.
        """
        from fusekit.accel.tree_model import compiled as cc

        out: list[Scored | None] = [None] * len(tilings)
        consts = [constants(t, dims) for t in tilings]
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, c in enumerate(consts):
            groups.setdefault(self._problem_key(c), []).append(i)
        for pkey, idx in groups.items():
            tpl = self._compiled_template(pkey, [tilings[i] for i in idx], dims, compat)
            if tpl is None:
                continue
            vals, at = tpl.values_many([consts[i] for i in idx])
            if vals is None:
                continue
            kept = [idx[j] for j in at]
            status, cycles, energy = tpl.score(vals)
            for j, i in enumerate(kept):
                if status[j] == cc.OK:
                    out[i] = Scored(tilings[i], int(cycles[j]), float(energy[j]))
                elif status[j] == cc.NO_FIT:
                    out[i] = Scored(tilings[i], None, None)
        return [
            sc if sc is not None else self.score(t, dims, compat, compiled=False)
            for t, sc in zip(tilings, out, strict=True)
        ]

    def _compiled_template(
        self, pkey: tuple[Any, ...], tilings: list[Tiling], dims: dict[str, int], compat: Compat
    ) -> cc.CompiledTemplate | None:
        """The compiled template of one problem, dims and ``compat``; ``None``: not (yet) one.

        Built from the first of ``tilings`` that passes the fit check and that the reference
        evaluates (a search in bound order may meet many rejected tilings first); after 32
        fitting tilings that gave none, the template is left to the reference.
        """
        from fusekit.accel.tree_model import compiled as cc

        key = (tuple(sorted(dims.items())), compat, pkey)
        tpl, tried = self._compiled.get(key, (None, 0))
        if tpl is not None or tried >= 32:
            return tpl
        fitting = list(itertools.islice((t for t in tilings if self.fits(t, dims, compat)),
                                        min(8, 32 - tried)))  # fmt: skip
        tpl = cc.compile_template(
            fitting, lambda t: self.inputs(t, dims), lambda: self._template, compat, len(fitting)
        )
        self._compiled[key] = (tpl, tried + len(fitting))
        return tpl

    def search(
        self,
        dims: dict[str, int],
        fixed: dict[str, dict[int, int]] | None = None,
        sample: int = 6,
        seed: int = 0,
        compat: Compat | None = None,
        workers: int = 1,
        prune: bool = True,
        compiled: bool | None = None,
    ) -> SpaceResult:
        """Score the tilings in bound order; stop where the bound passes the best cycles.

        COMET's sampler is modelled as a seeded shuffle of all tilings whose first ``sample``
        accepted ones are run; their median is reported (those picks are scored, pruned or
        not). Only scored tilings are fit-checked, so ``rejected`` counts the rejected among
        them (all of them with ``prune=False``).

        Args:
            dims: the extents.
            fixed: fixed factors (dim -> level index -> factor); the arch's by default.
            sample: accepted tilings in the seeded sample.
            seed: the sample's seed.
            compat: COMET's defects to reproduce (all by default).
            workers: processes scoring tilings.
            prune: stop at the lower bound (``False`` scores every tiling).
            compiled: score by the compiled evaluator (:meth:`score_many`) or the reference;
                ``None``: compiled for a space of at least ``COMPILED_MIN_TILINGS`` tilings.

        Raises:
            ValueError: no tiling meets the constraints, or none passes the fit check.
        """
        compat = compat or Compat()
        fixed = fixed if fixed is not None else arch_constraints(self.arch)
        tilings = self.tilings(dims, fixed)
        if not tilings:
            need = {d: math.prod(fixed.get(d, {}).values()) for d in dims}
            bad = ", ".join(f"{d}={v} is not a multiple of {need[d]}" for d, v in dims.items()
                            if v % need[d])  # fmt: skip
            raise ValueError(
                f"comet space: no tiling of {dims} meets the constraints (an extent must be a "
                f"multiple of the product of its fixed factors): {bad}"
            )
        use_compiled = len(tilings) >= COMPILED_MIN_TILINGS if compiled is None else compiled
        bounds = [self.lower_bound(t, dims, compat) for t in tilings]
        order = sorted(range(len(tilings)), key=lambda i: bounds[i])
        exact: dict[int, Scored] = {}
        best: Scored | None = None
        pool = None
        if workers > 1:
            pool = multiprocessing.Pool(workers)

        def run(idx: list[int]) -> None:
            args = [(tilings[i], dims, compat) for i in idx if i not in exact]
            if use_compiled:
                ts, w = [a[0] for a in args], max(1, workers)  # tiling j: chunk j % w
                chunks = [(ts[k::w], dims, compat) for k in range(w)]
                parts = (pool.starmap(self.score_many, chunks) if pool
                         else [self.score_many(*chunks[0])])  # fmt: skip
                got = [parts[j % w][j // w] for j in range(len(ts))]
            else:
                got = pool.starmap(self.score, args) if pool else [self.score(*a) for a in args]
            for i, sc in zip([i for i in idx if i not in exact], got, strict=True):
                exact[i] = sc

        try:
            batch = max(1, workers) * 8
            for pos in range(0, len(order), batch):
                if prune and best is not None and bounds[order[pos]] > (best.total_cycles or 0):
                    break
                idx = order[pos : pos + batch]
                run(idx)
                for i in idx:
                    sc = exact[i]
                    if sc.total_cycles is not None and (
                        best is None
                        or (sc.total_cycles, sc.total_energy_pj) < (best.total_cycles,
                                                                    best.total_energy_pj)
                    ):  # fmt: skip
                        best = sc
            if best is None:
                raise ValueError(f"comet space: no tiling of {dims} passes the fit check")
            shuffled = list(range(len(tilings)))
            random.Random(seed).shuffle(shuffled)
            picks: list[int] = []
            for pos in range(0, len(shuffled), batch):
                if len(picks) >= sample:
                    break
                chunk = shuffled[pos : pos + batch]
                run(chunk)
                picks += [i for i in chunk if exact[i].total_cycles is not None][
                    : sample - len(picks)
                ]
        finally:
            if pool is not None:
                pool.close()
                pool.join()
        median = statistics.median([c for i in picks if (c := exact[i].total_cycles) is not None])
        scored = tuple(exact[i] for i in sorted(exact))
        rejected = sum(1 for s in scored if s.total_cycles is None)
        return SpaceResult(scored, best, float(median), len(picks), len(tilings), rejected,
                           len(tilings) - len(scored))  # fmt: skip

    def write(self, out_dir: str | Path, tiling: Tiling, dims: dict[str, int], hw: str) -> Path:
        """Write the tiling as COMET's four files, ``fusekit.yaml`` (the tiling) and ``tree.yaml``.

        ``tree.yaml`` is fusekit's own form of the whole tree (:func:`tree_to_dict`);
        ``fusekit accel comet DIR/tree.yaml`` evaluates it without COMET's files.
        """
        d = Path(out_dir)
        d.mkdir(parents=True, exist_ok=True)
        dump = {"sort_keys": False, "default_flow_style": None, "width": 100}
        (d / "arch.yaml").write_text(yaml.safe_dump(self.arch_doc, **dump))
        (d / "problem.yaml").write_text(yaml.safe_dump(self.problem_doc, **dump))
        (d / "mapping.yaml").write_text(yaml.safe_dump(self.mapping_doc, **dump))
        const = constants(tiling, dims)
        (d / "constants.yaml").write_text(yaml.safe_dump({"const": const}, sort_keys=False))
        own = {
            "space": "comet",
            "hw": hw,
            "extents": dims,
            "levels": list(LEVELS),
            "tiling": {k: list(v) for k, v in tiling.items()},
            "label": label(tiling),
        }
        (d / "fusekit.yaml").write_text(yaml.safe_dump(own, **dump))
        tree = tree_to_dict(self.inputs(tiling, dims))
        (d / "tree.yaml").write_text(yaml.safe_dump(tree, **dump))
        return d
