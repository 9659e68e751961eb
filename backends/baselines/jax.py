"""`jax`: each op's jax.vjp derivation, jitted by XLA, in the case dtype on the device."""
from __future__ import annotations

from backends.baselines import _deviations
from harness import argcheck
from harness.registry import Backend, load_ops


def _check(device: str) -> str | None:
    try:
        from oracle.jax_setup import jax
    except ImportError as exc:
        return f"jax: not importable ({exc})"
    if device == "cuda":
        try:
            jax.devices("gpu")
        except RuntimeError:
            return "jax: no GPU backend (jax installed without CUDA support)"
    return None


jax_backend = Backend("jax", framework="jax", devices=("cpu", "cuda"),
                      description="jax.vjp of the forward, jax.jit on XLA", check=_check)

_JITTED: dict = {}


def _jitted(spec, params):
    """XLA specialises on params (fn, flags, shapes): jit once per params and reuse."""
    key = (spec.name, repr(sorted(params.items())))
    if key not in _JITTED:
        from oracle.jax_setup import jax

        frozen = dict(params)
        _JITTED[key] = jax.jit(lambda inputs: spec.jax_vjp(inputs, frozen))
    return _JITTED[key]


for _spec in load_ops().values():
    @argcheck.register(jax_backend, _spec.name, deterministic=False, deviations=_deviations.JAX)
    def _run(inputs, outs, params, _spec=_spec):
        results = _jitted(_spec, params)(inputs)
        for value in results.values():
            value.block_until_ready()
        return results
