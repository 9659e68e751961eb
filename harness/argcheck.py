"""Argument checks at the entry of every implementation: bad input gets a clear error, never a
crash, a hang or a silent wrong answer.

`check(op, inputs, outs, params, who=..., framework=..., dtypes=..., devices=...)` validates
one call `fn(inputs, outs, params)` of an implementation before it runs, in this order, and
raises on the first problem:

  names    inputs holds exactly the inputs the op takes with these params (OpSpec.names: e.g.
           layernorm's weight only when params affine is true), outs exactly its outputs
                                                                             (TypeError)
  types    each is an array of the backend's framework (torch.Tensor, cupy.ndarray, jax.Array,
           numpy.ndarray)                                                    (TypeError)
  dtypes   the anchor input (the op's first input: a, x, dy or q) has a dtype the
           implementation supports; every other tensor has the anchor's dtype, except the
           forward's saved statistics (OpSpec.stats: layernorm's mean and rstd, attention's
           lse): float32, float64 when the anchor is float64                 (TypeError)
  params,  the op's own argument rule, OpSpec.check_args(call), declared with the op in
  shapes   oracle/<op>.py: the params it reads are valid, and every input and output has the
           shape the op implies from the anchor inputs and the params (a broadcast, a conv
           geometry, ...), through the helpers of `Call`.  An op without a rule: its validate()
           accepts the params and each tensor has the shape its shapes() gives for them
                                                                             (ValueError)
  devices  every tensor is on one device, of a type the implementation runs on (ValueError)

Devices come last so that the argument checks of a CUDA-only backend can be exercised with
CPU tensors.  Outputs: `outs` maps each output to a buffer, checked like an input, or (a
functional framework: JAX) to None, which is not checked.

Messages name the implementation, the op, the argument, what was expected and what was got:

    torch binary_backward: argument 'grad_out' has shape (2, 3), expected (2, 4) (the broadcast of a (2, 4) and b (1, 4))

Not checked here: values (NaN and Inf are the kernels' business; a check never syncs the
device or copies data to the host), and kernel limits (contiguity, ranks, alignment), which
each backend checks itself.  `register(backend, op, **kw)` is `backend.impl(op, **kw)` with
`check` run at the entry of every call, with the implementation's own dtypes and devices.

Cost: a few microseconds per call -- attribute reads and comparisons; message text is built
only on failure.
"""
from __future__ import annotations

import functools
import math
from types import SimpleNamespace
from typing import Mapping

from harness import dtypes as _dtypes
from harness.registry import DEFAULT_VARIANT, get_op

# ----------------------------------------------------------------------------- frameworks


def _torch_type():
    import torch

    return torch.Tensor


def _cupy_type():
    import cupy

    return cupy.ndarray


def _jax_type():
    from oracle.jax_setup import jax  # x64 on and no GPU memory grabbed, as everywhere in gradoracle

    return jax.Array


def _numpy_type():
    import numpy

    return numpy.ndarray


def _jax_device(x):
    devices = x.devices()
    return next(iter(devices)) if len(devices) == 1 else frozenset(devices)


def _jax_device_type(dev) -> str:
    if isinstance(dev, frozenset):
        return f"{len(dev)} devices"
    return "cuda" if dev.platform in ("gpu", "cuda") else dev.platform


# framework -> (array type getter, its name in messages, device of an array (compared with ==),
#               that device's type ('cpu', 'cuda', 'meta'), its name in messages)
_FRAMEWORKS = {
    "torch": (_torch_type, "torch.Tensor", lambda x: x.device, lambda d: d.type, str),
    "cupy": (_cupy_type, "cupy.ndarray", lambda x: x.device.id, lambda d: "cuda", lambda d: f"cuda:{d}"),
    "jax": (_jax_type, "jax.Array", _jax_device, _jax_device_type,
            lambda d: _jax_device_type(d) + ("" if isinstance(d, frozenset) else f":{d.id}")),
    "numpy": (_numpy_type, "numpy.ndarray", lambda x: "cpu", lambda d: d, str),
}
_ARRAY_TYPES: dict = {}


def _array_type(framework: str):
    if framework not in _ARRAY_TYPES:
        _ARRAY_TYPES[framework] = _FRAMEWORKS[framework][0]()
    return _ARRAY_TYPES[framework]


def fmt_shape(shape) -> str:
    """(2, 3), (4,) or () -- Python's tuple spelling."""
    return str(tuple(int(n) for n in shape))


def dtype_name(dtype) -> str:
    """float32, bfloat16, int32 ...: the spelling every framework shares."""
    return str(dtype).replace("torch.", "")


def _type_name(x) -> str:
    cls = type(x)
    return cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__.split('.')[0]}.{cls.__name__}"


def broadcast(sx, sy) -> tuple[int, ...] | str:
    """NumPy broadcast of two shapes, or where they clash ('3 and 4 in dim -1')."""
    rank = max(len(sx), len(sy))
    px, py = (1,) * (rank - len(sx)) + tuple(sx), (1,) * (rank - len(sy)) + tuple(sy)
    for d, (m, n) in enumerate(zip(px, py)):
        if m != n and m != 1 and n != 1:
            return f"{m} and {n} in dim {d - rank}"
    return tuple(n if m == 1 else m for m, n in zip(px, py))


# ----------------------------------------------------------------------------- one call


class Call:
    """The arrays and params of one call, and the ways to reject them: what an op's argument rule
    (OpSpec.check_args) is given.  Every `fail` names the implementation and the op."""

    def __init__(self, op: str, who: str, params):
        self.op, self.who, self.params = op, who, params
        self.arrays: dict = {}  # name -> array, inputs then outputs (None outputs left out)
        self.shapes: dict = {}  # name -> shape tuple
        self.anchor = ""  # the op's first input: its dtype and device are the call's

    def fail(self, cls, text: str):
        raise cls(f"{self.who} {self.op}: {text}")

    def shape(self, name: str) -> tuple[int, ...]:
        return self.shapes[name]

    def expect(self, name: str, expected, why=None) -> None:
        """Argument `name` (if present) must have shape `expected`; `why()` says where that comes from."""
        got = self.shapes.get(name)
        if got is not None and got != tuple(expected):
            self.fail(ValueError, f"argument {name!r} has shape {fmt_shape(got)}, expected {fmt_shape(expected)}"
                                  + (f" ({why()})" if why else ""))

    def expect_param_shape(self, name: str, key: str) -> None:
        """A shape the params state for argument `name` must be the tensor's."""
        if key in self.params:
            self.expect(name, self.ints(key, self.params[key]), lambda: f"params[{key!r}]")

    def broadcast(self, x: str, y: str) -> tuple[int, ...]:
        """NumPy broadcast of the shapes of arguments x and y."""
        sx, sy = self.shapes[x], self.shapes[y]
        out = broadcast(sx, sy)
        if isinstance(out, str):
            self.fail(ValueError, f"arguments {x!r} {fmt_shape(sx)} and {y!r} {fmt_shape(sy)} do not broadcast: "
                                  f"expected equal sizes or 1 in each dim aligned from the right, got {out}")
        return out

    def flag(self, key: str, default: bool) -> bool:
        value = self.params.get(key, default)
        if value is not True and value is not False:
            self.fail(ValueError, f"params[{key!r}] is {value!r}, expected true or false")
        return value

    def number(self, key: str, default, low: float, strict: bool, none_ok: bool = False):
        """A finite real param >= low (> low when strict)."""
        value = self.params.get(key, default)
        if value is None and none_ok:
            return None
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
            and (value > low if strict else value >= low)
        if not ok:
            bound = f"{'>' if strict else '>='} {low:g}"
            self.fail(ValueError, f"params[{key!r}] is {value!r}, expected a finite number {bound}")
        return value

    def ints(self, key: str, value) -> tuple[int, ...]:
        """Param `key` (value `value`) as a tuple of ints, or fail."""
        try:
            out = tuple(value)
        except TypeError:
            out = None
        if out is None or not all(isinstance(n, int) and not isinstance(n, bool) for n in out):
            self.fail(ValueError, f"params[{key!r}] is {value!r}, expected a list of ints")
        return out


# ----------------------------------------------------------------------------- an op without its own rule


def _shapes_of_params(c: Call) -> None:
    """The rule of an op that declares no `check_args`: its validate accepts the params, and every
    tensor has the shape its shapes() gives for them."""
    spec = get_op(c.op)
    case = SimpleNamespace(op=c.op, params=dict(c.params), dtype=_dtypes.short_or_none(c.arrays[c.anchor].dtype), tags=frozenset())
    try:
        spec.validate(case)
        shapes = spec.shapes(case)
    except (ValueError, TypeError, KeyError) as exc:
        c.fail(ValueError, f"params {dict(c.params)!r} do not give the tensors' shapes ({type(exc).__name__}: "
                           f"{exc}); expected params its validate() accepts (the op declares no check_args)")
    for name in c.shapes:
        if name in shapes:
            c.expect(name, tuple(shapes[name]), lambda: "the op's shapes() for these params")


# ----------------------------------------------------------------------------- the check


def check(op: str, inputs, outs, params, *, who: str, framework: str,
          dtypes: tuple[str, ...] = _dtypes.NAMES, devices: tuple[str, ...] | None = None) -> None:
    """Validate one call of an implementation of `op` (see the module docstring); raise
    ValueError or TypeError naming `who`, the op, the argument, the expected and the got."""
    call = Call(op, who, params)
    for label, value in (("inputs", inputs), ("outs", outs), ("params", params)):
        if not isinstance(value, (dict, Mapping)):
            call.fail(TypeError, f"{label} is a {_type_name(value)}, expected a dict")
    spec = get_op(op)
    want_in, want_out = spec.names(params)
    array_type, type_label = _array_type(framework), _FRAMEWORKS[framework][1]
    for label, given, wanted in (("input", inputs, want_in), ("output", outs, want_out)):
        for name in wanted:
            x = given.get(name, _MISSING)
            if x is _MISSING:
                call.fail(TypeError, f"argument {name!r} is missing, expected a {type_label}")
            if x is None and label == "output":
                continue  # a functional framework returns its outputs
            if not isinstance(x, array_type):
                call.fail(TypeError, f"argument {name!r} is a {_type_name(x)}, expected a {type_label}")
            call.arrays[name] = x
            call.shapes[name] = tuple(x.shape)
        if len(given) != len(wanted):  # every wanted one is there: the rest are extra
            extra = next(n for n in given if n not in wanted)
            hint = " (the params decide which exist)" if spec.io_names is not None else ""
            call.fail(TypeError, f"unexpected {label} {extra!r}, expected {label}s {', '.join(wanted)}{hint}")
    anchor = call.anchor = want_in[0]
    _check_dtypes(call, anchor, dtypes, spec.stats)
    (spec.check_args or _shapes_of_params)(call)
    _check_devices(call, anchor, _FRAMEWORKS[framework], devices)


_MISSING = object()


def _check_dtypes(call: Call, anchor: str, supported: tuple[str, ...], saved: tuple[str, ...]) -> None:
    want = call.arrays[anchor].dtype
    short = _dtypes.short_or_none(want)
    if short not in supported:
        names = ", ".join(_dtypes.long_name(d) for d in supported)
        call.fail(TypeError, f"argument {anchor!r} has dtype {dtype_name(want)}, expected one of {names}"
                             f" (what {call.who} supports)")
    stats = _dtypes.accumulate_dtype(short)
    for name, x in call.arrays.items():
        if name in saved:
            if _dtypes.short_or_none(x.dtype) != stats:
                call.fail(TypeError, f"argument {name!r} has dtype {dtype_name(x.dtype)}, expected "
                                     f"{_dtypes.long_name(stats)} (saved statistics are float32, float64 for "
                                     f"float64 data; {anchor} is {dtype_name(want)})")
        elif x.dtype != want:
            call.fail(TypeError, f"argument {name!r} has dtype {dtype_name(x.dtype)}, expected "
                                 f"{dtype_name(want)} (the dtype of {anchor})")


def _check_devices(call: Call, anchor: str, fw, allowed: tuple[str, ...] | None) -> None:
    device_of, type_of, name_of = fw[2], fw[3], fw[4]
    where = device_of(call.arrays[anchor])
    for name, x in call.arrays.items():
        dev = device_of(x) if name != anchor else where
        if dev == where and (name != anchor or allowed is None or type_of(dev) in allowed):
            continue  # only the anchor's device type needs asking: the rest must equal it
        if allowed is not None and type_of(dev) not in allowed:
            call.fail(ValueError, f"argument {name!r} is on device {name_of(dev)}, expected "
                                  f"{' or '.join(allowed)} (where {call.who} runs)")
        call.fail(ValueError, f"argument {name!r} is on device {name_of(dev)}, expected {name_of(where)} "
                              f"(the device of {anchor})")


def check_impl(impl, inputs, outs, params) -> None:
    """`check` with an Impl's op, id, framework, dtypes and devices."""
    check(impl.op, inputs, outs, params, who=impl.id, framework=impl.backend.framework, dtypes=impl.dtypes,
          devices=impl.devices)


def register(backend, op: str, **impl_kwargs):
    """Decorator: `backend.impl(op, **impl_kwargs)`, with `check_impl` at the entry of every call.

    The undecorated function stays reachable as `.unchecked` (for measuring the checks' cost).
    """
    variant = impl_kwargs.get("variant", DEFAULT_VARIANT)

    def decorate(fn):
        @functools.wraps(fn)
        def checked(inputs, outs, params):
            check_impl(entry, inputs, outs, params)
            return fn(inputs, outs, params)

        checked.unchecked = fn
        backend.impl(op, **impl_kwargs)(checked)
        entry = backend.impls[(op, variant)]
        return checked

    return decorate
