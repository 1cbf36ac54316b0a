"""The compatibility switch: COMET's defects, each named, each reproducible on its own.

``Compat()`` reproduces the COMET binary (what its outputs are checked against);
``Compat.native()`` switches every defect off; ``Compat().without(name)`` switches one off, which
is how ``benchmarks/comet_compat.py`` measures each deviation's effect on the shared runs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

#: name -> what COMET does (on) and what the native model does instead (off)
DEVIATIONS: dict[str, str] = {
    "mesh_table": "collective hops and data come from a table of 1x1/2x2/4x4/16x16 sub-meshes; any "
    "other shape aborts (README quirk 1) -- native: 2(n-1) hops and data on an n x n sub-mesh",
    "binding_misread": "a tile whose left sibling is another tile reads that tile's loop type as "
    "its binding (temporal -> parallel, spatial -> sharing) -- native: the nearest binding on "
    "the left",
    "full_double_buffer": "the fit check gives a double-buffered level its whole capacity "
    "(README quirk 3) -- native: half of it per buffer",
    "unit_sum_total": "total cycles are the sum of the per-unit CS/OS/TMW table, not the root's "
    "latency (README quirk 2) -- native: the root node's cycles",
    "unscaled_os": "the table's OS column adds a node's exposed transfer time once, while the "
    "total counts it once per parent iteration -- native: OS times the parent iterations",
    "tag_instances": "a node's instance count (the spatial fan-out above it) is tracked per op "
    "tag, so an op whose tag a spatial ancestor does not list is charged for fewer units: SIMD "
    "energy of the first Softmax op depends on which tensors its GB-spatial node lists (README "
    "quirk 9; in the shipped mappings every SIMD op but DIV loses the DRAM-spatial fan-out) -- "
    "native: the product of every spatial ancestor's fan-out",
    "energy_by_name": "a compute unit's energy formula is picked by its tile's name "
    "(SystolicArray: MACs, VSIMD: SIMD ops; any other name, e.g. example_run's GEMM: "
    "compute_energy per instance; README quirk 6) -- native: by its class (mac, simd)",
    "simd_constants": "SIMD cycles and energies per op are constants of COMET's code (README "
    "quirk 10): an arch cannot give its own -- native: the SIMD unit's `op_cycles` and "
    "`op_energy_pj` maps (op type -> cycles per instruction, pJ per lane) where the arch gives "
    "them, COMET's constants for the ops they leave out",
    "port_overwrite": "when merging levels, the first level's write-port stalls overwrite its "
    "read-port stalls instead of taking the larger -- native: the larger",
}


@dataclass(frozen=True, slots=True)
class Compat:
    """Which of COMET's defects to reproduce (all on: the COMET binary)."""

    mesh_table: bool = True
    binding_misread: bool = True
    full_double_buffer: bool = True
    unit_sum_total: bool = True
    unscaled_os: bool = True
    port_overwrite: bool = True
    tag_instances: bool = True
    energy_by_name: bool = True
    simd_constants: bool = True

    @classmethod
    def native(cls) -> Compat:
        """Every defect off."""
        return cls(**{f.name: False for f in fields(cls)})

    def without(self, name: str) -> Compat:
        """This switch with defect ``name`` off."""
        if name not in DEVIATIONS:
            raise ValueError(f"comet: expected 'name' in {sorted(DEVIATIONS)} (got {name!r})")
        return replace(self, **{name: False})
