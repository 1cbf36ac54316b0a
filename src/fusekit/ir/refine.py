r"""Split merged dims: give every tensor the finest shape its reshapes agree on.

A reshape between ``[B*S, H]`` and ``[B, S, H]`` reads its source at computed indices
(``X[i/S, i%S, h]``), so the stitching analysis cannot unify the two sides and the reshape is a
kernel boundary. This pass rewrites the graph so that both sides use ``[B, S, H]``: each dim and
each op variable is split at the *breakpoints* every access of it implies, and the reshape
becomes a plain read (``X[b, s, h]``) that folds into its readers. ::

    before                                  after
    m[b,s,h] = x[b,s,h] * w[h]              m[b,s,h] = x[b,s,h] * w[h]
    v[i,h]   = m[i/128, i%128, h]           v[b,s,h] = m[b,s,h]
    c[h]     = sum_i v[i,h]                 c[h]     = sum_{b,s} v[b,s,h]

A dim of size ``N`` split into factors ``(f_1, ..., f_k)`` (outer first) is kept as its
breakpoints, the inner products :math:`\prod_{j>m} f_j` strictly between 1 and ``N``; two
factorisations of one dim are compatible iff the union of their breakpoints is a chain under
divisibility (``12`` as ``(3, 4)`` and ``(2, 6)`` is not). An index term that is a digit range
of a mixed-radix number of op variables (``b*128 + s``, ``i/128``, ``i%128``) links a dim's
positions to its variables' positions, and breakpoints flow both ways through links until
nothing changes; a slice at an aligned offset (``X[j + 32]`` with ``j < 32``) adds a constant
outer digit. A term of any other form (an unaligned offset, a step, a constant index) pins its
dim and variables: they are never split. When a reshape's breakpoints would split a pinned slot
or break a chain, that reshape is left as it was (a kernel boundary, as before) and the rest
proceeds.

Only the tensors of element-wise maps and reductions are split. Graph inputs and params keep
their shapes (their reads become affine, ``x[b*128 + s, h]``); a split tensor that the graph
returns, or that a contraction, opaque or indirect op reads, keeps its name and shape through a
reshape of the split one (run as a strided view, no copy). The result computes what the graph
computes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import count, pairwise

from fusekit.ir.expr import (
    Access,
    Bin,
    Call,
    Const,
    Expr,
    IBin,
    IConst,
    IndexTerm,
    IVar,
    Reduce,
    term_accesses,
    walk,
)
from fusekit.ir.graph import Graph
from fusekit.ir.lowering.base import reshape_terms
from fusekit.ir.op import Op, OpKind
from fusekit.ir.tensor import Dim, Format, Tensor

#: A slot: an op's index variable ``("v", op, var)`` or a tensor's dim ``("t", tensor, dim)``.
Slot = tuple[str, str, str | int]


@dataclass(frozen=True, slots=True)
class Piece:
    """Digits ``[lo, hi)`` of an op variable: the index ``(var / lo) % (hi / lo)``."""

    var: str
    lo: int
    hi: int


@dataclass(frozen=True, slots=True)
class Fixed:
    """A constant outer digit: ``value`` in ``[0, radix)`` (a slice's offset, ``X[j + 32]``)."""

    value: int
    radix: int


@dataclass(frozen=True, slots=True)
class Link:
    """Dim positions ``[inner, inner*r)`` of ``dim`` are variable positions ``[lo, lo*r)``."""

    dim: Slot
    var: Slot
    inner: int
    lo: int
    r: int


def _affine(term: IndexTerm) -> dict[str, int] | None:
    """``sum(var * stride)`` as ``{var: stride}``, or ``None`` for any other term."""
    if isinstance(term, IVar):
        return {term.name: 1}
    if isinstance(term, IBin) and term.op == "*":
        if isinstance(term.left, IVar) and isinstance(term.right, IConst):
            return {term.left.name: term.right.value}
        if isinstance(term.right, IVar) and isinstance(term.left, IConst):
            return {term.right.name: term.left.value}
        return None
    if isinstance(term, IBin) and term.op == "+":
        left, right = _affine(term.left), _affine(term.right)
        if left is None or right is None or set(left) & set(right):
            return None
        return {**left, **right}
    return None


def pieces(term: IndexTerm, size: int, extents: Mapping[str, int]) -> list[Piece | Fixed] | None:
    """The digit ranges that make up ``term``, outer first, or ``None`` if it is not one.

    ``term`` must be ``flat``, ``flat / c``, ``flat % m`` or ``flat / c % m``, where ``flat`` is a
    mixed-radix number of variables (each stride the product of the extents inside it), and the
    range it takes must cut each variable at divisors of its extent and cover ``size`` values;
    or ``flat + k``, or ``flat`` over fewer than ``size`` values, with ``k`` a multiple of the
    values ``flat`` takes (a slice at an aligned offset: a :class:`Fixed` outer digit).
    """
    k = 0
    if isinstance(term, IBin) and term.op == "+" and isinstance(term.right, IConst):
        k, term = term.right.value, term.left
    got = _digits(term, extents)
    if got is None:
        return None
    width = math.prod(p.hi // p.lo for p in got)
    if width == size and k == 0:
        return list(got)
    if width <= 0 or k % width or size % width or not 0 <= k // width < size // width:
        return None
    return [Fixed(k // width, size // width), *got]


def _digits(term: IndexTerm, extents: Mapping[str, int]) -> list[Piece] | None:
    """The digit ranges of ``flat``, ``flat / c``, ``flat % m`` or ``flat / c % m``."""
    c, m = 1, None
    if isinstance(term, IBin) and term.op == "%" and isinstance(term.right, IConst):
        m, term = term.right.value, term.left
    if isinstance(term, IBin) and term.op == "/" and isinstance(term.right, IConst):
        c, term = term.right.value, term.left
    flat = _affine(term)
    if flat is None or c <= 0:
        return None
    order = sorted(flat, key=lambda v: flat[v])  # inner first
    total = 1
    for var in order:
        if var not in extents or flat[var] != total:
            return None
        total *= extents[var]
    top = total if m is None else c * m
    if top > total or top % c:
        return None
    out: list[Piece] = []
    for var in reversed(order):  # outer first
        stride, extent = flat[var], extents[var]
        lo, hi = max(c, stride), min(top, stride * extent)
        if lo >= hi:
            continue
        if lo % stride or hi % stride:
            return None
        lo, hi = lo // stride, hi // stride
        if hi % lo or extent % hi:
            return None
        out.append(Piece(var, lo, hi))
    return out


def _chain(points: Iterable[int]) -> bool:
    ordered = sorted(points)
    return all(b % a == 0 for a, b in pairwise(ordered))


def factors(size: int, points: Iterable[int]) -> tuple[int, ...]:
    """The factors (outer first) of a dim of ``size`` split at ``points`` (a chain)."""
    cuts = [1, *sorted(points), size]
    return tuple(cuts[k + 1] // cuts[k] for k in reversed(range(len(cuts) - 1)))


def _refinable(graph: Graph, op: Op) -> bool:
    fmt = graph.tensor(op.name).format
    if not fmt.is_dense or fmt.order is not None:
        return False
    if op.kind not in (OpKind.MAP, OpKind.REDUCE) or op.accumulate:
        return False
    reads = [n for n in walk(op.expr) if isinstance(n, Access)]
    return not any(
        next(term_accesses(t), None) is not None for a in (op.out, *reads) for t in a.indices
    )


class _Slots:
    """Breakpoints of every slot, propagated through links, with the origin of each."""

    def __init__(self, sizes: Mapping[Slot, int], pinned: set[Slot], links: Sequence[Link]):
        self.sizes, self.pinned = sizes, pinned
        self.by_slot: dict[Slot, list[Link]] = {}
        for link in links:
            self.by_slot.setdefault(link.dim, []).append(link)
            self.by_slot.setdefault(link.var, []).append(link)
        self.points: dict[Slot, dict[int, int]] = {}  # slot -> breakpoint -> origin

    def add(self, seeds: Sequence[tuple[Slot, int, int]]) -> int | None:
        """Add seeds ``(slot, point, origin)`` and propagate; the origin of a conflict, if any."""
        work = list(seeds)
        while work:
            slot, point, origin = work.pop()
            if point <= 1 or point >= self.sizes[slot]:
                continue
            have = self.points.setdefault(slot, {})
            if point in have:
                continue
            if slot in self.pinned or not _chain([*have, point, self.sizes[slot]]):
                return origin
            have[point] = origin
            for link in self.by_slot.get(slot, ()):
                if slot == link.dim and link.inner < point < link.inner * link.r:
                    if point % link.inner:
                        return origin
                    work.append((link.var, link.lo * point // link.inner, origin))
                if slot == link.var and link.lo < point < link.lo * link.r:
                    if point % link.lo:
                        return origin
                    work.append((link.dim, link.inner * point // link.lo, origin))
        return None


def refine_dims(graph: Graph) -> Graph:
    """``graph`` with merged dims split wherever a reshape links them (module docstring).

    Returns ``graph`` itself when no reshape links two splittable tensors.
    """
    ops = [op for op in graph.ops if _refinable(graph, op)]
    slot_tensors = {op.name for op in ops}
    sizes: dict[Slot, int] = {}
    pinned: set[Slot] = set()
    links: dict[int, list[Link]] = {}  # origin (an access) -> the links of its terms
    seeds: dict[int, list[tuple[Slot, int, int]]] = {}  # origin -> its cut points
    parsed: dict[tuple[str, int, int], list[Piece | Fixed]] = {}  # (op, access, dim) -> pieces
    origins: dict[tuple[str, int], int] = {}  # (op, access) -> its origin
    for op in ops:
        ext = graph.extents(op.name)
        for var, e in ext.items():
            sizes[("v", op.name, var)] = e if isinstance(e, int) else 1
            if not isinstance(e, int):
                pinned.add(("v", op.name, var))
        reads = [n for n in walk(op.expr) if isinstance(n, Access)]
        for k, acc in enumerate((op.out, *reads)):
            if acc.tensor not in slot_tensors:
                continue
            shape = graph.shapes[acc.tensor]
            origin = len(links)
            links[origin] = []
            for d, term in enumerate(acc.indices):
                dim: Slot = ("t", acc.tensor, d)
                size = shape[d]
                sizes[dim] = size if isinstance(size, int) else 1
                ints = {v: e for v, e in ext.items() if isinstance(e, int)}
                got = pieces(term, size, ints) if isinstance(size, int) else None
                if got is None or not isinstance(size, int):
                    pinned.add(dim)
                    pinned.update(("v", op.name, v) for v in _vars(term))
                    continue
                parsed[(op.name, k, d)] = got
                origins[(op.name, k)] = origin
                inner = size
                for p in got:
                    if isinstance(p, Fixed):  # a constant digit: a cut, no variable to link
                        inner //= p.radix
                        seeds.setdefault(origin, []).append((dim, inner, origin))
                        continue
                    r = p.hi // p.lo
                    inner //= r
                    slot: Slot = ("v", op.name, p.var)
                    links[origin].append(Link(dim, slot, inner, p.lo, r))
                    cuts = [(dim, inner, origin), (slot, p.lo, origin), (slot, p.hi, origin)]
                    seeds.setdefault(origin, []).extend(cuts)
    slots, dropped = _solve(sizes, pinned, links, seeds)
    if not any(slots.points.values()):
        return graph
    kept = {key: got for key, got in parsed.items() if origins[key[:2]] not in dropped}
    return _rewrite(graph, ops, slots, kept)


def _vars(term: IndexTerm) -> set[str]:
    if isinstance(term, IVar):
        return {term.name}
    if isinstance(term, IBin):
        return _vars(term.left) | _vars(term.right)
    return set()


def _solve(
    sizes: Mapping[Slot, int],
    pinned: set[Slot],
    links: Mapping[int, list[Link]],
    seeds: Mapping[int, list[tuple[Slot, int, int]]],
) -> tuple[_Slots, set[int]]:
    """Propagate every origin's cuts; the slots, and the origins dropped on the way.

    An origin whose cuts conflict is dropped (its cuts and its links), and the propagation
    starts again without it.
    """
    dropped: set[int] = set()
    while True:
        active = [link for origin, own in links.items() if origin not in dropped for link in own]
        slots = _Slots(sizes, pinned, active)
        conflict = None
        for origin, cuts in seeds.items():
            if origin not in dropped:
                conflict = slots.add(cuts)
                if conflict is not None:
                    break
        if conflict is None:
            return slots, dropped
        dropped.add(conflict)


def _rewrite(
    graph: Graph,
    ops: Sequence[Op],
    slots: _Slots,
    parsed: Mapping[tuple[str, int, int], list[Piece | Fixed]],
) -> Graph:
    shapes = graph.shapes
    new_shape: dict[str, tuple[Dim, ...]] = {}
    for name in {op.name for op in ops}:
        split: list[Dim] = []
        for d, size in enumerate(shapes[name]):
            points = slots.points.get(("t", name, d), {})
            split += factors(size, points) if isinstance(size, int) else [size]
        if tuple(split) != tuple(shapes[name]):
            new_shape[name] = tuple(split)
    refinable = {op.name for op in ops}
    bridged = {
        name for name in new_shape
        if name in graph.outputs
        or any(c.name not in refinable for c in graph.consumers(name))
    }  # fmt: skip
    taken = {t.name for t in graph.tensors}
    rename: dict[str, str] = {}
    for name in sorted(bridged):
        fresh = f"{name}_split"
        while fresh in taken:
            fresh += "_"
        taken.add(fresh)
        rename[name] = fresh
    tensors: list[Tensor] = []
    for t in graph.tensors:
        if t.name in new_shape:
            shape = new_shape[t.name]
            tensors.append(
                replace(
                    t, name=rename.get(t.name, t.name), shape=shape, format=Format.dense(len(shape))
                )
            )
        if t.name not in new_shape or t.name in rename:
            tensors.append(t)
    new_ops: list[Op] = []
    for op in graph.ops:
        if op.name not in refinable:
            new_ops.append(op)
            continue
        new_ops.append(_Rewriter(graph, op, slots, parsed, new_shape, rename).op())
        if op.name in rename:  # the graph's own name and shape, as a view of the split tensor
            new_ops.append(_reshape(rename[op.name], new_shape[op.name], graph.tensor(op.name)))
    by_name = {t.name: t for t in tensors}
    alias = _identities(new_ops, by_name, refinable | set(rename.values()), set(graph.outputs))
    if alias:
        new_ops = [_read_through(op, alias) for op in new_ops if op.name not in alias]
        tensors = [t for t in tensors if t.name not in alias]
    return Graph(tuple(tensors), tuple(new_ops), graph.inputs, graph.params, graph.outputs,
                 graph.name)  # fmt: skip


def _identities(
    ops: Sequence[Op], tensors: Mapping[str, Tensor], rewritten: set[str], outputs: set[str]
) -> dict[str, str]:
    """The plain copies ``Y[v] = X[v]`` that only rewritten ops read, each to what it copies.

    Same shape and dtype; reads of ``Y`` become reads of ``X``.
    """
    readers: dict[str, list[str]] = {}
    for op in ops:
        for name in op.inputs:
            readers.setdefault(name, []).append(op.name)
    alias: dict[str, str] = {}
    for op in ops:
        src = op.expr
        if (
            op.name in outputs
            or not isinstance(src, Access)
            or op.accumulate
            or src.indices != op.out.indices
            or tensors[src.tensor].shape != tensors[op.name].shape
            or tensors[src.tensor].dtype != tensors[op.name].dtype
            or any(r not in rewritten for r in readers.get(op.name, ()))
        ):
            continue
        alias[op.name] = alias.get(src.tensor, src.tensor)
    return alias


def _read_through(op: Op, alias: Mapping[str, str]) -> Op:
    """``op`` reading ``alias[X]`` wherever it read ``X``."""

    def expr(e: Expr) -> Expr:
        if isinstance(e, Access):
            return Access(alias.get(e.tensor, e.tensor), e.indices)
        if isinstance(e, Bin):
            return Bin(e.op, expr(e.left), expr(e.right))
        if isinstance(e, Call):
            return Call(e.fn, tuple(expr(a) for a in e.args))
        if isinstance(e, Reduce):
            return Reduce(e.op, e.vars, expr(e.body))
        return e

    if not set(op.inputs) & set(alias):
        return op
    return Op(op.out, expr(op.expr), op.accumulate, op.origin)


def _reshape(source: str, shape: tuple[Dim, ...], out: Tensor) -> Op:
    """``out`` (its own shape) as a reshape of the split tensor ``source`` (``shape``)."""
    names = [f"i{d}" for d in range(len(out.shape))]
    terms = reshape_terms([int(s) for s in shape], [int(s) for s in out.shape], names)
    return Op(Access(out.name, tuple(IVar(n) for n in names)), Access(source, tuple(terms)),
              origin="refine: view of the split tensor")  # fmt: skip


class _Rewriter:
    """One op with its variables split and every access re-indexed."""

    def __init__(
        self,
        graph: Graph,
        op: Op,
        slots: _Slots,
        parsed: Mapping[tuple[str, int, int], list[Piece | Fixed]],
        new_shape: Mapping[str, tuple[Dim, ...]],
        rename: Mapping[str, str],
    ) -> None:
        self.graph, self.source, self.slots, self.parsed = graph, op, slots, parsed
        self.new_shape, self.rename = new_shape, rename
        ext = graph.extents(op.name)
        used = set(ext)
        self.subvars: dict[str, list[tuple[str, int]]] = {}  # var -> [(name, extent)], outer first
        self.flat: dict[str, IndexTerm] = {}
        for var, e in ext.items():
            points = slots.points.get(("v", op.name, var), {})
            if not points or not isinstance(e, int):
                self.subvars[var] = [(var, int(e) if isinstance(e, int) else 1)]
                self.flat[var] = IVar(var)
                continue
            subs: list[tuple[str, int]] = []
            for f in factors(e, points):
                k, name = 0, f"{var}{len(subs)}"
                while name in used:
                    k += 1
                    name = f"{var}{len(subs)}x{k}"
                used.add(name)
                subs.append((name, f))
            self.subvars[var] = subs
            self.flat[var] = _mixed_radix(subs)
        self.extents = {name: f for subs in self.subvars.values() for name, f in subs}

    def op(self) -> Op:
        """The rewritten op (reads numbered in :func:`walk` order, as :func:`refine_dims` does)."""
        op = self.source
        reads = count(1)
        return Op(self.access(op.out, 0), self._expr(op.expr, reads), op.accumulate, op.origin)

    def _expr(self, e: Expr, reads: Iterator[int]) -> Expr:
        if isinstance(e, Access):
            return self.access(e, next(reads))
        if isinstance(e, Bin):
            left = self._expr(e.left, reads)
            return Bin(e.op, left, self._expr(e.right, reads))
        if isinstance(e, Call):
            return Call(e.fn, tuple(self._expr(a, reads) for a in e.args))
        if isinstance(e, Reduce):
            names = tuple(n for v in e.vars for n, _ in self.subvars[v])
            return Reduce(e.op, names, self._expr(e.body, reads))
        assert isinstance(e, Const)
        return e

    def access(self, acc: Access, k: int) -> Access:
        """``acc`` (the op's ``k``-th access in walk order, 0 = its output) re-indexed."""
        name = acc.tensor
        shape = self.graph.shapes[name]
        terms: list[IndexTerm] = []
        for d, term in enumerate(acc.indices):
            dim: Slot = ("t", name, d)
            size = shape[d]
            points = self.slots.points.get(dim, {}) if name in self.new_shape else {}
            cuts = [1, *sorted(points), size]
            got = self.parsed.get((self.source.name, k, d))
            direct = self._direct(got, cuts) if got is not None else None
            if direct is not None:
                terms += direct
                continue
            flat = self._substitute(term)
            for j in reversed(range(len(cuts) - 1)):  # outer sub-dim first
                lo, hi = cuts[j], cuts[j + 1]
                t = flat if lo == 1 else IBin("/", flat, IConst(int(lo)))
                t = t if j == len(cuts) - 2 else IBin("%", t, IConst(int(hi) // int(lo)))
                terms.append(self._simplify(t, hi, lo))
        return Access(self.rename.get(name, name), tuple(terms))

    def _simplify(self, term: IndexTerm, hi: int | str, lo: int | str) -> IndexTerm:
        """``term`` as whole sub-variables when it is one (``(k0*32 + k1)/32`` is ``k0``)."""
        if not isinstance(hi, int) or not isinstance(lo, int):
            return term
        got = pieces(term, hi // lo, self.extents)
        if not got or any(
            isinstance(p, Fixed) or p.lo != 1 or p.hi != self.extents[p.var] for p in got
        ):
            return term  # not one, or a size-1 dim (a variable of extent 1 stays a variable)
        return _mixed_radix([(p.var, p.hi) for p in got if isinstance(p, Piece)])

    def _direct(self, got: list[Piece | Fixed], cuts: list[int | str]) -> list[IndexTerm] | None:
        """Each sub-dim as one sub-variable or constant, when the pieces line up with the cuts."""
        spans: list[tuple[int, int, Piece | Fixed]] = []  # dim positions [a, b) of each piece
        inner = 1
        for p in reversed(got):
            r = p.radix if isinstance(p, Fixed) else p.hi // p.lo
            spans.append((inner, inner * r, p))
            inner *= r
        out: list[IndexTerm] = []
        for j in reversed(range(len(cuts) - 1)):
            lo, hi = cuts[j], cuts[j + 1]
            if not isinstance(lo, int) or not isinstance(hi, int):
                return None
            span = next((s for s in spans if s[0] <= lo and hi <= s[1]), None)
            if span is None:
                return None
            a, _, p = span
            if isinstance(p, Fixed):  # the constant's digits in this sub-dim
                out.append(IConst(p.value * a // lo % (hi // lo)))
                continue
            vlo, vhi = p.lo * lo // a, p.lo * hi // a
            sub = self._subvar(p.var, vlo, vhi)
            if sub is None:
                return None
            out.append(sub)
        return out

    def _subvar(self, var: str, lo: int, hi: int) -> IndexTerm | None:
        inner = 1
        for name, f in reversed(self.subvars[var]):
            if inner == lo and inner * f == hi:
                return IVar(name)
            inner *= f
        return None

    def _substitute(self, term: IndexTerm) -> IndexTerm:
        if isinstance(term, IVar):
            return self.flat[term.name]
        if isinstance(term, IBin):
            return IBin(term.op, self._substitute(term.left), self._substitute(term.right))
        return term


def _mixed_radix(subs: Sequence[tuple[str, int]]) -> IndexTerm:
    out: IndexTerm | None = None
    stride = 1
    for name, f in reversed(subs):
        t: IndexTerm = IVar(name) if stride == 1 else IBin("*", IVar(name), IConst(stride))
        out = t if out is None else IBin("+", t, out)
        stride *= f
    assert out is not None
    return out
