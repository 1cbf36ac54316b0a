"""CPU kernels (numba), one file per dataflow; fusekit.gms.backends lists them in the CPU table."""
