"""Reference oracles: one module per op, each declaring the op (see harness.registry.OpSpec).

numpy oracles are explicit float64 formulas, readable as the spec; JAX oracles
differentiate the forward with jax.vjp, an independent derivation.  Every module here
that is not a helper (broadcast, conv_common, jax_setup) declares one op on import.
"""
import importlib
import pkgutil

HELPERS = {"broadcast", "conv_common", "jax_setup"}

for _m in pkgutil.iter_modules(__path__):
    if _m.name not in HELPERS and not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")
