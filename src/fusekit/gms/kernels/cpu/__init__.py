"""CPU kernels (numba), one file per dataflow; see fusekit.gms.dispatch for the naming."""
