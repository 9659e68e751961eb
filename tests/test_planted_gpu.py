"""Raw CUDA kernels with planted memory and race faults: run_case must fail each one on a GPU.

Each kernel computes binary_backward for fn=add with A = [R, C] and B = [C] (grad_a = grad_out,
grad_b = its column sums), through cupy.RawKernel, with one fault compiled in by -DFAULT=n:
an element never written, a store one past the end, a load one row past the end masked by a
multiply (NaN from the input's guard band), grad_out overwritten, and grad_b summed with
float atomicAdd while claiming to be deterministic.  The clean build must pass, so a failure
is the fault's and not the harness's.  Without CUDA the module skips.
"""
import numpy as np
import pytest

from cases import Case
from harness.registry import Backend
from harness.runner import run_case

cupy = pytest.importorskip("cupy")


def _cuda_devices() -> int:
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no driver, no device: skip
        return 0


if not _cuda_devices():
    pytest.skip("needs a CUDA device (cupy finds none)", allow_module_level=True)

pytestmark = pytest.mark.gpu

SOURCE = r"""
#define CLEAN 0
#define UNWRITTEN 1
#define OOB_WRITE 2
#define OOB_READ 3
#define MUTATE 4
#define ATOMIC 5

extern "C" __global__ void add_backward(const float* g, float* ga, float* gb, int R, int C) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int n = R * C;
#if FAULT == UNWRITTEN
    if (i < n - 1) ga[i] = g[i];             // the last element is never written
#elif FAULT == OOB_WRITE
    if (i <= n) ga[i] = i < n ? g[i] : 0.0f; // off-by-one bound: stores ga[n]
#else
    if (i < n) ga[i] = g[i];
#endif
#if FAULT == ATOMIC
    if (i < n) atomicAdd(&gb[i % C], g[i]);  // order of the adds changes run to run
#else
    if (i < C) {
        float acc = 0.0f;
#if FAULT == OOB_READ
        for (int r = 0; r <= R; ++r) acc += g[r * C + i] * (r < R ? 1.0f : 0.0f);  // loads row R
#else
        for (int r = 0; r < R; ++r) acc += g[r * C + i];
#endif
        gb[i] = acc;
    }
#endif
}

extern "C" __global__ void scribble(float* g, int n) {  // MUTATE: grad_out used as scratch afterwards
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = -g[i];
}
"""
FAULTS = {"clean": 0, "unwritten": 1, "oob_write": 2, "oob_read": 3, "mutate": 4, "atomic": 5}

gpu_planted = Backend("gpu_planted", framework="cupy", devices=("cuda",), register=False,
                      description="raw CUDA kernels with planted faults")
_MODULES: dict = {}


def _kernel(fault: str, name: str = "add_backward"):
    if fault not in _MODULES:
        _MODULES[fault] = cupy.RawModule(code=SOURCE, options=(f"-DFAULT={FAULTS[fault]}",))
    return _MODULES[fault].get_function(name)


def _launcher(fault: str):
    def fn(inputs, outs, params):
        g, ga, gb = inputs["grad_out"], outs["grad_a"], outs["grad_b"]
        for name, x in (("grad_out", g), ("grad_a", ga), ("grad_b", gb)):
            if not x.flags.c_contiguous:
                raise ValueError(f"gpu_planted: {name} must be C-contiguous, got strides {x.strides}")
        rows, cols = (int(d) for d in ga.shape)
        n = rows * cols
        if fault == "atomic":
            gb.fill(0)
        _kernel(fault)(((n + 1 + 255) // 256,), (256,), (g, ga, gb, np.int32(rows), np.int32(cols)))
        if fault == "mutate":
            _kernel(fault, "scribble")(((n + 255) // 256,), (256,), (g, np.int32(n)))
    return fn


def _add_only(case):
    p = case.params
    ok = p["fn"] == "add" and len(p["a"]) == 2 and list(p["b"]) == [p["a"][1]]
    return None if ok else "gpu_planted: fn=add with A=[R, C], B=[C] only"


for _fault in FAULTS:
    gpu_planted.impl("binary_backward", variant=_fault, dtypes=("f32",), supports=_add_only)(_launcher(_fault))
gpu_planted.impl("binary_backward", variant="atomic_declared", dtypes=("f32",), supports=_add_only,
                 deterministic=False)(_launcher("atomic"))

SMALL = Case("binary_backward", "f32", {"fn": "add", "a": [64, 32], "b": [32]})
# Many adds into few addresses: the float atomicAdd order differs between runs.
CONTENDED = Case("binary_backward", "f32", {"fn": "add", "a": [65536, 4], "b": [4]})


def _run(variant, case=SMALL, **kw):
    return run_case(gpu_planted.impls[("binary_backward", variant)], case, "cuda", run_seed=1, oracle="numpy", **kw)


def test_clean_kernel_passes():
    for case in (SMALL, CONTENDED):
        r = _run("clean", case)
        assert r.status == "PASS", r.report()


def test_unwritten_element_fails():
    r = _run("unwritten")
    assert r.status == "FAIL", r.report()
    grad_a = next(o for o in r.outputs if o.name == "grad_a")
    assert grad_a.mismatches == 1 and grad_a.worst_index == (63, 31) and "got nan" in grad_a.message


def test_write_one_past_the_end_fails():
    r = _run("oob_write")
    assert r.status == "FAIL", r.report()
    assert "[grad_a] FAIL guard band written: 1 element(s) after the end changed, first at end+0" in r.report()
    assert "reproduce: python -m harness run" in r.report()


def test_read_one_row_past_the_end_fails():
    r = _run("oob_read")
    assert r.status == "FAIL", r.report()
    grad_b = next(o for o in r.outputs if o.name == "grad_b")
    assert grad_b.mismatches == 32 and "got nan" in grad_b.message


def test_input_mutation_fails():
    r = _run("mutate")
    assert r.status == "FAIL", r.report()
    assert "[grad_out] FAIL input modified by the call: 2048 element(s) changed, first at (0,0)" in r.report()


def test_racy_atomic_sum_claiming_determinism_fails():
    r = _run("atomic", CONTENDED, repeats=20)
    assert r.status == "FAIL", r.report()
    assert "[grad_b] FAIL not deterministic" in r.report() and "--repeat 20" in r.repro
    print(r.report())


def test_racy_atomic_sum_declared_reports_its_spread():
    r = _run("atomic_declared", CONTENDED, repeats=20)
    assert r.status == "PASS", r.report()
    assert r.to_json()["spread"] > 0 and r.calls == 21
    print(r.report())
