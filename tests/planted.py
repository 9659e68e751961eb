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


# ----------------------------------------------------------------------------- memory and repeat faults
# Each is right in value where the harness looks only at the outputs; the guards of
# harness/guards.py must catch them.  Pointer-style access: as_strided from a view's first
# element reaches memory around it, as a raw kernel's out-of-range index would.


def _at(x, i):
    """A 1-element writable view of the element `i` places from x's first element (i may be -1 or past the end)."""
    item = x.itemsize
    return np.lib.stride_tricks.as_strided(x, (abs(i) + 1,), (item if i >= 0 else -item,))[abs(i):]


def _end(x) -> int:
    """Elements from x's first element to one past its last (its memory span)."""
    return sum((n - 1) * s for n, s in zip(x.shape, x.strides)) // x.itemsize + 1 if x.size else 0


def _write_correct(inputs, outs, params):
    for k, v in _correct(inputs, params).items():
        outs[k][...] = v


@planted.impl("binary_backward", variant="oob_write_after", dtypes=ALL)
def oob_write_after(inputs, outs, params):
    """Right values, then a 0 stored one element past the end of grad_b (an off-by-one bound)."""
    _write_correct(inputs, outs, params)
    _at(outs["grad_b"], _end(outs["grad_b"]))[0] = 0


@planted.impl("binary_backward", variant="oob_write_before", dtypes=ALL)
def oob_write_before(inputs, outs, params):
    """Right values, then NaN stored one element before the start of grad_a (index -1)."""
    _write_correct(inputs, outs, params)
    _at(outs["grad_a"], -1)[0] = np.nan


@planted.impl("binary_backward", variant="oob_read_after", dtypes=ALL)
def oob_read_after(inputs, outs, params):
    """Loads one element past the end of grad_out and masks it with a multiply by 0 (load before
    the bound test): harmless on finite memory, NaN from a NaN guard band."""
    _write_correct(inputs, outs, params)
    g = inputs["grad_out"]
    outs["grad_a"].reshape(-1)[-1] += 0 * _at(g, _end(g))[0]


@planted.impl("binary_backward", variant="oob_read_before", dtypes=ALL)
def oob_read_before(inputs, outs, params):
    """Loads the element before a (index -1) and masks it with a multiply by 0."""
    _write_correct(inputs, outs, params)
    outs["grad_b"].reshape(-1)[0] += 0 * _at(inputs["a"], -1)[0]


@planted.impl("binary_backward", variant="mutates_input", dtypes=ALL)
def mutates_input(inputs, outs, params):
    """Right values, but uses grad_out as scratch: it leaves grad_out * da there."""
    a, b, ta, tb = _grads(inputs, params)
    _write_correct(inputs, outs, params)
    g = inputs["grad_out"]
    g[...] = ta.astype(g.dtype)


_ORDERS = iter(range(1 << 62))  # a new summation order on every call, reproducibly


def _shuffled_sum(inputs, outs, params):
    """grad_b (B broadcast over leading dims) summed in float32 in a new random row order each call:
    within tolerance every time, not the same bits."""
    a, b, ta, tb = _grads(inputs, params)
    outs["grad_a"][...] = sum_to_shape(ta, a.shape)
    rows = tb.reshape(-1, *b.shape) if b.ndim else tb.reshape(-1, 1)
    acc = np.zeros(rows.shape[1:], np.float32)
    for r in np.random.default_rng(next(_ORDERS)).permutation(len(rows)):
        acc += rows[r].astype(np.float32)
    outs["grad_b"][...] = acc.reshape(b.shape)


planted.impl("binary_backward", variant="racy_sum", dtypes=("f32",))(_shuffled_sum)
planted.impl("binary_backward", variant="racy_sum_declared", dtypes=("f32",), deterministic=False)(_shuffled_sum)


# The same faults through the torch adapter (its guarded views carry a storage offset).
planted_torch = Backend("planted_torch", framework="torch", devices=("cpu", "cuda"), register=False,
                        description="wrong torch kernels the harness must catch")


def _torch_correct(inputs, outs):
    g = inputs["grad_out"]
    outs["grad_a"].copy_((g * inputs["b"]).sum_to_size(outs["grad_a"].shape))
    outs["grad_b"].copy_((g * inputs["a"]).sum_to_size(outs["grad_b"].shape))


def _mul_only(case):
    return None if case.params["fn"] == "mul" else "planted_torch: mul only"


@planted_torch.impl("binary_backward", variant="ok", dtypes=ALL, supports=_mul_only)
def torch_ok(inputs, outs, params):
    _torch_correct(inputs, outs)


@planted_torch.impl("binary_backward", variant="oob_write_after", dtypes=ALL, supports=_mul_only)
def torch_oob_write_after(inputs, outs, params):
    """Right values, then 0 stored one element past the end of grad_b, through its storage."""
    _torch_correct(inputs, outs)
    out = outs["grad_b"]
    out.as_strided((out.numel() + 1,), (1,), out.storage_offset())[-1] = 0


@planted_torch.impl("binary_backward", variant="mutates_input", dtypes=ALL, supports=_mul_only)
def torch_mutates_input(inputs, outs, params):
    """Right values, then negates b in place."""
    _torch_correct(inputs, outs)
    inputs["b"].neg_()
