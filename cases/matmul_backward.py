"""matmul_backward cases: the seed's 1024^3, llama projections, batch broadcasting, weight layouts, edges."""
from __future__ import annotations

from itertools import product

from cases.registry import add, strategy
from harness.registry import get_op

OP = "matmul_backward"
SMOKE, FULL, PERF, STRESS = {"smoke"}, {"full"}, {"full", "perf"}, {"stress"}  # PERF: timed and checked
DTYPES = ("f32", "f16", "bf16", "f64")


def case(a, b, dtype="f32", tags=FULL, **layouts):
    c = add(OP, dtype, tags, a=list(a), b=list(b), **layouts)
    get_op(OP).validate(c)
    return c


# Tiny (every tensor <= 64 elements, finite-difference checked).
case((2, 3), (3, 4), tags=SMOKE)
case((1, 5), (5, 3), tags=SMOKE)  # M = 1
case((4, 1), (1, 6), tags=SMOKE)  # K = 1: an outer product
case((3, 4), (4, 1), tags=SMOKE)  # N = 1
case((2, 2, 3), (2, 3, 2), tags=SMOKE)  # batched, no broadcast
case((2, 1, 2, 3), (3, 3, 2), tags=SMOKE)  # a (4,1,M,K)-style against b (3,K,N), both broadcast
case((2, 2, 3), (3, 4), tags=SMOKE)  # b unbatched against batched a
case((2, 3), (3, 3, 2), tags=SMOKE)  # a unbatched against batched b
case((1, 2, 3), (4, 3, 2), tags=SMOKE)  # a's batch dim of size 1
case((3, 4), (4, 5), "f64", tags=SMOKE)
case((2, 5), (5, 3), tags=SMOKE, b_layout="transposed")

# Every dtype at a few small sizes.
for dtype in DTYPES:
    case((16, 32), (32, 24), dtype, tags=SMOKE)
    case((4, 1, 8, 16), (3, 16, 12), dtype, tags=SMOKE if dtype in ("f32", "bf16") else FULL)
    case((64, 96), (96, 80), dtype, tags=SMOKE if dtype in ("bf16", "f16") else FULL, b_layout="transposed")
    case((128, 256), (256, 64), dtype, tags=FULL)

# Odd sizes: N not a multiple of 8, odd and prime K, M = 1 (GEMV shapes).
case((64, 64), (64, 33), tags=SMOKE)
case((17, 31), (31, 13), tags=SMOKE)
case((17, 31), (31, 13), "bf16", tags=SMOKE)
case((1, 256), (256, 100), "bf16", tags=SMOKE)
case((1, 4096), (4096, 4096), "bf16", tags=FULL)
case((257, 129), (129, 63), "f16", tags=FULL)
case((3, 1001), (1001, 7), tags=SMOKE)  # long K: float32 accumulation over 1001 terms
case((1000, 3), (3, 5), "bf16", tags=SMOKE)  # long M: db sums 1000 terms

# Batch broadcasting, as training graphs produce it.
case((4, 1, 16, 8), (3, 8, 12), tags=SMOKE)
case((5, 16, 8), (8, 12), "bf16", tags=SMOKE)  # shared weight: db sums over the batch
case((16, 8), (5, 8, 12), tags=SMOKE)
case((2, 3, 16, 8), (1, 3, 8, 12), "f16", tags=FULL)
case((8, 1, 64, 32), (1, 4, 32, 48), "bf16", tags=FULL)
case((8, 128, 64), (64, 96), "bf16", tags=FULL)

# Non-contiguous operands: weights stored (N, K) (b transposed), a transposed, sliced views.
for layouts in ({"b_layout": "transposed"}, {"a_layout": "transposed"}, {"dy_layout": "transposed"},
                {"a_layout": "sliced", "b_layout": "sliced"}, {"dy_layout": "sliced"}):
    case((33, 40), (40, 24), tags=SMOKE, **layouts)
    case((2, 33, 40), (40, 24), "bf16", tags=FULL, **layouts)

# Size-0 dims: K = 0 (nothing to write), M = 0 (db = 0), N = 0 (da = 0), empty batch.
case((3, 0), (0, 4), tags=SMOKE)
case((0, 5), (5, 4), tags=SMOKE)
case((3, 5), (5, 0), tags=SMOKE)
case((0, 3, 5), (5, 4), tags=SMOKE)

# The seed's 1024^3 matmul, float32 and bfloat16.
for dtype in ("f32", "bf16"):
    case((1024, 1024), (1024, 1024), dtype, tags=PERF)
case((1024, 1024), (1024, 1024), "f16", tags=FULL)

# Llama projections at 4096 tokens: q/k/v/o (4096 -> 4096), gate/up (4096 -> 14336) and
# down (14336 -> 4096), weights stored (out, in) as nn.Linear keeps them.
TOKENS = 4096
for k, n in [(4096, 4096), (4096, 14336), (14336, 4096)]:
    case((TOKENS, k), (k, n), "bf16", tags={"perf"}, b_layout="transposed")
    case((TOKENS, k), (k, n), "bf16", tags={"perf"})
case((2, 2048, 4096), (4096, 4096), "bf16", tags={"perf"}, b_layout="transposed")  # (batch, seq, hidden)
case((2048, 4096), (4096, 4096), "bf16", tags=FULL, b_layout="transposed")
case((32, 2048, 128), (32, 128, 2048), "bf16", tags={"perf"})  # batched, attention-score-like


# ----------------------------------------------------------------------------- fuzzing (harness/fuzz.py)


@strategy(OP)
def fuzz_cases(tiny: bool = False):
    """Batch dims of a and b mutually broadcastable (either or both unbatched, size-1 batch
    dims), M, K, N from 1 (M = 1: GEMV), sometimes a wide K (a long reduction) or one of them
    0, layouts of a, b and dy."""
    from math import prod

    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp

    from harness import fuzz

    @st.composite
    def draw_case(draw):
        batch = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=2 if tiny else 3,
                                                       max_side=3))
        top = 4 if tiny else 9
        m, k, n = draw(st.integers(1, top)), draw(st.integers(1, top)), draw(st.integers(1, top))
        k = fuzz.wide(draw, tiny, prod(batch.result_shape) * max(m, n)) or k
        empty = draw(st.sampled_from((None, "m", "k", "n")))
        m, k, n = (0 if empty == name else v for name, v in (("m", m), ("k", k), ("n", n)))
        batch_a, batch_b = (list(s) for s in batch.input_shapes)
        params = {"a": batch_a + [m, k], "b": batch_b + [k, n]}
        fuzz.set_layouts(draw, params, {"a_layout": 2, "b_layout": 2, "dy_layout": 2})
        return fuzz.valid_case(OP, draw(st.sampled_from(fuzz.DTYPES)), params)

    return draw_case()
