"""attention_backward cases: seed feature matrix (head dims x causal/window/softcap/GQA), llama-3 shapes, edges.

Smoke cases stay small (the numpy oracle, torch and JAX on CPU, and finite differences on
the tiny ones run in CI); full adds GPU-size versions; perf is llama-3 8B/70B training shapes
and the published FlashAttention benchmark grid.
"""
from __future__ import annotations

from itertools import product

from cases.registry import add, strategy

OP = "attention_backward"
SMOKE, FULL, PERF, PERF_ONLY = {"smoke"}, {"full"}, {"full", "perf"}, {"perf"}


def case(dtype, tags, B, Sq, Sk, Hq, Hkv, D, **kw):
    return add(OP, dtype, tags, B=B, Sq=Sq, Sk=Sk, Hq=Hq, Hkv=Hkv, D=D, **kw)


# ---- tiny: every tensor <= 64 elements, for the finite-difference check of both oracles
case("f64", SMOKE, 1, 4, 4, 2, 1, 8, causal=True)  # GQA
case("f64", SMOKE, 1, 6, 4, 1, 1, 8, causal=True)  # Sq > Sk: rows 0, 1 have no key
case("f64", SMOKE, 2, 3, 8, 1, 1, 4, window=[1, 1], softcap=1.5)  # Sq < Sk, window, softcap
case("f64", SMOKE, 1, 1, 8, 4, 2, 4)  # decoding, GQA
case("f32", SMOKE, 1, 4, 4, 2, 2, 8, causal=True, softcap=2.0)
case("f64", SMOKE, 1, 8, 4, 1, 1, 8, window=[0, 0])  # a window that leaves rows 0-3 empty
case("f32", SMOKE, 1, 5, 7, 2, 1, 4, causal=True, window=[2, 0], softmax_scale=0.3)
case("bf16", SMOKE, 2, 4, 4, 2, 2, 4)
case("f16", SMOKE, 1, 2, 4, 4, 1, 8, causal=True)  # MQA

# ---- every dtype (smoke: each distinct shape costs ~1 s of XLA compiles on CPU, so one each)
case("f32", SMOKE, 2, 128, 128, 4, 2, 64, causal=True)
case("f16", SMOKE, 2, 128, 128, 4, 4, 64)
case("bf16", SMOKE, 2, 128, 128, 4, 2, 64, causal=True)
case("f64", SMOKE, 2, 128, 128, 4, 2, 64, causal=True)
for dtype in ("f32", "f16", "bf16", "f64"):
    case(dtype, FULL, 2, 128, 128, 4, 4, 64)
    case(dtype, FULL, 2, 128, 128, 4, 2, 64, causal=True)

# ---- the seed's feature matrix: head dims 64, 128, 256 with causal, local window, softcap, GQA
case("bf16", SMOKE, 1, 96, 96, 4, 2, 64, window=[16, 16])
case("bf16", SMOKE, 1, 96, 96, 4, 2, 128, causal=True)
case("f16", SMOKE, 1, 96, 96, 2, 1, 128, causal=True, window=[32, 0], softcap=5.0)
case("bf16", SMOKE, 1, 96, 96, 4, 2, 256, causal=True)
case("f16", SMOKE, 1, 96, 96, 2, 2, 256, window=[16, 16], softcap=5.0)
for d in (64, 128, 256):
    case("bf16", FULL, 1, 96, 96, 4, 2, d, causal=True)
    case("bf16", FULL, 1, 96, 96, 2, 2, d, window=[16, 16])
    case("f16", FULL, 1, 96, 96, 2, 1, d, causal=True, window=[32, 0], softcap=5.0)
for d, dtype in product((64, 128, 256), ("bf16", "f16")):
    case(dtype, FULL, 2, 1024, 1024, 16, 16, d)
    case(dtype, FULL, 2, 1024, 1024, 16, 4, d, causal=True)
    case(dtype, FULL, 2, 1024, 1024, 16, 4, d, causal=True, window=[256, 0])
    case(dtype, FULL, 2, 1024, 1024, 16, 16, d, window=[128, 128])
    case(dtype, FULL, 2, 1024, 1024, 16, 4, d, causal=True, softcap=30.0, score_std=10.0)  # gemma-2 style cap, engaged
    case(dtype, FULL, 2, 1024, 1024, 16, 16, d, softcap=5.0)
for d in (64, 128):
    case("f32", FULL, 2, 1024, 1024, 16, 4, d, causal=True)
    case("f32", FULL, 2, 1024, 1024, 16, 4, d, window=[64, 64], softcap=5.0)

# ---- llama-3 8B (32 query heads over 8 kv heads) and 70B (64 over 8), D = 128, training shapes
for hq, s, b in product((32, 64), (2048, 4096, 8192), (1, 2)):
    tags = PERF if (s == 2048 or (s == 4096 and b == 1)) else PERF_ONLY
    case("bf16", tags, b, s, s, hq, 8, 128, causal=True)
for hq in (32, 64):
    case("f16", PERF_ONLY, 1, 4096, 4096, hq, 8, 128, causal=True)
    case("bf16", PERF_ONLY, 1, 4096, 4096, hq, 8, 128)  # non-causal (encoder-style)
    case("bf16", PERF, 1, 1, 8192, hq, 8, 128)  # decoding step against an 8k cache

# ---- the published FlashAttention benchmark grid (FA2/FA3 papers, cuDNN's and Triton's
# tables): batch x seqlen = 16k tokens, heads x D = 2048, D in {64, 128}, S from 512 to 16k,
# causal and not, bf16, MHA -- so these figures sit beside the published ones
for d, s, causal in product((64, 128), (512, 1024, 2048, 4096, 8192, 16384), (False, True)):
    case("bf16", PERF_ONLY, 16384 // s, s, s, 2048 // d, 2048 // d, d, **({"causal": True} if causal else {}))

# ---- edges
# Sq != Sk both ways, causal (bottom-right) and not
case("bf16", SMOKE, 1, 64, 128, 4, 2, 64, causal=True)  # prefill against a longer cache
case("bf16", SMOKE, 1, 128, 64, 4, 2, 64, causal=True)  # Sq > Sk: the first 64 rows are empty
case("f32", SMOKE, 2, 33, 100, 2, 1, 64)
case("f16", SMOKE, 1, 100, 33, 2, 2, 64, window=[8, 8])
for dtype in ("bf16", "f16"):
    case(dtype, FULL, 2, 512, 2048, 32, 8, 128, causal=True)
    case(dtype, FULL, 2, 2048, 512, 32, 8, 128, causal=True)
    case(dtype, FULL, 2, 777, 1500, 8, 2, 64)
# seqlens that no block size divides
case("bf16", SMOKE, 1, 113, 113, 2, 1, 64, causal=True)
case("f16", SMOKE, 1, 1023, 1023, 1, 1, 64, causal=True)
case("bf16", FULL, 2, 113, 113, 32, 8, 128, causal=True)
case("bf16", FULL, 2, 1023, 1023, 32, 8, 128, causal=True)
case("bf16", FULL, 2, 1023, 1023, 32, 8, 128, causal=True, window=[256, 0], softcap=30.0)
case("f16", FULL, 1, 1023, 1023, 8, 8, 96, window=[100, 27])
# head dims that are not powers of two
case("bf16", SMOKE, 1, 77, 77, 2, 1, 40, causal=True)
case("f32", SMOKE, 1, 50, 70, 2, 2, 80, softcap=3.0)
case("f16", SMOKE, 1, 77, 77, 4, 2, 96, window=[8, 0])
for d in (40, 80, 96):
    case("bf16", FULL, 1, 77, 77, 2, 1, d, causal=True)
    case("f32", FULL, 1, 50, 70, 2, 2, d, softcap=3.0)
    case("bf16", FULL, 2, 1023, 1023, 16, 4, d, causal=True)
    case("f16", FULL, 2, 1024, 1024, 16, 16, d)
# windows that leave whole rows without keys (output and gradient 0 there)
case("bf16", SMOKE, 1, 96, 40, 2, 1, 64, causal=True, window=[8, 0])  # rows 0-55 empty
case("f32", SMOKE, 1, 64, 16, 2, 2, 32, window=[4, 4])  # rows 0-43 empty
case("bf16", FULL, 2, 2048, 256, 16, 4, 128, causal=True, window=[64, 0])
# MQA
case("bf16", SMOKE, 1, 64, 64, 8, 1, 64, causal=True)
case("bf16", FULL, 2, 1024, 1024, 32, 1, 128, causal=True)
# softcap with causal, cap engaged
case("bf16", SMOKE, 1, 128, 128, 2, 2, 64, causal=True, softcap=5.0, score_std=4.0)
case("f32", FULL, 1, 128, 128, 2, 1, 64, causal=True, softcap=2.0)
# decoding-like: one query row (causal is then no mask: the row sees the whole cache)
case("bf16", SMOKE, 1, 1, 512, 8, 2, 128)
case("f16", SMOKE, 2, 1, 300, 4, 1, 64, causal=True)
case("f32", FULL, 1, 1, 257, 4, 4, 96, window=[64, 0])
for dtype in ("bf16", "f16"):
    case(dtype, FULL, 4, 1, 4096, 32, 8, 128, causal=True)
# one key: only the last query row is live when causal
case("f32", SMOKE, 1, 16, 1, 2, 1, 64, causal=True)
case("bf16", FULL, 2, 16, 1, 4, 4, 64)
# peaked softmax (large scores) and a non-default scale
case("f32", SMOKE, 1, 128, 128, 2, 2, 64, causal=True, score_std=4.0)
case("bf16", FULL, 1, 128, 128, 2, 2, 64, score_std=4.0)
case("f16", SMOKE, 1, 64, 64, 2, 2, 64, causal=True, softmax_scale=0.05)
case("bf16", FULL, 2, 2048, 2048, 16, 4, 128, causal=True, score_std=6.0)


# ----------------------------------------------------------------------------- fuzzing (harness/fuzz.py)


@strategy(OP)
def fuzz_cases(tiny: bool = False):
    """B, Sq and Sk drawn independently (Sq != Sk both ways, Sq = 1 decoding, sometimes a wide
    Sk: a long cache), GQA/MQA as Hkv kv heads times a group of 1-3, head dim 1-16 or 32/64,
    causal, a window [left, right] (sides -1 or 0..max(Sq, Sk), so some mask whole rows),
    softcap, an explicit softmax scale and a larger score spread (a peaked softmax)."""
    from hypothesis import strategies as st

    from harness import fuzz

    def window_side(draw, longest: int) -> int:
        """-1 (unbounded, the simple side) or 0..longest: 0 and small values against Sq != Sk
        leave whole query rows without a key."""
        return draw(st.one_of(st.just(-1), st.integers(0, longest)))

    @st.composite
    def draw_case(draw):
        big = 5 if tiny else 12
        b = draw(st.integers(1, 2))
        sq, sk = draw(st.integers(1, big)), draw(st.integers(1, big))
        hkv, group = draw(st.integers(1, 2)), draw(st.integers(1, 3))
        d = draw(st.one_of(st.integers(1, 8 if tiny else 16), st.sampled_from((32, 64))))
        sk = fuzz.wide(draw, tiny, b * sq * hkv * group * max(d, 8)) or sk  # the scores are B*Hq*Sq*Sk
        params: dict = {"B": b, "Sq": sq, "Sk": sk, "Hq": hkv * group, "Hkv": hkv, "D": d}
        if draw(st.booleans()):
            params["causal"] = True
        window = [window_side(draw, max(sq, sk)), window_side(draw, max(sq, sk))]
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
        return fuzz.valid_case(OP, draw(st.sampled_from(fuzz.DTYPES)), params)

    return draw_case()
