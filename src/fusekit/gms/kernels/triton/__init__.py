"""gms kernels for CUDA tensors, in Triton: one file per dataflow (``<module>_triton``)."""
