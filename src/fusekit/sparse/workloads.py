"""The sparse models of the FuseFlow study, as programs with their data and layer cuts.

* GCN (Kipf & Welling), 2 layers: ``H = relu(Â X W1)``, ``Y = Â H W2`` with
  ``Â = D^-1/2 (A + I) D^-1/2``, transform first (``Â (X W)``), relu as the aggregation's epilogue.
* GraphSAGE (mean aggregator, PyG's SAGEConv), 2 layers:
  ``H = relu(mean_N(X) Wn + X Ws)``, ``Y = mean_N(H) Wn2 + H Ws2``, transform first.
* A sparse autoencoder: ``Y = sigmoid(relu(X W1) W2)`` on a 90%-sparse batch.
* GPT-style attention with a BigBird block-sparse mask (random, window and global blocks):
  ``S = M ⊙ (Q Kᵀ)``, a row softmax over the stored entries, ``O = P V``. The mask is a 4-D
  block tensor ``M[I,J,ii,jj]`` (BCSR).

Each workload returns the program and its *layers*, the statements of each layer, which define
the ``partial`` cut.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from fusekit.data import planetoid
from fusekit.errors import expected
from fusekit.sparse.formats import from_dense, from_scipy
from fusekit.sparse.frontend import from_module
from fusekit.sparse.program import Operand, Program, Statement


@dataclass(frozen=True, eq=False)
class Workload:
    """A program and how it splits into layers.

    Attributes:
        name: a label, e.g. ``"gcn-cora"``.
        program: the statements and stored inputs.
        layers: the statements of each layer (the ``partial`` cut).
        notes: how the workload was built or reduced.
    """

    name: str
    program: Program
    layers: tuple[tuple[str, ...], ...]
    notes: str = ""


def _op(t: str, *v: str) -> Operand:
    return Operand(t, tuple(v))


def _graph(name: str) -> tuple[sp.csr_matrix, sp.csr_matrix, int]:
    g = planetoid(name)
    a = sp.csr_matrix(g.adjacency(), dtype=np.float64)
    x = sp.csr_matrix(g.x, dtype=np.float64)
    x.sort_indices()
    return a, x, int(g.y.max()) + 1


def gcn(graph: str = "cora", hidden: int = 16, seed: int = 0) -> Workload:
    """A 2-layer GCN on a citation graph of :mod:`fusekit.data`."""
    a, x, classes = _graph(graph)
    n = a.shape[0]
    a_hat = a + sp.identity(n, format="csr")
    deg = np.asarray(a_hat.sum(axis=1)).ravel()
    norm = sp.diags(deg**-0.5)
    a_hat = sp.csr_matrix(norm @ a_hat @ norm)
    a_hat.sort_indices()
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((x.shape[1], hidden)) / np.sqrt(x.shape[1])
    w2 = rng.standard_normal((hidden, classes)) / np.sqrt(hidden)
    inputs = {
        "A": from_scipy("A", a_hat, "csr"),
        "X": from_scipy("X", x, "csr"),
        "W1": from_dense("W1", w1),
        "W2": from_dense("W2", w2),
    }
    sts = (
        Statement("XW1", ("l", "n"), (_op("X", "l", "m"), _op("W1", "m", "n")), "mul", "sum"),
        Statement(
            "H1", ("i", "n"), (_op("A", "i", "l"), _op("XW1", "l", "n")), "mul", "sum", "relu"
        ),
        Statement("XW2", ("l", "c"), (_op("H1", "l", "n"), _op("W2", "n", "c")), "mul", "sum"),
        Statement("Y", ("i", "c"), (_op("A", "i", "l"), _op("XW2", "l", "c")), "mul", "sum"),
    )
    program = Program(f"gcn-{graph}", sts, inputs, ("Y",))
    return Workload(program.name, program, (("XW1", "H1"), ("XW2", "Y")))


def graphsage(graph: str = "cora", hidden: int = 16, seed: int = 0) -> Workload:
    """A 2-layer GraphSAGE (mean aggregation, root weight) on a citation graph."""
    a, x, classes = _graph(graph)
    deg = np.maximum(np.asarray(a.sum(axis=1)).ravel(), 1.0)
    a_mean = sp.csr_matrix(sp.diags(1.0 / deg) @ a)
    a_mean.sort_indices()
    rng = np.random.default_rng(seed)
    f = x.shape[1]
    ws = {
        "Wn1": rng.standard_normal((f, hidden)) / np.sqrt(f),
        "Ws1": rng.standard_normal((f, hidden)) / np.sqrt(f),
        "Wn2": rng.standard_normal((hidden, classes)) / np.sqrt(hidden),
        "Ws2": rng.standard_normal((hidden, classes)) / np.sqrt(hidden),
    }
    inputs = {"A": from_scipy("A", a_mean, "csr"), "X": from_scipy("X", x, "csr")}
    inputs.update({k: from_dense(k, v) for k, v in ws.items()})
    sts = (
        Statement("XN1", ("l", "n"), (_op("X", "l", "m"), _op("Wn1", "m", "n")), "mul", "sum"),
        Statement("XS1", ("i", "n"), (_op("X", "i", "m"), _op("Ws1", "m", "n")), "mul", "sum"),
        Statement("AG1", ("i", "n"), (_op("A", "i", "l"), _op("XN1", "l", "n")), "mul", "sum"),
        Statement(
            "H1", ("i", "n"), (_op("AG1", "i", "n"), _op("XS1", "i", "n")), "add", None, "relu"
        ),
        Statement("XN2", ("l", "c"), (_op("H1", "l", "n"), _op("Wn2", "n", "c")), "mul", "sum"),
        Statement("XS2", ("i", "c"), (_op("H1", "i", "n"), _op("Ws2", "n", "c")), "mul", "sum"),
        Statement("AG2", ("i", "c"), (_op("A", "i", "l"), _op("XN2", "l", "c")), "mul", "sum"),
        Statement("Y", ("i", "c"), (_op("AG2", "i", "c"), _op("XS2", "i", "c")), "add"),
    )
    program = Program(f"graphsage-{graph}", sts, inputs, ("Y",))
    return Workload(
        program.name, program, (("XN1", "XS1", "AG1", "H1"), ("XN2", "XS2", "AG2", "Y"))
    )


def autoencoder(
    batch: int = 32, features: int = 784, hidden: int = 128, sparsity: float = 0.9, seed: int = 0
) -> Workload:
    """A sparse autoencoder ``Y = sigmoid(relu(X W1) W2)`` on a ``sparsity``-sparse batch."""
    rng = np.random.default_rng(seed)
    mask = rng.random((batch, features)) >= sparsity
    x = sp.csr_matrix(np.where(mask, rng.random((batch, features)), 0.0))
    inputs = {
        "X": from_scipy("X", x, "csr"),
        "W1": from_dense("W1", rng.standard_normal((features, hidden)) / np.sqrt(features)),
        "W2": from_dense("W2", rng.standard_normal((hidden, features)) / np.sqrt(hidden)),
    }
    sts = (
        Statement("H", ("b", "h"), (_op("X", "b", "f"), _op("W1", "f", "h")), "mul", "sum", "relu"),
        Statement(
            "Y", ("b", "g"), (_op("H", "b", "h"), _op("W2", "h", "g")), "mul", "sum", "sigmoid"
        ),
    )
    program = Program(f"autoencoder-b{batch}", sts, inputs, ("Y",))
    return Workload(program.name, program, (("H",), ("Y",)))


def bigbird_mask(
    tokens: int,
    block: int,
    random_blocks: int = 2,
    window: int = 1,
    global_blocks: int = 2,
    seed: int = 0,
) -> np.ndarray:
    """BigBird's block mask ``[tokens/block, tokens/block]``: window, random and global blocks."""
    nb = tokens // block
    rng = np.random.default_rng(seed)
    m = np.zeros((nb, nb), dtype=bool)
    for i in range(nb):
        m[i, max(0, i - window) : i + window + 1] = True
        m[i, rng.choice(nb, size=min(random_blocks, nb), replace=False)] = True
    m[:global_blocks, :] = True
    m[:, :global_blocks] = True
    return m


def bigbird(
    tokens: int = 1024, head_dim: int = 64, block: int = 64, heads: int = 1, seed: int = 0
) -> Workload:
    """One head of GPT-style attention with a BigBird block-sparse mask.

    Heads are independent and identical in cost (same mask), so a study of ``h`` heads
    simulates one and multiplies its cycles by ``h`` (``heads`` is recorded in the notes).
    """
    nb = tokens // block
    rng = np.random.default_rng(seed)
    blocks = bigbird_mask(tokens, block, seed=seed)
    dense_mask = np.kron(blocks, np.ones((block, block))).astype(np.float64)
    q = rng.standard_normal((tokens, head_dim)) / head_dim**0.25
    k = rng.standard_normal((tokens, head_dim)) / head_dim**0.25
    v = rng.standard_normal((tokens, head_dim))
    inputs = {
        "M": from_scipy("M", sp.csr_matrix(dense_mask), "bcsr", block=block),
        "Q": from_dense("Q", q.reshape(nb, block, head_dim)),
        "K": from_dense("K", k.reshape(nb, block, head_dim)),
        "V": from_dense("V", v.reshape(nb, block, head_dim)),
    }
    blk = ("I", "J", "ii", "jj")
    sts = (
        Statement(
            "S",
            blk,
            (_op("M", *blk), _op("Q", "I", "ii", "d"), _op("K", "J", "jj", "d")),
            "mul",
            "sum",
        ),
        Statement("Mx", ("I", "ii"), (_op("S", *blk),), "copy", "max"),
        Statement("E", blk, (_op("S", *blk), _op("Mx", "I", "ii")), "sub", None, "exp"),
        Statement("Z", ("I", "ii"), (_op("E", *blk),), "copy", "sum"),
        Statement("P", blk, (_op("E", *blk), _op("Z", "I", "ii")), "div"),
        Statement("O", ("I", "ii", "d"), (_op("P", *blk), _op("V", "J", "jj", "d")), "mul", "sum"),
    )
    program = Program(f"bigbird-t{tokens}-b{block}", sts, inputs, ("O",))
    notes = f"one head of {heads} simulated; cycles scale by {heads} (heads are independent)"
    return Workload(program.name, program, (("S", "Mx", "E", "Z", "P"), ("O",)), notes)


def by_name(name: str, quick: bool = False) -> Workload:
    """A workload by name: ``gcn-cora``, ``graphsage-citeseer``, ``autoencoder``, ``bigbird-b32``.

    ``quick`` shrinks BigBird to 256 tokens.
    """
    kind, _, arg = name.partition("-")
    if kind in ("gcn", "graphsage"):
        return (gcn if kind == "gcn" else graphsage)(arg or "cora")
    if kind == "autoencoder":
        return autoencoder()
    if kind == "bigbird":
        block = int(arg.removeprefix("b")) if arg else 64
        return bigbird(tokens=256 if quick else 1024, block=block, heads=12)
    raise ValueError(
        "sparse: expected 'workload' to be gcn-<graph>, graphsage-<graph>, autoencoder, "
        f"bigbird-b<block> or path/to/file.py:factory (got {name!r})"
    )


def load_workload(spec: str, quick: bool = False) -> Workload:
    """A built-in workload (:func:`by_name`) or a user's, from ``path/to/file.py:factory``.

    The file is loaded as ``fusekit ir`` and ``fusekit stitch`` load theirs
    (:func:`fusekit.ir.examples.call_factory`). The factory returns a :class:`Workload`, a
    :class:`Program` (one layer per statement), or a sparse PyTorch module with its arguments
    (an ``ir`` :class:`~fusekit.ir.examples.Example` or a ``(module, args)`` pair), captured
    with :func:`fusekit.sparse.frontend.from_module` (one layer per statement).

    Raises:
        ValueError: for an unknown name, a missing file or factory, a factory returning
            anything else, or a module with an op the machine does not run.
    """
    if ":" not in spec:
        return by_name(spec, quick)
    from fusekit.ir.examples import as_example, call_factory  # imports torch: files only

    made, factory, file = call_factory(spec)
    if isinstance(made, Workload):
        return made
    if isinstance(made, Program):
        program = made
    else:
        example = as_example(made, factory, file)
        if example is None:
            raise ValueError(
                expected(
                    "sparse",
                    f"{factory}()",
                    "a Workload, a Program, an Example or a (module, args) pair",
                    type(made).__name__,
                )
            )

        program = from_module(example.module, example.args)
    layers = tuple((st.out,) for st in program.statements)
    return Workload(program.name, program, layers, f"{factory}() from {file}")
