"""`flash_attn`: the flash-attention 2 package (flash_attn.flash_attn_func), when it is installed.

It implements the spec's semantics natively: (B, S, H, D) layout, GQA/MQA, causal and
windows aligned to the bottom right, softcap (flash-attn >= 2.6), 0 output and gradient
on rows with no allowed key (it stores lse = +inf there, the convention the generator
follows).  Forward + backward through autograd, so like the sdpa_* baselines it times
the forward too and recomputes o and lse rather than taking the given ones.

Listed always; unavailable, with the reason "flash_attn: not installed", where the
package is missing (CPU machines, CI).
"""
from __future__ import annotations

import math
from types import SimpleNamespace

from harness import argcheck
from harness.registry import Backend

OP = "attention_backward"


def _version():
    import flash_attn

    return tuple(int(x) for x in flash_attn.__version__.split("+")[0].split(".")[:2])


def _check(device: str) -> str | None:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return "flash_attn: not installed"
    except Exception as exc:  # a broken install (CUDA/torch ABI mismatch) reads as unavailable
        return f"flash_attn: import failed: {type(exc).__name__}: {exc}"
    import torch

    if not torch.cuda.is_available():
        return "flash_attn: no CUDA device"
    return None


def _supports(case) -> str | None:
    p = case.params
    if p["D"] > 256:
        return f"flash_attn: head dim {p['D']} > 256"
    if p.get("softcap") and _version() < (2, 6):
        return f"flash_attn: softcap needs flash-attn >= 2.6 (found {'.'.join(map(str, _version()))})"
    if tuple(p.get("window", (-1, -1))) != (-1, -1) and _version() < (2, 3):
        return f"flash_attn: local windows need flash-attn >= 2.3 (found {'.'.join(map(str, _version()))})"
    return None


flash_attn_backend = Backend("flash_attn", framework="torch", devices=("cuda",),
                             description="flash-attention 2 package (flash_attn_func), forward + backward",
                             check=_check)


@argcheck.register(flash_attn_backend, OP, dtypes=("f16", "bf16"), deterministic=False, supports=_supports)
def attention_backward(inputs, outs, params):
    import torch
    from flash_attn import flash_attn_func

    # What the harness skips, a direct call must refuse: never run a case flash-attn would get wrong.
    reason = _supports(SimpleNamespace(params={**params, "D": inputs["q"].shape[-1]}))
    if reason:
        raise ValueError(f"flash_attn {OP}: params {params} not supported: {reason}")
    q, k, v = (inputs[n].detach().requires_grad_() for n in ("q", "k", "v"))
    scale = params.get("softmax_scale")
    kwargs = {"dropout_p": 0.0, "softmax_scale": 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale),
              "causal": bool(params.get("causal", False))}
    window = tuple(int(w) for w in params.get("window", (-1, -1)))
    if window != (-1, -1):
        kwargs["window_size"] = window
    if params.get("softcap"):
        kwargs["softcap"] = float(params["softcap"])
    out = flash_attn_func(q, k, v, **kwargs)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), inputs["do"])
    for name, grad in (("dq", dq), ("dk", dk), ("dv", dv)):
        outs[name].copy_(grad)
