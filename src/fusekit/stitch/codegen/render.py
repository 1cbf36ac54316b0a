"""Rendering index expressions of a stitched group as source text, shared by the backends.

A backend gives a :class:`Dialect` (how to spell functions, selections, typed constants, array
reads); :class:`Renderer` walks an op's folded expression and spells every read according to
where the value lives in the kernel::

    external tensor X[t0, t1]        in_X[t0 * S0 + t1]          (terms over anchor indices)
    same-stage full op Y             v_Y                          (a register)
    earlier-stage full op Y          buf_Y[q]                     (the row buffer), or
                                     Y's expression again         (recomputed when cheap)
    row op or row reduction R        v_R                          (a scalar of the row)
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from fusekit import paths
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
    walk,
)
from fusekit.ir.graph import Graph
from fusekit.stitch.schemes import Layout, Role, Stage

FLOATS = frozenset({"float32", "float64", "float16", "bfloat16"})
#: 16-bit floats: stored as they are, computed in float32 (loads widen, values round to them)
HALF = frozenset({"float16", "bfloat16"})
#: integers narrower than the kernels' int64 arithmetic: an op's result wraps to its dtype
NARROW_INTS = frozenset({"int8", "uint8", "int16", "int32"})


def compute_dtype(dtype: str) -> str:
    """The dtype a kernel computes a value of ``dtype`` in: float32 for the 16-bit floats."""
    return "float32" if dtype in HALF else dtype


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Dialect:
    """How one backend spells expressions.

    Attributes:
        functions: IR function name to a format string over ``{0}``, ``{1}``, ``{2}``;
            ``"select"``, when given, spells a ``where`` whose branches may both be evaluated
            (:meth:`Renderer.speculatable`) without a branch.
        typed_const: spells a float constant of a dtype (e.g. ``np.float32(0.5)``).
        read: spells a read of array ``name`` at offset text.
        widen: spells a loaded 16-bit float (text, its dtype) as a float32.
        round_to: spells a float32 (text) rounded to a 16-bit dtype, still as a float32.
        convert: spells a value (text) converted to another dtype, as torch's ``.to(dtype)``
            converts: to an integer by truncation toward zero, to bool as ``!= 0``.
        float64: spellings for float64 ops that replace ``functions``' (a backend whose
            ``functions`` use float32 approximations or constants spells exact ones here).
    """

    functions: Mapping[str, str]
    typed_const: Callable[[float, str], str]
    read: Callable[[str, str], str]
    widen: Callable[[str, str], str]
    round_to: Callable[[str, str], str]
    convert: Callable[[str, str], str]
    float64: Mapping[str, str] = field(default_factory=dict)


def strides(shape: tuple[int, ...]) -> list[int]:
    """Row-major strides of ``shape``."""
    out, acc = [], 1
    for size in reversed(shape):
        out.append(acc)
        acc *= size
    return out[::-1]


def static_shape(graph: Graph, name: str) -> tuple[int, ...]:
    """The static shape of tensor ``name``."""
    return tuple(int(s) for s in graph.tensor(name).shape)


@dataclass
class Renderer:
    """Spells the expressions of one group for one backend."""

    graph: Graph
    layout: Layout
    dialect: Dialect
    index: Callable[[int], str] = lambda d: f"a{d}"
    stage_of: dict[str, int] = field(default_factory=dict)
    reduce_names: dict[int, str] = field(default_factory=dict)
    #: anchor dims looped as two digits ``(i_hi, i_lo)`` of radix ``c``: ``i / c`` and ``i % c``
    #: render as the digits (:func:`digit_splits`)
    digits: dict[int, int] = field(default_factory=dict)
    #: ``where`` conditions with a known value (the loop version being spelled), by their text
    fixed: dict[str, bool] = field(default_factory=dict)
    #: when a list, every ``where`` condition spelled is appended to it (see ``conditions``)
    seen: list[str] | None = None
    #: strides of the inputs read with other strides than row-major contiguous
    given: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        k = 0
        for step in self.layout.steps:
            if isinstance(step, Stage):
                for op in step.ops:
                    self.stage_of[op] = k
                k += 1

    def term(self, op: str, t: IndexTerm) -> str:
        """An index term over the anchor indices."""
        if isinstance(t, IVar):
            d = self.layout.var_dims[op][t.name]
            return "0" if d is None else self.index(d)
        if isinstance(t, IConst):
            return str(t.value)
        if isinstance(t, IBin):
            digit = self._digit(op, t)
            if digit is not None:
                return digit
            sym = "//" if t.op == "/" else t.op
            return f"({self.term(op, t.left)} {sym} {self.term(op, t.right)})"
        raise ValueError(f"stitch: cannot render index term {t!r}")

    def _digit(self, op: str, t: IBin) -> str | None:
        """``i_hi`` for ``i / c``, ``i_lo`` for ``i % c`` when dim ``i`` is split at ``c``."""
        found = _digit_term(t)
        if found is None:
            return None
        var, c, high = found
        d = self.layout.var_dims[op].get(var)
        if d is None or self.digits.get(d) != c:
            return None
        return f"{self.index(d)}_{'hi' if high else 'lo'}"

    def offset(self, op: str, tensor: str, terms: tuple[IndexTerm, ...]) -> str:
        """The flat offset of ``tensor[terms]`` (its :attr:`given` strides, else contiguous)."""
        parts = []
        steps = self.given.get(tensor) or strides(static_shape(self.graph, tensor))
        for t, s in zip(terms, steps, strict=True):
            text = self.term(op, t)
            if text != "0":
                parts.append(text if s == 1 else f"{text} * {s}")
        return " + ".join(parts) or "0"

    def const(self, value: float, dtype: str) -> str:
        """A constant in the compute dtype of the op using it."""
        if dtype in FLOATS or isinstance(value, float):
            return self.dialect.typed_const(
                float(value), compute_dtype(dtype) if dtype in FLOATS else "float32"
            )
        return str(int(value))

    def value(self, op: str, reader_stage: int | None) -> str:
        """Op ``op``'s value: its expression, converted when the op is a cast.

        Values of 16-bit float ops are computed and kept in float32 (reductions accumulate in
        it); they are rounded where they are stored, and where the graph casts to a 16-bit
        float (``x.to(torch.bfloat16)``), so that what the model rounds on purpose is rounded.
        The ops one ATen op lowers to (a softmax's exp, sum and division) are not rounded one
        by one, as Inductor does: closer to exact than eager, never further than its rounding.
        Any other cast converts the value where the graph casts (``(x * 3.7).long()``
        truncates before the ops that read it), not only where it is stored; arithmetic on
        integers narrower than int64 wraps to its dtype (:data:`NARROW_INTS`).
        """
        expr = self.layout.exprs[op]
        text = self.expr(op, expr, reader_stage)
        dtype = self.graph.tensor(op).dtype
        if not self.graph.is_cast(op):
            if dtype in NARROW_INTS and not isinstance(expr, Access | Reduce):
                return self.dialect.convert(text, dtype)  # uint8 254 + 3 is 1, as torch's
            return text
        if dtype in HALF:
            return self.dialect.round_to(text, dtype)
        read = self.graph.op(op).expr  # a cast is a read of another dtype (Graph.is_cast)
        assert isinstance(read, Access)
        source = self.graph.tensor(read.tensor).dtype
        if compute_dtype(source) == dtype:  # a 16-bit float to float32: loaded as float32
            return text
        return self.dialect.convert(text, dtype)

    def expr(self, op: str, e: Expr, reader_stage: int | None) -> str:
        """Spell ``e`` (an expression of op ``op``); Reduce nodes by their accumulator names."""
        dtype = self.graph.tensor(op).dtype
        if isinstance(e, Const):
            return self.const(e.value, dtype)
        if isinstance(e, Access):
            return self.read(op, e, reader_stage)
        if isinstance(e, Bin):
            left, right = self.expr(op, e.left, reader_stage), self.expr(op, e.right, reader_stage)
            return f"({left} {e.op} {right})"
        if isinstance(e, Call):
            if e.fn == "where":
                cond = self.expr(op, e.args[0], reader_stage)
                if cond in self.fixed:  # this version's branch only: no load of the other
                    return self.expr(op, e.args[1 if self.fixed[cond] else 2], reader_stage)
                if self.seen is not None:
                    self.seen.append(cond)
            args = [self.expr(op, a, reader_stage) for a in e.args]
            select = self.dialect.functions.get("select")
            if e.fn == "where" and select and all(self.speculatable(op, a) for a in e.args[1:]):
                return "(" + select.format(*args) + ")"
            power = e.args[1] if e.fn == "pow" else None
            if isinstance(power, Const) and power.value in (1, 2, 3):  # x ** 2: exact products
                return "(" + " * ".join([args[0]] * int(power.value)) + ")"
            spell = self.dialect.float64.get(e.fn) if dtype == "float64" else None
            return "(" + (spell or self.dialect.functions[e.fn]).format(*args) + ")"
        if isinstance(e, Reduce):
            return self.reduce_names[id(e)]
        raise ValueError(f"stitch: cannot render {type(e).__name__}")

    def speculatable(self, op: str, e: Expr) -> bool:
        """Whether ``e`` (of op ``op``) may be evaluated when its value is not used.

        Yes when every read is in bounds for every index the loops take: each index term's
        range over the anchor extents (:meth:`span`) lies inside the tensor's dim. A padding's
        ``x[i - p]`` does not: only its ``where`` keeps it in bounds. A group op spelled again
        where it is read (not buffered) is checked through.
        """
        for n in walk(e):
            if not isinstance(n, Access):
                continue
            shape = static_shape(self.graph, n.tensor)
            for t, size in zip(n.indices, shape, strict=True):
                span = self.span(op, t)
                if span is None or span[0] < 0 or span[1] >= size:
                    return False
            if recomputed(self.layout, n.tensor):
                if not self.speculatable(n.tensor, self.layout.exprs[n.tensor]):
                    return False
        return True

    def span(self, op: str, t: IndexTerm) -> tuple[int, int] | None:
        """The least and greatest value of index term ``t`` over the loops (None: unknown)."""
        if isinstance(t, IVar):
            d = self.layout.var_dims[op].get(t.name)
            return (0, 0) if d is None else (0, int(self.layout.extents[d]) - 1)
        if isinstance(t, IConst):
            return (int(t.value), int(t.value))
        if not isinstance(t, IBin):
            return None  # an indirect index
        left, right = self.span(op, t.left), self.span(op, t.right)
        if left is None or right is None:
            return None
        (a, b), (c, d) = left, right
        if t.op == "+":
            return a + c, b + d
        if t.op == "-":
            return a - d, b - c
        if t.op == "*" and a >= 0 and c >= 0:
            return a * c, b * d
        if t.op == "/" and a >= 0 and c == d > 0:
            return a // c, b // c
        if t.op == "%" and a >= 0 and c == d > 0:
            return (a, b) if b < c else (0, c - 1)
        return None

    def read(self, op: str, acc: Access, reader_stage: int | None) -> str:
        """A read of ``acc`` by op ``op`` from inside stage ``reader_stage`` (None: a row step)."""
        name = acc.tensor
        role = self.layout.roles.get(name)
        if role is None:
            text = self.dialect.read(f"in_{name}", self.offset(op, name, acc.indices))
            dtype = self.graph.tensor(name).dtype
            return self.dialect.widen(text, dtype) if dtype in HALF else text
        if role in (Role.ROW, Role.ROW_REDUCE):
            return f"v_{name}"
        if reader_stage is not None and self.stage_of[name] == reader_stage:
            return f"v_{name}"
        if name not in self.layout.buffered:  # cheap: recomputed (schemes._schedule)
            return "(" + self.value(name, reader_stage) + ")"
        return self.dialect.read(f"buf_{name}", "q")


def recomputed(layout: Layout, name: str) -> bool:
    """Whether group op ``name`` is spelled again where it is read (a full op, not buffered)."""
    return layout.roles.get(name) is Role.FULL and name not in layout.buffered


def _digit_term(t: IndexTerm) -> tuple[str, int, bool] | None:
    """``(var, c, True)`` for ``var / c``, ``(var, c, False)`` for ``var % c``, else ``None``."""
    if (
        isinstance(t, IBin) and t.op in ("/", "%") and isinstance(t.left, IVar)
        and isinstance(t.right, IConst) and t.right.value > 1
    ):  # fmt: skip
        return t.left.name, int(t.right.value), t.op == "/"
    return None


def _terms(t: IndexTerm | Expr) -> list[IndexTerm]:
    """Every index term inside ``t`` (nested reads included), outermost first."""
    out: list[IndexTerm] = []
    stack: list[IndexTerm | Expr] = [t]
    while stack:
        node = stack.pop()
        if isinstance(node, Access):
            stack.extend(node.indices)
        elif isinstance(node, IBin):
            out.append(node)
            stack.extend((node.left, node.right))
        elif isinstance(node, Bin):
            stack.extend((node.left, node.right))
        elif isinstance(node, Call):
            stack.extend(node.args)
        elif isinstance(node, Reduce):
            stack.append(node.body)
    return out


def digit_splits(graph: Graph, layout: Layout) -> dict[int, int]:
    """The innermost dim to loop as two digits, ``{dim: radix}`` (empty: none).

    A read ``X[i / 32]`` or ``X[i % 32]`` in the vector loop over ``i`` (a ``cat`` or a rotary
    embedding's halves, an aligned slice) is a division per element and a gather; looped as
    ``for i_hi: for i_lo in range(32)``, ``i / 32`` is the loop-invariant ``i_hi`` and
    ``i % 32`` the contiguous ``i_lo``. The radix is the one most such terms use; it divides
    the dim's extent.
    """
    if not layout.inner_dims:
        return {}
    d = layout.inner_dims[-1]
    extent = layout.extents[d]
    votes: dict[int, int] = {}
    for op in layout.ops:
        out = graph.op(op).out
        for t in [*_terms(layout.exprs[op]), *_terms(out)]:
            found = isinstance(t, IBin) and _digit_term(t)
            if found and layout.var_dims[op].get(found[0]) == d and extent % found[1] == 0:
                if found[1] < extent:
                    votes[found[1]] = votes.get(found[1], 0) + 1
    if not votes:
        return {}
    return {d: max(votes, key=lambda c: (votes[c], c))}


def identity(op: str) -> float:
    """The identity of a reduction."""
    return {"sum": 0.0, "mean": 0.0, "max": -math.inf, "min": math.inf, "prod": 1.0}[op]


#: prefixes the emitters put before a graph name (``in_X``, ``v_Y``, ``p_part_Z_0``, ...)
NAME_PREFIXES = ("in_", "out_", "v_", "acc_", "part_", "col_", "p_", "buf_")
_IDENT = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")
_SUFFIX = re.compile(r"_\d+$")


def canonical(source: str, names: Iterable[str]) -> str:
    """``source`` with every graph name in it replaced by ``n0, n1, ...`` in order of appearance.

    Two groups of one structure (the same op in every layer of a model, the update of two
    parameters of one shape) differ in their source only by the graph's names: spelled
    canonically they are one module, compiled once and cached once, as Inductor names its
    kernels' buffers ``in_ptr0, tmp0, ...``. A name appears in the source only behind the
    emitters' :data:`NAME_PREFIXES`, possibly followed by ``_<digits>`` (a partial's index).
    """
    known = set(names)
    given: dict[str, str] = {}

    def name_of(ident: str) -> tuple[str, str, str] | None:
        """``(prefixes, name, suffix)`` of an identifier that spells a known name."""
        head = 0
        while True:
            prefix = next((p for p in NAME_PREFIXES if ident.startswith(p, head)), None)
            if prefix is None:
                return None
            head += len(prefix)
            rest = ident[head:]
            if rest in known:
                return ident[:head], rest, ""
            tail = _SUFFIX.search(rest)
            if tail is not None and rest[: tail.start()] in known:
                return ident[:head], rest[: tail.start()], tail.group()

    spelled: dict[str, str] = {}  # identifier -> its new spelling

    def rename(m: re.Match[str]) -> str:
        ident = m.group()
        if ident not in spelled:
            found = name_of(ident)
            if found is None:
                spelled[ident] = ident
            else:
                prefixes, name, suffix = found
                spelled[ident] = prefixes + given.setdefault(name, f"n{len(given)}") + suffix
        return spelled[ident]

    out = _IDENT.sub(rename, source)
    # a renaming that merged two identifiers (a graph name spelled like a prefixed one) would
    # change the program: the source is kept as it is
    return out if len(set(spelled.values())) == len(spelled) else source


def cache_dir() -> Path:
    """Where generated kernels are written (numba and Triton cache their code beside them)."""
    return paths.cache_dir("stitch")


_MODULES: dict[str, ModuleType] = {}


def _current(path: Path, source: str) -> bool:
    """Whether the file at ``path`` holds exactly ``source`` (a missing file does not)."""
    try:
        return path.read_bytes() == source.encode()
    except FileNotFoundError:
        return False


def source_digest(source: str) -> str:
    """The name stem of a generated module: the first 20 hex digits of its sha256."""
    return hashlib.sha256(source.encode()).hexdigest()[:20]


def is_loaded(source: str, prefix: str) -> bool:
    """Whether this process has loaded the generated module of ``source`` already."""
    return f"fusekit_stitch_{prefix}_{source_digest(source)}" in _MODULES


def write_generated(source: str, prefix: str) -> Path:
    """The cache file of ``source`` (named by its hash), written unless it holds exactly that.

    A file whose bytes differ (truncated, edited, planted) is replaced with one warning.
    """
    path = cache_dir() / f"{prefix}_{source_digest(source)}.py"
    if not _current(path, source):
        if path.exists() or path.is_symlink():
            log.warning("generated kernel %s does not match its hash; regenerating it", path)
        paths.write_atomic(path, source)
    return path


def load_generated(source: str, prefix: str) -> ModuleType:
    """Write ``source`` to the cache (named by its hash), verify it, import it; memoised by hash.

    The cache folder is untrusted: a file already there is used only if its bytes are exactly
    ``source`` (whose sha256 names it); a truncated, edited or planted file is replaced, with
    one warning, through a temporary file and ``os.replace``. The module is compiled from
    ``source`` itself, never from the file or a ``.pyc``. A real file, not ``exec`` alone:
    numba's cache and ``triton.jit`` both read the defining module's file.

    Raises:
        OSError: the cache folder cannot be written.
    """
    name = f"fusekit_stitch_{prefix}_{source_digest(source)}"
    if name in _MODULES:
        return _MODULES[name]
    path = write_generated(source, prefix)
    module = ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module  # numba's cache re-imports the module by name
    try:
        exec(compile(source, str(path), "exec"), module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    _MODULES[name] = module
    return module
