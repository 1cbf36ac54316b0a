r"""SAM dataflow graphs as Graphviz text: a tokenizer-based reader and a writer.

The files SAM's compiler prints use a small subset of the DOT language::

    digraph SAM {
        comment="X=ss01,B=ss01,C=ss01"
        <id> [comment="type=fiberlookup,index=i,..." label="..." type="fiberlookup" index="i" ...]
        <a> -> <b> [label="crd_in-B" style=dashed type="crd" comment="in-B"]
    }

Line 2 is the graph comment: every tensor as ``name=format``, the output first. A node's SAM
attributes appear twice, typed (``index="i"``) and packed into ``comment="type=...,k=v"``; the
reader merges both (the comment wins a disagreement, since SAM's own tools read it). ``label``,
``color``, ``shape`` and ``style`` only draw and are dropped. Quoted strings may hold literal line
breaks and the two-character escape ``\n`` (kept as it is); ``\"`` is a quote. A node may be
declared twice: the declarations merge, as in DOT.

:func:`write_gv` prints a :class:`SamGraph` in the same convention, so that
``parse_gv(write_gv(g)) == g``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from fusekit.errors import FusekitError
from fusekit.files import read_text

#: Attributes that only draw; the reader drops them and the writer makes its own.
DRAWING = frozenset({"label", "color", "shape", "style", "comment"})


class SamGraphError(FusekitError, ValueError):
    """A SAM graph that cannot be read or run: one line naming the file and the node.

    Attributes:
        source: the file (or ``"<graph>"``).
        node: the node id the problem is at, or ``None``.
    """

    def __init__(self, source: str, problem: str, node: int | None = None) -> None:
        self.source = source
        self.node = node
        self.problem = problem
        where = f"{source}: node {node}" if node is not None else source
        super().__init__(f"{where}: {problem}")


@dataclass(frozen=True, slots=True)
class SamNode:
    """One block of a SAM graph.

    Attributes:
        id: the node id (unique in its graph).
        type: the block kind (``fiberlookup``, ``intersect``, ...).
        attrs: the other SAM attributes (``index``, ``tensor``, ``mode``, ...), as strings.
    """

    id: int
    type: str
    attrs: dict[str, str] = field(default_factory=dict)

    def get(self, key: str, default: str = "") -> str:
        """Attribute ``key`` or ``default``."""
        return self.attrs.get(key, default)


@dataclass(frozen=True, slots=True)
class SamEdge:
    """A stream between two blocks.

    Attributes:
        src: producing node id.
        dst: consuming node id.
        type: stream kind: ``crd``, ``ref``, ``val`` or ``repsig``.
        comment: the port name on whichever end has several ports of that kind (or ``""``).
    """

    src: int
    dst: int
    type: str
    comment: str = ""


@dataclass(frozen=True, slots=True)
class SamGraph:
    """A SAM graph.

    Attributes:
        formats: every tensor's format (``s``/``d`` letters then mode digits, or ``none``),
            output first, as the graph comment lists them.
        nodes: the blocks by id.
        edges: the streams, in file order.
        source: where the graph was read from (for error messages; not compared).
    """

    formats: dict[str, str]
    nodes: dict[int, SamNode]
    edges: tuple[SamEdge, ...]
    source: str = field(default="<graph>", compare=False)

    @property
    def output(self) -> str:
        """The output tensor's name (the first in the graph comment)."""
        return next(iter(self.formats))


# --- tokenizer ---------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""(?P<ws>\s+|//[^\n]*|/\*.*?\*/)
      | (?P<str>"(?:[^"\\]|\\.)*")
      | (?P<arrow>->)
      | (?P<id>(?:[A-Za-z0-9_.+]|-(?!>))+)
      | (?P<sym>[{}\[\]=,;])""",
    re.VERBOSE | re.DOTALL,
)


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str  # str, id, arrow, sym, end
    text: str
    line: int


def _tokenize(text: str, source: str) -> list[_Tok]:
    out: list[_Tok] = []
    pos, line = 0, 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise SamGraphError(source, f"line {line}: unexpected character {text[pos]!r}")
        kind = m.lastgroup or "ws"
        chunk = m.group()
        if kind == "str":
            out.append(_Tok("str", re.sub(r'\\"', '"', chunk[1:-1]), line))
        elif kind != "ws":
            out.append(_Tok(kind, chunk, line))
        line += chunk.count("\n")
        pos = m.end()
    out.append(_Tok("end", "", line))
    return out


class _Parser:
    """Recursive descent over the token list (one graph, statements, attribute lists)."""

    def __init__(self, toks: list[_Tok], source: str) -> None:
        self.toks = toks
        self.k = 0
        self.source = source
        self.node: int | None = None  # the statement being read starts with this node id

    def peek(self) -> _Tok:
        return self.toks[self.k]

    def next(self) -> _Tok:
        tok = self.toks[self.k]
        self.k += 1
        return tok

    def fail(self, what: str, tok: _Tok | None = None) -> SamGraphError:
        tok = tok or self.peek()
        got = "end of file" if tok.kind == "end" else repr(tok.text)
        return SamGraphError(
            self.source, f"line {tok.line}: expected {what} (got {got})", self.node
        )

    def expect(self, text: str) -> None:
        tok = self.next()
        if tok.text != text or tok.kind == "str":
            raise self.fail(repr(text), tok)

    def value(self) -> str:
        tok = self.next()
        if tok.kind not in ("str", "id"):
            raise self.fail("a name or a quoted string", tok)
        return tok.text

    def attrs(self) -> dict[str, str]:
        self.expect("[")
        out: dict[str, str] = {}
        while self.peek().text != "]" or self.peek().kind == "str":
            key = self.value()
            self.expect("=")
            out[key] = self.value()
            if self.peek().text in (",", ";") and self.peek().kind == "sym":
                self.next()
            if self.peek().kind == "end":
                raise self.fail("']'")
        self.next()
        return out

    def graph(self) -> tuple[dict[str, str], list[tuple[int, dict[str, str], int]], list[_RawEdge]]:
        head = self.next()
        if head.text == "strict":
            head = self.next()
        if head.text != "digraph":
            raise self.fail("'digraph'", head)
        if self.peek().kind in ("id", "str"):
            self.next()
        self.expect("{")
        gattrs: dict[str, str] = {}
        nodes: list[tuple[int, dict[str, str], int]] = []
        edges: list[_RawEdge] = []
        while True:
            tok = self.peek()
            if tok.kind == "sym" and tok.text == "}":
                self.next()
                break
            if tok.kind == "sym" and tok.text == ";":
                self.next()
                continue
            if tok.kind == "end":
                raise self.fail("'}'")
            name = self.value()
            self.node = int(name) if name.isdigit() else None
            if name in ("graph", "node", "edge") and self.peek().text == "[":
                raise self.fail(
                    f"a node, an edge or 'key=value' (default {name} attributes "
                    "are outside the SAM subset)",
                    tok,
                )
            if self.peek().kind == "sym" and self.peek().text == "=":
                self.next()
                gattrs[name] = self.value()
            elif self.peek().kind == "arrow":
                self.next()
                dst = self.value()
                a = self.attrs() if self.peek().text == "[" else {}
                edges.append(
                    _RawEdge(self._id(src_tok := tok, name), self._id(src_tok, dst), a, tok.line)
                )
            else:
                a = self.attrs() if self.peek().text == "[" else {}
                nodes.append((self._id(tok, name), a, tok.line))
        if self.peek().kind != "end":
            raise self.fail("end of file after '}'")
        return gattrs, nodes, edges

    def _id(self, tok: _Tok, name: str) -> int:
        if not name.isdigit():
            raise SamGraphError(
                self.source, f"line {tok.line}: expected an integer node id (got {name!r})"
            )
        return int(name)


@dataclass(frozen=True, slots=True)
class _RawEdge:
    src: int
    dst: int
    attrs: dict[str, str]
    line: int


# --- from text to a SamGraph -------------------------------------------------------------------


def parse_comment(text: str) -> dict[str, str]:
    """``"type=mul,sub=1"`` -> ``{"type": "mul", "sub": "1"}`` (empty items are skipped)."""
    out: dict[str, str] = {}
    for item in text.split(","):
        item = item.strip()
        if item:
            key, _, val = item.partition("=")
            out[key.strip()] = val.strip()
    return out


def parse_formats(text: str, source: str = "<graph>") -> dict[str, str]:
    """The graph comment ``"x=s0,b=none"`` as ``{"x": "s0", "b": "none"}``.

    Raises:
        SamGraphError: for an item that is not ``name=format`` or a malformed format.
    """
    out: dict[str, str] = {}
    for item in text.split(","):
        name, eq, fmt = (s.strip() for s in item.partition("="))
        if not eq or not name or not _valid_format(fmt):
            raise SamGraphError(
                source,
                f"graph comment: expected 'name=format' items such as 'B=ss01' or "
                f"'b=none' (got {item.strip()!r})",
            )
        out[name] = fmt
    return out


def _valid_format(fmt: str) -> bool:
    if fmt == "none":
        return True
    m = re.fullmatch(r"([sd]+)(\d+)", fmt)
    return (
        m is not None
        and len(m.group(1)) == len(m.group(2))
        and sorted(m.group(2)) == [str(k) for k in range(len(m.group(2)))]
    )


def parse_gv(text: str, source: str = "<graph>") -> SamGraph:
    """Read a SAM graph from Graphviz text.

    Args:
        text: the file's contents.
        source: a name for error messages (the file path).

    Returns:
        The graph: formats from the graph comment, nodes with merged attributes, edges in order.

    Raises:
        SamGraphError: on a syntax error (with the line), a node without a ``type``, an edge to
            an undeclared node or without a ``type``, or a missing or malformed graph comment.
    """
    gattrs, raw_nodes, raw_edges = _Parser(_tokenize(text, source), source).graph()
    if "comment" not in gattrs:
        raise SamGraphError(
            source, 'expected a graph comment listing the tensor formats (comment="x=s0,...")'
        )
    formats = parse_formats(gattrs["comment"], source)
    merged: dict[int, dict[str, str]] = {}
    for nid, a, _ in raw_nodes:
        attrs = {k: v for k, v in a.items() if k not in DRAWING}
        attrs.update(parse_comment(a.get("comment", "")))
        merged.setdefault(nid, {}).update(attrs)
    nodes: dict[int, SamNode] = {}
    for nid, attrs in merged.items():
        kind = attrs.pop("type", "")
        if not kind:
            raise SamGraphError(source, "expected a 'type' attribute", nid)
        nodes[nid] = SamNode(nid, kind, attrs)
    edges: list[SamEdge] = []
    for e in raw_edges:
        for end in (e.src, e.dst):
            if end not in nodes:
                raise SamGraphError(
                    source, f"line {e.line}: edge {e.src} -> {e.dst} names an undeclared node", end
                )
        if not e.attrs.get("type"):
            raise SamGraphError(
                source,
                f"line {e.line}: expected edge {e.src} -> {e.dst} to "
                "have a 'type' (crd, ref, val or repsig)",
                e.dst,
            )
        edges.append(SamEdge(e.src, e.dst, e.attrs["type"], e.attrs.get("comment", "")))
    return SamGraph(formats, nodes, tuple(edges), source)


def read_gv(path: str | Path) -> SamGraph:
    """Read a SAM graph file (see :func:`parse_gv`).

    Raises:
        ConfigError: the file is unreadable, too large or not UTF-8 (one line naming it).
        SamGraphError: the graph is malformed.
    """
    return parse_gv(read_text(path), str(path))


# --- writer ------------------------------------------------------------------------------------

_COLORS = {
    "fiberlookup": "green4",
    "fiberwrite": "green3",
    "arrayvals": "green2",
    "intersect": "purple",
    "union": "purple",
    "repsiggen": "cyan3",
    "repeat": "cyan2",
    "crddrop": "orange",
    "crdhold": "orange",
}
_EDGE_STYLE = {"crd": "dashed", "ref": "bold", "repsig": "dotted"}


def _quote(text: str) -> str:
    return '"' + text.replace('"', '\\"') + '"'


def _label(node: SamNode) -> str:
    bits = [node.type] + [
        f"{k}={v}" for k, v in node.attrs.items() if k in ("index", "tensor", "mode", "op")
    ]
    return " ".join(bits)


def write_gv(graph: SamGraph, name: str = "SAM") -> str:
    """Print ``graph`` in SAM's Graphviz convention.

    The graph comment is line 2; each node carries ``comment="type=...,k=v"`` and the same
    attributes typed, plus a label for drawing; each edge its ``type`` and ``comment``.

    Returns:
        The text; :func:`parse_gv` reads it back to an equal graph.
    """
    lines = [
        f"digraph {name} {{",
        "    comment=" + _quote(",".join(f"{t}={f}" for t, f in graph.formats.items())),
    ]
    for node in graph.nodes.values():
        packed = ",".join(
            [f"type={node.type}"]
            + [f"{k}={v}" for k, v in node.attrs.items() if not set(v) & set(",=")]
        )
        typed = " ".join(f"{k}={_quote(v)}" for k, v in [("type", node.type), *node.attrs.items()])
        style = (
            "shape=point style=invis"
            if node.type == "broadcast"
            else f"color={_COLORS.get(node.type, 'brown')} shape=box style=filled"
        )
        lines.append(
            f"    {node.id} [comment={_quote(packed)} label={_quote(_label(node))} {style} {typed}]"
        )
    for e in graph.edges:
        label = e.type + (f"_{e.comment}" if e.comment else "")
        style = f" style={_EDGE_STYLE[e.type]}" if e.type in _EDGE_STYLE else ""
        lines.append(
            f"    {e.src} -> {e.dst} [label={_quote(label)}{style} "
            f"type={_quote(e.type)} comment={_quote(e.comment)}]"
        )
    lines.append("}")
    return "\n".join(lines) + "\n"
