"""`sdpa_flash`, `sdpa_cudnn`, `sdpa_efficient`: torch's fused attention, one backend each (CUDA only).

Each runs torch.nn.functional.scaled_dot_product_attention under
torch.nn.attention.sdpa_kernel(SDPBackend.<X>) -- forward, then autograd w.r.t. q, k, v
at cotangent do -- on q, k, v transposed to SDPA's (B, H, S, D) (views, no copies), and
transposes the gradients back.  So the timings include the forward (SDPA has no public
backward-only entry), and like every recomputing implementation they ignore the given o
and lse (see oracle/attention_backward.py for why that is inside the tolerance).

How the spec maps onto SDPA, and what cannot (each is the skip reason `supports` gives):
  * GQA/MQA: enable_gqa=True when Hq != Hkv (SDPA maps query head h to kv head h // g,
    as the spec does).
  * causal, Sq == Sk: is_causal=True.  A mask that allows every pair (causal decoding,
    Sq = 1, which sees the whole cache) is no mask.
  * causal, Sq != Sk: SDPA's is_causal is aligned to the top left, the spec (and
    flash-attention) to the bottom right, so a backend that takes attn_mask gets the
    spec's mask as a dense boolean (Sq, Sk) mask, and sdpa_flash, which takes none, skips.
  * a local window: no SDPA flag; the same dense mask where the backend takes one
    (what an SDPA user writes), a skip for sdpa_flash.
  * softcap: SDPA has none: skip.
  * query rows with no allowed key (causal with Sq > Sk, or a window): the spec's answer
    there is 0; SDPA's documented reference computes softmax over all -inf scores (NaN),
    torch warns that its lower-right causal bias gives NaN when Sq > Sk, and only the
    math backend is known to return 0 (torch >= 2.5): skip.
  * dtypes: flash and cuDNN take float16/bfloat16 only; efficient also float32; none float64.
  * head dims: flash <= 256; efficient a multiple of 8 (4 in float32); cuDNN a multiple of
    8 and <= 128 (256 on sm90/sm100 with recent cuDNN), no key length 1.  The last
    word is torch's own check (torch.backends.cuda.can_use_<x>_attention, asked on the
    GPU with the case's shapes): when it declines, its warnings are the skip reason (C++
    warnings that it prints to stderr are captured from there, so the log stays clean).
"""
from __future__ import annotations

import math
import os
import re
import sys
import tempfile
import warnings
from functools import partial

from types import SimpleNamespace

from harness import argcheck, dtypes as _dtypes
from harness.registry import Backend
from oracle.attention_backward import allowed_mask, key_bounds, pair_counts

OP = "attention_backward"

# name -> (SDPBackend member, torch.backends.cuda check function, dtypes, takes attn_mask, description)
KINDS = {
    "sdpa_flash": ("FLASH_ATTENTION", "can_use_flash_attention", ("f16", "bf16"), False,
                   "torch SDPA, flash-attention 2 kernels"),
    "sdpa_cudnn": ("CUDNN_ATTENTION", "can_use_cudnn_attention", ("f16", "bf16"), True,
                   "torch SDPA, cuDNN fused attention"),
    "sdpa_efficient": ("EFFICIENT_ATTENTION", "can_use_efficient_attention", ("f32", "f16", "bf16"), True,
                       "torch SDPA, memory-efficient (xformers/cutlass) kernels"),
}


def _check(kind: str, device: str) -> str | None:
    try:
        import torch
    except ImportError as exc:
        return f"{kind}: torch not importable ({exc})"
    if device != "cuda" or not torch.cuda.is_available():
        return f"{kind}: no CUDA device"
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401
    except ImportError:
        return f"{kind}: torch {torch.__version__} has no torch.nn.attention.sdpa_kernel"
    if kind == "sdpa_flash" and not torch.backends.cuda.is_flash_attention_available():
        return "sdpa_flash: this torch was built without flash attention"
    if kind == "sdpa_cudnn":
        version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        if version is None or version < 90000:
            return f"sdpa_cudnn: cuDNN {version} found; SDPA's cuDNN attention needs cuDNN >= 9.0"
    return None


def _geometry(p: dict):
    """(scale, causal, window, windowed, softcap, how) of case params; how is 'causal', 'mask' or None."""
    d = p["D"]
    scale = p.get("softmax_scale")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    causal = bool(p.get("causal", False))
    left, right = (int(w) for w in p.get("window", (-1, -1)))
    windowed = left >= 0 or (right >= 0 and not causal)  # causal makes right irrelevant
    if pair_counts(p["Sq"], p["Sk"], causal, (left, right))[0] == p["Sq"] * p["Sk"]:
        how = None  # the mask allows every pair (e.g. causal decoding, Sq = 1): no mask at all
    elif causal and not windowed and p["Sq"] == p["Sk"]:
        how = "causal"
    else:
        how = "mask"
    return scale, causal, (left, right), windowed, float(p.get("softcap", 0.0) or 0.0), how


def _static_reason(kind: str, case) -> str | None:
    p = case.params
    sq, sk, d = p["Sq"], p["Sk"], p["D"]
    _, causal, window, windowed, softcap, how = _geometry(p)
    takes_mask = KINDS[kind][3]
    if softcap:
        return f"{kind}: SDPA has no softcap (the spec applies softcap*tanh(s/softcap) to the scores)"
    lo, hi = key_bounds(sq, sk, causal, window)
    empty = int((hi < lo).sum())
    if empty:
        return (f"{kind}: {empty} query rows have no allowed key (spec: 0 output and gradient there); SDPA "
                f"leaves them undefined: its documented reference takes softmax over all -inf scores (NaN), and "
                f"torch warns that its lower-right causal bias gives NaN when Sq > Sk")
    if how == "mask" and not takes_mask:
        if not windowed:
            return f"{kind}: causal with Sq != Sk is top-left aligned in SDPA; oracle is bottom-right"
        return f"{kind}: SDPA has no sliding window, and the flash backend takes no attn_mask to spell one out"
    if kind == "sdpa_flash" and d > 256:
        return f"sdpa_flash: head dim {d} > 256"
    if kind == "sdpa_efficient":
        align = 4 if case.dtype == "f32" else 8
        if d % align:
            return f"sdpa_efficient: head dim {d} is not a multiple of {align} ({case.dtype})"
    if kind == "sdpa_cudnn":
        if d % 8:
            return f"sdpa_cudnn: head dim {d} is not a multiple of 8"
        if sk == 1:
            return "sdpa_cudnn: cuDNN SDPA does not support key/value length 1"
    return None


_PROBED: dict = {}


def with_stderr(fn):
    """(fn(), what it wrote to file descriptor 2).  torch's can_use_*_attention bindings report why
    they decline through C++ TORCH_WARN, which (no Python warning handler installed there) prints
    to the process's stderr, once per case, instead of raising a Python warning."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            result = fn()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        return result, tmp.read().decode(errors="replace")


def cpp_warnings(text: str) -> list[str]:
    """The messages of c10's warning lines, '[W... file.cpp:N] Warning: MESSAGE (function NAME)'."""
    found = []
    for line in text.splitlines():
        if "Warning: " in line:
            message = line.split("Warning: ", 1)[1].strip()
            found.append(re.sub(r"\s*\(function [^)]*\)$", "", message))
    return found


def _torch_reason(kind: str, case) -> str | None:
    """Ask torch's own backend check (on the GPU, with the case's shapes, dtype and mask)."""
    key = (kind, case.id)
    if key in _PROBED:
        return _PROBED[key]
    import torch
    from torch.backends import cuda as tcuda

    can_use = getattr(tcuda, KINDS[kind][1], None)
    if can_use is None or not hasattr(tcuda, "SDPAParams"):
        _PROBED[key] = None  # this torch cannot be asked; the call itself will say
        return None
    p = case.params
    b, sq, sk, hq, hkv, d = (p[n] for n in ("B", "Sq", "Sk", "Hq", "Hkv", "D"))
    dt = getattr(torch, _dtypes.long_name(case.dtype))
    q, k, v = (torch.empty((b, s, h, d), device="cuda", dtype=dt).transpose(1, 2).requires_grad_()
               for s, h in ((sq, hq), (sk, hkv), (sk, hkv)))
    _, causal, window, _, _, how = _geometry(p)
    mask = allowed_mask(sq, sk, causal, window, xp=torch, device="cuda") if how == "mask" else None
    try:
        params = tcuda.SDPAParams(q, k, v, mask, 0.0, how == "causal", hq != hkv)
    except TypeError:  # torch < 2.5: no enable_gqa
        if hq != hkv:
            _PROBED[key] = f"{kind}: torch {torch.__version__} has no enable_gqa (Hq={hq} != Hkv={hkv})"
            return _PROBED[key]
        params = tcuda.SDPAParams(q, k, v, mask, 0.0, how == "causal")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok, printed = with_stderr(lambda: can_use(params, True))
    reason = None
    said = [str(w.message).strip() for w in caught] + cpp_warnings(printed)
    if not ok:
        reason = f"{kind}: torch's check declines the case: {'; '.join(dict.fromkeys(said)) or 'no reason given'}"
    elif printed.strip():  # not a decline: whatever else it printed goes back where it was going
        sys.stderr.write(printed)
    _PROBED[key] = reason
    return reason


def _supports(kind: str, case) -> str | None:
    return _static_reason(kind, case) or _torch_reason(kind, case)


def _run(kind: str, inputs, outs, params):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v, do = (inputs[n] for n in ("q", "k", "v", "do"))
    sq, hq, sk, hkv = q.shape[1], q.shape[2], k.shape[1], k.shape[2]
    # The geometry comes from the tensors (argcheck made the params agree where they state it),
    # and what the harness skips a direct call must refuse: SDPA would silently drop a softcap.
    params = {**params, "Sq": sq, "Sk": sk, "D": q.shape[-1]}
    reason = _static_reason(kind, SimpleNamespace(params=params, dtype=_dtypes.from_any(q.dtype)))
    if reason:
        raise ValueError(f"{kind} {OP}: params {params} not supported: {reason}")
    scale, causal, window, _, _, how = _geometry(params)
    mask = allowed_mask(sq, sk, causal, window, xp=torch, device=q.device) if how == "mask" else None
    extra = {"enable_gqa": True} if hq != hkv else {}
    # SDPA's fused kernels want a unit stride along D: copy only a view that lacks one.
    q, k, v, do = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v, do))
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
    try:
        with sdpa_kernel(getattr(SDPBackend, KINDS[kind][0])):
            out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, is_causal=how == "causal",
                                                 scale=scale, **extra)
            dq, dk, dv = torch.autograd.grad(out, (qt, kt, vt), do.transpose(1, 2))
    except RuntimeError as exc:  # torch declined after all: report it, readable, as this case's error
        raise NotImplementedError(f"{kind}: {str(exc).splitlines()[0]}") from exc
    for name, grad in (("dq", dq), ("dk", dk), ("dv", dv)):
        outs[name].copy_(grad.transpose(1, 2))


BACKENDS = {}
for _kind, (_member, _fn, _dts, _mask, _desc) in KINDS.items():
    BACKENDS[_kind] = Backend(_kind, framework="torch", devices=("cuda",), description=_desc,
                              check=partial(_check, _kind))
    argcheck.register(BACKENDS[_kind], OP, dtypes=_dts, deterministic=False, supports=partial(_supports, _kind))(
        partial(_run, _kind))
