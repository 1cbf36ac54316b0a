r"""The compute units: cycles and energy of one tile primitive, and the ideal compute cycles.

COMET's compute classes: a systolic array (ScaleSim's ``(2R + C + T - 2)`` per fold), a vector
SIMD unit (cycles per instruction times instructions) and a fixed-latency GEMM unit. Energy per
access: MACs times ``MAC_PJ`` on an array, ``width`` lanes times the op's energy on a SIMD unit,
``compute_energy`` per instance on any other unit.
"""

from __future__ import annotations

import math

from fusekit.accel.compat import Compat
from fusekit.accel.tree import Hierarchy, Level, TreeMapping, TreeNode, pre_order
from fusekit.accel.tree_model.records import Access, TreeModelError, f32

#: COMET's SIMD cycles per instruction, by op type.
SIMD_CYCLES = {"div": 1, "exp": 3, "add": 1, "mult": 1, "max": 1, "sqrt": 1, "softmax": 1}
#: COMET's SIMD energy per lane-op, by op type.
SIMD_PJ = {"div": 0.8, "exp": 3.86, "add": 0.11, "mult": 0.64, "max": 0.0025, "sqrt": 2.84,
           "softmax": 1.0}  # fmt: skip
#: COMET's energy of one MAC.
MAC_PJ = 0.2296


def simd_instructions(level: Level, op: TreeNode) -> int:
    r"""SIMD instructions of one tile primitive: one per ``width x T`` elements.

    .. math:: n_{instr} = \lceil |prim| / (width \cdot T) \rceil

    with ``T`` the product of the op's reduction factors (COMET's float32 arithmetic).
    """
    width = int(level.attrs.get("computeWidth", 8))
    red = f32(1)
    for d in op.red_dims:
        red = f32(red * f32(op.red_factors[d]))
    elems = math.prod(op.primitive.values())
    return math.ceil(f32(f32(elems) / f32(f32(width) * red)))


def simd_op_cycles(level: Level, op_type: str, from_arch: bool = False) -> int:
    """Cycles of one SIMD instruction of ``op_type``.

    COMET's constants (row reductions: ``ceil(log2 width)``), or with ``from_arch`` the unit's
    ``op_cycles`` where it gives one.
    """
    given = level.attrs.get("op_cycles") if from_arch else None
    if isinstance(given, dict) and op_type in given:
        return int(given[op_type])
    if op_type in ("rowsum", "rowmax"):
        return math.ceil(math.log2(int(level.attrs.get("computeWidth", 8))))
    if op_type in SIMD_CYCLES:
        return SIMD_CYCLES[op_type]
    raise TreeModelError(f"op type {op_type} is not a SIMD op")


def systolic_cycles(level: Level, op: TreeNode) -> int:
    """ScaleSim cycles of one primitive: ``(2R + C + T - 2)`` per fold over the arrays.

    The folds tile the two dims left after dropping the reduction factor ``T`` over the
    ``R x C`` PEs of the ``num_sa_rows x num_sa_cols`` arrays.
    """
    a = level.attrs
    rows, cols = int(a.get("array_rows", 32)), int(a.get("array_cols", 32))
    if not op.red_dims:
        raise TreeModelError(f"{op.label}: a systolic GEMM needs reduction_dimensions")
    t = op.red_factors[op.red_dims[-1]]
    dims = list(reversed(op.primitive.values()))  # COMET's hash-map order
    if t not in dims:
        raise TreeModelError(f"{op.label}: reduction factor {t} is not a tile size")
    dims.remove(t)
    folds = 1
    pes = (rows * int(a.get("num_sa_rows", 1)), cols * int(a.get("num_sa_cols", 1)))
    for i, (v, n) in enumerate(zip(dims[:2], pes, strict=False)):
        folds *= math.ceil(v / n) if i < 2 else 1
    return folds * (2 * rows + cols + t - 2)


def gemm_unit_cycles(level: Level, op: TreeNode) -> int:
    """A fixed-function GEMM unit: start-up plus compute latency per 512 MACs."""
    a = level.attrs
    lat = int(a.get("startupLatency", 0))
    if len(op.primitive) == 3:
        if op.red_dims:
            extra = {16: 16, 8: 12, 4: 8, 2: 6}
            lat += extra.get(op.red_factors[op.red_dims[0]] // 256, 0)
        lat += math.prod(op.primitive.values()) // 512 * int(a.get("computeLatency", 0))
        return lat
    return int(a.get("computeLatency", 0))


def compute_cycles(level: Level, op: TreeNode, arch_costs: bool = False) -> int:
    """Cycles of one tile primitive of ``op`` on compute ``level`` (COMET's compute classes).

    Systolic array: :func:`systolic_cycles`; vector SIMD: the op's cycles per instruction
    (:func:`simd_op_cycles`; ``arch_costs``: the arch's where it gives them) times
    :func:`simd_instructions`; GEMM unit: :func:`gemm_unit_cycles`.
    """
    if level.kind == "SystolicArray":
        return systolic_cycles(level, op)
    if level.kind == "VSIMD":
        try:
            cyc = simd_op_cycles(level, op.op_type, arch_costs)
        except TreeModelError as e:
            raise TreeModelError(f"{op.label}: {e}") from None
        return cyc * simd_instructions(level, op)
    if level.kind == "GEMM":
        return gemm_unit_cycles(level, op)
    raise TreeModelError(f"{op.label}: no latency model for compute type {level.kind}")


def unit_energy_pj(a: Access, compat: Compat) -> float:
    """Energy of one access of a compute unit.

    The formula is picked by the unit's tile name (``SystolicArray``: MACs, ``VSIMD``: SIMD
    ops; compatibility deviation ``energy_by_name``) or, native, by its class (``mac``,
    ``simd``) where the arch names one; any other unit: ``compute_energy`` per instance.
    """
    spec = a.level
    cls = spec.attrs.get("class")
    if compat.energy_by_name or cls is None:  # a tree file may not name classes
        mac, simd = spec.kind == "SystolicArray", spec.kind == "VSIMD"
    else:
        mac, simd = cls == "mac", cls == "simd"
    if mac:
        return a.mac_pj
    if simd:
        width = int(spec.attrs.get("computeWidth", 8))
        given = None if compat.simd_constants else spec.attrs.get("op_energy_pj")
        if isinstance(given, dict) and a.op_type in given:
            per = float(f32(float(given[a.op_type])))
        elif a.op_type in ("rowsum", "rowmax"):
            base = 0.11 if a.op_type == "rowsum" else 0.0025
            per = float(f32(base * math.ceil(math.log2(width))))
        elif a.op_type in SIMD_PJ:
            per = float(f32(SIMD_PJ[a.op_type]))
        else:
            raise TreeModelError(f"op type {a.op_type} has no SIMD energy")
        return per * width
    return float(spec.attrs.get("compute_energy", 0)) * spec.instances


def total_nodes(arch: Hierarchy, name: str) -> int:
    """Instances of a level across the chip: its own times its widest parent's, up to the root."""
    n = arch.levels[name].instances
    while True:
        parents = [lv for lv in arch.levels.values() if name in lv.child_nets]
        if not parents:
            return n
        top = max(parents, key=lambda lv: lv.instances)
        n *= top.instances
        name = top.name


def ideal_op_cycles(inp: TreeMapping, arch_costs: bool = False) -> dict[str, int]:
    r"""COMET's ideal compute cycles per op: a function of the tree alone, no stage run.

    .. math::

        t_{op} = \frac{(|\text{op}| / |\text{primitive}|) \, t_{prim}}{n_{units}}

    with ``|op|`` the op's iteration space, ``t_prim`` one primitive's cycles on its unit and
    ``n_units`` the unit's instances across the chip. Their sum is the mapper's lower bound on
    the total cycles (:meth:`fusekit.accel.comet.space.Space.lower_bound`). ``arch_costs``: SIMD
    cycles from the arch where it gives them (the native model, :func:`compute_cycles`).
    """
    prob, arch = inp.problem, inp.arch
    ideal: dict[str, int] = {}
    for node in pre_order(inp.mapping):
        if not node.is_leaf_tile:
            continue
        op = node.children[0]
        unit = arch.levels[node.childs[0]]
        spec = prob.ops[op.op_name]
        space = math.prod(prob.sizes[d] for d in (spec.dims or range(len(prob.dims))))
        steps = space // math.prod(op.primitive.values())
        cyc = compute_cycles(unit, op, arch_costs)
        ideal[op.op_name] = steps * cyc // total_nodes(arch, unit.name)
    return dict(sorted(ideal.items()))
