"""binary_backward cases: the seed compare's shapes, every broadcast mask, training shapes and edges."""
from __future__ import annotations

from itertools import product

from cases.registry import add, strategy
from oracle.binary_backward import FNS

OP = "binary_backward"
SMOKE, FULL, PERF, STRESS = {"smoke"}, {"full"}, {"full", "perf"}, {"stress"}  # PERF: timed and checked
R4 = (2, 3, 4, 5)


def case(fn, a, b, dtype="f32", tags=FULL, **layouts):
    return add(OP, dtype, tags, fn=fn, a=list(a), b=list(b), **layouts)


def masked(shape, mask):
    """`shape` with the dims whose bit is set in `mask` replaced by 1 (bit 0 = last dim)."""
    r = len(shape)
    return tuple(1 if mask >> (r - 1 - d) & 1 else n for d, n in enumerate(shape))


# The seed compare program's shapes, verbatim: A=2x3x4x5 with B broadcast five ways.
SEED_B = [(2, 3, 4, 5), (1, 1, 4, 5), (2, 3, 4, 1), (1, 1, 1), (1, 3, 1, 5)]
for fn, b in product(FNS, SEED_B):
    case(fn, R4, b, tags=SMOKE)
# ... and the mirror image the seed never tried: A broadcast against a full B.
for fn, a in product(FNS, SEED_B[1:]):
    case(fn, a, R4, tags=SMOKE)

# Every broadcast mask of B, of A, and of both, on a rank-4 shape.
for mask in range(16):
    case("mul", R4, masked(R4, mask), tags=SMOKE)
    case("mul", masked(R4, mask), R4, tags=SMOKE)
for fn, ma, mb in product(("mul", "div", "maximum"), range(16), range(16)):
    case(fn, masked(R4, ma), masked(R4, mb), tags=FULL)
for fn, mask, dtype in product(FNS, range(16), ("f16", "bf16", "f64")):
    case(fn, R4, masked(R4, mask), dtype, tags=FULL)

# Both broadcast at once, in every dtype.
for fn, dtype in product(FNS, ("f32", "f16", "bf16", "f64")):
    case(fn, (3, 1, 5), (1, 4, 5), dtype, tags=SMOKE)

# 0-d scalars, rank mismatch, size-1 and size-0 dims.
for fn in ("mul", "div", "pow"):
    case(fn, (), (3, 4), tags=SMOKE)
    case(fn, (3, 4), (), tags=SMOKE)
    case(fn, (), (), tags=SMOKE)
    case(fn, R4, (5,), tags=SMOKE)
    case(fn, (5,), R4, tags=SMOKE)
    case(fn, (4, 1), (1,), tags=SMOKE)
for fn in ("mul", "maximum"):
    case(fn, (0, 5), (5,), tags=SMOKE)
    case(fn, (1, 5), (0, 5), tags=SMOKE)
    case(fn, (2, 0, 3), (2, 1, 3), tags=SMOKE)
    case(fn, (0,), (), tags=SMOKE)

# Odd and prime sizes: no vector width or block size divides them.
for fn in FNS:
    case(fn, (7, 13), (13,), tags=SMOKE)
    case(fn, (17, 1, 31), (1, 19, 31), tags=FULL)
    case(fn, (1021,), (1,), tags=FULL)
    case(fn, (3, 257, 129), (3, 257, 1), tags=FULL)
    case(fn, (1000003,), (1000003,), tags=FULL)

# Non-contiguous operands: transposed and sliced views of a, b and grad_out.
for fn, (a, b) in product(("mul", "div", "maximum", "pow"), [(R4, R4), (R4, (1, 3, 1, 5)), ((2, 1, 4, 5), (1, 3, 4, 5))]):
    case(fn, a, b, tags=SMOKE, a_layout="transposed")
    case(fn, a, b, tags=SMOKE, b_layout="sliced")
    case(fn, a, b, tags=SMOKE, g_layout="transposed")
    case(fn, a, b, tags=FULL, a_layout="sliced", b_layout="transposed", g_layout="sliced")
for dtype in ("f16", "bf16", "f64"):
    case("mul", (33, 65), (33, 1), dtype, tags=SMOKE, a_layout="transposed", g_layout="sliced")

# Llama-style training shapes: activations (8, 2048, 4096) against a weight, a per-token
# and a per-sequence operand, and the no-broadcast elementwise case.
LLAMA = (8, 2048, 4096)
for fn, dtype in product(("mul", "add", "div", "maximum"), ("bf16", "f32")):
    for b in [(4096,), (8, 1, 4096), (8, 2048, 1), LLAMA]:
        case(fn, LLAMA, b, dtype, tags=PERF if fn == "mul" else {"perf"})
for dtype in ("bf16", "f16", "f32"):
    case("mul", (8, 1, 4096), LLAMA, dtype, tags={"perf"})
    case("mul", (1, 2048, 4096), (8, 2048, 1), dtype, tags={"perf"})

# Over 2**31 elements in grad_out: every offset needs int64.
BIG = (2049, 1 << 20)
for b in [(1 << 20,), (2049, 1), BIG]:
    case("mul", BIG, b, "bf16", tags=STRESS)


# ----------------------------------------------------------------------------- fuzzing (harness/fuzz.py)


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


@strategy(OP)
def fuzz_cases(tiny: bool = False):
    """fn (simplest first), dtype, two mutually broadcastable shapes (ranks 0-4, either side
    broadcast, rank mismatch, sometimes a wide last dim or a size-0 dim), and a layout for a,
    b and grad_out."""
    from math import prod

    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp

    from harness import fuzz

    @st.composite
    def draw_case(draw):
        fn = draw(st.sampled_from(FNS))
        dtype = draw(st.sampled_from(fuzz.DTYPES))
        shapes = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3 if tiny else 4,
                                                        max_side=3 if tiny else 5))
        a, b = (list(s) for s in shapes.input_shapes)
        out = shapes.result_shape
        rank = len(out)
        if rank:
            # Only the last dim widens: its position then survives the shrinker dropping other
            # dims (a drawn position would point at another dim and lose the failure).
            wide = fuzz.wide(draw, tiny, prod(out[:-1]))
            if wide:
                a, b = _resize_broadcast_dim(a, b, 1, wide)
            if draw(st.booleans()):
                a, b = _resize_broadcast_dim(a, b, draw(st.integers(1, rank)), 0)
        params = {"fn": fn, "a": a, "b": b}
        fuzz.set_layouts(draw, params, {"a_layout": len(a), "b_layout": len(b), "g_layout": rank})
        return fuzz.valid_case(OP, dtype, params)

    return draw_case()
