"""COMET-format problem and mapping files for fusekit's built-in ops, written by fusekit.

The mappings have the shape of COMET's fused GEMM-Softmax mapping (its iterative mapper's
template): DRAM tiles (row blocks, the N split over the global buffers), a GB temporal tile,
then under it, one after another, the GEMM (N split over the cores, a core tile over the
systolic engine) and the SIMD ops in groups (N split over the cores, one OB tile per op over the
SIMD unit), with an all-reduce over N after each row reduction's group. The tiling is left to
the constants :func:`fusekit.accel.comet.space.constants` writes.

Ops: ``gemm``, ``gemm_softmax`` (ROWMAX, all-reduce(max), SUB, EXP1, all-reduce(add), ROWSUM,
DIV) and ``gemm_layernorm`` (ROWSUM1, all-reduce(add), SUB, SQR, all-reduce(add), ROWSUM2,
SQRT, DIV: no affine part, the 1/N not a separate op) and ``attention`` (the Softmax chain,
then ``O = H V`` on the GEMM engine over the same tiles, reduced over N, which the cores and
the global buffers split, so a reduction(add) of O onto one global buffer closes it; V's head
width is K's), and ``softmax`` and ``layernorm`` alone (the second kernel of an unfused
baseline: C read from DRAM).
COMET's placement of the second all-reduce on the exponentials (the tile) rather than on the
row sums is kept (README quirk 4).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROW, TILE = ("M",), ("M", "N")
SHAPES = {"A": ("M", "K"), "B": ("K", "N"), "V": ("N", "K"), "O": ("M", "K")}


@dataclass(frozen=True, slots=True)
class SimdOp:
    """One SIMD op: COMET type, inputs, output and its shape, the tensor its group lists."""

    name: str
    kind: str
    ins: tuple[str, ...]
    out: str
    out_shape: tuple[str, ...]
    gb_tensor: str


SOFTMAX = (
    (SimdOp("ROWMAX", "rowmax", ("C",), "D", ROW, "D"),),
    ("colop1", "max", "D"),
    (SimdOp("SUB", "add", ("C", "D"), "E", TILE, "D"),
     SimdOp("EXP1", "exp", ("E",), "F", TILE, "F")),
    ("colop2", "add", "F"),
    (SimdOp("ROWSUM", "rowsum", ("F",), "G", ROW, "F"),
     SimdOp("DIV", "div", ("F", "G"), "H", TILE, "H")),
)  # fmt: skip
LAYERNORM = (
    (SimdOp("ROWSUM1", "rowsum", ("C",), "D", ROW, "D"),),
    ("colop1", "add", "D"),
    (SimdOp("SUB", "add", ("C", "D"), "E", TILE, "D"),
     SimdOp("SQR", "mult", ("E",), "F", TILE, "F")),
    ("colop2", "add", "F"),
    (SimdOp("ROWSUM2", "rowsum", ("F",), "G", ROW, "F"),
     SimdOp("SQRT", "sqrt", ("G",), "S", ROW, "S"),
     SimdOp("DIV", "div", ("E", "S"), "H", TILE, "H")),
)  # fmt: skip
CHAINS: dict[str, tuple[Any, ...]] = {"gemm": (), "gemm_softmax": SOFTMAX,
                                      "gemm_layernorm": LAYERNORM,
                                      "attention": SOFTMAX, "softmax": SOFTMAX,
                                      "layernorm": LAYERNORM}  # fmt: skip
#: the chains alone: the second kernel of an unfused baseline, reading C from DRAM (DRAM -> GB ->
#: OB, loaded by the first op's group), as the oracle's authored ``*_only`` runs are built
ALONE = ("softmax", "layernorm")
#: attention's second GEMM, ``O[M,K] = H[M,N] V[N,K]`` (the value head width is K's), reduced
#: over N, which the cores and the global buffers split: a reduction(add) of O onto one global
#: buffer follows it (only the one that writes O back needs the sum)
PV = ("GEMM2", ("H", "V"), "O")


def _shape(t: str, ops: list[SimdOp]) -> tuple[str, ...]:
    if t in SHAPES:
        return SHAPES[t]
    if t == "C":
        return TILE
    return next(o.out_shape for o in ops if o.out == t)


def _factors(n: int, m: str, nn: str, k: str) -> str:
    return f"M=[{','.join([m] * n)}] N=[{','.join([nn] * n)}] K=[{','.join([k] * n)}]"


def _tile(
    kind: str,
    tensors: list[str],
    tags: list[str],
    target: list[str],
    child: list[str],
    bits: int,
    factors: list[str],
    perm: str,
    sub: list[Any] | None = None,
) -> dict[str, Any]:
    n = len(tensors)
    node: dict[str, Any] = {
        "node_type": "DataMovement_Tile", "target": target, "type": kind, "tensors": tensors,
        "precision": [bits] * n, "rmw": [False] * n, "wb_output": [i == n - 1 for i in range(n)],
        "tag": tags, "factors": factors, "permutation": perm, "child": child,
    }  # fmt: skip
    if sub:
        node["subtree"] = sub
    return node


def _spatial(n: int, m: str = "1", k: str = "1", level: str = "GB") -> list[str]:
    return [_factors(n, m, f"N_{level}_spatial_{xy}", k) for xy in ("X", "Y")]


def _seq() -> dict[str, str]:
    return {"node_type": "inter_tile_binding", "binding": "sequential"}


def _gemm(
    name: str = "GEMM",
    tensors: tuple[str, ...] = ("A", "B", "C"),
    red: str = "red_dim",
    factor: str = "red_factor",
    bits: int = 8,
) -> dict[str, Any]:
    op = {
        "node_type": "Operation", "type": "GEMM", "tensors": list(tensors),
        "TilePrimitive": "M=M_Compute N=N_Compute K=K_Compute",
        "TileSteps": {t: "M=M_Compute N=N_Compute K=K_Compute" for t in tensors},
        "name": name,
        "compute_attributes": {"reduction_dimensions": [red],
                               "reduction_factors": [factor], "rmw": True, "specd": True},
    }  # fmt: skip
    core = _tile("temporal", list(tensors), [name] * 3, ["IB", "WB", "OB"],
                 ["GEMMEngine"] * 3, bits,
                 [_factors(3, "M_Core_temporal", "N_Core_temporal", "K_Core_temporal")], "MKN",
                 [op])  # fmt: skip
    return _tile("spatial", list(tensors), [name] * 3, ["GB"] * 3, ["IB", "WB", "OB"], bits,
                 _spatial(3), "KNM", [core])  # fmt: skip


def _allreduce(tag: str, red: str, tensor: str, kind: str = "allreduce") -> dict[str, Any]:
    return {
        "node_type": "CollectiveOperation", "tag": tag, "target": "GB", "type": kind,
        "reduction_op": red, "dimension": "N", "src": ["GB"], "dest": ["GB"],
        "wb_output": False, "in_tensor": tensor, "out_tensor": tensor, "precision": 16,
        "child": "GB",
    }  # fmt: skip


def _simd_leaf(op: SimdOp) -> dict[str, Any]:
    tensors = [*op.ins, op.out]
    leaf = {
        "node_type": "Operation", "type": op.kind, "tensors": tensors, "name": op.name,
        "TilePrimitive": "M=M_SM N=N_SM K=K_SM",
        "TileSteps": {t: "M=M_SM N=N_SM K=K_SM" for t in tensors},
        "compute_attributes": {"reduction_dimensions": ["red_dim_simd"],
                               "reduction_factors": ["red_dim_simd_val"], "rmw": True,
                               "specd": True},
    }  # fmt: skip
    n = len(tensors)
    return _tile("temporal", tensors, [op.name] * n, ["OB"] * n, ["SE"] * n, 16,
                 [_factors(n, "M_SE", "N_SE", "K_SE")], "MKN", [leaf])  # fmt: skip


def mapping(op: str) -> dict[str, Any]:
    """The ``mapping.yaml`` document of built-in op ``op``."""
    if op not in CHAINS:
        raise ValueError(f"comet templates: expected 'op' in {sorted(CHAINS)} (got {op!r})")
    chain = CHAINS[op]
    ops = [o for g in chain if not isinstance(g[0], str) for o in g]
    last = ops[-1].name if ops else "GEMM"
    out = ops[-1].out if ops else "C"
    alone = op in ALONE
    children: list[Any] = [_seq(), _gemm(), _seq()] if ops else [_gemm()]
    gb_t = ["A", "B"] + [o.gb_tensor for o in ops] if ops else ["A", "B", "C"]
    gb_tags = ["GEMM", "GEMM"] + [o.name for o in ops] if ops else ["GEMM"] * 3
    if alone:
        children = [_seq()]
        gb_t, gb_tags = ["C", *gb_t[2:]], [ops[0].name, *gb_tags[2:]]
    for i, group in enumerate(chain):
        if isinstance(group[0], str):  # a collective after the group on its left
            tag, red, tensor = group
            children.append(_allreduce(tag, red, tensor))
            if i + 1 < len(chain) - 1 or op == "attention":  # the last child reads 2 left
                children.append(_seq())
            continue
        leaves = [_simd_leaf(o) for o in group]
        sub = leaves if len(leaves) == 1 else [_seq(), *leaves]
        names = [o.gb_tensor for o in group]
        tags = [o.name for o in group]
        if alone and i == 0:  # C comes in from DRAM with the first op
            names, tags = ["C", *names], [group[0].name, *tags]
        g = len(names)
        children.append(
            _tile("spatial", names, tags, ["GB"] * g, ["OB"] * g, 16, _spatial(g), "MKN", sub)
        )
        if i + 1 < len(chain):
            children.append(_seq())
    io, tags = ["A", "B", out], ["GEMM", "GEMM", last]
    childs = ["IB", "WB"] + ["OB"] * (len(gb_t) - 2)
    if alone:
        io, tags, childs = ["C", out], [ops[0].name, last], ["OB"] * len(gb_t)
    if op == "attention":  # P V after the softmax, then the all-reduce of its partial sums
        name, (h, v), o = PV
        children += [_seq(), _gemm(name, (h, v, o), "red_dim_pv", "red_factor_pv", 16), _seq(),
                     _allreduce("colop3", "add", o, "reduction")]  # fmt: skip
        gb_t, gb_tags, childs = [*gb_t, v, o], [*gb_tags, name, name], [*childs, "WB", "OB"]
        io, tags = ["A", "B", v, o], ["GEMM", "GEMM", name, name]
    n = len(gb_t)
    gb = _tile("temporal", gb_t, gb_tags, ["GB"] * n, childs, 8,
               [_factors(n, "M_A_GB_temporal", "N_A_GB_temporal", "K_A_GB_temporal")], "KNM",
               children)  # fmt: skip
    k = len(io)
    dram_s = _tile("spatial", io, tags, ["DRAM"] * k, ["GB"] * k, 8, _spatial(k, level="DRAM"),
                   "KNM", [gb])  # fmt: skip
    m_rows = ",".join(["M_A_DRAM_temporal"] * (k - 1) + ["M_H_DRAM_temporal"])
    ones = ",".join(["1"] * k)
    rows = f"M=[{m_rows}] N=[{ones}] K=[{ones}]"
    return {"mapping": _tile("temporal", io, tags, ["DRAM"] * k, ["GB"] * k, 8, [rows], "KNM",
                             [dram_s])}  # fmt: skip


def problem(op: str) -> dict[str, Any]:
    """The ``problem.yaml`` document of built-in op ``op``."""
    if op not in CHAINS:
        raise ValueError(f"comet templates: expected 'op' in {sorted(CHAINS)} (got {op!r})")
    ops = [o for g in CHAINS[op] if not isinstance(g[0], str) for o in g]

    def spec(name: str, ins: tuple[str, ...], out: str) -> dict[str, Any]:
        tensors = []
        for t in [*ins, out]:
            entry: dict[str, Any] = {"name": t, "projection": [[[d]] for d in _shape(t, ops)]}
            if t == out:
                entry["read-write"] = True
            tensors.append(entry)
        return {"name": name, "ins": ",".join(ins), "out": out, "dimensions": ["M", "N", "K"],
                "tensors": tensors}  # fmt: skip

    opers = [spec("GEMM", ("A", "B"), "C")] + [spec(o.name, o.ins, o.out) for o in ops]
    ins, outs = "A,B", ops[-1].out if ops else "C"
    if op in ALONE:
        opers, ins = opers[1:], "C"
    if op == "attention":
        name, pv_ins, outs = PV
        opers.append(spec(name, pv_ins, outs))
        ins = "A,B,V"
    body = {
        "io": {"ins": ins, "outs": outs},
        "dimensions": ["M", "N", "K"],
        "instance": {"M": "M", "N": "N", "K": "K"},
        "operations": opers,
    }
    return {"problem": body}


def write_template(op: str, out_dir: str | Path, arch: dict[str, Any]) -> Path:
    """Write ``arch.yaml``, ``problem.yaml`` and ``mapping.yaml`` of ``op`` into ``out_dir``."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    dump = {"sort_keys": False, "default_flow_style": None, "width": 100}
    (d / "arch.yaml").write_text(yaml.safe_dump(arch, **dump))
    (d / "problem.yaml").write_text(yaml.safe_dump(problem(op), **dump))
    (d / "mapping.yaml").write_text(yaml.safe_dump(mapping(op), **dump))
    return d


def _indexed(t: str, ops: list[SimdOp]) -> str:
    return f"{t}[{','.join(d.lower() for d in _shape(t, ops))}]"


def formulas(op: str) -> list[tuple[str, str, str]]:
    """Built-in op ``op``'s steps in tree order: (name, unit, index notation).

    ``("ROWMAX", "SIMD", "D[m] = max_n C[m,n]")``; the collectives as
    ``("allreduce(max)", "NoC", "D[m] reduced (max) across the N split")``.
    """
    if op not in CHAINS:
        raise ValueError(f"comet templates: expected 'op' in {sorted(CHAINS)} (got {op!r})")
    chain = CHAINS[op]
    ops = [o for g in chain if not isinstance(g[0], str) for o in g]
    out = [] if op in ALONE else [("GEMM", "GEMM engine", "C[m,n] = sum_k A[m,k] B[k,n]")]
    sign = {"SUB": "-"}
    for group in chain:
        if isinstance(group[0], str):
            _, red, tensor = group
            t = _indexed(tensor, ops)
            out.append((f"allreduce({red})", "NoC", f"{t} reduced ({red}) across the N split"))
            continue
        for o in group:
            ins = [_indexed(t, ops) for t in o.ins]
            if o.kind in ("rowmax", "rowsum"):
                rhs = f"{'max' if o.kind == 'rowmax' else 'sum'}_n {ins[0]}"
            elif o.kind in ("exp", "sqrt"):
                rhs = f"{o.kind}({ins[0]})"
            elif o.kind == "mult" and len(ins) == 1:
                rhs = f"{ins[0]} * {ins[0]}"
            else:
                symbol = {"add": sign.get(o.name, "+"), "mult": "*", "div": "/"}[o.kind]
                rhs = f" {symbol} ".join(ins)
            out.append((o.name, "SIMD", f"{_indexed(o.out, ops)} = {rhs}"))
    if op == "attention":
        out += [("GEMM2", "GEMM engine", "O[m,k] = sum_n H[m,n] V[n,k]"),
                ("reduction(add)", "NoC", "O[m,k] reduced (add) across the N split")]  # fmt: skip
    return out
