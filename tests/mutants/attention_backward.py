"""attention_backward mutants: mask edges off by one, causal aligned top-left, the GQA head map off by
one, softcap applied after the mask, dq without its scale, a group head left out of dk/dv, key and query
tail blocks dropped, an unwritten row.

Each is a fused backward that takes the forward's o and lse as given (as the spec and flash-attention
do) and gets one thing wrong; the per-block formulas are the oracle's (attention_backward_block)."""
from __future__ import annotations

import numpy as np

from mutants.common import f64, plant, reference, write
from oracle.attention_backward import _params, allowed_mask, attention_backward_block

OP = "attention_backward"


def grouped(h: int, g: int, hkv: int) -> int:
    return h // g


def attention(inputs, params, *, mask=allowed_mask, head=grouped, cap_after_mask=False, dq_scale=True,
              skip_group_head=False, dkdv_rows=None) -> dict:
    """{dq, dk, dv} from the given o and lse, per (batch, query head); dkdv_rows(Sq) -> the query rows
    whose terms reach dk and dv (default all)."""
    q, k, v, o, do, lse = (f64(inputs[n]) for n in ("q", "k", "v", "o", "do", "lse"))
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    scale, causal, window, softcap = _params(params, d)
    allowed = mask(sq, sk, causal, window)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for bi in range(b):
        for h in range(hq):
            c = head(h, g, hkv)
            args = (q[bi, :, h], k[bi, :, c], v[bi, :, c], o[bi, :, h], do[bi, :, h], lse[bi, h])
            part = _capped_after_mask(*args, allowed, scale, softcap) if cap_after_mask and softcap else \
                attention_backward_block(*args, allowed, scale, softcap)
            dq[bi, :, h] = part["dq"] if dq_scale else part["dq"] / scale
            if skip_group_head and g > 1 and h % g == g - 1:
                continue
            if dkdv_rows is not None:  # the dk/dv pass sees only these query rows
                rows = dkdv_rows(sq)
                qh, kh, vh, oh, doh, lseh = args
                part = attention_backward_block(qh[rows], kh, vh, oh[rows], doh[rows], lseh[rows], allowed[rows],
                                                scale, softcap)
            dk[bi, :, c] += part["dk"]
            dv[bi, :, c] += part["dv"]
    return {"dq": dq, "dk": dk, "dv": dv}


def _capped_after_mask(q, k, v, o, do, lse, allowed, scale, softcap):
    """One block with the cap applied to the masked scores: a masked -inf becomes -softcap, so masked
    keys get weight exp(-softcap - lse) (their 1 - tanh**2 is 0, so only dv and the row sums see them)."""
    s = np.where(allowed, (q @ k.T) * scale, -np.inf)
    th = np.tanh(s / softcap)
    live = allowed.any(axis=1)
    p = np.exp(np.where(live[:, None], softcap * th - np.where(live, lse, 0.0)[:, None], -np.inf))
    ds = p * (do @ v.T - np.einsum("id,id->i", do, o)[:, None]) * (1.0 - th * th)
    return {"dq": scale * (ds @ k), "dk": scale * (ds.T @ q), "dv": p.T @ do}


def _edge_mask(side: str):
    """allowed_mask with the window's `side` edge one key short (`>` for `>=`, `<` for `<=`)."""
    def mask(sq, sk, causal, window):
        ok = allowed_mask(sq, sk, causal, window)
        left, right = window
        diag = np.arange(sq)[:, None] + (sk - sq)
        j = np.arange(sk)[None, :]
        if side == "left" and left >= 0:
            ok &= j != diag - left
        if side == "right" and right >= 0 and not causal:
            ok &= j != diag + right
        return ok
    return mask


def _whole_blocks(n: int, block: int = 64) -> int:
    """How far a loop over whole blocks of `block` gets: the tail past them is lost (when there is one)."""
    return n - n % block if n > block else n


def _no_key_tail(sq, sk, causal, window):
    """allowed_mask without the keys past the last whole block of 64 (a K/V loop missing its tail)."""
    ok = allowed_mask(sq, sk, causal, window)
    ok[:, _whole_blocks(sk):] = False
    return ok


def _top_left(sq, sk, causal, window):
    """The mask with causal aligned to the top left (j <= i), as torch SDPA's is_causal."""
    ok = allowed_mask(sq, sk, False, window)
    return ok & (np.arange(sk)[None, :] <= np.arange(sq)[:, None]) if causal else ok


@reference.impl(OP)
def correct(inputs, outs, params):
    write(outs, attention(inputs, params))


@plant(OP, "window_left_edge_off_by_one")
def window_left_edge_off_by_one(inputs, outs, params):
    """The local window's left edge is exclusive (j > i + off - left): one key short."""
    write(outs, attention(inputs, params, mask=_edge_mask("left")))


@plant(OP, "window_right_edge_off_by_one")
def window_right_edge_off_by_one(inputs, outs, params):
    """The local window's right edge is exclusive (j < i + off + right): one key short."""
    write(outs, attention(inputs, params, mask=_edge_mask("right")))


@plant(OP, "causal_top_left")
def causal_top_left(inputs, outs, params):
    """causal aligned to the top left (j <= i) instead of the bottom right: differs when Sq != Sk."""
    write(outs, attention(inputs, params, mask=_top_left))


@plant(OP, "gqa_head_map_off_by_one")
def gqa_head_map_off_by_one(inputs, outs, params):
    """Query head h reads kv head (h + 1) // g (clamped) instead of h // g: a group's last head strays."""
    write(outs, attention(inputs, params, head=lambda h, g, hkv: min((h + 1) // g, hkv - 1)))


@plant(OP, "softcap_after_mask")
def softcap_after_mask(inputs, outs, params):
    """softcap applied after the mask: masked scores become -softcap instead of staying -inf."""
    write(outs, attention(inputs, params, cap_after_mask=True))


@plant(OP, "dq_missing_scale")
def dq_missing_scale(inputs, outs, params):
    """dq = dS @ k without the softmax scale."""
    write(outs, attention(inputs, params, dq_scale=False))


@plant(OP, "dkdv_drop_last_group_head")
def dkdv_drop_last_group_head(inputs, outs, params):
    """dk and dv of a kv head sum its group's query heads but the last (GQA/MQA)."""
    write(outs, attention(inputs, params, skip_group_head=True))


@plant(OP, "drops_key_tail_block")
def drops_key_tail_block(inputs, outs, params):
    """The loop over key blocks of 64 skips the partial last block (Sk not a multiple of 64)."""
    write(outs, attention(inputs, params, mask=_no_key_tail))


@plant(OP, "dkdv_drop_query_tail_block")
def dkdv_drop_query_tail_block(inputs, outs, params):
    """The dk/dv pass loops over whole query blocks of 64: the partial last block adds nothing to dk, dv."""
    write(outs, attention(inputs, params, dkdv_rows=lambda sq: slice(0, _whole_blocks(sq))))


@plant(OP, "dq_last_row_unwritten")
def dq_last_row_unwritten(inputs, outs, params):
    """dq's last query row (of every batch and head) is never written (the NaN-poison control)."""
    values = attention(inputs, params)
    write(outs, {"dk": values["dk"], "dv": values["dv"]})
    outs["dq"][:, :-1] = values["dq"][:, :-1]
