"""The stress cases (over 2**31 elements) without a GPU: that they exist for every memory-bound
op, that harness/stress.py judges them within one machine's memory and equals the whole-case
oracle, that every backend either claims them or says why not, and that the custom kernels'
index math holds past 2**31 where a CPU can run it.

- The chunked oracle (row chunks, sampled big outputs) is checked against the ordinary one on
  small cases of every op, with the size thresholds lowered so they take the stress path.
- run_case on such a case passes the torch backend and fails planted faults that only a
  huge case shows: a row past the int32 boundary left unwritten, or written wrong.
- Index math: the Triton kernels (TRITON_INTERPRET=1) and torch_ext's C++ CPU kernels run on
  views whose element offsets pass 2**31 and 2**32 (a row stride of 2**30 + 64 elements),
  inside a sparse 8 GiB zero buffer of which only a few pages are ever touched; each must give
  the same bits as on a dense copy.  An int32 offset would wrap 2**32 elements back, into the
  same buffer, and read zeros.  cupy's and torch_ext's CUDA kernels share
  backends/cuda/binary_backward.cuh, which only the GPU runs (scripts/gpu_stress.sh); here
  their host-side launch plans for the stress shapes are checked: 64-bit words, grid and
  workspace within bounds.
"""
from __future__ import annotations

from math import prod

import numpy as np
import pytest

from cases import select
from cases.registry import Case
from harness import dtypes, prepare, runner, stress
from harness import prepared as prepared_mod
from harness.registry import Backend, find_impl, get_op, impls_for

MEMORY_BOUND = ("binary_backward", "reduce_sum", "layernorm_backward", "rmsnorm_backward")
INT32_LIMIT = 2**31

# The implementations that claim every stress case of their op (dtype listed, no `supports`
# reason): each indexes with 64-bit offsets (cupy / torch_ext: backends/cuda/binary_backward.cuh
# "All index math is 64-bit"; triton: int64 program ids and descriptor; torch, torch_compile,
# jax: the libraries), so none declares a limit.  A backend that cannot take a stress case must
# say so through `supports` (the row shows SKIP with the reason) and be listed in LIMITED.
CLAIMS = {
    "binary_backward": {"torch", "torch_compile", "jax", "cupy@opt", "cupy@naive", "torch_ext", "triton"},
    "reduce_sum": {"torch", "torch_compile", "jax"},
    "layernorm_backward": {"torch", "torch_compile", "jax"},
    "rmsnorm_backward": {"torch", "torch_compile", "jax"},
}
LIMITED: dict = {}  # (op, impl id) -> a word its skip reason must contain


def _numel(case) -> int:
    return max(prod(s) for s in get_op(case.op).shapes(case).values())


# ----------------------------------------------------------------------------- the stress set


@pytest.mark.parametrize("op", MEMORY_BOUND)
def test_every_memory_bound_op_has_stress_cases_over_int32(op):
    found = select("stress", op=op)
    assert found, f"{op}: no stress case"
    for case in found:
        assert _numel(case) > INT32_LIMIT, case.id
        assert stress.applies(case), f"{case.id} would take the in-memory path: it cannot fit"
        plan = stress.row_plan(case)
        assert len(plan.bounds()) > 100  # chunks small enough for many threads and little memory


def _bytes(case, names) -> int:
    spec, item = get_op(case.op), np.dtype(dtypes.numpy_dtype(case.dtype)).itemsize
    shapes = spec.shapes(case)
    return sum(prod(shapes[n]) * item for n in names)


@pytest.mark.parametrize("case", select("stress"), ids=lambda c: f"{c.op}-{c.id}")
def test_stress_case_fits_the_h100_and_its_host(case):
    """What one run holds, from how run_case and the guards allocate (harness/runner.py,
    harness/guards.py): on the card, the inputs and their snapshot, the outputs and the stale
    check's clone of them, a second snapshot and one upload while the inputs are refilled;
    on the host, the inputs in the case dtype twice (the two seed variants) and the float64
    work of one chunk per thread.  Under 64 of the 80 GB leaves 16 GB for a backend's own
    temporaries (cupy@naive's float32 accumulators: 8.6 GB per 2**31-element output)."""
    spec = get_op(case.op)
    ins, outs = spec.inputs, spec.outputs_of(case)
    shapes = spec.shapes(case)
    inputs, outputs = _bytes(case, [n for n in ins if n in shapes]), _bytes(case, outs)
    biggest = max(_bytes(case, [n]) for n in ins if n in shapes)
    device = 3 * inputs + 2 * outputs + biggest
    assert device < 64e9, f"{case.id}: about {device / 1e9:.0f} GB on the card"
    threads, chunk_f64 = 16, 12 * 8 * stress.CHUNK_ELEMS  # a dozen float64 chunk arrays per thread
    host = 2 * inputs + threads * chunk_f64
    assert host < 64e9, f"{case.id}: about {host / 1e9:.0f} GB on the host"


# ----------------------------------------------------------------------------- the chunked oracle

SMALL = [
    Case("binary_backward", "f32", {"fn": "mul", "a": [7, 5], "b": [5]}),
    Case("binary_backward", "bf16", {"fn": "div", "a": [7, 5], "b": [7, 1]}),
    Case("binary_backward", "f32", {"fn": "maximum", "a": [7, 5], "b": [7, 5]}),
    Case("binary_backward", "f16", {"fn": "pow", "a": [7, 3, 4], "b": [3, 1]}),
    Case("binary_backward", "f32", {"fn": "sub", "a": [1, 5], "b": [7, 5]}),
    Case("reduce_sum", "f32", {"shape": [7, 5], "axes": [0]}),
    Case("reduce_sum", "f32", {"shape": [7, 5], "axes": [1]}),
    Case("reduce_sum", "bf16", {"shape": [7, 5], "target": [5]}),
    Case("reduce_sum", "f32", {"shape": [7, 5], "axes": None, "keepdim": True}),
    Case("layernorm_backward", "f32", {"shape": [7, 6]}),
    Case("layernorm_backward", "bf16", {"shape": [7, 6], "bias": False}),
    Case("layernorm_backward", "f32", {"shape": [7, 2, 6], "affine": False, "bias": False}),
    Case("rmsnorm_backward", "f32", {"shape": [7, 6]}),
    Case("rmsnorm_backward", "bf16", {"shape": [7, 6], "eps": 1e-5}),
]


@pytest.fixture
def tiny_thresholds(monkeypatch):
    """Small cases take the stress path: 2-row chunks (the last one short), outputs over 20
    elements sampled at 8 uniform indices plus boundary windows of 2."""
    monkeypatch.setattr(stress, "HUGE_NUMEL", 10)
    monkeypatch.setattr(stress, "CHUNK_ELEMS", 12)
    monkeypatch.setattr(stress, "BOUNDARY", 2)
    monkeypatch.setattr(prepared_mod, "SAMPLE_ABOVE", 20)
    monkeypatch.setattr(prepared_mod, "SAMPLE_SIZE", 8)
    monkeypatch.setattr(stress, "_PLANS", {})
    monkeypatch.setattr(stress, "_INPUTS", stress.OrderedDict())
    prepare._CACHE.clear()
    yield
    prepare._CACHE.clear()


@pytest.mark.parametrize("case", SMALL, ids=lambda c: f"{c.op}-{c.id}")
def test_chunked_oracle_equals_the_whole_case_oracle(tiny_thresholds, case):
    spec = get_op(case.op)
    assert stress.applies(case)
    prepared = stress.build_prepared(case, seed=123)
    in64 = {k: t.float64() for k, t in prepared.inputs.items()}
    assert not any(np.isnan(v).any() for v in in64.values())  # every row of every input was written
    for name, t in prepared.inputs.items():  # NaN guard bands around every input, as from_values makes them
        assert t.guard and np.isnan(t.base[:t.guard].astype(np.float64)).all()
        assert np.isnan(t.base[-t.guard:].astype(np.float64)).all()
    ref, scale = spec.numpy_oracle(in64, case.params), spec.error_scale(in64, case.params)
    sampled = 0
    for name in spec.outputs_of(case):
        whole_scale, n = scale[name]
        assert prepared.scale[name][1] == n, name
        if name in prepared.samples:
            sampled += 1
            idx, ref_at, scale_at = prepared.samples[name]
            assert idx[0] == 0 and idx[-1] == prod(ref[name].shape) - 1
            np.testing.assert_allclose(ref_at, ref[name].reshape(-1)[idx], rtol=1e-12, atol=1e-300)
            np.testing.assert_allclose(scale_at, np.asarray(whole_scale).reshape(-1)[idx], rtol=1e-12)
            assert prepared.nan_count(name) == int(np.isnan(ref[name]).sum())
        else:
            np.testing.assert_allclose(prepared.ref[name], ref[name], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(prepared.scale[name][0], whole_scale, rtol=1e-12, atol=1e-300)
    big = [n for n in spec.outputs_of(case) if prod(spec.shapes(case)[n]) > prepared_mod.SAMPLE_ABOVE]
    assert sampled == len([n for n in big if n in stress.row_plan(case).split])


def test_inputs_are_a_pure_function_of_the_seed(tiny_thresholds):
    case = SMALL[0]
    one = stress.build_prepared(case, seed=5).inputs
    stress._INPUTS.clear()
    two = stress.generate(case, seed=5)
    other = stress.generate(case, seed=6)
    for k in one:
        assert np.array_equal(one[k].base.view(np.uint8), two[k].base.view(np.uint8))
    assert not np.array_equal(one["a"].float64(), other["a"].float64())


def test_sample_keeps_the_int32_boundaries():
    idx = stress.sample_indices((1 << 31) + (1 << 20), 1000, seed=1)
    assert np.all(np.diff(idx) > 0) and idx.dtype == np.int64
    for must in (0, (1 << 31) - 1, 1 << 31, (1 << 31) + stress.BOUNDARY - 1, (1 << 31) + (1 << 20) - 1):
        assert must in set(idx.tolist())


def test_ordinary_cases_keep_the_ordinary_path():
    assert not any(stress.applies(c) for c in select("full"))
    assert not stress.applies(Case("binary_backward", "bf16", {"fn": "mul", "a": [2049, 1 << 20], "b": [1 << 20],
                                                               "a_layout": "transposed"}))
    assert not stress.applies(Case("matmul_backward", "bf16", {"m": 1 << 16, "n": 1 << 16, "k": 1}))


# ----------------------------------------------------------------------------- run_case on it

faulty = Backend("stress_faults", framework="torch", devices=("cpu",), register=False,
                 description="binary_backward mul with faults that show only past a row boundary")


def _mul_into(inputs, outs):
    a, b, g = inputs["a"], inputs["b"], inputs["grad_out"]
    outs["grad_a"].copy_((g.float() * b.float()).sum_to_size(a.shape))
    outs["grad_b"].copy_((g.float() * a.float()).sum_to_size(b.shape))


@faulty.impl("binary_backward", variant="last_row_unwritten", dtypes=("f32",))
def _last_row_unwritten(inputs, outs, params):
    keep = outs["grad_a"][-1].clone()
    _mul_into(inputs, outs)
    outs["grad_a"][-1].copy_(keep)  # still the NaN poison: an int32 offset that never got there


@faulty.impl("binary_backward", variant="last_row_wrapped", dtypes=("f32",))
def _last_row_wrapped(inputs, outs, params):
    _mul_into(inputs, outs)
    outs["grad_a"][-1].copy_(outs["grad_a"][0])  # the last row computed from the first row's data


@pytest.mark.parametrize("case", [c for c in SMALL if c.op in ("binary_backward", "layernorm_backward",
                                                                "reduce_sum")][:6],
                         ids=lambda c: f"{c.op}-{c.id}")
def test_run_case_passes_torch_on_the_stress_path(tiny_thresholds, case):
    r = runner.run_case(find_impl(case.op, "torch"), case, "cpu", run_seed=3)
    assert r.status == "PASS", r.report()
    assert r.oracle == "numpy@rows" and r.recheck
    sampled = [o for o in r.outputs if "sampled" in o.details]
    assert bool(sampled) == any(o in stress.row_plan(case).split and prod(get_op(case.op).shapes(case)[o]) > 20
                                for o in get_op(case.op).outputs_of(case))


@pytest.mark.parametrize("variant, words", [("last_row_unwritten", "NaN count"), ("last_row_wrapped", "worst at")])
def test_run_case_fails_a_row_past_the_boundary(tiny_thresholds, monkeypatch, variant, words):
    monkeypatch.setattr(stress, "BOUNDARY", 5)  # the last row (5 elements) is in the sample whole
    case = Case("binary_backward", "f32", {"fn": "mul", "a": [7, 5], "b": [5]})
    r = runner.run_case(faulty.impls[("binary_backward", variant)], case, "cpu", run_seed=3)
    assert r.status == "FAIL", r.report()
    bad = [o for o in r.outputs if not o.passed]
    assert [o.name for o in bad] == ["grad_a"] and words in bad[0].message, r.report()


# ----------------------------------------------------------------------------- backends' declarations


@pytest.mark.parametrize("op", MEMORY_BOUND)
def test_each_backend_claims_the_stress_cases_or_says_why_not(op):
    """Every implementation of the op either claims each stress case (its dtype listed and no
    `supports` reason) or gives a reason, and the known ones do what CLAIMS / LIMITED say."""
    for case in select("stress", op=op):
        for impl in impls_for(op):
            reason = None if case.dtype in impl.dtypes else f"dtype {case.dtype}"
            if reason is None and impl.supports is not None:
                reason = impl.supports(case)
            if (op, impl.id) in LIMITED:
                assert reason and LIMITED[(op, impl.id)] in reason, (impl.id, case.id, reason)
            elif impl.id in CLAIMS[op]:
                assert reason is None, f"{impl.id} declines {case.id}: {reason}"
            else:  # a backend not reviewed here (e.g. liger, an entry point): a reason if it declines
                assert reason is None or reason.strip(), impl.id
    assert {i.id for i in impls_for(op)} >= CLAIMS[op]


# ----------------------------------------------------------------------------- launch plans


def _binary_stress():
    return select("stress", op="binary_backward")


@pytest.mark.parametrize("case", _binary_stress(), ids=lambda c: c.id)
def test_cupy_launch_plan_of_the_stress_shapes(case):
    """What cupy (and torch_ext's CUDA op, from the same plan) would launch: the BBParams words carry
    sizes past 2**31 unchanged, the grid fits a launch, the partial rows a few hundred MB at most."""
    from backends._plans import binary_backward as _bcast_plan
    from backends._plans import binary_backward_cuda as cuda_plan
    from backends.cupy import binary_backward as cupy_raw

    a, b = case.params["a"], case.params["b"]
    plan = _bcast_plan.make_plan(a, b, _bcast_plan.contiguous_strides(a), _bcast_plan.contiguous_strides(b),
                                 _bcast_plan.contiguous_strides(_bcast_plan.broadcast_shape(a, b)))
    launch = cuda_plan.plan_launch(plan, 132, (0,) * 5, 2)
    assert plan.numel > INT32_LIMIT
    assert 1 <= launch.grid < 2**31
    if launch.words:
        words = cupy_raw.params_struct(launch.words)["words"][0]
        assert words.dtype == np.int64 and list(words) == launch.words
        assert max(launch.words) == max(plan.k.numel, plan.ra.numel, plan.rb.numel, *launch.words)
    partial_bytes = sum(n * numel * 4 for n, numel in zip(launch.nchunks, launch.numel_out) if n > 1)
    assert partial_bytes < 512e6, f"{launch.kind}: {partial_bytes / 1e9:.1f} GB of partials"
    assert cuda_plan.naive_grid(plan.numel) < 2**31


@pytest.mark.parametrize("case", _binary_stress(), ids=lambda c: c.id)
def test_triton_launch_plan_of_the_stress_shapes(case):
    pytest.importorskip("torch")
    from backends._plans import binary_backward as _bcast_plan
    from backends.triton import binary_backward as tk

    a, b = case.params["a"], case.params["b"]
    plan = _bcast_plan.make_plan(a, b, _bcast_plan.contiguous_strides(a), _bcast_plan.contiguous_strides(b),
                                 _bcast_plan.contiguous_strides(_bcast_plan.broadcast_shape(a, b)))
    if plan.contiguous_fast_path():
        block = min(tk.GPU_CONFIG.flat_bytes // 2, tk.p2(plan.numel))
        assert -(-plan.numel // block) < 2**31
        return
    L = tk.plan_tile(plan, 2, "mul")
    assert 1 <= L.grid < 2**31
    workspace = 4 * (L.parts_a * prod(a) * (L.parts_a > 1) + L.parts_b * prod(b) * (L.parts_b > 1))
    assert workspace < 1e9, f"{workspace / 1e9:.1f} GB of float32 partials"


# ----------------------------------------------------------------------------- offsets past 2**31 on the CPU

START = (1 << 31) + (1 << 20)  # the views start here: an offset wrapped by 2**32 still lands in the buffer
ROW = (1 << 30) + 64  # row stride: row 2 starts past 2**31 elements from the view, row 4 past 2**32
R, C = 5, 16
SPARSE = START + (R - 1) * ROW + (1 << 20)  # float16 elements: 13 GB of address space, a few pages touched


@pytest.fixture(scope="module")
def sparse():
    """A zero float16 buffer of SPARSE elements whose untouched pages take no memory (MAP_NORESERVE)."""
    torch = pytest.importorskip("torch")
    import mmap

    try:
        flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20) | getattr(mmap, "MAP_NORESERVE", 0)
        buf = mmap.mmap(-1, 2 * SPARSE, flags=flags)
    except (OSError, ValueError, OverflowError) as exc:
        pytest.skip(f"no {2 * SPARSE / 2**30:.0f} GiB of address space for a sparse buffer ({exc})")
    yield torch.from_numpy(np.frombuffer(buf, dtype=np.float16))


def _far_views(sparse, b_shape):
    """a and grad_out (R, C) with row stride ROW inside the sparse buffer; b small and dense."""
    import torch

    rng = np.random.default_rng(7)
    views = {}
    for k, name in enumerate(("grad_out", "a")):
        v = sparse[START + 32 * k:].as_strided((R, C), (ROW, 1))
        v.copy_(torch.from_numpy(rng.uniform(0.25, 2.0, (R, C)) * rng.choice([-1, 1], (R, C))).half())
        views[name] = v
    views["b"] = torch.from_numpy(rng.uniform(0.25, 2.0, b_shape)).half()
    assert views["a"].storage_offset() + (R - 1) * ROW > START + (1 << 32)
    return views


def _fresh(b_shape):
    import torch

    return {"grad_a": torch.full((R, C), float("nan"), dtype=torch.float16),
            "grad_b": torch.full(b_shape, float("nan"), dtype=torch.float16)}


B_SHAPES = [(C,), (R, 1), (R, C)]


@pytest.mark.parametrize("b_shape", B_SHAPES, ids=str)
def test_triton_offsets_past_int32(sparse, b_shape):
    import torch

    from backends.triton import binary_backward as tk

    if not tk.interpreted():
        pytest.skip("needs TRITON_INTERPRET=1 (a GPU machine runs the stress cases instead)")
    views = _far_views(sparse, b_shape)
    far, dense = _fresh(b_shape), _fresh(b_shape)
    tk.run(views, far, {"fn": "mul"}, tk.INTERPRETER_CONFIG)
    tk.run({k: v.contiguous() for k, v in views.items()}, dense, {"fn": "mul"}, tk.INTERPRETER_CONFIG)
    for k in far:
        assert not torch.isnan(far[k]).any() and torch.equal(far[k], dense[k]), k


@pytest.mark.parametrize("b_shape", B_SHAPES, ids=str)
def test_torch_ext_cpu_offsets_past_int32(sparse, b_shape):
    import torch

    from backends import torch_ext

    reason = torch_ext._check("cpu")
    if reason:
        pytest.skip(reason)
    views = _far_views(sparse, b_shape)
    far, dense = _fresh(b_shape), _fresh(b_shape)
    torch.ops.gradoracle.binary_backward.out(views["a"], views["b"], views["grad_out"], "mul",
                                             grad_a=far["grad_a"], grad_b=far["grad_b"])
    d = {k: v.contiguous() for k, v in views.items()}
    torch.ops.gradoracle.binary_backward.out(d["a"], d["b"], d["grad_out"], "mul",
                                             grad_a=dense["grad_a"], grad_b=dense["grad_b"])
    for k in far:
        assert not torch.isnan(far[k]).any() and torch.equal(far[k], dense[k]), k


def test_gpu_stress_script_parses():
    import shutil
    import subprocess
    from pathlib import Path

    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu_stress.sh"
    subprocess.run([bash, "-n", str(script)], check=True)
