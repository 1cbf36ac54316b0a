"""The per-token reference machine: stream tokens, bounded channels, primitives and a cycle engine.

This is the exact, slow counterpart of :mod:`fusekit.sparse.simulate`: one Python step per
primitive per cycle, for tiny inputs, token-exact tests and checks of the fast simulator's
token counts and cycle model.
"""
