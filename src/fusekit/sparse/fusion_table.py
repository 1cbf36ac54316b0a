"""Fusion tables: one fused region as a table of index variables by tensor views (FuseFlow §4).

Building a region's table:

1. **Unify index variables.** The root statement keeps its names; a producer's output
   variables take the names its consumer reads them with (``XW1[l,n]`` read as ``XW1[k,j]``
   becomes ``k, j``) and its reduced variables get fresh names.
2. **Order.** Rows are the unified variables in the region's dataflow order: the root's order,
   each producer's own variables inserted after its consumer's context depth (factored
   iteration: a producer's reduction runs inside the consumer only as deep as it must), then a
   value row.
3. **Cells.** Each column is one tensor view (an operand of one statement, or a statement's
   output); each cell names the primitive that produces that view at that level: ``scan`` (a
   compressed level), ``iter`` (a dense level walked), ``locate`` (a dense level indexed by a
   coordinate), ``repeat``, ``intersect``/``union`` where several views meet, ``array`` (value
   read), ``alu``, ``reduce``/``spacc``, ``write``; a view of a tensor produced inside the region
   points at its producer's stream (``-> XW1``) instead of reading memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusekit.sparse.formats import SparseTensor, restore
from fusekit.sparse.program import Program, Statement
from fusekit.sparse.schedule import Schedule


def context_depth(consumer_order: tuple[str, ...], access_vars: tuple[str, ...]) -> int:
    """The depth of a consumer's loop nest at which a fused producer is replayed.

    With the producer's output read as ``T[access_vars]``, the producer streams ``T``'s
    sub-tensor once per consumer point at depth ``d``: the first access variable is bound and
    every variable of the consumer that is not an access variable but comes before the last
    access variable is bound too (it changes the stream the consumer expects, so the producer
    must be replayed for it). Factored iteration: variables after the last access variable
    never replay the producer.
    """
    pos = [consumer_order.index(v) for v in access_vars]
    first, last = min(pos), max(pos)
    foreign = [p for p in range(last) if consumer_order[p] not in access_vars]
    return max(first + 1, max(foreign, default=-1) + 1)


def bound_prefix(
    consumer_order: tuple[str, ...], access_vars: tuple[str, ...], producer_out: tuple[str, ...]
) -> tuple[str, ...]:
    """The producer's output variables bound by the consumer's context, in consumer order."""
    d = context_depth(consumer_order, access_vars)
    rename = dict(zip(access_vars, producer_out, strict=True))
    return tuple(rename[v] for v in consumer_order[:d] if v in rename)


def fusion_legal(
    consumer_order: tuple[str, ...],
    access_vars: tuple[str, ...],
    producer: Statement,
    producer_order: tuple[str, ...],
) -> bool:
    """Whether a producer's order can feed its consumer's order without a buffer.

    The producer's order must start with the context's bound variables, and it must emit its
    output variables in the order the consumer reads them.
    """
    prefix = bound_prefix(consumer_order, access_vars, producer.out_vars)
    if producer_order[: len(prefix)] != prefix:
        return False
    rename = dict(zip(access_vars, producer.out_vars, strict=True))
    wanted = [rename[v] for v in consumer_order if v in rename]
    emitted = [v for v in producer_order if v in producer.out_vars]
    return wanted == emitted


def fork_granularity(
    producer: Statement,
    producer_order: tuple[str, ...],
    consumers: list[tuple[Statement, tuple[str, ...]]],
) -> int:
    """How many leading variables of a producer's order a forked stream must buffer under.

    A consumer's values are final once it has seen one binding of the leading producer
    variables that are its own output variables (a reduction consumer finishes a row when its
    reduced variables are exhausted); the consumer that waits for another's result buffers the
    producer's output for one binding of the coarsest such prefix.
    """
    depth = len(producer_order)
    for cons, access in consumers:
        rename = dict(zip(producer.out_vars, access, strict=True))
        g = 0
        for v in producer_order:
            if v not in rename or rename[v] not in cons.out_vars:
                break
            g += 1
        depth = min(depth, g)
    return depth


@dataclass(frozen=True, slots=True)
class FusionTable:
    """A region's fusion table.

    Attributes:
        rows: the unified index variables in dataflow order, then ``"value"``.
        columns: the tensor views, ``"<statement>:<tensor>"``.
        cells: ``cells[r][c]``, empty where the view has no primitive at that row.
    """

    rows: tuple[str, ...]
    columns: tuple[str, ...]
    cells: tuple[tuple[str, ...], ...]

    def format(self, width: int | None = None) -> str:
        """The table as aligned text.

        Args:
            width: the most characters per line: a wider table is printed as blocks of
                columns, one under the other, each with the row names (None: one block).
        """
        widths = [max(len(c), *(len(r[k]) for r in self.cells)) for k, c in enumerate(self.columns)]
        blocks: list[list[int]] = [[]]
        used = 8
        for k, w in enumerate(widths):
            if blocks[-1] and width is not None and used + 2 + w > width:
                blocks.append([])
                used = 8
            used += w + (2 if blocks[-1] else 0)
            blocks[-1].append(k)
        parts = []
        for block in blocks:
            lines = [" " * 8 + "  ".join(self.columns[k].ljust(widths[k]) for k in block)]
            for name, row in zip(self.rows, self.cells, strict=True):
                lines.append(f"{name:<8}" + "  ".join(row[k].ljust(widths[k]) for k in block))
            parts.append("\n".join(line.rstrip() if width is not None else line for line in lines))
        return "\n\n".join(parts)


def unify(
    program: Program, region: tuple[str, ...], orders: dict[str, tuple[str, ...]]
) -> tuple[dict[str, dict[str, str]], list[str]]:
    """Rename every statement's variables into the region's unified names.

    Returns:
        Per statement, a map from its variable names to unified names; and the unified
        variables in dataflow order.
    """
    sts = [st for st in program.statements if st.out in region]
    rename: dict[str, dict[str, str]] = {}
    rows: list[str] = []
    used: set[str] = set()

    def fresh(v: str) -> str:
        name, k = v, 1
        while name in used:
            name, k = f"{v}{k}", k + 1
        used.add(name)
        return name

    for st in reversed(sts):
        consumer = next(
            ((c, o) for c in reversed(sts) for o in c.operands if o.tensor == st.out), None
        )
        if consumer is None:
            rename[st.out] = {v: fresh(v) for v in st.vars}
            rows.extend(rename[st.out][v] for v in orders[st.out])
            continue
        c, access = consumer
        mapping = {v: rename[c.out][a] for v, a in zip(st.out_vars, access.vars, strict=True)}
        mapping.update({v: fresh(v) for v in st.vars if v not in mapping})
        rename[st.out] = mapping
        d = context_depth(orders[c.out], access.vars)
        anchor = rename[c.out][orders[c.out][d - 1]]
        cursor = rows.index(anchor) + 1
        for v in orders[st.out]:  # the producer's new variables, in its order, after its context
            if mapping[v] in rows:
                cursor = max(cursor, rows.index(mapping[v]) + 1)
            else:
                rows.insert(cursor, mapping[v])
                cursor += 1
    return rename, rows


def fusion_table(program: Program, schedule: Schedule, region: int = 0) -> FusionTable:
    """Build the fusion table of one region of a schedule."""
    names = schedule.regions[region]
    orders = dict(schedule.orders)
    sts: list[Statement] = [st for st in program.statements if st.out in names]
    rename, rows = unify(program, names, orders)
    storage = {(s, t): o for s, t, o in schedule.storage}

    def stored(st: Statement, tensor: str) -> SparseTensor | None:
        t = program.inputs.get(tensor)
        if t is not None and (st.out, tensor) in storage:
            return restore(t, storage[(st.out, tensor)])
        return t

    columns: list[str] = []
    cols: list[list[str]] = []
    for st in sts:
        r = rename[st.out]
        sparse_vars: dict[str, int] = {}
        for o in st.operands:
            t = stored(st, o.tensor)
            if t is not None and not t.is_dense:
                for lvl, d in enumerate(t.order):
                    if t.levels[lvl].kind.value != "dense":
                        sparse_vars[o.vars[d]] = sparse_vars.get(o.vars[d], 0) + 1
        for o in st.operands:
            col = [""] * (len(rows) + 1)
            t = stored(st, o.tensor)
            for v in st.vars:
                at = rows.index(r[v])
                if o.tensor in names:
                    col[at] = f"-> {o.tensor}" if v in o.vars else "repeat"
                elif v not in o.vars:
                    col[at] = "repeat"
                elif (
                    t is not None
                    and not t.is_dense
                    and t.levels[t.order.index(o.vars.index(v))].kind.value != "dense"
                ):
                    col[at] = "scan" + (
                        " & intersect" if sparse_vars.get(v, 0) > 1 and st.combine == "mul" else ""
                    )
                    col[at] += (
                        " & union" if sparse_vars.get(v, 0) > 1 and st.combine != "mul" else ""
                    )
                else:
                    col[at] = "locate" if sparse_vars.get(v) else "iter"
            col[-1] = f"-> {o.tensor}" if o.tensor in names else "array"
            columns.append(f"{st.out}:{o.tensor}")
            cols.append(col)
        out = [""] * (len(rows) + 1)
        for v in st.out_vars:
            out[rows.index(r[v])] = (
                "write" if st.out not in {o.tensor for c in sts for o in c.operands} else "stream"
            )
        trailing = (
            all(
                orders[st.out].index(v) > max(orders[st.out].index(u) for u in st.out_vars)
                for v in st.reduce_vars
            )
            if st.out_vars
            else True
        )
        value = f"alu {st.combine}" if st.combine != "copy" else "copy"
        if st.reduce_vars:
            value += f", {'reduce' if trailing else 'spacc'} {st.reduce}"
        if st.epilogue:
            value += f", {st.epilogue}"
        out[-1] = value
        columns.append(f"{st.out}:out")
        cols.append(out)
    cells = tuple(tuple(col[k] for col in cols) for k in range(len(rows) + 1))
    return FusionTable((*rows, "value"), tuple(columns), cells)
