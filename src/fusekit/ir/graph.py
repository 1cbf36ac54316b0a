"""The graph: a DAG of ops over declared tensors, with the algorithms the planners need.

Ops are named by the tensor they write, so "op ``y``" is the op producing tensor ``y``. A graph
keeps its ops in a topological order (ops given out of order are sorted; a cycle is an error
naming it). Graph inputs are user inputs (``inputs``) and weights or buffers (``params``).

Algorithms: producers and consumers, ancestors and descendants, subgraph extraction, the
convexity of an op set (no path leaves the set and comes back) and the cycle check of a
partition's quotient graph (the condition a fusion plan must meet).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

from fusekit.errors import expected
from fusekit.ir.expr import Access
from fusekit.ir.op import Op, OpKind, format_op
from fusekit.ir.printer import format_tensor
from fusekit.ir.tensor import Dim, Tensor


@dataclass(frozen=True, slots=True)
class Graph:
    """A DAG of ops.

    Attributes:
        tensors: every tensor: inputs, params and each op's output.
        ops: the ops, in a topological order.
        inputs: user inputs, in call order.
        params: weights and buffers, read like inputs but fixed.
        outputs: the tensors the graph returns.
        name: a label for printing.
    """

    tensors: tuple[Tensor, ...]
    ops: tuple[Op, ...]
    inputs: tuple[str, ...]
    params: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    name: str = "graph"
    _by_name: dict[str, Tensor] = field(init=False, repr=False, compare=False)
    _op_index: dict[str, int] = field(init=False, repr=False, compare=False)
    _consumers: dict[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)
    _shapes: dict[str, tuple[Dim, ...]] = field(init=False, repr=False, compare=False)
    _extents: dict[str, dict[str, Dim]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"graph {self.name}"
        by_name: dict[str, Tensor] = {}
        for tensor in self.tensors:
            if tensor.name in by_name:
                raise ValueError(expected(where, tensor.name, "declared once", "twice"))
            by_name[tensor.name] = tensor
        sources = [*self.inputs, *self.params]
        for name in [*sources, *(op.name for op in self.ops), *self.outputs]:
            if name not in by_name:
                raise ValueError(expected(where, name, "a declared tensor", "undeclared"))
        if len(set(sources)) != len(sources):
            raise ValueError(
                expected(where, "inputs", "distinct from each other and params", sources)
            )
        written: dict[str, Op] = {}
        for op in self.ops:
            if op.name in written or op.name in sources:
                raise ValueError(expected(where, op.name, "written once", "written twice"))
            written[op.name] = op
        shapes = {t.name: t.shape for t in self.tensors}
        extents: dict[str, dict[str, Dim]] = {}
        for op in self.ops:
            for name in op.inputs:
                if name not in written and name not in sources:
                    raise ValueError(
                        expected(
                            where,
                            name,
                            f"an input or an op's output (read by {op.name})",
                            "neither",
                        )
                    )
            extents[op.name] = op.extents(shapes)
        ops = _topological(self.ops, written, where)
        object.__setattr__(self, "tensors", tuple(self.tensors))
        object.__setattr__(self, "ops", ops)
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_op_index", {op.name: i for i, op in enumerate(ops)})
        object.__setattr__(self, "_shapes", shapes)
        object.__setattr__(self, "_extents", extents)
        consumers: dict[str, list[str]] = {name: [] for name in by_name}
        for op in ops:
            for name in op.inputs:
                consumers[name].append(op.name)
        object.__setattr__(self, "_consumers", {k: tuple(v) for k, v in consumers.items()})

    # -- lookups -------------------------------------------------------------------------------
    def tensor(self, name: str) -> Tensor:
        """The tensor called ``name``.

        Raises:
            KeyError: if there is none.
        """
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(expected(f"graph {self.name}", "tensor", "declared", name)) from None

    @property
    def shapes(self) -> Mapping[str, tuple[Dim, ...]]:
        """The shape of every tensor, by name (do not modify)."""
        return self._shapes

    def extents(self, name: str) -> Mapping[str, Dim]:
        """The extent of every index variable of op ``name`` (:meth:`Op.extents`; do not modify).

        Raises:
            KeyError: if no op writes ``name``.
        """
        try:
            return self._extents[name]
        except KeyError:
            raise KeyError(
                expected(f"graph {self.name}", "op", "the name of an op", name)
            ) from None

    def op(self, name: str) -> Op:
        """The op writing tensor ``name``.

        Raises:
            KeyError: if no op writes it.
        """
        if name not in self._op_index:
            raise KeyError(expected(f"graph {self.name}", "op", "the name of an op", name))
        return self.ops[self._op_index[name]]

    def in_order(self, names: Collection[str]) -> list[Op]:
        """The ops of ``names`` (op names) in the graph's order; unknown names are left out.

        Costs the group's size, not the graph's (a planner asks for thousands of groups).
        """
        index = self._op_index
        return [self.ops[i] for i in sorted(index[n] for n in names if n in index)]

    def is_cast(self, name: str) -> bool:
        """Whether op ``name`` is a read of another dtype (``x.to(torch.bfloat16)``)."""
        expr = self.op(name).expr
        return (
            isinstance(expr, Access) and self.tensor(expr.tensor).dtype != self.tensor(name).dtype
        )

    def moves_only(self, name: str) -> bool:
        """Whether op ``name`` only moves elements.

        A layout op (:attr:`Op.is_layout`) that is not a cast, which converts every element.
        """
        return self.op(name).is_layout and not self.is_cast(name)

    def producer(self, tensor: str) -> Op | None:
        """The op writing ``tensor``, or ``None`` for an input or param."""
        self.tensor(tensor)
        index = self._op_index.get(tensor)
        return None if index is None else self.ops[index]

    def consumers(self, tensor: str) -> tuple[Op, ...]:
        """The ops reading ``tensor``, in topological order."""
        self.tensor(tensor)
        return tuple(self.op(name) for name in self._consumers[tensor])

    def predecessors(self, op: str) -> tuple[str, ...]:
        """The ops whose outputs op ``op`` reads."""
        return tuple(n for n in self.op(op).inputs if n in self._op_index)

    def successors(self, op: str) -> tuple[str, ...]:
        """The ops reading op ``op``'s output."""
        self.op(op)
        return self._consumers[op]

    def topological_order(self) -> tuple[str, ...]:
        """Op names, each after every op it reads from."""
        return tuple(op.name for op in self.ops)

    def kinds(self) -> Counter[OpKind]:
        """How many ops of each kind the graph has."""
        return Counter(op.kind for op in self.ops)

    # -- reachability --------------------------------------------------------------------------
    def ancestors(self, ops: Iterable[str]) -> set[str]:
        """Ops with a path to some op of ``ops`` (the ops themselves excluded unless on a path)."""
        return self._reach(ops, self.predecessors)

    def descendants(self, ops: Iterable[str]) -> set[str]:
        """Ops reachable from some op of ``ops`` (the ops themselves excluded unless on a path)."""
        return self._reach(ops, self.successors)

    @staticmethod
    def _reach(ops: Iterable[str], step: Callable[[str], Iterable[str]]) -> set[str]:
        seen: set[str] = set()
        stack = [n for op in ops for n in step(op)]
        while stack:
            name = stack.pop()
            if name not in seen:
                seen.add(name)
                stack.extend(step(name))
        return seen

    def is_convex(self, ops: Collection[str]) -> bool:
        """Whether no path leaves ``ops`` and comes back into it.

        A convex op set can become one kernel: nothing outside it needs part of its results
        before the rest can run.

        Raises:
            KeyError: if a name is not an op.
        """
        group = set(self._check_ops(ops))
        outside = {s for op in group for s in self.successors(op)} - group
        return not ((self.descendants(outside) | outside) & group)

    def subgraph(self, ops: Collection[str], name: str | None = None) -> Graph:
        """The graph of ``ops`` alone.

        Its inputs are the tensors the ops read but do not write (params of this graph stay
        params); its outputs are the tensors they write that are read outside or returned.

        Raises:
            KeyError: if a name is not an op.
            ValueError: if the set is not convex (its outputs would feed its own inputs).
        """
        group = set(self._check_ops(ops))
        if not self.is_convex(group):
            raise ValueError(expected(f"graph {self.name}", "ops", "a convex set", sorted(group)))
        chosen = tuple(op for op in self.ops if op.name in group)
        reads = dict.fromkeys(n for op in chosen for n in op.inputs if n not in group)
        params = tuple(n for n in reads if n in self.params)
        inputs = tuple(n for n in reads if n not in self.params)
        outputs = tuple(
            op.name
            for op in chosen
            if op.name in self.outputs or set(self._consumers[op.name]) - group
        )
        tensors = tuple(self.tensor(n) for n in (*inputs, *params, *(op.name for op in chosen)))
        return Graph(tensors, chosen, inputs, params, outputs, name or f"{self.name}_sub")

    def find_quotient_cycle(
        self, groups: Iterable[Collection[str]]
    ) -> tuple[frozenset[str], ...] | None:
        """Check that contracting each group to one node leaves a DAG.

        Ops in no group are groups of their own. A fusion plan is legal only when this quotient
        graph has no cycle (every group can run as one kernel, after the groups it reads).

        Args:
            groups: disjoint sets of op names.

        Returns:
            ``None`` for an acyclic quotient graph, else the groups along one cycle, in order.

        Raises:
            KeyError: if a name is not an op.
            ValueError: if two groups share an op.
        """
        owner: dict[str, int] = {}
        members: list[frozenset[str]] = []
        for group in groups:
            ids = frozenset(self._check_ops(group))
            for name in ids:
                if name in owner:
                    raise ValueError(expected(f"graph {self.name}", "groups", "disjoint", name))
                owner[name] = len(members)
            members.append(ids)
        for op in self.ops:
            if op.name not in owner:
                owner[op.name] = len(members)
                members.append(frozenset({op.name}))
        edges: list[set[int]] = [set() for _ in members]
        for op in self.ops:
            for pred in self.predecessors(op.name):
                if owner[pred] != owner[op.name]:
                    edges[owner[pred]].add(owner[op.name])
        cycle = _find_cycle(edges)
        return None if cycle is None else tuple(members[i] for i in cycle)

    def _check_ops(self, ops: Iterable[str]) -> list[str]:
        names = list(ops)
        for name in names:
            self.op(name)
        return names

    def __str__(self) -> str:
        return format_graph(self)


def format_graph(graph: Graph) -> str:
    """Print a graph as declarations and op lines that :func:`fusekit.ir.text.parse_graph` reads."""
    lines = [f"graph {graph.name}"]
    lines += [f"input {format_tensor(graph.tensor(n))}" for n in graph.inputs]
    lines += [f"param {format_tensor(graph.tensor(n))}" for n in graph.params]
    for op in graph.ops:
        lines += [f"tensor {format_tensor(graph.tensor(op.name))}", format_op(op)]
    lines.append("output " + ", ".join(graph.outputs))
    return "\n".join(lines) + "\n"


def _topological(ops: tuple[Op, ...], written: dict[str, Op], where: str) -> tuple[Op, ...]:
    """Order ``ops`` so each follows the ops it reads, keeping the given order where possible."""
    position = {op.name: i for i, op in enumerate(ops)}
    edges: list[set[int]] = [set() for _ in ops]
    for i, op in enumerate(ops):
        for name in op.inputs:
            if name in written:
                edges[position[name]].add(i)
    cycle = _find_cycle(edges)
    if cycle is not None:
        path = " -> ".join(ops[i].name for i in (*cycle, cycle[0]))
        raise ValueError(expected(where, "ops", "acyclic", f"cycle {path}"))
    indegree = [0] * len(ops)
    for targets in edges:
        for t in targets:
            indegree[t] += 1
    ready = [i for i, d in enumerate(indegree) if d == 0]
    order: list[int] = []
    while ready:
        ready.sort(reverse=True)
        i = ready.pop()
        order.append(i)
        for t in edges[i]:
            indegree[t] -= 1
            if indegree[t] == 0:
                ready.append(t)
    return tuple(ops[i] for i in order)


def _find_cycle(edges: list[set[int]]) -> list[int] | None:
    """One cycle of a directed graph given as adjacency sets, or ``None`` (iterative DFS)."""
    color = [0] * len(edges)  # 0 new, 1 on the stack, 2 done
    parent = [-1] * len(edges)
    for root in range(len(edges)):
        if color[root]:
            continue
        stack = [(root, iter(sorted(edges[root])))]
        color[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                color[node] = 2
                stack.pop()
            elif color[nxt] == 1:
                cycle = [node]
                while cycle[-1] != nxt:
                    cycle.append(parent[cycle[-1]])
                return cycle[::-1]
            elif color[nxt] == 0:
                color[nxt] = 1
                parent[nxt] = node
                stack.append((nxt, iter(sorted(edges[nxt]))))
    return None
