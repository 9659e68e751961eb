"""The `triton` layernorm_backward and rmsnorm_backward: interpreter runs and sm_90 compiles.

Interpreter (TRITON_INTERPRET=1): small shapes against the float64 numpy oracle under the
harness's own tolerance model (harness/compare.py), with the backend's sizing and with tiny
sizings (`_norm.Config`) that force each code path at small sizes: the split path for wide
rows (column chunks, partial row sums), several rows per tile (small N), many programs
with a partial workspace and the stage-2 sum, one program writing the outputs itself;
plus M = 1, N = 1, rank-1 x, no rows, transposed and sliced views (the row-offset table),
strided saved statistics.  In-process checks: the plan cache (a repeated call plans
nothing), bitwise repeatability, the registration, the kernel's own argument errors.

TRITON_INTERPRET must be set before triton is imported.  Where the test session did not
set it (a GPU machine), the oracle cases run in one worker subprocess that sets it.

sm_90 (no GPU needed): every kernel compiles for cuda:90 with the launch parameters the
planner picks for each perf case (and for the split and offset-table paths), in worker
subprocesses without TRITON_INTERPRET.  Each must give a cubin, int64 pointer offsets, 16-byte
loads on the perf cases, and (ptxas -v, where triton ships ptxas) no register spills.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/: the shared interpreter helper

import triton_sm90 as sm90  # noqa: E402
from triton_interp import check_result, interpreting_here, report, worker_results  # noqa: E402
from backends.triton import _norm  # noqa: E402
from harness import dtypes  # noqa: E402
from harness.compare import compare  # noqa: E402
from harness.registry import get_op  # noqa: E402

LN, RMS = _norm.LAYERNORM, _norm.RMSNORM
SHORT = {LN: "ln", RMS: "rms"}
# Tiny sizings (interpreter): each forces one path at small sizes.
SIZINGS = {
    "auto": None,
    # rows wider than 16 elements are cut into chunks of 8 columns; many row blocks
    "split": _norm.Config(sms=3, max_block=16, chunk=8, tile_elems=8, warps_per_sm=16, ws_ratio=0, stages=1,
                          pdl=False),
    # the split path with one row block: the outputs written by the main kernel
    "split1": _norm.Config(sms=1, max_block=16, chunk=8, tile_elems=8, warps_per_sm=1, ws_ratio=0, stages=1, pdl=False),
    # several rows per tile (BM > 1) and many programs, each with a partial row
    "rows": _norm.Config(sms=4, tile_elems=64, warps_per_sm=16, ws_ratio=0, stages=2, pdl=False),
    # one program for everything: no workspace, no stage 2
    "one": _norm.Config(sms=1, warps_per_sm=1, tile_elems=16, ws_ratio=0, stages=1, pdl=False),
    # the partial rows added by a second kernel (finish "kernel"), rows and split paths
    "rows_k": _norm.Config(sms=4, tile_elems=64, warps_per_sm=16, ws_ratio=0, stages=2, pdl=False, finish="kernel",
                           stage2_cols=16, stage2_rows=2),
    "split_k": _norm.Config(sms=3, max_block=16, chunk=8, tile_elems=8, warps_per_sm=16, ws_ratio=0, stages=1,
                            pdl=False, finish="kernel"),
    # finish "last" with narrow finisher tiles: several column tiles and partial-row steps
    "last_narrow": _norm.Config(sms=5, tile_elems=32, warps_per_sm=16, ws_ratio=0, stages=1, fin_thread_elems=1,
                                fin_rows=2),
}
# Config.ws_cache: the workspace kept between calls (shared by every case of the worker, grown as needed)
SIZINGS["rows_k_kept"] = replace(SIZINGS["rows_k"], ws_cache=True)
SIZINGS["split_kept"] = replace(SIZINGS["split"], ws_cache=True)

# id: (op, dtype, shape, params, sizing); params may hold x_layout, dy_layout, stats_layout
CASES = {}


def _add(op, dtype, shape, sizing, **params):
    flags = "".join(f",{k}={v}" for k, v in params.items())
    CASES[f"{SHORT[op]}|{dtype}|{'x'.join(map(str, shape))}{flags}|{sizing}"] = (op, dtype, tuple(shape), params, sizing)


for _op in (LN, RMS):
    for _sz in SIZINGS:
        _add(_op, "f32", (11, 37), _sz)                    # N = 37: 5 chunks of 8 on the split path
        _add(_op, "bf16", (3, 4, 21), _sz)
    _add(_op, "f32", (1, 1), "auto")                       # M = 1, N = 1
    _add(_op, "f32", (9, 1), "rows")                       # N = 1, several rows per tile
    _add(_op, "f32", (6,), "auto")                         # rank 1: 0-d statistics
    _add(_op, "f32", (1, 40), "split")                     # M = 1 on the split path
    _add(_op, "f32", (1, 24), "rows")
    _add(_op, "f64", (7, 19), "split")
    _add(_op, "f64", (7, 19), "rows")
    _add(_op, "f16", (19, 5), "rows")                      # 19 rows, 8 per tile: a partial last tile
    _add(_op, "bf16", (33, 64), "auto")
    _add(_op, "f32", (4, 5, 6), "rows", x_layout="transposed")  # rows do not merge: offset table
    _add(_op, "f32", (4, 5, 20), "split", x_layout="transposed", dy_layout="sliced")
    _add(_op, "f32", (5, 12), "rows", dy_layout="transposed", stats_layout="sliced")
    _add(_op, "bf16", (6, 18), "split", x_layout="sliced", stats_layout="sliced")
    _add(_op, "f32", (0, 8), "auto")                       # no rows: dweight (dbias) = 0
    _add(_op, "f32", (2, 0, 3), "rows")
for _sz in ("auto", "split", "rows", "one"):
    _add(LN, "f32", (10, 20), _sz, affine=False)
    _add(LN, "f32", (10, 20), _sz, bias=False)
    _add(LN, "bf16", (10, 20), _sz, affine=False, bias=False)
_add(LN, "f32", (4, 1), "rows", affine=False)              # N = 1: dx = 0, dbias = sum dy

# ----------------------------------------------------------------------------- one case


def _to_torch(t):
    """A HostTensor as a torch view with the same strides (bfloat16 through its bits)."""
    base = t.base
    if base.dtype == dtypes.numpy_dtype("bf16"):
        flat = torch.from_numpy(base.view(np.uint16).copy()).view(torch.bfloat16)
    else:
        flat = torch.from_numpy(base.copy())
    return flat.as_strided(t.shape, t.strides, t.offset)


def _strided_stats(x):
    """x's values in a view whose elements sit 3 apart (a sliced layout of any rank)."""
    wide = torch.full((max(x.numel(), 1) * 3,), float("nan"), dtype=x.dtype)
    view = wide[: x.numel() * 3: 3][: x.numel()].view(x.shape) if x.dim() else wide[:1].view(())
    view.copy_(x)
    return view


def _make(op, dtype, shape, params, seed=0):
    spec = get_op(op)
    case_params = {"shape": list(shape), **{k: v for k, v in params.items() if k != "stats_layout"}}
    case = SimpleNamespace(op=op, dtype=dtype, params=case_params)
    host = spec.generate(case, np.random.default_rng(seed))
    inputs = {k: _to_torch(v) for k, v in host.items()}
    if params.get("stats_layout") == "sliced":
        for k in ("mean", "rstd"):
            if k in inputs:
                inputs[k] = _strided_stats(inputs[k])
    torch_dt = getattr(torch, dtypes.long_name(dtype))
    shapes = spec.shapes(case)
    outs = {k: torch.full(shapes[k], float("nan"), dtype=torch_dt) for k in spec.outputs_of(case)}
    return spec, case_params, host, inputs, outs


def run_case(case_id: str) -> None:
    op, dtype, shape, params, sizing = CASES[case_id]
    spec, case_params, host, inputs, outs = _make(op, dtype, shape, params)
    _norm.run(op, inputs, outs, case_params, SIZINGS[sizing])
    inputs64 = {k: v.float64() for k, v in host.items()}
    ref = spec.numpy_oracle(inputs64, case_params)
    scale = spec.error_scale(inputs64, case_params)
    assert set(outs) == set(ref), f"outputs {sorted(outs)}, the oracle has {sorted(ref)}"
    for name, want in ref.items():
        got = outs[name].to(torch.float64).numpy()
        s, n = scale[name]
        report = compare(name, got, want, s, n, dtype)
        assert report.passed, report.line() + (f" {report.message}" if report.message else "")


# ----------------------------------------------------------------------------- runner


_interpreting_here = interpreting_here


@pytest.fixture(scope="module")
def subprocess_results():
    """Results of every case from a worker that sets TRITON_INTERPRET=1 before importing triton."""
    return worker_results(__file__, "--interpret")


@pytest.mark.parametrize("case_id", list(CASES))
def test_matches_oracle(subprocess_results, case_id):
    check_result(subprocess_results, case_id, run_case)


def _interpret_worker() -> None:
    report(CASES, run_case)


def _plan_of(op, shape, dtype="f32", sizing=None, **params):
    spec, case_params, _, inputs, outs = _make(op, dtype, shape, params)
    names = ("x", "dy", "weight", "mean", "rstd", "dx", "dweight", "dbias")
    t = {**dict.fromkeys(names), **inputs, **outs}
    return _norm.make_plan(op, t, SIZINGS[sizing] if sizing else _norm.INTERPRETER_CONFIG)


@pytest.mark.parametrize("sizing, shape, params, expect", [
    ("split", (11, 37), {}, dict(SPLIT=True, FINISH=2)),
    ("split1", (11, 37), {}, dict(SPLIT=True, FINISH=0)),
    ("rows", (19, 5), {}, dict(SPLIT=False, FINISH=2, BM=8)),
    ("one", (10, 20), {}, dict(SPLIT=False, FINISH=0)),
    ("rows_k", (19, 5), {}, dict(SPLIT=False, FINISH=1, BM=8)),
    ("split_k", (11, 37), {}, dict(SPLIT=True, FINISH=1)),
    ("last_narrow", (11, 37), {}, dict(SPLIT=False, FINISH=2, FIN_BP=2, FIN_BC=16)),
    ("rows", (4, 5, 6), {"x_layout": "transposed"}, dict(TABLE=True)),
    ("rows", (4, 5, 6), {"x_layout": "sliced"}, dict(TABLE=False)),
], ids=["split", "split_direct", "multirow", "one_program", "multirow_kernel", "split_kernel", "last_narrow",
        "table", "sliced_no_table"])
def test_sizings_force_their_paths(sizing, shape, params, expect):
    """The tiny sizings above really take the path each test case is meant to cover."""
    plan = _plan_of(LN, shape, sizing=sizing, **params)
    got = {k: plan.constexprs[k] for k in expect}
    assert got == expect, plan
    if expect.get("SPLIT"):
        assert plan.grid[1] == 5 and plan.split is not None
    if expect.get("FINISH") in (1, 2):
        assert plan.parts > 1 and plan.ws_numel == plan.parts * 2 * shape[-1]
        assert (plan.stage2 is not None) == (expect["FINISH"] == 1)
    if expect.get("FINISH") == 2:
        # the interpreter runs one finisher; it covers every column tile of the workspace
        ints, c = plan.ints, plan.constexprs
        assert ints["finishers"] == 1 and ints["fin_tiles"] * c["FIN_BC"] >= 2 * shape[-1], ints
    if sizing == "last_narrow":  # several column tiles, several steps over the partial rows
        assert plan.ints["fin_tiles"] > 1 and plan.parts > plan.constexprs["FIN_BP"], plan


@pytest.mark.parametrize("parts, width, warps, sms, finishers, want", [
    (128, 4096, 4, 132, 64, dict(FIN_BP=128, FIN_BC=32, fin_tiles=2, finishers=64)),
    (128, 4096, 4, 132, 200, dict(FIN_BP=128, FIN_BC=32, fin_tiles=2, finishers=64)),   # at most half the SMs
    (128, 4096, 4, 10, 64, dict(FIN_BP=128, FIN_BC=32, fin_tiles=26, finishers=5)),
    (3, 100, 1, 132, 32, dict(FIN_BP=4, FIN_BC=256, fin_tiles=1, finishers=1)),         # one tile: one finisher
    (256, 8192, 8, 132, 24, dict(FIN_BP=128, FIN_BC=64, fin_tiles=6, finishers=22)),
    (40, 8192, 16, 132, 64, dict(FIN_BP=64, FIN_BC=256, fin_tiles=1, finishers=32)),   # no more than the tiles
])
def test_finish_shape(parts, width, warps, sms, finishers, want):
    """Finishers split the workspace columns into equal runs of tiles; their tiles cover it all;
    there are at most half as many as SMs (a waiting finisher never holds the last free slot)."""
    cfg = _norm.Config(finishers=finishers)
    got = _norm.finish_shape(parts, parts, width, warps, sms, cfg, one_finisher=False)
    assert got == want
    assert got["finishers"] * got["fin_tiles"] * got["FIN_BC"] >= width
    assert (got["finishers"] - 1) * got["fin_tiles"] * got["FIN_BC"] < width  # none of them idle
    assert got["finishers"] <= max(1, sms // 2)
    assert _norm.finish_shape(parts, parts, width, warps, sms, cfg, one_finisher=True)["finishers"] == 1


@pytest.mark.parametrize("tile, per_sm, text, want", [
    (16384, 1, "", 3),                      # off: the configured depth
    (16384, 1, "inflight=64", 5),           # 4 tiles of 16 KiB in flight
    (16384, 1, "inflight=128", 8),          # capped by max_stages
    (16384, 2, "inflight=128", 5),          # two programs share the SM
    (65536, 2, "inflight=256", 3),          # 2 x 64 KiB per stage: shared memory allows 1 + 192 // 128 = 2
    (32768, 1, "inflight=32,stages=4", 4),  # never below `stages`
])
def test_pipeline_depth(tile, per_sm, text, want):
    """inflight raises the row loop's depth until that many KiB of loads are in flight per SM,
    within the shared memory its buffers may take."""
    cfg = _norm.parse_config(text, _norm.Config())
    got = _norm.pipeline_depth(tile, per_sm, cfg)
    assert got == want
    if cfg.inflight and got > cfg.stages:
        assert (got - 1) * tile * per_sm <= cfg.inflight_smem * 1024


def test_config_from_environment():
    """$GRADORACLE_TRITON_NORM overrides the GPU sizing; bad text names the field and the value."""
    cfg = _norm.parse_config("finish=kernel, stages=4,pdl=off", _norm.Config())
    assert (cfg.finish, cfg.stages, cfg.pdl) == ("kernel", 4, False)
    assert _norm.parse_config("", _norm.Config()) == _norm.Config()
    for text, words in (("stages=four", ["stages", "int", "'four'"]), ("finish=first", ["finish", "'first'"]),
                        ("bogus=1", ["bogus"]), ("stages", ["name=value"]), ("pdl=maybe", ["pdl", "bool"])):
        with pytest.raises(ValueError) as info:
            _norm.parse_config(text, _norm.Config())
        for w in words:
            assert w in str(info.value), (text, str(info.value))
    env = dict(os.environ, GRADORACLE_TRITON_NORM="finish=kernel,finishers=8")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", "from backends.triton import _norm; c = _norm.GPU_CONFIG; "
                          "print(c.finish, c.finishers)"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["kernel", "8"], out.stderr[-2000:]


@pytest.mark.parametrize("finish", _norm.FINISHES)
def test_gpu_plans_of_the_perf_cases(finish):
    """The H100 plan of each perf case: the rows path, a grid that fills 132 SMs without a
    second wave, a workspace of at most 1/8 of the bytes moved, partials only with dweight or
    dbias, added by a second kernel (finish "kernel") or by finishers on at most half the SMs
    (finish "last")."""
    from cases import select

    cfg = replace(_norm.GPU_CONFIG, finish=finish)
    for case in select("perf"):
        if case.op not in _norm.OPS:
            continue
        t = _meta_tensors(case)
        plan = _norm.make_plan(case.op, t, cfg)
        c = plan.constexprs
        assert not c["SPLIT"] and not c["TABLE"], case.id
        slots = 132 * max(1, cfg.warps_per_sm // plan.num_warps)
        assert 64 <= plan.grid[0] <= slots, (case.id, plan.grid, slots)
        cost = get_op(case.op).cost(case)
        assert plan.ws_numel * 4 <= cost.bytes / 8, (case.id, plan.ws_numel)
        assert (c["FINISH"] == 0) == (plan.k == 0), case.id
        moved = t["x"].numel() * t["x"].element_size() * 3  # x and dy read, dx written
        last = finish == "last" or moved <= cfg.last_below
        assert (plan.stage2 is not None) == (c["FINISH"] == 1) == (plan.k > 0 and not last), case.id
        if c["FINISH"] == 2:
            fins = plan.ints["finishers"]
            assert 1 < fins <= 66 and fins * plan.ints["fin_tiles"] * c["FIN_BC"] >= plan.ints["ws_stride"]


def test_last_below_takes_the_small_calls():
    """last_below (32 MiB moved, the GPU default): exactly the three 2M-element f32 perf cases (10-12 us
    kernels on the H100, host-bound with two launches) take the one-launch finish."""
    from cases import select

    cfg = replace(_norm.GPU_CONFIG, last_below=_norm.LAST_BELOW)
    one = []
    for case in select("perf"):
        if case.op in _norm.OPS:
            plan = _norm.make_plan(case.op, _meta_tensors(case), cfg)
            if plan.k and plan.constexprs["FINISH"] == 2:
                one.append(case.id)
            else:
                assert plan.k == 0 or plan.stage2 is not None, case.id
    assert sorted(one) == ["layernorm[f32,1024x2048]", "layernorm[f32,16x64x2048]", "rmsnorm[f32,1024x2048]"], one


def _meta_tensors(case):
    """The tensors of a case as meta tensors (shapes, strides and dtypes; no memory)."""
    spec = get_op(case.op)
    shapes = spec.shapes(case)
    dt = getattr(torch, dtypes.long_name(case.dtype))
    st = torch.float64 if case.dtype == "f64" else torch.float32
    names = ("x", "dy", "weight", "mean", "rstd", "dx", "dweight", "dbias")
    out = {k: (torch.empty(shapes[k], dtype=st if k in ("mean", "rstd") else dt, device="meta")
               if k in shapes else None) for k in names}
    for k in ("x", "dy"):  # the case's layouts, as harness.tensors builds them
        layout, shape = case.params.get(f"{k}_layout", "contig"), tuple(shapes[k])
        if layout == "transposed":
            out[k] = torch.empty(shape[:-2] + (shape[-1], shape[-2]), dtype=dt, device="meta").transpose(-1, -2)
        elif layout == "sliced":
            out[k] = torch.empty(shape[:-1] + (2 * shape[-1],), dtype=dt, device="meta")[..., ::2]
    return out


# ----------------------------------------------------------------------------- in-process checks


def _needs_interpreter():
    if not _interpreting_here():
        pytest.skip("needs TRITON_INTERPRET=1 in this process (the worker covers the oracle cases)")


def test_plan_cache_hit():
    """A repeated call with the same layout plans nothing; another layout plans once."""
    _needs_interpreter()
    _, params, _, inputs, outs = _make(LN, "f32", (6, 10), {})
    _norm.run(LN, inputs, outs, params)
    made = _norm.PLANS_MADE[0]
    for seed in (1, 2):
        _, _, _, inputs, outs = _make(LN, "f32", (6, 10), {}, seed=seed)
        _norm.run(LN, inputs, outs, params)
    assert _norm.PLANS_MADE[0] == made, "a call with a layout seen before planned again"
    _, _, _, inputs, outs = _make(LN, "f32", (6, 10), {"x_layout": "transposed"})
    _norm.run(LN, inputs, outs, params)
    assert _norm.PLANS_MADE[0] == made + 1, "a new layout must get its own plan"


@pytest.mark.parametrize("op", [LN, RMS])
def test_deterministic(op):
    """Two calls give the same bits (partials path with many programs, and the split path)."""
    _needs_interpreter()
    for sizing, shape in (("rows", (37, 24)), ("split", (13, 40))):
        _, params, _, inputs, outs1 = _make(op, "f32", shape, {})
        _, _, _, _, outs2 = _make(op, "f32", shape, {})
        _norm.run(op, inputs, outs1, params, SIZINGS[sizing])
        _norm.run(op, inputs, outs2, params, SIZINGS[sizing])
        for name in outs1:
            assert torch.equal(outs1[name], outs2[name]), f"{sizing}: {name} differs between two identical runs"


@pytest.mark.parametrize("op", [LN, RMS])
def test_registered(op):
    from backends.triton import triton_backend

    impl = triton_backend.impls[(op, "default")]
    assert impl.dtypes == ("f32", "f16", "bf16", "f64") and impl.deterministic
    module = sys.modules[f"backends.triton.{op}"]
    assert impl.fn.unchecked is module._unchecked, "timed loops call the launch without the checks"
    if _interpreting_here():
        for fn in (impl.fn, impl.fn.unchecked):
            _, params, _, inputs, outs = _make(op, "f32", (3, 8), {})
            fn(inputs, outs, params)
            assert not any(torch.isnan(o).any() for o in outs.values())


@pytest.mark.parametrize("mutate, error, words", [
    (lambda i, o: o.update(dx=torch.empty(8, 3).t()), ValueError, ["dx", "contiguous", "strides"]),
    (lambda i, o: o.update(dx=i["dy"]), ValueError, ["dx", "memory shared with dy"]),
    (lambda i, o: o.update(dbias=o["dweight"]), ValueError, ["dweight", "memory shared with dbias"]),
    (lambda i, o: o.update(dweight=i["weight"][:8]), ValueError, ["dweight", "memory shared with weight"]),
    (lambda i, o: o.pop("dweight"), ValueError, ["weight and dweight", "both or neither"]),
], ids=["dx_strided", "dx_is_dy", "dbias_is_dweight", "dweight_is_weight", "dweight_missing"])
def test_kernel_argument_errors(mutate, error, words):
    """What the kernels need beyond harness.argcheck: contiguous, unshared outputs."""
    _, params, _, inputs, outs = _make(LN, "f32", (3, 8), {})
    mutate(inputs, outs)
    with pytest.raises(error) as info:
        _norm.run(LN, inputs, outs, params)  # what the registered function runs after argcheck
    msg = str(info.value)
    assert msg.startswith("triton layernorm_backward: "), msg
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"


def test_merge_rows():
    # contiguous rows merge into one dim; a transposed 3-D view leaves two; size-1 dims drop
    assert _norm.merge_rows((4, 5), {"x": (30, 6), "dx": (30, 6)}) == [(20, {"x": 6, "dx": 6})]
    assert len(_norm.merge_rows((4, 5), {"x": (30, 1), "dx": (30, 6)})) == 2
    assert _norm.merge_rows((1, 5, 1), {"x": (0, 6, 0)}) == [(5, {"x": 6})]
    assert _norm.merge_rows((), {"x": ()}) == []


# ----------------------------------------------------------------------------- sm_90 compiles

_TY = sm90.TRITON_TY
BIG_SPLIT = [(LN, "bf16", (64, 65536), {}), (RMS, "f32", (7, 12289), {}), (LN, "f64", (8, 8192), {"bias": False})]
TABLE = [(LN, "bf16", (4, 33, 130), {"x_layout": "transposed"})]
# odd shapes: N = 1 with many rows per tile, N = 5 and 1023 (no vector width divides them), a strided column
ODD = [(LN, "f32", (4, 1), {}), (LN, "bf16", (13, 5), {}), (RMS, "f16", (3, 1023), {}),
       (LN, "f32", (33, 65), {"dy_layout": "transposed", "affine": False})]


def _compile_jobs() -> list[str]:
    """One job per distinct launch of a kernel (perf cases, the split path, the offset table)."""
    from cases import select

    jobs, seen = [], set()
    for c in select("perf"):
        # cases that differ only in the row count M compile to the same kernels: one of each
        if c.op not in _norm.OPS:
            continue
        key = (c.op, c.dtype, c.params["shape"][-1], tuple(sorted((k, str(v)) for k, v in c.params.items()
                                                                  if k not in ("shape", "eps"))))
        if key not in seen:
            seen.add(key)
            jobs.append(f"perf:{c.id}")
    # the other finish on a few perf cases (each op, 2- and 4-byte dtypes, with and without dbias)
    jobs += [f"kernel:{c}" for c in ("layernorm[f32,1024x2048]", "layernorm[bf16,2048x8192,nobias]",
                                     "rmsnorm[bf16,2048x4096,eps=1e-05]")]
    # the deepest pipelines the inflight knob makes (8 stages; 5 stages of 32 KiB tiles)
    jobs += [f"deep:{c}" for c in ("layernorm[bf16,2048x4096]", "rmsnorm[bf16,2048x8192,eps=1e-05]")]
    jobs += [f"extra:{i}" for i in range(len(BIG_SPLIT) + len(TABLE) + len(ODD))]
    jobs += [f"xkernel:{i}" for i in range(len(BIG_SPLIT))]
    return jobs


def _job_case(job: str):
    """(case, sizing) of a compile job."""
    from cases import select
    from cases.registry import Case

    kind, rest = job.split(":", 1)
    cfg = replace(_norm.GPU_CONFIG, finish="kernel", last_below=0) if kind in ("kernel", "xkernel") else _norm.GPU_CONFIG
    if kind == "deep":
        cfg = replace(cfg, inflight=128)
    if kind in ("perf", "kernel", "deep"):
        return next(c for c in select("perf") if c.id == rest), cfg
    op, dt, shape, params = (BIG_SPLIT + TABLE + ODD)[int(rest)]
    return Case(op, dt, {"shape": list(shape), **params}), cfg


def _launches(job: str) -> list:
    """(label, kernel, pointer dtypes, int args, constexprs, num_warps, options) of each launch."""
    case, cfg = _job_case(job)
    plan = _norm.make_plan(case.op, _meta_tensors(case), cfg)
    ty, acc = _TY[case.dtype], "fp64" if case.dtype == "f64" else "fp32"
    ptrs = dict(x_ptr=ty, dy_ptr=ty, w_ptr=ty, mean_ptr=acc, rstd_ptr=acc, dx_ptr=ty, ws_ptr=acc, dw_ptr=ty,
                db_ptr=ty, tab_ptr="i64", sums_ptr=acc, cnt_ptr="i32")
    out = [("main", _norm._rows_kernel, ptrs, plan.ints, plan.constexprs, plan.num_warps, {})]
    if plan.split is not None:
        s = plan.split
        out.append(("chunk_sums", _norm._chunk_sums_kernel, ptrs, s["ints"], s["constexprs"], s["num_warps"], {}))
    if plan.stage2 is not None:
        s = plan.stage2
        opts = {"launch_pdl": True} if s["constexprs"]["PDL"] else {}
        out.append(("stage2", _norm._partials_kernel, dict(ws_ptr=acc, dw_ptr=ty, db_ptr=ty), s["ints"],
                    s["constexprs"], s["num_warps"], opts))
    return out


def _compile(job: str) -> dict:
    result = {}
    launches = _launches(job)
    result["paths"] = {k: launches[0][4][k] for k in ("SPLIT", "TABLE", "FINISH", "PDL", "STAGES")}
    for label, kernel, ptrs, ints, constexprs, warps, opts in launches:
        sig, consts, attrs = sm90.launch_signature(kernel, ptrs, ints, constexprs)
        compiled = sm90.compile_sm90(kernel, sig, consts, attrs, warps, **opts)
        ptx = compiled.asm["ptx"]
        addptrs, narrow = sm90.pointer_offsets(compiled.asm["ttir"])
        result[label] = {
            "cubin": len(compiled.asm.get("cubin", b"")),
            "addptrs": addptrs,
            "narrow_offsets": narrow,
            # 16-byte global loads: vector loads, or the pipeliner's 16-byte async copies
            "wide_loads": bool(re.search(r"ld\.global(?:\.\w+)*\.v[24]\.(?:b32|b64|f32)|cp\.async\.\w+\.shared\.global"
                                         r" \[[^\]]*\], \[[^\]]*\], (?:16|0x10)", ptx)),
            # the finishers' 16-byte loads of the partials, from L2 (.cg)
            "wide_cg_loads": bool(re.search(r"ld\.global\.cg(?:\.\w+)*\.v4\.(?:b32|f32)|"
                                            r"ld\.global\.cg(?:\.\w+)*\.v2\.(?:b64|f64)", ptx)),
        }
        r = sm90.ptxas_report(ptx)  # spills: stores + loads in bytes (None: no ptxas shipped with triton)
        result[label]["regs"] = r["regs"]
        result[label]["spills"] = None if r["regs"] is None else r["spill_stores"] + r["spill_loads"]
    return result


COMPILE_JOBS = _compile_jobs()


@pytest.fixture(scope="module")
def compiled() -> dict:
    """Compile every job in two worker processes without TRITON_INTERPRET (this machine has two cores)."""
    return sm90.run_workers(__file__, "--compile", [COMPILE_JOBS[i::2] for i in range(2)], timeout=1500)


@pytest.mark.parametrize("job", COMPILE_JOBS)
def test_compiles_for_sm90(compiled, job):
    r = dict(compiled[job])
    assert "error" not in r, r.get("error")
    paths = r.pop("paths")
    kind = job.split(":")[0]
    if kind == "extra":  # the extra jobs are there for these paths
        i = int(job.split(":")[1])
        assert paths["SPLIT"] == (i < len(BIG_SPLIT)), paths
        assert paths["TABLE"] == (len(BIG_SPLIT) <= i < len(BIG_SPLIT) + len(TABLE)), paths
    if kind in ("kernel", "xkernel"):  # a second kernel adds the partials
        assert paths["FINISH"] == 1 and "stage2" in r, paths
    if paths["FINISH"] == 2 and kind == "perf":
        assert r["main"]["wide_cg_loads"], "finish last: the partials are not read with 16-byte loads"
    for label, k in r.items():
        assert k["cubin"] > 0, f"{label}: no cubin"
        assert k["addptrs"] > 0, label
        assert not k["narrow_offsets"], f"{label}: pointer offsets of type {k['narrow_offsets']} overflow past 2**31"
        assert k["spills"] in (None, 0), f"{label}: ptxas reports {k['spills']} bytes of register spills"
    if kind in ("perf", "kernel", "deep"):
        assert r["main"]["wide_loads"], "main kernel: no 16-byte global loads on a perf case"
    if kind == "deep":
        assert paths["STAGES"] >= 5, paths


if __name__ == "__main__" and sys.argv[1:2] == ["--interpret"]:
    _interpret_worker()
elif __name__ == "__main__" and sys.argv[1:2] == ["--compile"]:
    sm90.worker(sys.argv[2:], _compile)
