"""layernorm_backward cases: the seed's (16, 64, 2048), llama-size hidden dims, odd N, every affine/bias combination."""
from __future__ import annotations

from itertools import product

from cases.registry import add, strategy
from harness.registry import get_op

OP = "layernorm_backward"
SMOKE, FULL, PERF, STRESS = {"smoke"}, {"full"}, {"full", "perf"}, {"stress"}  # PERF: timed and checked
DTYPES = ("f32", "f16", "bf16", "f64")


def case(shape, dtype="f32", tags=FULL, affine=True, bias=True, **extra):
    params = {"shape": list(shape)}
    if not affine:
        params["affine"] = False
    if not bias:
        params["bias"] = False
    params.update(extra)
    c = add(OP, dtype, tags, **params)
    get_op(OP).validate(c)
    return c


# Tiny (<= 64 elements, finite-difference checked): every affine/bias combination, rank 1-3.
for affine, bias in product((True, False), (True, False)):
    case((3, 5), tags=SMOKE, affine=affine, bias=bias)
    case((2, 2, 6), tags=SMOKE, affine=affine, bias=bias)
case((7,), tags=SMOKE)  # one row, rank 1: mean/rstd are 0-d
case((1, 17), tags=SMOKE)  # M = 1, N prime
case((4, 1), tags=SMOKE)  # N = 1: xhat = 0, dx = dweight = 0, dbias = sum dy
case((3, 8), "f64", tags=SMOKE, eps=1e-3)
case((2, 16), "bf16", tags=SMOKE, affine=False)

# Every dtype at a small and a mid size, with and without affine.
for dtype in DTYPES:
    case((32, 128), dtype, tags=SMOKE)
    case((4, 8, 64), dtype, tags=SMOKE, bias=False)
    case((64, 256), dtype, tags=SMOKE if dtype in ("bf16", "f16") else FULL, affine=False, bias=False)
    case((2, 4096), dtype, tags=SMOKE if dtype == "bf16" else FULL)
    case((16, 64, 2048), dtype, tags=FULL)  # the seed's shape in every dtype

# N not a multiple of 4 or 8 (no vector width divides it), and odd row counts.
for n in (5, 17, 1023):
    case((8, n), tags=SMOKE)
    case((13, n), "bf16", tags=SMOKE if n != 1023 else FULL)
    case((3, n), "f16", tags=FULL, affine=False)
case((5, 1023), "bf16", tags=SMOKE)
case((4096, 16), "bf16", tags=SMOKE)  # dweight, dbias: sums of 4096 rows, where a 16-bit accumulator rounds
case((1, 4096), "bf16", tags=SMOKE)  # M = 1 at llama hidden
case((1, 8192), "f32", tags=FULL)
case((7, 12289), "bf16", tags=FULL)

# Non-contiguous dy and x: transposed (the normalised axis strided) and sliced (stride 2).
for dy_layout, x_layout in [("transposed", "contig"), ("contig", "transposed"), ("sliced", "contig"),
                            ("contig", "sliced"), ("transposed", "sliced")]:
    case((33, 65), tags=SMOKE, dy_layout=dy_layout, x_layout=x_layout)
    case((4, 33, 130), "bf16", tags=FULL, dy_layout=dy_layout, x_layout=x_layout)

# Empty: no rows (dweight and dbias are sums of nothing, 0).
case((0, 8), tags=SMOKE)
case((2, 0, 16), "bf16", tags=SMOKE)

# The seed's layernorm: batch 16, seq 64, hidden 2048, float32 (and as a 2-D M x N).
case((16, 64, 2048), "f32", tags=PERF)
case((1024, 2048), "f32", tags=PERF)

# Llama-family hidden sizes 4096 and 8192 at 2k-8k tokens, bf16 (as training runs them).
for tokens, hidden in product((2048, 4096, 8192), (4096, 8192)):
    case((tokens, hidden), "bf16", tags=PERF if tokens == 2048 else {"perf"})
    case((tokens, hidden), "bf16", tags={"perf"}, bias=False)
case((4, 2048, 4096), "bf16", tags=PERF)
case((2048, 4096), "f32", tags=PERF)
case((2048, 4096), "f16", tags={"perf"})
case((8192, 4096), "bf16", tags={"perf"}, affine=False, bias=False)

# Over 2**31 elements in dy, x and dx: 2**18 + 1 rows of llama-70B's hidden 8192 (the last row
# starts at flat offset 2**31, so a kernel whose row offset row * N is an int32 goes wrong there).
BIG = (262145, 8192)
case(BIG, "bf16", tags=STRESS)


# ----------------------------------------------------------------------------- fuzzing (harness/fuzz.py)

FUZZ_EPS = (None, 1e-5, 1e-3, 0.5)  # None: the op's default


def fuzz_norm_params(draw, tiny: bool) -> dict:
    """shape = leading dims (0-2 of them: M = their product, M = 1 included) + [N], N from 1 up,
    mostly not a multiple of 4 or 8, sometimes wide; sometimes no rows at all; eps; layouts of
    dy and x.  Shared with rmsnorm's strategy."""
    from math import prod

    from hypothesis import strategies as st

    from harness import fuzz

    lead = draw(st.lists(st.integers(1, 3 if tiny else 5), max_size=2))
    n = draw(st.integers(1, 24 if tiny else 70))
    n = fuzz.wide(draw, tiny, prod(lead)) or n
    shape = fuzz.maybe_empty(draw, lead + [n], range(len(lead)))
    params: dict = {"shape": shape}
    eps = draw(st.sampled_from(FUZZ_EPS))
    if eps is not None:
        params["eps"] = eps
    fuzz.set_layouts(draw, params, {"dy_layout": len(shape), "x_layout": len(shape)})
    return params


@strategy(OP)
def fuzz_cases(tiny: bool = False):
    """Norm shape and eps (fuzz_norm_params), weight (affine) and bias present or not."""
    from hypothesis import strategies as st

    from harness import fuzz

    @st.composite
    def draw_case(draw):
        params = fuzz_norm_params(draw, tiny)
        for key in ("affine", "bias"):
            if not draw(st.sampled_from((True, False))):  # True (the default) is the simple side
                params[key] = False
        return fuzz.valid_case(OP, draw(st.sampled_from(fuzz.DTYPES)), params)

    return draw_case()
