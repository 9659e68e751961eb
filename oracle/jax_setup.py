"""Import JAX for the oracles: float64 on, CPU unless a GPU is asked for.

x64 must be set before any array is made, so every oracle imports jax from here.
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the oracle judges on the host unless told otherwise
import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
