"""The cupy binary_backward kernels' CUDA source, executed on the CPU, judged by the harness.

tests/cuda_host.py compiles backends/cuda/binary_backward.cuh with g++ against the CUDA stand-in
(a fiber per thread, real barriers and warp shuffles, bit-exact bfloat16 / float16 conversions).
`bbhost` below is the cupy backend's own host code (build_entry / run_entry in
backends/cupy/binary_backward.py: the plans, the BBParams / BBCollapsed bytes, the launch
sequence, stage 2) over that device, registered as a numpy backend for the CPU, so the harness's
`run_case` checks every rung: NaN-poisoned outputs inside canary bands, inputs unchanged, repeated
calls bitwise equal for the deterministic rungs, the stale-input recheck, the float64 oracle and
its tolerance model.

The planner sees 3 SMs (and, for @best, 1 resident block per SM unless a variant says more), so
small cases already take several tiles, partial rows and stage 2; `best_v` runs @best on 16-byte
packs of cases sized so that they apply.

What this cannot check: timing, the memory model across blocks, and the GPU's own rounding (no
FMA contraction on the host): scripts/gpu/cupy_bcast.sh runs the same cases on the device.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

import cuda_host
from backends._plans import binary_backward as bcast
from backends._plans import binary_backward_cuda as cuda_plan
from backends.cupy import binary_backward as bb
from backends.cupy.common import element_strides
from cases import select
from cases.registry import Case
from harness import dtypes
from harness.registry import Backend, get_op
from harness.runner import run_case
from oracle.binary_backward import FNS

OP = bb.OP
WHY = cuda_host.available()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"CUDA-on-CPU stand-in unavailable: {WHY}")

RUNGS = ("naive", "opt", "opt2", "best")
# (variant, SMs, resident blocks per SM): @best on one small GPU, and on a larger one.
CONFIGS = {"naive": ("naive", 3, None), "opt": ("opt", 3, None), "opt2": ("opt2", 3, None),
           "best": ("best", 3, 1), "best_big": ("best", 40, 3)}
# @best built with GRADORACLE_CUPY_BB's other unrolls (the rows of a loop step masked differently).
# yg= overrides bb_both's rows in flight for every type (BB_YG; default BBBothRows: 4 in f32, else 1).
DEFINES = {"best_ur1": bb.best_options("ur=1,pf=0,colsur=4,colsminblocks=1,yg=1"),
           "best_ur4": bb.best_options("ur=4,minblocks=2,pf=1,colsur=2,colsminblocks=3,yg=2")}
CONFIGS.update({name: ("best", 3, 1) for name in DEFINES})
CONFIGS["best_legacy"] = ("best", 3, 1)  # GRADORACLE_CUPY_BB=legacy=1: the previous @best launches
_ENTRIES: dict = {}

bbhost = Backend("bbhost", framework="numpy", devices=("cpu",), register=False,
                 description="the cupy binary_backward kernels' CUDA source run on the CPU (tests/cuda_host)")


def _host_span(x) -> tuple[int, int]:
    """backends._buffers.byte_span for numpy arrays of any dtype (it reads numpy addresses through
    the buffer protocol, which bfloat16 arrays lack)."""
    start, item = cuda_host.data_address(x), x.itemsize
    low = sum((n - 1) * st for n, st in zip(x.shape, x.strides) if st < 0)
    high = sum((n - 1) * st for n, st in zip(x.shape, x.strides) if st > 0)
    return start + low, start + high + item


def _check_args(inputs, outs, params):
    """The cupy backend's check_args on numpy arrays."""
    saved, bb.byte_span = bb.byte_span, _host_span
    try:
        return bb.check_args(inputs, outs, params)
    finally:
        bb.byte_span = saved


def _impl(name: str):
    variant, sms, bps = CONFIGS[name]
    dev = cuda_host.HostBinaryDevice(sms, bps, DEFINES.get(name, ()))

    def fn(inputs, outs, params):
        a, b, g = inputs["a"], inputs["b"], inputs["grad_out"]
        ga, gb = outs["grad_a"], outs["grad_b"]
        ptrs = tuple(cuda_host.data_address(x) for x in (a, b, g, ga, gb))
        aligned = not (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4]) & 15
        key = (name, params["fn"], a.dtype, a.shape, a.strides, b.shape, b.strides, g.strides, aligned)
        entry = _ENTRIES.get(key)
        if entry is None:  # as the cupy backend does: checks and plan once per layout
            dt, fn_ = _check_args(inputs, outs, params)
            layout = tuple((x.shape, element_strides(x, n)) for x, n in ((a, "a"), (b, "b"), (g, "grad_out")))
            entry = _ENTRIES[key] = bb.build_entry(variant, dt, fn_, layout, (0,) * 5 if aligned else (1,) * 5,
                                                   sms, dev.blocks_per_sm if bps else None,
                                                   legacy=name == "best_legacy")
        bb.run_entry(dev, entry, a, b, g, ga, gb)
    return fn


for _name, (_variant, _, _) in CONFIGS.items():
    bbhost.impl(OP, variant=_name, dtypes=bb.DTYPES, deterministic=_variant in ("opt", "best"))(_impl(_name))


def _check(name: str, case) -> None:
    impl = bbhost.impls[(OP, name)]
    result = run_case(impl, case, "cpu", run_seed=0)
    assert result.status == "PASS", f"{impl.id} {case.id}: {result.status} {result.reason}\n" + \
        "\n".join(r.line() for r in result.outputs)


def _case(fn, a, b, dtype="f32", **layouts):
    c = Case(OP, dtype, {"fn": fn, "a": list(a), "b": list(b), **layouts}, frozenset({"full"}), "test")
    get_op(OP).validate(c)
    return c


SMOKE = select("smoke", op=OP)


@pytest.mark.parametrize("case", SMOKE, ids=[c.id for c in SMOKE])
def test_every_rung_on_the_smoke_set(case):
    for name in RUNGS:
        _check(name, case)


# Shapes whose vectors fit 16-byte packs in every dtype (inner extents multiples of 8), with
# enough rows for several chunks: bias-like (bb_cols), row sums (bb_rows), A broadcast, both
# broadcast (bb_batch), a transposed grad_out (no packs: scalar accesses), and a dense
# no-broadcast case.
PACKED = [
    (fn, dt, a, b, lay)
    for dt in ("f32", "bf16", "f16", "f64")
    for fn, a, b, lay in [
        ("mul", (600, 64), (64,), {}),
        ("div", (4, 37, 32), (4, 1, 32), {}),
        ("pow", (40, 48), (40, 1), {}),
        ("div", (40, 48), (40, 1), {}),  # bb_rows' div (one division per element for 16-bit T)
        ("pow", (2, 2048), (2, 1), {}),
        ("maximum", (8, 1, 40), (8, 30, 40), {}),
        ("sub", (1, 8, 32), (200, 8, 1), {}),
        ("div", (1, 4, 256), (6, 4, 1), {}),
        ("minimum", (24, 64), (24, 64), {}),
        ("add", (24, 64), (64,), {"g_layout": "transposed"}),
        ("mul", (96, 16), (96, 1), {"a_layout": "sliced"}),
        ("mul", (), (5, 16), {}),
        # both broadcast with a short Y (bb_both): Y = 8 rows, x chunks with a
        # remainder; a two-dim X (b broadcast along dims 0 and 2); fewer x packs than lanes
        ("mul", (1, 40, 96), (8, 40, 1), {}),
        ("mul", (1, 6, 1000), (8, 6, 1), {}),
        ("mul", (4, 6, 64), (64,), {"a_layout": "transposed"}),  # bb_cols with two row dims (no merge)  # f32: 4 x chunks of 252, 252, 252, 244 -> partial dP rows
        ("pow", (5, 1, 64), (1, 7, 1), {}),
        ("maximum", (3, 1, 8), (1, 5, 1), {}),
        ("div", (1, 12, 64), (8, 12, 1), {"g_layout": "transposed"}),
    ]
]
PACKED_CASES = [_case(fn, a, b, dt, **lay) for fn, dt, a, b, lay in PACKED]


@pytest.mark.parametrize("case", PACKED_CASES, ids=[c.id for c in PACKED_CASES])
def test_best_on_packs_chunks_and_partial_rows(case):
    _check("best", case)
    _check("best_big", case)
    if case.dtype in ("f32", "bf16"):
        for name in (*DEFINES, "best_legacy"):
            _check(name, case)


def _plan(a_shape, b_shape, layouts=None):
    g_shape = bcast.broadcast_shape(a_shape, b_shape)
    return bcast.make_plan(a_shape, b_shape, bcast.contiguous_strides(a_shape), bcast.contiguous_strides(b_shape),
                           bcast.contiguous_strides(g_shape))


def test_packed_cases_reach_the_vectorized_kernels_and_partial_rows():
    seen = set()
    for fn, dt, a, b, lay in PACKED:
        if lay:
            continue
        la = cuda_plan.plan_best(_plan(a, b), 3, (0,) * 5, bb.ITEMSIZE[dt], lambda kind, vec: 1)
        seen.add((la.kind, la.vectorized, max(la.nchunks) > 1))
    assert {("cols", True, True), ("rows", True, False), ("rows", True, True), ("fast", True, False),
            ("both", True, False)} <= seen


@pytest.mark.parametrize("a_shape, b_shape, kind", [
    ((8, 2048, 4096), (4096,), "cols"), ((8, 2048, 4096), (8, 1, 4096), "cols"), ((8, 1, 4096), (8, 2048, 4096), "cols"),
    ((8, 2048, 4096), (8, 2048, 1), "rows"), ((8, 2048, 4096), (8, 2048, 4096), "fast"),
    ((1, 2048, 4096), (8, 2048, 1), "both")])
@pytest.mark.parametrize("itemsize", [2, 4])
def test_best_grids_fill_one_wave_of_the_perf_cases(a_shape, b_shape, kind, itemsize):
    """The perf cases: 16-byte packs, a grid of at most one wave of resident blocks, and work
    split so that the wave is at least 90% full (no partial last wave)."""
    sms, bps = 132, cuda_plan.BEST_BLOCKS_PER_SM[kind]  # what each kernel is built for
    la = cuda_plan.plan_best(_plan(a_shape, b_shape), sms, (0,) * 5, itemsize, lambda k, v: bps)
    assert la.kind == kind
    assert la.grid <= sms * bps
    assert la.vectorized
    if kind == "cols":  # tiles: one block each, round after round
        ntiles = la.words[-4]
        assert cuda_plan.wave_fill(ntiles, sms * bps) >= 0.9, (ntiles, la.grid)
    if kind in ("rows", "both"):  # tasks: one lane segment each (bb_both's: up to a whole block)
        ntasks, segs = la.words[-4], sms * bps * (cuda_plan.BLOCK // la.words[-12])
        assert cuda_plan.wave_fill(ntasks, segs) >= 0.9, (ntasks, segs)
    if kind in ("fast", "rows"):
        assert la.grid == sms * bps


def test_opt2_collapses_dims_per_tensor():
    # A = (2, 3, 4, 5) against B = (1, 3, 1, 5): a, g, ga collapse to one dim; b and gb keep two
    # (3 and 5, with the broadcast dims between them dropped).
    words, direct, numel = cuda_plan.opt2_words((2, 3, 4, 5), (1, 3, 1, 5), (60, 20, 5, 1), (15, 5, 5, 1),
                                                (60, 20, 5, 1))
    assert numel == 120 and direct == (True, False)
    assert words[3:8] == [1, 2, 1, 1, 2]
    dims = cuda_plan.collapse(cuda_plan._out_dims((2, 3, 4, 5), (1, 3, 1, 5), (60, 20, 5, 1), (15, 5, 5, 1),
                                                  (60, 20, 5, 1))[1], "b")
    assert dims == [(20, 3, 5), (1, 5, 1)]  # (O elements per step, size, stride)
    # A transposed a: no chain in a, so its dims stay apart.
    dims = cuda_plan.collapse(cuda_plan._out_dims((4, 5), (4, 5), (1, 4), (5, 1), (5, 1))[1], "a")
    assert dims == [(5, 4, 1), (1, 5, 4)]


def test_host_time_per_call_is_a_dict_lookup(monkeypatch):
    """After the first call of a layout, a call makes no plan and no check: the per-call Python of
    the cupy backend's `call` (with the launches stubbed out) stays in the tens of microseconds,
    far below the device time of any case worth timing."""
    made = []
    real_build = bb.build_entry
    monkeypatch.setattr(bb, "build_entry", lambda *a, **k: made.append(1) or real_build(*a, **k))

    class Arr:  # what `call` reads of a cupy array
        def __init__(self, x: np.ndarray):
            self.x, self.shape, self.strides, self.dtype, self.flags = x, x.shape, x.strides, x.dtype, x.flags
            self.data = type("P", (), {"ptr": cuda_host.data_address(x)})()
            self.device = type("D", (), {"id": 0})()
            self.size, self.itemsize = x.size, x.itemsize

    class Dev:
        def num_sms(self):
            return 132

        def blocks_per_sm(self, expr):
            return 3

    runs = []
    monkeypatch.setattr(bb, "_device", lambda: Dev())
    monkeypatch.setattr(bb, "run_entry", lambda dev, entry, *arrays: runs.append(entry.launch))
    shape = (8, 64, 128)
    x = {n: Arr(np.zeros(s, np.float32)) for n, s in (("a", shape), ("b", (128,)), ("grad_out", shape),
                                                     ("grad_a", shape), ("grad_b", (128,)))}
    inputs = {n: x[n] for n in ("a", "b", "grad_out")}
    outs = {n: x[n] for n in ("grad_a", "grad_b")}
    bb._ENTRIES.clear()
    bb.call("best", inputs, outs, {"fn": "mul"})
    assert made == [1] and runs[-1].kind == "cols"
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        bb.call("best", inputs, outs, {"fn": "mul"})
    per_call = (time.perf_counter() - t0) / n
    assert made == [1], "a repeated layout must not be planned again"
    assert per_call < 50e-6, f"{per_call * 1e6:.1f} us of Python per call before the launches"


def test_host_device_runs_every_kind_it_is_asked_for():
    """The stand-in library holds every instantiation the cupy backend can name."""
    lib = cuda_host.library(OP, "f32")
    assert set(bb.all_kernel_exprs("f32")) <= set(lib.fns)
    assert len(bb.all_kernel_exprs("f32")) == len(FNS) * 16 + 1
    assert dtypes.numpy_dtype("f32") == np.float32


# ----------------------------------------------------------------------------- torch_ext's records


@pytest.mark.parametrize("a_shape, b_shape, kind", [((3, 4, 40), (40,), "cols"), ((4, 64), (4, 1), "rows"),
                                                    ((3, 1, 64), (3, 5, 64), "cols")])
def test_torch_ext_takes_the_best_records(a_shape, b_shape, kind):
    """torch_ext's CUDA op launches plan_best's record; on the CPU its C++ checks pass such a
    record through every check but the device's (the kind is checked last)."""
    torch = pytest.importorskip("torch")
    from backends import torch_ext

    reason = torch_ext._check("cpu")
    if reason:
        pytest.skip(reason)
    a, b = torch.rand(a_shape, dtype=torch.float64), torch.rand(b_shape, dtype=torch.float64)
    g = torch.rand(torch.broadcast_shapes(a_shape, b_shape), dtype=torch.float64)
    plan = bcast.make_plan(a_shape, b_shape, a.stride(), b.stride(), g.stride())
    launch = cuda_plan.plan_best(plan, 132, (0,) * 5, 8)
    assert launch.kind == kind and launch.vectorized
    record = torch.tensor(cuda_plan.launch_record(launch, plan, 132), dtype=torch.int64)
    assert cuda_plan.KINDS[int(record[0])] == kind and int(record[2]) == 1
    ga, gb = torch.empty(a_shape, dtype=torch.float64), torch.empty(b_shape, dtype=torch.float64)
    with pytest.raises(ValueError, match=rf"plan has kind {cuda_plan.KINDS.index(kind)}, which cpu does not run"):
        torch.ops.gradoracle._binary_backward_run(a, b, g, "mul", record, grad_a=ga, grad_b=gb)


@pytest.mark.parametrize("a_shape, b_shape, both", [
    ((1, 2048, 4096), (8, 2048, 1), True), ((5, 1, 64), (1, 7, 1), True), ((1, 8, 32), (200, 8, 1), False),
    ((1, 8, 32), (9, 8, 1), False)])
def test_short_y_takes_bb_both(a_shape, b_shape, both):
    """Both operands broadcast: a one-dim Y of at most BATCH_ROWS rows goes to bb_both (no Y
    chunks, so dQ is written final); a longer Y, or legacy, to bb_batch's y-looped mode."""
    plan = _plan(a_shape, b_shape)
    la = cuda_plan.plan_best(plan, 132, (0,) * 5, 2, lambda k, v: 4)
    assert la.kind == ("both" if both else "batch")
    assert la.words[-8] == 0  # chunk[2]: bb_batch's y-looped mode (bb_both does not read it)
    if both:
        assert la.nchunks[1] == 1
    legacy = cuda_plan.plan_best(plan, 132, (0,) * 5, 2, lambda k, v: 3, legacy=True)
    assert legacy.kind == "batch" and legacy.words[-8] == 0


@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_both_perf_case_is_one_row_per_block(itemsize):
    """mul(A = 1x2048x4096, B = 8x2048x1) on an H100 (132 SMs, 4 blocks each): a task is a whole
    row of X owned by the whole block (dP written final: no partial rows, no bb_finalize launch),
    16-byte packs, b as P (swap), at least 90% of the last wave busy."""
    la = cuda_plan.plan_best(_plan((1, 2048, 4096), (8, 2048, 1)), 132, (0,) * 5, itemsize, lambda k, v: 4)
    assert la.kind == "both" and la.vectorized and la.swap
    assert la.words[cuda_plan.GROUP_WORDS * 3 + 2] % (16 // itemsize) == 0  # chunk[0]: whole 16-byte packs
    assert la.words[-12] == cuda_plan.BLOCK and la.nchunks == (1, 1)
    assert la.grid == 132 * 4 and cuda_plan.wave_fill(la.words[-4], la.grid) >= 0.9


# Both operands broadcast with a short Y (bb_both): whole-block, multi-warp and sub-warp segments,
# X lengths that are not a multiple of the 16-byte pack (scalar accesses), X cut into chunks (one
# z: partial dP rows and stage 2), b or a as the operand broadcast along X, Y of 1 to 8 rows.
BOTH = [
    (fn, dt, a, b)
    for fn, dt in [("mul", "f32"), ("mul", "bf16"), ("div", "f16"), ("pow", "f64"), ("maximum", "bf16"),
                   ("sub", "f32"), ("minimum", "f16"), ("add", "f64")]
    for a, b in [((1, 3, 2048), (8, 3, 1)),     # bf16: 128-lane segments, f32: the whole block
                 ((1, 1, 4096), (8, 1, 1)),     # one row: X in chunks, partial dP rows
                 ((1, 5, 37), (7, 5, 1)),       # 37: no packs, sub-warp segments
                 ((6, 4, 1), (1, 4, 200)),      # a broadcast along X (no swap), 200 = 25 packs of 8
                 ((1, 9, 24), (3, 9, 1)),       # 3 rows of Y, narrow segments
                 ((1, 5, 148), (7, 5, 1))]      # 37 packs of 4: f32 on packs, 16-bit T scalar
]
BOTH_CASES = [_case(fn, a, b, dt) for fn, dt, a, b in BOTH]


def test_both_cases_reach_packs_and_partial_rows():
    seen = set()
    for fn, dt, a, b in BOTH:
        la = cuda_plan.plan_best(_plan(a, b), 3, (0,) * 5, bb.ITEMSIZE[dt], lambda kind, vec: 1)
        seen.add((la.vectorized, la.nchunks[0] > 1, la.words[-12] > 32))
    assert {(True, False, True), (True, True, True), (False, False, False)} <= seen, seen


@pytest.mark.parametrize("case", BOTH_CASES, ids=[c.id for c in BOTH_CASES])
def test_both_broadcast_takes_bb_both_and_matches_the_oracle(case):
    a, b = case.params["a"], case.params["b"]
    la = cuda_plan.plan_best(_plan(tuple(a), tuple(b)), 3, (0,) * 5, bb.ITEMSIZE[case.dtype], lambda k, v: 1)
    assert la.kind == "both"
    _check("best", case)
    _check("best_big", case)


# ----------------------------------------------------------------------------- bb_both's packs


@pytest.mark.parametrize("itemsize, x, pack", [(2, 4096, 16), (2, 144, 16), (2, 148, 0), (2, 37, 0), (4, 148, 16),
                                               (4, 150, 0), (8, 148, 16)])
def test_both_pack_width_per_element_size(itemsize, x, pack):
    """bb_both takes 16-byte packs in every type whenever X's length is a multiple of V (148 = 37
    packs of 4 in f32, not a whole number of 8-element packs in 16-bit types); else scalar
    accesses, like the other @best kernels."""
    la = cuda_plan.plan_best(_plan((1, 5, x), (7, 5, 1)), 132, (0,) * 5, itemsize, lambda k, v: 4)
    assert la.kind == "both" and la.vectorized == (pack > 0)
    if pack:
        assert la.words[-10] % (pack // itemsize) == 0  # chunk[0]: whole packs
        record = cuda_plan.launch_record(la, _plan((1, 5, x), (7, 5, 1)), 132)
        assert record[2] == 1  # torch_ext's `vectorized` word
    dt = {2: "bf16", 4: "f32", 8: "f64"}[itemsize]
    assert bb.kernel_expr("rows", dt, "mul", True).endswith(f", {16 // itemsize}>")  # the other kernels alike
    expr = bb.kernel_expr("both", dt, "mul", la.vectorized)
    assert expr.endswith(f", {pack // itemsize if pack else 1}>"), expr


@pytest.mark.parametrize("align, vec16", [(16, True), (8, False), (4, False), (2, False)])
def test_both_packs_follow_the_pointer_alignment(align, vec16):
    """The pointers decide: only 16-byte aligned pointers take the packs, in bb_both as in the
    other kernels, whatever the element size."""
    both = _plan((1, 5, 256), (7, 5, 1))
    assert cuda_plan.plan_best(both, 132, (0, 16, 32, align, 48), 2, lambda k, v: 4).vectorized == vec16
    assert cuda_plan.plan_best(both, 132, (align,) * 5, 2, lambda k, v: 4).vectorized == vec16
    assert cuda_plan.plan_best(both, 132, (align,) * 5, 4, lambda k, v: 4).vectorized == vec16
    rows = _plan((4, 256), (4, 1))
    assert cuda_plan.plan_best(rows, 132, (align,) * 5, 2, lambda k, v: 4).vectorized == vec16


def _placed(x: np.ndarray, offset: int) -> np.ndarray:
    """A copy of x whose first element is `offset` bytes past a 64-byte boundary."""
    buf = np.zeros(x.nbytes + 128, np.uint8)
    start = (-cuda_host.data_address(buf)) % 64 + offset
    out = buf[start:start + x.nbytes].view(x.dtype).reshape(x.shape)
    out[...] = x
    return out


@pytest.mark.parametrize("dt", ["bf16", "f16"])
@pytest.mark.parametrize("offset", [0, 8, 2])
def test_emulated_both_packs_and_misaligned_pointers(dt, offset):
    """bb_both on the stand-in with X = 144 (18 packs of 8) at pointers 64-, 8- and 2-byte aligned:
    16-byte packs for the first, the scalar kernel for the others, each within the tolerance of a
    float64 reference.  (The stand-in does not
    fault on a misaligned vector access: the plan's choice is checked instead.)"""
    npdt = dtypes.numpy_dtype(dt)
    rng = np.random.default_rng(7)
    a_shape, b_shape, g_shape = (1, 5, 144), (7, 5, 1), (7, 5, 144)
    src = {n: rng.uniform(0.5, 1.5, s).astype(np.float32) for n, s in (("a", a_shape), ("b", b_shape), ("grad_out", g_shape))}
    arrs = {n: _placed(v.astype(npdt), offset) for n, v in src.items()}
    outs = {"grad_a": _placed(np.zeros(a_shape, npdt), offset), "grad_b": _placed(np.zeros(b_shape, npdt), offset)}
    ptrs = tuple(cuda_host.data_address(v) for v in (*arrs.values(), *outs.values()))
    la = cuda_plan.plan_best(_plan(a_shape, b_shape), 3, ptrs, 2, lambda k, v: 1)
    assert la.kind == "both" and la.vectorized == (offset % 16 == 0)
    _impl("best")(arrs, outs, {"fn": "mul"})
    a, b, g = (arrs[n].astype(np.float64) for n in ("a", "b", "grad_out"))
    want_a = (g * b).sum(axis=0, keepdims=True)
    want_b = (g * a).sum(axis=2, keepdims=True)
    np.testing.assert_allclose(outs["grad_a"].astype(np.float64), want_a, rtol=2e-2)
    np.testing.assert_allclose(outs["grad_b"].astype(np.float64), want_b, rtol=2e-2)
