"""Built-in example models for tests, benchmarks and the tour, with their example inputs.

========== =================================================================================
name       model
========== =================================================================================
bert       BERT-style encoder layer: multi-head attention with a padding mask, GELU FFN,
           post-LayerNorm residuals
gpt_moe    GPT-style decoder layer: token and position embeddings, causal attention, and a
           Mixture-of-Experts FFN with expert-choice routing (each expert picks its top
           ``capacity`` tokens: gather -> per-expert bmm -> GELU -> bmm -> index_add)
gcn        two-layer GCN, ``A (X W) + b``, with a sparse CSR normalised adjacency
rgcn       RGCN layer in plain torch ops: gather source rows, per-edge relation weights,
           bmm, mean over each (node, relation) pair, index_add into the destinations
========== =================================================================================

Opaque on purpose: ``aten.topk`` in ``gpt_moe`` (a selection, not an index-notation expression).
This module imports torch; ``import fusekit.ir`` does not import it.
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fusekit.errors import FusekitError, expected


@dataclass(frozen=True)
class Example:
    """A model with example inputs.

    Attributes:
        name: registry name.
        description: one line.
        module: the model, in eval mode.
        args: example arguments.
        opaque: ATen targets kept opaque on purpose, with the reason.
    """

    name: str
    description: str
    module: nn.Module
    args: tuple[Any, ...]
    opaque: Mapping[str, str] = field(default_factory=dict)


class BertLayer(nn.Module):
    """Post-LN encoder layer: ``x = LN(x + Attn(x)); x = LN(x + FFN(x))``."""

    def __init__(self, dim: int = 64, heads: int = 4, hidden: int = 128, dropout: float = 0.1):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.ff1, self.ff2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``x``: [B, T, C]; ``mask``: [B, T], 0 for tokens and a large negative for padding."""
        b, t, c = x.shape
        d = c // self.heads
        q = self.q(x).view(b, t, self.heads, d).transpose(1, 2)
        k = self.k(x).view(b, t, self.heads, d).transpose(1, 2)
        v = self.v(x).view(b, t, self.heads, d).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d) + mask[:, None, None, :]
        attn = (self.drop(torch.softmax(scores, dim=-1)) @ v).transpose(1, 2).reshape(b, t, c)
        x = self.ln1(x + self.drop(self.o(attn)))
        out: torch.Tensor = self.ln2(x + self.drop(self.ff2(self.drop(F.gelu(self.ff1(x))))))
        return out


class ExpertChoiceMoE(nn.Module):
    r"""MoE FFN where each expert takes its ``capacity`` highest-scoring tokens.

    .. math:: y_t = \sum_{e: t \in top_e} g_{e,t} W2_e \, gelu(W1_e x_t)
    """

    def __init__(self, dim: int = 64, hidden: int = 128, experts: int = 4, capacity: int = 16):
        super().__init__()
        self.capacity = capacity
        self.router = nn.Linear(dim, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, dim, hidden) / math.sqrt(dim))
        self.w2 = nn.Parameter(torch.randn(experts, hidden, dim) / math.sqrt(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: [N, C] tokens."""
        experts, c = self.w1.shape[0], x.shape[1]
        scores = torch.softmax(self.router(x), dim=-1)
        gate, idx = torch.topk(scores.t(), self.capacity, dim=-1)  # [E, capacity]
        flat = idx.reshape(-1)
        picked = x.index_select(0, flat).view(experts, self.capacity, c)
        y = torch.bmm(F.gelu(torch.bmm(picked, self.w1)), self.w2) * gate.unsqueeze(-1)
        return torch.zeros_like(x).index_add_(0, flat, y.reshape(-1, c))


class GPTMoELayer(nn.Module):
    """Embeddings, then a pre-LN decoder block: causal attention and an expert-choice MoE FFN."""

    future: torch.Tensor

    def __init__(
        self,
        vocab: int = 128,
        block: int = 16,
        dim: int = 64,
        heads: int = 4,
        experts: int = 4,
        capacity: int = 16,
    ):
        super().__init__()
        self.heads = heads
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Parameter(torch.randn(block, dim) * 0.02)
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.moe = ExpertChoiceMoE(dim, 2 * dim, experts, capacity)
        self.register_buffer("future", torch.ones(block, block, dtype=torch.bool).triu(1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids``: [B, T] token ids."""
        b, t = ids.shape
        x = self.wte(ids) + self.wpe[:t]
        c = x.shape[-1]
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(c // self.heads))
        att = torch.softmax(att.masked_fill(self.future[:t, :t], float("-inf")), dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
        out: torch.Tensor = x + self.moe(self.ln2(x).reshape(b * t, c)).view(b, t, c)
        return out


class GCN(nn.Module):
    """Two GCN layers: ``H = relu(A (X W1) + b1)``, ``Y = A (H W2) + b2``, ``A`` sparse."""

    def __init__(self, features: int = 32, hidden: int = 16, classes: int = 8):
        super().__init__()
        self.w1 = nn.Linear(features, hidden, bias=False)
        self.w2 = nn.Linear(hidden, classes, bias=False)
        self.b1 = nn.Parameter(torch.zeros(hidden))
        self.b2 = nn.Parameter(torch.zeros(classes))
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        """``x``: [N, F] features; ``adj``: [N, N] sparse normalised adjacency."""
        h = torch.relu(torch.sparse.mm(adj, self.w1(x)) + self.b1)
        out: torch.Tensor = adj @ self.w2(self.drop(h)) + self.b2
        return out


class RGCNLayer(nn.Module):
    r"""RGCN with mean aggregation per relation, in plain torch ops.

    .. math:: y_i = x_i W_0 + b + \sum_r \frac{1}{|N_r(i)|} \sum_{j \in N_r(i)} x_j W_r
    """

    def __init__(self, nodes: int, relations: int = 4, features: int = 16, out: int = 16):
        super().__init__()
        self.nodes, self.relations = nodes, relations
        self.weight = nn.Parameter(torch.randn(relations, features, out) / math.sqrt(features))
        self.root = nn.Parameter(torch.randn(features, out) / math.sqrt(features))
        self.bias = nn.Parameter(torch.zeros(out))

    def forward(
        self, x: torch.Tensor, edge_index: torch.Tensor, edge_type: torch.Tensor
    ) -> torch.Tensor:
        """``x``: [N, K]; ``edge_index``: [2, E] (source, destination); ``edge_type``: [E]."""
        src, dst = edge_index[0], edge_index[1]
        msg = torch.bmm(x.index_select(0, src).unsqueeze(1), self.weight.index_select(0, edge_type))
        key = dst * self.relations + edge_type
        ones = torch.ones_like(edge_type, dtype=x.dtype)
        count = x.new_zeros(self.nodes * self.relations).index_add_(0, key, ones)
        msg = msg.squeeze(1) / count.index_select(0, key).unsqueeze(-1)
        agg = x.new_zeros(self.nodes, self.weight.shape[-1]).index_add_(0, dst, msg)
        return agg + x @ self.root + self.bias


def _bert(seed: int) -> Example:
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    x = torch.randn(2, 16, 64, generator=g)
    mask = torch.zeros(2, 16)
    mask[1, 12:] = -1e4
    return Example(
        "bert", "BERT-style encoder layer (B=2, T=16, C=64, 4 heads)", BertLayer().eval(), (x, mask)
    )


def _gpt_moe(seed: int) -> Example:
    torch.manual_seed(seed)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(seed))
    why = {"aten.topk.default": "expert-choice routing selects tokens: not index notation"}
    return Example(
        "gpt_moe",
        "GPT-style decoder layer with an expert-choice MoE FFN (4 experts)",
        GPTMoELayer().eval(),
        (ids,),
        why,
    )


def normalized_adjacency(
    nodes: int, edges: int, seed: int, layout: torch.layout = torch.sparse_csr
) -> torch.Tensor:
    """A random symmetric adjacency with self loops, ``D^-1/2 (A + I) D^-1/2``, stored sparse.

    Args:
        nodes: number of nodes.
        edges: number of random undirected edges (before deduplication).
        seed: random seed.
        layout: ``torch.sparse_csr`` or ``torch.sparse_coo``.

    Returns:
        The ``[nodes, nodes]`` sparse matrix.
    """
    g = torch.Generator().manual_seed(seed)
    pairs = torch.randint(0, nodes, (2, edges), generator=g)
    dense = torch.zeros(nodes, nodes)
    dense[pairs[0], pairs[1]] = 1.0
    dense = ((dense + dense.t() + torch.eye(nodes)) > 0).float()
    scale = dense.sum(1).rsqrt()
    dense = scale[:, None] * dense * scale[None, :]
    with warnings.catch_warnings():  # torch calls CSR support "beta" on every construction
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return dense.to_sparse(layout=layout)


def _gcn(seed: int) -> Example:
    torch.manual_seed(seed)
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(seed))
    adj = normalized_adjacency(64, 160, seed)
    return Example(
        "gcn", "2-layer GCN on a 64-node graph with a sparse CSR adjacency", GCN().eval(), (x, adj)
    )


def _rgcn(seed: int) -> Example:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    nodes, edges, relations = 64, 256, 4
    x = torch.randn(nodes, 16, generator=g)
    edge_index = torch.randint(0, nodes, (2, edges), generator=g)
    edge_type = torch.randint(0, relations, (edges,), generator=g)
    model = RGCNLayer(nodes, relations).eval()
    return Example(
        "rgcn",
        "RGCN layer in plain torch ops (64 nodes, 256 edges, 4 relations)",
        model,
        (x, edge_index, edge_type),
    )


#: Built-in examples: name -> factory(seed).
EXAMPLES: dict[str, Callable[[int], Example]] = {
    "bert": _bert,
    "gpt_moe": _gpt_moe,
    "gcn": _gcn,
    "rgcn": _rgcn,
}


def load_example(name: str, seed: int = 0) -> Example:
    """Build a built-in example.

    Raises:
        ValueError: if ``name`` is not a built-in example.
    """
    if name not in EXAMPLES:
        raise ValueError(expected("examples", "model", "one of " + ", ".join(EXAMPLES), name))
    return EXAMPLES[name](seed)


def call_factory(spec: str) -> tuple[Any, str, str]:
    """Import ``path/to/file.py`` and call its ``factory()`` (no arguments).

    The loader shared by the commands that take a user model (``ir``, ``stitch``, ``sparse``).

    Returns:
        What the factory returned, the factory's name and the file's name.

    Raises:
        ValueError: if ``spec`` is not ``file.py:factory``, the file is missing or has no such
            function.
        FusekitError: the file does not import (a syntax error, a missing module, an
            exception at import) or the factory raises; one line naming the file and the error.
    """
    path_text, _, factory_name = spec.rpartition(":")
    path = Path(path_text)
    if not path_text or not path.is_file():
        raise ValueError(
            expected("examples", "model", "a built-in name or an existing file.py:factory", spec)
        )
    module_spec = importlib.util.spec_from_file_location(f"_fusekit_user_{path.stem}", path)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(expected("examples", "model", "a Python file", str(path)))
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # the user's code: any failure is reported, not raised
        raise FusekitError(f"{path}: cannot import it: {_describe(e)}") from e
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise ValueError(
            expected("examples", "factory", f"a function in {path.name}", factory_name)
        )
    try:
        made = factory()
    except (Exception, SystemExit) as e:
        raise FusekitError(f"{path}: {factory_name}() raised {_describe(e)}") from e
    return made, factory_name, path.name


def _describe(e: BaseException) -> str:
    """``"SyntaxError: invalid syntax (line 3)"``: an exception from a user's file, briefly."""
    if isinstance(e, SyntaxError):
        return f"{type(e).__name__}: {e.msg} (line {e.lineno})"
    text = str(e).strip()
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def as_example(made: Any, factory_name: str, file_name: str) -> Example | None:
    """``made`` as an :class:`Example` (it is one, or a ``(module, args)`` pair), else ``None``."""
    if isinstance(made, Example):
        return made
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module):
        return Example(factory_name, f"{factory_name} from {file_name}", made[0], tuple(made[1]))
    return None


def load_model(spec: str, seed: int = 0) -> Example:
    """Load a built-in example by name, or a user model from ``path/to/file.py:factory``.

    The factory takes no arguments and returns an :class:`Example` or a ``(module, args)`` pair.

    Raises:
        ValueError: if the name is unknown, the file or factory is missing, or the factory
            returns something else.
    """
    if ":" not in spec:
        return load_example(spec, seed)
    made, factory_name, file_name = call_factory(spec)
    example = as_example(made, factory_name, file_name)
    if example is not None:
        return example
    raise ValueError(
        expected(
            "examples",
            f"{factory_name}()",
            "an Example or a (module, args) pair",
            type(made).__name__,
        )
    )
