"""conv_backward_data and conv_backward_weight cases: one geometry list, run through both ops.

Seed shapes (a 3-tap conv1d over 1024*1024 points, strided dgrad with 3x3 and 1x1 filters),
ResNet-50's layers, and the edges of the index math: stride above the kernel size, depthwise
and grouped, dilation 2 and 3, different stride/padding/dilation per dim, padding above
kernel/2, output size 1, input sizes that dy cannot recover, 1D and 3D, batch 1, odd channels,
channels-first and channels-last, non-contiguous inputs.  Smoke holds small versions of all of
them; the tiny ones (every tensor <= 64 elements) also get the finite-difference check.
"""
from __future__ import annotations

from itertools import product

from cases.registry import add, strategy

OPS = ("conv_backward_data", "conv_backward_weight")
SMOKE, FULL, PERF = {"smoke"}, {"full"}, {"full", "perf"}  # PERF: timed and checked
NCHW, NHWC = "channels_first", "channels_last"


def conv(dtype, tags, n, cin, cout, spatial, kernel, stride=1, padding=0, dilation=1, groups=1, layout=NCHW,
         ops=OPS, **layouts):
    """Add one geometry to each op in `ops`; ints in stride/padding/dilation apply to every dim."""
    rank = len(spatial)
    per_dim = lambda v: [v] * rank if isinstance(v, int) else list(v)  # noqa: E731
    for op in ops:
        extra = {k: v for k, v in layouts.items()
                 if k == "dy_layout" or (k == "w_layout") == (op == "conv_backward_data")}
        add(op, dtype, tags, n=n, cin=cin, cout=cout, spatial=list(spatial), kernel=per_dim(kernel),
            stride=per_dim(stride), padding=per_dim(padding), dilation=per_dim(dilation), groups=groups,
            layout=layout, **extra)


# ----------------------------------------------------------------------------- smoke: tiny (FD-checked)
conv("f32", SMOKE, 1, 2, 3, [8], [3], stride=2, padding=1)                               # strided 1D
conv("f32", SMOKE, 2, 2, 2, [9], [2], padding=1, dilation=3, layout=NHWC)                # dilation 3, NWC
conv("f32", SMOKE, 1, 1, 2, [5, 6], [2, 3], stride=[2, 1], padding=[1, 0], dilation=[1, 2])  # per-dim
conv("f32", SMOKE, 1, 4, 2, [4, 4], [3, 3], padding=1, groups=2, layout=NHWC)            # grouped
conv("f32", SMOKE, 1, 3, 6, [3, 4], [2, 2], groups=3)                                    # depthwise x2
conv("f32", SMOKE, 1, 1, 2, [3, 3, 4], [2, 2, 2], stride=[1, 1, 2])                      # 3D
conv("f32", SMOKE, 1, 1, 2, [4, 4, 4], [2, 1, 2], stride=[3, 2, 3], layout=NHWC)         # 3D, stride > k
conv("f64", SMOKE, 1, 2, 4, [5], [3], padding=2, groups=2)                               # padding > k/2
conv("f32", SMOKE, 2, 2, 3, [3, 3], [3, 3])                                              # output 1x1
for size in (7, 8):  # k=3, s=2, p=1: both give O=4, dy cannot tell which
    conv("f32", SMOKE, 2, 1, 1, [size], [3], stride=2, padding=1)
conv("bf16", SMOKE, 1, 2, 2, [5, 5], [2, 2], dilation=2, layout=NHWC)
conv("f32", SMOKE, 1, 1, 2, [9], [2], stride=2, padding=1, dilation=2)  # s = d = 2: even rows never read
conv("f16", SMOKE, 3, 2, 2, [6], [3], padding=1, groups=2, layout=NHWC)

# ----------------------------------------------------------------------------- smoke: small
# Strided dgrad, the seed's 3x3 and 1x1 filters, on odd and even inputs: 3x3/2 on 9 and 8 rows (5 and 4
# output rows); 1x1/2 on 8 and 7 rows, which both give 4 (with 8 the last row is never read: its dx is 0).
conv("f32", SMOKE, 2, 4, 5, [9, 9], [3, 3], stride=2, padding=1)
conv("f32", SMOKE, 2, 4, 5, [8, 8], [3, 3], stride=2, padding=1, layout=NHWC)
conv("f32", SMOKE, 2, 6, 4, [8, 8], [1, 1], stride=2, layout=NHWC)
conv("f32", SMOKE, 2, 6, 4, [7, 7], [1, 1], stride=2)
# Dilation 2 and 3.
conv("f32", SMOKE, 2, 3, 4, [10, 10], [3, 3], padding=2, dilation=2)
conv("f32", SMOKE, 1, 4, 3, [11, 9], [3, 3], padding=3, dilation=3, layout=NHWC)
# Grouped and depthwise.
conv("f32", SMOKE, 2, 8, 8, [6, 6], [3, 3], padding=1, groups=4, layout=NHWC)
conv("f32", SMOKE, 2, 8, 8, [9, 9], [3, 3], stride=2, padding=1, groups=8, layout=NHWC)
conv("f32", SMOKE, 1, 6, 6, [7, 7], [5, 5], padding=2, groups=6)
# Odd channel counts, batch 1.
conv("f32", SMOKE, 3, 3, 5, [7, 5], [3, 3], padding=1)
conv("f32", SMOKE, 1, 7, 13, [5, 6], [3, 2], layout=NHWC)
# Stride above the kernel size: input positions no window reads.
conv("f32", SMOKE, 2, 3, 4, [10, 10], [2, 2], stride=3)
conv("f32", SMOKE, 2, 3, 2, [17], [3], stride=4, padding=1, layout=NHWC)
# Padding above kernel/2 (the output is larger than the input).
conv("f32", SMOKE, 2, 3, 2, [5, 5], [3, 3], padding=2, layout=NHWC)
conv("f32", SMOKE, 2, 2, 3, [4, 4], [1, 1], padding=1)
# Different stride, padding and dilation per dim.
conv("f32", SMOKE, 2, 4, 6, [9, 10], [3, 1], stride=[1, 2], padding=[2, 0], dilation=[1, 3], layout=NHWC)
conv("f32", SMOKE, 2, 4, 2, [8, 9], [1, 5], stride=[2, 1], padding=[0, 2], dilation=[2, 1], groups=2)
# 3D.
conv("f32", SMOKE, 2, 3, 4, [5, 6, 7], [3, 3, 3], stride=2, padding=1, layout=NHWC)
conv("f32", SMOKE, 2, 3, 4, [5, 6, 7], [3, 3, 3], stride=2, padding=1)
conv("f32", SMOKE, 1, 4, 4, [4, 5, 6], [3, 1, 3], stride=[1, 2, 1], padding=[1, 0, 1], dilation=[1, 1, 2], groups=2)
# Output size 1: the kernel covers the whole (padded) input.
conv("f32", SMOKE, 2, 4, 3, [7, 7], [7, 7], stride=2)
conv("f32", SMOKE, 3, 2, 5, [5], [3], stride=3, padding=1, dilation=2, layout=NHWC)
# The seed's 3-tap conv1d (small), and ResNet-50's 7x7/2 stem (small).
conv("f32", SMOKE, 1, 1, 1, [4096], [3], padding=1)
conv("bf16", SMOKE, 1, 1, 1, [4096], [3], padding=1, layout=NHWC)
conv("bf16", SMOKE, 2, 3, 8, [32, 32], [7, 7], stride=2, padding=3, layout=NHWC)
conv("f16", SMOKE, 2, 3, 8, [32, 32], [7, 7], stride=2, padding=3)
# Every dtype on a 3x3 layer, and longer reductions in 16-bit.
for dtype in ("f16", "bf16", "f64"):
    conv(dtype, SMOKE, 2, 8, 8, [8, 8], [3, 3], padding=1, layout=NHWC)
conv("bf16", SMOKE, 4, 16, 16, [64], [3], padding=1)
conv("f16", SMOKE, 4, 4, 4, [16, 16], [3, 3], stride=2, padding=1, layout=NHWC)
# Non-contiguous inputs: strided views of dy and of w / x.
conv("f32", SMOKE, 2, 4, 5, [6, 7], [3, 3], padding=1, dy_layout="sliced", w_layout="transposed",
     x_layout="transposed")
conv("bf16", SMOKE, 2, 4, 4, [6, 7], [3, 3], stride=2, padding=1, layout=NHWC, dy_layout="transposed",
     w_layout="sliced", x_layout="sliced")

# ----------------------------------------------------------------------------- full: GPU-sized
# Strided dgrad, 3x3 and 1x1 (seed), odd and even inputs that dy cannot tell apart (31 and 32 -> 16).
for dtype, layout, size in product(("f32", "bf16", "f16"), (NCHW, NHWC), (31, 32)):
    conv(dtype, FULL, 8, 64, 64, [size, size], [3, 3], stride=2, padding=1, layout=layout)
    conv(dtype, FULL, 8, 64, 128, [size, size], [1, 1], stride=2, layout=layout)
# The edges at a realistic size, in f32 and bf16, both layouts.
EDGES = [
    dict(n=8, cin=32, cout=32, spatial=[30, 30], kernel=[2, 2], stride=3),
    dict(n=8, cin=32, cout=48, spatial=[29, 29], kernel=[3, 3], stride=5, padding=1),
    dict(n=8, cin=96, cout=96, spatial=[28, 28], kernel=[3, 3], padding=1, groups=96),
    dict(n=8, cin=96, cout=96, spatial=[29, 29], kernel=[5, 5], stride=2, padding=2, groups=96),
    dict(n=8, cin=64, cout=128, spatial=[28, 28], kernel=[3, 3], padding=1, groups=2),
    dict(n=8, cin=64, cout=64, spatial=[28, 28], kernel=[3, 3], padding=1, groups=4),
    dict(n=8, cin=64, cout=64, spatial=[33, 33], kernel=[3, 3], padding=2, dilation=2),
    dict(n=8, cin=64, cout=64, spatial=[33, 33], kernel=[3, 3], padding=3, dilation=3),
    dict(n=8, cin=32, cout=48, spatial=[40, 27], kernel=[5, 3], stride=[2, 1], padding=[1, 2], dilation=[1, 3]),
    dict(n=8, cin=32, cout=32, spatial=[17, 19], kernel=[1, 7], stride=[1, 2], padding=[0, 3]),
    dict(n=8, cin=32, cout=32, spatial=[14, 14], kernel=[3, 3], padding=3),
    dict(n=8, cin=64, cout=64, spatial=[7, 7], kernel=[7, 7]),
    dict(n=8, cin=128, cout=64, spatial=[9, 9], kernel=[3, 3], stride=4),
    dict(n=1, cin=3, cout=64, spatial=[64, 64], kernel=[3, 3], padding=1),
    dict(n=3, cin=7, cout=13, spatial=[31, 29], kernel=[3, 3], stride=2, padding=1),
    dict(n=4, cin=33, cout=65, spatial=[25], kernel=[5], stride=2, padding=2, dilation=2),
    dict(n=4, cin=32, cout=32, spatial=[8, 16, 16], kernel=[3, 3, 3], padding=1),
    dict(n=2, cin=16, cout=32, spatial=[9, 17, 17], kernel=[3, 3, 3], stride=2, padding=1, groups=2),
    dict(n=2, cin=8, cout=8, spatial=[7, 12, 10], kernel=[1, 3, 3], stride=[1, 2, 2], padding=[0, 1, 1],
         dilation=[1, 2, 1]),
]
for geo, dtype, layout in product(EDGES, ("f32", "bf16"), (NCHW, NHWC)):
    conv(dtype, FULL, layout=layout, **geo)
for geo in EDGES[::3]:
    conv("f16", FULL, layout=NHWC, **geo)
    conv("f64", FULL, layout=NCHW, **geo)

# The seed's 3-tap conv1d over 1024*1024 points: one long signal, and a batch of multichannel ones.
L = 1024 * 1024
for dtype in ("f32", "bf16", "f16"):
    conv(dtype, PERF, 1, 1, 1, [L], [3], padding=1)
for dtype, layout in product(("f32", "bf16"), (NCHW, NHWC)):
    conv(dtype, PERF, 16, 64, 64, [L // 16], [3], padding=1, layout=layout)

# ResNet-50 layers at batch 32: the 7x7/2 stem, a 3x3 and a 1x1 of a stage-1 block, the strided
# 3x3 entering stage 2, and the 1x1/2 projection entering stage 4.
RESNET50 = [
    dict(cin=3, cout=64, spatial=[224, 224], kernel=[7, 7], stride=2, padding=3),
    dict(cin=64, cout=64, spatial=[56, 56], kernel=[3, 3], padding=1),
    dict(cin=256, cout=64, spatial=[56, 56], kernel=[1, 1]),
    dict(cin=128, cout=128, spatial=[56, 56], kernel=[3, 3], stride=2, padding=1),
    dict(cin=512, cout=1024, spatial=[28, 28], kernel=[1, 1], stride=2),
]
for geo, dtype, layout in product(RESNET50, ("bf16", "f16", "f32"), (NHWC, NCHW)):
    conv(dtype, PERF, 32, layout=layout, **geo)
# Depthwise (MobileNetV2), grouped (ResNeXt-50 32x4d) and 3D (video) layers.
for dtype in ("bf16", "f32"):
    conv(dtype, PERF, 32, 144, 144, [56, 56], [3, 3], stride=2, padding=1, groups=144, layout=NHWC)
    conv(dtype, PERF, 32, 128, 128, [56, 56], [3, 3], padding=1, groups=32, layout=NHWC)
    conv(dtype, PERF, 4, 64, 64, [8, 56, 56], [3, 3, 3], padding=1, layout=NHWC)


# ----------------------------------------------------------------------------- fuzzing (harness/fuzz.py)


def _fuzz_params(draw, tiny: bool, layout_keys: tuple[str, str]) -> dict:
    """A valid geometry: rank 1-3; groups 1-3 with 1-3 channels per group on each side (1 in
    is depthwise); per dim kernel, stride (above the kernel too), padding (above kernel/2
    too), dilation, and an input size from the smallest the dilated kernel allows upward
    (so the output size is >= 1: valid by construction, and shrinking keeps it valid); in 1D
    sometimes a wide signal."""
    from hypothesis import strategies as st

    from harness import fuzz

    rank = draw(st.integers(1, 3))
    small = tiny or rank == 3
    groups, cig, cog = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dims = []  # per spatial dim: (input size, kernel, stride, padding, dilation)
    for _ in range(rank):
        k = draw(st.integers(1, 3 if small else 4))
        s, p, dil = draw(st.integers(1, 4)), draw(st.integers(0, 3)), draw(st.integers(1, 3))
        extra = draw(st.integers(0, 3 if small else 6))
        if rank == 1:
            extra = fuzz.wide(draw, tiny, 9 * 3 * 4) or extra  # N * channels * kernel at most
        dims.append((max(1, dil * (k - 1) + 1 - 2 * p) + extra, k, s, p, dil))
    spatial, kernel, stride, padding, dilation = (list(v) for v in zip(*dims))
    params = {"n": draw(st.integers(1, 2)), "cin": groups * cig, "cout": groups * cog, "spatial": spatial,
              "kernel": kernel, "stride": stride, "padding": padding, "dilation": dilation, "groups": groups,
              "layout": draw(st.sampled_from((NCHW, NHWC)))}
    fuzz.set_layouts(draw, params, {key: rank + 2 for key in layout_keys})  # every conv tensor has rank >= 3
    return params


def _fuzz_strategy(op: str, layout_keys: tuple[str, str], tiny: bool):
    from hypothesis import strategies as st

    from harness import fuzz

    @st.composite
    def draw_case(draw):
        params = _fuzz_params(draw, tiny, layout_keys)
        return fuzz.valid_case(op, draw(st.sampled_from(fuzz.DTYPES)), params)

    return draw_case()


@strategy("conv_backward_data")
def fuzz_data_cases(tiny: bool = False):
    """A geometry (_fuzz_params), layouts of dy and w."""
    return _fuzz_strategy("conv_backward_data", ("dy_layout", "w_layout"), tiny)


@strategy("conv_backward_weight")
def fuzz_weight_cases(tiny: bool = False):
    """A geometry (_fuzz_params), layouts of dy and x."""
    return _fuzz_strategy("conv_backward_weight", ("dy_layout", "x_layout"), tiny)
