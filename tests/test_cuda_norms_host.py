"""The cupy norm kernels' CUDA source, executed on the CPU, judged by the harness.

tests/cuda_host.py compiles backends/cuda/{layernorm,rmsnorm}_backward.cuh with g++ against a CUDA
stand-in (a fiber per thread, real __syncthreads barriers and warp shuffles, bit-exact bfloat16 and
float16 conversions; divergent barriers or shuffles are reported, not hung on).  `cupyhost` below is
the cupy backend's host code (_norm_plan.build_entry / check_overlap / run, the same planning and
launch sequence) over that device, registered as a numpy backend for the CPU, so the harness's own
`run_case` checks it: NaN-poisoned outputs inside canary bands, NaN bands around the inputs,
inputs unchanged, repeated calls bitwise equal for `best`, the stale-input recheck, the float64
oracle and its tolerance model.  The planner sees 3 SMs, so cases with enough rows take several
blocks and the partial-row second stage.

`best` runs with the default settings (nb_rows, nb_chunked for long rows); `best_rows2*` and
`best_rows3*` with GRADORACLE_CUPY_NORMS' other kernels, nb_rows3 with nb_colsum after it and with
two copy stages (slots refilled every other step).  The stand-in defers every asynchronous copy to
the wait that retires it, and fills dynamic shared memory with NaN, so a missing wait or a slot
refilled too early shows up as a wrong result.

What this cannot check: timing, the memory model across blocks (blocks run one after another),
and the GPU's own rounding (no FMA contraction on the host): the GPU batch
(scripts/gpu/cuda_norms.sh) runs the same cases on the device.
"""
from __future__ import annotations

import ctypes
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

import cuda_host
from backends.cupy import _norm_plan as plan
from cases import select
from cases.registry import Case
from harness import dtypes
from harness.registry import Backend
from harness.runner import run_case

LN, RMS = plan.LN, plan.RMS
WHY = cuda_host.available()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"CUDA-on-CPU stand-in unavailable: {WHY}")

NUM_SMS = 3
DEVICE = cuda_host.HostCudaDevice()
_ENTRIES: dict = {}

cupyhost = Backend("cupyhost", framework="numpy", devices=("cpu",), register=False,
                   description="the cupy norm kernels' CUDA source run on the CPU (tests/cuda_host)")


KNOBS = {"best": "", "best_rows": "kernel=rows", "best_rows2": "kernel=rows2",
         "best_rows2_pf2": "kernel=rows2,prefetch=2,minrows=1",
         "best_rows3_colsum": "kernel=rows3,finish=colsum", "best_rows3_s2": "kernel=rows3,stages=2,minrows=1"}
for _op in (LN, RMS):
    for _dt in plan.DTYPES:  # instantiations beyond the defaults' (built into the stand-in's library)
        cuda_host.EXTRA_EXPRS[(_op, _dt)] = sorted(
            set(plan.all_kernel_exprs(_op, _dt, plan.settings(KNOBS["best_rows2_pf2"])))
            | set(plan.all_kernel_exprs(_op, _dt, plan.settings(KNOBS["best_rows3_s2"])))
            | set(plan.all_kernel_exprs(_op, _dt, plan.settings(KNOBS["best_rows"]))))


def _impl(op: str, variant: str, num_sms: int = NUM_SMS, knobs: str = ""):
    def fn(inputs, outs, params):
        arrays = {"x": inputs["x"], "dy": inputs["dy"], "weight": inputs.get("weight"), "mean": inputs.get("mean"),
                  "rstd": inputs["rstd"], "dx": outs["dx"], "dweight": outs.get("dweight"), "dbias": outs.get("dbias")}
        arrs = tuple(arrays[k] for k in plan.NAMES)
        ptrs = [0 if a is None else cuda_host.address(a) for a in arrs]
        aligned = not (ptrs[plan.X] | ptrs[plan.DY] | ptrs[plan.DX] | ptrs[plan.W]) & 15
        key = (op, variant, num_sms, knobs, aligned,
               *[None if a is None else (a.shape, a.strides, a.dtype) for a in arrs])
        entry = _ENTRIES.get(key)
        if entry is None:  # kept, as the cupy backend keeps it: later calls reuse its workspace
            entry = _ENTRIES[key] = plan.build_entry(op, variant, dtypes.from_any(arrs[0].dtype), arrays, aligned,
                                                     num_sms, knobs=plan.settings(knobs))
        plan.check_overlap(entry, ptrs)
        plan.run(DEVICE, entry, arrs)
    return fn


def _v5_supports(case):
    from backends.cupy.layernorm_backward import _v5_supports as supports

    return supports(case)


for _variant in plan.RUNGS:
    cupyhost.impl(LN, variant=_variant, dtypes=plan.DTYPES, deterministic=False,
                  supports=_v5_supports if _variant == "v5" else None)(_impl(LN, _variant))
for _op in (LN, RMS):
    for _name, _knobs in KNOBS.items():
        cupyhost.impl(_op, variant=_name, dtypes=plan.DTYPES)(_impl(_op, "best", knobs=_knobs))
    # 40 SMs: 16 or more partial rows, every row slice of nb_colsum in use
    cupyhost.impl(_op, variant="best_40sm", dtypes=plan.DTYPES)(_impl(_op, "best", 40))
    # cupy@v6 as the backend registers it (nb_rows2 whatever the variable says), and with one row
    # per block at least: 40 SMs give it many partial rows.
    cupyhost.impl(_op, variant="v6", dtypes=plan.DTYPES)(_impl(_op, "v6"))
    cupyhost.impl(_op, variant="v6_40sm", dtypes=plan.DTYPES)(_impl(_op, "v6", 40, "minrows=1"))
    # cupy@v7 (nb_rows3, the column sums in the same cooperative launch, split in two here), and
    # with 40 SMs and one row per block at least: many partial rows, every block in the finish.
    cupyhost.impl(_op, variant="v7", dtypes=plan.DTYPES)(_impl(_op, "v7"))
    cupyhost.impl(_op, variant="v7_40sm", dtypes=plan.DTYPES)(_impl(_op, "v7", 40, "minrows=1"))


def _case(op, dtype, shape, **params):
    c = Case(op, dtype, {"shape": list(shape), **params}, frozenset({"full"}), "test")
    from harness.registry import get_op

    get_op(op).validate(c)
    return c


# Paths the smoke set does not reach: rows too long for registers (column chunks, scalar and
# vector), several partial rows of a chunked launch, strided long rows, tall narrow cases, and
# blocks that take several steps of wide (multi-warp) rows.
EXTRA = [
    _case(LN, "f32", (7, 9000)),
    _case(LN, "bf16", (5, 8200), bias=False),
    _case(LN, "f16", (4, 8193), affine=False),
    _case(LN, "f64", (9, 2050)),
    _case(LN, "bf16", (6, 8200), x_layout="transposed"),
    _case(LN, "f32", (1, 4100)),
    _case(RMS, "bf16", (5, 8200), eps=1e-5),
    _case(RMS, "f32", (4, 4099), dy_layout="sliced"),
    _case(RMS, "f64", (3, 2050)),
    _case(LN, "bf16", (1500, 8)),
    _case(RMS, "f16", (700, 24)),
    _case(LN, "bf16", (40, 2048)),   # 4 groups of 128 threads, 4 steps: the row-sum buffers' reuse
    _case(RMS, "bf16", (12, 8192), eps=1e-5),  # one 512-thread group, 4 steps
]


MANY_PARTS = [
    _case(LN, "f32", (300, 1024)),
    _case(LN, "f32", (40, 4100), bias=False),
    _case(RMS, "bf16", (260, 1024)),
    _case(LN, "f32", (3000, 33)),  # N % 4 != 0: nb_rows' scalar path, 64 groups of 8 threads
]


def _ids(cases):
    return [c.id for c in cases]


def _check(impl_id: str, case) -> None:
    op_impls = {i.variant: i for (o, _), i in cupyhost.impls.items() if o == case.op}
    impl = op_impls[impl_id]
    result = run_case(impl, case, "cpu", run_seed=0)
    if result.status == "SKIP":
        assert impl_id == "v5" and "v5" in result.reason, result.reason
        return
    assert result.status == "PASS", f"{impl.id} {case.id}: {result.status} {result.reason}\n" + \
        "\n".join(r.line() for r in result.outputs)


@pytest.fixture(autouse=True)
def _default_settings(monkeypatch):
    monkeypatch.delenv(plan.ENV, raising=False)  # each impl names its own knobs
    # These tests exercise the driver launch path as the default they were written for; the
    # shipped default launches through cupy until the driver path has run on a GPU.
    monkeypatch.setitem(plan.SETTINGS, "launch", (plan.SETTINGS["launch"][0], "driver"))


@pytest.mark.parametrize("case", select("smoke", op=LN), ids=_ids(select("smoke", op=LN)))
@pytest.mark.parametrize("variant", [*KNOBS, *plan.RUNGS])
def test_layernorm_smoke_on_host(variant, case):
    _check(variant, case)


@pytest.mark.parametrize("case", select("smoke", op=RMS), ids=_ids(select("smoke", op=RMS)))
@pytest.mark.parametrize("variant", list(KNOBS))
def test_rmsnorm_smoke_on_host(variant, case):
    _check(variant, case)


@pytest.mark.parametrize("case", EXTRA, ids=_ids(EXTRA))
def test_long_rows_and_partial_rows_on_host(case):
    for variant in ("best", "best_rows2", "best_rows2_pf2", "v6", "v7"):
        _check(variant, case)
    shape = case.params["shape"]
    if case.op == LN and shape[-1] <= 8200 and np.prod(shape[:-1]) <= 64:  # long rows through two rungs too
        for rung in ("v2", "v5"):
            _check(rung, case)


@pytest.mark.parametrize("case", MANY_PARTS, ids=_ids(MANY_PARTS))
def test_many_partial_rows_on_host(case):
    _check("best_40sm", case)
    _check("v6_40sm", case)
    _check("v7_40sm", case)


def test_the_extra_cases_reach_their_paths():
    seen = set()
    for case, sms in [(c, NUM_SMS) for c in EXTRA] + [(c, 40) for c in MANY_PARTS]:
        x = np.zeros(case.params["shape"], dtypes.numpy_dtype(case.dtype))
        n = x.shape[-1]
        arrays = {"x": x, "dy": x, "weight": np.zeros(n, x.dtype), "mean": None if case.op == RMS else x[..., 0],
                  "rstd": x[..., 0], "dx": x.copy(), "dweight": np.zeros(n, x.dtype), "dbias": None}
        arrays["mean"] = None if case.op == RMS else np.zeros(x.shape[:-1], np.float64 if case.dtype == "f64"
                                                                else np.float32)
        arrays["rstd"] = np.zeros(x.shape[:-1], np.float64 if case.dtype == "f64" else np.float32)
        for knobs in KNOBS.values():
            entry = plan.build_entry(case.op, "best", case.dtype, arrays, True, sms, knobs=plan.settings(knobs))
            seen.add((entry.launch.kind, entry.launch.vec > 1, entry.launch.nparts > 1, entry.launch.coop))
            if sms == 40 and entry.launch.kind not in ("chunked", "rows2", "rows3"):  # rows2 / 3: ROWS2_MIN_ROWS a block
                assert entry.launch.nparts >= 2 * (plan.COLSUM_BLOCK // 32), entry.launch
    for case in MANY_PARTS:  # v6_40sm: every row slice of nb_colsum in use there too
        x = np.zeros(case.params["shape"], dtypes.numpy_dtype(case.dtype))
        n = x.shape[-1]
        st = np.float64 if case.dtype == "f64" else np.float32
        arrays = {"x": x, "dy": x, "weight": np.zeros(n, x.dtype), "mean": None if case.op == RMS else
                  np.zeros(x.shape[:-1], st), "rstd": np.zeros(x.shape[:-1], st), "dx": x.copy(),
                  "dweight": np.zeros(n, x.dtype), "dbias": None}
        entry = plan.build_entry(case.op, "v6", case.dtype, arrays, True, 40, knobs=plan.settings("minrows=1"))
        if entry.launch.kind != "rows2":  # N = 4100 f32: 1025 vectors, longer than nb_rows2 holds
            assert plan.rows2_config(n, entry.launch.vec, x.dtype.itemsize) is None
            continue
        assert entry.launch.kind == "rows2" and entry.launch.nparts >= 2 * (plan.COLSUM_BLOCK // 32), entry.launch
        seen.add(("rows2", entry.launch.vec > 1, True, False))
    assert {("rows2", True, True, False), ("rows2", False, True, False), ("chunked", True, True, False), ("chunked", False, True, False), ("rows", True, True, False),
            ("rows", False, True, False)} <= seen


# ============================================================================= nb_rows3 (cupy@v7)

# Dense 16-byte rows of every group shape nb_rows3 takes: a few lanes of a warp per row (many
# groups a block), a warp, 2-4 warps (a barrier a step), a whole 1024-thread block; vectors left
# over in the last lane's slots (N not a power of two); every dtype; weight and bias present or
# not; M = 1; row counts that are not a multiple of the groups, blocks or steps.
ROWS3 = [
    _case(LN, "bf16", (37, 1000)),                 # 125 vectors: 128-thread rows, 2 a step
    _case(RMS, "f16", (45, 520), eps=1e-5),        # 65 vectors: 128-thread rows, lanes past N idle
    _case(LN, "f32", (50, 24), bias=False),        # 6 vectors: 8-lane groups, 32 a step
    _case(LN, "f64", (21, 130)),                   # 65 vectors, 2 a thread: 64-thread rows
    _case(LN, "bf16", (9, 8192)),                  # 1024-thread rows and blocks
    _case(RMS, "bf16", (70, 2048)),                # 256-thread rows
    _case(LN, "f16", (1, 4096), affine=False),     # M = 1: the sums written directly
    _case(LN, "f32", (64, 4096), affine=False, bias=False),  # no sums: no partial rows
    _case(LN, "bf16", (33, 64), bias=False),       # 8 vectors, one warp-part per row
    _case(RMS, "f64", (17, 4096)),                 # 2048 vectors, 2 a thread: 1024-thread rows
]


def _rows3_launch(case, sms: int, knobs: str):
    x = np.zeros(case.params["shape"], dtypes.numpy_dtype(case.dtype))
    n = x.shape[-1]
    st = np.float64 if case.dtype == "f64" else np.float32
    affine, bias = case.params.get("affine", True), case.params.get("bias", True) and case.op == LN
    arrays = {"x": x, "dy": x, "weight": np.zeros(n, x.dtype) if affine else None,
              "mean": None if case.op == RMS else np.zeros(x.shape[:-1], st), "rstd": np.zeros(x.shape[:-1], st),
              "dx": x.copy(), "dweight": np.zeros(n, x.dtype) if affine else None,
              "dbias": np.zeros(n, x.dtype) if bias else None}
    return plan.build_entry(case.op, "v7", case.dtype, arrays, True, sms, knobs=plan.settings(knobs)).launch


@pytest.mark.parametrize("case", ROWS3, ids=_ids(ROWS3))
def test_rows3_on_host(case):
    for variant in ("v7", "best_rows3_colsum", "best_rows3_s2", "v7_40sm"):
        _check(variant, case)


def test_rows3_cases_reach_their_paths():
    seen = set()
    for case in ROWS3:
        for sms, knobs in ((NUM_SMS, ""), (NUM_SMS, KNOBS["best_rows3_colsum"]), (NUM_SMS, KNOBS["best_rows3_s2"]),
                           (40, "minrows=1")):
            la = _rows3_launch(case, sms, knobs)
            assert la.kind == "rows3", (case.id, la)
            steps = -(-la.rows_per_block // (plan.rows3_block(la.gw) // la.gw))
            seen.add(("gw<=32" if la.gw <= 32 else "gw>32", la.gw == plan.ROWS3_MAX_GW))
            seen.add(("finish", "coop" if la.coop else "colsum" if la.colsum else "direct" if la.nparts == 1 else
                      "none"))
            seen.add(("stages", la.stages, steps > la.stages))  # the ring wraps round when steps > stages
            if case.params["shape"][0] % la.rows_per_block:
                seen.add("last block short")
    assert {("gw<=32", False), ("gw>32", False), ("gw>32", True), ("finish", "coop"), ("finish", "colsum"),
            ("finish", "direct"), ("finish", "none"), ("stages", 2, True), ("stages", 4, True),
            "last block short"} <= seen, seen
    # Scalar layouts and rows longer than 1024 threads hold take the default kernel's plan.
    assert _rows3_launch(_case(LN, "f32", (5, 1001)), NUM_SMS, "").kind == "rows"
    assert _rows3_launch(_case(LN, "bf16", (5, 16384)), NUM_SMS, "").kind == "chunked"


def _pad_rows(values: np.ndarray, dtype, pad: int) -> np.ndarray:
    """values (rank 3) in a buffer whose rows are `pad` elements longer and whose two leading
    dims are swapped in memory: leading dims that do not merge, rows still dense and 16-byte aligned."""
    a, b, n = values.shape
    buf = np.full((b, a, n + pad), np.nan, dtype)
    view = buf.transpose(1, 0, 2)[..., :n]
    view[...] = values
    return view


@pytest.mark.parametrize("op", [LN, RMS])
@pytest.mark.parametrize("dt", ["bf16", "f32"])
def test_rows3_strided_rows_on_host(op, dt):
    # The harness's layouts (transposed, sliced) are scalar ones; these rows are dense vectors at
    # strides of rows the kernel's row addressing must unravel (two leading dims, not merged).
    from oracle.layernorm_backward import layernorm_backward_numpy
    from oracle.rmsnorm_backward import rmsnorm_backward_numpy

    rng = np.random.default_rng(5)
    npdt = dtypes.numpy_dtype(dt)
    shape, n = (3, 7, 136), 136
    x_v = (rng.uniform(-2, 2, shape) + rng.uniform(-1, 1, shape[:-1] + (1,))).astype(npdt)
    dy_v = rng.uniform(-1, 1, shape).astype(npdt)
    w_v = rng.uniform(0.5, 1.5, (n,)).astype(npdt)
    xf = x_v.astype(np.float64)
    st = np.float32
    mean = xf.mean(-1) if op == LN else None
    rstd = 1 / np.sqrt((((xf - mean[..., None]) if op == LN else xf) ** 2).mean(-1) + 1e-5)
    inputs = {"x": _pad_rows(x_v, npdt, 8), "dy": _pad_rows(dy_v, npdt, 24), "weight": w_v,
              "rstd": rstd.astype(st)}
    if op == LN:
        inputs["mean"] = np.ascontiguousarray(mean.astype(st).T).T  # strided statistics too
    outs = {"dx": np.full(shape, np.nan, npdt), "dweight": np.full(n, np.nan, npdt)}
    if op == LN:
        outs["dbias"] = np.full(n, np.nan, npdt)
    for sms, knobs in ((NUM_SMS, ""), (40, "minrows=1")):
        arrays = {k: inputs.get(k, outs.get(k)) for k in plan.NAMES}
        entry = plan.build_entry(op, "v7", dt, arrays, True, sms, knobs=plan.settings(knobs))
        assert entry.launch.kind == "rows3" and len(entry.layout.sizes) == 2, entry.launch
        _impl(op, "v7", sms, knobs)(inputs, outs, {})
        if op == LN:
            want = layernorm_backward_numpy(dy_v.astype(np.float64), xf, w_v.astype(np.float64), 1e-5, True)
        else:
            want = rmsnorm_backward_numpy(dy_v.astype(np.float64), xf, w_v.astype(np.float64), 1e-5)
        tol = 2e-2 if dt == "bf16" else 1e-4  # the output's rounding (bf16: 2**-8) and the fp32 statistics
        for name, got in outs.items():
            g = got.astype(np.float64)
            assert np.isfinite(g).all(), name
            scale = np.abs(want[name]).max()
            assert np.abs(g - want[name]).max() <= tol * scale, (name, np.abs(g - want[name]).max(), scale)
        for got in outs.values():
            got[...] = np.nan


# ============================================================================= the stand-in itself


def _build(source: str) -> ctypes.CDLL:
    tmp = Path(tempfile.mkdtemp())
    (tmp / "k.cpp").write_text('#include "cuda_host_runtime.h"\n' + cuda_host.SET_SCHEDULE + source)
    subprocess.run([cuda_host.CXX, *cuda_host.FLAGS, f"-I{cuda_host.HERE}", str(tmp / "k.cpp"), "-o",
                    str(tmp / "k.so")], check=True, capture_output=True)
    return ctypes.CDLL(str(tmp / "k.so"))


FAULTS = r"""
__global__ void divergent_sync(int* out) { if (threadIdx.x < 40) __syncthreads(); out[threadIdx.x] = 1; }
__global__ void divergent_shfl(int* out) { int v = 1; if (threadIdx.x % 32 < 16) v = __shfl_xor_sync(0xffffffffu, v, 1); out[threadIdx.x] = v; }
__global__ void fine(int* out) {
  __shared__ int s[64];
  s[threadIdx.x] = threadIdx.x;
  __syncthreads();
  int v = s[63 - threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  out[blockIdx.x * 64 + threadIdx.x] = v;
}
// Each warp's lane 0 publishes a shuffled value, one barrier, everyone reads both: the next
// step's write can land before a lagging warp has read this step's value (a second barrier, or
// two buffers, is missing).  Round robin runs every thread to its next shuffle first and hides it.
__global__ void racy(int* out) {
  __shared__ int s[2];
  for (int step = 0; step < 3; ++step) {
    int v = __shfl_xor_sync(0xffffffffu, step, 1);
    if (threadIdx.x % 32 == 0) s[threadIdx.x / 32] = v;
    __syncthreads();
    out[step * 64 + threadIdx.x] = s[0] + s[1];
  }
}
#define WRAP(k) extern "C" int run_##k(int* out, char* err, int n) { \
  return cuhost::launch(dim3{2, 1, 1}, dim3{64, 1, 1}, [&] { k(out); }, err, n); }
WRAP(divergent_sync)
WRAP(divergent_shfl)
WRAP(fine)
WRAP(racy)
"""


def test_stand_in_reports_divergence_and_runs_good_kernels():
    lib = _build(FAULTS)
    out = np.zeros(192, np.int32)
    err = ctypes.create_string_buffer(512)
    ptr = out.ctypes.data_as(ctypes.POINTER(ctypes.c_int))
    assert lib.run_fine(ptr, err, 512) == 0, err.value
    # Warp w of block b sums s[63 - t] over its lanes t: 63 - (32w + 0..31) summed.
    want = np.repeat([sum(63 - t for t in range(32)), sum(63 - t for t in range(32, 64))], 32)
    assert (out[:128] == np.tile(want, 2)).all()
    assert lib.run_divergent_sync(ptr, err, 512) == 1
    assert b"__syncthreads" in err.value or b"barrier" in err.value, err.value
    assert lib.run_divergent_shfl(ptr, err, 512) == 1 and b"shuffle" in err.value, err.value
    racy_ok = np.repeat([0, 2, 4], 64)  # step + step over the two warps
    got = {}
    for schedule in range(cuda_host.SCHEDULES):
        lib.set_schedule(schedule)
        out[...] = -1
        assert lib.run_racy(ptr, err, 512) == 0, err.value
        got[schedule] = out[:192].copy()
    lib.set_schedule(0)
    assert (got[0] == racy_ok).all()  # round robin hides the race
    assert not (got[1] == racy_ok).all() and not (got[2] == racy_ok).all()  # warp-serial shows it
