"""attention_backward through torch autograd of an explicit attention: what a user writes.

Math as flash-attention's `attention_ref` with upcast: q, k, v to float32 (float64 stays),
scores = scale * q k^T, softcap, mask, softmax, times v, back to the input dtype; then
torch.autograd.grad at cotangent do.  GQA by repeat_interleave of k and v over the
query heads of each group (autograd sums dk, dv over the group).  Runs on CPU and CUDA.

It ignores the given o and lse (autograd recomputes the forward), so it computes the
exact gradient of q, k, v, not the spec's "from the stored o and lse"; the difference is
inside the tolerance (see oracle/attention_backward.py).

Masking as attention_ref: masked scores are -inf; softmax is NaN on a row with no allowed
key, and that row is zeroed after the softmax.  The NaN never reaches a gradient:
masked_fill's backward selects 0 at every filled position (it does not multiply), so the
row gets output 0 and gradient 0, as the spec says.
"""
from __future__ import annotations

import math

from oracle.attention_backward import allowed_mask

OP = "attention_backward"
# The explicit softmax materialises B*Hq*Sq*Sk float32 scores several times over (scores,
# probabilities and their gradients): past this many bytes per copy it would not fit a GPU.
MAX_SCORE_BYTES = 12 << 30


def supports(case):
    p = case.params
    score_bytes = 4 * p["B"] * p["Hq"] * p["Sq"] * p["Sk"]
    if score_bytes > MAX_SCORE_BYTES:
        return (f"torch: the explicit softmax holds B*Hq*Sq*Sk float32 scores ({score_bytes / 2**30:.0f} GiB) "
                f"several times over; over the {MAX_SCORE_BYTES >> 30} GiB per copy this baseline allows")
    return None


def backward(inputs, params):
    import torch

    q, k, v, do = (inputs[n] for n in ("q", "k", "v", "do"))
    _, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale = params.get("softmax_scale")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    softcap = float(params.get("softcap", 0.0) or 0.0)
    window = tuple(int(w) for w in params.get("window", (-1, -1)))
    work = torch.promote_types(q.dtype, torch.float32)

    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    qf = q.to(work).transpose(1, 2)  # (B, Hq, Sq, D)
    kf = k.to(work).transpose(1, 2).repeat_interleave(hq // hkv, dim=1)  # (B, Hq, Sk, D)
    vf = v.to(work).transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    allowed = allowed_mask(sq, sk, bool(params.get("causal", False)), window, xp=torch, device=q.device)
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1).masked_fill(~allowed.any(dim=-1, keepdim=True), 0.0)
    out = torch.matmul(probs, vf).transpose(1, 2).to(q.dtype)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
    return {"dq": dq, "dk": dk, "dv": dv}
