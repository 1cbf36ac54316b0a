"""Triton kernels for CUDA tensors, one file per dataflow; fusekit.gms.backends lists them."""
