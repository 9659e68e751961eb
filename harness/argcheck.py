"""Argument checks at the entry of every implementation: bad input gets a clear error, never a
crash, a hang or a silent wrong answer.

`check(op, inputs, outs, params, who=..., framework=..., dtypes=..., devices=...)` validates
one call `fn(inputs, outs, params)` of an implementation before it runs, in this order, and
raises on the first problem:

  names    inputs holds exactly the inputs the op takes with these params (layernorm's weight
           only when params affine is true), outs exactly its outputs        (TypeError)
  types    each is an array of the backend's framework (torch.Tensor, cupy.ndarray, jax.Array,
           numpy.ndarray)                                                    (TypeError)
  dtypes   the anchor input (the op's first input: a, x, dy or q) has a dtype the
           implementation supports; every other tensor has the anchor's dtype, except the
           forward's saved statistics (mean, rstd, lse): float32, float64 when the anchor is
           float64                                                           (TypeError)
  params   the params the op reads are valid: fn, axes/keepdim/target, eps, the conv
           geometry, attention's causal/window/softcap/softmax_scale        (ValueError)
  shapes   every input and output has the shape the op implies from the anchor inputs and
           the params: broadcasts, the norms' (N,) and per-row shapes, matmul's K and batch
           broadcast, the conv geometry, attention's (B, S, H, D) with Hq a multiple of Hkv;
           a shape the params state (binary a/b, matmul a/b, norm and reduce shape, attention
           B/Sq/Sk/Hq/Hkv/D) must match the tensor                           (ValueError)
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
from typing import Callable, Mapping

from harness import dtypes as _dtypes
from harness.registry import DEFAULT_VARIANT, get_op

STATS = ("mean", "rstd", "lse")  # saved forward statistics: float32, or float64 for float64 data

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


_SHORT: dict = {}  # dtype object -> 'f32' ... or None


def _short(dtype) -> str | None:
    if dtype not in _SHORT:
        try:
            _SHORT[dtype] = _dtypes.from_any(dtype)
        except TypeError:
            _SHORT[dtype] = None
    return _SHORT[dtype]


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


class _Call:
    """The arrays and params of one call, and the ways to reject them."""

    def __init__(self, op: str, who: str, params):
        self.op, self.who, self.params = op, who, params
        self.arrays: dict = {}  # name -> array, inputs then outputs (None outputs left out)
        self.shapes: dict = {}  # name -> shape tuple

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
            self.expect(name, self._ints(key, self.params[key]), lambda: f"params[{key!r}]")

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

    def _ints(self, key: str, value) -> tuple[int, ...]:
        try:
            out = tuple(value)
        except TypeError:
            out = None
        if out is None or not all(isinstance(n, int) and not isinstance(n, bool) for n in out):
            self.fail(ValueError, f"params[{key!r}] is {value!r}, expected a list of ints")
        return out


# ----------------------------------------------------------------------------- per-op rules
# Each rule checks the op's params and every shape; names, types, dtypes and devices are generic.


def _binary_backward(c: _Call) -> None:
    from oracle.binary_backward import FNS

    fn = c.params.get("fn")
    if fn not in FNS:
        c.fail(ValueError, f"params['fn'] is {fn!r}, expected one of {', '.join(FNS)}")
    c.expect_param_shape("a", "a")
    c.expect_param_shape("b", "b")
    a, b = c.shape("a"), c.shape("b")
    c.expect("grad_out", c.broadcast("a", "b"), lambda: f"the broadcast of a {fmt_shape(a)} and b {fmt_shape(b)}")
    c.expect("grad_a", a, lambda: "the shape of a")
    c.expect("grad_b", b, lambda: "the shape of b")


def _reduce_sum(c: _Call) -> None:
    from oracle.reduce_sum import out_shape

    c.expect_param_shape("x", "shape")
    x = c.shape("x")
    rank = len(x)
    if "target" in c.params:
        if "axes" in c.params or "keepdim" in c.params:
            c.fail(ValueError, f"params has 'target' and {'axes' if 'axes' in c.params else 'keepdim'}, "
                               "expected one form: target, or axes/keepdim")
        target = c._ints("target", c.params["target"])
        lead = rank - len(target)
        if lead < 0 or any(t not in (n, 1) for t, n in zip(target, x[lead:])):
            c.fail(ValueError, f"params['target'] is {list(target)}, expected a shape x {fmt_shape(x)} sums to "
                               f"(at most {rank} dims aligned from the right, each equal to x's or 1)")
        why = lambda: f"x {fmt_shape(x)} summed to params['target']"  # noqa: E731
    else:
        axes = c.params.get("axes")
        if axes is not None:
            axes = c._ints("axes", axes)
            if any(not -rank <= ax < rank for ax in axes) or len({ax % rank for ax in axes}) != len(axes):
                c.fail(ValueError, f"params['axes'] is {list(axes)}, expected distinct axes of x {fmt_shape(x)} "
                                   f"in [{-rank}, {rank})")
        c.flag("keepdim", False)
        why = lambda: f"x {fmt_shape(x)} summed over params['axes']"  # noqa: E731
    c.expect("y", out_shape(x, c.params), why)


def _norm_rows(c: _Call) -> tuple[tuple[int, ...], int]:
    """x's shape and its normalised (last) dim N, for layernorm and rmsnorm."""
    c.expect_param_shape("x", "shape")
    x = c.shape("x")
    if not x or x[-1] < 1:
        c.fail(ValueError, f"argument 'x' has shape {fmt_shape(x)}, expected at least 1 dim and a last "
                           "(normalised) dim N >= 1")
    n = x[-1]
    c.expect("dy", x, lambda: "the shape of x")
    for name in ("weight", "dweight", "dbias"):
        c.expect(name, (n,), lambda: f"N = x.shape[-1] of x {fmt_shape(x)}")
    for name in ("mean", "rstd"):
        c.expect(name, x[:-1], lambda: f"one per row of x {fmt_shape(x)}: x.shape[:-1]")
    c.expect("dx", x, lambda: "the shape of x")
    return x, n


def _layernorm_backward(c: _Call) -> None:
    c.flag("affine", True)
    c.flag("bias", True)
    c.number("eps", 1e-5, 0.0, strict=True)
    _norm_rows(c)


def _rmsnorm_backward(c: _Call) -> None:
    c.number("eps", 1e-6, 0.0, strict=True)
    _norm_rows(c)


def _matmul_backward(c: _Call) -> None:
    c.expect_param_shape("a", "a")
    c.expect_param_shape("b", "b")
    a, b = c.shape("a"), c.shape("b")
    for name, s, dims in (("a", a, "(..., M, K)"), ("b", b, "(..., K, N)")):
        if len(s) < 2:
            c.fail(ValueError, f"argument {name!r} has shape {fmt_shape(s)}, expected at least 2 dims {dims}")
    if a[-1] != b[-2]:
        c.fail(ValueError, f"argument 'b' has shape {fmt_shape(b)}, expected b.shape[-2] = {a[-1]} "
                           f"(K, the last dim of a {fmt_shape(a)})")
    batch = broadcast(a[:-2], b[:-2])
    if isinstance(batch, str):
        c.fail(ValueError, f"arguments 'a' {fmt_shape(a)} and 'b' {fmt_shape(b)} have batch dims "
                           f"{fmt_shape(a[:-2])} and {fmt_shape(b[:-2])}, expected broadcastable batch dims, "
                           f"got {batch}")
    out = batch + (a[-2], b[-1])
    c.expect("dy", out, lambda: f"(*batch, M, N) of a {fmt_shape(a)} @ b {fmt_shape(b)}")
    c.expect("da", a, lambda: "the shape of a")
    c.expect("db", b, lambda: "the shape of b")


def _conv_geometry(c: _Call):
    from oracle import conv_common as cc

    try:
        return cc.geometry(c.params, c.op)
    except (ValueError, TypeError, KeyError) as exc:  # the geometry's own message names the param
        text = str(exc)
        c.fail(ValueError, text[len(c.op) + 2:] if text.startswith(f"{c.op}: ") else text)


def _conv_dims(geo) -> str:
    return "(N, *O, Cout)" if geo.channels_last else "(N, Cout, *O)"


def _conv_backward_data(c: _Call) -> None:
    geo = _conv_geometry(c)
    c.expect("dy", geo.y_shape, lambda: f"{_conv_dims(geo)} of the params' geometry")
    c.expect("w", geo.w_shape, lambda: "the weight shape of the params' geometry")
    c.expect("dx", geo.x_shape, lambda: "the input shape of the params' geometry")


def _conv_backward_weight(c: _Call) -> None:
    geo = _conv_geometry(c)
    c.expect("dy", geo.y_shape, lambda: f"{_conv_dims(geo)} of the params' geometry")
    c.expect("x", geo.x_shape, lambda: "the input shape of the params' geometry")
    c.expect("dw", geo.w_shape, lambda: "the weight shape of the params' geometry")


def _attention_backward(c: _Call) -> None:
    c.flag("causal", False)
    window = c.params.get("window", (-1, -1))
    if (not isinstance(window, (list, tuple)) or len(window) != 2
            or not all(isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window)):
        c.fail(ValueError, f"params['window'] is {window!r}, expected [left, right], ints >= -1 (-1 = unbounded)")
    c.number("softcap", 0.0, 0.0, strict=False, none_ok=True)
    c.number("softmax_scale", None, 0.0, strict=True, none_ok=True)
    q, k = c.shape("q"), c.shape("k")
    for name, s, dims in (("q", q, "(B, Sq, Hq, D)"), ("k", k, "(B, Sk, Hkv, D)")):
        if len(s) != 4 or min(s) < 1:
            c.fail(ValueError, f"argument {name!r} has shape {fmt_shape(s)}, expected 4 dims {dims}, each >= 1")
    c.expect("q", tuple(c.params.get(key, n) for key, n in zip(("B", "Sq", "Hq", "D"), q)),
             lambda: "params B, Sq, Hq, D")
    b, sq, hq, d = q
    c.expect("k", (b, c.params.get("Sk", k[1]), c.params.get("Hkv", k[2]), d),
             lambda: f"(B, Sk, Hkv, D) with B and D of q {fmt_shape(q)}")
    hkv = k[2]
    if hq % hkv:
        c.fail(ValueError, f"argument 'k' has {hkv} heads (Hkv = k.shape[2]), expected a divisor of "
                           f"Hq = {hq} (q.shape[2]): each kv head serves Hq / Hkv query heads")
    for name in ("v", "dk", "dv"):
        c.expect(name, k, lambda: "the shape of k")
    for name in ("o", "do", "dq"):
        c.expect(name, q, lambda: "the shape of q")
    c.expect("lse", (b, hq, sq), lambda: f"(B, Hq, Sq) of q {fmt_shape(q)}")


RULES: dict[str, Callable[[_Call], None]] = {
    "binary_backward": _binary_backward,
    "reduce_sum": _reduce_sum,
    "layernorm_backward": _layernorm_backward,
    "rmsnorm_backward": _rmsnorm_backward,
    "matmul_backward": _matmul_backward,
    "conv_backward_data": _conv_backward_data,
    "conv_backward_weight": _conv_backward_weight,
    "attention_backward": _attention_backward,
}


_NAMES: dict = {}


def expected_names(op: str, params: Mapping) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(inputs, outputs) the op takes and gives with these params."""
    flags = (params.get("affine", True), params.get("bias", True)) if op == "layernorm_backward" else ()
    key = (op, flags)
    if key not in _NAMES:
        spec = get_op(op)
        ins, outs = spec.inputs, spec.outputs
        if flags:
            affine, bias = flags
            ins = tuple(n for n in ins if n != "weight" or affine)
            outs = tuple(n for n in outs if (n != "dweight" or affine) and (n != "dbias" or bias))
        _NAMES[key] = (ins, outs)
    return _NAMES[key]


# ----------------------------------------------------------------------------- the check


def check(op: str, inputs, outs, params, *, who: str, framework: str,
          dtypes: tuple[str, ...] = _dtypes.NAMES, devices: tuple[str, ...] | None = None) -> None:
    """Validate one call of an implementation of `op` (see the module docstring); raise
    ValueError or TypeError naming `who`, the op, the argument, the expected and the got."""
    call = _Call(op, who, params)
    for label, value in (("inputs", inputs), ("outs", outs), ("params", params)):
        if not isinstance(value, (dict, Mapping)):
            call.fail(TypeError, f"{label} is a {_type_name(value)}, expected a dict")
    want_in, want_out = expected_names(op, params)
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
            hint = " (params affine/bias decide which exist)" if op == "layernorm_backward" else ""
            call.fail(TypeError, f"unexpected {label} {extra!r}, expected {label}s {', '.join(wanted)}{hint}")
    anchor = want_in[0]
    _check_dtypes(call, anchor, dtypes)
    RULES[op](call)
    _check_devices(call, anchor, _FRAMEWORKS[framework], devices)


_MISSING = object()


def _check_dtypes(call: _Call, anchor: str, supported: tuple[str, ...]) -> None:
    want = call.arrays[anchor].dtype
    short = _short(want)
    if short not in supported:
        names = ", ".join(_dtypes.long_name(d) for d in supported)
        call.fail(TypeError, f"argument {anchor!r} has dtype {dtype_name(want)}, expected one of {names}"
                             f" (what {call.who} supports)")
    stats = _dtypes.accumulate_dtype(short)
    for name, x in call.arrays.items():
        if name in STATS:
            if _short(x.dtype) != stats:
                call.fail(TypeError, f"argument {name!r} has dtype {dtype_name(x.dtype)}, expected "
                                     f"{_dtypes.long_name(stats)} (saved statistics are float32, float64 for "
                                     f"float64 data; {anchor} is {dtype_name(want)})")
        elif x.dtype != want:
            call.fail(TypeError, f"argument {name!r} has dtype {dtype_name(x.dtype)}, expected "
                                 f"{dtype_name(want)} (the dtype of {anchor})")


def _check_devices(call: _Call, anchor: str, fw, allowed: tuple[str, ...] | None) -> None:
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
