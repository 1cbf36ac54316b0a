"""The compact text form of ops and graphs, and its parser.

An op is one line (see :mod:`fusekit.ir.op` for the semantics)::

    Y[i,j] = sum_k A[i,k] * B[k,j]
    Y[i,j] = exp(S[i,j] - max_j S[i,j])
    Y[d[e],m] += X[g[e],k] * W[s[e],k,m]
    Y[i,j] = X[i/16, i%16, j]
    Y = opaque aten.topk.default(X, 4, dtype=torch.float32)[1]

Precedence, loosest first: ``+ -``; ``* /``; unary ``-``; a reduction ``sum_k``/``sum_{k,l}``
binds the product that follows it (``sum_k A * B + C`` is ``(sum_k A * B) + C``). A 0-d tensor is
written bare (``Y``) in values and ``n[]`` inside an index. A graph is declarations and op lines::

    graph mlp
    input x: float32[B,64]
    param w: float32[64,32]
    param adj: float32[6,6] {dense,compressed} nnz=7
    tensor y: float32[B,32]
    y[i,j] = sum_k x[i,k] * w[k,j]
    output y

The printers, :func:`fusekit.ir.op.format_op` and :func:`fusekit.ir.graph.format_graph` (on
:mod:`fusekit.ir.printer`), write what :func:`parse_op` and :func:`parse_graph` read back equal.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from fusekit.errors import FusekitError
from fusekit.ir.expr import (
    FUNCTIONS,
    Access,
    Bin,
    Call,
    Const,
    DTypeRef,
    Expr,
    IBin,
    IConst,
    IndexTerm,
    IVar,
    Opaque,
    OpaqueArg,
    Reduce,
    ReduceOp,
    TensorRef,
)
from fusekit.ir.graph import Graph
from fusekit.ir.op import Op
from fusekit.ir.tensor import Dim, Format, Level, Tensor, TensorStats

_T = TypeVar("_T")


class ParseError(FusekitError, ValueError):
    """A malformed text form; ``position`` is the 0-based column, ``line`` the 1-based line."""

    def __init__(self, problem: str, text: str, position: int, line: int | None = None) -> None:
        self.problem = problem
        self.text = text
        self.position = position
        self.line = line
        where = f"column {position + 1}" + (f" of line {line}" if line is not None else "")
        super().__init__(f"ir text: {problem} at {where}: {text!r}")


_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\.\d+(?:[eE][+-]?\d+)?|\d+)"
    r"|(?P<str>\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*')"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op>\+=|[-+*/%()\[\]{},=:.])"
    r"|(?P<comment>#.*))"
)
_REDUCE = re.compile(r"(sum|max|min|prod|mean)_(.*)\Z", re.S)


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str  # num, str, name, op, end
    text: str
    pos: int


def _lex(text: str, line: int | None) -> list[_Tok]:
    toks: list[_Tok] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.lastgroup is None:
            start = len(text) - len(text[pos:].lstrip())
            raise ParseError(f"unexpected character {text[start]!r}", text, start, line)
        if m.lastgroup == "comment":
            break
        toks.append(_Tok(m.lastgroup, m.group(m.lastgroup), m.start(m.lastgroup)))
        pos = m.end()
    toks.append(_Tok("end", "", len(text)))
    return toks


class _Parser:
    def __init__(self, text: str, line: int | None = None) -> None:
        self.text = text
        self.line = line
        self.toks = _lex(text, line)
        self.i = 0

    # -- token helpers -------------------------------------------------------------------------
    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def error(self, problem: str, tok: _Tok | None = None) -> ParseError:
        tok = tok or self.tok
        return ParseError(problem, self.text, tok.pos, self.line)

    def expect(self, text: str) -> _Tok:
        tok = self.tok
        if tok.text != text or tok.kind not in ("op", "name"):
            raise self.error(f"expected {text!r} (got {tok.text or 'end of text'!r})")
        self.i += 1
        return tok

    def accept(self, text: str) -> bool:
        if self.tok.kind in ("op", "name") and self.tok.text == text:
            self.i += 1
            return True
        return False

    def name(self, what: str) -> _Tok:
        tok = self.tok
        if tok.kind != "name":
            raise self.error(f"expected {what} (got {tok.text or 'end of text'!r})")
        self.i += 1
        return tok

    def build(self, tok: _Tok, make: Callable[[], _T]) -> _T:
        try:
            return make()
        except ParseError:
            raise
        except ValueError as e:
            raise self.error(str(e), tok) from e

    def end(self) -> None:
        if self.tok.kind != "end":
            raise self.error(f"expected end of text (got {self.tok.text!r})")

    # -- ops -----------------------------------------------------------------------------------
    def op(self) -> Op:
        head = self.name("a tensor name")
        indices: tuple[IndexTerm, ...] = ()
        if self.accept("["):
            indices = self.index_list("]")
        out = self.build(head, lambda: Access(head.text, indices))
        eq = self.tok
        if not (self.accept("=") or self.accept("+=")):
            raise self.error(f"expected '=' or '+=' (got {eq.text or 'end of text'!r})")
        if self.tok.kind == "name" and self.tok.text == "opaque":
            self.i += 1
            expr: Expr = self.opaque()
        else:
            expr = self.expr()
        self.end()
        op = self.build(eq, lambda: Op(out, expr, accumulate=eq.text == "+="))
        return op

    def opaque(self) -> Opaque:
        parts = [self.name("an ATen target").text]
        while self.accept("."):
            parts.append(self.name("an ATen target").text)
        self.expect("(")
        args: list[OpaqueArg] = []
        kwargs: list[tuple[str, OpaqueArg]] = []
        while not self.accept(")"):
            if args or kwargs:
                self.expect(",")
            if self.tok.kind == "name" and self.toks[self.i + 1].text == "=":
                key = self.name("a keyword").text
                self.i += 1
                kwargs.append((key, self.literal()))
            else:
                if kwargs:
                    raise self.error("expected a keyword argument after keyword arguments")
                args.append(self.literal())
        output = None
        if self.accept("["):
            output = int(self.number("an output index"))
            self.expect("]")
        return Opaque(".".join(parts), tuple(args), tuple(kwargs), output)

    def literal(self) -> OpaqueArg:
        tok = self.tok
        if tok.kind == "str":
            self.i += 1
            return str(ast.literal_eval(tok.text))
        if tok.text == "[" and tok.kind == "op":
            self.i += 1
            items: list[OpaqueArg] = []
            while not self.accept("]"):
                if items:
                    self.expect(",")
                items.append(self.literal())
            return tuple(items)
        if tok.kind == "num" or tok.text == "-" or tok.text in ("inf", "nan"):
            return self.number("a number")
        name = self.name("a tensor name or a literal")
        if name.text in ("None", "True", "False"):
            return {"None": None, "True": True, "False": False}[name.text]
        if name.text == "torch":
            self.expect(".")
            return DTypeRef(self.name("a dtype").text)
        ref = self.build(name, lambda: Access(name.text))
        return TensorRef(ref.tensor)

    def number(self, what: str) -> int | float:
        negative = self.accept("-")
        tok = self.tok
        if tok.kind == "name" and tok.text in ("inf", "nan"):
            value: int | float = float(tok.text)
        elif tok.kind == "num":
            is_float = any(c in tok.text for c in ".eE")
            value = float(tok.text) if is_float else int(tok.text)
        else:
            raise self.error(f"expected {what} (got {tok.text or 'end of text'!r})")
        self.i += 1
        return -value if negative else value

    # -- index terms ---------------------------------------------------------------------------
    def index_list(self, close: str) -> tuple[IndexTerm, ...]:
        terms: list[IndexTerm] = []
        while not self.accept(close):
            if terms and not self.accept(","):
                got = self.tok.text or "end of text"
                raise self.error(f"expected ',' or {close!r} (got {got!r})")
            terms.append(self.iexpr())
        return tuple(terms)

    def iexpr(self) -> IndexTerm:
        term = self.iterm()
        while self.tok.text in ("+", "-") and self.tok.kind == "op":
            op = self.tok.text
            self.i += 1
            term = IBin(op, term, self.iterm())  # type: ignore[arg-type]
        return term

    def iterm(self) -> IndexTerm:
        term = self.ifactor()
        while self.tok.text in ("*", "/", "%") and self.tok.kind == "op":
            op = self.tok.text
            self.i += 1
            term = IBin(op, term, self.ifactor())  # type: ignore[arg-type]
        return term

    def ifactor(self) -> IndexTerm:
        tok = self.tok
        if self.accept("("):
            term = self.iexpr()
            self.expect(")")
            return term
        if tok.kind == "num" or tok.text == "-":
            value = self.number("an index")
            if not isinstance(value, int):
                raise self.error(f"expected an integer index (got {value!r})", tok)
            return IConst(value)
        name = self.name("an index variable, an int or an index tensor")
        if self.accept("["):
            indices = self.index_list("]")
            acc = self.build(name, lambda: Access(name.text, indices))
            return acc
        var = self.build(name, lambda: IVar(name.text))
        return var

    # -- values --------------------------------------------------------------------------------
    def expr(self) -> Expr:
        expr = self.term()
        while self.tok.text in ("+", "-") and self.tok.kind == "op":
            op = self.tok.text
            self.i += 1
            expr = Bin(op, expr, self.term())  # type: ignore[arg-type]
        return expr

    def term(self) -> Expr:
        expr = self.unary()
        while self.tok.text in ("*", "/") and self.tok.kind == "op":
            op = self.tok.text
            self.i += 1
            expr = Bin(op, expr, self.unary())  # type: ignore[arg-type]
        return expr

    def unary(self) -> Expr:
        tok = self.tok
        if tok.kind == "op" and tok.text == "-":
            nxt = self.toks[self.i + 1]
            if nxt.kind == "num" or nxt.text in ("inf", "nan"):
                return Const(self.number("a number"))
            self.i += 1
            return Call("neg", (self.unary(),))
        m = _REDUCE.match(tok.text) if tok.kind == "name" else None
        if m is None:
            return self.primary()
        self.i += 1
        if m.group(2):
            names = [m.group(2)]
        else:
            self.expect("{")
            names = [self.name("an index variable").text]
            while self.accept(","):
                names.append(self.name("an index variable").text)
            self.expect("}")
        body = self.term()
        red = self.build(tok, lambda: Reduce(ReduceOp(m.group(1)), tuple(names), body))
        return red

    def primary(self) -> Expr:
        tok = self.tok
        if self.accept("("):
            expr = self.expr()
            self.expect(")")
            return expr
        if tok.kind == "num" or tok.text in ("inf", "nan"):
            return Const(self.number("a number"))
        name = self.name("a tensor, a number, a function or '('")
        if self.accept("("):
            if name.text not in FUNCTIONS:
                raise self.error(f"unknown function {name.text!r}", name)
            args: list[Expr] = []
            while not self.accept(")"):
                if args:
                    self.expect(",")
                args.append(self.expr())
            call = self.build(name, lambda: Call(name.text, tuple(args)))
            return call
        indices: tuple[IndexTerm, ...] = ()
        if self.accept("["):
            indices = self.index_list("]")
        acc = self.build(name, lambda: Access(name.text, indices))
        return acc


def parse_op(text: str) -> Op:
    """Parse one op from its text form.

    Args:
        text: e.g. ``"Y[i,j] = sum_k A[i,k] * B[k,j]"``.

    Returns:
        The op.

    Raises:
        ParseError: naming the problem and the column where it was found.
    """
    return _Parser(text).op()


def parse_expr(text: str) -> Expr:
    """Parse a right-hand side on its own (``"exp(S[i,j] - max_j S[i,j])"``).

    Raises:
        ParseError: naming the problem and its column.
    """
    parser = _Parser(text)
    expr = parser.expr()
    parser.end()
    return expr


# -- tensors and graphs ------------------------------------------------------------------------
def _level(p: _Parser) -> Level:
    tok = p.name("a level format")
    if tok.text not in {level.value for level in Level}:
        raise p.error(f"expected dense, compressed or singleton (got {tok.text!r})", tok)
    return Level(tok.text)


def _parse_tensor(p: _Parser) -> Tensor:
    head = p.name("a tensor name")
    p.expect(":")
    dtype = p.name("a dtype").text
    p.expect("[")
    shape: list[Dim] = []
    while not p.accept("]"):
        if shape:
            p.expect(",")
        tok = p.tok
        shape.append(int(tok.text) if tok.kind == "num" else p.name("a dim").text)
        if tok.kind == "num":
            p.i += 1
    fmt = Format.dense(len(shape))
    if p.accept("{"):
        levels = [_level(p)]
        while p.accept(","):
            levels.append(_level(p))
        p.expect("}")
        order: list[int] | None = None
        if p.accept("("):
            order = [int(p.number("a level"))]
            while p.accept(","):
                order.append(int(p.number("a level")))
            p.expect(")")
        fmt = p.build(head, lambda: Format(tuple(levels), None if order is None else tuple(order)))
    nnz: int | None = None
    segments: tuple[int, ...] | None = None
    while p.tok.kind == "name":
        key = p.name("nnz= or segments=")
        p.expect("=")
        if key.text == "nnz":
            nnz = int(p.number("a count"))
        elif key.text == "segments":
            p.expect("[")
            items: list[int] = []
            while not p.accept("]"):
                if items:
                    p.expect(",")
                items.append(int(p.number("a size")))
            segments = tuple(items)
        else:
            raise p.error(f"expected nnz= or segments= (got {key.text!r})", key)
    p.end()
    stats = None if nnz is None and segments is None else TensorStats(nnz, segments)
    tensor = p.build(head, lambda: Tensor(head.text, tuple(shape), dtype, fmt, stats))
    return tensor


def parse_graph(text: str) -> Graph:
    """Parse the graph text form (see the module docstring).

    Raises:
        ParseError: naming the problem, its line and column.
        ValueError: if the parsed graph is inconsistent (see :class:`~fusekit.ir.graph.Graph`).
    """
    name = "graph"
    tensors: list[Tensor] = []
    roles: dict[str, list[str]] = {"input": [], "param": [], "output": []}
    ops: list[Op] = []
    for number, line in enumerate(text.splitlines(), start=1):
        p = _Parser(line, number)
        if p.tok.kind == "end":
            continue
        word = p.tok.text if p.tok.kind == "name" else ""
        nxt = p.toks[p.i + 1]
        if word == "graph" and nxt.kind == "name":
            p.i += 1
            name = p.name("a graph name").text
            p.end()
        elif word in ("input", "param", "tensor") and nxt.kind == "name":
            p.i += 1
            tensor = _parse_tensor(p)
            tensors.append(tensor)
            if word != "tensor":
                roles[word].append(tensor.name)
        elif word == "output" and nxt.kind == "name":
            p.i += 1
            roles["output"].append(p.name("a tensor name").text)
            while p.accept(","):
                roles["output"].append(p.name("a tensor name").text)
            p.end()
        else:
            ops.append(p.op())
    return Graph(
        tensors=tuple(tensors),
        ops=tuple(ops),
        inputs=tuple(roles["input"]),
        params=tuple(roles["param"]),
        outputs=tuple(roles["output"]),
        name=name,
    )
