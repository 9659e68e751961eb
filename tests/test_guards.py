"""The guard machinery itself: NaN bands around inputs, canary bands around outputs, bitwise
comparison, and that the timing path still sees the same buffers (harness/guards.py)."""
import json

import ml_dtypes
import numpy as np
import pytest

from cases import Case
from harness import cli, frameworks, guards, runner
from harness.runner import REPEAT_ENV
from harness.tensors import GUARD_BYTES, LAYOUTS, from_values

DTYPES = ("f32", "f16", "bf16", "f64")
ADAPTERS = ("numpy", "torch")


def _host_nan(x) -> np.ndarray:
    return np.isnan(np.asarray(x, dtype=np.float64))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_has_nan_bands_and_keeps_its_values(layout, dtype):
    values = np.arange(1, 13, dtype=np.float64).reshape(3, 4)
    t = from_values(values, dtype, layout)
    g = t.guard
    assert g * t.base.itemsize == GUARD_BYTES and t.offset >= g
    assert _host_nan(t.base[:g]).all() and _host_nan(t.base[-g:]).all()
    assert np.array_equal(t.float64(), values)
    assert t.span_nbytes == t.base.nbytes - 2 * GUARD_BYTES
    last = t.offset + sum((n - 1) * s for n, s in zip(t.shape, t.strides))
    assert t.base.size - 1 - last >= g  # a whole band after the view's last element


@pytest.mark.parametrize("layout", LAYOUTS)
def test_locate_names_view_indices_gaps_and_bands(layout):
    t = from_values(np.ones((3, 4)), "f32", layout)
    seen = set()
    for idx in np.ndindex(*t.shape):
        flat = t.offset + sum(i * s for i, s in zip(idx, t.strides))
        assert t.locate(flat) == f"({idx[0]},{idx[1]})"
        seen.add(flat)
    assert t.locate(0) == f"guard band before the view, start-{t.guard}"
    assert t.locate(t.base.size - 1) == f"guard band after the view, end+{t.guard - 1}"
    gaps = [k for k in range(t.guard, t.base.size - t.guard) if k not in seen]
    assert (layout == "sliced") == bool(gaps)
    assert all("a gap between the view's elements" in t.locate(k) for k in gaps)


def test_scalar_inputs_get_bands_too():
    t = from_values(np.float64(1.5), "f16")
    assert t.shape == () and t.guard == GUARD_BYTES // 2 and float(t.float64()) == 1.5 and t.locate(t.offset) == "()"


@pytest.mark.parametrize("dtype", DTYPES)
def test_canaries_are_finite_nonzero_values_of_every_dtype(dtype):
    npdt = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16, "f64": np.float64}[dtype]
    item = np.dtype(npdt).itemsize
    value = np.array([guards.CANARY[item]], dtype=f"u{item}").view(npdt)[0]
    assert np.isfinite(np.float64(value)) and np.float64(value) != 0
    assert guards.band_elems(item) * item == GUARD_BYTES


@pytest.mark.parametrize("fw_name", ADAPTERS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_guarded_outputs_are_contiguous_poisoned_views_inside_canary_bands(fw_name, dtype):
    fw = frameworks.adapter(fw_name)
    item = {"f64": 8, "f32": 4}.get(dtype, 2)
    g, canary = guards.band_elems(item), guards.CANARY[item]
    flat, view = fw.guarded((3, 5), dtype, "cpu", g, canary)
    assert tuple(view.shape) == (3, 5) and fw.dtype_name(view) == dtype and fw.nan_count(view) == 15
    if fw_name == "torch":
        assert view.is_contiguous() and view.storage_offset() == g and view.data_ptr() == flat.data_ptr() + g * item
    else:
        assert view.flags.c_contiguous and view.ctypes.data == flat.ctypes.data + g * item
    assert (fw.bits_host(flat, 0, g) == canary).all() and (fw.bits_host(flat, g + 15, 15 + 2 * g) == canary).all()


@pytest.mark.parametrize("fw_name", ADAPTERS)
def test_first_difference_compares_bits(fw_name):
    fw = frameworks.adapter(fw_name)
    t = from_values(np.array([1.0, np.nan, 0.0, 3.0]), "f32")
    x, y = fw.to_device(t, "cpu"), fw.to_device(t, "cpu")
    assert fw.first_difference(x, y) is None  # NaN equals NaN bit for bit
    neg = from_values(np.array([1.0, np.nan, -0.0, 2.0]), "f32")
    assert fw.first_difference(x, fw.to_device(neg, "cpu")) == (2, 2)  # -0 is not +0


@pytest.mark.parametrize("fw_name", ADAPTERS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_upload_view_clone_copy_carry_the_bands(fw_name, layout):
    """What timed_check does with the input buffers still works with the bands in them."""
    fw = frameworks.adapter(fw_name)
    t0 = from_values(np.arange(12.0).reshape(3, 4) + 1, "bf16", layout)
    t1 = from_values(-np.arange(12.0).reshape(3, 4) - 1, "bf16", layout)
    flat = fw.clone(fw.upload(t0, "cpu"))
    assert np.array_equal(fw.to_host64(fw.view(flat, t0)), t0.float64())
    flat = fw.copy(flat, fw.upload(t1, "cpu"))
    assert np.array_equal(fw.to_host64(fw.view(flat, t1)), t1.float64())
    host = fw.to_host64(flat)
    assert np.isnan(host[:t1.guard]).all() and np.isnan(host[-t1.guard:]).all()


def test_footprint_counts_the_spans_not_the_bands():
    case = Case("binary_backward", "f32", {"fn": "mul", "a": [6, 8], "b": [8], "b_layout": "contig"})
    inputs = runner.generate(case, 0)
    spans = sum(t.base.nbytes - 2 * GUARD_BYTES for t in inputs.values())
    assert runner.footprint_bytes(case, inputs) == spans + (48 + 8) * 4
    assert spans == (48 + 8 + 48) * 4


def test_jax_implementations_get_no_buffers_to_guard():
    fw = frameworks.adapter("jax")
    assert fw.guarded((2, 3), "f32", "cpu", 64, guards.CANARY[4]) == (None, None)


def test_refill_keeps_buffers_and_view_objects_and_rejects_other_layouts():
    from harness.registry import discover, find_impl

    discover()
    case = Case("binary_backward", "f32", {"fn": "mul", "a": [6, 8], "b": [8]})
    call = guards.GuardedCall(find_impl("binary_backward", "torch"), case, "cpu", runner.generate(case, 0))
    views, ptrs = dict(call.views), {k: v.data_ptr() for k, v in call.views.items()}
    call.refill(runner.generate(case, 0, variant=1))
    assert all(call.views[k] is views[k] and views[k].data_ptr() == ptrs[k] for k in views)
    refilled = runner.generate(case, 0, variant=1)["a"].float64().astype(np.float32)
    assert np.array_equal(call.views["a"].numpy(), refilled)
    other = Case("binary_backward", "f32", {"fn": "mul", "a": [6, 8], "b": [8], "a_layout": "sliced"})
    with pytest.raises(ValueError, match="binary_backward: refill of input 'a' expects the same buffer layout"):
        call.refill(runner.generate(other, 0))


def test_run_repeat_option_reaches_run_case(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(REPEAT_ENV, "")  # restored (removed) after the test: the CLI sets it
    spec = json.dumps({"op": "binary_backward", "dtype": "f32", "params": {"fn": "mul", "a": [4, 3], "b": [3]}})
    out = tmp_path / "r.json"
    assert cli.main(["run", "--backend", "torch", "--device", "cpu", "--seed", "2", "--case", spec,
                     "--repeat", "3", "--json", str(out)]) == 0
    row = json.loads(out.read_text())["results"][0]
    assert row["calls"] == 4 and row["spread"] == 0.0 and row["recheck"] == "oracle"
    assert row["repro"].endswith(" --repeat 3")
    with pytest.raises(SystemExit, match="--repeat expects N >= 1, got 0"):
        cli.main(["run", "--backend", "torch", "--device", "cpu", "--case", spec, "--repeat", "0"])

