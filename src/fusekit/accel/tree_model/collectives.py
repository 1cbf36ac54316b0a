r"""Stage 4's collectives: memory cycles, network cycles and energy of a collective node.

COMET's collective model on the level the collective runs at: ``n_src`` sources send ``r``
elements each (``w`` per sink after it), ``p`` bytes each, through link ports of ``BW`` bytes
per cycle. Per kind (``k`` the spatial factor, ``n_src`` unless given):

* gather: ``max(ceil((n-1) w p / (BW_w n)), ceil(r p / BW_r))``;
* broadcast: ``max(ceil(r p / BW_r) [x n_dst without in-network broadcast], ceil(r p / BW_w))``;
* reduction: ``ceil(r p / BW_r + 2 r p / BW_w)`` in-network, else ``(n-1)`` serial steps;
* all-gather, all-reduce: ``k`` rounds of the gathered (reduced) data;
* scatter: ``ceil((k-1) r p / (BW_r k)) + ceil(w p / (k BW_w))`` with ``k = n_dst``.

Memory energy: blocks read and written at the level's ``child_read_energy`` and
``child_write_energy``; network cycles and energy from :mod:`fusekit.accel.noc`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

from fusekit.accel.noc import link_energy_pj, link_latency
from fusekit.accel.tree import Hierarchy, Network, TreeMapping, TreeNode
from fusekit.accel.tree_model.records import Nests, TreeModelError

#: Cycles per reduced element on the way (COMET's constant).
RED_COST = 1


class Link(NamedTuple):
    """What a collective's memory cycles and energy depend on.

    Attributes:
        rsize: elements each source reads.
        wsize: elements each sink writes.
        scale: bytes per element.
        n_src: source instances.
        n_dst: sink instances.
        sf: the spatial factor (``n_src`` unless the node gives one).
        lr: link read bandwidth (bytes per cycle).
        lw: link write bandwidth (bytes per cycle).
        port: network port bandwidth (bytes per cycle).
        mw: the level's child write bandwidth (bytes per cycle).
        block: bytes per access block.
        rc: energy of reading one block.
        wc: energy of writing one block.
        broadcast: the network broadcasts.
        reduction: the network reduces.
    """

    rsize: int
    wsize: int
    scale: float
    n_src: int
    n_dst: int
    sf: int
    lr: float
    lw: float
    port: int
    mw: float
    block: float
    rc: float
    wc: float
    broadcast: bool
    reduction: bool


#: Memory cycles, read energy (pJ), write energy (pJ).
MemoryCost = tuple[float, float, float]
#: Cycles, memory energy (pJ), network energy (pJ) of a collective.
CollectiveCost = tuple[int, float, float]
#: All a collective's cost depends on: network, kind, reduction op, generalised network, link.
CostKey = tuple[Network, str, str, bool, Link]
#: Costs already computed (a tiling sweep meets the same collectives again), and their bound.
_COSTS: dict[CostKey, CollectiveCost] = {}
_MAX_COSTS = 4096


def collective_cost(
    inp: TreeMapping, nests: Nests, node: TreeNode, generalise: bool
) -> CollectiveCost:
    """Cycles, memory energy and network energy of collective ``node`` (module docstring).

    Cached by all the cost depends on (:data:`CostKey`).
    """
    arch, prob = inp.arch, inp.problem
    lv = arch.levels[node.target]
    net = lv.link_net
    if net is None:
        raise TreeModelError(f"{node.label}: {lv.name} has no link network (link_transfers)")
    proj = prob.projection("", node.in_tensor)
    ext_in = nests.col_in[node.id][-1]
    ext_out = nests.col_out[node.id][-1]
    for d in sorted(range(len(prob.dims)), key=lambda d: prob.dims[d]):
        if d not in ext_in:
            raise TreeModelError(f"{node.label}: no extent of dim {prob.dims[d]}")
    rsize = math.prod(ext_in[d] for d in proj)
    scale = node.precision / 8.0
    n_src = _instances(arch, node.src)
    a = lv.attrs
    link = Link(
        rsize, math.prod(ext_out[d] for d in proj), scale, n_src, _instances(arch, node.dest),
        node.spatial_factor or n_src, float(lv.bw("link_read_bw")), float(lv.bw("link_write_bw")),
        net.port_bw, float(lv.bw("child_write_bw")), float(lv.width_bytes()),
        float(a.get("child_read_energy", 0)), float(a.get("child_write_energy", 0)),
        net.broadcast, net.reduction,
    )  # fmt: skip
    key = (net, node.col_type, node.red_op, generalise, link)
    hit = _COSTS.get(key)
    if hit is None:
        hit = _link_cost(node, *key)
        if len(_COSTS) >= _MAX_COSTS:
            _COSTS.clear()
        _COSTS[key] = hit
    return hit


def _link_cost(
    node: TreeNode, net: Network, kind: str, red_op: str, generalise: bool, link: Link
) -> CollectiveCost:
    """Cycles (memory plus network), memory energy and network energy of a collective."""
    n_src, rsize, scale = link.n_src, link.rsize, link.scale
    net_t = link_latency(net, kind, rsize, 1, n_src, scale, red_op, generalise)
    net_e = link_energy_pj(net, kind, rsize, 1, n_src, scale, red_op, generalise)
    model = KINDS.get(kind, scatter)
    if model is scatter and link.n_dst <= 1:
        raise TreeModelError(f"{node.label}: a scatter needs more than one destination")
    mem, read_pj, write_pj = model(link)
    return int(mem) + int(net_t), read_pj + write_pj, net_e


def _instances(arch: Hierarchy, levels: list[str]) -> int:
    return math.prod(arch.levels[s].instances for s in levels)


def gather(c: Link) -> MemoryCost:
    """Every source's data to one sink, over at most two ports."""
    ports = min(2, c.n_src - 1)
    lr, lw = min(c.lr, c.port), min(min(c.lw, ports * c.port), c.mw)
    mem = max(math.ceil((c.n_src - 1) * c.wsize * c.scale / (lw * c.n_src)),
              math.ceil(c.rsize * c.scale / lr))  # fmt: skip
    re_ = c.rsize * c.scale / c.block * c.rc
    we = (c.n_src - 1) * c.rsize * c.scale / c.block * c.wc
    return mem, re_, we


def broadcast(c: Link) -> MemoryCost:
    """One source's data to every sink: read once in-network, once per sink otherwise."""
    lr, lw = min(c.lr, c.port), min(c.lw, c.port)
    tw = math.ceil(c.rsize * c.scale / lw)
    we = (c.n_dst - 1) * c.rsize * c.scale / c.block * c.wc
    if c.broadcast:
        tr = math.ceil(c.rsize * c.scale / lr)
        re_ = c.rsize * c.scale / c.block * c.rc
    else:
        tr = math.ceil(c.rsize * c.scale / lr * c.n_dst)
        re_ = c.n_dst * c.rsize * c.scale / c.block * c.rc
    return max(tr, tw), re_, we


def reduction(c: Link) -> MemoryCost:
    """Every source's data reduced into one sink: in-network, or ``n - 1`` serial steps."""
    lr, lw = min(c.lr, c.port), min(c.lw, c.port)
    rb, wb = c.rsize * c.scale / lr, c.rsize * c.scale / lw
    re_ = c.rsize * c.scale * c.n_src / c.block * c.rc
    we = c.rsize * c.scale / c.block * c.wc
    if c.reduction:
        return math.ceil(rb + wb + wb * RED_COST), re_, we
    mem = math.ceil(max(rb * (c.n_src - 1), wb * (c.n_src - 1)) + wb * RED_COST)
    return mem, re_ * (c.n_src - 1), we * (c.n_src - 1)


def allgather(c: Link) -> MemoryCost:
    """Every source's data to every source: ``sf`` rounds of the gathered data."""
    lr, lw = min(c.lr, c.port), min(c.lw, c.port)
    rb, wb = c.rsize * c.n_src * c.scale / lr, c.rsize * c.n_src * c.scale / lw
    re_ = c.rsize * c.n_src * c.scale / c.block * c.rc
    we = c.rsize * c.n_src * c.scale / c.block * c.wc * c.sf
    if c.broadcast:
        return math.ceil(wb * c.sf), re_, we
    return math.ceil(max(math.ceil(wb * c.sf), math.ceil(rb * c.sf))), re_ * c.sf, we


def allreduce(c: Link) -> MemoryCost:
    """Every source's data reduced into every source: a reduction, then a broadcast."""
    lr, lw = min(c.lr, c.port), min(c.lw, c.port)
    rb, wb = c.rsize * c.n_src * c.scale / lr, c.wsize * c.n_src * c.scale / lw
    re_ = c.rsize * c.n_src * c.scale / c.block * c.rc
    we = c.wsize * c.n_src * c.scale / c.block * c.wc
    if c.broadcast and c.reduction:
        return math.ceil(wb + rb + wb * RED_COST), re_, we
    if c.broadcast:
        return math.ceil((wb + rb) * c.sf + wb * RED_COST), re_ * c.sf, we * c.sf
    return math.ceil((2 * rb + wb) * c.sf + wb * RED_COST), re_ * (c.sf * 2), we * c.sf


def scatter(c: Link) -> MemoryCost:
    """One source's data split over the ``n_dst`` sinks, over at most two ports."""
    sf = c.n_dst
    ports = min(2, c.n_dst - 1)
    lr, lw = min(c.lr, ports * c.port), min(c.lw, c.port)
    mem = (math.ceil((sf - 1) * c.rsize * c.scale / (lr * sf))
           + math.ceil(c.wsize * c.scale / (sf * lw)))  # fmt: skip
    re_ = (sf - 1) * c.rsize * c.scale / (sf * c.block) * c.rc
    we = c.wsize * c.scale / c.block * c.wc
    return mem, re_, we


#: The memory model of each collective kind (any other kind is a scatter, as in COMET).
KINDS: dict[str, Callable[[Link], MemoryCost]] = {
    "gather": gather,
    "broadcast": broadcast,
    "reduction": reduction,
    "allgather": allgather,
    "allreduce": allreduce,
    "scatter": scatter,
}
