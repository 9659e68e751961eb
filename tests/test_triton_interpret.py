"""The `triton` backend run by the Triton interpreter (TRITON_INTERPRET=1) on small shapes.

Every broadcast pattern (A, B or both broadcast, scalars, rank mismatch, size-0 dims,
transposed and sliced views) and every fn, in float32, plus float16 / bfloat16 / float64
on a few, against the float64 oracle.  Each pattern runs with the backend's own sizing
and with TINY sizing, which splits even these shapes into many blocks, chunks and
partials, so the two-stage reduction runs too.

TRITON_INTERPRET must be set before triton is imported.  The test session sets it on
GPU-less machines; where it was not (a GPU machine), the cases run in one worker
subprocess that sets it, and each test reads its result.
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/: the shared interpreter helper

from triton_interp import check_result, interpreting_here, report, worker_results  # noqa: E402
from backends.triton import binary_backward as tk  # noqa: E402
from harness import dtypes  # noqa: E402
from oracle import binary_backward as bb  # noqa: E402
from oracle.broadcast import sum_to_shape  # noqa: E402

# label: (A, B, layouts of a, b, grad_out)
PATTERNS = {
    "same": ((2, 3, 5), (2, 3, 5), "contig", "contig", "contig"),        # the flat kernel
    "b_rows": ((3, 4, 10), (10,), "contig", "contig", "contig"),        # K contiguous, grad_b sums rows
    "b_last": ((3, 4, 10), (3, 4, 1), "contig", "contig", "contig"),    # RB contiguous
    "b_mid": ((3, 4, 10), (3, 1, 10), "contig", "contig", "contig"),    # K of two dims
    "a_bcast": ((4, 1), (4, 6), "contig", "contig", "contig"),          # loops over RA
    "a_rank": ((6,), (3, 5, 6), "contig", "contig", "contig"),          # rank mismatch
    "both": ((3, 1, 5), (1, 4, 1), "contig", "contig", "contig"),
    # both broadcast, the summed row contiguous (_batch_kernel): rows of 37 (no multiple of a
    # chunk), 11 batches (no multiple of a tile), and the mirror image (grad_b sums the batches)
    "both_rows": ((1, 3, 37), (11, 3, 1), "contig", "contig", "contig"),
    "both_rows_mirror": ((11, 3, 1), (1, 3, 37), "contig", "contig", "contig"),
    "outer": ((6, 1), (1, 9), "contig", "contig", "contig"),
    "interleaved": ((2, 1, 3, 1, 4), (1, 3, 1, 2, 4), "contig", "contig", "contig"),
    "scalar_a": ((), (4, 5), "contig", "contig", "contig"),
    "scalar_b": ((3, 4), (), "contig", "contig", "contig"),
    "scalars": ((), (), "contig", "contig", "contig"),
    "ones": ((1, 1), (1,), "contig", "contig", "contig"),
    "a_transposed": ((5, 6), (6,), "transposed", "contig", "contig"),   # generic unravel, no fast path
    "g_transposed": ((5, 6), (5, 1), "contig", "contig", "transposed"),
    "b_transposed": ((2, 3, 4), (2, 3, 4), "contig", "transposed", "contig"),  # no broadcast, strided
    "sliced": ((4, 6), (1, 6), "sliced", "sliced", "sliced"),
    "zero_out": ((0, 4), (4,), "contig", "contig", "contig"),           # numel(O) == 0
    "zero_bcast": ((3, 1), (3, 0), "contig", "contig", "contig"),       # grad_a sums over a size-0 dim
    "zero_rank": ((1,), (2, 0), "contig", "contig", "contig"),
}
# Small launch sizing: tiles of 16 float32 on 2 "SMs" x 2 programs, so every path (partials,
# stage 2 over several row steps, prefetch past a chunk's end) runs here; TINY_NP the kernel
# without prefetch, and both reductions looped over the contiguous one (which the batch kernel
# never takes: the generic tile kernel's both-broadcast paths run there).  In the batch kernel,
# TINY makes tiles of 2 batches x 4 float32, several a program; TINY_BT splits them over programs
# too (partials of the batch sum, each a running sum over tiles), without prefetch.
TINY = tk.Config(tile_bytes=64, vectors=2, inner_bytes=32, s_max=2, row_bytes=32, sms=2, occupancy=2,
                 partial_limit=1, partial_share=None, flat_bytes=32, flat_vectors=2, stage2_rows=2, stage2_bytes=64,
                 batch_tile=2, batch_bytes=16)
TINY_NP = replace(TINY, prefetch=False, loop_inner=True)
TINY_BT = replace(TINY, occupancy=4, prefetch=False)
SIZINGS = {"auto": None, "tiny": TINY, "tiny_np": TINY_NP, "tiny_bt": TINY_BT}
_BATCH = ("both", "outer", "both_rows", "both_rows_mirror")  # the patterns _batch_kernel takes
_ZERO = ("zero_out", "zero_bcast", "zero_rank")


def _case_ids() -> list[str]:
    ids = [f"{fn}|f32|{p}|auto" for p in PATTERNS if p not in _ZERO for fn in bb.FNS]
    ids += [f"{fn}|f32|{p}|tiny" for p in PATTERNS if p not in _ZERO for fn in ("mul", "pow", "maximum")]
    ids += [f"{fn}|f32|{p}|tiny_np" for p in PATTERNS if p not in _ZERO for fn in ("div", "pow", "add")]
    ids += [f"{fn}|f32|{p}|auto" for p in _ZERO for fn in ("add", "div")]
    ids += [f"{fn}|{dt}|{p}|{cfg}" for dt in ("f16", "bf16") for p in ("same", "b_rows", "both", "outer")
            for fn in ("mul", "pow", "maximum") for cfg in ("auto", "tiny")]
    ids += [f"{fn}|f64|{p}|{cfg}" for p in ("same", "b_mid", "both", "sliced") for fn in ("div", "pow")
            for cfg in ("auto", "tiny")]
    # the batch kernel: every fn with its running sums and partials, 16-bit and float64 rows
    ids += [f"{fn}|f32|{p}|{cfg}" for p in _BATCH for fn in bb.FNS for cfg in ("tiny", "tiny_bt")
            if not (cfg == "tiny" and fn in ("mul", "pow", "maximum"))]
    ids += [f"{fn}|{dt}|{p}|{cfg}" for dt in ("f16", "bf16", "f64") for p in ("both_rows", "both_rows_mirror")
            for fn in ("mul", "div", "pow", "minimum") for cfg in ("auto", "tiny", "tiny_bt")]
    return ids


CASES = _case_ids()

# ----------------------------------------------------------------------------- one case


def _to_torch(t):
    """A HostTensor as a torch view with the same strides (bfloat16 goes through its bits)."""
    base = t.base
    if base.dtype == dtypes.numpy_dtype("bf16"):
        flat = torch.from_numpy(base.view(np.uint16).copy()).view(torch.bfloat16)
    else:
        flat = torch.from_numpy(base.copy())
    return flat.as_strided(t.shape, t.strides, t.offset)


def _inputs(fn: str, dt: str, pattern: str, seed: int = 0):
    return inputs_for(fn, dt, *PATTERNS[pattern], seed=seed)


def inputs_for(fn: str, dt: str, a_shape, b_shape, la="contig", lb="contig", lg="contig", seed: int = 0):
    """(host inputs, torch views of them, NaN-filled torch outputs) of one case."""
    case = SimpleNamespace(dtype=dt, params={"fn": fn, "a": a_shape, "b": b_shape,
                                             "a_layout": la, "b_layout": lb, "g_layout": lg})
    host = bb.SPEC.generate(case, np.random.default_rng(seed))
    torch_dt = getattr(torch, dtypes.long_name(dt))
    outs = {"grad_a": torch.full(a_shape, float("nan"), dtype=torch_dt),
            "grad_b": torch.full(b_shape, float("nan"), dtype=torch_dt)}
    return host, {k: _to_torch(v) for k, v in host.items()}, outs


def _bound(fn: str, dt: str, a, b, g, ref: dict) -> dict:
    """Per element: |got - ref| may reach output rounding plus the float32 (float64) error of
    computing and summing n terms, n = the reduction length: the classic (n + c) u sum|t| bound."""
    u_out, u_acc = dtypes.unit_roundoff(dt), dtypes.unit_roundoff(dtypes.accumulate_dtype(dt))
    da, db = bb.partials(fn, a, b)
    out = {}
    for name, x, d in (("grad_a", a, da), ("grad_b", b, db)):
        n = g.size // x.size if x.size else 0
        e = (n + 8) * u_acc * sum_to_shape(np.abs(g * d), x.shape)
        out[name] = u_out * (np.abs(ref[name]) + e) + e + u_out * dtypes.tiny(dt)
    return out


def run_case(case_id: str) -> None:
    fn, dt, pattern, sizing = case_id.split("|")
    host, inputs, outs = _inputs(fn, dt, pattern)
    tk.run(inputs, outs, {"fn": fn}, SIZINGS[sizing])
    check_outputs(fn, dt, host, outs)


def check_outputs(fn: str, dt: str, host: dict, outs: dict) -> None:
    """outs (torch) against the float64 oracle of the host inputs, within the bound of `_bound`."""
    a, b, g = (host[k].float64() for k in ("a", "b", "grad_out"))
    ga, gb = bb.binary_backward_numpy(fn, a, b, g)
    ref = {"grad_a": ga, "grad_b": gb}
    bound = _bound(fn, dt, a, b, g, ref)
    for name, want in ref.items():
        got = outs[name].to(torch.float64).numpy()
        assert got.shape == want.shape, f"{name}: shape {got.shape}, expected {want.shape}"
        assert not np.isnan(got).any(), f"{name}: NaN left in the output (not fully written)"
        err = np.abs(got - want)
        worst = np.unravel_index(np.argmax(err - bound[name]), err.shape) if err.size else None
        assert (err <= bound[name]).all(), (
            f"{name}[{worst}]: got {got[worst]!r}, expected {want[worst]!r}, "
            f"error {err[worst]:.3g} over bound {bound[name][worst]:.3g}")


# ----------------------------------------------------------------------------- runner


# Other triton test modules import _interpreting_here from here: it stays, as triton_interp's.
_interpreting_here = interpreting_here


@pytest.fixture(scope="module")
def subprocess_results():
    """Results of every case from a worker that sets TRITON_INTERPRET=1 before importing triton."""
    return worker_results(__file__)


@pytest.mark.parametrize("case_id", CASES)
def test_matches_oracle(subprocess_results, case_id):
    check_result(subprocess_results, case_id, run_case)


def _worker() -> None:
    report(CASES, run_case)


# ----------------------------------------------------------------------------- in-process checks


@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_pow_special_values(dt):
    """pow's partials where the generated cases never go: negative bases (odd, even and
    non-integer exponents, so the signs of a**b and a**(b-1) and the NaNs), zeros, ones, infs,
    NaN, exponents 0 and 1, and |b| past 2**24 where every float is even.  Checked against the
    oracle's float64 formulas on the same (rounded) values: same NaNs and infs, else close."""
    if not _interpreting_here():
        pytest.skip("needs TRITON_INTERPRET=1 in this process")
    tdt = getattr(torch, dtypes.long_name(dt))
    av = [-3.0, -2.0, -1.5, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 1.5, 2.0, float("inf"), -float("inf"), float("nan")]
    bv = [-3.0, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 16777218.0, -16777218.0, 1e-10]
    a = torch.tensor([x for x in av for _ in bv], dtype=tdt)
    b = torch.tensor([y for _ in av for y in bv], dtype=tdt)
    # elementwise (the flat kernel), and b broadcast over a's rows (the tile kernel, grad_b summed)
    for a_in, b_in in ((a, b), (a.view(len(av), len(bv)), b[: len(bv)])):
        for sizing in (None, TINY, TINY_NP):
            outs = {"grad_a": torch.full_like(a_in, float("nan")), "grad_b": torch.full_like(b_in, float("nan"))}
            with np.errstate(all="ignore"):  # the interpreter's numpy meets the infs and NaNs too
                tk.run({"a": a_in, "b": b_in, "grad_out": torch.ones_like(a_in)}, outs, {"fn": "pow"}, sizing)
                da, db = bb.partials("pow", a_in.double().numpy(), np.broadcast_to(b_in.double().numpy(), a_in.shape))
                db = sum_to_shape(db, tuple(b_in.shape))
            for name, want in (("grad_a", da), ("grad_b", db)):
                got = outs[name].double().numpy()
                same = (np.isnan(got) == np.isnan(want)) & (np.isinf(got) == np.isinf(want))
                finite = np.isfinite(want) & np.isfinite(got)
                with np.errstate(invalid="ignore"):  # inf - inf where both are inf: judged by `same`
                    close = np.where(finite, np.abs(got - want) <= 1e-5 * np.abs(want) + 1e-30, got == want)
                bad = np.flatnonzero(~(same & (close | np.isnan(want))))
                assert not bad.size, (name, sizing, [(float(got.flat[i]), float(want.flat[i])) for i in bad[:6]])


def test_deterministic():
    if not _interpreting_here():
        pytest.skip("needs TRITON_INTERPRET=1 in this process (covered by the worker's cases)")
    _, inputs, outs1 = _inputs("pow", "f32", "both")
    _, _, outs2 = _inputs("pow", "f32", "both")
    tk.run(inputs, outs1, {"fn": "pow"}, TINY)
    tk.run(inputs, outs2, {"fn": "pow"}, TINY)
    for name in outs1:
        assert torch.equal(outs1[name], outs2[name]), f"{name} differs between two identical runs"


def test_registered_impl_runs():
    if not _interpreting_here():
        pytest.skip("needs TRITON_INTERPRET=1 in this process")
    impl = tk.triton_backend.impls[("binary_backward", "default")]
    assert impl.dtypes == ("f32", "f16", "bf16", "f64") and impl.deterministic
    _, inputs, outs = _inputs("div", "f32", "b_rows")
    impl.fn(inputs, outs, {"fn": "div"})
    assert not any(torch.isnan(o).any() for o in outs.values())


def test_check_reports_interpreter_state():
    reason = tk.check("cpu")
    if _interpreting_here():
        assert reason is None
    else:
        assert reason and "TRITON_INTERPRET=1" in reason
    assert "unknown device" in tk.check("tpu")


def _good():
    a, b = torch.ones(2, 3), torch.ones(3)
    return ({"a": a, "b": b, "grad_out": torch.ones(2, 3)},
            {"grad_a": torch.empty(2, 3), "grad_b": torch.empty(3)}, {"fn": "mul"})


@pytest.mark.parametrize("mutate, error, words", [
    (lambda i, o, p: p.update(fn="atan2"), ValueError, ["params['fn']", "one of add", "'atan2'"]),
    (lambda i, o, p: p.pop("fn"), ValueError, ["params['fn']", "None"]),
    (lambda i, o, p: i.update(a=np.ones((2, 3), np.float32)), TypeError, ["a:", "torch.Tensor", "ndarray"]),
    (lambda i, o, p: o.pop("grad_b"), TypeError, ["grad_b", "NoneType"]),
    (lambda i, o, p: i.update(b=torch.ones(3, dtype=torch.float64)), TypeError, ["b.dtype", "torch.float64"]),
    (lambda i, o, p: i.update(a=torch.ones(2, 3, dtype=torch.int32)), TypeError, ["a.dtype", "int32"]),
    (lambda i, o, p: i.update(grad_out=torch.ones(3, 2)), ValueError, ["grad_out.shape", "(2, 3)", "(3, 2)"]),
    (lambda i, o, p: i.update(b=torch.ones(4)), ValueError, ["shapes of a and b", "(2, 3) and (4,)"]),
    (lambda i, o, p: o.update(grad_a=torch.empty(3, 2)), ValueError, ["grad_a.shape", "(2, 3)", "(3, 2)"]),
    (lambda i, o, p: o.update(grad_a=torch.empty(3, 2).t()), ValueError, ["grad_a", "contiguous"]),
    (lambda i, o, p: o.update(grad_b=torch.empty(3, dtype=torch.float16)), TypeError, ["grad_b.dtype"]),
], ids=["fn", "no_fn", "not_tensor", "missing_out", "dtype_mismatch", "int_dtype", "grad_out_shape",
        "no_broadcast", "out_shape", "out_strided", "out_dtype"])
def test_bad_arguments(mutate, error, words):
    inputs, outs, params = _good()
    mutate(inputs, outs, params)
    with pytest.raises(error) as info:
        tk.binary_backward(inputs, outs, params)
    msg = str(info.value)
    assert msg.startswith("triton binary_backward: "), msg
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    _worker()
