"""attention_backward for `torch_ext`: the op's Python side (the C++ is attention_backward.cpp /
_cuda.cu / .h).  Spec: oracle/attention_backward.py.

Ops (namespace gradoracle; schemas in attention_backward.cpp; `dout` is the oracle's `do`):
    attention_backward(q, k, v, o, dout, lse, float? softmax_scale, bool causal, int[] window,
                       float softcap) -> (dq, dk, dv)
    attention_backward.out(..., *, Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv) -> ()
    _attention_backward_run(q, k, v, o, dout, lse, Tensor plan, float scale, float softcap, *, dq, dk, dv) -> ()

The plan is cupy@fa2_lean's (= cupy@best; backends/cupy/attention_backward.py, pure Python, never
imports cupy) with its default tiles (the ones the extension builds; no tuning): header words (kind,
template parameters, grids; attention_backward.h) then AttnParams.  CUDA runs the .cuh's kernels
(bf16 / f16 on tensor cores with atomic dq, f32 / f64 SIMT); the CPU runs plain C++ loops.
`torch_ext@det` runs cupy@fa2_lean_det's kernels instead (dq by its own kernel, no float atomics:
bitwise repeatable) through the same run op.  Plans are cached per layout; an input whose head-dim
stride is not 1 goes through a contiguous copy; outputs must be contiguous (ValueError otherwise, as
every kernel backend here).
Both public ops have fake (meta) kernels running harness.argcheck's checks, so they trace under
torch.compile(fullgraph=True).
"""
from __future__ import annotations

from backends.cupy import attention_backward as A
from backends.torch_ext import require, torch_ext
from harness import argcheck, dtypes

OP = A.OP
DTYPES = A.DTYPES
KIND = {"fa2_lean": 0, "fa2_lean_det": 1, "simt": 2}  # attention_backward.h AttnKind
BEST, BEST_DET = "fa2_lean", "fa2_lean_det"
_PLANS: dict = {}
_RUN = None  # torch.ops.gradoracle._attention_backward_run.default, once loaded
_INPUTS = ("q", "k", "v", "o", "do", "lse")


def _params(softmax_scale, causal, window, softcap) -> dict:
    return {"softmax_scale": softmax_scale, "causal": bool(causal), "window": list(window or (-1, -1)),
            "softcap": float(softcap or 0.0)}


def plan_words(variant: str, dt: str, sizes, strides: dict, aligned: bool, params: dict,
               sms: int | None = None, vec: bool = False) -> tuple[list[int], float, float]:
    """(plan words, scale, softcap) for the run op: header + AttnParams (attention_backward.h);
    sms: the CUDA device's SM count (None on the CPU: no head split); vec: o, do, dq allow 16-byte
    accesses (the 16-byte preprocess and dq convert)."""
    d = sizes[5]
    cfg = A.candidates(variant, dt, d)[0]  # the default tiles: what the extension builds
    p = A.plan(variant, dt, sizes, strides, aligned, params, cfg, sms, vec)
    launches = p.launches
    if cfg is None:
        kind, dp, (bm, bn, wd, qs), (qbm, qbn), npl, lpr = KIND["simt"], 0, (0, 0, 0, 0), (0, 0), A.lanes_per_row(d), 0
    else:
        kind, dp, (bm, bn, wd, qs), npl = KIND[variant], A.padded_dim(d), cfg[0], 0
        qbm, qbn = cfg[1] if cfg[1] is not None else (0, 0)
        lpr = A.pre_lanes(d) if launches[0].expr.startswith("attn_pre_vec") else 0
    g3x = launches[3].grid[0] if len(launches) > 3 else 0  # attn_split_sum
    header = [kind, dp, bm, bn, wd, qs, qbm, qbn, npl, lpr, launches[0].grid[0], *launches[1].grid,
              *launches[2].grid, g3x]
    return header + p.words, p.scale, p.softcap


def _plan_for(variant: str, t: dict, params: dict):
    import torch

    q, k = t["q"], t["k"]
    dt = dtypes.from_any(q.dtype)
    sizes = (q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3])
    strides = {n: tuple(x.stride()) for n, x in t.items()}
    aligned = q.is_cuda and A.sixteen(sizes[5], [(t[n].data_ptr(), strides[n]) for n in A.ALIGNED])
    vec = q.is_cuda and A.sixteen(sizes[5], [(t[n].data_ptr(), strides[n]) for n in A.VECTOR])
    key = (variant, dt, sizes, tuple(sorted(strides.items())), aligned, vec, params["causal"],
           tuple(params["window"]), params["softcap"], params["softmax_scale"], q.device.type)
    entry = _PLANS.get(key)
    if entry is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else None
        words, scale, softcap = plan_words(variant, dt, sizes, strides, aligned, params, sms, vec)
        entry = _PLANS[key] = (torch.tensor(words, dtype=torch.int64), scale, softcap)
    return entry


def run(q, k, v, o, dout, lse, dq, dk, dv, params: dict, variant: str = BEST) -> None:
    """Write dq, dk, dv in place (the extension must be loaded)."""
    t = {"q": q, "k": k, "v": v, "o": o, "do": dout, "lse": lse}
    for name in _INPUTS[:5]:
        if t[name].stride(-1) != 1:
            t[name] = t[name].contiguous()
    outs = {"dq": dq, "dk": dk, "dv": dv}
    for name, y in outs.items():
        if not y.is_contiguous():
            raise ValueError(f"torch_ext {OP}: {name} must be contiguous, got strides {tuple(y.stride())} for shape "
                             f"{tuple(y.shape)}")
    t.update(outs)
    plan, scale, softcap = _plan_for(variant, t, params)
    _RUN(t["q"], t["k"], t["v"], t["o"], t["do"], t["lse"], plan, scale, softcap, dq=dq, dk=dk, dv=dv)


def _check(q, k, v, o, dout, lse, params, dq=None, dk=None, dv=None) -> None:
    inputs = {"q": q, "k": k, "v": v, "o": o, "do": dout, "lse": lse}
    argcheck.check(OP, inputs, {"dq": dq, "dk": dk, "dv": dv}, params, who="torch_ext", framework="torch")


def _functional(q, k, v, o, dout, lse, softmax_scale, causal, window, softcap):
    params = _params(softmax_scale, causal, window, softcap)
    dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    run(q, k, v, o, dout, lse, dq, dk, dv, params)
    return dq, dk, dv


def _out(q, k, v, o, dout, lse, softmax_scale, causal, window, softcap, *, dq, dk, dv):
    run(q, k, v, o, dout, lse, dq, dk, dv, _params(softmax_scale, causal, window, softcap))


def on_load(with_cuda: bool) -> None:
    """Once the library is loaded: the public ops' Python kernels and their fake kernels."""
    import torch

    global _RUN
    _RUN = torch.ops.gradoracle._attention_backward_run.default
    devices = ("cpu", "cuda") if with_cuda else ("cpu",)
    torch.library.impl(f"gradoracle::{OP}", devices, _functional)
    torch.library.impl(f"gradoracle::{OP}.out", devices, _out)

    @torch.library.register_fake(f"gradoracle::{OP}")
    def _fake(q, k, v, o, dout, lse, softmax_scale, causal, window, softcap):
        _check(q, k, v, o, dout, lse, _params(softmax_scale, causal, window, softcap))
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    @torch.library.register_fake(f"gradoracle::{OP}.out")
    def _out_fake(q, k, v, o, dout, lse, softmax_scale, causal, window, softcap, *, dq, dk, dv):
        _check(q, k, v, o, dout, lse, _params(softmax_scale, causal, window, softcap), dq, dk, dv)

    @torch.library.register_fake(f"gradoracle::_{OP}_run")
    def _run_fake(q, k, v, o, dout, lse, plan, scale, softcap, *, dq, dk, dv):
        return None


def _harness_params(params: dict) -> dict:
    return _params(params.get("softmax_scale"), params.get("causal", False), params.get("window"),
                   params.get("softcap"))


@argcheck.register(torch_ext, OP, dtypes=DTYPES, deterministic=False, supports=A.supports)
def _attention_backward_impl(inputs, outs, params):
    """cupy@best's kernels (CUDA) or the C++ loops (CPU); writes outs in place."""
    require()
    run(inputs["q"], inputs["k"], inputs["v"], inputs["o"], inputs["do"], inputs["lse"], outs["dq"], outs["dk"],
        outs["dv"], _harness_params(params))


@argcheck.register(torch_ext, OP, variant="det", dtypes=DTYPES, deterministic=True, supports=A.supports)
def _attention_backward_det_impl(inputs, outs, params):
    """cupy@fa2_lean_det's kernels (CUDA: no float atomics) or the C++ loops (CPU); writes outs in place."""
    require()
    run(inputs["q"], inputs["k"], inputs["v"], inputs["o"], inputs["do"], inputs["lse"], outs["dq"], outs["dk"],
        outs["dv"], _harness_params(params), BEST_DET)


def attention_backward(q, k, v, o, dout, lse, softmax_scale=None, causal=False, window=(-1, -1), softcap=0.0):
    """(dq, dk, dv) by the functional op (works under torch.compile)."""
    import torch

    require()
    return torch.ops.gradoracle.attention_backward(q, k, v, o, dout, lse, softmax_scale, causal, list(window),
                                                   float(softcap))
