"""Ops the plan runs alone, by their eager ATen calls rather than by the IR interpreter.

Four fast paths, each with the interpreter as its reference (``reference_group`` in the runner;
the tests compare them):

- a contraction ``Y[o] = sum_r A[a] * B[b] (+ C[c])`` (a GEMM, BMM or linear layer) runs as
  ``torch.addmm``/``torch.mm`` (``A[n,l] W[k,l] + b[k]``: ``F.linear``'s own call) or
  ``torch.matmul`` on permuted views (``A[batch,m,k] B[batch,k,n]``), else ``torch.einsum``.
  A linear layer in fp32 on the CPU may instead run as oneDNN's inner product over the same
  ``[k, l]`` weight (``mkldnn::_linear_pointwise``, no packing, so nothing to keep in step with
  the weight): :func:`linear` times both once per shape signature and keeps the faster, since
  which of them wins over MKL's ``sgemm`` with a transposed B depends on the CPU and the shape;
- a reduction of one plain read ``Y[o] = red_r X[a]`` (sum, max, min, mean) runs as the one
  ``torch.sum/amax/amin/mean`` over the reduced dims that eager calls (the runner times
  it against the op's stitched kernel: one op moves the same bytes either way);
- a gather or scatter-add along one axis by one index tensor (an embedding, a loss's target
  logit, an embedding's gradient) runs as the ``index_select``, ``gather`` or ``index_add_``
  eager calls (:class:`AtenIndexing`);
- a group of layout ops only (transpose, view, reshape, unsqueeze) becomes a strided view of its
  source, as eager returns one: the source offset of every output element is computed once per
  source stride signature and fitted to ``base + sum_d idx_d * stride_d``; a layout that is not
  such a view (e.g. a reshape of a transposed tensor) is materialised by the stitched kernel.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from functools import partial
from types import MappingProxyType
from typing import Any

import torch

from fusekit.ir.expr import Access, Bin, IVar, Reduce, ReduceOp
from fusekit.ir.graph import Graph
from fusekit.ir.op import Op
from fusekit.ir.strides import fit_strides
from fusekit.search.measure import fastest
from fusekit.stitch.schemes import Layout, Unfusable, fold_layouts


def plain_vars(acc: Access) -> tuple[str, ...] | None:
    """The variables of a plain read, in index order (``None``: some index is computed)."""
    return tuple(t.name for t in acc.indices if isinstance(t, IVar)) if acc.is_plain else None


class AtenContraction:
    """One contraction op run by the ATen call eager would make.

    Args:
        graph: the graph.
        name: the op (a contraction of two plain reads, plus an optional plain addend).
        op: the op to run in place of ``graph.op(name)`` (a contraction and the add of its
            epilogue made one: :func:`fusekit.stitch.epilogue.merged_addend`).

    Raises:
        ValueError: if the op is not of that form (the runner then uses the interpreter).
    """

    def __init__(self, graph: Graph, name: str, op: Op | None = None) -> None:
        op = op if op is not None else graph.op(name)
        expr, bias = op.expr, None
        if isinstance(expr, Bin) and expr.op == "+":
            left, right = expr.left, expr.right
            if isinstance(left, Reduce) and isinstance(right, Access):
                expr, bias = left, right
            elif isinstance(right, Reduce) and isinstance(left, Access):
                expr, bias = right, left
        if not (
            isinstance(expr, Reduce) and expr.op is ReduceOp.SUM and isinstance(expr.body, Bin)
            and expr.body.op == "*" and isinstance(expr.body.left, Access)
            and isinstance(expr.body.right, Access) and not op.accumulate
        ):  # fmt: skip
            raise ValueError(f"stitch: {name} is not a sum of a product of two reads")
        a, b = expr.body.left, expr.body.right
        va, vb, vo = plain_vars(a), plain_vars(b), plain_vars(op.out)
        vc = plain_vars(bias) if bias is not None else ()
        if va is None or vb is None or vo is None or vc is None:
            raise ValueError(f"stitch: {name} reads at computed indices")
        self.name, self.a, self.b = name, a.tensor, b.tensor
        self.bias = bias.tensor if bias is not None else None
        self.out_shape = tuple(int(s) for s in graph.tensor(name).shape)
        reduced = set(expr.vars)
        letters = {v: chr(ord("a") + i) for i, v in enumerate(dict.fromkeys((*vo, *va, *vb)))}
        spell = "".join
        self.spec = (
            f"{spell(letters[v] for v in va)},{spell(letters[v] for v in vb)}"
            f"->{spell(letters[v] for v in vo)}"
        )
        # the addend broadcast over the output: its dims permuted into output order, then
        # reshaped with ones where the output has dims it lacks
        dims = tuple(vo.index(v) for v in vc)
        self.bias_perm = (
            None
            if list(dims) == sorted(dims)
            else tuple(sorted(range(len(dims)), key=lambda i: dims[i]))
        )
        self.bias_shape = tuple(
            self.out_shape[d] if d in dims else 1 for d in range(len(self.out_shape))
        )
        # linear: A[..., l] W[k, l] (+ b[k]) -> Y[..., k]
        self.linear = (
            len(reduced) == 1 and va[-1] in reduced and len(vb) == 2 and vb[1] == va[-1]
            and vo == (*va[:-1], vb[0]) and vc in ((), (vb[0],))
        )  # fmt: skip
        # batched matmul: A[batch.., m, k] B[batch.., k, n] -> Y[batch.., m, n], any storage order
        self.perm_a = self.perm_b = None
        if not self.linear and len(reduced) == 1 and len(vo) >= 2:
            (k,) = reduced
            batch, m, n = vo[:-2], vo[-2], vo[-1]
            want_a, want_b = (*batch, m, k), (*batch, k, n)
            if sorted(va) == sorted(want_a) and sorted(vb) == sorted(want_b):
                self.perm_a = tuple(va.index(v) for v in want_a)
                self.perm_b = tuple(vb.index(v) for v in want_b)
        # a plain GEMM A[m, k] B[k, n] (+ c[n] or c[m, n]), one addmm: B is often a transposed
        # weight, W.t()
        self.gemm = self.perm_a is not None and len(vo) == 2 and vc in ((), (vo[-1],), vo)

    def __call__(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``{name: Y}`` from the values of the operands."""
        a, b = values[self.a], values[self.b]
        c = values[self.bias] if self.bias is not None else None
        if self.linear:
            y = linear(a.reshape(-1, a.shape[-1]), b, c)
            return {self.name: y.reshape(self.out_shape)}
        if self.gemm:
            assert self.perm_a is not None and self.perm_b is not None
            y = linear(a.permute(self.perm_a), b.permute(self.perm_b).t(), c)
            return {self.name: y}
        if self.perm_a is not None and self.perm_b is not None:
            y = torch.matmul(a.permute(self.perm_a), b.permute(self.perm_b))
        else:
            y = torch.einsum(self.spec, a, b)
        if c is not None:
            y = y + self._broadcast(c)
        return {self.name: y.contiguous()}

    def _broadcast(self, c: torch.Tensor) -> torch.Tensor:
        if self.bias_perm is not None:
            c = c.permute(self.bias_perm)
        return c.reshape(self.bias_shape)


LinearCall = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


def eager_linear(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``Y[n,k] = sum_l a[n,l] w[k,l] (+ bias[k])`` as ``F.linear`` computes it (the reference)."""
    return torch.mm(a, w.t()) if bias is None else torch.addmm(bias, a, w.t())


def onednn_linear(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The same product by oneDNN's inner product over the plain ``[k, l]`` weight."""
    y: torch.Tensor = torch.ops.mkldnn._linear_pointwise(a, w, bias, "none", [], "")
    return y


#: The implementations :func:`linear` chooses between, the reference first.
LINEAR_CALLS: Mapping[str, LinearCall] = MappingProxyType(
    {"aten": eager_linear, "onednn": onednn_linear}
)

#: The implementation each linear signature runs, chosen at its first call in the process:
#: ``{linear_signature(...): name in LINEAR_CALLS}``.
LINEAR_CHOICES: dict[tuple[Any, ...], str] = {}

#: Seconds each timing round of a linear choice spends at least (a millisecond GEMM's single
#: call is too noisy to decide on).
LINEAR_ROUND_S = 0.02

#: ``FUSEKIT_ONEDNN=0`` keeps every linear layer on eager's call (results then equal eager's
#: bit for bit; oneDNN's sums run in another order, within fp32 rounding).
ONEDNN_ENV = "FUSEKIT_ONEDNN"


def linear_signature(
    a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None
) -> tuple[Any, ...] | None:
    """What the choice of :func:`linear` depends on, or ``None`` where only eager's call runs.

    oneDNN is a choice for fp32 CPU tensors, a 1-d bias, and no autograd through the call
    (its op has no derivative; the forward graphs AOTAutograd hands over run without grad).
    """
    tensors = (a, w) if bias is None else (a, w, bias)
    mkldnn = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
    if (
        os.environ.get(ONEDNN_ENV, "1") == "0" or not mkldnn
        or any(t.device.type != "cpu" or t.dtype != torch.float32 for t in tensors)
        or (bias is not None and bias.dim() != 1)
        or (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
    ):  # fmt: skip
        return None
    return (
        tuple(a.shape), a.stride(), tuple(w.shape), w.stride(), bias is not None,
        torch.get_num_threads(),
    )  # fmt: skip


def linear(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``Y[n,k] = sum_l a[n,l] w[k,l] (+ bias[k])`` by the faster of :data:`LINEAR_CALLS`.

    The first call of a signature times each implementation (three interleaved rounds of at
    least one call and :data:`LINEAR_ROUND_S` seconds, after a warm-up) and records the pick in
    :data:`LINEAR_CHOICES`.
    """
    key = linear_signature(a, w, bias)
    if key is None:
        return eager_linear(a, w, bias)
    choice = LINEAR_CHOICES.get(key)
    if choice is None:
        calls = {name: partial(fn, a, w, bias) for name, fn in LINEAR_CALLS.items()}
        choice, _ = fastest(calls, rounds=3, repeats=1, min_total_s=LINEAR_ROUND_S)
        LINEAR_CHOICES[key] = choice
    return LINEAR_CALLS[choice](a, w, bias)


#: The ATen reduction eager calls for each reduction of the IR.
_ATEN_REDUCTIONS: Mapping[ReduceOp, str] = MappingProxyType(
    {ReduceOp.SUM: "sum", ReduceOp.MAX: "amax", ReduceOp.MIN: "amin", ReduceOp.MEAN: "mean"}
)


class AtenReduction:
    """One reduction of a plain read run by eager's single ATen call.

    ``Y[o] = red_{r} X[a]`` with ``a`` a permutation of ``o + r`` (no computed indices) becomes
    ``red(X, dim=[a.index(v) for v in r])``, then a permute when ``o`` is not in ``a``'s order.

    Args:
        graph: the graph.
        name: the op.

    Raises:
        ValueError: if the op is not of that form (the runner then keeps the stitched kernel).
    """

    def __init__(self, graph: Graph, name: str) -> None:
        op = graph.op(name)
        expr = op.expr
        if not (
            isinstance(expr, Reduce) and expr.op in _ATEN_REDUCTIONS
            and isinstance(expr.body, Access) and not op.accumulate
        ):  # fmt: skip
            raise ValueError(f"stitch: {name} is not a reduction of one read")
        va, vo = plain_vars(expr.body), plain_vars(op.out)
        if va is None or vo is None or sorted(va) != sorted((*vo, *expr.vars)):
            raise ValueError(f"stitch: {name} reads at computed indices")
        self.name, self.src, self.call = name, expr.body.tensor, _ATEN_REDUCTIONS[expr.op]
        self.dims = tuple(va.index(v) for v in expr.vars)
        kept = [v for v in va if v not in expr.vars]
        self.perm = None if kept == list(vo) else tuple(kept.index(v) for v in vo)

    def __call__(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``{name: Y}``."""
        y = getattr(values[self.src], self.call)(dim=self.dims)
        if self.perm is not None:
            y = y.permute(self.perm).contiguous()
        return {self.name: y}


def _indirect_position(acc: Access) -> tuple[int, str, tuple[str, ...], tuple[str, ...]] | None:
    """``X[v.., T[w..], v..]`` as ``(p, T, w, v)``.

    One index is a plain read of an index tensor ``T``, the others are distinct variables
    ``v``; ``None`` for any other form.
    """
    indirect = [d for d, t in enumerate(acc.indices) if not isinstance(t, IVar)]
    if len(indirect) != 1:
        return None
    (p,) = indirect
    term = acc.indices[p]
    if not isinstance(term, Access) or (w := plain_vars(term)) is None:
        return None
    v = tuple(t.name for t in acc.indices if isinstance(t, IVar))
    return (p, term.tensor, w, v) if len(set(v)) == len(v) else None


class AtenIndexing:
    """One gather or scatter-add op run by the single ATen call eager makes for it.

    With ``T`` an index tensor read at distinct variables ``w`` and the other indices distinct
    variables ``v``:

    - ``Y[o] = X[v.., T[w..], v..]``, no ``v`` among ``w`` (an embedding), is
      ``X.index_select(p, T.flatten())`` reshaped to ``(v.., w.., v..)``, permuted to ``o``;
    - ``Y[w] = X[w_0, .., T[w], .., w_n]``, ``X`` read at ``T``'s own variables but ``w_p``
      (a loss's target logit), is ``torch.gather(X, p, T)``;
    - ``Y[v.., T[w..], v..] += V[a]``, no ``v`` among ``w`` and ``a`` a permutation of
      ``(v.., w.., v..)`` (an embedding's gradient), is ``zeros(Y).index_add_(p, T.flatten(),
      V)``.

    Args:
        graph: the graph (static shapes).
        name: the op.

    Raises:
        ValueError: if the op is not of one of these forms (the runner then uses the
            interpreter).
    """

    def __init__(self, graph: Graph, name: str) -> None:
        op = graph.op(name)
        self.name = name
        self.shape = tuple(int(s) for s in graph.tensor(name).shape)
        self.dtype = getattr(torch, graph.tensor(name).dtype)
        self.perm: tuple[int, ...] | None = None
        self.flat: tuple[int, ...] = ()
        if not isinstance(op.expr, Access):
            raise ValueError(f"stitch: {name} is not one read")
        form = _indirect_position(op.out if op.accumulate else op.expr)
        if form is None:
            raise ValueError(f"stitch: {name} does not index one axis by one index tensor")
        p, self.index, w, v = form
        self.axis, self.src = p, op.expr.tensor
        index_shape = tuple(int(s) for s in graph.tensor(self.index).shape)
        labels = (*v[:p], *w, *v[p:])
        if op.accumulate:  # a scatter-add of one plain read
            va = plain_vars(op.expr)
            if va is None or set(v) & set(w) or sorted(va) != sorted(labels):
                raise ValueError(f"stitch: {name} scatters a read that is not its whole source")
            plain_dims = [d for d in range(len(self.shape)) if d != p]
            sizes = {**dict(zip(w, index_shape, strict=True)),
                     **{x: self.shape[d] for d, x in zip(plain_dims, v, strict=True)}}  # fmt: skip
            read = tuple(int(s) for s in graph.tensor(self.src).shape)
            if read != tuple(sizes[x] for x in va):
                raise ValueError(f"stitch: {name} scatters a slice of {self.src}")
            self.kind = "index_add"
            self.perm = None if va == labels else tuple(va.index(x) for x in labels)
            self.flat = (*self.shape[:p], math.prod(index_shape), *self.shape[p + 1 :])
            return
        vo = plain_vars(op.out)
        src_shape = tuple(int(s) for s in graph.tensor(self.src).shape)
        if vo is not None and vo == w and len(w) == len(src_shape) and v == w[:p] + w[p + 1 :]:
            if index_shape != self.shape:
                raise ValueError(f"stitch: {name} reads a slice of {self.index}")
            self.kind = "gather"  # X[.., T[o], ..] over T's own variables
            return
        if vo is None or set(v) & set(w) or sorted(labels) != sorted(vo):
            raise ValueError(f"stitch: {name} is not a gather ATen spells in one call")
        sizes = dict(zip(vo, self.shape, strict=True))
        plain_dims = [d for d in range(len(src_shape)) if d != p]  # where v is read, in order
        if any(src_shape[d] != sizes[x] for d, x in zip(plain_dims, v, strict=True)) or any(
            n != sizes[x] for n, x in zip(index_shape, w, strict=True)
        ):
            raise ValueError(f"stitch: {name} reads a slice of {self.src}")
        self.kind = "index_select"
        self.perm = None if labels == vo else tuple(labels.index(x) for x in vo)
        self.flat = (*src_shape[:p], *index_shape, *src_shape[p + 1 :])

    def __call__(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``{name: Y}``."""
        x, index = values[self.src], values[self.index]
        if index.dtype not in (torch.int64, torch.int32):
            index = index.long()
        if self.kind == "gather":
            y = torch.gather(x, self.axis, index.long())
        elif self.kind == "index_select":
            y = x.index_select(self.axis, index.reshape(-1)).view(self.flat)
            if self.perm is not None:
                y = y.permute(self.perm).contiguous()
        else:
            src = x if self.perm is None else x.permute(self.perm)
            y = torch.zeros(self.shape, dtype=self.dtype, device=x.device)
            y.index_add_(self.axis, index.reshape(-1), src.reshape(self.flat).to(self.dtype))
        return {self.name: y if y.dtype == self.dtype else y.to(self.dtype)}


class LayoutViews:
    """A group of layout ops only, returned as views of its sources (no copy).

    Args:
        graph: the graph.
        layout: the group's layout (every computed op a plain read after folding).
        fallback: the stitched kernel, run when some output is not a strided view.

    Raises:
        ValueError: if some computed op is not a plain read.
    """

    def __init__(self, graph: Graph, layout: Layout, fallback: Any) -> None:
        self.fallback = fallback
        self.reads: dict[str, tuple[Access, tuple[str, ...], tuple[int, ...]]] = {}
        # an output read by another output (view_43 and permute(view_43) both returned): the
        # later one reads the group's input through the earlier one's indices
        chained = {
            n: dataclasses.replace(graph.op(n), expr=layout.exprs[n])  # reads of group inputs
            for n in layout.outputs
            if graph.moves_only(n) and n in layout.exprs
        }
        for name in layout.outputs:
            expr, op = layout.exprs.get(name), graph.op(name)
            if isinstance(expr, Access) and expr.tensor in chained:
                try:
                    expr = fold_layouts(expr, {k: v for k, v in chained.items() if k != name})
                except Unfusable:
                    expr = None
            vars_ = plain_vars(op.out)
            if not isinstance(expr, Access) or vars_ is None or expr.tensor in layout.exprs:
                raise ValueError(f"stitch: {name} is not a read of a group input")
            self.reads[name] = (expr, vars_, tuple(int(s) for s in graph.tensor(name).shape))
        self.memo: dict[tuple[Any, ...], dict[str, tuple[int, tuple[int, ...]]] | None] = {}

    def fit(
        self, key: tuple[tuple[int, ...], ...]
    ) -> dict[str, tuple[int, tuple[int, ...]]] | None:
        """Per output, ``(offset, strides)`` in its source, for sources of strides ``key``.

        ``key``: one stride tuple per output, in :attr:`reads` order. ``None`` when some
        output is not such a view.
        """
        if key not in self.memo:
            fits = {
                name: fit_strides(acc, vars_, shape, step)
                for (name, (acc, vars_, shape)), step in zip(self.reads.items(), key, strict=True)
            }
            ok = all(f is not None for f in fits.values())
            self.memo[key] = {n: f for n, f in fits.items() if f is not None} if ok else None
        return self.memo[key]

    def __call__(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The outputs as views of the inputs (or the kernel's copies)."""
        fitted = self.fit(tuple(values[a.tensor].stride() for a, _, _ in self.reads.values()))
        if fitted is None:
            out: dict[str, torch.Tensor] = self.fallback(values)
            return out
        views = {}
        for name, (acc, _, shape) in self.reads.items():
            src = values[acc.tensor]
            base, strides = fitted[name]
            views[name] = torch.as_strided(src, shape, strides, src.storage_offset() + base)
        return views
