"""Fuzzing with shrinking: hypothesis strategies that build a valid `Case` of every op.

    cases(op, tiny=False)        a strategy of Cases of `op` (each passes the op's validate and
                                 survives Case.to_json / from_json with the same id)
    check(impl, case, device)    run_case; raise AssertionError (report + repro line) unless PASS
    fuzz_settings(profile, n)    hypothesis settings: 'ci' (derandomized) or 'deep' (random)

Every strategy is built from integers, booleans and sampled_from, whose first choice is the
simplest (f32, fn add, contiguous, defaults), so hypothesis shrinks a failure toward a small,
plain case: fewer dims, sizes 1, the default of every flag the failure does not need.  Sizes
stay small (an example runs in milliseconds on a CPU), except that one dim is sometimes wide
(up to 8193, at most MAX_ELEMENTS in all) so that kernels' block tails, vector widths and
work splitting run too; `tiny=True` never widens and shrinks sizes further, for slow
implementations (Triton's interpreter).  Optional params are written only when they
differ from the op's default, so a shrunk case's JSON is as short as a registry case's.
"""
from __future__ import annotations

from math import prod

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cases.registry import Case
from harness.registry import get_op

DTYPES = ("f32", "f64", "f16", "bf16")  # f32 first: shrinking moves toward it
FNS = ("add", "sub", "mul", "div", "pow", "maximum", "minimum")  # oracle.binary_backward.FNS, simplest first
SOURCE = "fuzz"
WIDE = 8193  # a wide dim's largest size (one case in five has one)
MAX_ELEMENTS = 1 << 17  # a widened case's largest tensor stays under this


def _case(op: str, dtype: str, params: dict) -> Case:
    """A Case checked by its op's validate, so a strategy bug fails where it is made."""
    case = Case(op, dtype, params, frozenset(), SOURCE)
    get_op(op).validate(case)
    return case


def _layout(draw, rank: int) -> str:
    """contig, sliced (rank >= 1: stride 2 on the last dim) or transposed (rank >= 2)."""
    options = ("contig",) + (("sliced",) if rank >= 1 else ()) + (("transposed",) if rank >= 2 else ())
    return draw(st.sampled_from(options))


def _set_layouts(draw, params: dict, ranks: dict) -> None:
    """Add each `<key>: layout` whose drawn layout is not contig (the default)."""
    for key, rank in ranks.items():
        layout = _layout(draw, rank)
        if layout != "contig":
            params[key] = layout


def _wide(draw, tiny: bool, others: int = 1) -> int | None:
    """None (usually), or a wide size for one dim: 2 to WIDE, capped so that with `others`
    elements in the other dims the tensor stays under MAX_ELEMENTS.  An integer range, not a
    list of sizes, so that a failure found wide shrinks its size smoothly down toward 2."""
    if tiny or draw(st.integers(0, 4)) < 4:  # shrinks to 0: not wide
        return None
    return draw(st.integers(2, max(2, min(WIDE, MAX_ELEMENTS // max(others, 1)))))


def _maybe_empty(draw, shape: list[int], dims: range) -> list[int]:
    """Sometimes set one of `dims` to 0 (size-0 edges); shrinks to not doing it."""
    if dims and draw(st.booleans()):
        shape = list(shape)
        shape[draw(st.sampled_from(list(dims)))] = 0
    return shape


# ----------------------------------------------------------------------------- binary_backward


def _resize_broadcast_dim(a: list[int], b: list[int], back: int, size: int) -> tuple[list[int], list[int]]:
    """Make the result dim `back` (counted from the right, 1 = last) `size`, keeping a and b
    broadcastable: each operand that has the dim and is not 1 there gets `size`; if both are 1
    (or lack it), the first that has it gets `size` and the other broadcasts along it."""
    a, b = list(a), list(b)
    owners = [s for s in (a, b) if len(s) >= back]
    changed = False
    for s in owners:
        if s[-back] != 1:
            s[-back], changed = size, True
    if not changed:
        owners[0][-back] = size
    return a, b


@st.composite
def binary_cases(draw, tiny: bool = False) -> Case:
    """binary_backward: fn, dtype, two mutually broadcastable shapes (ranks 0-4, either side
    broadcast, rank mismatch, sometimes a wide last dim or a size-0 dim), and a layout for a,
    b and grad_out."""
    fn = draw(st.sampled_from(FNS))
    dtype = draw(st.sampled_from(DTYPES))
    shapes = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3 if tiny else 4,
                                                    max_side=3 if tiny else 5))
    a, b = (list(s) for s in shapes.input_shapes)
    out = shapes.result_shape
    rank = len(out)
    if rank:
        # Only the last dim widens: its position then survives the shrinker dropping other
        # dims (a drawn position would point at another dim and lose the failure).
        wide = _wide(draw, tiny, prod(out[:-1]))
        if wide:
            a, b = _resize_broadcast_dim(a, b, 1, wide)
        if draw(st.booleans()):
            a, b = _resize_broadcast_dim(a, b, draw(st.integers(1, rank)), 0)
    params = {"fn": fn, "a": a, "b": b}
    _set_layouts(draw, params, {"a_layout": len(a), "b_layout": len(b), "g_layout": rank})
    return _case("binary_backward", dtype, params)


# ----------------------------------------------------------------------------- reduce_sum


@st.composite
def reduce_sum_cases(draw, tiny: bool = False) -> Case:
    """reduce_sum: x of rank 0-4 (sometimes a wide or a size-0 dim); the axes form (all, or a
    set of axes, some written negative; keepdim) or the sum_to_shape form (drop leading dims,
    keep or collapse each remaining one to 1); a layout for x."""
    shape = draw(st.lists(st.integers(1, 4 if tiny else 7), max_size=3 if tiny else 4))
    if shape:
        i = draw(st.integers(0, len(shape) - 1))
        shape[i] = _wide(draw, tiny, prod(shape) // shape[i]) or shape[i]
    shape = _maybe_empty(draw, shape, range(len(shape)))
    rank = len(shape)
    params: dict = {"shape": shape}
    if draw(st.sampled_from(("axes", "target"))) == "axes":
        if draw(st.booleans()):
            axes = draw(st.lists(st.integers(0, rank - 1), unique=True, max_size=rank)) if rank else []
            params["axes"] = [a - rank if draw(st.booleans()) else a for a in axes]
        else:
            params["axes"] = None  # every axis
        if draw(st.booleans()):
            params["keepdim"] = True
    else:
        lead = draw(st.integers(0, rank))
        params["target"] = [1 if draw(st.booleans()) else n for n in shape[lead:]]
    _set_layouts(draw, params, {"x_layout": rank})
    return _case("reduce_sum", draw(st.sampled_from(DTYPES)), params)


# ----------------------------------------------------------------------------- layernorm / rmsnorm

EPS = (None, 1e-5, 1e-3, 0.5)  # None: the op's default


def _norm_params(draw, tiny: bool) -> dict:
    """shape = leading dims (0-2 of them: M = their product, M = 1 included) + [N], N from 1 up,
    mostly not a multiple of 4 or 8, sometimes wide; sometimes no rows at all; eps; layouts of
    dy and x."""
    lead = draw(st.lists(st.integers(1, 3 if tiny else 5), max_size=2))
    n = draw(st.integers(1, 24 if tiny else 70))
    n = _wide(draw, tiny, prod(lead)) or n
    shape = _maybe_empty(draw, lead + [n], range(len(lead)))
    params: dict = {"shape": shape}
    eps = draw(st.sampled_from(EPS))
    if eps is not None:
        params["eps"] = eps
    _set_layouts(draw, params, {"dy_layout": len(shape), "x_layout": len(shape)})
    return params


@st.composite
def layernorm_cases(draw, tiny: bool = False) -> Case:
    """layernorm_backward: norm shape and eps, weight (affine) and bias present or not."""
    params = _norm_params(draw, tiny)
    for key in ("affine", "bias"):
        if not draw(st.sampled_from((True, False))):  # True (the default) is the simple side
            params[key] = False
    return _case("layernorm_backward", draw(st.sampled_from(DTYPES)), params)


@st.composite
def rmsnorm_cases(draw, tiny: bool = False) -> Case:
    """rmsnorm_backward: norm shape and eps."""
    return _case("rmsnorm_backward", draw(st.sampled_from(DTYPES)), _norm_params(draw, tiny))


# ----------------------------------------------------------------------------- attention_backward


def _window_side(draw, longest: int) -> int:
    """-1 (unbounded, the simple side) or 0..longest: 0 and small values against Sq != Sk leave
    whole query rows without a key."""
    return draw(st.one_of(st.just(-1), st.integers(0, longest)))


@st.composite
def attention_cases(draw, tiny: bool = False) -> Case:
    """attention_backward: B, Sq and Sk drawn independently (Sq != Sk both ways, Sq = 1
    decoding, sometimes a wide Sk: a long cache), GQA/MQA as Hkv kv heads times a group of
    1-3, head dim 1-16 or 32/64, causal, a window [left, right] (sides -1 or 0..max(Sq, Sk),
    so some mask whole rows), softcap, an explicit softmax scale and a larger score spread
    (a peaked softmax)."""
    big = 5 if tiny else 12
    b = draw(st.integers(1, 2))
    sq, sk = draw(st.integers(1, big)), draw(st.integers(1, big))
    hkv, group = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    d = draw(st.one_of(st.integers(1, 8 if tiny else 16), st.sampled_from((32, 64))))
    sk = _wide(draw, tiny, b * sq * hkv * group * max(d, 8)) or sk  # the scores are B*Hq*Sq*Sk
    params: dict = {"B": b, "Sq": sq, "Sk": sk, "Hq": hkv * group, "Hkv": hkv, "D": d}
    if draw(st.booleans()):
        params["causal"] = True
    window = [_window_side(draw, max(sq, sk)), _window_side(draw, max(sq, sk))]
    if window != [-1, -1]:
        params["window"] = window
    softcap = draw(st.sampled_from((0.0, 1.0, 5.0, 30.0)))
    if softcap:
        params["softcap"] = softcap
    scale = draw(st.sampled_from((None, 0.3, 1.0)))
    if scale is not None:
        params["softmax_scale"] = scale
    score_std = draw(st.sampled_from((None, 4.0)))
    if score_std is not None:
        params["score_std"] = score_std
    return _case("attention_backward", draw(st.sampled_from(DTYPES)), params)


# ----------------------------------------------------------------------------- conv


def _conv_params(draw, tiny: bool, layout_keys: tuple[str, str]) -> dict:
    """A valid geometry: rank 1-3; groups 1-3 with 1-3 channels per group on each side (1 in
    is depthwise); per dim kernel, stride (above the kernel too), padding (above kernel/2
    too), dilation, and an input size from the smallest the dilated kernel allows upward
    (so the output size is >= 1: valid by construction, and shrinking keeps it valid); in 1D
    sometimes a wide signal."""
    rank = draw(st.integers(1, 3))
    small = tiny or rank == 3
    groups, cig, cog = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dims = []  # per spatial dim: (input size, kernel, stride, padding, dilation)
    for _ in range(rank):
        k = draw(st.integers(1, 3 if small else 4))
        s, p, dil = draw(st.integers(1, 4)), draw(st.integers(0, 3)), draw(st.integers(1, 3))
        extra = draw(st.integers(0, 3 if small else 6))
        if rank == 1:
            extra = _wide(draw, tiny, 9 * 3 * 4) or extra  # N * channels * kernel at most
        dims.append((max(1, dil * (k - 1) + 1 - 2 * p) + extra, k, s, p, dil))
    spatial, kernel, stride, padding, dilation = (list(v) for v in zip(*dims))
    params = {"n": draw(st.integers(1, 2)), "cin": groups * cig, "cout": groups * cog, "spatial": spatial,
              "kernel": kernel, "stride": stride, "padding": padding, "dilation": dilation, "groups": groups,
              "layout": draw(st.sampled_from(("channels_first", "channels_last")))}
    _set_layouts(draw, params, {key: rank + 2 for key in layout_keys})  # every conv tensor has rank >= 3
    return params


@st.composite
def conv_data_cases(draw, tiny: bool = False) -> Case:
    """conv_backward_data: a geometry (see _conv_params), layouts of dy and w."""
    params = _conv_params(draw, tiny, ("dy_layout", "w_layout"))
    return _case("conv_backward_data", draw(st.sampled_from(DTYPES)), params)


@st.composite
def conv_weight_cases(draw, tiny: bool = False) -> Case:
    """conv_backward_weight: a geometry (see _conv_params), layouts of dy and x."""
    params = _conv_params(draw, tiny, ("dy_layout", "x_layout"))
    return _case("conv_backward_weight", draw(st.sampled_from(DTYPES)), params)


# ----------------------------------------------------------------------------- matmul_backward


@st.composite
def matmul_cases(draw, tiny: bool = False) -> Case:
    """matmul_backward: batch dims of a and b mutually broadcastable (either or both
    unbatched, size-1 batch dims), M, K, N from 1 (M = 1: GEMV), sometimes a wide K (a long
    reduction) or one of them 0, layouts of a, b and dy."""
    batch = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=2 if tiny else 3,
                                                   max_side=3))
    top = 4 if tiny else 9
    m, k, n = draw(st.integers(1, top)), draw(st.integers(1, top)), draw(st.integers(1, top))
    k = _wide(draw, tiny, prod(batch.result_shape) * max(m, n)) or k
    empty = draw(st.sampled_from((None, "m", "k", "n")))
    m, k, n = (0 if empty == name else v for name, v in (("m", m), ("k", k), ("n", n)))
    batch_a, batch_b = (list(s) for s in batch.input_shapes)
    params = {"a": batch_a + [m, k], "b": batch_b + [k, n]}
    _set_layouts(draw, params, {"a_layout": 2, "b_layout": 2, "dy_layout": 2})
    return _case("matmul_backward", draw(st.sampled_from(DTYPES)), params)


# ----------------------------------------------------------------------------- registry of strategies

STRATEGIES = {
    "binary_backward": binary_cases,
    "reduce_sum": reduce_sum_cases,
    "layernorm_backward": layernorm_cases,
    "rmsnorm_backward": rmsnorm_cases,
    "attention_backward": attention_cases,
    "conv_backward_data": conv_data_cases,
    "conv_backward_weight": conv_weight_cases,
    "matmul_backward": matmul_cases,
}


def cases(op: str, tiny: bool = False) -> st.SearchStrategy:
    """The strategy of valid Cases of `op`; KeyError naming the ops that have one."""
    if op not in STRATEGIES:
        raise KeyError(f"no fuzz strategy for op {op!r}: have {', '.join(sorted(STRATEGIES))}")
    return STRATEGIES[op](tiny=tiny)


# ----------------------------------------------------------------------------- running and settings


def check(impl, case: Case, device: str, run_seed: int = 0):
    """run_case(impl, case); return the result if it PASSes (or SKIPs: the caller decides).

    Otherwise raise AssertionError whose message is the result's report followed by the
    one-line `python -m harness run ... --case '<json>'` command that reproduces it.  An
    exception escaping run_case (a crash the runner does not catch) is reported the same
    way, so hypothesis shrinks crashes too and the repro line is never lost.
    """
    from harness.runner import repro_command, run_case

    try:
        result = run_case(impl, case, device, run_seed)
    except Exception as exc:  # noqa: BLE001 - any crash is a finding, with its repro line
        raise AssertionError(f"{case.op} {impl.id} {case.id} [{device}, seed={run_seed}]: CRASH "
                             f"{type(exc).__name__}: {exc}\n  reproduce: "
                             f"{repro_command(impl, case, run_seed, device)}") from exc
    if result.status not in ("PASS", "SKIP"):
        report = result.report()
        if "reproduce:" not in report:
            report += f"\n  reproduce: {result.repro}"
        raise AssertionError(report)
    return result


def repro_line(message: str) -> str:
    """The `python -m harness run ...` command in a check() failure message."""
    for line in message.splitlines():
        if line.strip().startswith("reproduce:"):
            return line.split("reproduce:", 1)[1].strip()
    raise ValueError(f"no 'reproduce:' line in {message!r}")


PROFILES = {
    # CI: the same examples every run (no randomness, no example database written to the tree).
    "ci": dict(derandomize=True, database=None),
    # Asked for (pytest -m fuzz, --fuzz-examples): fresh random examples each run.
    "deep": dict(derandomize=False, database=None),
}
_COMMON = dict(deadline=None,  # XLA compiles and the Triton interpreter vary far beyond any deadline
               print_blob=False,  # the repro line, not a hypothesis blob, is how a failure is replayed
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much])
for _name, _values in PROFILES.items():
    settings.register_profile(f"gradoracle-{_name}", **_values, **_COMMON)


def fuzz_settings(profile: str, max_examples: int, **overrides) -> settings:
    """The registered gradoracle-<profile> settings with `max_examples` (and any overrides)."""
    return settings(settings.get_profile(f"gradoracle-{profile}"), max_examples=max_examples, **overrides)
