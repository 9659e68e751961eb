"""attention_backward as Triton kernels on tensor cores (FlashAttention-2 structure).

The whole spec of oracle/attention_backward.py: layout (B, S, H, D) (any strides of the
inputs; contiguous outputs), GQA/MQA, causal and local windows aligned bottom-right,
softcap, softmax_scale, Sq != Sk, head dims up to 256 (padded in-kernel to a power of two
>= 16 with masks), rows with no allowed key (gradient 0), f16 / bf16 / f32 / f64.

Kernels (backends/triton/_attn_kernels.py):

1. preprocess: delta = rowsum(o * do) and lse * log2(e) per query row, in float32 (float64
   for float64); empty rows get 0 and +inf whatever o and lse hold.  The default variant
   also zeroes its float32 dq accumulator here (no memset launch).
2. main: one program per (key block, batch, kv head); k, v stay on chip, dk, dv
   accumulate in registers over the query blocks of every query head of the kv head's
   group, p recomputed from q, k and the stored lse.  Only the query blocks that meet the
   band are visited, in three loops: masked blocks, fully allowed blocks (no mask code),
   masked blocks.  When the grid would hold under two programs per SM (GQA with few kv heads
   and short sequences), a kv head's query heads are split over several programs, whose
   float32 partial dk, dv a fourth kernel adds in a fixed order (`split_for`).
3. dq, two ways:
     atomics         the main kernel adds dS k into the float32 accumulator by atomics, a
                     cast kernel scales and rounds it: fewest flops, not bit-reproducible;
     a dq pass       a separate kernel per (query block, head) loops over its key blocks
                     (recomputing p and dp): no float atomics, the same bits every call.
   triton@det always takes the dq pass.  triton (declared deterministic=False) takes it where its
   grid has a program per SM or more (`dq_by_atomics`): there it measured 1.00-1.34x the atomic
   kernels' speed on 31 of the 33 H100 perf cases it was timed on beside them (BENCHMARKS.md,
   ninth session; not yet profiled, so why is not measured); the atomics elsewhere (decoding: one
   query row, where the pass ran at 0.30-0.39x), and always on the CPU, where the interpreter tests
   cover them through it.

Host side: a plan per (variant, layout, dtype, params, device, sizing) caches the launches
(`_steps.Step`: the compiled kernels' own launchers after the first call) and its float32
workspace (delta, lse * log2 e, the dq accumulator, split partials; one per CUDA stream), so
a repeated call is a dict lookup and three or four launches.  The checked entry checks the
arguments and, on CUDA for a call of TUNE_MIN_FLOPS or more, settles the sizing of its
class once by timing a few candidates (`candidates`); the unchecked entry (what timed loops
call) only looks the plan up.  GRADORACLE_TRITON_TUNE=0 keeps the defaults.

Cost model: the oracle's (2.5 x the forward over the allowed pairs); the det variant does
two more matmuls per visited pair (s and dp again), which the figures do not count.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from backends.triton import triton_backend
from backends.triton import _attn_kernels as K
from backends.triton._steps import Step
from backends.triton.common import byte_span, cdiv, interpreted, on_device, overlap, p2
from backends.triton.common import TUNE_ENV, time_ms, tuning_on  # noqa: F401 - TUNE_ENV: for callers
from harness import argcheck

OP = "attention_backward"
DTYPES = ("f32", "f16", "bf16", "f64")
MAX_D = 256
TUNE_MIN_FLOPS = 2e10     # smaller calls keep the default sizing (tuning would cost more than it saves)
TUNE_MARGIN = 0.03        # another candidate must beat the default by this much
LOG2E = 1.4426950408889634


# ============================================================================= sizing


@dataclass(frozen=True)
class Config:
    """Block sizes: (bm query rows x bn keys) per step of the main kernel, (bm2 x bn2) of the dq kernel."""

    bm: int
    bn: int
    warps: int
    stages: int
    bm2: int
    bn2: int
    warps2: int
    stages2: int
    pre_bm: int = 64
    split: int = 0    # programs sharing a kv head's query heads (0: from the SM count, see `split_for`)


# Candidates per (element size, padded head dim), the default first.  16-bit inputs use the
# tensor cores; float32 (ieee) and float64 dots do not, so they take small tiles.
_CANDIDATES = {
    # (bm, bn, warps, stages | bm2, bn2, warps2, stages2).  ptxas on sm_90 (bf16, causal, atomic dq):
    # main D=64: 64x128/8w spills 64 B, 64x64/4w 68 B; D=128: 32x128/8w 60 B, 64x64/8w 136 B,
    # 64x128/8w 460 B; D=256: 32x32/8w 12 B, 16x32/4w 84 B, 32x64/8w 1236 B.  The dq kernels
    # below spill nothing but D=256 64x32/8w (68 B).
    (2, 64): [Config(64, 128, 8, 3, 128, 64, 8, 3), Config(64, 64, 4, 3, 128, 32, 4, 4),
              Config(32, 128, 8, 3, 128, 32, 8, 3)],
    (2, 128): [Config(32, 128, 8, 2, 128, 64, 8, 2), Config(64, 64, 8, 2, 128, 32, 8, 2),
               Config(64, 128, 8, 2, 64, 64, 4, 2)],
    (2, 256): [Config(32, 32, 8, 2, 32, 32, 4, 2), Config(16, 32, 4, 2, 32, 32, 4, 2),
               Config(32, 64, 8, 2, 64, 32, 8, 2)],
    (4, 64): [Config(32, 64, 4, 2, 64, 32, 4, 2)],
    (4, 128): [Config(32, 64, 8, 1, 64, 32, 8, 1)],
    (4, 256): [Config(16, 32, 4, 1, 32, 16, 4, 1)],
    (8, 64): [Config(16, 32, 4, 1, 32, 16, 4, 1)],
    (8, 128): [Config(16, 32, 4, 1, 32, 16, 4, 1)],
    (8, 256): [Config(16, 16, 4, 1, 16, 16, 4, 1)],
}
# The interpreter: small tiles, so even the smoke shapes cross several blocks and every loop runs.
INTERP_CONFIG = Config(32, 32, 4, 1, 32, 32, 4, 1, 32)


def padded_dim(d: int) -> int:
    """The head dim the kernels compute on: the next power of two, at least 16 (tl.dot's minimum)."""
    return max(16, p2(d))


def split_for(g: int, programs: int, sms: int) -> int:
    """How many programs share the g query heads of a kv head (a divisor of g): the fewest that
    give the main kernel two programs per SM.  GQA with few kv heads and short sequences
    otherwise leaves SMs idle (llama-3 8B at 2k tokens: 16 key blocks x 8 kv heads = 128
    programs for 132 SMs, each over 4 heads); the split costs one float32 write and read of
    dk, dv per share."""
    split = 1
    while programs * split < 2 * sms and split < g and g % (split * 2) == 0:
        split *= 2
    return split


_SMS: dict = {}


def _sm_count(device) -> int:
    if device.type != "cuda":
        return 1
    if device.index not in _SMS:
        import torch

        _SMS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device.index]


def dq_by_atomics(variant: str, q, cfg: Config) -> bool:
    """Whether a plan makes dq by float32 atomics (see the module docstring, 3.)."""
    if variant != "default":
        return False
    if q.device.type != "cuda":
        return True
    b, sq, hq, _ = q.shape
    return cdiv(sq, cfg.bm2) * b * hq < _sm_count(q.device)


def candidates(itemsize: int, d: int) -> list[Config]:
    dp = padded_dim(d)
    return _CANDIDATES[(itemsize, max(64, dp))]


# ============================================================================= plans


def _mask_args(params: dict, d: int) -> tuple:
    """(left, right, has_left, has_right, softcap, scale): the mask as the kernels take it
    (causal folded into right = 0: causal with a window is the window (left, 0))."""
    scale = params.get("softmax_scale")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    left, right = (int(w) for w in params.get("window", (-1, -1)) or (-1, -1))
    if params.get("causal", False):
        right = 0
    return left, right, left >= 0, right >= 0, float(params.get("softcap", 0.0) or 0.0), scale


class _Plan:
    """The launches of one call layout: preprocess, main, then cast (atomic dq) or the dq kernel."""

    def __init__(self, variant: str, q, k, lse, o, do, v, dq, dk, dv, params: dict, cfg: Config):
        import torch

        b, sq, hq, d = q.shape
        sk, hkv = k.shape[1], k.shape[2]
        left, right, has_l, has_r, softcap, scale = _mask_args(params, d)
        is64 = q.dtype == torch.float64
        acc = torch.float64 if is64 else torch.float32
        dp = padded_dim(d)
        self.atomic = dq_by_atomics(variant, q, cfg)
        self.device, self.cfg, self._ws = q.device, cfg, {}
        lg = 1.0 if is64 else LOG2E
        self.consts = torch.tensor([scale * lg, scale / softcap if softcap else 0.0, softcap * lg, scale, lg],
                                   dtype=acc, device=q.device)
        rows = b * hq * sq
        self.seg = -(-rows // 8) * 8  # keeps each workspace slice 16-byte aligned
        self.ws_len = 2 * self.seg + (b * sq * hq * d if self.atomic else 0)
        self.acc = acc
        common = dict(Sq=sq, Sk=sk, Hq=hq, D=d, LEFT=left, RIGHT=right, HAS_LEFT=has_l, HAS_RIGHT=has_r,
                      IS_F64=is64, DP=dp)
        prec = "ieee" if q.dtype in (torch.float32, torch.float64) else "tf32"
        s = lambda x: tuple(int(t) for t in x.stride())  # noqa: E731
        (so_b, so_s, so_h, so_d), (sd_b, sd_s, sd_h, sd_d) = s(o), s(do)
        sl_b, sl_h, sl_s = s(lse)
        self.pre = Step(K._attn_pre_kernel, (cdiv(sq, cfg.pre_bm), b * hq), 7, dict(
            common, so_b=so_b, so_s=so_s, so_h=so_h, so_d=so_d, sd_b=sd_b, sd_s=sd_s, sd_h=sd_h, sd_d=sd_d,
            sl_b=sl_b, sl_h=sl_h, sl_s=sl_s, ZERO_DQ=self.atomic, BM=cfg.pre_bm), 4)
        qs, ks, vs = s(q), s(k), s(v)
        strides = dict(zip(("sq_b", "sq_s", "sq_h", "sq_d"), qs), **dict(zip(("sk_b", "sk_s", "sk_h", "sk_d"), ks)),
                       **dict(zip(("sv_b", "sv_s", "sv_h", "sv_d"), vs)),
                       **dict(zip(("sd_b", "sd_s", "sd_h", "sd_d"), (sd_b, sd_s, sd_h, sd_d))))
        flags = dict(SOFTCAP=bool(softcap), PREC=prec, EVEN_D=dp == d, G=hq // hkv)
        g = hq // hkv
        split = cfg.split or split_for(g, cdiv(sk, cfg.bn) * b * hkv, _sm_count(q.device))
        if g % split:
            raise ValueError(f"triton {OP}: split {split} does not divide the group of {g} query heads")
        self.split = split
        n_kv = b * sk * hkv * d
        if split > 1:  # partials (split, B, Sk, Hkv, D), contiguous, summed by _attn_sum_kernel
            (sdk_b, sdk_s, sdk_h), sdk_p = (sk * hkv * d, hkv * d, d), n_kv
            (sdv_b, sdv_s, sdv_h), sdv_p = (sdk_b, sdk_s, sdk_h), n_kv
            self.ws_len += 2 * split * n_kv
            self.sum = Step(K._attn_sum_kernel, (cdiv(n_kv, 1024),), 4, dict(n=n_kv, SPLIT=split, BLOCK=1024), 4)
        else:
            (sdk_b, sdk_s, sdk_h, _), (sdv_b, sdv_s, sdv_h, _) = s(dk), s(dv)
            sdk_p = sdv_p = 0
        self.n_kv = n_kv
        self.main = Step(K._attn_dkdv_kernel, (cdiv(sk, cfg.bn), b * hkv * split), 10, dict(
            common, **strides, **flags, Hkv=hkv, SPLIT=split, sdk_p=sdk_p, sdk_b=sdk_b, sdk_s=sdk_s,
            sdk_h=sdk_h, sdv_p=sdv_p, sdv_b=sdv_b, sdv_s=sdv_s, sdv_h=sdv_h, ATOMIC_DQ=self.atomic, BM=cfg.bm,
            BN=cfg.bn), cfg.warps, num_stages=cfg.stages)
        if self.atomic:
            n = b * sq * hq * d
            self.n_dq = n
            self.last = Step(K._attn_cast_kernel, (cdiv(n, 1024),), 3, dict(n=n, BLOCK=1024), 4)
        else:
            sdq_b, sdq_s, sdq_h, _ = s(dq)
            self.last = Step(K._attn_dq_kernel, (cdiv(sq, cfg.bm2), b * hq), 8, dict(
                common, **strides, **flags, sdq_b=sdq_b, sdq_s=sdq_s, sdq_h=sdq_h, BM=cfg.bm2, BN=cfg.bn2),
                cfg.warps2, num_stages=cfg.stages2)

    def workspace(self) -> tuple:
        """(delta, lse2, dk partials, dv partials, dq accumulator) for the current stream: kept by
        the plan, one set per stream (calls on one stream run in order, so they may share it)."""
        import torch

        sid = torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0
        views = self._ws.get(sid)
        if views is None:
            ws = torch.empty(self.ws_len, dtype=self.acc, device=self.device)
            seg, n = self.seg, self.split * self.n_kv if self.split > 1 else 0
            views = (ws[:seg], ws[seg:2 * seg], ws[2 * seg:2 * seg + n], ws[2 * seg + n:2 * seg + 2 * n],
                     ws[2 * seg + 2 * n:])
            self._ws[sid] = views
        return views

    def __call__(self, q, k, v, o, do, lse, dq, dk, dv) -> None:
        delta, lse2, dkp, dvp, dqa = self.workspace()
        c = self.consts
        split = self.split > 1  # the main kernel writes partials; the sum kernel dk and dv
        dk_in, dv_in = (dkp, dvp) if split else (dk, dv)
        if self.atomic:
            self.pre(o, do, lse, c, delta, lse2, dqa)
            self.main(q, k, v, do, lse2, delta, c, dk_in, dv_in, dqa)
            self.last(dqa, c, dq)
        else:
            self.pre(o, do, lse, c, delta, lse2, delta)
            self.main(q, k, v, do, lse2, delta, c, dk_in, dv_in, delta)
            self.last(q, k, v, do, lse2, delta, c, dq)
        if split:
            self.sum(dkp, dvp, dk, dv)

    def launches(self) -> list:
        return [self.pre, self.main, self.last] + ([self.sum] if self.split > 1 else [])


_PLANS: dict = {}
MAX_PLANS = 64  # plans hold workspaces: the oldest goes when a run has met more layouts than this
_TUNED: dict = {}        # (device index, tune class) -> Config
TUNING_LOG: dict = {}    # (device index, tune class) -> {"tried": [...], "chosen": i}


def _key(variant, q, k, v, o, do, lse, dq, dk, dv, params, cfg) -> tuple:
    return (variant, q.dtype, q.device, q.shape, k.shape, q.stride(), k.stride(), v.stride(), o.stride(),
            do.stride(), lse.stride(), dq.stride(), dk.stride(), dv.stride(), params.get("causal", False),
            tuple(params.get("window", (-1, -1)) or (-1, -1)), params.get("softcap", 0.0),
            params.get("softmax_scale"), cfg)


def _call(variant: str, inputs: dict, outs: dict, params: dict, cfg: Config | None = None, tune: bool = False):
    q, k, v, o, do, lse = inputs["q"], inputs["k"], inputs["v"], inputs["o"], inputs["do"], inputs["lse"]
    dq, dk, dv = outs["dq"], outs["dk"], outs["dv"]
    key = _key(variant, q, k, v, o, do, lse, dq, dk, dv, params, cfg)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _new_plan(key, variant, q, k, v, o, do, lse, dq, dk, dv, params, cfg, tune)
    if q.device.type == "cuda":
        with on_device(q):
            plan(q, k, v, o, do, lse, dq, dk, dv)
    else:
        plan(q, k, v, o, do, lse, dq, dk, dv)


def _new_plan(key, variant, q, k, v, o, do, lse, dq, dk, dv, params, cfg, tune) -> _Plan:
    args = (q, k, lse, o, do, v, dq, dk, dv)
    if cfg is not None:
        plan = _Plan(variant, *args, params, cfg)
    elif interpreted() or q.device.type != "cuda":
        plan = _Plan(variant, *args, params, INTERP_CONFIG)
    else:
        with on_device(q):
            plan = _auto_plan(variant, args, params, tune)
    _PLANS[key] = plan
    if len(_PLANS) > MAX_PLANS:
        _PLANS.pop(next(iter(_PLANS)))
    return plan


def clear_plans() -> None:
    _PLANS.clear()


# ============================================================================= autotuning
#
# Per tune class (variant, dtype, padded head dim, masked or not) the first checked CUDA call
# of TUNE_MIN_FLOPS or more times each candidate on its own tensors and keeps the fastest
# (the default unless another is TUNE_MARGIN faster; a candidate that fails to compile, e.g.
# out of shared memory, is dropped).  The choice is made before the call's own launch and
# never changes after: every later call of the class runs the same kernels.  Unchecked calls
# never tune (they find the plan the checked call built).


def tune_class(variant, q, params) -> tuple:
    masked = bool(params.get("causal")) or tuple(params.get("window", (-1, -1)) or (-1, -1)) != (-1, -1)
    return (variant, str(q.dtype), padded_dim(q.shape[3]), masked)


def _flops(q, k) -> float:
    b, sq, hq, d = q.shape
    return 10.0 * b * hq * d * sq * k.shape[1]


def _auto_plan(variant, args, params, tune) -> _Plan:
    q, k = args[0], args[1]
    cands = candidates(q.element_size(), q.shape[3])
    if len(cands) == 1 or not tuning_on() or _flops(q, k) < TUNE_MIN_FLOPS:
        return _Plan(variant, *args, params, cands[0])
    tkey = (q.device.index, tune_class(variant, q, params))
    cfg = _TUNED.get(tkey)
    if cfg is not None or not tune:
        return _Plan(variant, *args, params, cfg or cands[0])
    return _autotune(tkey, variant, args, params, cands)


def _autotune(tkey, variant, args, params, cands) -> _Plan:
    import torch

    q, k, lse, o, do, v, dq, dk, dv = args
    # Scratch outputs: the candidates must not leave their bits in the caller's buffers.
    scratch = (torch.empty_like(dq), torch.empty_like(dk), torch.empty_like(dv))
    tensors = (q, k, v, o, do, lse, *scratch)
    tried, plans = [], []
    for i, cfg in enumerate(cands):
        try:
            plan = _Plan(variant, *args, params, cfg)
            ms = time_ms(lambda: plan(*tensors))
        except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory: that candidate is out
            if i == 0:
                raise
            tried.append({"config": cfg, "error": f"{type(exc).__name__}: {exc}"[:300]})
            plans.append(None)
            continue
        spills = max(int(getattr(L.compiled, "n_spills", 0) or 0) for L in plan.launches())
        tried.append({"config": cfg, "ms": ms, "spills": spills})
        plans.append(plan)
    timed = [(t["ms"], i) for i, t in enumerate(tried) if "ms" in t]
    best_ms, best = min(timed)
    if best_ms > (1 - TUNE_MARGIN) * tried[0]["ms"]:
        best = 0
    _TUNED[tkey] = tried[best]["config"]
    TUNING_LOG[tkey] = {"tried": tried, "chosen": best}
    return plans[best]


# ============================================================================= checks and entries


def _fail(cls, what: str, expected: str, got) -> None:
    raise cls(f"triton {OP}: {what}: expected {expected}, got {got}")


def _check_limits(inputs, outs) -> None:
    """What the kernels need beyond the op's argument rule (run after it): head dim <= 256,
    contiguous outputs, outputs in buffers of their own."""
    q = inputs["q"]
    d = q.shape[3]
    if d > MAX_D:
        _fail(ValueError, "head dim (q.shape[3])", f"at most {MAX_D}", d)
    if q.device.type not in ("cuda", "cpu"):
        _fail(ValueError, "device", "cuda, or cpu under TRITON_INTERPRET=1", q.device)
    for name in ("dq", "dk", "dv"):
        if not outs[name].is_contiguous():
            _fail(ValueError, name, "a contiguous tensor", f"strides {tuple(outs[name].stride())}")
    spans = {n: byte_span(x) for n, x in (*inputs.items(), *outs.items())}
    for name in ("dq", "dk", "dv"):
        for other in spans:
            if other != name and overlap(spans[name], spans[other]):
                _fail(ValueError, name, "a buffer of its own (outputs are written while inputs are read)",
                      f"memory shared with {other}")


def _supports(case) -> str | None:
    d = int(case.params.get("D", 0))
    return f"triton {OP}: head dim {d} > {MAX_D}" if d > MAX_D else None


def _entry(variant: str, deterministic: bool, doc: str):
    def checked(inputs, outs, params):
        argcheck.check_impl(impl, inputs, outs, params)
        _check_limits(inputs, outs)
        _call(variant, inputs, outs, params, None, True)

    def unchecked(inputs, outs, params):
        _call(variant, inputs, outs, params)

    checked.unchecked = unchecked
    checked.__doc__ = doc
    checked.__name__ = checked.__qualname__ = f"{OP}_{variant}"
    triton_backend.impl(OP, variant=variant, dtypes=DTYPES, deterministic=deterministic,
                        supports=_supports)(checked)
    impl = triton_backend.impls[(OP, variant)]
    return checked


attention_backward = _entry("default", False, "attention_backward, dq by a separate pass where its grid fills the "
                            "GPU, else by float32 atomics (not bit-reproducible).")
attention_backward_det = _entry("det", True, "attention_backward, dq by its own pass over the key blocks: deterministic.")


def run(inputs: dict, outs: dict, params: dict, variant: str = "default", cfg: Config | None = None) -> None:
    """attention_backward with explicit sizing (`cfg`); tests use it to force block sizes."""
    _call(variant, inputs, outs, params, cfg)
