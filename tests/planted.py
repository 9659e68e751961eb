"""Deliberately wrong backends, kept out of the global registry: the harness must fail each one."""
import numpy as np

from harness.registry import Backend, load_ops
from oracle.binary_backward import partials
from oracle.broadcast import sum_to_shape

planted = Backend("planted", framework="numpy", devices=("cpu",), register=False,
                  description="wrong kernels the harness must catch")
ALL = ("f32", "f16", "bf16", "f64")


def _grads(inputs, params):
    a, b, g = (np.asarray(inputs[k], np.float64) for k in ("a", "b", "grad_out"))
    da, db = partials(params["fn"], a, b)
    return a, b, g * da, g * db


def zeros(inputs, outs, params):
    """Writes 0 into every output: op-agnostic, so every op gets it."""
    for out in outs.values():
        out[...] = 0


for _op in load_ops():
    planted.impl(_op, variant="zeros", dtypes=ALL)(zeros)


@planted.impl("binary_backward", variant="copy_input", dtypes=ALL)
def copy_input(inputs, outs, params):
    outs["grad_a"][...] = inputs["a"]
    outs["grad_b"][...] = inputs["b"]


@planted.impl("binary_backward", variant="a_not_reduced", dtypes=ALL)
def a_not_reduced(inputs, outs, params):
    """The seed's bug: right when only B is broadcast, but grad_a takes one term instead of the sum."""
    a, b, ta, tb = _grads(inputs, params)
    lead = ta.ndim - a.ndim
    first = ta[(0,) * lead] if lead else ta
    first = first[tuple(slice(0, 1) if n == 1 else slice(None) for n in a.shape)] if a.ndim else first
    outs["grad_a"][...] = first.reshape(a.shape)
    outs["grad_b"][...] = sum_to_shape(tb, b.shape)


@planted.impl("binary_backward", variant="misses_last", dtypes=ALL)
def misses_last(inputs, outs, params):
    """Correct, except that the last element of grad_b is never written (stays NaN-poisoned)."""
    a, b, ta, tb = _grads(inputs, params)
    outs["grad_a"][...] = sum_to_shape(ta, a.shape)
    full = sum_to_shape(tb, b.shape)
    flat = outs["grad_b"].reshape(-1)
    flat[:-1] = full.reshape(-1)[:-1]


@planted.impl("binary_backward", variant="fp16_accumulate", dtypes=("f16",))
def fp16_accumulate(inputs, outs, params):
    """Sums in float16 one term at a time: breaks the 'accumulate in at least float32' rule."""
    a, b, ta, tb = _grads(inputs, params)
    for name, x, t in (("grad_a", a, ta), ("grad_b", b, tb)):
        t = t.astype(np.float16)
        acc = np.zeros(x.shape, np.float16)
        lead = t.ndim - x.ndim
        t = t.reshape((-1,) + t.shape[lead:]) if lead else t[None]
        for row in t:
            acc = (acc + sum_to_shape(row.astype(np.float64), x.shape).astype(np.float16)).astype(np.float16)
        outs[name][...] = acc


# Right on their first call, stale after it: one checked call passes them, and the timed
# re-validation (harness.runner.timed_check) must fail every one.  `forget()` clears their memory.
_MEMORY: dict = {}


def forget():
    _MEMORY.clear()


def _correct(inputs, params):
    a, b, ta, tb = _grads(inputs, params)
    return {"grad_a": sum_to_shape(ta, a.shape), "grad_b": sum_to_shape(tb, b.shape)}


@planted.impl("binary_backward", variant="stale_cache", dtypes=ALL)
def stale_cache(inputs, outs, params):
    """Computes once per params, then returns the cached result whatever the inputs hold."""
    key = ("stale_cache", repr(sorted(params.items())))
    if key not in _MEMORY:
        _MEMORY[key] = _correct(inputs, params)
    return {k: v.astype(outs[k].dtype) for k, v in _MEMORY[key].items()}


@planted.impl("binary_backward", variant="compute_once", dtypes=ALL)
def compute_once(inputs, outs, params):
    """Writes its outputs on the first call and skips the work after it, believing them still there."""
    key = ("compute_once", repr(sorted(params.items())))
    if key in _MEMORY:
        return
    _MEMORY[key] = True
    for k, v in _correct(inputs, params).items():
        outs[k][...] = v


@planted.impl("binary_backward", variant="address_memo", dtypes=ALL)
def address_memo(inputs, outs, params):
    """Memoizes on the inputs' buffer addresses: right until a buffer is refilled in place."""
    key = ("address_memo",) + tuple(np.asarray(inputs[k]).__array_interface__["data"][0] for k in sorted(inputs))
    if key not in _MEMORY:
        _MEMORY[key] = _correct(inputs, params)
    for k, v in _MEMORY[key].items():
        outs[k][...] = v
