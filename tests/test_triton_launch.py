"""backends/triton/_steps.py: the direct launch path of the triton backend's plans (every op's).

Stand-in kernels record what reaches triton's JIT and what reaches a compiled kernel's
launcher, so the rules run without a GPU: the first call goes through the JIT, later ones
straight to the launcher with the same arguments (data pointers as ints in the default
mode), on the given or the current stream; misaligned pointers, the interpreter, the jit
mode and launchers that take other arguments always go through the JIT.  Under the
interpreter a real kernel launched through a Step computes the right values.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backends.triton import _steps  # noqa: E402
from backends.triton.common import interpreted, jit, tl  # noqa: E402


class _FakeCompiled:
    """Stands in for triton's CompiledKernel: `compiled[grid](*args, stream=)` records the launch."""

    def __init__(self, log, n_signature, fail=False):
        self.src = type("Src", (), {"signature": {f"p{i}": "x" for i in range(n_signature)}})()
        self.log, self.fail = log, fail

    def __getitem__(self, grid):
        def runner(*args, stream=None):
            if self.fail:
                raise TypeError("function takes exactly 3 arguments")
            self.log.append(("direct", grid, args, stream))
        return runner


class _FakeKernel:
    """Stands in for a JITFunction: `kernel[grid](*args, num_warps=, **options)` records the launch."""

    arg_names = ["x_ptr", "y_ptr", "n", "BLOCK"]
    __name__ = "fake"

    def __init__(self, compiled_signature=4, fail=False):
        self.log = []
        self.compiled = _FakeCompiled(self.log, compiled_signature, fail)

    def __getitem__(self, grid):
        def launch(*args, num_warps, **options):
            self.log.append(("jit", grid, args, num_warps, options))
            return self.compiled
        return launch

    def warmup(self, *args, grid, num_warps, **options):
        self.log.append(("warmup", grid, args, num_warps, options))
        return self.compiled


@pytest.fixture
def on_gpu(monkeypatch):
    """As on a GPU: not interpreting, device 0 current, its current stream 77."""
    monkeypatch.setattr(_steps, "interpreted", lambda: False)
    monkeypatch.setattr(_steps, "_current_device", lambda: 0)
    _steps._bind_torch()
    monkeypatch.setattr(_steps, "_raw_stream", lambda device: 77 + device)


def _pair(offset=0):
    """Two float32 CPU tensors; `offset` elements into their storage (1: 4 bytes off alignment)."""
    base = torch.zeros(64 + offset, dtype=torch.float32)
    x, y = base[offset:offset + 32], torch.ones(64 + offset)[offset:offset + 32]
    assert (x.data_ptr() % 16 == 0) == (offset == 0) == (y.data_ptr() % 16 == 0)
    return x, y


def _ptrs(*tensors):
    return tuple(t.data_ptr() for t in tensors)


def test_first_call_jit_then_direct_with_pointers(on_gpu):
    kernel = _FakeKernel()
    launch = _steps.Step(kernel, 7, 2, {"BLOCK": 64, "n": 100}, 4, mode="direct", launch_pdl=True)
    calls = [_pair() for _ in range(3)]
    for x, y in calls:
        launch(x, y)
    (x1, y1), (x2, y2), (x3, y3) = calls
    assert kernel.log[0] == ("jit", (7, 1, 1), (x1, y1, 100, 64), 4, {"launch_pdl": True})
    assert kernel.log[1:] == [("direct", (7, 1, 1), _ptrs(x2, y2) + (100, 64), 77),
                              ("direct", (7, 1, 1), _ptrs(x3, y3) + (100, 64), 77)]
    assert launch.calls == [1, 2] and launch.compiled is kernel.compiled


def test_tensors_mode_and_explicit_stream(on_gpu):
    kernel = _FakeKernel()
    launch = _steps.Step(kernel, (3, 2), 2, {"BLOCK": 8, "n": 5}, 1, mode="tensors")
    x, y = _pair()
    launch(x, y)
    launch(x, y, stream=1234)
    assert kernel.log[0][:3] == ("jit", (3, 2, 1), (x, y, 5, 8))
    assert kernel.log[1] == ("direct", (3, 2, 1), (x, y, 5, 8), 1234)


def test_misaligned_pointers_go_through_the_jit(on_gpu):
    """The JIT specialises pointers on 16-byte alignment: a kernel compiled for aligned
    pointers must never get a misaligned one, and one compiled for a misaligned one is not kept."""
    kernel = _FakeKernel()
    launch = _steps.Step(kernel, 2, 2, {"BLOCK": 8, "n": 5}, 1)
    off = _pair(offset=1)
    launch(*off)  # first call misaligned: JIT, no launcher kept
    assert launch.runner is None
    launch(*_pair())  # aligned: JIT, launcher kept
    launch(*off)  # misaligned again: JIT
    launch(*_pair())  # aligned: direct
    assert [e[0] for e in kernel.log] == ["jit", "jit", "jit", "direct"]


def test_jit_mode_and_interpreter_always_use_the_jit(on_gpu, monkeypatch):
    kernel = _FakeKernel()
    launch = _steps.Step(kernel, 2, 2, {"BLOCK": 8, "n": 5}, 1, mode="jit")
    for _ in range(3):
        launch(*_pair())
    assert [e[0] for e in kernel.log] == ["jit"] * 3 and launch.runner is False
    monkeypatch.setattr(_steps, "interpreted", lambda: True)
    kernel = _FakeKernel()
    launch = _steps.Step(kernel, 2, 2, {"BLOCK": 8, "n": 5}, 1, mode="direct")
    for _ in range(3):
        launch(*_pair())
    assert [e[0] for e in kernel.log] == ["jit"] * 3 and launch.runner is False


@pytest.mark.parametrize("signature, fail", [(2, False), (4, True)], ids=["old-launcher", "launcher-rejects"])
def test_other_launchers_fall_back_to_the_jit(on_gpu, signature, fail):
    kernel = _FakeKernel(signature, fail)
    launch = _steps.Step(kernel, 3, 2, {"BLOCK": 8, "n": 5}, 1)
    for _ in range(3):
        launch(*_pair())
    assert [e[0] for e in kernel.log] == ["jit"] * 3
    assert launch.runner is False


def test_arguments_and_modes_are_checked(monkeypatch):
    kernel = _FakeKernel()
    with pytest.raises(KeyError, match=r"fake: no value for \['BLOCK'\]"):
        _steps.Step(kernel, 3, 2, {"n": 5}, 1)
    with pytest.raises(ValueError, match="grid of 1 to 3 dims"):
        _steps.Step(kernel, (1, 2, 3, 4), 2, {"BLOCK": 8, "n": 5}, 1)
    with pytest.raises(ValueError, match="mode: expected one of direct, tensors, jit, got 'fast'"):
        _steps.Step(kernel, 3, 2, {"BLOCK": 8, "n": 5}, 1, mode="fast")
    monkeypatch.setenv(_steps.MODE_ENV, "tensors")
    assert _steps.Step(kernel, 3, 2, {"BLOCK": 8, "n": 5}, 1).mode == "tensors"
    monkeypatch.setenv(_steps.MODE_ENV, "sometimes")
    with pytest.raises(ValueError, match=r"\$GRADORACLE_TRITON_LAUNCH: expected one of direct, tensors, jit, "
                                         r"got 'sometimes'"):
        _steps.default_mode()
    monkeypatch.delenv(_steps.MODE_ENV)
    assert _steps.default_mode() == "direct"


def test_warmup_and_signature():
    kernel = _FakeKernel()
    launch = _steps.Step(kernel, (4, 2), 2, {"BLOCK": 8, "n": 5}, 2, launch_pdl=True)
    x, y = _pair()
    assert launch.warmup(x, y) is kernel.compiled
    assert kernel.log == [("warmup", (4, 2, 1), (x, y, 5, 8), 2, {"launch_pdl": True})]
    same = _steps.Step(kernel, (4, 2, 1), 2, {"n": 5, "BLOCK": 8}, 2, launch_pdl=True)
    other = _steps.Step(kernel, (4, 2), 2, {"BLOCK": 16, "n": 5}, 2, launch_pdl=True)
    assert launch.signature() == same.signature() != other.signature()


def test_launch_alias_and_resources(on_gpu):
    """`step.launch(...)` is `step(...)` (binary_backward and reduce_sum call it so); resources()
    reads the compiled kernel of the first launch, None before it."""
    kernel = _FakeKernel()
    kernel.compiled.n_regs, kernel.compiled.n_spills = 40, 0
    kernel.compiled.metadata = type("Meta", (), {"shared": 4096})()
    step = _steps.Step(kernel, 5, 2, {"BLOCK": 8, "n": 5}, 4)
    assert step.resources() is None
    x, y = _pair()
    step.launch(x, y)
    step.launch(x, y)
    assert [e[0] for e in kernel.log] == ["jit", "direct"] and step.calls == [1, 1]
    assert step.resources() == {"regs": 40, "spills": 0, "shared": 4096}


class _FakeLauncher:
    """Stands in for a compiled kernel's `run` (triton's CudaLauncher): records its arguments."""

    def __init__(self, log):
        self.log = log

    def __call__(self, *args):
        self.log.append(("run",) + args)


def test_lean_launch_skips_the_runner_unless_hooks(on_gpu, monkeypatch):
    """With a compiled kernel that exposes its launcher, direct calls go straight to it with no
    launch metadata and no hooks; while a launch hook is registered (a profiler), through the
    runner, which calls the hooks."""
    from triton import knobs

    kernel = _FakeKernel()
    c = kernel.compiled
    c.run, c.function, c.packed_metadata = _FakeLauncher(kernel.log), "fn-handle", ("meta",)
    step = _steps.Step(kernel, (6, 2), 2, {"BLOCK": 8, "n": 5}, 4)
    x, y = _pair()
    step(x, y)
    step(x, y, stream=9)
    assert kernel.log[1] == ("run", 6, 2, 1, 9, "fn-handle", ("meta",), None, None, None) + _ptrs(x, y) + (5, 8)
    monkeypatch.setattr(knobs.runtime.launch_enter_hook, "calls", [lambda metadata: None])
    step(x, y, stream=9)
    assert kernel.log[2] == ("direct", (6, 2, 1), _ptrs(x, y) + (5, 8), 9)
    assert step.calls == [1, 2]


def test_aligned():
    x, y = _pair()
    assert _steps.aligned((x, y))
    assert not _steps.aligned((x, _pair(offset=1)[1]))
    assert _steps.aligned(())


# ----------------------------------------------------------------------------- a real kernel


@jit
def _axpy_kernel(x_ptr, y_ptr, out_ptr, n, a, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, a * tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)


def _real_kernel_check() -> None:
    launch = _steps.Step(_axpy_kernel, 3, 3, {"n": 37, "a": 2.5, "BLOCK": 16}, 1)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        x, y = torch.randn(37, generator=g), torch.randn(37, generator=g)
        out = torch.full((37,), float("nan"))
        launch(x, y, out)
        assert torch.equal(out, 2.5 * x + y), seed
    assert launch.calls == [3, 0]  # the interpreter: every call through the JIT


def test_real_kernel_under_the_interpreter():
    if interpreted() and os.environ.get("TRITON_INTERPRET") == "1":
        _real_kernel_check()
        return
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, __file__, "--real"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


if __name__ == "__main__" and sys.argv[1:2] == ["--real"]:
    _real_kernel_check()
    print("ok")
