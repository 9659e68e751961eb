"""The `triton` backend's reduce_sum (backends/triton/reduce_sum.py) under the Triton
interpreter (TRITON_INTERPRET=1), and its planner on the perf and stress shapes.

Every pattern runs with the backend's own interpreter sizing and with TINY sizing in both
finishes, which splits even these shapes into many blocks, chunks and partials, so the
two-stage paths run: the last program of a tile adding the partials (finishes "rows" and
"last") and _stage2_kernel (finish "kernel").  Results are checked against the float64 oracle on the
exact rounded inputs with the classic (n + c) u sum|x| bound of a float32 sum.

TRITON_INTERPRET must be set before triton is imported.  The test session sets it on
GPU-less machines; where it was not (a GPU machine), the cases run in one worker
subprocess that sets it, and each test reads its result.
"""
from __future__ import annotations

import sys
from dataclasses import replace
from math import prod
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/: the shared interpreter helper

from triton_interp import check_result, interpreting_here, needs_interpreter, report, worker_results  # noqa: E402
from backends.triton import reduce_sum as rs  # noqa: E402
from harness import dtypes  # noqa: E402
from oracle import reduce_sum as spec  # noqa: E402

# label: (shape, params, x layout) and the kernel the planner must pick for it
PATTERNS = {
    "rows": ((6, 40), {"axes": [1]}, "contig"),                       # row sums
    "rows_keepdim": ((6, 40), {"axes": [-1], "keepdim": True}, "contig"),
    "full": ((300,), {"axes": None}, "contig"),                       # one row: the full reduction
    "full_3d": ((5, 6, 7), {"axes": None, "keepdim": True}, "contig"),
    "cols": ((40, 6), {"axes": [0]}, "contig"),                       # column sums
    "mid": ((4, 9, 5), {"axes": [1]}, "contig"),                      # col: kept outer dim + fast dim
    "outer_inner": ((4, 9, 5), {"axes": [0, 2]}, "contig"),           # row with an outer reduced dim
    "bias": ((3, 8, 12), {"target": [12]}, "contig"),                 # sum_to forms
    "per_seq": ((3, 8, 12), {"target": [3, 1, 12]}, "contig"),
    "per_token": ((3, 8, 12), {"target": [3, 8, 1]}, "contig"),
    "lead": ((3, 8, 12), {"target": [8, 12]}, "contig"),
    "full_target": ((3, 8, 12), {"target": []}, "contig"),
    "t_bias": ((3, 10, 12), {"target": [12]}, "transposed"),          # summed dim contiguous: row
    "t_cols": ((33, 20), {"axes": [0]}, "transposed"),
    "t_keep": ((4, 6, 5), {"axes": [0]}, "transposed"),               # fast kept dim with y stride != 1
    "s_rows": ((7, 20), {"axes": [1]}, "sliced"),                     # fast dim of stride 2
    "s_cols": ((20, 7), {"axes": [0]}, "sliced"),
    "s_full": ((4, 33, 9), {"axes": None}, "sliced"),
    "p_full": ((6, 40), {"axes": None}, "padded"),                   # rows 43 apart: row with NK = 0, NRO = 1
    "p_cols": ((40, 6), {"axes": [0]}, "padded"),
    "interleaved_row": ((2, 3, 4, 5, 6), {"axes": [0, 2, 4]}, "contig"),  # NK = 2, NRO = 2
    "interleaved_col": ((2, 3, 4, 5, 6), {"axes": [1, 3]}, "contig"),     # NKO = 2, NR = 2
    "none": ((3, 4, 5), {"axes": []}, "contig"),                      # nothing summed: y = x
    "ones": ((1, 5, 1), {"axes": [0, 2]}, "contig"),                  # size-1 dims only
    "scalar": ((), {"axes": None}, "contig"),
    "odd_rows": ((7, 13), {"axes": [1]}, "contig"),
    "odd_cols": ((13, 7), {"axes": [0]}, "contig"),
    "long_rows": ((3, 1000), {"axes": [1]}, "contig"),
    "long_cols": ((1000, 3), {"axes": [0]}, "contig"),
    "empty_sum": ((0, 5), {"axes": [0]}, "contig"),                   # a sum over nothing: 0
    "empty_keepdim": ((0, 5), {"axes": None, "keepdim": True}, "contig"),
    "empty_target": ((2, 0, 3), {"target": [1, 3]}, "contig"),
    "empty_out": ((3, 0), {"axes": [0]}, "contig"),                   # nothing to write
}
KERNEL = {"rows": "row", "rows_keepdim": "row", "full": "row", "full_3d": "row", "cols": "col", "mid": "col",
          "outer_inner": "row", "bias": "col", "per_seq": "col", "per_token": "row", "lead": "col",
          "full_target": "row", "t_bias": "row", "t_cols": "row", "t_keep": "col", "s_rows": "row",
          "s_cols": "col", "s_full": "row", "p_full": "row", "p_cols": "col", "interleaved_row": "row", "interleaved_col": "col", "none": "col",
          "ones": "col", "scalar": "col", "odd_rows": "row", "odd_cols": "col", "long_rows": "row",
          "long_cols": "col", "empty_sum": "col", "empty_keepdim": "col", "empty_target": "col", "empty_out": ""}
# Tiles of 16 float32, 8 "SMs" x 4 programs: even these shapes split into chunks and partials;
# reductions of up to 4 run one row a step (BR = 1), and the next block is read ahead (prefetch);
# "plain": blocks read 4 a step (unroll), tall tiles for all; "stages": 2 a step, software-pipelined;
# "rows": the last program adds the partials row by row (finish "rows"), several rows a step;
# "tiles": as "rows", the col kernel's programs storing their [BR, BN] sums as BR rows.
TINY = rs.Config(tile_bytes=64, seg_bytes=16, short_red=4, vectors=1, sms=8, occupancy=4, query_occupancy=False,
                 partial_limit=1, finish="last", finish_bytes=32, stage2_bytes=64, prefetch=True)
CONFIGS = {"auto": None, "last": TINY, "kernel": replace(TINY, finish="kernel"),
           "plain": replace(TINY, prefetch=False, unroll=4, short_red=0),
           "stages": replace(TINY, prefetch=False, unroll=2, stages=3),
           "rows": replace(TINY, finish="rows", rows_min_width=1),
           "tiles": replace(TINY, finish="tiles", rows_min_width=1, prefetch=False, short_red=0)}
_EMPTY = ("empty_sum", "empty_keepdim", "empty_target", "empty_out", "scalar")


def _case_ids() -> list[str]:
    ids = [f"f32|{p}|{c}" for p in PATTERNS for c in CONFIGS if p not in _EMPTY or c == "auto"]
    ids += [f"{dt}|{p}|{c}" for dt in ("f16", "bf16", "f64") for p in ("rows", "full", "cols", "per_seq", "t_bias")
            for c in CONFIGS]
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


def _params(shape, params, layout) -> dict:
    out = dict(params, shape=list(shape))
    if layout not in ("contig", "padded"):
        out["x_layout"] = layout
    return out


def _padded(x):
    """x as a view whose rows sit 3 elements further apart than their length (NaN between)."""
    wide = torch.full(x.shape[:-1] + (x.shape[-1] + 3,), float("nan"), dtype=x.dtype)
    wide[..., : x.shape[-1]] = x
    return wide[..., : x.shape[-1]]


def _request(dt: str, shape, params, layout, seed: int = 0):
    """(host inputs, torch inputs, NaN outputs, params) of one request."""
    params = _params(shape, params, layout)
    case = SimpleNamespace(dtype=dt, params=params)
    host = spec.SPEC.generate(case, np.random.default_rng(seed))
    y_shape = spec.out_shape(params["shape"], params)
    y = torch.full(y_shape, float("nan"), dtype=getattr(torch, dtypes.long_name(dt)))
    x = _to_torch(host["x"])
    if layout == "padded":
        x = _padded(x)
    return host, {"x": x}, {"y": y}, {k: v for k, v in params.items() if k != "x_layout"}


def _inputs(dt: str, pattern: str, seed: int = 0):
    return _request(dt, *PATTERNS[pattern], seed=seed)


def _bound(dt: str, x: np.ndarray, ref: np.ndarray, params: dict) -> np.ndarray:
    """|got - ref| may reach the output rounding plus the float32 (float64) error of adding
    n terms, n the reduction length: u_out |ref| + (n + 8) u_acc sum|x| (+ a subnormal)."""
    u_out, u_acc = dtypes.unit_roundoff(dt), dtypes.unit_roundoff(dtypes.accumulate_dtype(dt))
    n = prod(x.shape[a] for a in spec.reduced_axes(x.shape, params))
    e = (n + 8) * u_acc * spec.reduce_sum_numpy(np.abs(x), params)
    return u_out * (np.abs(ref) + e) + e + u_out * dtypes.tiny(dt)


def run_case(case_id: str) -> None:
    dt, pattern, sizing = case_id.split("|")
    _check(dt, _inputs(dt, pattern), CONFIGS[sizing])


def _check(dt: str, request, cfg) -> None:
    host, inputs, outs, params = request
    rs.run(inputs, outs, params, cfg)
    x = host["x"].float64()
    want = spec.reduce_sum_numpy(x, params)
    got = outs["y"].to(torch.float64).numpy()
    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
    assert not np.isnan(got).any(), "NaN left in the output (not fully written)"
    bound = _bound(dt, x, want, params)
    err = np.abs(got - want)
    if err.size:
        worst = np.unravel_index(np.argmax(err - bound), err.shape)
        assert (err <= bound).all(), (f"y[{worst}]: got {got[worst]!r}, expected {want[worst]!r}, "
                                      f"error {err[worst]:.3g} over bound {bound[worst]:.3g}")


def random_requests(n: int, seed: int = 5) -> list:
    """n random requests: rank 0-4, sizes 0-9 (0 rarely), either form, every layout, dtype, sizing."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        rank = int(rng.integers(0, 5))
        shape = tuple(int(v) if rng.random() > 0.04 else 0 for v in rng.integers(1, 10, rank))
        layouts = ["contig"] + (["sliced", "padded"] if rank >= 1 else []) + (["transposed"] if rank >= 2 else [])
        layout = layouts[int(rng.integers(0, len(layouts)))]
        if rng.random() < 0.3:  # target form: drop some leading dims, keep or 1 the rest
            lead = int(rng.integers(0, rank + 1))
            params = {"target": [n if rng.random() < 0.5 else 1 for n in shape[lead:]]}
        else:
            pick = rng.random()
            axes = None if pick < 0.15 else [] if pick < 0.2 else \
                [int(a) - rank * int(rng.integers(0, 2)) for a in range(rank) if rng.random() < 0.5]
            params = {"axes": axes, "keepdim": bool(rng.random() < 0.3)}
        dt = ("f32", "f32", "bf16", "f16", "f64")[k % 5]
        out.append((dt, shape, params, layout, ("auto", "last", "kernel", "plain", "stages", "rows", "tiles")[k % 7]))
    return out


# ----------------------------------------------------------------------------- runner


_interpreting_here = interpreting_here
_needs_interpreter = needs_interpreter


@pytest.fixture(scope="module")
def subprocess_results():
    """Results of every case from a worker that sets TRITON_INTERPRET=1 before importing triton."""
    return worker_results(__file__)


@pytest.mark.parametrize("case_id", CASES)
def test_matches_oracle(subprocess_results, case_id):
    check_result(subprocess_results, case_id, run_case)


def _worker() -> None:
    report(CASES, run_case)


# ----------------------------------------------------------------------------- which path runs


def _plan(pattern: str, cfg, dt: str = "f32"):
    shape, params, layout = PATTERNS[pattern]
    host, inputs, outs, p = _inputs(dt, pattern)
    x = inputs["x"]
    return rs.plan_request(x.shape, x.stride(), x.element_size(), p, cfg or rs.INTERPRETER_CONFIG,
                           (cfg or rs.INTERPRETER_CONFIG).sms)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_kernel_choice(pattern):
    L = _plan(pattern, None)
    assert L.kernel == KERNEL[pattern]
    if L.kernel:
        assert L.chunks == 1 and L.constexprs["FINISH"] == 0, "the interpreter sizing never splits"


def test_every_path_is_forced():
    """Each kernel path the GPU takes on big shapes runs at tiny sizes under TINY."""
    seen = set()
    for pattern in PATTERNS:
        for name, cfg in CONFIGS.items():
            L = _plan(pattern, cfg)
            if not L.kernel:
                continue
            c = L.constexprs
            seen.add((L.kernel, "split" if L.chunks > 1 else "direct", c["FINISH"]))
            seen.add((L.kernel, "prefetch", c["PREFETCH"]))
            seen.add((L.kernel, "stages", c["STAGES"] > 1))
            if L.kernel == "row":
                seen.add(("row", "unit" if c["UNIT"] else "strided", c["NK"] > 0, c["NRO"] > 0))
            else:
                seen.add(("col", "unit" if c["UNIT_X"] else "strided", "y unit" if c["UNIT_Y"] else "y strided"))
                seen.add(("col", "NKO", c["NKO"], "NR", c["NR"]))
                seen.add(("col", "BR", c["BR"] == 1))
            if L.chunks > 1:
                assert (L.stage2 is not None) == (name == "kernel")
                tiles = 4 if L.kernel == "col" and c["BR"] > 1 else 3
                assert c["FINISH"] == {"kernel": 1, "rows": 3, "tiles": tiles}.get(name, 2)
    for needed in [("row", "direct", 0), ("row", "split", 2), ("row", "split", 1), ("col", "direct", 0),
                   ("col", "split", 2), ("col", "split", 1), ("row", "split", 3), ("col", "split", 3), ("col", "split", 4), ("row", "strided", True, False),
                   ("row", "unit", False, False), ("row", "unit", True, True), ("row", "unit", False, True),
                   ("col", "strided", "y unit"), ("col", "unit", "y strided"), ("col", "NKO", 0, "NR", 0),
                   ("col", "NKO", 2, "NR", 2), ("col", "NKO", 1, "NR", 1), ("row", "prefetch", True),
                   ("row", "prefetch", False), ("col", "prefetch", True), ("col", "prefetch", False),
                   ("col", "BR", True), ("col", "BR", False), ("row", "stages", True), ("col", "stages", True)]:
        assert needed in seen, f"no pattern takes path {needed}"


def test_random_requests():
    """Random shapes, axes, targets and layouts through every sizing."""
    _needs_interpreter()
    for k, (dt, shape, params, layout, sizing) in enumerate(random_requests(90)):
        try:
            _check(dt, _request(dt, shape, params, layout, seed=k), CONFIGS[sizing])
        except Exception as exc:
            raise AssertionError(f"request {k}: {dt} {shape} {params} {layout} {sizing}: {exc}") from exc


def test_programs_per_sm():
    assert rs.programs_per_sm(64, 4096, 8) == 4   # 64 registers x 256 threads: a quarter of 64 K
    assert rs.programs_per_sm(40, 32, 8) == 6     # 40 -> 48 allocated: 65536 // (48 * 256)
    assert rs.programs_per_sm(16, 0, 8) == 8      # threads bound: 2048 // 256
    assert rs.programs_per_sm(32, 100_000, 4) == 2  # shared memory bound
    assert rs.programs_per_sm(255, 0, 8) == 1


def test_collapse_merges_contiguous_dims():
    lay = rs.collapse((8, 2048, 4096), (2048 * 4096, 4096, 1), (0, 1))
    assert lay.kept == ((4096, 1),) and lay.red == ((8 * 2048, 4096),) and lay.n_y == 4096
    lay = rs.collapse((8, 2048, 4096), (2048 * 4096, 1, 2048), (0, 1))  # transposed: the summed dim is contiguous
    assert lay.kept == ((4096, 2048),) and lay.red == ((8, 2048 * 4096), (2048, 1))
    lay = rs.collapse((2, 1, 3, 4), (12, 12, 4, 1), (1, 3))  # size-1 dims dropped, kept (2, 3) merged
    assert lay.kept == ((6, 4),) and lay.kept_ys == (1,) and lay.red == ((4, 1),)
    lay = rs.collapse((5, 0, 3), (0, 3, 1), (1,))
    assert lay.n_red == 0 and lay.red == () and lay.n_y == 15


# ----------------------------------------------------------------------------- in-process checks


def test_plan_cache_hit(monkeypatch):
    """A second call with the same (shape, strides, dtype, params, device) does no planning."""
    _needs_interpreter()
    host, inputs, outs, params = _inputs("f32", "per_seq")
    rs._PLANS.clear()
    rs.run(inputs, outs, params, TINY)
    assert rs.plan_cache_size() == 1

    def no_planning(*a, **k):
        raise AssertionError("planned again on a repeated request")

    monkeypatch.setattr(rs, "plan", no_planning)
    monkeypatch.setattr(rs, "collapse", no_planning)
    _, inputs2, outs2, _ = _inputs("f32", "per_seq", seed=1)  # new buffers, same request
    rs.run(inputs2, outs2, params, TINY)
    assert rs.plan_cache_size() == 1 and not torch.isnan(outs2["y"]).any()
    with pytest.raises(AssertionError, match="planned again"):  # another form is another plan
        rs.run(inputs2, {"y": torch.empty(3, 8, 1)}, {"shape": [3, 8, 12], "target": [3, 8, 1]}, TINY)


@pytest.mark.parametrize("sizing", ["last", "kernel", "rows", "tiles"])
def test_deterministic(sizing):
    _needs_interpreter()
    _, inputs, outs1, params = _inputs("f32", "cols")
    _, _, outs2, _ = _inputs("f32", "cols")
    rs.run(inputs, outs1, params, CONFIGS[sizing])
    rs.run(inputs, outs2, params, CONFIGS[sizing])
    assert torch.equal(outs1["y"], outs2["y"]), "y differs between two identical runs"


def test_counters_left_zero():
    """finish="last" (and "rows") takes one ticket per program and the last one resets its tile's counter."""
    _needs_interpreter()
    for pattern in ("full", "cols", "per_seq"):
        for cfg in (TINY, CONFIGS["rows"], CONFIGS["tiles"]):
            _, inputs, outs, params = _inputs("f32", pattern)
            L = rs._prepare(inputs["x"], outs["y"], params, cfg).L
            assert L.chunks > 1 and L.stage2 is None, pattern
            rs.run(inputs, outs, params, cfg)
            assert not rs._counters(inputs["x"].device, 1).any(), f"{pattern}: a tile counter was left non-zero"


def test_registered_impl():
    impl = rs.triton_backend.impls[("reduce_sum", "default")]
    assert impl.dtypes == ("f32", "f16", "bf16", "f64") and impl.deterministic
    assert impl.fn.unchecked is rs._run  # the timed path: no argument checks
    if _interpreting_here():
        _, inputs, outs, params = _inputs("bf16", "per_seq")
        impl.fn(inputs, outs, params)
        assert not torch.isnan(outs["y"]).any()


def _good():
    return {"x": torch.ones(2, 3, 4)}, {"y": torch.empty(3)}, {"shape": [2, 3, 4], "axes": [0, 2]}


@pytest.mark.parametrize("mutate, error, words", [
    (lambda i, o, p: o.update(y=torch.empty(6)[::2]), ValueError, ["y", "contiguous", "strides (2,)"]),
    (lambda i, o, p: o.update(y=i["x"].view(-1)[:3]), ValueError, ["y", "buffer of its own", "shared with x"]),
    (lambda i, o, p: o.update(y=torch.empty(4)), ValueError, ["'y'", "(4,)", "(3,)"]),
    (lambda i, o, p: p.update(axes=[0, 3]), ValueError, ["axes", "[0, 3]", "[-3, 3)"]),
    (lambda i, o, p: i.update(x=torch.ones(2, 3, 4, dtype=torch.int32)), TypeError, ["x", "int32"]),
    (lambda i, o, p: o.update(y=torch.empty(3, dtype=torch.float64)), TypeError, ["y", "float64", "float32"]),
], ids=["y_strided", "y_aliases_x", "y_shape", "axes", "int_dtype", "y_dtype"])
def test_bad_arguments(mutate, error, words):
    inputs, outs, params = _good()
    mutate(inputs, outs, params)
    with pytest.raises(error) as info:
        rs.reduce_sum(inputs, outs, params)
    msg = str(info.value)
    assert msg.startswith("triton reduce_sum: "), msg
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"


def test_preset_env(monkeypatch):
    monkeypatch.setenv(rs.PRESET_ENV, "unroll8")
    assert rs._preset() == rs.PRESETS["unroll8"]
    monkeypatch.setenv(rs.PRESET_ENV, "turbo")
    with pytest.raises(ValueError, match=r"GRADORACLE_TRITON_REDUCE: expected one of default, .*got 'turbo'"):
        rs._preset()


def test_variants_register_and_run(monkeypatch):
    """$GRADORACLE_TRITON_REDUCE_VARIANTS registers triton@<preset>, checked (argcheck) and unchecked."""
    monkeypatch.setattr(rs.triton_backend, "impls", dict(rs.triton_backend.impls))
    monkeypatch.setenv(rs.VARIANTS_ENV, "prefetch,before")
    rs._register_variants()
    for name in ("prefetch", "before"):
        impl = rs.triton_backend.impls[("reduce_sum", name)]
        assert impl.id == f"triton@{name}" and impl.deterministic
        with pytest.raises(ValueError, match="'y'"):  # the op's argument checks run first
            impl.fn({"x": torch.ones(2, 3, 4)}, {"y": torch.empty(4)}, {"shape": [2, 3, 4], "axes": [0, 2]})
        if _interpreting_here():
            for call in (impl.fn, impl.fn.unchecked):
                host, inputs, outs, params = _inputs("f32", "per_seq")
                call(inputs, outs, params)
                want = spec.reduce_sum_numpy(host["x"].float64(), params)
                assert np.allclose(outs["y"].double().numpy(), want, rtol=1e-5, atol=1e-5)
    monkeypatch.setenv(rs.VARIANTS_ENV, "bogus")
    with pytest.raises(ValueError, match="GRADORACLE_TRITON_REDUCE_VARIANTS: expected names from"):
        rs._register_variants()


# ----------------------------------------------------------------------------- the planner on GPU shapes


def _perf_plans(finish: str = "rows"):
    from cases import select

    cfg = replace(rs.GPU_CONFIG, finish=finish)
    out = {}
    for case in select("perf", op="reduce_sum"):
        shape = case.params["shape"]
        strides = [prod(shape[i + 1:]) for i in range(len(shape))]
        if case.params.get("x_layout") == "transposed":
            strides[-1], strides[-2] = shape[-2], 1  # the last two dims swapped in memory
        params = {k: v for k, v in case.params.items() if k in ("axes", "keepdim", "target")}
        out[case.id] = rs.plan_request(shape, strides, 2 if case.dtype in ("bf16", "f16") else 4, params, cfg, 132)
    return out


def test_perf_case_plans():
    """The hard shapes take the planned paths: split column sums and full reductions, direct
    row sums, the transposed bias gradient as row sums; grids about one wave or many."""
    plans = _perf_plans()
    assert len(plans) == 20
    for cid, L in plans.items():
        assert L.kernel in ("row", "col"), cid
        if "axes=all" in cid:
            assert L.kernel == "row" and L.chunks > 100 and L.grid <= 132 * rs.GPU_CONFIG.occupancy, cid
        elif "T=4096" in cid and "transposed" not in cid or "axes=(0,1)" in cid or "16384x4096,axes=(0)" in cid:
            assert L.kernel == "col" and L.chunks > 1 and L.grid <= 132 * rs.GPU_CONFIG.occupancy, cid
        elif "T=8x1x4096" in cid:
            assert L.kernel == "col" and L.chunks > 1, cid
        elif "T=8x2048x1" in cid or "axes=(-1)" in cid or "axes=(1)" in cid:
            assert L.kernel == "row" and L.chunks == 1 and L.grid >= 8192, cid
        elif "T=1x2048x4096" in cid:  # 8 terms an output: one contiguous row segment a step, in lanes
            assert L.kernel == "col" and L.chunks == 1 and L.constexprs["BR"] == 1 and L.grid >= 1024, cid
        elif "transposed" in cid:
            assert L.kernel == "row" and L.chunks == 1 and L.constexprs["UNIT"] and L.constexprs["NRO"] == 1, cid
        else:
            raise AssertionError(f"no expectation for {cid}")
        c = L.constexprs
        tile = (c["BM"] * c["BC"]) if L.kernel == "row" else (c["BR"] * c["BN"])
        item = 2 if ("bf16" in cid or "f16" in cid) else 4
        assert tile * item == rs.GPU_CONFIG.tile_bytes and L.num_warps == 8, cid  # 4 KiB blocks, 16-byte loads
        if L.kernel == "row" and L.chunks == 1:  # short rows: narrower blocks, so a step reads `unroll` whole ones
            assert L.ints["nblk"] >= rs.GPU_CONFIG.unroll, cid
        assert L.chunks == 1 or L.chunks * L.n_y * 4 <= 1 << 20, f"{cid}: partials over 1 MiB"
        if L.chunks > 1:  # finish "rows" where a tile is wide (the column sums), "last" for the full sums
            assert c["FINISH"] == (3 if L.kernel == "col" else 2), cid
            if L.kernel == "col":  # a step's loads all in flight: 32 values a thread at most
                assert c["BP"] * max(1, c["BN"] // (32 * L.num_warps)) <= 32 and c["BP"] >= min(L.chunks, 32), cid


def test_stress_shapes_plan():
    """Over 2**31 elements: grids fit, the workspace stays small."""
    from cases import select

    for case in select("stress", op="reduce_sum"):
        shape = case.params["shape"]
        strides = [prod(shape[i + 1:]) for i in range(len(shape))]
        params = {k: v for k, v in case.params.items() if k in ("axes", "keepdim", "target")}
        for finish in ("rows", "last", "kernel"):
            L = rs.plan_request(shape, strides, 2, params, replace(rs.GPU_CONFIG, finish=finish), 132)
            assert 1 <= L.grid < 2**31, case.id
            assert L.chunks * L.n_y * 4 < 64 << 20, case.id


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    _worker()
