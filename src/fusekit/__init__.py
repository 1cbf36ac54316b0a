"""fusekit: decide how to fuse, order and tile deep-learning computations, and run the result.

Importing fusekit initialises no GPU and compiles nothing; parts are imported on use.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
