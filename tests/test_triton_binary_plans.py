"""The host side of the `triton` binary_backward: cached launch plans, the thin unchecked entry
and the autotuner's bookkeeping, run by the Triton interpreter (TRITON_INTERPRET=1) on small
shapes.  Every call's outputs are still judged against the float64 oracle: a cache that
returned stale results, or a candidate sizing that miscomputes, fails here.

The autotuner times candidates with CUDA events; here its timer is replaced by a table of
made-up times, which tests the choice (margin, dedup, errors) and that only the checked entry
ever tunes.  The real timings run on the GPU (scripts/gpu/triton_binary.sh).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_triton_interpret as ti  # noqa: E402
from backends._plans import binary_backward as _bcast_plan  # noqa: E402
from backends.triton import binary_backward as tk  # noqa: E402
from harness import argcheck  # noqa: E402
from harness.registry import timed_callable  # noqa: E402

pytestmark = pytest.mark.skipif(not ti._interpreting_here(), reason="needs TRITON_INTERPRET=1 in this process")


@pytest.fixture(autouse=True)
def fresh_caches(monkeypatch):
    """Each test starts with no plans and no tuning choices, and leaves none behind."""
    monkeypatch.setattr(tk, "_PLANS", {})
    monkeypatch.setattr(tk, "_TUNED", {})
    monkeypatch.setattr(tk, "TUNING_LOG", {})


def _counting(monkeypatch):
    """Count calls of the planning functions: make_plan (broadcast plan) and plan_tile."""
    counts = {"make_plan": 0, "plan_tile": 0}

    def wrap(owner, name):
        real = getattr(owner, name)

        def counted(*args, **kwargs):
            counts[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)

    wrap(_bcast_plan, "make_plan")
    wrap(tk, "plan_tile")
    return counts


def _params(fn, inputs):
    return {"fn": fn, "a": list(inputs["a"].shape), "b": list(inputs["b"].shape)}


@pytest.mark.parametrize("pattern, cfg", [("b_rows", None), ("both", ti.TINY), ("same", None)],
                         ids=["tile", "tile-two-stage", "flat"])
def test_second_call_does_no_planning(monkeypatch, pattern, cfg):
    counts = _counting(monkeypatch)
    first = None
    for seed in (0, 1, 2):  # other values, other buffers, same layout
        host, inputs, outs = ti._inputs("mul", "f32", pattern, seed=seed)
        if cfg is None:
            tk.binary_backward(inputs, outs, _params("mul", inputs))
        else:
            tk.run(inputs, outs, {"fn": "mul"}, cfg)
        ti.check_outputs("mul", "f32", host, outs)  # a stale (cached) result would fail here
        if first is None:
            first = dict(counts)
    expect_tile = 0 if pattern == "same" else 1
    assert first == {"make_plan": 1, "plan_tile": expect_tile}, first
    assert counts == first, f"later calls planned again: {counts}"
    assert len(tk._PLANS) == 1


def test_plan_key_separates_layouts(monkeypatch):
    counts = _counting(monkeypatch)
    _, inputs, outs = ti._inputs("mul", "f32", "b_rows")
    tk.binary_backward(inputs, outs, _params("mul", inputs))
    # another fn, another dtype, another alignment of a data pointer: each its own plan
    _, inputs2, outs2 = ti._inputs("div", "f32", "b_rows")
    tk.binary_backward(inputs2, outs2, _params("div", inputs2))
    host3, inputs3, outs3 = ti._inputs("mul", "bf16", "b_rows")
    tk.binary_backward(inputs3, outs3, _params("mul", inputs3))
    ti.check_outputs("mul", "bf16", host3, outs3)
    host4, inputs4, outs4 = ti._inputs("mul", "f32", "b_rows")
    buf = torch.empty(inputs4["a"].numel() + 1)
    shifted = buf[1:].view(inputs4["a"].shape)  # 4 bytes past a 16-byte boundary
    shifted.copy_(inputs4["a"])
    inputs4["a"] = shifted
    tk.binary_backward(inputs4, outs4, _params("mul", inputs4))
    ti.check_outputs("mul", "f32", host4, outs4)
    assert len(tk._PLANS) == 4 and counts["make_plan"] == 4


def test_registered_function_has_a_thin_unchecked_path(monkeypatch):
    impl = tk.triton_backend.impls[("binary_backward", "default")]
    assert timed_callable(impl) is tk.binary_backward.unchecked is tk._unchecked
    assert impl.fn is tk.binary_backward
    for pattern, fn in (("b_rows", "pow"), ("same", "maximum"), ("outer", "div")):
        _, inputs, outs = ti._inputs(fn, "f32", pattern)
        impl.fn(inputs, outs, _params(fn, inputs))  # the checked call first, as the harness does

        def refuse(*_, **__):
            raise AssertionError("the unchecked path checked or planned again")

        with monkeypatch.context() as m:
            for owner, name in ((tk, "_validate"), (argcheck, "check_impl"), (_bcast_plan, "make_plan"),
                                (tk, "plan_tile"), (tk, "_autotune"), (tk, "_build")):
                m.setattr(owner, name, refuse)
            host, inputs, outs = ti._inputs(fn, "f32", pattern, seed=5)
            timed_callable(impl)(inputs, outs, _params(fn, inputs))
        ti.check_outputs(fn, "f32", host, outs)


def test_unchecked_path_plans_on_a_miss():
    """Called first (not what the harness does), the unchecked path still plans, never tunes."""
    host, inputs, outs = ti._inputs("sub", "f32", "a_bcast")
    tk.binary_backward.unchecked(inputs, outs, {"fn": "sub"})
    ti.check_outputs("sub", "f32", host, outs)
    assert len(tk._PLANS) == 1 and not tk._TUNED


# ----------------------------------------------------------------------------- autotuning


def _bplan(inputs):
    a, b, g = inputs["a"], inputs["b"], inputs["grad_out"]
    return _bcast_plan.make_plan(tuple(a.shape), tuple(b.shape), a.stride(), b.stride(), g.stride())


def _tensors(inputs, outs):
    return inputs["a"], inputs["b"], inputs["grad_out"], outs["grad_a"], outs["grad_b"]


def _fake_timer(monkeypatch, bplan, times_by_index, calls):
    """Replace the CUDA-event timer: candidate i of the class 'takes' times_by_index[i] ms (an
    exception: it fails), and every call is logged in `calls`; tuning also made possible here."""
    def fake(plan, tensors, *_, **__):
        item, device = tensors[0].element_size(), tensors[0].device
        sig = plan.signature()
        for i, cfg in enumerate(tk.candidates(tk.tune_class(bplan, item, "mul"))):
            if tk._build(bplan, "mul", item, cfg, device).signature() == sig:
                calls.append(i)
                if isinstance(times_by_index[i], Exception):
                    raise times_by_index[i]
                return times_by_index[i]
        raise AssertionError("timed a plan of no candidate")

    monkeypatch.setattr(tk, "_time_ms", fake)
    monkeypatch.setattr(tk, "TUNE_MIN_BYTES", 0)


# A K-inner reduction large enough that the candidates plan different launches.
TUNE_SHAPE = ((256, 4096), (4096,))


def _tune_inputs(seed=0):
    return ti.inputs_for("mul", "f32", *TUNE_SHAPE, seed=seed)


@pytest.mark.parametrize("times, chosen", [
    ([1.0, 0.5, 0.9, 0.8, 0.7], 1),          # clearly faster: taken
    ([1.0, 0.99, 0.995, 1.2, 1.1], 0),       # within the margin: the default stays
    ([1.0, RuntimeError("out of resources"), 2.0, 0.6, 3.0], 3),  # a failing candidate is skipped
])
def test_autotune_choice(monkeypatch, times, chosen):
    host, inputs, outs = _tune_inputs()
    bplan = _bplan(inputs)
    calls = []
    _fake_timer(monkeypatch, bplan, times, calls)
    cls = tk.tune_class(bplan, 4, "mul")
    cands = tk.candidates(cls)
    assert cls[:4] == ("tile", "mul", "k", True) and len(cands) == len(times)
    plan = tk._auto_plan(bplan, "mul", 4, _tensors(inputs, outs), tune=True)
    sigs = {tk._build(bplan, "mul", 4, c, inputs["a"].device).signature() for c in cands}
    assert len(calls) == len(sigs), "each distinct candidate launch is timed once"
    assert tk._TUNED[(None, cls)] == cands[chosen]
    assert plan.signature() == tk._build(bplan, "mul", 4, cands[chosen], inputs["a"].device).signature()
    log = tk.TUNING_LOG[(None, cls)]
    assert log["chosen"] == chosen and len(log["tried"]) == len(cands)
    plan(*_tensors(inputs, outs))  # the chosen plan computes the right thing
    ti.check_outputs("mul", "f32", host, outs)
    # settled: a second call of the class, checked or not, times nothing
    calls.clear()
    tk._auto_plan(bplan, "mul", 4, _tensors(inputs, outs), tune=True)
    tk._auto_plan(bplan, "mul", 4, _tensors(inputs, outs), tune=False)
    assert calls == []


def test_unchecked_never_tunes(monkeypatch):
    _, inputs, outs = _tune_inputs()
    bplan = _bplan(inputs)
    calls = []
    _fake_timer(monkeypatch, bplan, [1.0, 0.5, 0.5, 0.5, 0.5], calls)
    plan = tk._auto_plan(bplan, "mul", 4, _tensors(inputs, outs), tune=False)
    assert calls == [] and not tk._TUNED
    assert plan.signature() == tk._build(bplan, "mul", 4, tk.GPU_CONFIG, inputs["a"].device).signature()


def test_spilling_candidate_is_never_chosen(monkeypatch):
    """A candidate that times fastest but spills registers loses to the default."""
    host, inputs, outs = _tune_inputs()
    bplan = _bplan(inputs)
    calls = []
    _fake_timer(monkeypatch, bplan, [1.0, 0.5, 0.9, 1.1, 1.2], calls)
    spilling = tk._build(bplan, "mul", 4, tk.candidates(tk.tune_class(bplan, 4, "mul"))[1], inputs["a"].device)
    monkeypatch.setattr(tk, "plan_spills", lambda plan: 64 if plan.signature() == spilling.signature() else 0)
    tk._auto_plan(bplan, "mul", 4, _tensors(inputs, outs), tune=True)
    cls = tk.tune_class(bplan, 4, "mul")
    log = tk.TUNING_LOG[(None, cls)]
    assert log["tried"][1]["spills"] == 64 and log["chosen"] == 2  # 0.9: the fastest that does not spill


def test_tune_class_separates_fns():
    """pow needs several times mul's registers: a sizing chosen on mul's timings is not pow's."""
    _, inputs, _ = _tune_inputs()
    bplan = _bplan(inputs)
    classes = {tk.tune_class(bplan, 4, fn) for fn in ("mul", "pow", "add")}
    assert len(classes) == 3
    flat = _bcast_plan.make_plan((64,), (64,), (1,), (1,), (1,))
    pow_flat = tk.candidates(tk.tune_class(flat, 2, "pow"))
    assert all(tk.flat_block(1 << 26, 2, c)[0] // (32 * tk.flat_block(1 << 26, 2, c)[1]) <= 16 for c in pow_flat), \
        "a pow flat candidate gives a thread over 16 values"


def test_tuning_off_and_small_calls_use_defaults(monkeypatch):
    _, inputs, outs = _tune_inputs()
    bplan = _bplan(inputs)
    calls = []
    _fake_timer(monkeypatch, bplan, [1.0, 0.5, 0.5, 0.5, 0.5], calls)
    monkeypatch.setenv(tk.TUNE_ENV, "0")
    tk._auto_plan(bplan, "mul", 4, _tensors(inputs, outs), tune=True)
    monkeypatch.delenv(tk.TUNE_ENV)
    monkeypatch.setattr(tk, "TUNE_MIN_BYTES", tk.min_bytes(bplan, 4) + 1)
    tk._auto_plan(bplan, "mul", 4, _tensors(inputs, outs), tune=True)
    assert calls == [] and not tk._TUNED


# ----------------------------------------------------------------------------- every candidate computes right

# (pattern, A, B): one shape per kind of tune class
CANDIDATE_SHAPES = {
    "flat": ((8, 96), (8, 96)),
    "k_inner_sum": ((48, 160), (160,)),       # K contiguous, rows summed (bias gradient)
    "k_inner_mid": ((3, 40, 96), (3, 1, 96)),  # K of two dims
    "row_sum": ((24, 130), (24, 1)),          # the contiguous class is summed
    "a_bcast": ((1, 96), (40, 96)),           # loops over RA
    "both": ((1, 12, 64), (5, 12, 1)),        # both reduce, the fixed one contiguous (the batch kernel)
    "both_mirror": ((5, 12, 1), (1, 12, 37)),  # ... and its mirror, rows of 37
    "outer": ((40, 1), (1, 24)),              # the fixed class contiguous
}


def _candidate_ids():
    out = []
    for label, (a, b) in CANDIDATE_SHAPES.items():
        g = _bcast_plan.broadcast_shape(a, b)
        cs = _bcast_plan.contiguous_strides
        bplan = _bcast_plan.make_plan(a, b, cs(a), cs(b), cs(g))
        for dt, item in (("f32", 4), ("bf16", 2)):
            for fn in ("div", "pow"):
                for i, _ in enumerate(tk.candidates(tk.tune_class(bplan, item, fn))):
                    out.append(f"{label}|{dt}|{fn}|{i}")
    return out


@pytest.mark.parametrize("case_id", _candidate_ids())
def test_every_candidate_matches_oracle(case_id):
    label, dt, fn, i = case_id.split("|")
    a_shape, b_shape = CANDIDATE_SHAPES[label]
    host, inputs, outs = ti.inputs_for(fn, dt, a_shape, b_shape)
    bplan = _bplan(inputs)
    cfg = tk.candidates(tk.tune_class(bplan, inputs["a"].element_size(), fn))[int(i)]
    tk.run(inputs, outs, {"fn": fn}, cfg)
    ti.check_outputs(fn, dt, host, outs)


# ----------------------------------------------------------------------------- paths, presets, variants


def _launch_of(pattern: str, cfg, fn: str = "mul"):
    _, inputs, _ = ti._inputs(fn, "f32", pattern)
    bplan = _bplan(inputs)
    if bplan.numel == 0 or bplan.contiguous_fast_path():
        return None
    return tk.plan_tile(bplan, 4, fn, cfg, cfg.sms, None)


def test_every_tile_path_is_forced():
    """The interpreter patterns under TINY / TINY_NP take every branch of `_tile_kernel` that the
    GPU takes on large shapes: both loop directions, prefetch on and off, split loops (several
    chunks, each several steps), fixed-class partials, stage 2 over several row steps, blocks of
    1 and more on each summed axis."""
    seen = set()
    for pattern in ti.PATTERNS:
        for cfg in (ti.TINY, ti.TINY_NP):
            L = _launch_of(pattern, cfg)
            if L is None or L.kernel == "batch":  # see test_every_batch_path_is_forced
                continue
            c = L.constexprs
            seen.add(("loop_b" if c["LOOP_B"] else "loop_a", "prefetch" if c["PREFETCH"] else "plain"))
            looped, fixed = (L.parts_b, L.parts_a) if c["LOOP_B"] else (L.parts_a, L.parts_b)
            if looped > 1 and L.ints["iters"] > 1:
                seen.add("split loop")
            if fixed > 1:
                seen.add("fixed partials")
            for parts in (L.parts_a, L.parts_b):
                if parts > cfg.stage2_rows:
                    seen.add("stage 2 in steps")
            seen.add(("BA", c["BA"] > 1))
            seen.add(("BB", c["BB"] > 1))
            seen.add(("fast", c["FAST"]))
    for needed in [("loop_b", "prefetch"), ("loop_b", "plain"), ("loop_a", "prefetch"), ("loop_a", "plain"),
                   "split loop", "fixed partials", "stage 2 in steps", ("BA", True), ("BA", False),
                   ("BB", True), ("BB", False), ("fast", True), ("fast", False)]:
        assert needed in seen, f"no pattern takes path {needed}"


PERF_BOTH = ((1, 2048, 4096), (8, 2048, 1))  # the both-broadcast perf cases' shapes


def _plan_of(a_shape, b_shape):
    cs = _bcast_plan.contiguous_strides
    return _bcast_plan.make_plan(a_shape, b_shape, cs(a_shape), cs(b_shape),
                                 cs(_bcast_plan.broadcast_shape(a_shape, b_shape)))


@pytest.mark.parametrize("item", [2, 4, 8])
def test_both_broadcast_takes_the_batch_kernel(item):
    """The perf cases mul[A=1x2048x4096, B=8x2048x1]: one program per row of the 2048, every batch
    in one tile whose row chunk spans the 4 warps with one 16-byte vector per thread and batch
    (so the batch sum stays in each thread), both gradients written directly, one reduction
    across warps per program; the mirror image too.  batch_tile=0 keeps the generic tile kernel."""
    for a_shape, b_shape, swap in (PERF_BOTH + (False,), PERF_BOTH[::-1] + (True,)):
        bplan = _plan_of(a_shape, b_shape)
        assert tk.batch_path(bplan) and tk.tune_class(bplan, item, "mul")[0] == "batch"
        L = tk.plan_tile(bplan, item, "mul", tk.GPU_CONFIG, 132)
        c = L.constexprs
        assert L.kernel == "batch" and c["SWAP"] == swap
        assert (L.grid, L.num_warps, c["BT"], c["BN"], c["VEC"]) == (2048, 4, 8, 2048 // item, 16 // item)
        assert c["BN"] == 32 * L.num_warps * c["VEC"]  # the warps side by side along the row
        assert (L.parts_a, L.parts_b, c["DIRECT"], c["ACCUM"], c["PREFETCH"]) == (1, 1, True, False, True)
        assert L.ints["nblk_r"] == 4096 // c["BN"] and not (L.scratch_a or L.scratch_b)
        assert tk.plan_tile(bplan, item, "pow", tk.GPU_CONFIG, 132).constexprs["PREFETCH"] is False
        old = tk.plan_tile(bplan, item, "mul", tk.PRESETS["no_batch"], 132)
        assert old.kernel == "tile" and not tk.batch_path(bplan, tk.PRESETS["no_batch"])
    assert not tk.batch_path(_plan_of((8, 2048, 4096), (8, 2048, 1)))  # one reduction: the tile kernel


def test_every_batch_path_is_forced():
    """The interpreter's batch patterns under its sizings take every branch of `_batch_kernel`:
    both operand orders, prefetch on and off, running sums over several tiles a program, batch
    partials (with and without running sums), several chunks a row and rows of several dims,
    batch counts and row lengths that leave a tile or chunk partly masked."""
    seen = set()
    for pattern in ti._BATCH:
        for cfg in (None, ti.TINY, ti.TINY_BT):
            _, inputs, _ = ti._inputs("mul", "f32", pattern)
            cfg = cfg or tk.INTERPRETER_CONFIG
            L = tk.plan_tile(_bplan(inputs), 4, "mul", cfg, cfg.sms)
            assert L.kernel == "batch", pattern
            c, n = L.constexprs, L.ints
            seen |= {("swap", c["SWAP"]), ("prefetch", c["PREFETCH"]), ("direct", c["DIRECT"], c["ACCUM"])}
            seen |= {("chunks", n["nblk_r"] > 1), ("row dims", (c["NA"] if c["SWAP"] else c["NB"]) > 1),
                     ("ragged tile", n["n_l"] % c["BT"] != 0), ("ragged chunk", n["cols"] % c["BN"] != 0)}
    for needed in [("swap", True), ("swap", False), ("prefetch", True), ("prefetch", False),
                   ("direct", True, True), ("direct", True, False), ("direct", False, True),
                   ("direct", False, False), ("chunks", True), ("row dims", True), ("ragged tile", True),
                   ("ragged chunk", True)]:
        assert needed in seen, f"no pattern takes path {needed}"


def test_split_fills_whole_waves():
    """A split loop runs sms x occupancy programs at most (one resident wave), in chunks of
    equal length but the last."""
    bplan = _bcast_plan.make_plan((8, 2048, 4096), (4096,), (2048 * 4096, 4096, 1), (1,), (2048 * 4096, 4096, 1))
    for occ in (4, 7, 10):
        L = tk.plan_tile(bplan, 2, "mul", tk.GPU_CONFIG, 132, lambda _: occ)
        assert L.parts_b > 1 and L.occupancy == occ
        assert 132 * occ * 0.9 <= L.grid <= 132 * occ, (occ, L.grid)
        assert (L.parts_b - 1) * L.ints["iters"] < L.ints["nblk_l"] <= L.parts_b * L.ints["iters"]


def test_preset_env(monkeypatch):
    monkeypatch.setenv(tk.PRESET_ENV, "wide")
    assert tk._preset() == tk.PRESETS["wide"]
    monkeypatch.setenv(tk.PRESET_ENV, "fastest")
    with pytest.raises(ValueError, match=r"GRADORACLE_TRITON_BINARY: expected one of lean, .*got 'fastest'"):
        tk._preset()


def test_variants_register_and_run(monkeypatch):
    """$GRADORACLE_TRITON_VARIANTS registers triton@<preset> implementations, checked and unchecked."""
    monkeypatch.setattr(tk.triton_backend, "impls", dict(tk.triton_backend.impls))
    monkeypatch.setenv(tk.VARIANTS_ENV, "lean_noprefetch,old")
    tk._register_variants()
    for name in ("lean_noprefetch", "old"):
        impl = tk.triton_backend.impls[("binary_backward", name)]
        assert impl.id == f"triton@{name}" and impl.deterministic
        host, inputs, outs = ti._inputs("div", "f32", "b_mid")
        impl.fn(inputs, outs, _params("div", inputs))
        ti.check_outputs("div", "f32", host, outs)
        host, inputs, outs = ti._inputs("div", "f32", "b_mid", seed=3)
        timed_callable(impl)(inputs, outs, _params("div", inputs))
        ti.check_outputs("div", "f32", host, outs)
    monkeypatch.setenv(tk.VARIANTS_ENV, "lean,bogus")
    with pytest.raises(ValueError, match="GRADORACLE_TRITON_VARIANTS: expected names from"):
        tk._register_variants()
