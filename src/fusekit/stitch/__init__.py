"""Fusion planning and stitched kernels for chains of memory-intensive ops (FusionStitching).

The pipeline (DESIGN.md)::

    graph --classify--> dominant ops --candidates--> convex groups --model--> cost per group
          --search (ILP on HiGHS, greedy warm start)--> plan --codegen (numba / Triton)--> runner
"""
