"""gms kernels: the plain-PyTorch reference and one folder per backend (cpu, triton)."""
