"""Index sets of the three g-mm-s families, for the CLI, the tour and the benchmarks.

=========  =======================  ===================  =====================  ==============
family     gather ``g``             segment ``s``        scatter ``d``          scale ``c``
=========  =======================  ===================  =====================  ==============
RGCN       source node of an edge   relation (and its    target node            none (mean
                                    inverse)                                    reduce)
conv       input voxel              kernel offset        output voxel           none
MoE        token                    expert               token                  gate weight
=========  =======================  ===================  =====================  ==============

The synthetic generators state their skew: RGCN relation sizes follow a Zipf law (exponent 1.2,
as the triples per relation of AIFB and MUTAG roughly do: the largest relation holds ~15% of the
edges) and edge endpoints a power law over nodes; conv voxels lie on a few random planes (the
surfaces a LiDAR sees), with a submanifold 3x3x3 kernel map; MoE tokens pick ``top_k`` distinct
experts with Zipf(1.0) popularity. :func:`kernel_map` also turns real voxel coordinates into a
kernel map (``benchmarks/gms_kernels.py`` uses a real LiDAR scan) through the plain-torch
probe of :func:`fusekit.gms.kmap.reference.probe_pairs`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import torch

from fusekit.errors import expected
from fusekit.gms.kmap.reference import probe_pairs
from fusekit.gms.problem import GMSProblem

SHAPES: tuple[str, ...] = ("rgcn", "conv", "moe")


@dataclass(frozen=True, slots=True, eq=False)
class Workload:
    """The indices of one problem and the sizes its operands need.

    Attributes:
        name: a short label, e.g. ``"rgcn-synthetic"``.
        gather: ``[E]`` int64.
        segment: ``[E]`` int64.
        scatter: ``[E]`` int64.
        n_in: rows of ``x``.
        n_out: output rows.
        num_segments: weight matrices.
        reduce: the family's reduce (RGCN: mean; conv, MoE: sum).
        scale: ``[E]`` per-pair factor (MoE gates), or None.
    """

    name: str
    gather: torch.Tensor
    segment: torch.Tensor
    scatter: torch.Tensor
    n_in: int
    n_out: int
    num_segments: int
    reduce: str
    scale: torch.Tensor | None = None

    @property
    def num_pairs(self) -> int:
        """``E``."""
        return int(self.gather.shape[0])

    def problem(self) -> GMSProblem:
        """The validated :class:`~fusekit.gms.GMSProblem` of these indices."""
        return GMSProblem.create(
            self.gather,
            self.segment,
            self.scatter,
            self.n_out,
            num_segments=self.num_segments,
            reduce=self.reduce,
        )


def rgcn_from_triples(
    name: str, head: torch.Tensor, relation: torch.Tensor, tail: torch.Tensor, nodes: int
) -> Workload:
    """An RGCN layer's pairs from (head, relation, tail) triples, with inverse relations.

    Each triple gives two pairs, as in R-GCN (Schlichtkrull et al., ESWC 2018): head -> tail with
    relation ``r`` and tail -> head with ``r + R``.
    """
    relations = int(relation.max()) + 1 if relation.numel() else 0
    return Workload(
        name=name,
        gather=torch.cat([head, tail]).long(),
        segment=torch.cat([relation, relation + relations]).long(),
        scatter=torch.cat([tail, head]).long(),
        n_in=nodes,
        n_out=nodes,
        num_segments=2 * relations,
        reduce="mean",
    )


def rgcn_shaped(
    seed: int = 0, nodes: int = 8_000, relations: int = 45, triples: int = 29_000
) -> Workload:
    """A synthetic knowledge graph the size of AIFB (Zipf relations, power-law endpoints)."""
    gen = torch.Generator().manual_seed(seed)
    relation = _zipf(relations, triples, 1.2, gen)
    head = _zipf(nodes, triples, 0.8, gen)
    tail = _zipf(nodes, triples, 0.8, gen)
    perm = torch.randperm(nodes, generator=gen)  # popular nodes are not the low ids
    return rgcn_from_triples("rgcn-synthetic", perm[head], relation, perm[tail], nodes)


def kernel_map(name: str, coords: torch.Tensor, kernel: int = 3) -> Workload:
    """Submanifold sparse-convolution pairs (outputs on the input voxels).

    Input voxel ``i`` feeds output voxel ``j`` through offset ``o`` when
    ``coords[i] = coords[j] + o``.

    Args:
        name: the workload's label.
        coords: ``[N, 3]`` distinct integer voxel coordinates.
        kernel: odd kernel size (offsets in ``[-kernel // 2, kernel // 2]^3``).

    Returns:
        The workload (``kernel ** 3`` segments, sum reduce).
    """
    coords = coords.long()
    if coords.dim() != 2 or coords.shape[1] != 3 or kernel % 2 == 0:
        raise ValueError(
            expected("gms", "coords", "[N, 3] with an odd kernel", tuple(coords.shape))
        )
    low = coords.min(0).values - kernel
    span = int((coords.max(0).values - low).max()) + 2 * kernel
    probes = torch.stack([_linear(coords - low + o, span) for o in _offsets(kernel // 2)], 1)
    gather, segment, scatter = probe_pairs(_linear(coords - low, span), probes)
    n = coords.shape[0]
    return Workload(
        name=name,
        gather=gather,
        segment=segment,
        scatter=scatter,
        n_in=n,
        n_out=n,
        num_segments=kernel**3,
        reduce="sum",
    )


def conv_shaped(seed: int = 0, voxels: int = 20_000, planes: int = 6) -> Workload:
    """Voxels on a few random planes (LiDAR-like surfaces), submanifold 3x3x3 kernel map."""
    gen = torch.Generator().manual_seed(seed)
    per_plane = voxels // planes
    clouds = []
    for _ in range(planes):
        uv = torch.rand(per_plane, 2, generator=gen) * (per_plane**0.5) * 1.3
        normal = torch.nn.functional.normalize(torch.randn(3, generator=gen), dim=0)
        basis = torch.linalg.qr(torch.stack([normal, *torch.randn(2, 3, generator=gen)]).T).Q
        origin = torch.rand(3, generator=gen) * 40
        clouds.append(origin + uv @ basis[:, 1:].T)
    coords = torch.unique(torch.cat(clouds).floor().long(), dim=0)
    return kernel_map("conv-synthetic", coords)


def moe_shaped(seed: int = 0, tokens: int = 4_096, experts: int = 8, top_k: int = 2) -> Workload:
    """Top-k routing of tokens to experts with Zipf(1.0) expert popularity; gates sum to 1."""
    gen = torch.Generator().manual_seed(seed)
    popularity = 1.0 / torch.arange(1, experts + 1, dtype=torch.float64)
    logits = torch.log(popularity) + torch.randn(
        tokens, experts, generator=gen, dtype=torch.float64
    )
    top = torch.topk(logits, top_k, dim=1)
    gates = torch.softmax(top.values, dim=1).float()
    token = torch.arange(tokens).repeat_interleave(top_k)
    return Workload(
        name="moe-synthetic",
        gather=token,
        segment=top.indices.flatten(),
        scatter=token,
        n_in=tokens,
        n_out=tokens,
        num_segments=experts,
        reduce="sum",
        scale=gates.flatten(),
    )


def make(shape: str, seed: int = 0, scale: float = 1.0) -> Workload:
    """A synthetic workload of a family.

    Args:
        shape: ``"rgcn"``, ``"conv"`` or ``"moe"``.
        seed: the generator seed.
        scale: multiplies the default size (pairs scale about linearly).

    Returns:
        The workload.

    Raises:
        ValueError: unknown shape or non-positive scale.
    """
    if shape not in SHAPES:
        raise ValueError(expected("gms", "shape", " or ".join(SHAPES), repr(shape)))
    if not scale > 0:
        raise ValueError(expected("gms", "scale", "> 0", scale))
    if shape == "rgcn":
        return rgcn_shaped(
            seed, nodes=max(1, int(8_000 * scale)), triples=max(1, int(29_000 * scale))
        )
    if shape == "conv":
        return conv_shaped(seed, voxels=max(6, int(20_000 * scale)))
    return moe_shaped(seed, tokens=max(1, int(4_096 * scale)))


@dataclass(frozen=True, slots=True, eq=False)
class Sized:
    """A workload with operand widths: one problem of a tuning or selection study.

    Attributes:
        workload: the indices.
        k: columns of ``x``.
        m: columns of ``y``.
    """

    workload: Workload
    k: int
    m: int

    @property
    def label(self) -> str:
        """E.g. ``"rgcn-synthetic#3 E=12000 K=32 M=64 mean"``."""
        wl = self.workload
        return f"{wl.name} E={wl.num_pairs} K={self.k} M={self.m} {wl.reduce}"


def varied(seed: int, count: int) -> list[Sized]:
    """``count`` varied problems of the three families, for tuning and selection studies.

    Problem ``i`` uses family ``i mod 3`` (RGCN, conv, MoE) and a generator seeded with
    ``seed + i``: RGCN graphs of 1k-8k nodes, 10-90 relations, 2k-12k triples, reduce mean
    (60%), sum or max; LiDAR-like scans of 3k-10k voxels on 2-8 planes; MoE batches of
    256-2048 tokens over 4-32 experts, top-1/2/4. ``K`` and ``M`` are drawn independently from
    {16, 32, 64, 128} ({64, 128} for MoE). Sizes keep one call in the milliseconds on a laptop.

    Args:
        seed: the first generator seed (disjoint seed ranges give disjoint problem sets).
        count: how many problems.

    Returns:
        The problems, in order.
    """
    out = []
    for i in range(count):
        rng = random.Random(seed + i)
        family = SHAPES[i % 3]
        if family == "rgcn":
            wl = rgcn_shaped(
                seed + i,
                nodes=rng.randint(1_000, 8_000),
                relations=rng.choice((10, 20, 45, 90)),
                triples=rng.randint(2_000, 12_000),
            )
            wl = replace(wl, reduce=rng.choice(("mean", "mean", "mean", "sum", "max")))
            widths: tuple[int, ...] = (16, 32, 64, 128)
        elif family == "conv":
            wl = conv_shaped(seed + i, voxels=rng.randint(3_000, 10_000), planes=rng.randint(2, 8))
            widths = (16, 32, 64, 128)
        else:
            experts = rng.choice((4, 8, 16, 32))
            top_k = rng.choice([t for t in (1, 2, 4) if t <= experts])
            wl = moe_shaped(seed + i, rng.choice((256, 512, 1024, 2048)), experts, top_k)
            widths = (64, 128)
        wl = replace(wl, name=f"{wl.name}#{seed + i}")
        out.append(Sized(wl, rng.choice(widths), rng.choice(widths)))
    return out


def _zipf(n: int, count: int, exponent: float, gen: torch.Generator) -> torch.Tensor:
    weights = 1.0 / torch.arange(1, n + 1, dtype=torch.float64) ** exponent
    return torch.multinomial(weights, count, replacement=True, generator=gen)


def _linear(c: torch.Tensor, span: int) -> torch.Tensor:
    return (c[:, 0] * span + c[:, 1]) * span + c[:, 2]


def _offsets(half: int) -> list[torch.Tensor]:
    r = range(-half, half + 1)
    return [torch.tensor([i, j, k]) for i in r for j in r for k in r]
