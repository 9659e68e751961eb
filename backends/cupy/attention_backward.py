"""attention_backward for the `cupy` backend: FlashAttention-2 style CUDA C++
(backends/cuda/attention_backward.cuh, over mma.cuh) compiled with NVRTC through cupy.RawModule.
Spec: oracle/attention_backward.py (layout (B, S, H, D), GQA/MQA, causal / local windows aligned
bottom-right, softcap, softmax_scale, Sq != Sk, empty rows -> 0).

Variants:
  @fa2            bf16 / f16: preprocess (delta = rowsum(o * do), lse copied, empty rows neutralised,
                  the fp32 dq accumulator zeroed), main kernel per (key block, batch, kv head) with
                  K, V in shared memory and dK, dV in registers over every query block of the
                  group's heads (Q, dO double-buffered by cp.async, mma.sync m16n8k16 + ldmatrix,
                  unmasked blocks on a path with no mask code), dQ += dS K by fp32 atomics, then a
                  convert kernel.  Not bitwise reproducible (atomics).  When the main grid
                  would be short (GQA with few kv heads), a kv head's query heads are split over
                  blocks (`split_for`) whose fp32 dk, dv partials attn_split_sum adds in order.
  @fa2_det        the same main kernel without dQ, then a dQ kernel per (query block, head) over its
                  key blocks (S and dP recomputed): no float atomics, deterministic.
  @fa2_lean       fa2 with fewer live registers and narrower memory traffic (issue 17): the main
                  kernel computes S, dP, P, dS and the dK, dV update in query sub-blocks of QS rows
                  (QS / 8 score tiles live instead of BM / 8; the K, V fragments are reloaded per
                  sub-block), adds dQ by two-float reductions (red.global.add.v2.f32), and the
                  preprocess and dq convert read and write 16 bytes per lane (attn_pre_vec,
                  attn_dq_convert_vec) when D % 8 == 0 and o, do, dq are 16-byte aligned.  Shared
                  memory layout as fa2 (its padded row pitches are bank-conflict free:
                  tests/test_cuda_attention.py counts every ldmatrix and cp.async on the stand-in).
  @fa2_lean_det   fa2_det with the lean main kernel and preprocess.
  @best           = @fa2_lean: on the H100 (results/h100/s6/) 1.03-1.17x @fa2 on the six attn_s4
                  perf cases it was timed on, every `full` case PASS and @fa2_lean_det bitwise
                  equal over 50 calls.
  f32 and f64 (every variant): a SIMT path (no TF32: its error is outside the fp32 tolerance), one
  warp per query row for dq and per key row for dk, dv, accumulating in float / double.
Tiles: candidates per padded head dim (MAIN_CFGS, DQ_CFGS), the default first; on CUDA a call of
TUNE_MIN_FLOPS or more times them once per (variant, dtype, sizes, mask) and keeps the fastest
(GRADORACLE_CUPY_ATTN_TUNE=0: the defaults; GRADORACLE_CUPY_ATTN_CFG forces one).
Head dims up to 256: the tensor-core kernels compute on DP = 64, 128 or 256 columns, zero-filled
past D.  Larger head dims are declared unsupported.

Host side: `plan` is pure Python (tests run it against the CPU stand-in, tests/cuda_host_attention.py):
the launches of one (variant, dtype, sizes, strides, alignment, params) and the packed AttnParams,
cached in a dict; a call looks the plan up and launches.  Importing this module never imports cupy.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from backends.cupy import cupy_backend
from backends.cupy.common import CUDA_TYPE, overlap
from harness import argcheck, dtypes

OP = "attention_backward"
SOURCE = "attention_backward.cuh"
DTYPES = ("f32", "f16", "bf16", "f64")
TC_DTYPES = ("bf16", "f16")
MAX_D = 256
FIELDS = ("B", "Sq", "Sk", "Hq", "Hkv", "D", "G", "left", "right", "aligned",
          "q_b", "q_s", "q_h", "k_b", "k_s", "k_h", "v_b", "v_s", "v_h", "o_b", "o_s", "o_h", "do_b", "do_s", "do_h",
          "lse_b", "lse_h", "lse_s", "dq_b", "dq_s", "dq_h", "dk_b", "dk_s", "dk_h", "dv_b", "dv_s", "dv_h", "split")
PARAMS_DTYPE = np.dtype([("words", np.int64, (len(FIELDS),))])
# Candidate (BM query rows, BN keys, WD head-dim slices per key group) of the main kernel, per DP,
# the default first.  Warps: (BN / 16) * WD; D = 256 splits dK, dV over two warps per key group
# (registers).  ptxas (sm_90, bf16, atomic dq): 64x64x1 uses 253 registers at DP 64, 255 and a
# 96-byte spill at DP 128; 32x64x2 at DP 256 255 registers, no spill.
MAIN_CFGS = {64: [(64, 128, 1), (64, 64, 1), (32, 128, 1)],
             128: [(64, 128, 1), (64, 64, 1), (32, 128, 1), (32, 64, 1)],
             256: [(32, 64, 2), (16, 64, 2), (32, 32, 2)]}
# Candidate (BM, BN, WD, QS) of the lean main kernel (QS query rows per sub-block pass), per DP, the
# default first.  Every one compiles without spills (tests/test_cuda_attention_compile.py; ptxas
# sm_90, bf16 / f16): QS = 32 spills at (64, 128) with DP 128 (8 bytes) and at (64, 64) with DP 64.
LEAN_CFGS = {64: [(64, 128, 1, 32), (64, 128, 1, 16), (64, 64, 1, 16)],
             128: [(64, 128, 1, 16), (64, 64, 1, 32), (64, 64, 1, 16), (32, 128, 1, 16)],
             256: [(32, 64, 2, 16), (16, 64, 2, 16), (32, 32, 2, 16)]}
VARIANTS = ("fa2", "fa2_det", "fa2_lean", "fa2_lean_det")
# Candidate (BM, BN) of the deterministic dq kernel (BM / 16 warps), the default first.
DQ_CFGS = {64: [(64, 64), (128, 64), (64, 128)], 128: [(64, 64), (128, 64), (64, 32)], 256: [(64, 32), (32, 32)]}
TUNE_ENV = "GRADORACLE_CUPY_ATTN_TUNE"   # 0: always the default configuration
CFG_ENV = "GRADORACLE_CUPY_ATTN_CFG"     # "main=BMxBNxWD,dq=BMxBN": force one (tests, experiments)
TUNE_MIN_FLOPS = 2e10  # smaller calls keep the default (timing candidates would cost more than it saves)
SPLIT_WAVES = 3    # split a kv head's query heads over blocks until the main grid has this many per SM
PRE_ROWS = 4       # query rows per block of attn_pre (one warp each); warps per block of attn_pre_vec
CONVERT_BLOCK = 256


def padded_dim(d: int) -> int:
    """The head dim the tensor-core kernels compute on."""
    return 64 if d <= 64 else 128 if d <= 128 else 256


def lanes_per_row(d: int) -> int:
    """NPL of the SIMT kernels: head-dim elements per lane, a power of two with 32 * NPL >= D."""
    n = 1
    while 32 * n < d:
        n *= 2
    return n


def pre_lanes(d: int) -> int:
    """LPR of attn_pre_vec: lanes per query row, D / 8 rounded up to a power of two, at most 32."""
    n = 1
    while n < 32 and 8 * n < d:
        n *= 2
    return n


# The tensors whose 16-byte alignment a plan depends on: `aligned` (the main kernels' 16-byte loads of
# q, k, v, do) and `vec` (the lean variants' vector preprocess and dq convert over o, do, dq).
ALIGNED, VECTOR = ("q", "k", "v", "do"), ("o", "do", "dq")


def sixteen(d: int, views) -> bool:
    """D % 8 == 0 and every (address, element strides) of `views` 16-byte aligned, its leading three
    strides multiples of 8 elements: every row of D elements starts on 16 bytes."""
    return d % 8 == 0 and all(addr % 16 == 0 and all(s % 8 == 0 for s in strides[:3]) for addr, strides in views)


def is_lean(variant: str) -> bool:
    return variant.startswith("fa2_lean")


def is_det(variant: str) -> bool:
    return variant.endswith("_det")


def main_cfgs(variant: str, dp: int) -> list[tuple]:
    """The main kernel's candidate configurations of a variant at padded head dim dp."""
    return LEAN_CFGS[dp] if is_lean(variant) else MAIN_CFGS[dp]


def main_smem(dp: int, bm: int, bn: int) -> int:
    """attn_main_smem<DP, BM, BN>() of the .cuh."""
    return (2 * bn * (dp + 8) + 4 * bm * (dp + 8) + bn * (bm + 8)) * 2 + 4 * bm * 4


def dq_smem(dp: int, bm: int, bn: int) -> int:
    """attn_dq_smem<DP, BM, BN>() of the .cuh."""
    return (2 * bm * (dp + 8) + 4 * bn * (dp + 8)) * 2 + 2 * bm * 4


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def split_for(g: int, programs: int, sms: int | None) -> int:
    """How many blocks share the g query heads of a kv head (a power of two dividing g): the fewest
    that give the main kernel SPLIT_WAVES blocks per SM.  GQA with few kv heads otherwise leaves
    SMs idle, and under a causal mask the first key blocks (every query attends them) hold the
    whole grid up (llama-3 8B at 2k tokens: 16 key blocks x 8 kv heads = 128 blocks, each over 4
    heads, for 132 SMs).  A share costs one fp32 write and read of dk, dv."""
    split = 1
    while sms and programs * split < SPLIT_WAVES * sms and g % (2 * split) == 0:
        split *= 2
    return split


def mask_params(params: dict, d: int) -> tuple[float, float, int, int]:
    """(scale, softcap, left, right): causal folded into right = 0 (causal with a window is the
    window (left, 0)), -1 unbounded."""
    scale = params.get("softmax_scale")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    left, right = (int(w) for w in (params.get("window") or (-1, -1)))
    if params.get("causal", False):
        right = 0
    return scale, float(params.get("softcap", 0.0) or 0.0), left, right


@dataclass(frozen=True)
class Launch:
    expr: str
    grid: tuple[int, int]
    block: int
    smem: int
    args: tuple[str, ...]   # symbolic: P, scale, softcap, tensor and workspace names, null


@dataclass
class Plan:
    launches: tuple[Launch, ...]
    words: list[int]
    scale: float
    softcap: float
    ws: dict            # workspace name -> (elements, numpy dtype)
    cfg: object = None  # (main cfg, dq cfg) of `candidates`
    args: object = None  # the packed AttnParams (filled on first use)


def kernel_exprs(variant: str, dt: str, d: int, every: bool = True) -> list[str]:
    """The name expressions a call of (variant, dtype, head dim) may launch: with `every`, those
    of every candidate configuration (the compile tests instantiate each one)."""
    cfgs = candidates(variant, dt, d) if every else [default_cfg(variant, dt, d)]
    return sorted({launch.expr for cfg in cfgs for split in (1, 2) for vec in (False, True)
                   for launch in _launches(variant, dt, (1, 1, 1, 2, 1, d), cfg, split, vec)})


def candidates(variant: str, dt: str, d: int) -> list[tuple]:
    """(main cfg, dq cfg) pairs a tuning call times, the default first ([None] for the SIMT path)."""
    if dt not in TC_DTYPES:
        return [None]
    dp = padded_dim(d)
    mains = main_cfgs(variant, dp)
    if is_det(variant):  # the two kernels tune independently: vary one at a time
        return [(mains[0], DQ_CFGS[dp][0])] + [(m, DQ_CFGS[dp][0]) for m in mains[1:]] + \
            [(mains[0], q) for q in DQ_CFGS[dp][1:]]
    return [(m, None) for m in mains]


def forced_cfg(variant: str, dt: str, d: int):
    """The configuration CFG_ENV names, or None."""
    text = os.environ.get(CFG_ENV, "").strip()
    if not text or dt not in TC_DTYPES:
        return None
    dp = padded_dim(d)
    mains = main_cfgs(variant, dp)
    main, dq = mains[0], DQ_CFGS[dp][0] if is_det(variant) else None
    for part in text.split(","):
        name, _, value = part.partition("=")
        nums = tuple(int(x) for x in value.split("x"))
        if name.strip() == "main":
            main = nums
        elif name.strip() == "dq" and is_det(variant):
            dq = nums
    if main not in mains or (dq is not None and dq not in DQ_CFGS[dp]):
        raise ValueError(f"cupy {OP}: {CFG_ENV}={text!r}: expected main in {mains}"
                         f"{f' and dq in {DQ_CFGS[dp]}' if is_det(variant) else ''} for head dim {d} ({variant})")
    return main, dq


def default_cfg(variant: str, dt: str, d: int):
    return forced_cfg(variant, dt, d) or candidates(variant, dt, d)[0]


def _launches(variant: str, dt: str, sizes, cfg, split: int = 1, vec: bool = False) -> tuple[Launch, ...]:
    """vec: D % 8 == 0 and o, do, dq 16-byte aligned (the lean variants' vector preprocess and convert)."""
    b, sq, sk, hq, hkv, d = sizes
    t = CUDA_TYPE[dt]
    acc = "double" if dt == "f64" else "float"
    pre_grid = (_cdiv(b * hq * sq, PRE_ROWS), 1)
    common = ("P", "scale", "softcap", "q", "k", "v", "do", "lse_ws", "delta_ws")
    if dt not in TC_DTYPES:
        npl = lanes_per_row(d)
        return (Launch(f"attn_pre<{t}, {acc}>", pre_grid, 32 * PRE_ROWS, 0,
                       ("P", "o", "do", "lse", "lse_ws", "delta_ws", "null")),
                Launch(f"attn_simt_dq<{t}, {acc}, {npl}>", (_cdiv(b * hq * sq, 4), 1), 128, 0, common + ("dq",)),
                Launch(f"attn_simt_dkdv<{t}, {acc}, {npl}>", (_cdiv(b * hkv * sk, 4), 1), 128, 0,
                       common + ("dk", "dv")))
    dp = padded_dim(d)
    main_cfg, dqc = cfg
    bm, bn, wd = main_cfg[:3]
    det, lean = is_det(variant), is_lean(variant)
    vec = vec and lean
    targs = f"{t}, {dp}, {bm}, {bn}, {wd}, {'false' if det else 'true'}"
    if lean and (main_cfg[3] != bm or not det):  # QS, RED2 (dQ adds only with the atomic dq); with
        targs += f", {main_cfg[3]}, {'false' if det else 'true'}"  # QS = BM and no RED2 it is fa2's kernel
    main = Launch(f"attn_fa2_main<{targs}>",
                  (_cdiv(sk, bn), b * hkv * split), 32 * (bn // 16) * wd, main_smem(dp, bm, bn),
                  common + ("null" if det else "dq_acc", "part" if split > 1 else "null", "dk", "dv"))
    n_kv = b * sk * hkv * d
    tail = (Launch(f"attn_split_sum<{t}>", (min(_cdiv(n_kv, CONVERT_BLOCK), 8192), 1), CONVERT_BLOCK, 0,
                   ("P", "part", "dk", "dv")),) if split > 1 else ()
    pre_args = ("P", "o", "do", "lse", "lse_ws", "delta_ws", "null" if det else "dq_acc")
    if vec:
        lpr = pre_lanes(d)
        pre = Launch(f"attn_pre_vec<{t}, {lpr}>", (_cdiv(b * hq * sq, PRE_ROWS * (32 // lpr)), 1), 32 * PRE_ROWS, 0,
                     pre_args)
    else:
        pre = Launch(f"attn_pre<{t}, float>", pre_grid, 32 * PRE_ROWS, 0, pre_args)
    if det:
        qbm, qbn = dqc
        dq = Launch(f"attn_fa2_dq<{t}, {dp}, {qbm}, {qbn}>", (_cdiv(sq, qbm), b * hq), 32 * (qbm // 16),
                    dq_smem(dp, qbm, qbn), common + ("dq",))
        return (pre, main, dq) + tail
    n = b * sq * hq * d
    if vec:
        conv = Launch(f"attn_dq_convert_vec<{t}>", (max(1, min(_cdiv(n // 8, CONVERT_BLOCK), 8192)), 1),
                      CONVERT_BLOCK, 0, ("P", "scale", "dq_acc", "dq"))
    else:
        conv = Launch(f"attn_dq_convert<{t}>", (min(_cdiv(n, CONVERT_BLOCK), 8192), 1), CONVERT_BLOCK, 0,
                      ("P", "scale", "dq_acc", "dq"))
    return (pre, main, conv) + tail


def plan(variant: str, dt: str, sizes, strides: dict, aligned: bool, params: dict, cfg=None,
         sms: int | None = None, vec: bool = False) -> Plan:
    """The launches and packed parameters of one call.  sizes (B, Sq, Sk, Hq, Hkv, D); strides:
    name -> element strides of q, k, v, o, do, lse, dq, dk, dv (head-dim strides 1); cfg one of
    `candidates` (None: the default); sms: the device's SM count (None: no head split); vec: o,
    do, dq allow 16-byte accesses (D % 8 == 0, 16-byte aligned rows)."""
    b, sq, sk, hq, hkv, d = sizes
    scale, softcap, left, right = mask_params(params, d)
    if cfg is None:
        cfg = default_cfg(variant, dt, d)
    split = split_for(hq // hkv, _cdiv(sk, cfg[0][1]) * b * hkv, sms) if cfg is not None else 1
    values = dict(B=b, Sq=sq, Sk=sk, Hq=hq, Hkv=hkv, D=d, G=hq // hkv, left=left, right=right, aligned=int(aligned),
                  split=split)
    for name in ("q", "k", "v", "o", "do", "dq", "dk", "dv"):
        values[f"{name}_b"], values[f"{name}_s"], values[f"{name}_h"] = strides[name][:3]
    values["lse_b"], values["lse_h"], values["lse_s"] = strides["lse"]
    words = [int(values[f]) for f in FIELDS]
    acc = np.float64 if dt == "f64" else np.float32
    ws = {"lse_ws": (b * hq * sq, acc), "delta_ws": (b * hq * sq, acc)}
    if dt in TC_DTYPES and not is_det(variant):
        ws["dq_acc"] = (b * sq * hq * d, np.float32)
    if split > 1:
        ws["part"] = (2 * split * b * sk * hkv * d, np.float32)
    return Plan(_launches(variant, dt, sizes, cfg, split, vec), words, scale, softcap, ws, cfg)


def params_struct(words: list[int]) -> np.ndarray:
    """AttnParams by value: cupy passes the bytes of a size-1 numpy array as the argument."""
    arg = np.zeros(1, dtype=PARAMS_DTYPE)
    arg["words"][0] = words
    return arg


def run(dev, p: Plan, tensors: dict) -> None:
    """Launch plan p on `dev` (CupyDevice, or the CPU stand-in in tests); tensors: q, k, v, o, do,
    lse, dq, dk, dv (head-dim stride 1)."""
    if p.args is None:
        p.args = params_struct(p.words)
    bufs = dict(tensors)
    for name, (n, dtype) in p.ws.items():
        bufs[name] = dev.workspace(p, name, n, dtype)
    scalars = {"P": p.args, "scale": np.float64(p.scale), "softcap": np.float64(p.softcap), "null": np.uint64(0)}
    for launch in p.launches:
        args = tuple(scalars[a] if a in scalars else bufs[a] for a in launch.args)
        dev.launch(launch, args)


# ----------------------------------------------------------------------------- the cupy side

_PLANS: dict = {}
_FAST: dict = {}     # (variant, params, pointers, layouts) -> plan: repeated calls skip every check
_FAST_MAX = 4096
_DEVICE: list = []
_INPUTS = ("q", "k", "v", "o", "do", "lse")
_OUTPUTS = ("dq", "dk", "dv")


class CupyDevice:
    """Launches through cupy (its current stream) and per-plan workspaces (one per stream)."""

    def __init__(self):
        import cupy

        self.cupy = cupy
        self._fns: dict = {}
        self._ws: dict = {}

    def function(self, launch: Launch):
        fn = self._fns.get(launch.expr)
        if fn is None:
            from backends.cupy.common import function

            fn = function(SOURCE, launch.expr)
            if launch.smem > 48 * 1024:
                fn.max_dynamic_shared_size_bytes = launch.smem
            self._fns[launch.expr] = fn
        return fn

    def num_sms(self) -> int:
        from backends.cupy.common import num_sms

        return num_sms()

    def launch(self, launch: Launch, args) -> None:
        self.function(launch)(launch.grid, (launch.block,), args, shared_mem=launch.smem)

    def time_ms(self, fn, reps: int = 3) -> float:
        """Best of `reps` timed calls of fn (after one untimed), in milliseconds."""
        fn()
        best = math.inf
        for _ in range(reps):
            start, stop = self.cupy.cuda.Event(), self.cupy.cuda.Event()
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            best = min(best, self.cupy.cuda.get_elapsed_time(start, stop))
        return best

    def workspace(self, p: Plan, name: str, n: int, dtype):
        """A view of n elements of the stream's `name` buffer (one per stream, name and dtype, grown
        on demand and shared by every plan); the plan keeps its view while the buffer stays."""
        key = (self.cupy.cuda.get_current_stream().ptr, name, np.dtype(dtype).str)
        buf = self._ws.get(key)
        if buf is None or buf.size < n:
            buf = self._ws[key] = self.cupy.empty(max(n, 2 * buf.size if buf is not None else n), dtype=dtype)
        views = p.__dict__.setdefault("_views", {})
        view = views.get(key)
        if view is None or view[0] is not buf:
            view = views[key] = (buf, buf[:n])
        return view[1]


def device() -> CupyDevice:
    if not _DEVICE:
        _DEVICE.append(CupyDevice())
    return _DEVICE[0]


def element_strides(x) -> tuple[int, ...]:
    item = x.dtype.itemsize
    return tuple(s // item for s in x.strides)


def call(dev, variant: str, inputs: dict, outs: dict, params: dict, xp=None, address=None) -> None:
    """One attention_backward call on `dev`.  xp: the array module (cupy, numpy in tests);
    address(x) -> int, the data pointer (alignment of the cp.async path, overlap checks).  Inputs
    whose head-dim stride is not 1 go through contiguous copies; outputs must be contiguous."""
    if xp is None:
        import cupy as xp
    if address is None:
        address = lambda x: x.data.ptr  # noqa: E731
    # A call with the pointers, layouts and params of an earlier checked one: its plan, no checks
    # to redo (they depend on nothing else).  Only keys are kept, never the arrays.
    fast = (variant, os.environ.get(CFG_ENV), params.get("causal", False), str(params.get("window")),
            params.get("softcap"), params.get("softmax_scale"),
            *[(address(x), x.shape, x.strides, x.dtype) for x in (inputs[n] for n in _INPUTS)],
            *[(address(x), x.shape, x.strides, x.dtype) for x in (outs[n] for n in _OUTPUTS)])
    p = _FAST.get(fast)
    if p is not None:
        run(dev, p, {**inputs, **outs})
        return
    q, k = inputs["q"], inputs["k"]
    dt = dtypes.from_any(q.dtype)
    tensors = {}
    for name in _INPUTS:
        x = inputs[name]
        tensors[name] = x if name == "lse" or x.strides[-1] == x.dtype.itemsize else xp.ascontiguousarray(x)
    _check_outputs(inputs, outs, address)
    for name in _OUTPUTS:
        tensors[name] = outs[name]
    strides = {name: element_strides(x) for name, x in tensors.items()}
    sizes = (q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3])
    d = sizes[5]
    aligned = sixteen(d, [(address(tensors[n]), strides[n]) for n in ALIGNED])
    vec = sixteen(d, [(address(tensors[n]), strides[n]) for n in VECTOR])
    mask = (params.get("causal", False), tuple(params.get("window") or (-1, -1)), params.get("softcap"),
            params.get("softmax_scale"))
    key = (variant, dt, sizes, tuple(sorted(strides.items())), aligned, vec, mask, os.environ.get(CFG_ENV))
    p = _PLANS.get(key)
    if p is None:
        cfg = None
        if hasattr(dev, "time_ms") and _tuning(variant, dt, sizes):
            tkey = (variant, dt, sizes, mask)
            cfg = _TUNED.get(tkey)
            if cfg is None:
                cfg = _TUNED[tkey] = _tune(dev, variant, dt, sizes, strides, aligned, params, tensors, vec)
        p = _PLANS[key] = plan(variant, dt, sizes, strides, aligned, params, cfg, dev.num_sms(), vec)
    if all(tensors[n] is inputs[n] for n in _INPUTS):  # no copies made: the next such call is a lookup
        if len(_FAST) >= _FAST_MAX:
            _FAST.clear()
        _FAST[fast] = p
    run(dev, p, tensors)


def _span(x, address) -> tuple[int, int]:
    """[first, end) bytes of x's elements (non-negative strides: arrays the harness and cupy make)."""
    start = address(x)
    return start, start + sum((n - 1) * s for n, s in zip(x.shape, x.strides)) + x.dtype.itemsize


def _check_outputs(inputs: dict, outs: dict, address) -> None:
    """Outputs are written densely while the inputs are read: each must be C-contiguous and share
    no memory with an input or another output (ValueError naming both)."""
    spans = {}
    for name in _OUTPUTS:
        y = outs[name]
        if not y.flags.c_contiguous:
            raise ValueError(f"cupy {OP}: {name} must be contiguous, got strides {y.strides} (bytes) for shape "
                             f"{tuple(y.shape)}")
        spans[name] = _span(y, address)
    for name in _INPUTS:
        spans[name] = _span(inputs[name], address)
    for name in _OUTPUTS:
        for other, span in spans.items():
            if other != name and overlap(spans[name], span):
                raise ValueError(f"cupy {OP}: {name} shares memory with {other}, expected a separate array")


_TUNED: dict = {}
TUNE_MARGIN = 0.03  # another candidate must beat the default by this much


def _tuning(variant: str, dt: str, sizes) -> bool:
    b, sq, sk, hq, _, d = sizes
    return (os.environ.get(TUNE_ENV, "1") != "0" and forced_cfg(variant, dt, d) is None
            and len(candidates(variant, dt, d)) > 1 and 10.0 * b * hq * sq * sk * d >= TUNE_MIN_FLOPS)


def _tune(dev, variant: str, dt: str, sizes, strides, aligned: bool, params: dict, tensors: dict,
          vec: bool = False):
    """The fastest candidate configuration for this call's sizes, timed on `dev` (once per class;
    every candidate writes the same outputs, and the caller's own run follows)."""
    best, best_ms = None, math.inf
    for i, cfg in enumerate(candidates(variant, dt, sizes[5])):
        trial = plan(variant, dt, sizes, strides, aligned, params, cfg, dev.num_sms(), vec)
        try:
            ms = dev.time_ms(lambda: run(dev, trial, tensors))
        except Exception:  # noqa: BLE001 - a candidate that cannot launch here (resources) is skipped
            if i == 0:
                raise
            continue
        if i == 0 or ms < best_ms * (1 - TUNE_MARGIN):
            best, best_ms = cfg, ms
    return best


def supports(case) -> str | None:
    d = case.params["D"]
    if d > MAX_D:
        return f"cupy {OP}: head dim {d} > {MAX_D} (the kernels hold at most {MAX_D} columns per row)"
    return None


@argcheck.register(cupy_backend, OP, variant="fa2", dtypes=DTYPES, deterministic=False, supports=supports)
def attention_backward_fa2(inputs, outs, params):
    call(device(), "fa2", inputs, outs, params)


@argcheck.register(cupy_backend, OP, variant="best", dtypes=DTYPES, deterministic=False, supports=supports)
def attention_backward_best(inputs, outs, params):
    call(device(), "fa2_lean", inputs, outs, params)


@argcheck.register(cupy_backend, OP, variant="fa2_det", dtypes=DTYPES, deterministic=True, supports=supports)
def attention_backward_fa2_det(inputs, outs, params):
    call(device(), "fa2_det", inputs, outs, params)


@argcheck.register(cupy_backend, OP, variant="fa2_lean", dtypes=DTYPES, deterministic=False, supports=supports)
def attention_backward_fa2_lean(inputs, outs, params):
    call(device(), "fa2_lean", inputs, outs, params)


@argcheck.register(cupy_backend, OP, variant="fa2_lean_det", dtypes=DTYPES, deterministic=True, supports=supports)
def attention_backward_fa2_lean_det(inputs, outs, params):
    call(device(), "fa2_lean_det", inputs, outs, params)
