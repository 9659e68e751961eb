"""Import JAX for the oracles and the JAX baseline: float64 enabled, no GPU memory grabbed.

x64 must be on before any array is made, and XLA must not preallocate most of the GPU
(torch and cupy share it), so every use of jax in gradoracle imports it from here.
"""
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_enable_x64", True)


def device(kind: str = "cpu"):
    """The first JAX device of a kind: 'cpu', or 'cuda'/'gpu'."""
    return jax.devices("gpu" if kind in ("cuda", "gpu") else "cpu")[0]


def run_float64(vjp_fn, inputs: dict, params: dict, on: str = "cpu") -> dict:
    """The JAX oracle: an op's dtype-agnostic `vjp_fn` evaluated in float64 on `on`, as numpy."""
    dev = device(on)
    args = {k: jax.device_put(np.asarray(v, np.float64), dev) for k, v in inputs.items()}
    with jax.default_device(dev):
        out = vjp_fn(args, params)
    return {k: np.asarray(v, np.float64) for k, v in out.items()}
