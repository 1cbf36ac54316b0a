"""One interface for every strategy: run a :class:`~fusekit.gms.candidates.Strategy` on a plan.

The kernels come from the device's table (:func:`fusekit.gms.backends.backend_for`), so a call
reads ``torch.ops.fusekit.gms`` (:mod:`fusekit.gms.ops`) -> :func:`forward` ->
``backend.dataflows[strategy.dataflow]`` -> the launcher, e.g. ``kernels/cpu/gms_seg.py:
gms_seg_cpu``. A dataflow launcher gets ``x[N_in, K]``, ``w[S, K, M]`` (contiguous, same dtype),
the plan and the per-position scale (mean weights folded in, or None) and returns ``Y[N_out, M]``
reduced by ``plan.reduce``.

Orders are compositions of those pieces, the same on every backend::

    pairwise         Y = dataflow(X, W, plan, c)
    aggregate-first  A = reduce_rows(X[g] * c by (s, d) group);  Y = dataflow(A, W, agg.plan)
    transform-first  T = dataflow(X, W, tf.plan);  Y = reduce_rows(c * T[v] by scatter row)

except that ``aggregate-first/(GMS)seg`` runs the table's ``aggregate_gms_seg`` (the
aggregation in the GEMM prologue, ``A`` never in memory) where the backend has it.

Gradients (``sum``/``mean``; ``c`` the per-position scale, ``n`` the mean weight)::

    dX[g[p]] += c[p] * dY[d[p]] @ W[s]^T     the forward problem with g and d swapped: where the
                                             table says ``transposed_input_gradient``,
                                             (GMS)seg on the transposed plan (built once per
                                             plan, :func:`transposed_plan`); otherwise the
                                             segment products (or the table's vendor GEMM for
                                             G-Mseg-S) with dY rows, then a reduce by gather
                                             row (the source CSR)
    dW[s]    += c[p] * X[g[p]]^T dY[d[p]]    segment outer products
    dc[e]     = n[p] * dY[d[p]] . (X[g[p]] @ W[s])    pair dots, e = order[p]

``max`` recomputes the pair products, finds each output element's winning pairs (ties share the
gradient equally, as ``torch.scatter_reduce`` does) and replaces ``dY[d[p]]`` by that per-pair
gradient ``G[p]`` (materialised, ``[E, M]``).
"""

from __future__ import annotations

import torch

from fusekit.errors import expected
from fusekit.gms.backends import Backend, VendorGemm, backend_for
from fusekit.gms.candidates import Dataflow, GemmRows, Order, Strategy, default_strategy
from fusekit.gms.planning.build import plan_sorted
from fusekit.gms.planning.layout import GMSPlan, OrderPlan


def gemm_rows(plan: GMSPlan) -> GemmRows:
    """The GEMM rows each planned order runs."""
    return GemmRows(
        pairwise=plan.num_pairs,
        transform_first=plan.transform.plan.num_pairs if plan.transform else None,
        aggregate_first=plan.aggregate.plan.num_pairs if plan.aggregate else None,
    )


def resolve(strategy: str | Strategy | Dataflow | Order, plan: GMSPlan) -> Strategy:
    """Parse a strategy and check that the plan supports it.

    ``"auto"`` is :func:`~fusekit.gms.candidates.default_strategy` of the plan's GEMM rows.

    Raises:
        ValueError: unknown name, an order the reduce does not allow, or an order not planned.
    """
    if isinstance(strategy, str) and strategy == "auto":
        return default_strategy(plan.reduce, gemm_rows(plan))
    chosen = Strategy.parse(strategy)
    if not chosen.order.allows(plan.reduce):
        raise ValueError(
            expected(
                "gms",
                "strategy",
                f"an order valid for reduce={plan.reduce!r}",
                f"{chosen.name!r} (aggregating before the GEMM needs a linear reduce)",
            )
        )
    if gemm_rows(plan).of(chosen.order) is None:
        raise ValueError(
            expected("gms", "strategy", "an order the plan holds", f"{chosen.name!r}; plan(...)")
        )
    return chosen


def position_scale(
    plan: GMSPlan, scale: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor | None:
    """The scale of each plan position: ``scale[order[p]]``, times ``1/deg`` for ``mean``."""
    c = scale[plan.order].to(dtype) if scale is not None else None
    if plan.reduce == "mean":
        norm = plan.derived.norms.get(dtype)
        if norm is None:
            norm = plan.derived.norms[dtype] = plan.norm.to(dtype)
        c = norm if c is None else c * norm
    return c


def _compute_dtype(dtype: torch.dtype, backend: Backend) -> torch.dtype:
    """The dtype kernels compute in: float32 for bfloat16 where the backend has no bfloat16."""
    if dtype == torch.bfloat16 and not backend.bfloat16:
        return torch.float32
    return dtype


def _order_plan(plan: GMSPlan, strategy: Strategy) -> OrderPlan:
    sub = plan.aggregate if strategy.order is Order.AGGREGATE_FIRST else plan.transform
    if sub is None:
        raise ValueError(expected("gms", "strategy", "an order the plan holds", strategy.name))
    return sub


def mark_mirrored(plan: GMSPlan) -> None:
    """Declare ``plan``'s pairs closed under ``(d, g, s) -> (g, d, S - 1 - s)`` (:func:`mirrored`).

    For a builder that knows it, where the pairs need not mirror position by position: a
    submanifold kernel map on voxels in any order (input ``j`` is output ``i``'s neighbour at
    offset ``k`` exactly when ``i`` is ``j``'s at offset ``26 - k``).
    """
    plan.derived.mirrored = True


def mirrored(plan: GMSPlan) -> bool:
    """Whether ``plan``'s pairs are closed under ``(d, g, s) -> (g, d, S - 1 - s)``.

    Then the input gradient ``dX[g] += dY[d] @ W[s]^T`` is the forward problem on the plan
    itself with ``W'[s] = W[S - 1 - s]^T``, and :func:`transposed_plan` need not be built.
    Marked by the builder (:func:`mark_mirrored`), or else checked once per plan (kept in
    ``plan.derived.mirrored``) position by position: position ``p`` of segment ``s`` mirrors
    ``q = ptr[S-1-s] + p - ptr[s]`` when ``(gather, scatter)[q] = (scatter, gather)[p]``, every
    segment as long as its mirror and as many inputs as outputs. A submanifold kernel map
    written in key order is such a plan (the mirror of a pair has its rank:
    :func:`fusekit.gms.kmap.pairs._write_symmetric`). The check costs a few passes over ``E``, far
    less than a transposed plan, and holds whoever built the plan.
    """
    hit = plan.derived.mirrored
    if hit is None:
        hit = plan.derived.mirrored = _pairs_mirror(plan)
    return hit


def _pairs_mirror(plan: GMSPlan) -> bool:
    ptr = plan.segment_ptr
    lengths = ptr.diff()
    if plan.n_in != plan.n_out or not torch.equal(lengths, lengths.flip(0)):
        return False
    s = plan.segment
    q = torch.arange(plan.num_pairs, device=s.device) + (ptr.flip(0)[1:] - ptr[:-1])[s]
    return torch.equal(plan.gather[q], plan.scatter) and torch.equal(plan.scatter[q], plan.gather)


def transposed_plan(plan: GMSPlan) -> tuple[GMSPlan, torch.Tensor]:
    """The plan of the input-gradient problem and ``perm``, computed once per plan (``derived``).

    The pairs with gather and scatter swapped (``dY`` rows gathered by ``d``, ``dX`` rows
    scattered to by ``g``), sorted by (segment, ``g``) and planned with the forward plan's tile
    rows, blocks and schedule; position ``q`` of it is position ``perm[q]`` of ``plan``. Its
    blocks own ranges of ``dX`` rows, so (GMS)seg computes ``dX`` without atomics and without the
    ``[E, K]`` pair buffer of a segment GEMM followed by a reduce.
    """
    cached = plan.derived.transposed
    if cached is None:
        key = plan.segment * (plan.n_in + 1) + plan.gather
        perm = torch.sort(key, stable=True).indices
        position = torch.empty_like(perm)  # position[perm[q]] = q
        position[perm] = torch.arange(perm.numel(), device=perm.device)
        # the CSRs swap too: by dX row (the forward's source CSR), by dY row (its destination CSR)
        csr = (plan.src_ptr, position[plan.src_pos], plan.dst_ptr, position[plan.dst_pos])
        t_plan = plan_sorted(
            plan.scatter[perm],
            plan.segment[perm],
            plan.gather[perm],
            n_in=plan.n_out,
            n_out=plan.n_in,
            num_segments=plan.num_segments,
            tile_rows=plan.tile_rows,
            blocks=plan.block_ptr.numel() - 1,
            schedule=plan.schedule,
            csr=csr,
        )
        cached = plan.derived.transposed = (t_plan, perm)
    return cached


def _vendor_gemm(strategy: Strategy, backend: Backend) -> VendorGemm | None:
    """The table's vendor GEMM where ``strategy`` ran on it (``G-Mseg-S``), else None."""
    return backend.vendor_gemm if strategy.dataflow is Dataflow.G_MSEG_S else None


def pair_values(
    strategy: Strategy, x: torch.Tensor, w: torch.Tensor, plan: GMSPlan
) -> torch.Tensor:
    """``X[g[p]] @ W[s[p]]`` per plan position, computed by the kernels the forward used.

    The max gradient picks each output element's winning pairs among these values (the vendor
    GEMM for ``G-Mseg-S``, the numba register tile otherwise, the distinct-row products for
    transform-first), so that they agree with the forward's winners to the last bit.
    """
    backend = backend_for(x.device, strategy.dataflow.module)
    if strategy.order is Order.TRANSFORM_FIRST:
        distinct = _order_plan(plan, strategy)
        return backend.dataflows[strategy.dataflow](x, w, distinct.plan, None)[distinct.index]
    vendor = _vendor_gemm(strategy, backend)
    if vendor is not None:
        gathered = backend.gather_rows(x, plan.gather)
        out = gathered.new_empty(plan.num_pairs, w.shape[2])
        return vendor.per_segment_mm(gathered, w, plan.segment_ptr.tolist(), out)
    return backend.segment_products(x, plan.gather, w, plan)


def forward(
    strategy: Strategy,
    x: torch.Tensor,
    w: torch.Tensor,
    plan: GMSPlan,
    scale: torch.Tensor | None,
) -> torch.Tensor:
    """``Y[N_out, M]`` by ``strategy``; operands already checked (``check_operands``).

    Args:
        strategy: a resolved strategy.
        x: ``[N_in, K]``.
        w: ``[S, K, M]``.
        plan: the plan of the indices.
        scale: ``[E]`` in original pair order, or None.

    Returns:
        ``Y`` in the dtype of ``x``.

    Raises:
        ValueError: no backend serves ``x``'s device.
    """
    backend = backend_for(x.device, strategy.dataflow.module)
    dtype = _compute_dtype(x.dtype, backend)
    xc, wc = x.to(dtype), w.to(dtype)
    c = position_scale(plan, scale, dtype)
    run = backend.dataflows[strategy.dataflow]
    fused = backend.aggregate_gms_seg if strategy.dataflow is Dataflow.GMS_SEG else None
    if strategy.order is Order.PAIRWISE:
        y = run(xc, wc, plan, c)
    elif strategy.order is Order.AGGREGATE_FIRST and fused is not None:
        y = fused(xc, wc, plan, c)
    elif strategy.order is Order.AGGREGATE_FIRST:
        groups = _order_plan(plan, strategy)
        aggregated = backend.reduce_rows(
            xc, groups.index, n_pairs=plan.num_pairs, src_index=plan.gather, scale=c
        )
        y = run(aggregated, wc, groups.plan, None)
    else:
        distinct = _order_plan(plan, strategy)
        transformed = run(xc, wc, distinct.plan, None)
        y = backend.reduce_rows(
            transformed,
            plan.dst_ptr,
            n_pairs=plan.num_pairs,
            src_index=distinct.index,
            scale=c,
            pos=plan.dst_pos,
            reduce_max=plan.reduce == "max",
        )
    return y.to(x.dtype)


def _input_gradient(
    backend: Backend,
    vendor: VendorGemm | None,
    shape: torch.Size,
    w: torch.Tensor,
    b: torch.Tensor,
    b_index: torch.Tensor,
    c: torch.Tensor | None,
    plan: GMSPlan,
) -> torch.Tensor:
    """``dX[g[p]] += c[p] * B[b_index[p]] @ W[s[p]]^T`` (``shape`` rows, compute dtype).

    Where the table says ``transposed_input_gradient``, for ``sum``/``mean`` (``B = dY``,
    ``b_index = d``) and not on the vendor GEMM: (GMS)seg on :func:`transposed_plan`, or on the
    plan itself with the segments' weights reversed when its pairs mirror each other
    (:func:`mirrored`) and are unscaled. Otherwise the pair products (the vendor segment GEMM on
    gathered rows for ``G-Mseg-S``, the segment products else) reduced by gather row.
    """
    w_t = w.transpose(1, 2).contiguous()
    dx = torch.zeros(shape, dtype=b.dtype, device=b.device)
    gms_seg = backend.dataflows[Dataflow.GMS_SEG]
    if vendor is None and backend.transposed_input_gradient and plan.reduce != "max":
        if c is None and mirrored(plan):
            reversed_w = w_t[: plan.num_segments].flip(0).contiguous()
            dx[: plan.n_in] = gms_seg(b, reversed_w, plan, None)
            return dx
        t_plan, perm = transposed_plan(plan)
        t_scale = c[perm] if c is not None else None
        dx[: plan.n_in] = gms_seg(b, w_t, t_plan, t_scale)
        return dx
    if vendor is not None:
        back = vendor.segment_mm(backend.gather_rows(b, b_index), w_t, plan.segment_ptr)
    else:
        back = backend.segment_products(b, b_index, w_t, plan)
    backend.reduce_rows(
        back, plan.src_ptr, n_pairs=plan.num_pairs, scale=c, pos=plan.src_pos, out=dx[: plan.n_in]
    )
    return dx


def backward(
    strategy: Strategy,
    grad: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor,
    plan: GMSPlan,
    scale: torch.Tensor | None,
    needs: tuple[bool, bool, bool],
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Gradients of ``Y`` w.r.t. ``x``, ``w`` and ``scale`` (``None`` where not needed).

    Args:
        strategy: the forward's strategy (``G-Mseg-S`` keeps the vendor GEMM for gradients).
        grad: ``dY[N_out, M]``.
        x: the forward's ``x``.
        w: the forward's ``w``.
        plan: the forward's plan.
        scale: the forward's ``scale`` (or None).
        needs: which of (x, w, scale) need a gradient.

    Returns:
        ``(dx, dw, dscale)`` in the operands' dtypes.
    """
    dev = x.device
    backend = backend_for(dev, "backward")
    dtype = _compute_dtype(x.dtype, backend)
    xc, wc, gc = x.to(dtype), w.to(dtype), grad.to(dtype).contiguous()
    c = position_scale(plan, scale, dtype)
    vendor = _vendor_gemm(strategy, backend)

    # The pair-side gradient rows B[b_index[p]]: dY[d[p]] for sum/mean, G[p] for max.
    values: torch.Tensor | None = None
    if plan.reduce == "max":
        values = pair_values(strategy, xc, wc, plan)
        scaled = values * c[:, None] if c is not None else values
        index = plan.scatter[:, None].expand_as(scaled)
        best = torch.full_like(gc, float("-inf")).scatter_reduce_(0, index, scaled, "amax")
        wins = (scaled == best[plan.scatter]).to(dtype)
        ties = torch.zeros_like(gc).index_add_(0, plan.scatter, wins)
        b = gc[plan.scatter] * wins / ties[plan.scatter]
        b_index = torch.arange(plan.num_pairs, device=dev)
    else:
        b, b_index = gc, plan.scatter

    dx = dw = dscale = None
    if needs[0]:
        dx = _input_gradient(backend, vendor, x.shape, wc, b, b_index, c, plan).to(x.dtype)
    if needs[1]:
        if vendor is not None:
            rows_b = backend.gather_rows(b, b_index)
            if c is not None:
                rows_b = rows_b * c[:, None]
            dw = vendor.segment_outer_mm(
                backend.gather_rows(xc, plan.gather), rows_b, plan.segment_ptr, w.shape[0]
            )
        else:
            dw = backend.segment_outer(xc, plan.gather, b, b_index, c, plan, w.shape[0])
        dw = dw.to(w.dtype)
    if needs[2] and scale is not None:
        if values is not None:  # max: the pair values are known
            dots = (b * values).sum(1)
        else:
            dots = backend.pair_dot(xc, plan.gather, wc, b, b_index, plan)
        norm = position_scale(plan, None, dtype)
        if norm is not None:  # mean: the 1 / deg weights
            dots = dots * norm
        dscale = torch.empty_like(dots)
        dscale[plan.order] = dots
        dscale = dscale.to(scale.dtype)
    return dx, dw, dscale
