"""The `triton` matmul_backward, conv_backward_data and conv_backward_weight under the Triton interpreter.

Oracle runs (TRITON_INTERPRET=1, CPU): every smoke case of the three ops (and EXTRA: conv layers
whose channels span several tiles) through the
harness's own runner (harness/runner.py: NaN-poisoned outputs, guard bands, the float64 numpy
oracle and the tolerance model of harness/compare.py), and a set of conv smoke cases with
the tensor-core (tl.dot) path forced where the planner would take the multiply-add path for
small channel groups (so groups, depthwise, strides, dilation, 3D and both layouts run
through both kernels of each conv op).  The interpreter sizing splits wgrad's reduction
into up to 3 chunks, so both the direct store and the partials + finish run.

In-process checks: the plan cache (a repeated call plans nothing), bitwise repeatability,
the registration (deterministic, `unchecked`), the kernels' own argument errors, and the
autotuner's choice rules (settled once per class, only by a checked call, default kept on
near ties).

TRITON_INTERPRET must be set before triton is imported: where the test session did not set
it (a GPU machine), the oracle cases run in one worker subprocess that sets it.
"""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backends.triton import _conv  # noqa: E402
from backends.triton import conv_backward_data as cbd  # noqa: E402
from backends.triton import conv_backward_weight as cbw  # noqa: E402
from backends.triton import matmul_backward as mmb  # noqa: E402
from harness import dtypes  # noqa: E402
from harness.registry import get_op  # noqa: E402
from test_triton_interpret import _to_torch  # noqa: E402 - the HostTensor -> torch view helper
from triton_interp import check_result, needs_interpreter, report, worker_results  # noqa: E402

OPS = ("matmul_backward", "conv_backward_data", "conv_backward_weight")
# Conv smoke cases (by a substring of their ids) also run with the tl.dot path forced.
FORCED_DOT = ("C=4->2,HW=4x4,k=3x3,s=1,p=1,d=1,g=2,nhwc",      # grouped, channels last
              "C=3->6,HW=3x4,k=2x2,s=1,p=0,d=1,g=3,nchw",      # depthwise x2
              "C=8->8,HW=9x9,k=3x3,s=2,p=1,d=1,g=8,nhwc",      # strided depthwise
              "C=4->5,HW=9x9,k=3x3,s=2,p=1,d=1,g=1,nchw",      # strided 3x3: filter phases
              "C=1->2,DHW=4x4x4,k=2x1x2,s=3x2x3",              # 3D, stride above the kernel
              "C=4->6,HW=9x10,k=3x1,s=1x2,p=2x0,d=1x3",        # per-dim stride/padding/dilation
              "C=4->4,DHW=4x5x6,k=3x1x3",                       # 3D grouped, dilation
              "f64,N=1,C=2->4,L=5",                             # float64 on DMMA
              "bf16,N=2,C=4->4,HW=6x7,k=3x3,s=2,p=1,d=1,g=1,nhwc,dy:transposed")  # strided views


# Channels over several interpreter tiles (16 wide): the channel-block loops and grids of the
# tl.dot paths (Cin/g = 20, Cout/g = 24: 2 column blocks, 2 reduction steps per tap in dgrad,
# 2 x 2 tiles per tap in wgrad), grouped and strided, both layouts; and the multiply-add paths
# with more channels than one column block.
EXTRA = [
    ("f32", dict(n=2, cin=40, cout=48, spatial=[7, 6], kernel=[3, 3], stride=[2, 1], padding=[1, 1], groups=2,
                 layout="channels_first")),
    ("bf16", dict(n=1, cin=20, cout=24, spatial=[5, 6], kernel=[2, 3], stride=[1, 2], padding=[0, 1], dilation=[2, 1],
                  layout="channels_last")),
    ("f32", dict(n=2, cin=40, cout=40, spatial=[9], kernel=[3], stride=[2], padding=[1], groups=40,
                 layout="channels_last")),
    # channels last, Cin = 16: every tap's weight offset is 16-byte aligned (dgrad's WVEC path)
    ("f32", dict(n=1, cin=16, cout=8, spatial=[5, 6], kernel=[3, 3], stride=[2, 1], padding=[1, 1],
                 layout="channels_last")),
    # a small stem (Cin = 3, 7x7, stride 2): wgrad's merged-tap GEMM (MT) over 147 (tap, c) columns,
    # 10 column tiles of the interpreter's 16, Cout over two row tiles; both layouts
    ("bf16", dict(n=2, cin=3, cout=24, spatial=[11, 10], kernel=[7, 7], stride=[2, 2], padding=[3, 3],
                  layout="channels_first")),
    ("f32", dict(n=1, cin=3, cout=24, spatial=[9, 9], kernel=[7, 7], stride=[2, 2], padding=[3, 3],
                 layout="channels_last")),
    # channels first, 1x1 stride 2 (16 -> 8, the tensor-core path): dgrad's weight copy is the identity
    # (used in place), dy's and dx's copies real, with thin tiles (9 and 16 along one side)
    ("f32", dict(n=2, cin=16, cout=8, spatial=[5, 6], kernel=[1, 1], stride=[2, 2], layout="channels_first")),
    # channels first, one input channel (Cin/g x Cout/g = 64: not the multiply-add path): x's copy
    # (wgrad) and dx's (dgrad) are the identity
    ("bf16", dict(n=2, cin=1, cout=64, spatial=[6, 5], kernel=[3, 3], padding=[1, 1], layout="channels_first")),
]


def _extra(op):
    from cases.registry import Case

    out = []
    for dt, geo in EXTRA:
        params = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1, **geo}
        rank = len(params["spatial"])
        params = {k: ([v] * rank if k in ("stride", "padding", "dilation") and isinstance(v, int) else v)
                  for k, v in params.items()}
        out.append(Case(op, dt, params, frozenset({"smoke"})))
    return out


def _smoke(op):
    from cases import select

    return select("smoke", op=op) + (_extra(op) if op != "matmul_backward" else [])


def _case_ids() -> list[str]:
    ids = [f"{op}|{c.id}|auto" for op in OPS for c in _smoke(op)]
    ids += [f"{op}|{c.id}|dot" for op in OPS[1:] for c in _smoke(op) if any(s in c.id for s in FORCED_DOT)]
    return ids


CASES = _case_ids()

# ----------------------------------------------------------------------------- one case


def run_case(case_id: str) -> None:
    """Run one smoke case through the harness runner on the CPU; raise with its verdict unless PASS."""
    from harness import runner, status
    from harness.registry import find_impl

    op, cid, path = case_id.split("|")
    case = next(c for c in _smoke(op) if c.id == cid)
    saved = cbd.EW_MAX, cbw.EW_MAX
    if path == "dot":
        cbd.EW_MAX = cbw.EW_MAX = 0
    cbd.clear_plans()
    cbw.clear_plans()
    try:
        # The stale-output recheck and the exact-input check cost two more interpreted calls a case:
        # matmul keeps them (cheap); the conv ops' own are left to the GPU runs.
        r = runner.run_case(find_impl(op, "triton"), case, "cpu", run_seed=0, oracle="numpy",
                            recheck=op == "matmul_backward")
    finally:
        cbd.EW_MAX, cbw.EW_MAX = saved
        cbd.clear_plans()
        cbw.clear_plans()
    if r.status != status.PASS:
        bad = [f"{o.name}: {o.detail if hasattr(o, 'detail') else o}" for o in r.outputs if not o.passed]
        raise AssertionError(f"{r.status}: {r.reason} {bad[:2]}")


# ----------------------------------------------------------------------------- runner


@pytest.fixture(scope="module")
def subprocess_results():
    """Results of every case from a worker that sets TRITON_INTERPRET=1 before importing triton."""
    return worker_results(__file__, "--worker", timeout=1800)


@pytest.mark.parametrize("case_id", CASES)
def test_matches_oracle(subprocess_results, case_id):
    check_result(subprocess_results, case_id, run_case)


# ----------------------------------------------------------------------------- in-process checks


def _make(op, dtype, **params):
    """(inputs, NaN-filled outputs, params) of a case given by its params, as torch CPU tensors."""
    spec = get_op(op)
    case = SimpleNamespace(op=op, dtype=dtype, params=params)
    host = spec.generate(case, np.random.default_rng(0))
    shapes = spec.shapes(case)
    tdt = getattr(torch, dtypes.long_name(dtype))
    outs = {k: torch.full(shapes[k], float("nan"), dtype=tdt) for k in spec.outputs}
    return {k: _to_torch(v) for k, v in host.items()}, outs, params


CONV = dict(n=2, cin=4, cout=6, spatial=[7, 6], kernel=[3, 3], stride=[2, 1], padding=[1, 1], dilation=[1, 1],
            groups=2, layout="channels_last")
ENTRIES = {
    "matmul_backward": (mmb, dict(a=[3, 8, 20], b=[20, 12], b_layout="transposed")),
    "conv_backward_data": (cbd, CONV),
    "conv_backward_weight": (cbw, dict(CONV, n=4)),
}


def _cached(mod) -> list:
    """Identities of the cached plans (the conv caches keep a list of (params, plan) per key)."""
    out = []
    for v in mod._PLANS.values():
        out += [id(p) for _, p in v] if isinstance(v, list) else [id(v)]
    return out


@pytest.mark.parametrize("op", OPS)
def test_plan_cache_and_repeatability(op):
    """A second call of the same layout plans nothing and gives the same bits."""
    needs_interpreter()
    mod, params = ENTRIES[op]
    fn = mod.triton_backend.impls[(op, "default")].fn
    mod.clear_plans()
    inputs, outs1, _ = _make(op, "f32", **params)
    fn(inputs, outs1, params)
    plans = _cached(mod)
    assert len(plans) == 1
    _, outs2, _ = _make(op, "f32", **params)
    fn.unchecked(inputs, outs2, params)
    assert _cached(mod) == plans, "the second call planned again"
    for name in outs1:
        assert not torch.isnan(outs1[name]).any(), f"{name}: NaN left (not fully written)"
        assert torch.equal(outs1[name], outs2[name]), f"{name} differs between two identical calls"


def test_registration():
    for op in OPS:
        impl = mmb.triton_backend.impls[(op, "default")]
        assert impl.dtypes == ("f32", "f16", "bf16", "f64") and impl.deterministic
        assert callable(impl.fn.unchecked) and impl.fn.unchecked is not impl.fn


def _bad_cases():
    """(op, mutate(inputs, outs), error type, words the message must hold)."""
    def noncontig(name):
        def mutate(i, o):
            t = o[name]
            o[name] = torch.empty(tuple(reversed(t.shape)), dtype=t.dtype).permute(*reversed(range(t.dim())))
        return mutate

    def alias(out, inp):
        def mutate(i, o):  # the input and the output as views of one buffer, overlapping
            src, dst = i[inp], o[out]
            buf = torch.zeros(src.numel() + dst.numel(), dtype=src.dtype)
            buf[: src.numel()].view(src.shape).copy_(src)
            i[inp] = buf[: src.numel()].view(src.shape)
            o[out] = buf[src.numel() // 2: src.numel() // 2 + dst.numel()].view(dst.shape)
        return mutate

    def wrong_shape(name):
        def mutate(i, o):
            t = o[name]
            o[name] = torch.empty(tuple(t.shape[:-1]) + (t.shape[-1] + 1,), dtype=t.dtype)
        return mutate

    def wrong_dtype(name):
        def mutate(i, o):
            i[name] = i[name].to(torch.float64)
        return mutate

    return [
        ("matmul_backward", noncontig("da"), ValueError, ["matmul_backward", "da", "contiguous"]),
        ("matmul_backward", alias("db", "dy"), ValueError, ["matmul_backward", "db", "shared with dy"]),
        ("matmul_backward", wrong_shape("da"), ValueError, ["da"]),
        ("matmul_backward", wrong_dtype("b"), TypeError, ["b"]),
        ("conv_backward_data", noncontig("dx"), ValueError, ["conv_backward_data", "dx", "contiguous"]),
        ("conv_backward_data", alias("dx", "dy"), ValueError, ["conv_backward_data", "dx", "shared with dy"]),
        ("conv_backward_data", wrong_shape("dx"), ValueError, ["dx"]),
        ("conv_backward_weight", noncontig("dw"), ValueError, ["conv_backward_weight", "dw", "contiguous"]),
        ("conv_backward_weight", alias("dw", "x"), ValueError, ["conv_backward_weight", "dw", "shared with x"]),
        ("conv_backward_weight", wrong_dtype("x"), TypeError, ["x"]),
    ]


@pytest.mark.parametrize("op, mutate, error, words", _bad_cases())
def test_bad_input_errors(op, mutate, error, words):
    """Each bad argument raises a clear error naming the op and the argument; nothing is written."""
    mod, params = ENTRIES[op]
    fn = mod.triton_backend.impls[(op, "default")].fn
    inputs, outs, _ = _make(op, "f32", **params)
    mutate(inputs, outs)
    with pytest.raises(error) as info:
        fn(inputs, outs, params)
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"


def test_tuner_rules(monkeypatch):
    """The tuner times the candidates once per (device, class), only when asked (a checked call),
    keeps the default unless another is TUNE_MARGIN faster, and reuses the choice."""
    a, b, c = _conv.Tile(16, 16, 16), _conv.Tile(32, 32, 32), _conv.Tile(64, 64, 64)
    times = {a: 1.0, b: 0.99, c: 0.5}
    timed = []
    monkeypatch.setattr(_conv, "interpreted", lambda: False)
    monkeypatch.setattr(_conv, "capturing", lambda device: False)
    monkeypatch.setattr(_conv, "time_ms", lambda run: timed.append(run.name) or times[run.name])

    def build(tile):
        run = lambda: None  # noqa: E731
        run.name = tile
        return run

    abc = [a, b, c]
    cuda = SimpleNamespace(type="cuda", index=0)
    t = _conv.Tuner("test")
    big = 2 * _conv.TUNE_MIN_FLOPS
    assert t.pick("k", abc, build, cuda, big, tune=False).name == a and not timed  # unchecked
    assert t.pick("k", abc, build, cuda, _conv.TUNE_MIN_FLOPS / 2, tune=True).name == a and not timed
    assert t.pick("k", abc, build, cuda, big, tune=True).name == c and timed == [a, b, c]
    assert t.pick("k", abc, build, cuda, big, tune=True).name == c and len(timed) == 3  # cached
    assert t.pick("k", abc, build, cuda, big, tune=False).name == c
    times[c] = 0.995  # a near tie: the default stays
    assert t.pick("k2", abc, build, cuda, big, tune=True).name == a
    monkeypatch.setenv(_conv.TUNE_ENV, "0")
    assert t.pick("k3", abc, build, cuda, big, tune=True).name == a and len(timed) == 6


def test_tuner_records_its_choice_in_the_tune_file(monkeypatch, tmp_path):
    """With $GRADORACLE_TUNE_FILE set (harness profile's tuning pass), a tuner writes each choice
    there, and another process's tuner (a fresh Tuner) takes it without timing anything; a class
    the file does not hold is timed as usual."""
    a, b, c = _conv.Tile(16, 16, 16), _conv.Tile(32, 32, 32), _conv.Tile(64, 64, 64, stage=True)
    times = {a: 1.0, b: 0.5, c: 0.7}
    timed = []
    monkeypatch.setattr(_conv, "interpreted", lambda: False)
    monkeypatch.setattr(_conv, "capturing", lambda device: False)
    monkeypatch.setattr(_conv, "time_ms", lambda run: timed.append(run.name) or times[run.name])
    monkeypatch.setenv(_conv.TUNE_FILE_ENV, str(tmp_path / "tuned.json"))

    def build(tile):
        run = lambda: None  # noqa: E731
        run.name = tile
        return run

    cuda, big = SimpleNamespace(type="cuda", index=0), 2 * _conv.TUNE_MIN_FLOPS
    key = ("torch.float32", (1, 3, 3), True)
    assert _conv.Tuner("op").pick(key, [a, b, c], build, cuda, big, tune=True).name == b and len(timed) == 3
    times[c] = 0.1  # would win now, but the recorded choice is taken untimed
    fresh = _conv.Tuner("op")
    assert fresh.pick(key, [a, b, c], build, cuda, big, tune=True).name == b and len(timed) == 3
    assert fresh.pick(key, [a, b, c], build, cuda, big, tune=False).name == b  # and kept
    assert _conv.Tuner("other_op").pick(key, [a, b, c], build, cuda, big, tune=True).name == c  # per op
    assert _conv.Tuner("op").pick(key + (1,), [a, b, c], build, cuda, big, tune=True).name == c  # per class
    assert len(timed) == 9


def test_batch_tables():
    """The folded-batch offset tables: z over the output operand's batch, r over what it folds."""
    # da of a (4, 1, M, K) against dy (4, 3, M, N), b (3, K, N): z = a's 4 batch elements, r = the 3 it folds
    xo, yo, z, r = mmb._batch_tables((4, 1), (4, 3), (300, 100), (3,), (50,), (4, 3))
    assert (z, r) == (4, 3)
    assert xo.tolist() == [i * 300 + j * 100 for i in range(4) for j in range(3)]
    assert yo.tolist() == [j * 50 for _ in range(4) for j in range(3)]
    # db of b (K, N) (no batch) against a (2, 3, M, K): everything folds into one output
    xo, yo, z, r = mmb._batch_tables((), (2, 3), (30, 10), (2, 3), (60, 20), (2, 3))
    assert (z, r) == (1, 6) and xo.tolist() == [0, 10, 20, 30, 40, 50] and yo.tolist() == [0, 20, 40, 60, 80, 100]


def _codes(a_shape, a_strides, b_shape, b_strides, dtype):
    """{"da": (XC, YC), "db": (XC, YC)}: the alignment codes the matmul plan gives its two launches
    (planned on meta tensors with the CUDA candidates: no data, nothing launched)."""
    a = torch.empty_strided(a_shape, a_strides, dtype=dtype, device="meta")
    b = torch.empty_strided(b_shape, b_strides, dtype=dtype, device="meta")
    full = torch.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    dy = torch.empty(full + (a_shape[-2], b_shape[-1]), dtype=dtype, device="meta")
    da, db = (torch.empty(o.shape, dtype=dtype, device="meta") for o in (a, b))
    out = {}
    for product in mmb._plan(a, b, dy, da, db, False, 0).products:
        step = product.launch
        v = dict(zip(step.kernel.arg_names[step.n_tensors:], step.tail))
        if "XC0" in v:  # da and db in one launch
            assert all(v[k] for k in ("XC0", "YC0", "XC1", "YC1")), v  # only where every code is set
            out.update(da=(v["XC0"], v["YC0"]), db=(v["XC1"], v["YC1"]))
        else:
            out["da" if product.ci == 3 else "db"] = (v["XC"], v["YC"])
    return out


def test_alignment_codes():
    """The 16-byte facts the matmul kernel is told (XC/YC: 1 along L, 2 along P/Q, 0 none) hold
    exactly where they are true: unit stride on that axis, the other stride, the batch offsets
    and the contiguous size multiples of 16 bytes; anything else takes the hint-free path."""
    bf, f32 = torch.bfloat16, torch.float32
    # Contiguous: da reads dy and b along L (= N); db reads a^T along P (= K) and dy along Q (= N).
    assert _codes((64, 32), (32, 1), (32, 48), (48, 1), bf) == {"da": (1, 1), "db": (2, 2)}
    # b stored (N, K): b^T is contiguous along Q for da, and b's own (K, N) output is unaffected.
    assert _codes((64, 32), (32, 1), (32, 48), (1, 32), bf) == {"da": (1, 2), "db": (2, 2)}
    # K = 36: a's rows are 72 bytes apart (not 16-byte aligned) in bf16, but 144 bytes in f32
    # (da reads dy and b only, whose rows of N = 48 stay aligned).
    assert _codes((64, 36), (36, 1), (36, 48), (48, 1), bf) == {"da": (1, 1), "db": (0, 2)}
    assert _codes((64, 36), (36, 1), (36, 48), (48, 1), f32) == {"da": (1, 1), "db": (2, 2)}
    # N = 12 in bf16: dy's rows (L of da) are not 16-byte runs; f32 rows of 48 bytes are.
    assert _codes((64, 32), (32, 1), (32, 12), (12, 1), bf) == {"da": (0, 0), "db": (2, 0)}
    # Sliced (stride 2 on the last dim): no unit stride, no facts for that operand.
    assert _codes((64, 32), (130, 2), (32, 48), (48, 1), bf)["db"] == (0, 2)
    # A batch stride of 65 elements: a's batch offsets break the facts of every tile of a.
    assert _codes((3, 8, 8), (65, 8, 1), (8, 16), (16, 1), bf) == {"da": (1, 1), "db": (0, 2)}
    # Broadcast batch (b shared by the batch of a): db folds it, offsets 0, 512, ... stay aligned.
    assert _codes((4, 16, 32), (512, 32, 1), (32, 16), (16, 1), bf) == {"da": (1, 1), "db": (2, 2)}


def test_tap_table_matches_enumeration():
    """dgrad's per-phase tap header makes exactly the taps a brute-force enumeration finds: for
    each phase the (kd, kh, kw) with k*d = r (mod s) in every dim, in that order, with their dy
    window shifts (i0 + p - k*d) / s and weight offsets (strides, gcd(d, s) > 1, s > k, padding)."""
    from itertools import product as cartesian

    from backends._plans.conv_geometry import Geo3

    sw = (0, 0, 1000, 31, 7)  # weight strides (co, ci, kd, kh, kw): distinct, so offsets identify taps
    for k, s, d, p in [((1, 3, 3), (1, 2, 2), (1, 1, 1), (0, 1, 1)), ((3, 1, 5), (3, 2, 2), (1, 3, 2), (2, 0, 2)),
                       ((2, 1, 2), (3, 2, 3), (1, 1, 1), (0, 0, 0)), ((1, 4, 6), (1, 4, 6), (1, 2, 4), (0, 3, 5)),
                       ((1, 7, 7), (1, 2, 2), (1, 1, 1), (0, 3, 3))]:
        g = Geo3(1, 4, 4, 1, (1, 9, 9), (1, 5, 5), k, s, p, d)
        tab, offsets = cbd.tap_table(g, sw)
        tab = tab.reshape(-1, cbd.HEADER)
        made_all = []
        for i, r in enumerate(cartesian(*(range(x) for x in s))):
            want = []
            for kk in cartesian(*(range(x) for x in k)):
                if all((kj * dj - rj) % sj == 0 for kj, dj, rj, sj in zip(kk, d, r, s)):
                    i0 = [(rj - pj) % sj for rj, pj, sj in zip(r, p, s)]
                    shift = tuple((a + pj - kj * dj) // sj for a, pj, kj, dj, sj in zip(i0, p, kk, d, s))
                    want.append((shift, sum(kj * st for kj, st in zip(kk, sw[2:]))))
            n, cntw, cnth, sd0, sh0, sw0, dqd, dqh, dqw, w0, wsd, wsh, wsw = (int(v) for v in tab[i])
            made = []
            for ti in range(n):  # as the kernel's _tap makes them
                jw, jh, jd = ti % cntw, (ti // cntw) % cnth, ti // cntw // cnth
                made.append(((sd0 - jd * dqd, sh0 - jh * dqh, sw0 - jw * dqw), w0 + jd * wsd + jh * wsh + jw * wsw))
            assert made == want, (k, s, d, p, r)
            made_all += [o for _, o in made]
        assert offsets == made_all


def _matmul_with_tile(monkeypatch, case_id: str, tile):
    """(result, plans): the matmul smoke case through the harness runner under the interpreter with the
    interpreter's tile made `tile` (a CUDA tuner candidate's kind), stale-output and exact checks on."""
    needs_interpreter()
    from cases import select
    from harness import runner
    from harness.registry import find_impl

    case = next(c for c in select("smoke", op="matmul_backward") if c.id == case_id)
    monkeypatch.setattr(_conv, "INTERPRETER_TILE", tile)
    mmb.clear_plans()
    try:
        r = runner.run_case(find_impl("matmul_backward", "triton"), case, "cpu", run_seed=0, oracle="numpy",
                            recheck=True)
        return r, list(mmb._PLANS.values())
    finally:
        mmb.clear_plans()


TMA_CASES = ("matmul[f32,A=16x32,B=32x24]", "matmul[bf16,A=64x96,B=96x80,B:transposed]",
             "matmul[f32,A=4x1x8x16,B=3x16x12]", "matmul[f32,A=16x8,B=5x8x12]", "matmul[bf16,A=16x32,B=32x24]")


@pytest.mark.parametrize("case_id", TMA_CASES)
def test_matmul_tma_interpreted(monkeypatch, case_id):
    """The TMA variant of the one-launch matmul (a tuner candidate on CUDA) against the oracle under
    the interpreter: on-device descriptors, out-of-range tiles read as 0, transposed operands,
    folded batches.  The interpreter's tile is made a TMA tile for the test."""
    r, plans = _matmul_with_tile(monkeypatch, case_id, _conv.Tile(32, 32, 32, 1, 1, 1, tma=True))
    assert r.status == "PASS", (r.status, r.reason)
    kinds = {type(p).__name__ for plan in plans for p in plan.products}
    assert kinds == {"_BothTMA"}, kinds


STAGED_CASES = {"matmul[f32,A=16x32,B=32x24]": True, "matmul[f32,A=4x1x8x16,B=3x16x12]": True,
                "matmul[f32,A=4x1x16x8,B=3x8x12]": True, "matmul[f32,A=16x8,B=5x8x12]": True,
                "matmul[f32,A=33x40,B=40x24,B:transposed]": False, "matmul[f32,A=64x64,B=64x33]": False,
                "matmul[bf16,A=16x32,B=32x24]": False}


@pytest.mark.parametrize("case_id", STAGED_CASES)
def test_matmul_staged_interpreted(monkeypatch, case_id):
    """The staged float32 plan (a tuner candidate on CUDA: da reads transposed copies of dy and b) against
    the oracle under the interpreter, with the stale-output and exact-arithmetic checks (the copies are
    remade every call): folded and broadcast batches.  Where it does not apply (a transposed b, N not a
    multiple of 4, 16 bits) the staged tile plans the unstaged way."""
    r, plans = _matmul_with_tile(monkeypatch, case_id, _conv.Tile(32, 32, 32, 1, 1, 1, stage=True))
    assert r.status == "PASS", (r.status, r.reason)
    kinds = {type(plan).__name__ for plan in plans}
    assert r.recheck == "oracle"
    assert kinds == ({"_Staged"} if STAGED_CASES[case_id] else {"_Plan"}), kinds


def _dgrad_wvec(cin, layout, dtype, groups=1, w_strides=None):
    """The WVEC the dgrad plan gives a 3x3 stride-2 layer of Cin -> 8 channels (meta tensors)."""
    cl = layout == "channels_last"
    w_shape = (8, 3, 3, cin // groups) if cl else (8, cin // groups, 3, 3)
    x_shape = (2, 10, 10, cin) if cl else (2, cin, 10, 10)
    y_shape = (2, 5, 5, 8) if cl else (2, 8, 5, 5)
    dy, w, dx = (torch.empty(s, dtype=dtype, device="meta") for s in (y_shape, w_shape, x_shape))
    if w_strides:
        w = torch.empty_strided(w_shape, w_strides, dtype=dtype, device="meta")
    params = {"stride": [2, 2], "padding": [1, 1], "dilation": [1, 1], "groups": groups, "layout": layout}
    step = cbd._plan(dy, w, dx, params, cl, False, 0).launch
    return dict(zip(step.kernel.arg_names[step.n_tensors:], step.tail))["WVEC"]


def test_dgrad_weight_alignment():
    """dgrad is told its tap weight offsets are 16-byte multiples (WVEC > 1) exactly when they are:
    channels last with Cin/g a multiple of 16 bytes, and so contiguous channels first, which is
    staged to channels last; not a channels-first view read in place (offsets 2 (3 kh + kw))."""
    assert _dgrad_wvec(64, "channels_last", torch.bfloat16) == 8
    assert _dgrad_wvec(16, "channels_last", torch.float32) == 4
    assert _dgrad_wvec(20, "channels_last", torch.bfloat16) == 1   # offsets 20 k: 40-byte steps
    assert _dgrad_wvec(64, "channels_first", torch.bfloat16) == 8  # staged
    assert _dgrad_wvec(64, "channels_first", torch.bfloat16, w_strides=(64 * 18, 18, 6, 2)) == 1


def test_repack_tiles():
    """64 x 64 copies, a side under 64 the power of two that holds it (at least 4), the other side
    taking the freed lanes up to REPACK_TILE elements; the interpreter's 16 x 16 likewise up to 256."""
    assert _conv.repack_tile(256, 3136) == (64, 64)
    assert _conv.repack_tile(50176, 3) == (4, 1024)   # the stem's dx back: C = spatial, S = 3 channels
    assert _conv.repack_tile(3, 50176) == (1024, 4)   # the stem's x to channels last
    assert _conv.repack_tile(64, 9) == (16, 64)       # 3x3 weights: S = the taps
    assert _conv.repack_tile(2, 2) == (4, 4)
    assert _conv.repack_tile(3, 50176, True) == (64, 4)
    assert _conv.repack_tile(40, 40, True) == (16, 16)
    for c in (1, 2, 3, 5, 16, 17, 63, 64, 65, 1000):
        for s_ in (1, 3, 9, 49, 64, 100, 3136):
            bs, bc = _conv.repack_tile(c, s_)
            assert bs * bc <= _conv.REPACK_TILE and bs & (bs - 1) == 0 and bc & (bc - 1) == 0, (c, s_)
            assert bs >= min(64, s_) or bc == max(4, _conv.p2(c)), (c, s_)  # no lanes given up for nothing


def _staging(mod, cin, cout, kernel):
    """The Staging of `mod`'s plan (meta tensors, no launch) for a channels-first stride-1 layer, N=2, 6x5."""
    dy, w, x = (torch.empty(s, dtype=torch.float32, device="meta")
                for s in ((2, cout, 7 - kernel, 6 - kernel), (cout, cin, kernel, kernel), (2, cin, 6, 5)))
    params = {"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1, "layout": "channels_first"}
    args = (dy, w, x) if mod is cbd else (dy, x, w)
    return mod._plan(*args, params, False, False, 0).stage


def test_identity_copies_are_not_staged():
    """A copy between two layouts that are the same memory (C == 1 or S == 1 in Repack(b, c, s)) gets no
    buffer: the operand is used in place (a 1x1 layer's weights; a one-channel input)."""
    st = _staging(cbd, 16, 8, 1)
    assert [r.identity for r in st] == [False, True, False]   # dy, w (1x1), dx
    bufs = st.buffers(*(torch.empty(n) for n in (2 * 8 * 30, 8 * 16, 2 * 16 * 30)))
    assert bufs[1] is None and bufs[0] is not None and bufs[2] is not None
    w = torch.ones(3)
    assert st.operand(1, w, bufs) is w
    st = _staging(cbd, 1, 64, 3)
    assert [r.identity for r in st] == [False, True, True]    # w and dx with one input channel
    st = _staging(cbw, 1, 64, 3)
    assert [r.identity for r in st] == [False, True]          # x with one channel


def test_wgrad_splits_fill_whole_waves():
    """The split never puts a handful of programs into a wave of their own: programs x chunks stays
    within 4 a SM (528 on 132 SMs), rounded down."""
    for programs in (1, 7, 9, 27, 64, 100, 527):
        s_ = cbw.splits_for(programs, 10 ** 8, 32, "cuda", 132)
        assert programs * s_ <= 528 < programs * (s_ + 1), programs
    assert cbw.splits_for(9, 9 * 32 * 8, 32, "cuda", 132) == 9   # chunks of at least 8 steps
    assert cbw.splits_for(600, 10 ** 8, 32, "cuda", 132) == 1


def test_wgrad_finish_adds_every_partial():
    """The finish kernel on its own: 19 partial rows (two full groups of FINISH_SB and a short one) of 300
    weights (two programs, the second masked) give their float64 sum, and the same bits twice."""
    needs_interpreter()
    S, cout, cig = 19, 12, 25
    E = cout * cig
    ws = torch.from_numpy(np.random.default_rng(3).standard_normal(S * E).astype(np.float32))
    outs = []
    for _ in range(2):
        dw = torch.full((cout, cig), float("nan"), dtype=torch.float32)
        grid = (-(-E // cbw.FINISH_BLOCK),)
        cbw._finish_kernel[grid](ws, dw, E, S, cout, cig, 1, 1, cig, 1, 0, 0, 0, BLOCK=cbw.FINISH_BLOCK,
                                 SB=cbw.FINISH_SB, IS_F64=False)
        outs.append(dw)
    want = ws.double().view(S, E).sum(0).view(cout, cig)
    assert torch.allclose(outs[0].double(), want, rtol=1e-6, atol=1e-5), (outs[0].double() - want).abs().max()
    assert torch.equal(outs[0], outs[1])


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    report(CASES, run_case)


def test_wgrad_merged_taps_where_cin_is_small():
    """wgrad's MT (every tap in one GEMM): groups 1, Cin below MT_CIG_MAX, more than one tap, not a
    multiply-add (EW) case; the tile's columns are then the (tap, c) pairs."""
    def geo(cin, cout, kernel=(7, 7), groups=1):
        params = dict(n=2, cin=cin, cout=cout, spatial=[16, 16], kernel=list(kernel), stride=[2, 2], padding=[3, 3],
                      dilation=[1, 1], groups=groups, layout="channels_last")
        g = _conv.geometry3((2, 16, 16, cin), (2, 8, 8, cout), (cout, *kernel, cin // groups), params, True)
        return g

    assert cbw._mt(geo(3, 64))
    assert not cbw._mt(geo(cbw.MT_CIG_MAX, 64))          # a tap's own GEMM fills 16+ columns
    assert not cbw._mt(geo(6, 64, groups=2))              # grouped
    assert not cbw._mt(geo(3, 64, kernel=(1, 1)))         # one tap: nothing to merge
    assert not cbw._mt(geo(3, 8))                         # the multiply-add path (EW)
    assert cbw._fit(_conv.Tile(128, 128, 64, 8, 3), geo(3, 64)).bn == 128  # 147 columns: the full width
