"""rmsnorm_backward cases: llama-family hidden sizes and token counts, odd N, layouts, edges."""
from __future__ import annotations

from itertools import product

from cases.layernorm_backward import fuzz_norm_params
from cases.registry import add, strategy
from harness.registry import get_op

OP = "rmsnorm_backward"
SMOKE, FULL, PERF, STRESS = {"smoke"}, {"full"}, {"full", "perf"}, {"stress"}  # PERF: timed and checked
DTYPES = ("f32", "f16", "bf16", "f64")


def case(shape, dtype="f32", tags=FULL, **extra):
    c = add(OP, dtype, tags, shape=list(shape), **extra)
    get_op(OP).validate(c)
    return c


# Tiny (<= 64 elements, finite-difference checked), rank 1-3.
case((3, 5), tags=SMOKE)
case((2, 2, 6), tags=SMOKE)
case((7,), tags=SMOKE)  # one row, rank 1: rstd is 0-d
case((1, 17), tags=SMOKE)  # M = 1, N prime
case((6, 1), tags=SMOKE)  # N = 1
case((3, 8), "f64", tags=SMOKE, eps=1e-3)
case((2, 16), "bf16", tags=SMOKE)
case((4, 4), "f16", tags=SMOKE, eps=1e-5)

# Every dtype at a small and a mid size.
for dtype in DTYPES:
    case((32, 128), dtype, tags=SMOKE)
    case((4, 8, 64), dtype, tags=SMOKE)
    case((2, 4096), dtype, tags=SMOKE if dtype == "bf16" else FULL)
    case((16, 64, 2048), dtype, tags=FULL)

# N not a multiple of 4 or 8, and odd row counts.
for n in (5, 17, 1023):
    case((8, n), tags=SMOKE)
    case((13, n), "bf16", tags=SMOKE if n != 1023 else FULL)
    case((3, n), "f16", tags=FULL)
case((5, 1023), "bf16", tags=SMOKE)
case((1, 4096), "bf16", tags=SMOKE)  # M = 1 at llama hidden
case((1, 8192), "f32", tags=FULL)
case((7, 12289), "bf16", tags=FULL)
case((256, 64), "bf16", tags=SMOKE)  # dweight: a sum over 256 rows
case((4096, 16), "bf16", tags=SMOKE)  # dweight: a sum of 4096 rows, where a 16-bit accumulator rounds

# Non-contiguous dy and x: transposed (the normalised axis strided) and sliced (stride 2).
for dy_layout, x_layout in [("transposed", "contig"), ("contig", "transposed"), ("sliced", "contig"),
                            ("contig", "sliced"), ("transposed", "sliced")]:
    case((33, 65), tags=SMOKE, dy_layout=dy_layout, x_layout=x_layout)
    case((4, 33, 130), "bf16", tags=FULL, dy_layout=dy_layout, x_layout=x_layout)

# Empty: no rows (dweight is a sum of nothing, 0).
case((0, 8), tags=SMOKE)
case((2, 0, 16), "bf16", tags=SMOKE)

# Llama-family: hidden 4096 (7B/8B) and 8192 (70B) at 2k-8k tokens, bf16, llama's eps.
for tokens, hidden in product((2048, 4096, 8192), (4096, 8192)):
    case((tokens, hidden), "bf16", tags=PERF if tokens == 2048 else {"perf"}, eps=1e-5)
case((4, 2048, 4096), "bf16", tags=PERF, eps=1e-5)
case((2048, 4096), "f32", tags=PERF)
case((2048, 4096), "f16", tags={"perf"})
case((1024, 2048), "f32", tags=PERF)

# Over 2**31 elements in dy, x and dx: 2**18 + 1 rows of llama-70B's hidden 8192 (the last row
# starts at flat offset 2**31, so a kernel whose row offset row * N is an int32 goes wrong there).
BIG = (262145, 8192)
case(BIG, "bf16", tags=STRESS, eps=1e-5)


# ----------------------------------------------------------------------------- fuzzing (harness/fuzz.py)


@strategy(OP)
def fuzz_cases(tiny: bool = False):
    """Norm shape and eps (cases.layernorm_backward.fuzz_norm_params)."""
    from hypothesis import strategies as st

    from harness import fuzz

    @st.composite
    def draw_case(draw):
        return fuzz.valid_case(OP, draw(st.sampled_from(fuzz.DTYPES)), fuzz_norm_params(draw, tiny))

    return draw_case()
