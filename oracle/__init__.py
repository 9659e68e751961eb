"""Reference oracles: one module per op, each declaring the op (see harness.registry.OpSpec).

numpy oracles are explicit float64 formulas, readable as the spec; JAX oracles
differentiate the forward with jax.vjp, an independent derivation.
"""
from oracle import binary_backward  # noqa: F401
