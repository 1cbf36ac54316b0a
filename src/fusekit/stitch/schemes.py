"""Stitching schemes: how the ops of one fusion group share one kernel.

A group becomes one kernel over a common iteration space, the *anchor*: the index variables of
all its ops are unified through the tensors they exchange (``Y[i,j]`` written by one op and read
as ``Y[a,b]`` by another makes ``i = a`` and ``j = b``; inputs two ops both read plainly unify
them too, which is how sibling reductions over different axes meet). The anchor's dims split
into outer *parallel* dims ``P`` (one row per iteration, rows spread over threads or programs)
and inner dims ``Q`` (loops inside a row)::

    for p in P (parallel):              scheme
        stage 1: for q in Q: ...        local     one stage: values stay in registers
        row ops on scalars              regional  several stages: a value needed by a later
        stage 2: for q in Q: ...                  stage is kept in a row buffer (cache, shared
                                                  memory)
    combine per-thread partials         global    column reductions (over P): per-thread partial
                                                  sums, combined after the rows (two phases)

Each op takes one role: ``full`` (a map over P and Q, computed in a stage), ``row`` (a map over
P only, a scalar per row), ``row_reduce`` (reduces Q dims into a scalar per row) or
``col_reduce`` (reduces all P dims, keeps Q dims). Layout ops read only inside the group are
folded into their readers' index expressions. A group the analysis cannot express raises
:class:`Unfusable` with the reason; such ops run alone.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType

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
    ReduceOp,
    term_accesses,
    walk,
)
from fusekit.ir.graph import Graph
from fusekit.ir.op import Op, OpKind
from fusekit.stitch.classify import EXPENSIVE as _EXPENSIVE

#: Most arithmetic nodes of a full value a later stage recomputes rather than reads from a
#: row buffer (its own and those of earlier full values it recomputes in turn), and of a map
#: folded into the readers that read it at computed indices.
RECOMPUTE_NODES = 4


class Unfusable(ValueError):
    """The group cannot become one stitched kernel; the message says why."""


class Scheme(StrEnum):
    """How a kernel's ops exchange values (FusionStitching's stitching schemes)."""

    LOCAL = "local"
    REGIONAL = "regional"
    GLOBAL = "global"


class Role(StrEnum):
    """What one op computes inside the kernel."""

    FULL = "full"
    ROW = "row"
    ROW_REDUCE = "row_reduce"
    COL_REDUCE = "col_reduce"


@dataclass(frozen=True, slots=True)
class Stage:
    """One loop over the inner dims computing ``ops`` (full ops and reductions)."""

    ops: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RowStep:
    """A scalar op computed once per row between stages."""

    op: str


@dataclass(frozen=True, slots=True)
class Layout:
    """The kernel structure of one group.

    Attributes:
        ops: the computed ops (layout ops folded into readers excluded), topological order.
        folded: layout ops, and cheap maps read at computed indices, folded into their readers.
        exprs: each computed op's expression after folding.
        var_dims: per op, its variables' anchor dims (``None``: a size-1 dim, index 0).
        extents: anchor extents, outermost first.
        par_dims: the parallel (outer) anchor dims.
        inner_dims: the inner anchor dims.
        roles: each computed op's :class:`Role`.
        steps: stages and row steps in execution order.
        buffered: full ops a later stage reads (kept in a row buffer).
        inputs: tensors read from outside the group.
        outputs: tensors the group writes (read outside or returned).
        scheme: the stitching scheme.
        out_dims: per computed op, the anchor dim of each output dimension (``None``: size 1).
        online: row sums computed in their row max's stage (:func:`online_softmax`): sum ->
            max; empty unless a backend asked for the rewrite.
    """

    ops: tuple[str, ...]
    folded: frozenset[str]
    exprs: Mapping[str, Expr]
    var_dims: Mapping[str, Mapping[str, int | None]]
    extents: tuple[int, ...]
    par_dims: tuple[int, ...]
    inner_dims: tuple[int, ...]
    roles: Mapping[str, Role]
    steps: tuple[Stage | RowStep, ...]
    buffered: frozenset[str]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    scheme: Scheme
    out_dims: Mapping[str, tuple[int | None, ...]]
    online: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def out_dims_of(self, op: str) -> list[int]:
        """The anchor dims of an op's output (size-1 dims left out)."""
        return [d for d in self.out_dims[op] if d is not None]

    @property
    def inner_numel(self) -> int:
        """Elements of one row (the product of the inner extents)."""
        n = 1
        for d in self.inner_dims:
            n *= self.extents[d]
        return n

    @property
    def rows(self) -> int:
        """Number of rows (the product of the parallel extents)."""
        n = 1
        for d in self.par_dims:
            n *= self.extents[d]
        return n


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[tuple[str, str, int | str], tuple[str, str, int | str]] = {}

    def find(self, x: tuple[str, str, int | str]) -> tuple[str, str, int | str]:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def members(self) -> dict[tuple[str, str, int | str], list[tuple[str, str, int | str]]]:
        out: dict[tuple[str, str, int | str], list[tuple[str, str, int | str]]] = {}
        for x in self.parent:
            out.setdefault(self.find(x), []).append(x)
        return out


def _subst_term(term: IndexTerm, env: Mapping[str, IndexTerm]) -> IndexTerm:
    if isinstance(term, IVar):
        return env[term.name]
    if isinstance(term, IBin):
        return IBin(term.op, _subst_term(term.left, env), _subst_term(term.right, env))
    if isinstance(term, Access):
        raise Unfusable(f"indirect index {term.tensor}")
    return term


def _subst_expr(expr: Expr, env: Mapping[str, IndexTerm]) -> Expr:
    """``expr`` with its index variables replaced by ``env``'s terms (no reductions inside)."""
    if isinstance(expr, Access):
        return Access(expr.tensor, tuple(_subst_term(t, env) for t in expr.indices))
    if isinstance(expr, Bin):
        return Bin(expr.op, _subst_expr(expr.left, env), _subst_expr(expr.right, env))
    if isinstance(expr, Call):
        return Call(expr.fn, tuple(_subst_expr(a, env) for a in expr.args))
    if isinstance(expr, Const):
        return expr
    raise Unfusable(f"expression {type(expr).__name__} in a folded op")


def fold_layouts(expr: Expr, layouts: Mapping[str, Op]) -> Expr:
    """Replace reads of folded ops by their sources (or expressions), at composed indices.

    A folded layout op is a read of its source; a folded map (a cheap one an op reads at
    computed indices) is its expression, recomputed at the reader's indices.
    """
    if isinstance(expr, Access):
        if any(next(term_accesses(t), None) is not None for t in expr.indices):
            raise Unfusable(f"indirect read of {expr.tensor}")
        op = layouts.get(expr.tensor)
        if op is None:
            return expr
        env = {
            t.name: term for t, term in zip(op.out.indices, expr.indices, strict=True)
            if isinstance(t, IVar)
        }  # fmt: skip
        return fold_layouts(_subst_expr(op.expr, env), layouts)
    if isinstance(expr, Bin):
        return Bin(expr.op, fold_layouts(expr.left, layouts), fold_layouts(expr.right, layouts))
    if isinstance(expr, Call):
        return Call(expr.fn, tuple(fold_layouts(a, layouts) for a in expr.args))
    if isinstance(expr, Reduce):
        return Reduce(expr.op, expr.vars, fold_layouts(expr.body, layouts))
    if isinstance(expr, Const):
        return expr
    raise Unfusable(f"expression {type(expr).__name__}")


def _folded(op: Op, layouts: Mapping[str, Op]) -> Expr:
    """``fold_layouts(op.expr, layouts)``: the op's own expression when it reads none of them.

    For a map or reduce op (no indirect read, no opaque call) folding changes only the reads
    of ``layouts``; keeping the expression itself lets :func:`_reads` use the op's memo.
    """
    if layouts.keys().isdisjoint(op.inputs):
        return op.expr
    return fold_layouts(op.expr, layouts)


def _reads(op: Op, expr: Expr) -> tuple[Access, ...]:
    """The value reads of ``expr``, the op's (folded) expression, in :func:`walk` order."""
    if expr is op.expr:
        return op.reads
    return tuple(n for n in walk(expr) if isinstance(n, Access))


def _inlined(
    order: list[Op],
    folded: Mapping[str, Op],
    outputs: Collection[str],
    shapes: Mapping[str, tuple[int | str, ...]],
) -> dict[str, Op]:
    """Cheap maps of the group that some op reads at computed indices: folded into readers.

    A ``cat`` reads its pieces at ``(j + c) % n``, a rotary embedding's ``-x2`` among them;
    computed there, ``-x2`` could share no loop with the ``cat``. At most
    :data:`RECOMPUTE_NODES` arithmetic nodes, no transcendental function, not an output.
    """
    ops = {op.name: op for op in order}
    chosen = dict(folded)
    while True:
        found = {}
        for op in order:
            if op.name in chosen:
                continue
            for n in _reads(op, _folded(op, chosen)):
                if n.tensor not in ops or n.tensor in chosen:
                    continue
                plain = all(
                    isinstance(t, IVar) or (isinstance(t, IConst) and shapes[n.tensor][d] == 1)
                    for d, t in enumerate(n.indices)
                )
                src = ops[n.tensor]
                if plain or n.tensor in outputs or src.kind is not OpKind.MAP or src.accumulate:
                    continue
                if _nodes(src.expr) <= RECOMPUTE_NODES:
                    found[n.tensor] = src
        if not found:
            return {k: v for k, v in chosen.items() if k not in folded}
        chosen.update(found)


def _nodes(expr: Expr) -> int:
    """Arithmetic nodes of ``expr``, a transcendental function counting past any limit."""
    nodes = 0
    for n in walk(expr):
        if isinstance(n, Call) and n.fn in _EXPENSIVE:
            nodes += RECOMPUTE_NODES + 1
        elif isinstance(n, Bin | Call):
            nodes += 1
    return nodes


def _bound_vars(expr: Expr) -> list[str]:
    return [v for n in walk(expr) if isinstance(n, Reduce) for v in n.vars]


def analyze(graph: Graph, group: Collection[str]) -> Layout:
    """The kernel structure of ``group``.

    Args:
        graph: the graph.
        group: op names, a convex set.

    Returns:
        The :class:`Layout`.

    Raises:
        Unfusable: if the ops cannot share one stitched kernel (a contraction or opaque op, an
            in-group tensor read at computed indices, variables that do not unify, reductions
            that fit no split of the anchor into parallel and inner dims).
    """
    names = set(group)
    order = graph.in_order(names)
    if len(order) != len(names):
        raise Unfusable("unknown op names")
    outputs = tuple(
        op.name for op in order
        if op.name in graph.outputs or set(graph.successors(op.name)) - names
    )  # fmt: skip
    for op in order:
        if op.kind not in (OpKind.MAP, OpKind.REDUCE) or op.accumulate:
            raise Unfusable(f"{op.name} is a {op.kind.value} op")
        nested = op.kind is OpKind.REDUCE and any(
            isinstance(n, Reduce) and _bound_vars(n.body) for n in walk(op.expr)
        )
        if nested:
            raise Unfusable(f"{op.name} nests reductions")
    layouts = {op.name: op for op in order if graph.moves_only(op.name) and op.name not in outputs}
    layouts.update(_inlined(order, layouts, outputs, graph.shapes))
    computed = [op for op in order if op.name not in layouts]
    if not computed:
        raise Unfusable("only layout ops")
    exprs = {op.name: _folded(op, layouts) for op in computed}
    reads_of = {op.name: _reads(op, exprs[op.name]) for op in computed}
    shapes = graph.shapes
    extents = {op.name: graph.extents(op.name) for op in computed}
    produced = {op.name for op in computed}

    # -- unify variables through tensors: in-group tensors must agree, inputs only help --
    uf = _UnionFind()
    # per class root: its members by tensor (or op) name; two members of one name in a class
    # would index one loop with two dims of that tensor
    owners: dict[tuple[str, str, int | str], dict[str, tuple[str, str, int | str]]] = {}

    def union(a: tuple[str, str, int | str], b: tuple[str, str, int | str], strict: bool) -> None:
        ra, rb = uf.find(a), uf.find(b)
        if ra == rb:
            return
        da, db = owners.get(ra) or {ra[1]: ra}, owners.get(rb) or {rb[1]: rb}
        if len(da) > len(db):  # the smaller class joins the larger
            ra, rb, da, db = rb, ra, db, da
        for name, m in da.items():
            prev = db.get(name)
            if prev is not None and prev != m:
                if strict:
                    raise Unfusable(f"{name} would index one loop with two of its dims")
                return
        db.update(da)
        uf.parent[ra] = rb
        owners[rb] = db
        owners.pop(ra, None)

    reads: list[tuple[Op, Access]] = []
    for op in computed:
        for var in extents[op.name]:
            uf.find(("v", op.name, var))
        for d, t in enumerate(op.out.indices):
            if isinstance(t, IVar):
                union(("v", op.name, t.name), ("t", "#" + op.name, d), True)
        reads += [(op, n) for n in reads_of[op.name]]
    for op, acc in reads:
        if acc.tensor not in produced:
            continue
        for d, t in enumerate(acc.indices):
            if isinstance(t, IVar):
                union(("v", op.name, t.name), ("t", "#" + acc.tensor, d), True)
            elif not (isinstance(t, IConst) and shapes[acc.tensor][d] == 1):
                raise Unfusable(f"{op.name} reads in-group {acc.tensor} at a computed index")
    for op, acc in sorted(reads, key=lambda r: -_numel(shapes[r[1].tensor])):
        if acc.tensor in produced:
            continue
        for d, t in enumerate(acc.indices):
            if isinstance(t, IVar) and shapes[acc.tensor][d] == extents[op.name][t.name]:
                union(("v", op.name, t.name), ("t", "@" + acc.tensor, d), False)

    # -- anchor dims: one per class holding a variable of extent > 1, in storage order --
    classes = uf.members()
    dim_of_root: dict[tuple[str, str, int | str], int] = {}
    root_extent: list[int] = []
    root_order: list[tuple[str, str, int | str]] = []
    for root, members in classes.items():
        sizes = {int(extents[m[1]][str(m[2])]) for m in members if m[0] == "v"}
        if not sizes:
            continue
        if len(sizes) > 1:
            raise Unfusable(f"one loop with extents {sorted(sizes)}")
        size = sizes.pop()
        if size > 1:
            dim_of_root[root] = len(root_extent)
            root_extent.append(size)
            root_order.append(root)
    read = {n.tensor for op in computed for n in reads_of[op.name]}
    touched = set(produced) | read
    largest = max(_numel(shapes[t]) for t in touched)
    if _numel(tuple(root_extent)) > largest:  # loops of unrelated ops side by side: a product
        raise Unfusable(
            f"an iteration space of {_numel(tuple(root_extent)):,} points, more than its "
            f"largest tensor ({largest:,}): the ops share no loops"
        )
    rank = _storage_rank(root_order, classes, shapes)
    perm = sorted(range(len(root_order)), key=lambda i: rank[i])
    new_index = {old: new for new, old in enumerate(perm)}
    anchor = tuple(root_extent[i] for i in perm)
    var_dims: dict[str, dict[str, int | None]] = {}
    for op in computed:
        var_dims[op.name] = {}
        for var in extents[op.name]:
            root = uf.find(("v", op.name, var))
            var_dims[op.name][var] = new_index[dim_of_root[root]] if root in dim_of_root else None
    out_maps = tuple(
        (op.name, tuple(
            var_dims[op.name][t.name] if isinstance(t, IVar) else None for t in op.out.indices
        ))
        for op in computed
    )  # fmt: skip

    # -- split anchor dims into parallel and inner, the innermost possible first --
    n = len(anchor)
    bound_vars = {op.name: _bound_vars(exprs[op.name]) for op in computed}
    roles: dict[str, Role] | None = None
    split = n
    for split in ([n - 1] if n else [0]) + list(range(n - 2, -1, -1)):
        roles = _roles(computed, exprs, bound_vars, var_dims, dict(out_maps), set(range(split)), n)
        if roles is not None:
            break
    if roles is None:
        raise Unfusable("no split of the loops into rows and columns fits every reduction")
    par, inner = tuple(range(split)), tuple(range(split, n))
    # read inside (``read``): by a computed op, directly or through the layout ops folded in
    for op in computed:
        if roles[op.name] is Role.COL_REDUCE and op.name in read:
            raise Unfusable(f"column reduction {op.name} is read inside the group")
    steps, buffered = _schedule([op.name for op in computed], exprs, roles, produced)
    scheme = _scheme(roles, steps)
    inputs = tuple(
        dict.fromkeys(
            n.tensor for op in computed for n in reads_of[op.name] if n.tensor not in produced
        )
    )
    return Layout(
        ops=tuple(op.name for op in computed),
        folded=frozenset(layouts),
        exprs=exprs,
        var_dims=var_dims,
        extents=anchor,
        par_dims=par,
        inner_dims=inner,
        roles=roles,
        steps=steps,
        buffered=buffered,
        inputs=inputs,
        outputs=outputs,
        scheme=scheme,
        out_dims=dict(out_maps),
    )


def _numel(shape: tuple[int | str, ...]) -> int:
    n = 1
    for s in shape:
        n *= s if isinstance(s, int) else 1
    return n


def _storage_rank(
    roots: list[tuple[str, str, int | str]],
    classes: Mapping[tuple[str, str, int | str], list[tuple[str, str, int | str]]],
    shapes: Mapping[str, tuple[int | str, ...]],
) -> list[tuple[float, int, int]]:
    """Order anchor dims as the tensors touching them store them, by bytes (outer first).

    A dim's place is the mean of its position from the right in each tensor holding it,
    weighted by the tensor's size: the innermost loop runs along the dim that most of the
    bytes keep contiguous (one transposed view among several plain arrays does not turn the
    loop nest). Ties: the largest tensor's order.
    """
    best: list[tuple[float, int, int]] = []
    for root in roots:
        placed = [
            (_numel(shapes[m[1].lstrip("@#")]), int(m[2]) - len(shapes[m[1].lstrip("@#")]))
            for m in classes[root] if m[0] == "t"
        ]  # fmt: skip
        if not placed:
            best.append((0.0, 0, 0))
            continue
        total = sum(n for n, _ in placed)
        mean = sum(n * pos for n, pos in placed) / total
        largest = min((-n, pos) for n, pos in placed)
        best.append((round(mean, 9), *largest))
    return best


def _roles(
    ops: list[Op],
    exprs: Mapping[str, Expr],
    bound_vars: Mapping[str, list[str]],
    var_dims: Mapping[str, Mapping[str, int | None]],
    out_maps: Mapping[str, tuple[int | None, ...]],
    par: set[int],
    n: int,
) -> dict[str, Role] | None:
    inner = set(range(n)) - par
    roles: dict[str, Role] = {}
    for op in ops:
        dims = var_dims[op.name]
        kept = {d for d in out_maps[op.name] if d is not None}
        bound = {dims[v] for v in bound_vars[op.name]} - {None}
        if not bound_vars[op.name]:
            if not par <= kept:
                return None
            roles[op.name] = Role.FULL if kept & inner else Role.ROW
        elif bound <= inner and not kept & inner and par <= kept:
            roles[op.name] = Role.ROW_REDUCE
        elif par <= bound and kept <= inner and _only_reductions(exprs[op.name]):
            roles[op.name] = Role.COL_REDUCE
        else:
            return None
    return roles


def _only_reductions(expr: Expr) -> bool:
    """Whether every read of ``expr`` sits inside a reduction (what a column reduction needs)."""
    if isinstance(expr, Access):
        return False
    if isinstance(expr, Reduce | Const):
        return True
    if isinstance(expr, Bin):
        return _only_reductions(expr.left) and _only_reductions(expr.right)
    if isinstance(expr, Call):
        return all(_only_reductions(a) for a in expr.args)
    return False


def _scheme(roles: Mapping[str, Role], steps: Sequence[Stage | RowStep]) -> Scheme:
    return (
        Scheme.GLOBAL if Role.COL_REDUCE in roles.values()
        else Scheme.REGIONAL if sum(isinstance(s, Stage) for s in steps) > 1
        else Scheme.LOCAL
    )  # fmt: skip


def _schedule(
    ops: Sequence[str],
    exprs: Mapping[str, Expr],
    roles: Mapping[str, Role],
    produced: Collection[str],
    online: Mapping[str, str] | None = None,
) -> tuple[tuple[Stage | RowStep, ...], frozenset[str]]:
    """Put each op in the earliest stage its inputs allow.

    A full op or reduction joins the stage of its latest full input, or the stage after a row
    reduction it reads; a row op runs before the first stage that may read it. A full value
    read by a later stage is recomputed there when it is cheap (at most
    :data:`RECOMPUTE_NODES` arithmetic nodes, no transcendental function: its inputs are re-read
    from cache, as Inductor's loops re-read them), else kept in a row buffer. A row buffer is a
    store and a load per element that the loop vectoriser must order against every other
    array of the loop, which makes a several-stage loop over many arrays run several times
    slower than the same loop re-reading its inputs.

    ``online``: row sums (sum -> max, :func:`online_pairs`) put in their max's stage; what
    their bodies read of the max's later stages is recomputed there from the running max.
    """
    online = online or {}
    level: dict[str, int] = {}
    for op in ops:
        if op in online:
            level[op] = level[online[op]]
            continue
        deps = [n.tensor for n in walk(exprs[op]) if isinstance(n, Access) and n.tensor in produced]
        need = [level[d] + (roles[d] is Role.ROW_REDUCE) for d in deps]
        level[op] = max(need, default=0)
    later = {
        n.tensor
        for op in ops if op not in online
        for n in walk(exprs[op])
        if isinstance(n, Access) and n.tensor in produced
        and roles[n.tensor] is Role.FULL and level[n.tensor] < level[op]
    }  # fmt: skip
    buffered: set[str] = set()
    cost: dict[str, int] = {}
    for op in ops:  # in order: a value's full inputs are decided before it
        if op not in later:
            continue
        nodes = _nodes(exprs[op]) + sum(
            cost[n.tensor]
            for n in walk(exprs[op])
            if isinstance(n, Access) and n.tensor in cost and n.tensor not in buffered
        )
        cost[op] = nodes
        if nodes > RECOMPUTE_NODES:
            buffered.add(op)
    steps: list[Stage | RowStep] = []
    for k in range(max(level.values(), default=-1) + 1):
        steps += [RowStep(op) for op in ops if roles[op] is Role.ROW and level[op] == k]
        stage = tuple(op for op in ops if roles[op] is not Role.ROW and level[op] == k)
        if stage:
            steps.append(Stage(stage))
    return tuple(steps), frozenset(buffered)


def _canonical_term(layout: Layout, op: str, t: IndexTerm) -> IndexTerm:
    """An index term over anchor dims (``d<k>``) instead of ``op``'s variables."""
    if isinstance(t, IVar):
        d = layout.var_dims[op].get(t.name)
        return IConst(0) if d is None else IVar(f"d{d}")
    if isinstance(t, IBin):
        left, right = _canonical_term(layout, op, t.left), _canonical_term(layout, op, t.right)
        return IBin(t.op, left, right)
    if isinstance(t, Access):
        return Access(t.tensor, tuple(_canonical_term(layout, op, i) for i in t.indices))
    return t


def _canonical(layout: Layout, op: str, e: Expr) -> Expr | None:
    """``e`` (of op ``op``) over anchor dims, the full values it reads inlined.

    Two ops' expressions of one value are then equal; ``None`` for what has no such form (a
    reduction over a size-1 dim).
    """
    if isinstance(e, Access):
        if layout.roles.get(e.tensor) is Role.FULL:
            return _canonical(layout, e.tensor, layout.exprs[e.tensor])
        return Access(e.tensor, tuple(_canonical_term(layout, op, t) for t in e.indices))
    if isinstance(e, Bin):
        left, right = _canonical(layout, op, e.left), _canonical(layout, op, e.right)
        return None if left is None or right is None else Bin(e.op, left, right)
    if isinstance(e, Call):
        args = [_canonical(layout, op, a) for a in e.args]
        return None if any(a is None for a in args) else Call(e.fn, tuple(args))  # type: ignore[arg-type]
    if isinstance(e, Reduce):
        dims = [layout.var_dims[op].get(v) for v in e.vars]
        body = _canonical(layout, op, e.body)
        if body is None or any(d is None for d in dims):
            return None
        return Reduce(e.op, tuple(f"d{d}" for d in dims), body)
    return e


def _row_reduce(layout: Layout, op: str, kind: ReduceOp) -> Reduce | None:
    """The one reduction of row reduction ``op`` when it is a ``kind`` over every inner dim."""
    if layout.roles.get(op) is not Role.ROW_REDUCE:
        return None
    reds = [n for n in walk(layout.exprs[op]) if isinstance(n, Reduce)]
    if len(reds) != 1 or reds[0].op is not kind:
        return None
    dims = {layout.var_dims[op].get(v) for v in reds[0].vars}
    return reds[0] if dims == set(layout.inner_dims) else None


def online_pairs(layout: Layout) -> dict[str, str]:
    r"""Row sums of ``exp(B - M)`` whose ``M`` is the row max of that same ``B``: sum -> max.

    Such a sum needs not wait for its max: swept once over the row in column blocks, with
    the max so far :math:`m` and the sum so far :math:`s` rescaled when the max grows,

    .. math::

        m' = \max(m, \max_{q \in blk} B_q), \qquad
        s' = s \, e^{m - m'} + \sum_{q \in blk} e^{B_q - m'},

    it ends at :math:`s = \sum_q e^{B_q - \max_q B_q}` (softmax's and logsumexp's
    normaliser: the online max/sum of Milakov and Gimelshein). The max must reduce ``B``
    exactly as the sum's exponent reads it, over the whole row.
    """
    pairs: dict[str, str] = {}
    for op in layout.ops:
        red = _row_reduce(layout, op, ReduceOp.SUM)
        body = None if red is None else _canonical(layout, op, red.body)
        if not (isinstance(body, Call) and body.fn == "exp" and isinstance(body.args[0], Bin)):
            continue
        diff = body.args[0]
        if diff.op != "-" or not isinstance(diff.right, Access):
            continue
        top = diff.right.tensor
        mx = _row_reduce(layout, top, ReduceOp.MAX)
        if mx is None or layout.exprs[top] != mx:  # the max itself, not a function of it
            continue
        if _canonical(layout, top, mx.body) == diff.left:
            pairs[op] = top
    return pairs


def online_softmax(layout: Layout) -> Layout:
    """``layout`` with every :func:`online_pairs` sum computed in its max's stage.

    What follows the sum moves up with it (a softmax's normalisation joins the stage that
    recomputes ``exp(B - M)``), and full values only the sums read leave the schedule (their
    expressions stay, recomputed in the sums' bodies): one sweep over the row fewer per pair.
    For a backend that sweeps long rows in column blocks; a layout without such a pair is
    returned as is.
    """
    pairs = online_pairs(layout)
    if not pairs:
        return layout
    # full values only the swept sums read (exp(B - M) itself) are computed in no stage
    readers: dict[str, set[str]] = {op: set() for op in layout.ops}
    for op in layout.ops:
        for n in walk(layout.exprs[op]):
            if isinstance(n, Access) and n.tensor in readers:
                readers[n.tensor].add(op)
    unused: set[str] = set()
    for op in reversed(layout.ops):
        if (layout.roles[op] is Role.FULL and op not in layout.outputs
                and readers[op] <= set(pairs) | unused):  # fmt: skip
            unused.add(op)
    ops = [op for op in layout.ops if op not in unused]
    steps, buffered = _schedule(ops, layout.exprs, layout.roles, layout.ops, pairs)
    return replace(layout, steps=steps, buffered=buffered, online=MappingProxyType(pairs),
                   scheme=_scheme(layout.roles, steps))  # fmt: skip
