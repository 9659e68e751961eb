"""Planted bugs for the fuzz tests: each backend is right except under one non-obvious condition,
so only a search over cases finds it, and shrinking must bring it down to a known minimum.

Kept out of the global registry (register=False); `install()` registers the backend in a
process that wants to run it through `python -m harness run` (tests/test_fuzz.py does so in
a subprocess to replay a printed repro line).

    fuzzbugs@mid_bcast_odd   binary_backward: grad_b drops the last term of its sum along an
                             axis where b is broadcast, if that axis is neither the first nor
                             the last of the output and the output's last dim is odd and >= 3
                             (a vectorised tail path that mishandles a middle broadcast).
                             Smallest trigger: fn add, f32, output (1, 2, 3).
    fuzzbugs@window_top_left attention_backward: the local window is aligned top-left (as
                             torch SDPA aligns is_causal) instead of bottom-right; causal alone
                             is right.  Wrong only when Sq != Sk and a window side is set.
                             Smallest trigger: B=Hq=Hkv=D=1, Sq=1, Sk=2, window [-1, 0].
"""
from __future__ import annotations

import math

import numpy as np

from harness.registry import Backend, register_backend
from oracle.binary_backward import partials
from oracle.broadcast import broadcast_shape, sum_to_shape

fuzzbugs = Backend("fuzzbugs", framework="numpy", devices=("cpu",), register=False,
                   description="implementations wrong only under one condition, for the fuzz tests")
ALL = ("f32", "f16", "bf16", "f64")


def install() -> Backend:
    """Register the backend globally (a process that runs it through the CLI)."""
    return register_backend(fuzzbugs)


# ----------------------------------------------------------------------------- binary_backward


def middle_broadcast_axis(a_shape, b_shape) -> int | None:
    """The first output axis, neither first nor last, along which b (padded to the output's
    rank) is broadcast, when the output's last dim is odd and >= 3; else None (no trigger)."""
    out = broadcast_shape(a_shape, b_shape)
    rank = len(out)
    if rank < 3 or out[-1] < 3 or out[-1] % 2 == 0:
        return None
    padded = (1,) * (rank - len(b_shape)) + tuple(b_shape)
    return next((i for i in range(1, rank - 1) if padded[i] == 1 and out[i] > 1), None)


@fuzzbugs.impl("binary_backward", variant="mid_bcast_odd", dtypes=ALL)
def mid_bcast_odd(inputs, outs, params):
    a, b, g = (np.asarray(inputs[k], np.float64) for k in ("a", "b", "grad_out"))
    da, db = partials(params["fn"], a, b)
    outs["grad_a"][...] = sum_to_shape(g * da, a.shape)
    terms = g * db
    axis = middle_broadcast_axis(a.shape, b.shape)
    if axis is not None:  # the bug: the reduction along `axis` stops one short
        terms = np.delete(terms, -1, axis=axis)
    outs["grad_b"][...] = sum_to_shape(terms, b.shape)


# ----------------------------------------------------------------------------- attention_backward


def window_misaligned(params) -> bool:
    """Whether window_top_left's mask differs from the spec's: Sq != Sk and a window side set."""
    window = params.get("window", [-1, -1])
    return params["Sq"] != params["Sk"] and any(int(w) >= 0 for w in window)


def _mask(sq: int, sk: int, causal: bool, window) -> np.ndarray:
    """Causal bottom-right (right), the window top-left (the bug): query i sees key j iff ..."""
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    ok = np.ones((sq, sk), bool)
    if causal:
        ok &= j <= i + (sk - sq)
    left, right = (int(w) for w in window)
    if left >= 0:
        ok &= j >= i - left  # the spec has i + (sk - sq) - left
    if right >= 0:
        ok &= j <= i + right
    return ok


@fuzzbugs.impl("attention_backward", variant="window_top_left", dtypes=ALL)
def window_top_left(inputs, outs, params):
    """Dense float64 attention backward that recomputes the forward (ignores o and lse)."""
    q, k, v, do = (np.asarray(inputs[n], np.float64) for n in ("q", "k", "v", "do"))
    _, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    scale = params.get("softmax_scale")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    cap = float(params.get("softcap", 0.0) or 0.0)
    allowed = _mask(sq, sk, bool(params.get("causal", False)), params.get("window", [-1, -1]))
    # heads first: (B, H, S, D); kv heads repeated over their query group
    qh, doh = q.transpose(0, 2, 1, 3), do.transpose(0, 2, 1, 3)
    kh, vh = (np.repeat(x.transpose(0, 2, 1, 3), group, axis=1) for x in (k, v))
    s = scale * qh @ kh.transpose(0, 1, 3, 2)
    t = cap * np.tanh(s / cap) if cap else s
    t = np.where(allowed, t, -np.inf)
    peak = np.max(t, axis=-1, keepdims=True)
    e = np.where(allowed, np.exp(t - np.where(np.isfinite(peak), peak, 0.0)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    p = np.divide(e, total, out=np.zeros_like(e), where=total > 0)  # an empty row: P = 0
    o = p @ vh
    dv = p.transpose(0, 1, 3, 2) @ doh
    dp = doh @ vh.transpose(0, 1, 3, 2)
    dt = p * (dp - np.sum(doh * o, axis=-1, keepdims=True))
    ds = dt * (1.0 - np.tanh(s / cap) ** 2) if cap else dt
    dq = scale * ds @ kh
    dk = scale * ds.transpose(0, 1, 3, 2) @ qh

    def kv_heads(x):  # (B, Hq, Sk, D) summed over each group -> (B, Sk, Hkv, D)
        b = x.shape[0]
        return x.reshape(b, hkv, group, sk, d).sum(axis=2).transpose(0, 2, 1, 3)

    outs["dq"][...] = dq.transpose(0, 2, 1, 3)
    outs["dk"][...] = kv_heads(dk)
    outs["dv"][...] = kv_heads(dv)
