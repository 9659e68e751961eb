"""The host side of the triton norms' calls (backends/triton/_norm.py Call, backends/triton/_steps.py
raw launches), without a GPU.

Launches are recorded at triton's launcher module: a real CudaLauncher (the installed triton's
class, built without compiling anything) around a recording `launch`.  So the Step-by-Step path
(Step -> lean runner -> CudaLauncher.__call__ -> launch) and the Call's fast closure
(`_steps.raw_launch` -> launch) can be compared argument for argument: the same launches, in the
same order, with the same pointers, ints and options.  Also: what goes back to the Step path
(misaligned pointers, a launch hook, another device current), no per-call planning, the
Config knobs ws_cache and fast, the kept workspace.
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backends.triton import _norm, _steps  # noqa: E402

LN, RMS = _norm.LAYERNORM, _norm.RMSNORM
# finish "kernel" with a stage 2 (the GPU default's path), at CPU-test sizes
KERNEL = replace(_norm.INTERPRETER_CONFIG, sms=4, tile_elems=64, finish="kernel", stage2_cols=16, stage2_rows=2,
                 fast=True)
LAST = replace(_norm.INTERPRETER_CONFIG, sms=4, tile_elems=64, finish="last", fast=True)
SPLIT = _norm.Config(sms=3, max_block=16, chunk=8, tile_elems=8, warps_per_sm=16, ws_ratio=0, stages=1, pdl=False,
                     finish="kernel", stage2_cols=16, stage2_rows=2, fast=True)


def _launcher_class():
    from triton.backends.nvidia.driver import CudaLauncher

    return CudaLauncher


def _fake_compiled(log, step_name: str, n_args: int, pdl: bool, **attrs):
    """A stand-in CompiledKernel whose `run` is the installed triton's CudaLauncher around a
    launcher module that records each launch."""
    cls = _launcher_class()
    run = cls.__new__(cls)
    run.launch = lambda *args: log.append((step_name,) + args)
    run.num_ctas, run.global_scratch_size, run.global_scratch_align = 1, 0, 1
    run.profile_scratch_size, run.profile_scratch_align, run.gsan_enabled = 0, 1, False
    run.launch_cooperative_grid, run.launch_pdl = False, pdl
    if cls.__call__.__code__.co_argcount > 6:  # 3.8: the launcher module takes annotations and a C signature
        run.arg_annotations, run.kernel_signature = ["ann"] * n_args, b"sig"
    for k, v in attrs.items():
        setattr(run, k, v)
    compiled = SimpleNamespace(run=run, function=1234, packed_metadata=(4, 1, 0))
    return compiled


@pytest.fixture(autouse=True)
def fresh_plans():
    """Stubbed Calls must not outlive their test (other tests would launch into the stubs)."""
    _norm._PLANS.clear()
    yield
    _norm._PLANS.clear()


@pytest.fixture
def as_gpu(monkeypatch):
    """Launch as on a GPU: device 0 current, stream 55, CudaLauncher's driver lookup answered."""
    import triton

    monkeypatch.setattr(triton.runtime.driver, "_active", SimpleNamespace(), raising=False)
    _steps._bind_torch()
    monkeypatch.setattr(_steps, "_raw_stream", lambda device: 55)
    jits = []
    monkeypatch.setattr(_steps.Step, "jit", lambda self, *tensors: jits.append(tensors))
    return jits


def _tensors(op, shape, dtype=torch.float32, affine=True, bias=True, x_layout="contig"):
    n = shape[-1]
    if x_layout == "transposed":
        x = torch.randn(shape[:-2] + (shape[-1], shape[-2]), dtype=dtype).transpose(-1, -2)
    else:
        x = torch.randn(shape, dtype=dtype)
    t = {"x": x, "dy": torch.randn(shape, dtype=dtype), "rstd": torch.rand(shape[:-1]) + 0.5,
         "dx": torch.empty(shape, dtype=dtype), "weight": None, "mean": None, "dweight": None, "dbias": None}
    if op == LN:
        t["mean"] = torch.randn(shape[:-1])
    if affine:
        t["weight"], t["dweight"] = torch.randn(n, dtype=dtype), torch.empty(n, dtype=dtype)
    if bias and op == LN:
        t["dbias"] = torch.empty(n, dtype=dtype)
    return tuple(t[k] for k in _norm.NAMES)


def _stubbed_call(op, tensors, cfg, log):
    """The Call of these tensors, made to launch as a CUDA one: every Step launches directly into
    a recording CudaLauncher (its runner: triton's lean path), device 0, stream 55, workspaces on
    the meta device (pointer 0: the same in every call)."""
    call = _norm.prepare(op, tensors, cfg)
    for name, step in (("split", call.split), ("main", call.main), ("stage2", call.stage2)):
        if step is None:
            continue
        compiled = _fake_compiled(log, name, step.n_tensors + len(step.tail), bool(step.options.get("launch_pdl")))
        step.compiled, step.device = compiled, 0
        step.runner = _steps._lean_runner(compiled, step.grid,
                                          lambda *args, stream, _n=name: log.append(("runner", _n, stream)))
        assert step.runner, "the installed triton must give the lean runner these tests compare against"
    call.index, call.current_device, call.current_stream = 0, (lambda: 0), (lambda index: 55)
    call.device = torch.device("meta")
    call.fast_state = None if call.plan.fast else False
    return call


def _run(op, tensors, cfg):
    inputs = dict(zip(("x", "dy", "weight", "mean", "rstd"), (tensors[0], tensors[1], tensors[2], tensors[3],
                                                               tensors[4])))
    outs = dict(zip(("dx", "dweight", "dbias"), tensors[5:]))
    _norm.run(op, {k: v for k, v in inputs.items() if v is not None}, {k: v for k, v in outs.items() if v is not None},
              {}, cfg, check=False)


PATHS = [
    (LN, (16, 24), KERNEL, {}, 2),                                    # main + stage 2
    (LN, (16, 24), LAST, {}, 1),                                      # finish "last": the stream's counters
    (RMS, (16, 24), KERNEL, {}, 2),                                   # no mean, no dbias
    (LN, (16, 24), KERNEL, {"affine": False}, 2),                     # dbias only
    (LN, (16, 24), KERNEL, {"affine": False, "bias": False}, 1),      # no partials: one launch, no workspace
    (LN, (4, 5, 20), SPLIT, {"x_layout": "transposed"}, 3),           # chunk sums + main + stage 2, offset table
    (LN, (16, 24), replace(KERNEL, ws_cache=True), {}, 2),
]


@pytest.mark.parametrize("op, shape, cfg, kw, launches", PATHS,
                         ids=["kernel", "last", "rms", "dbias_only", "no_partials", "split_table", "ws_cache"])
def test_fast_closure_launches_what_the_steps_launch(as_gpu, op, shape, cfg, kw, launches):
    """After the first (Step-by-Step) call, calls go through the fast closure, and what reaches
    triton's launcher module is the same, argument for argument; nothing is planned again."""
    log = []
    tensors = _tensors(op, shape, **kw)
    call = _stubbed_call(op, tensors, cfg, log)
    assert len(call.launches()) == launches
    _run(op, tensors, cfg)
    slow = list(log)
    assert call.entry == call.fast and call.fast_calls == [0], "the first call must make the fast closure"
    assert [e[0] for e in slow] == [k for k in ("split", "main", "stage2") if getattr(call, k if k != "main"
                                                                                      else "main")]
    made = _norm.PLANS_MADE[0]
    for _ in range(3):
        log.clear()
        _run(op, tensors, cfg)
        assert log == slow
    assert call.fast_calls == [3] and _norm.PLANS_MADE[0] == made and not as_gpu
    assert all(e[4] == 55 for e in slow), "every launch on the current stream"


def test_fast_closure_hands_back_what_it_does_not_handle(as_gpu, monkeypatch):
    """Misaligned pointers (the JIT picks their variant), a registered launch hook (it must see
    the launch), another device current: through the Step path; the fast closure stays."""
    from triton import knobs

    log = []
    tensors = _tensors(LN, (16, 24))
    call = _stubbed_call(LN, tensors, KERNEL, log)
    _run(LN, tensors, KERNEL)
    assert call.entry == call.fast
    # x misaligned by 4 bytes: same shape and strides (the same plan), through the JIT
    base = torch.randn(16 * 24 + 1)
    odd = base[1:].view(16, 24)
    assert odd.data_ptr() % 16
    _run(LN, (odd,) + tensors[1:], KERNEL)
    assert len(as_gpu) == 1 and as_gpu[0][0] is odd and call.fast_calls == [0]
    # a launch hook registered: through triton's runner, which calls the hooks
    log.clear()
    monkeypatch.setattr(knobs.runtime.launch_enter_hook, "calls", [lambda metadata: None])
    _run(LN, tensors, KERNEL)
    assert [e[0] for e in log] == ["runner", "runner"] and call.fast_calls == [0]
    monkeypatch.setattr(knobs.runtime.launch_enter_hook, "calls", [])
    # another device current: switched to the plan's device, Step by Step
    switched = []
    call.current_device = lambda: 1
    call.torch = SimpleNamespace(cuda=SimpleNamespace(device=lambda i: switched.append(i) or contextlib.nullcontext()),
                                 empty=torch.empty)
    call.fast = call.entry = call._make_fast(tensors, [s.raw() for s in (call.main, call.stage2)],
                                             _steps.hook_chains())
    log.clear()
    _run(LN, tensors, KERNEL)
    assert switched == [0] and [e[0] for e in log] == ["main", "stage2"] and call.fast_calls == [0]
    assert call.entry == call.fast


def test_no_fast_closure_when_off_or_not_direct(as_gpu):
    """Config.fast=False, the jit launch mode, a CPU call: Step by Step for good."""
    log = []
    tensors = _tensors(LN, (16, 24))
    call = _stubbed_call(LN, tensors, replace(KERNEL, fast=False), log)
    for _ in range(2):
        _run(LN, tensors, replace(KERNEL, fast=False))
    assert call.fast is None and call.entry == call.__call__ and call.fast_state is False
    assert [e[0] for e in log] == ["main", "stage2"] * 2
    plain = _norm.prepare(LN, _tensors(LN, (16, 25)), KERNEL)  # a CPU Call: no device index
    assert plain.fast_state is False
    for launch, state in (("jit", False), ("tensors", False), ("direct", None)):
        plan = _norm.make_plan(LN, dict(zip(_norm.NAMES, tensors)), replace(KERNEL, launch=launch))
        plan.device_index = 0  # as a CUDA plan
        assert _norm.Call(plan, torch.device("cpu"), torch.float32).fast_state is state, launch


# ----------------------------------------------------------------------------- raw launches


def _launch_args(compiled, stream, args, raw: bool):
    log = []
    compiled.run.launch = lambda *a: log.append(a)
    if raw:
        _steps.raw_launch(compiled, (6, 2, 1))(stream, args)
    else:  # what the lean runner hands CudaLauncher.__call__
        compiled.run(6, 2, 1, stream, compiled.function, compiled.packed_metadata, None, None, None, *args)
    return log


def test_raw_launch_passes_what_cuda_launcher_passes(as_gpu):
    """The installed triton's CudaLauncher.__call__ and raw_launch hand the launcher module the
    same arguments (grid, stream, function, options, metadata, no hooks, no scratch, the
    kernel's arguments)."""
    compiled = _fake_compiled([], "k", 5, pdl=True)
    args = (1 << 40, 2 << 40, 7, 3, 64)
    want = _launch_args(compiled, 99, args, raw=False)
    assert len(want) == 1 and 99 in want[0] and want[0][-1] in (args, 64)
    assert _launch_args(compiled, 99, args, raw=True) == want


@pytest.mark.parametrize("attr, value", [("global_scratch_size", 128), ("profile_scratch_size", 64),
                                         ("gsan_enabled", True)])
def test_raw_launch_declines_what_it_does_not_repeat(attr, value):
    """Scratch memory (CudaLauncher allocates it per launch), a sanitizer build, another launcher
    class or a compiled kernel without one: None (the Step path stays)."""
    assert _steps.raw_launch(_fake_compiled([], "k", 2, False, **{attr: value}), (1, 1, 1)) is None

    class Other:
        def __call__(self, grid, stream, *args):
            pass

    other = SimpleNamespace(run=Other(), function=1, packed_metadata=())
    other.run.launch, other.run.launch_cooperative_grid, other.run.launch_pdl = print, False, False
    other.run.global_scratch_size = other.run.profile_scratch_size = 0
    assert _steps.raw_launch(other, (1, 1, 1)) is None
    assert _steps.raw_launch(SimpleNamespace(), (1, 1, 1)) is None
    assert _steps.raw_launch(None, (1, 1, 1)) is None


def test_step_raw_needs_a_direct_launcher(as_gpu):
    kernel = SimpleNamespace(arg_names=["x_ptr", "n"], __name__="k")
    step = _steps.Step(kernel, 4, 1, {"n": 3}, 4, mode="direct")
    assert step.raw() is None  # not launched yet
    step.compiled, step.runner = _fake_compiled([], "k", 2, False), lambda *a, stream: None
    assert callable(step.raw())
    step.mode = "tensors"
    assert step.raw() is None


# ----------------------------------------------------------------------------- knobs and the workspace


def test_knobs_parse_and_reach_the_plan():
    cfg = _norm.parse_config("ws_cache=1, fast=1", _norm.GPU_DEFAULT)
    assert (cfg.ws_cache, cfg.fast) == (True, True)
    # both on by default since the H100 A/B (results/h100/s5/norms_host.json.gz: same bits, a
    # third less host time); the Config defaults (tests, the interpreter) keep both off
    assert (_norm.GPU_DEFAULT.ws_cache, _norm.GPU_DEFAULT.fast) == (True, True)
    assert (_norm.Config().ws_cache, _norm.Config().fast) == (False, False)
    t = dict(zip(_norm.NAMES, _tensors(LN, (16, 24))))
    plan = _norm.make_plan(LN, t, replace(KERNEL, ws_cache=True, fast=False))
    assert plan.ws_cache and not plan.fast and plan.ws_numel > 0
    plan = _norm.make_plan(LN, t, KERNEL)
    assert not plan.ws_cache and plan.fast


def test_kept_workspace(monkeypatch):
    """ws_cache: one workspace per (device, stream, dtype), grown when a call needs more; a
    fresh one for every call while the stream is captured into a CUDA graph."""
    monkeypatch.setattr(_norm, "_WORKSPACES", {})
    meta = torch.device("meta")
    a = _norm._workspace(meta, 7, 100, torch.float32)
    assert _norm._workspace(meta, 7, 50, torch.float32) is a
    assert _norm._workspace(meta, 8, 50, torch.float32) is not a  # another stream
    assert _norm._workspace(meta, 7, 50, torch.float64) is not a  # another dtype
    b = _norm._workspace(meta, 7, 200, torch.float32)
    assert b is not a and b.numel() == 200 and _norm._workspace(meta, 7, 100, torch.float32) is b
    made = []
    fake = SimpleNamespace(_C=SimpleNamespace(_cuda_isCurrentStreamCapturing=lambda: True),
                           empty=lambda n, dtype, device: made.append(n) or object())
    monkeypatch.setattr(_norm, "_TORCH", [fake])
    cuda = SimpleNamespace(type="cuda", index=0)
    one, two = _norm._workspace(cuda, 7, 10, torch.float32), _norm._workspace(cuda, 7, 10, torch.float32)
    assert one is not two and made == [10, 10]


def test_call_workspace_kept_only_with_the_knob(monkeypatch):
    monkeypatch.setattr(_norm, "_WORKSPACES", {})
    tensors = _tensors(LN, (16, 24))
    for cfg, kept in ((KERNEL, False), (replace(KERNEL, ws_cache=True), True)):
        call = _norm.prepare(LN, tensors, cfg)
        call.device = torch.device("meta")
        assert (call.workspace(3) is call.workspace(3)) == kept
        assert call.workspace(3).numel() >= call.plan.ws_numel


def test_a_launcher_that_takes_other_arguments_ends_the_fast_path(as_gpu):
    """A TypeError from triton's launcher module (arguments it does not take): the call is made
    Step by Step (which falls back to the JIT for good), and later calls stay off the fast path."""

    class Log(list):
        refuse = False

        def append(self, item):
            if self.refuse and item[0] != "runner":
                raise TypeError("function takes exactly 20 arguments")
            super().append(item)

    log = Log()
    tensors = _tensors(LN, (16, 24))
    call = _stubbed_call(LN, tensors, KERNEL, log)
    _run(LN, tensors, KERNEL)
    assert call.entry == call.fast
    log.refuse = True
    _run(LN, tensors, KERNEL)
    assert call.entry == call.__call__ and call.fast_state is False and call.fast_calls == [0]
    assert len(as_gpu) == 2 and call.main.runner is False and call.stage2.runner is False
    _run(LN, tensors, KERNEL)
    assert len(as_gpu) == 4 and call.fast_calls == [0]
