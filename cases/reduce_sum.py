"""reduce_sum cases: the seed's 32M-float sum, every axis pattern, sum_to_shape as autograd uses it, edges."""
from __future__ import annotations

from itertools import product

from cases.registry import add, strategy
from harness.registry import get_op

OP = "reduce_sum"
SMOKE, FULL, PERF, STRESS = {"smoke"}, {"full"}, {"full", "perf"}, {"stress"}  # PERF: timed and checked


def axes(shape, ax, dtype="f32", tags=FULL, keepdim=False, layout="contig"):
    """Sum over `ax` (None: all axes)."""
    params = {"shape": list(shape), "axes": None if ax is None else list(ax)}
    if keepdim:
        params["keepdim"] = True
    if layout != "contig":
        params["x_layout"] = layout
    return _add(dtype, tags, params)


def to(shape, target, dtype="f32", tags=FULL, layout="contig"):
    """sum_to_shape form."""
    params = {"shape": list(shape), "target": list(target)}
    if layout != "contig":
        params["x_layout"] = layout
    return _add(dtype, tags, params)


def _add(dtype, tags, params):
    case = add(OP, dtype, tags, **params)
    get_op(OP).validate(case)
    return case


R3 = (5, 6, 7)
# Tiny (<= 64 elements, finite-difference checked): all / inner / outer / middle / several axes.
for ax, keep in product([None, (0,), (1,), (-1,), (0, 2), (-3, -1)], (False, True)):
    axes((3, 4, 5), ax, tags=SMOKE if not keep or ax in (None, (1,), (-3, -1)) else FULL, keepdim=keep)
axes((3, 4, 5), (), tags=SMOKE)  # reduces nothing (torch's sum(dim=[]) would reduce everything)
for target in [(5,), (4, 5), (3, 1, 5), (1, 4, 1), (4, 1), (1, 1, 1), ()]:
    to((3, 4, 5), target, tags=SMOKE)

# Every axis pattern of a rank-3 shape, in every dtype, both keepdims.
for ax, dtype in product([None, (0,), (1,), (2,), (0, 1), (1, 2), (0, 2)], ("f32", "f16", "bf16", "f64")):
    # One output element in bf16/f16 (axes=all): zeros would pass by chance in a few % of seeds
    # (|sum| below 8*u_in*s), so those stay out of the smoke set the zeros test runs on.
    smoke = dtype == "f32" or ax in ((1,), (0, 2)) or (dtype, ax) == ("f64", None)
    axes(R3, ax, dtype, tags=SMOKE if smoke else FULL)
    axes(R3, ax, dtype, tags=FULL, keepdim=True)
for ax in [(-1,), (-2,), (0, -1), (-3, -2, -1)]:
    axes(R3, ax, tags=FULL)

# sum_to_shape as autograd uses it: bias, per-sequence, per-token, per-feature-group gradients.
for target, dtype in product([(7,), (5, 1, 7), (1, 6, 1), (6, 7), (5, 6, 1)], ("f32", "bf16", "f16", "f64")):
    to(R3, target, dtype, tags=SMOKE if dtype == "f32" or (dtype == "bf16" and len(target) < 3) else FULL)

# Non-contiguous x: transposed (last two dims swapped in memory) and sliced (stride 2).
for layout in ("transposed", "sliced"):
    for ax in [(0,), (-1,), None]:
        axes((33, 65), ax, tags=SMOKE if ax else FULL, layout=layout)
    to((4, 33, 65), (65,), tags=SMOKE, layout=layout)
    to((4, 33, 65), (4, 1, 65), "bf16", tags=FULL, layout=layout)
    axes((8, 128, 96), (0, 1), "bf16", tags=FULL, layout=layout)

# Size-1 and size-0 dims, M = 1, rank 0 and 1.
axes((1, 5, 1), None, tags=SMOKE)
axes((1, 5, 1), (0, 2), tags=SMOKE)
axes((1, 1024), (0,), tags=SMOKE)
axes((1, 1024), (1,), tags=SMOKE)  # one output element: kept float32, where zeros cannot pass by chance
axes((1024, 1), (0,), tags=SMOKE)
axes((1, 1024, 3), (1,), "bf16", tags=SMOKE)
to((1, 5), (5,), tags=SMOKE)
axes((), None, tags=SMOKE)
axes((7,), None, tags=SMOKE)
axes((0, 5), (0,), tags=SMOKE)  # a sum over an empty axis: y = 0
axes((3, 0), (0,), tags=SMOKE)  # nothing to write
axes((0, 5), None, tags=SMOKE, keepdim=True)
to((2, 0, 3), (1, 3), tags=SMOKE)
to((0, 4), (4,), tags=SMOKE)

# Odd and prime sizes: no vector width or block size divides them.
axes((7, 13), (0,), tags=SMOKE)
axes((7, 13), (1,), "bf16", tags=SMOKE)
axes((17, 31, 3), (0, 2), tags=FULL)
axes((1021,), None, "f16", tags=FULL)
axes((257, 129), (0,), "bf16", tags=FULL)
axes((257, 129), (1,), "bf16", tags=FULL)
axes((1000003,), None, tags=FULL)
to((3, 257, 129), (257, 1), tags=FULL)

# An uneven tail past whole blocks (1000 = 3 * 256 + 232): a block loop without its tail drops 232 terms.
axes((5, 1000), (1,), tags=SMOKE)

# Long reductions at smoke size: float32 accumulation of ~10**4 low-precision terms.
axes((16384, 4), (0,), "bf16", tags=SMOKE)
axes((4, 16384), (1,), "f16", tags=SMOKE)

# The seed's sum over 32*1024*1024 floats, flat and as (32, 1024, 1024).
SEED = 32 * 1024 * 1024
for dtype in ("f32", "bf16"):
    axes((SEED,), None, dtype, tags=PERF)
axes((32, 1024, 1024), None, tags=FULL)
axes((32, 1024, 1024), (1, 2), tags=FULL)

# Llama-style training shapes: the gradient of a bias (4096,), a per-sequence (8, 1, 4096)
# and a per-token (8, 2048, 1) operand, and row/column sums of the (tokens, hidden) matrix.
LLAMA = (8, 2048, 4096)
for dtype in ("bf16", "f32"):
    for target in [(4096,), (8, 1, 4096), (8, 2048, 1), (1, 2048, 4096)]:
        to(LLAMA, target, dtype, tags=PERF)
    axes(LLAMA, (0, 1), dtype, tags=PERF)
    axes(LLAMA, (-1,), dtype, tags=PERF)
    axes(LLAMA, (-1,), dtype, tags=FULL, keepdim=True)
    axes((16384, 4096), (0,), dtype, tags=PERF)
    axes((16384, 4096), (1,), dtype, tags={"perf"})
to(LLAMA, (4096,), "f16", tags={"perf"})
to(LLAMA, (4096,), "bf16", tags={"perf"}, layout="transposed")

# Over 2**31 elements in x: every offset needs int64.
BIG = (2049, 1 << 20)
for ax in [(0,), (1,)]:
    axes(BIG, ax, "bf16", tags=STRESS)
to(BIG, (1 << 20,), "bf16", tags=STRESS)


# ----------------------------------------------------------------------------- fuzzing (harness/fuzz.py)


@strategy(OP)
def fuzz_cases(tiny: bool = False):
    """x of rank 0-4 (sometimes a wide or a size-0 dim); the axes form (all, or a set of axes,
    some written negative; keepdim) or the sum_to_shape form (drop leading dims, keep or
    collapse each remaining one to 1); a layout for x."""
    from math import prod

    from hypothesis import strategies as st

    from harness import fuzz

    @st.composite
    def draw_case(draw):
        shape = draw(st.lists(st.integers(1, 4 if tiny else 7), max_size=3 if tiny else 4))
        if shape:
            i = draw(st.integers(0, len(shape) - 1))
            shape[i] = fuzz.wide(draw, tiny, prod(shape) // shape[i]) or shape[i]
        shape = fuzz.maybe_empty(draw, shape, range(len(shape)))
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
        fuzz.set_layouts(draw, params, {"x_layout": rank})
        return fuzz.valid_case(OP, draw(st.sampled_from(fuzz.DTYPES)), params)

    return draw_case()
