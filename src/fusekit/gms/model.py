r"""The g-mm-s performance model: predicted time of a (strategy, config) for a problem on a target.

The prediction is a weighted sum of roofline times, one per kind of work::

    t = sum_i coef_i * term_i

    tile_gemm    = 2 R_pad K M_pad / peak / eta                  numba register tiles (CPU) or the
                                                                Triton tile (GPU), padded rows/cols
    vendor_gemm  = 2 R K M / peak                                torch.mm per segment (G-Mseg-S)
    stream       = sequential bytes / bw                         intermediates, W, Y written once
    random_dram  = randomly indexed row bytes / bw / eta         gathers/scatters of rows whose
                                                                matrix is larger than the LLC
    random_cache = the same for matrices that fit the LLC        (cache-resident rows)
    tiles        = tiles / cores * 1 us                          per-tile loop and reload overhead
    dynamic      = prange iterations / P * 0.1 us  (chunk 1)     handing out rows and blocks one
                                                                at a time instead of P slices
    threads      = (cores / P - 1) * (sum of the terms above)    running on P < cores threads
    calls        = kernel calls * launch overhead                Python dispatch / GPU launches
    atomics      = atomic row bytes / bw * pairs per scatter row fused scatter on a GPU

``R`` is the GEMM rows of the order (``E``, ``V`` or ``U``, see ``candidates.Order``), rows read
at random are rounded up to 64-byte lines, ``P`` the threads (CPU). The rates are the whole
machine's; the ``threads`` term's fitted coefficient says how much of it fewer threads lose
(1: all of it; less where the reported cores share a physical core or bandwidth).
``eta`` is the parallel efficiency: on a CPU the busiest thread's share of the destination
blocks (a row is never split, so a block holds at least the largest row's pairs; static
``prange`` gives each thread ``B/P`` consecutive blocks, dynamic hands them out one at a time),
on a GPU the programs over full waves of the SMs times the latency hiding of
``warps x stages`` (assumed saturated at 16 warp-stages per SM). Sources: the roofline (Williams
et al., CACM 2009) for every term, Efficient-GMS (DAC 2025) for the dataflows' intermediates.

The coefficients default to :data:`DEFAULT_COEF` (stated efficiencies) and are refitted per
machine from measurements by :func:`fit` (least squares on log time, weakly pulled towards the
defaults); fitted coefficients are stored in the tuning cache.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fusekit.gms.candidates import Config, Dataflow, Order
from fusekit.gms.features import Features
from fusekit.hw import CPUTarget, GPUTarget

TERMS: tuple[str, ...] = (
    "tile_gemm",
    "vendor_gemm",
    "stream",
    "random_dram",
    "random_cache",
    "tiles",
    "dynamic",
    "threads",
    "calls",
    "atomics",
)

#: Untuned coefficients: the numba register tile runs at about half the vendor GEMM's peak,
#: row-granular random access at half the streaming bandwidth, cache-resident rows at three
#: times it, one kernel call from Python costs about 3 launches.
DEFAULT_COEF: Mapping[str, float] = {
    "tile_gemm": 2.0,
    "vendor_gemm": 1.2,
    "stream": 1.0,
    "random_dram": 2.0,
    "random_cache": 0.33,
    "tiles": 1.0,
    "dynamic": 1.0,
    "threads": 1.0,
    "calls": 3.0,
    "atomics": 1.0,
}

LINE_BYTES = 64
TILE_OVERHEAD_S = 1e-6
DYNAMIC_ITERATION_S = 1e-7
#: Warp-stages per SM assumed to hide memory latency fully (GPU; unvalidated without a GPU).
WARP_STAGES_SATURATED = 16


@dataclass(frozen=True, slots=True)
class Breakdown:
    """A prediction term by term.

    Attributes:
        terms_s: roofline seconds of each term (before its coefficient).
        coef: the coefficients applied.
        eta: parallel efficiency used.
    """

    terms_s: Mapping[str, float]
    coef: Mapping[str, float]
    eta: float

    @property
    def total_s(self) -> float:
        """Predicted seconds: ``sum coef_i * term_i``."""
        return sum(self.coef[t] * self.terms_s[t] for t in TERMS)

    def contributions_s(self) -> dict[str, float]:
        """Each term's share of :attr:`total_s`, largest first, zeros left out."""
        parts = {t: self.coef[t] * self.terms_s[t] for t in TERMS if self.terms_s[t] > 0}
        return dict(sorted(parts.items(), key=lambda kv: -kv[1]))

    def explain(self) -> str:
        """One line: the terms that make the time, e.g. ``tile_gemm 61%, random_cache 20%``."""
        total = self.total_s or 1.0
        parts = [f"{t} {100 * v / total:.0f}%" for t, v in self.contributions_s().items()]
        return ", ".join(parts[:3]) + f" (eta {self.eta:.2f})"


def _gemm_rows(f: Features, order: Order) -> tuple[int, tuple[int, ...]]:
    if order is Order.TRANSFORM_FIRST:
        return f.transform_rows, f.transform_segment_rows
    if order is Order.AGGREGATE_FIRST and f.aggregate_rows is not None:
        return f.aggregate_rows, f.aggregate_segment_rows
    return f.pairs, f.segment_pairs


@functools.lru_cache(maxsize=4096)
def _tiles(
    segment_rows: tuple[int, ...], tile_rows: int, blocks: int, pad_to: int
) -> tuple[int, int]:
    """Tiles and padded rows when each segment's rows spread over ``blocks`` and are cut in tiles.

    A segment of ``n`` rows falls into ``min(n, blocks)`` runs of ``n / runs`` rows; each run is
    cut into tiles of at most ``tile_rows``, each tile padded to a multiple of ``pad_to``.
    """
    n = np.asarray(segment_rows, dtype=np.float64)
    n = n[n > 0]
    if n.size == 0:
        return 0, 0
    runs = np.minimum(n, blocks)
    per_run = n / runs
    tiles_per_run = np.ceil(per_run / tile_rows)
    rows_per_tile = per_run / tiles_per_run
    padded = np.ceil(rows_per_tile / pad_to) * pad_to
    tiles = runs * tiles_per_run
    return int(tiles.sum()), int((tiles * padded).sum())


@functools.lru_cache(maxsize=1024)
def _nonempty(segment_rows: tuple[int, ...]) -> int:
    """Segments with at least one row (one vendor GEMM call each)."""
    return sum(1 for n in segment_rows if n)


def _row_bytes(width: int, elem: int) -> float:
    """Bytes one randomly indexed row costs: its width rounded up to cache lines."""
    return math.ceil(width * elem / LINE_BYTES) * LINE_BYTES


def _cpu_eta(pairs: float, unit: float, blocks: int, threads: int, chunk: int) -> float:
    """Mean thread load over the busiest thread's, for ``blocks`` blocks of >= ``unit`` pairs."""
    if pairs <= 0 or threads <= 1:
        return 1.0
    mean = pairs / threads
    unit = min(max(unit, pairs / blocks), pairs)
    if chunk:  # dynamic: the last block handed out ends at most one block late
        busiest = max(unit, mean + unit * (1 - 1 / threads) / 2)
    else:  # static: B/P consecutive blocks, one of them possibly the big one
        per_thread = max(1.0, blocks / threads)
        rest = (pairs - unit) / max(1, blocks - 1)
        busiest = max(mean, unit + (per_thread - 1) * rest)
    return min(1.0, mean / busiest)


def cpu_terms(f: Features, cfg: Config, target: CPUTarget) -> tuple[dict[str, float], float]:
    """Roofline seconds of each term on a CPU, and the parallel efficiency (see module doc)."""
    elem = 8 if f.dtype == "fp64" else 4  # bfloat16 runs in float32 on the CPU
    threads = min(cfg.launch.threads or target.cores, target.cores)
    share = 1.0
    peak = target.peak(
        "fp64" if f.dtype == "fp64" and "fp64" in target.peak_flops_per_s else "fp32"
    )
    flops_s, bw = peak * share, target.mem_bw_bytes_per_s * share
    llc = target.last_level_cache_bytes
    order, flow = cfg.strategy.order, cfg.strategy.dataflow
    r, seg_rows = _gemm_rows(f, order)
    k, m = f.k, f.m
    tiles, r_pad = _tiles(seg_rows, cfg.tile_rows, cfg.blocks, 4)
    m_pad = math.ceil(m / 16) * 16
    eta = _cpu_eta(
        r,
        f.max_row_pairs if order is not Order.TRANSFORM_FIRST else 1,
        cfg.blocks,
        threads,
        cfg.launch.chunk or 0,
    )

    x_fits, y_fits = f.n_in * k * elem <= llc, f.n_out * m * elem <= llc
    random = {"dram": 0.0, "cache": 0.0}

    def rows_at_random(count: float, width: int, fits: bool) -> None:
        random["cache" if fits else "dram"] += count * _row_bytes(width, elem)

    stream = (f.segments * k * m + f.n_out * m) * elem  # W once, Y written once
    calls = 0
    iterations = 0.0  # prange iterations of every kernel (matter only when handed out one by one)
    # ---- the order's own pass ----
    if order is Order.AGGREGATE_FIRST:
        rows_at_random(f.pairs, k, x_fits)  # X[g] rows summed per (s, d)
        if flow is not Dataflow.GMS_SEG:  # the composition writes A and reads it back
            stream += 2 * r * k * elem
            calls += 1
            iterations += r
        src_rows, src_fits = 0.0, True  # the GEMM reads A (or the prologue's sums)
    else:
        src_rows, src_fits = float(r), x_fits
    if order is Order.TRANSFORM_FIRST:  # T[V] written, then E random rows of T reduced into Y
        stream += r * m * elem
        rows_at_random(f.pairs, m, r * m * elem <= llc)
        calls += 1
        iterations += f.n_out
        dst_rows, dst_fits = 0.0, True
    else:
        dst_rows, dst_fits = float(r), y_fits
    # ---- the dataflow of the GEMM ----
    gathered = flow in (Dataflow.G_MSEG_S, Dataflow.G_MS_SEG)
    products = flow in (Dataflow.G_MSEG_S, Dataflow.GM_SEG_S)
    rows_at_random(src_rows, k, src_fits)
    if gathered:
        stream += 2 * r * k * elem
    if products:
        stream += 2 * r * m * elem
    rows_at_random(dst_rows, m, dst_fits)
    rows_at_random(dst_rows, m, dst_fits)  # read-modify-write of the destination rows
    calls += 1 + gathered + products
    vendor = flow is Dataflow.G_MSEG_S
    scatter_rows = f.n_out if dst_rows else r  # transform-first's GEMM writes T[V] row by row
    iterations += r * gathered + scatter_rows * products
    iterations += 0 if vendor else (tiles if flow is Dataflow.GM_SEG_S else cfg.blocks)
    if vendor:
        calls += _nonempty(seg_rows)
    gemm_s = 2.0 * (r if vendor else r_pad) * k * (m if vendor else m_pad) / flops_s
    terms = {
        "tile_gemm": 0.0 if vendor else gemm_s / eta,
        "vendor_gemm": gemm_s if vendor else 0.0,
        "stream": stream / bw,
        "random_dram": random["dram"] / bw / eta,
        "random_cache": random["cache"] / bw / eta,
        "tiles": 0.0 if vendor else tiles / target.cores * TILE_OVERHEAD_S,
        "dynamic": iterations / threads * DYNAMIC_ITERATION_S if cfg.launch.chunk else 0.0,
    }
    # fewer threads than cores: the parallel work runs up to (cores / P - 1) times longer
    terms["threads"] = (target.cores / threads - 1.0) * sum(terms.values())
    terms["calls"] = calls * target.launch_overhead_s
    terms["atomics"] = 0.0
    return terms, eta


def gpu_terms(f: Features, cfg: Config, target: GPUTarget) -> tuple[dict[str, float], float]:
    """Roofline seconds of each term on a GPU, and the wave x latency-hiding efficiency."""
    launch = cfg.launch
    be, bm, bk = launch.block_e or 16, launch.block_m or 16, launch.block_k or 16
    warps, stages = launch.num_warps or 4, launch.num_stages or 2
    elem = {"fp64": 8, "fp32": 4}.get(f.dtype, 2)
    peak = target.peak(f.dtype if f.dtype in target.peak_flops_per_s else "fp32")
    bw = target.mem_bw_bytes_per_s
    order, flow = cfg.strategy.order, cfg.strategy.dataflow
    r, seg_rows = _gemm_rows(f, order)
    k, m = f.k, f.m
    tiles, r_pad = _tiles(seg_rows, cfg.tile_rows, 1, be)
    m_pad, k_pad = math.ceil(m / bm) * bm, math.ceil(k / bk) * bk
    # ---- occupancy, waves, latency hiding ----
    smem = stages * (be + bm) * bk * elem
    per_sm = max(
        1,
        min(
            target.max_threads_per_sm // (warps * target.warp_size),
            target.shared_mem_per_sm_bytes // max(smem, 1),
            32,
        ),
    )
    programs = tiles * math.ceil(m / bm)
    slots = target.sm_count * per_sm
    waves = max(1, math.ceil(programs / slots))
    hiding = min(1.0, per_sm * warps * stages / WARP_STAGES_SATURATED)
    eta = max(programs / (waves * slots), 1e-3) * hiding if programs else 1.0
    # ---- bytes: operands per program from L2, intermediates and rows through HBM ----
    l2_bytes = programs * (be + bm) * k_pad * elem
    stream = (f.segments * k * m + f.n_out * m) * elem
    random = r * _row_bytes(k, elem)  # gathered rows
    calls = 1
    if order is Order.AGGREGATE_FIRST:
        random += f.pairs * _row_bytes(k, elem)
        stream += 2 * r * k * elem
        calls += 1
    if order is Order.TRANSFORM_FIRST:
        stream += r * m * elem
        random += f.pairs * _row_bytes(m, elem)
        calls += 1
    gathered = flow in (Dataflow.G_MSEG_S, Dataflow.G_MS_SEG)
    products = flow in (Dataflow.G_MSEG_S, Dataflow.GM_SEG_S)
    stream += 2 * r * k * elem * gathered + 2 * r * m * 4 * products
    calls += gathered + products
    atomic = not products and order is not Order.TRANSFORM_FIRST
    dup = f.pairs / max(1, f.scatter_rows)
    terms = {
        "tile_gemm": 2.0 * r_pad * k_pad * m_pad / peak / eta,
        "vendor_gemm": 0.0,
        "stream": stream / bw,
        "random_dram": random / bw,
        "random_cache": l2_bytes / bw,
        "tiles": 0.0,
        "dynamic": 0.0,
        "threads": 0.0,
        "calls": calls * target.launch_overhead_s,
        "atomics": r * m * 4 / bw * dup if atomic else 0.0,
    }
    return terms, eta


def estimate(
    f: Features,
    cfg: Config,
    target: CPUTarget | GPUTarget,
    coef: Mapping[str, float] | None = None,
) -> Breakdown:
    """Predict the time of one configuration (see the module docstring for the formula).

    Args:
        f: the problem's features.
        cfg: the configuration.
        target: where it runs.
        coef: fitted coefficients; :data:`DEFAULT_COEF` for missing ones.

    Returns:
        The :class:`Breakdown`.
    """
    terms, eta = (
        cpu_terms(f, cfg, target) if isinstance(target, CPUTarget) else gpu_terms(f, cfg, target)
    )
    return Breakdown(terms, {**DEFAULT_COEF, **(coef or {})}, eta)


def term_matrix(
    f: Features, configs: Sequence[Config], target: CPUTarget | GPUTarget
) -> np.ndarray:
    """``[len(configs), len(TERMS)]`` roofline seconds: the design matrix of :func:`fit`."""
    rows = [estimate(f, c, target).terms_s for c in configs]
    return np.array([[r[t] for t in TERMS] for r in rows], dtype=np.float64).reshape(-1, len(TERMS))


def predict(
    f: Features,
    configs: Sequence[Config],
    target: CPUTarget | GPUTarget,
    coef: Mapping[str, float] | None = None,
) -> np.ndarray:
    """Predicted seconds of every configuration."""
    weights = np.array([{**DEFAULT_COEF, **(coef or {})}[t] for t in TERMS])
    predicted: np.ndarray = term_matrix(f, configs, target) @ weights
    return predicted


def fit(terms: np.ndarray, measured_s: np.ndarray, prior_weight: float = 0.002) -> dict[str, float]:
    """Fit the coefficients to measurements: least squares on log time, pulled to the defaults.

    Minimises ``sum_j (log(T_j . c) - log t_j)^2 + prior_weight * n * sum_i log(c_i / d_i)^2``
    over ``c > 0`` (``T`` the term matrix, ``t`` the measured times, ``d`` the defaults). Log
    errors weigh a 2x overestimate like a 2x underestimate, which is what ranking needs; the
    prior keeps a term the measurements barely exercise at its default.

    Args:
        terms: ``[n, len(TERMS)]`` from :func:`term_matrix`.
        measured_s: ``[n]`` measured seconds.
        prior_weight: strength of the pull towards :data:`DEFAULT_COEF`.

    Returns:
        Coefficients by term name.
    """
    # scipy.optimize is slow to import and only fitting needs it (predictions are common)
    from scipy.optimize import least_squares

    terms = np.asarray(terms, dtype=np.float64)
    measured_s = np.asarray(measured_s, dtype=np.float64)
    keep = measured_s > 0
    a, log_t = terms[keep], np.log(measured_s[keep])
    defaults = np.array([DEFAULT_COEF[t] for t in TERMS])
    lam = math.sqrt(prior_weight * max(1, len(log_t)))

    def residuals(log_c: np.ndarray) -> np.ndarray:
        predicted = a @ np.exp(log_c)
        return np.concatenate(
            [np.log(np.maximum(predicted, 1e-30)) - log_t, lam * (log_c - np.log(defaults))]
        )

    solution = least_squares(residuals, np.log(defaults), method="trf")
    return {t: float(c) for t, c in zip(TERMS, np.exp(solution.x), strict=True)}
