"""What the Triton matmul_backward, conv_backward_data and conv_backward_weight share.

* `Tile`: the block sizes of one implicit-GEMM launch (BM x BN output tile, BK reduction
  step, warps, software-pipeline stages).
* `Tuner`: per shape class, the Tile that runs fastest, settled by timing a few candidates
  on the first *checked* CUDA call of the class (CUDA events, on that call's own tensors) and
  kept for the process.  Unchecked calls (what the harness times) never tune: they take the
  cached choice, or the class's default where none is settled.  The choice is made before the
  call's own launch and never changes after, so every call of a plan runs the same kernels in
  the same summation order.  GRADORACLE_TRITON_TUNE=0 turns tuning off; small problems (under
  TUNE_MIN_FLOPS) take the default without timing.
* `geometry3`: a convolution's per-dim parameters padded to 3 spatial dims (size 1, kernel 1,
  stride 1, no padding, dilation 1 in the missing leading dims), so one kernel serves 1D, 2D
  and 3D; and the strides of each tensor as (n, c, d, h, w) whatever its layout.
* `mma`: acc + a @ b on tensor cores, in IEEE precision for float32 (never TF32: the spec is
  the float32 product) and float64 (DMMA on sm_80+).
* `Repack`: the transposing copy that stages a contiguous channels-first conv operand to
  channels last (and a channels-last result back), so the conv kernels take their pipelined path.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from backends._plans.conv_geometry import Geo3, data_strides, weight_strides
from backends.triton.common import IMPORT_ERROR, INTERPRETER, byte_span, interpreted, jit, on_device, overlap, p2, tl
from backends.triton.common import TUNE_ENV, capturing, time_ms, tuning_on  # noqa: F401 - TUNE_ENV: for callers
from harness.timing import TUNE_FILE_ENV

TUNE_MIN_FLOPS = 2e8     # below this a call takes the default tile: tuning would cost more than it wins
TUNE_MARGIN = 0.03       # a candidate must beat the default by this much to replace it


@jit
def mma(a, b, acc):
    """acc + a @ b: float32 (float64 for float64 inputs) accumulation, IEEE products.  The
    interpreter's dot mishandles bfloat16 operands: there they go up to float32 first (exact:
    a product of two bfloat16 values fits float32, as on the tensor cores)."""
    if INTERPRETER and a.dtype == tl.bfloat16:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision="ieee", out_dtype=acc.dtype)


@dataclass(frozen=True)
class Tile:
    bm: int
    bn: int
    bk: int
    warps: int = 4
    stages: int = 3
    group: int = 8   # programs along M that share B tiles in L2 (grouped launch order)
    tma: bool = False  # matmul: operand tiles through TMA descriptors (sm_90), not cp.async
    stage: bool = False  # matmul, float32: da's K-major operands copied M- and K-major first

    def short(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk}w{self.warps}s{self.stages}" + ("tma" if self.tma else "") + \
            ("st" if self.stage else "")


# The interpreter runs every program in Python: few, large-ish blocks keep the smoke runs short.
INTERPRETER_TILE = Tile(32, 32, 32, 1, 1, 1)


def gemm_candidates(itemsize: int) -> list[Tile]:
    """Tiles tried for a tensor-core GEMM of this element size, the default first."""
    if itemsize == 2:
        return [Tile(128, 128, 64, 8, 3), Tile(128, 256, 64, 8, 3), Tile(128, 128, 64, 4, 4),
                Tile(64, 128, 64, 4, 4), Tile(128, 64, 64, 4, 4), Tile(64, 64, 64, 4, 3),
                Tile(128, 256, 64, 8, 4), Tile(256, 128, 64, 8, 3), Tile(128, 128, 64, 8, 4, 16)]
    if itemsize == 4:  # IEEE float32 runs on the FMA units: smaller K steps, fewer stages
        return [Tile(64, 64, 32, 4, 3), Tile(128, 64, 32, 8, 3), Tile(128, 128, 32, 8, 2), Tile(64, 128, 32, 4, 3)]
    return [Tile(64, 64, 16, 4, 2), Tile(32, 64, 16, 4, 2), Tile(64, 32, 16, 4, 2)]


def gather_candidates(itemsize: int) -> list[Tile]:
    """Tiles for an implicit GEMM whose operand rows are gathered (no unit stride along the tile's
    contiguous dim, e.g. a channels-first convolution): every element has its own 64-bit pointer,
    so tiles stay small enough not to spill."""
    if itemsize == 2:
        return [Tile(64, 64, 32, 4, 3), Tile(128, 64, 32, 8, 3), Tile(64, 128, 32, 8, 3), Tile(64, 64, 64, 4, 3)]
    if itemsize == 4:
        return [Tile(64, 32, 16, 4, 2), Tile(64, 64, 16, 4, 2), Tile(32, 64, 32, 4, 2)]
    return gemm_candidates(itemsize)


def distinct(tiles, fit) -> list[Tile]:
    """The tiles in order but those that fit(tile) makes the same as an earlier one (fitted to a
    small layer, several candidates become one tile, which the tuner would time again)."""
    seen, out = set(), []
    for t in tiles:
        f = fit(t)
        if f not in seen:
            seen.add(f)
            out.append(t)
    return out


def small_tile(tile: Tile, m: int, n: int) -> Tile:
    """`tile` shrunk (by halves, not below 16) where the problem is narrower than it."""
    bm, bn = tile.bm, tile.bn
    while bm > 16 and bm // 2 >= m:
        bm //= 2
    while bn > 16 and bn // 2 >= n:
        bn //= 2
    return Tile(bm, bn, tile.bk, tile.warps if bm * bn >= 64 * 64 else min(tile.warps, 4), tile.stages, tile.group,
                tile.tma)


_current_device = None   # torch.cuda.current_device, or False with a single GPU (never another device)


def other_device(t) -> bool:
    """Whether t is on a CUDA device that is not the current one (a launch must switch to it)."""
    global _current_device
    if not t.is_cuda or _current_device is False:
        return False
    if _current_device is None:
        import torch

        _current_device = torch.cuda.current_device if torch.cuda.device_count() > 1 else False
        return other_device(t)
    return t.device.index != _current_device()


class Tuner:
    """The chosen Tile per (device, shape class) of one op; `log` keeps what each tuning tried.
    Where $GRADORACLE_TUNE_FILE names a file (harness profile's tuning pass), each choice is also
    written there, and a class with a choice there takes it untimed."""

    def __init__(self, op: str):
        self.op = op
        self.chosen: dict = {}
        self.log: dict = {}

    def _file(self):
        path = os.environ.get(TUNE_FILE_ENV)
        if not path:
            return None, {}
        try:
            return Path(path), json.loads(Path(path).read_text())
        except (OSError, ValueError):  # not written yet
            return Path(path), {}

    def _recorded(self, ckey, candidates: list):
        """The candidate the tune file holds for this class, if any."""
        _, doc = self._file()
        want = doc.get(self.op, {}).get(repr(ckey))
        return next((c for c in candidates if want is not None and asdict(c) == want), None)

    def _record(self, ckey, tile) -> None:
        path, doc = self._file()
        if path is not None:
            doc.setdefault(self.op, {})[repr(ckey)] = asdict(tile)
            path.write_text(json.dumps(doc, indent=1))

    def pick(self, key, candidates: list, build, device, flops: float, tune: bool, force: int | None = None):
        """The plan for the class `key`: build(tile) -> a plan (callable with no arguments runs
        it).  Times the candidates when `tune` and the class has no choice yet; else the cached
        choice or the default (candidates[0]).  force: candidates[force], untimed (tests; the
        sm_90 compile test plans on meta tensors, which get the CUDA candidates)."""
        if force is not None:
            return build(candidates[force])
        if device.type != "cuda" or interpreted():
            return build(candidates[0])
        ckey = (device.index, key)
        tile = self.chosen.get(ckey) or self._recorded(ckey, candidates)
        if tile is not None:
            self.chosen[ckey] = tile
            return build(tile)
        if not (tune and tuning_on() and flops >= TUNE_MIN_FLOPS and len(candidates) > 1) or capturing(device):
            return build(candidates[0])
        tried, plans = [], {}
        for i, tile in enumerate(candidates):
            try:
                plan = build(tile)
                ms = time_ms(plan)
            except Exception as exc:  # noqa: BLE001 - out of resources etc.: that candidate is out
                if i == 0:
                    raise
                tried.append({"tile": tile.short(), "error": f"{type(exc).__name__}: {exc}"[:200]})
                continue
            tried.append({"tile": tile.short(), "ms": ms})
            plans[i] = (ms, plan)
        best = min(plans, key=lambda i: plans[i][0])
        if plans[best][0] > (1 - TUNE_MARGIN) * plans[0][0]:
            best = 0
        best_plan = plans[best][1]
        self.chosen[ckey] = candidates[best]
        self.log[ckey] = {"tried": tried, "chosen": candidates[best].short()}
        self._record(ckey, candidates[best])
        return best_plan


def bucket(n: int) -> int:
    """A size class: n rounded up to a power of two, capped (large sizes all tile alike)."""
    b = 1
    while b < n and b < 8192:
        b *= 2
    return b


# ----------------------------------------------------------------------------- convolution geometry


def geometry3(x_shape, y_shape, w_shape, params: dict, channels_last: bool) -> Geo3:
    """The Geo3 of tensors of these (case-layout) shapes and the params' stride/padding/dilation/groups."""
    rank = len(x_shape) - 2

    def per_dim(key, default):
        v = params.get(key, default)
        v = (int(v),) * rank if isinstance(v, int) else tuple(int(e) for e in v)
        return (default,) * (3 - rank) + v

    if channels_last:
        n, *sp_in, cin = x_shape
        _, *sp_out, cout = y_shape
        k = tuple(w_shape[1:-1])
    else:
        n, cin, *sp_in = x_shape
        _, cout, *sp_out = y_shape
        k = tuple(w_shape[2:])
    pad = (1,) * (3 - rank)
    return Geo3(n, cin, cout, int(params.get("groups", 1)), pad + tuple(sp_in), pad + tuple(sp_out), pad + k,
                per_dim("stride", 1), per_dim("padding", 0), per_dim("dilation", 1))


def strides5(t, channels_last: bool) -> tuple:
    """(n, c, d, h, w) element strides of a data tensor (N, C, *S) or (N, *S, C)."""
    return data_strides(t.stride(), channels_last)


def wstrides5(w, channels_last: bool) -> tuple:
    """(co, ci, kd, kh, kw) element strides of a weight (Cout, Cin/g, *k) or (Cout, *k, Cin/g)."""
    return weight_strides(w.stride(), channels_last)


# ============================================================================= channels-first staging
#
# A channels-first tensor-core tile is a gather: the GEMM's reduction runs over channels, whose
# stride is the spatial size, so every element is a scalar load through its own 64-bit pointer,
# nothing is a 16-byte vector and triton's pipeliner has no cp.async to schedule (one shared
# stage, ~250 registers).  Copying a contiguous channels-first operand to channels last first (one
# read and one write of it, a transposing copy per call) lets the conv kernels run their
# channels-last, pipelined path; the kernels read everything through strides, so only the staged
# operands' strides change and the output is written in place in its own layout.


@jit(do_not_specialize=["C", "S"])
def _repack_kernel(src, dst, C, S, BS: tl.constexpr, BC: tl.constexpr):
    """dst[b, s, c] = src[b, c, s]: a contiguous (B, C, S) tensor to (B, S, C); program (s, c, b) blocks."""
    s = tl.program_id(0) * BS + tl.arange(0, BS)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    base = tl.program_id(2).to(tl.int64) * C * S
    m = (s[:, None] < S) & (c[None, :] < C)
    v = tl.load(src + base + c[None, :].to(tl.int64) * S + s[:, None], mask=m)
    tl.store(dst + base + s[:, None].to(tl.int64) * C + c[None, :], v, mask=m)


REPACK_TILE = 4096  # elements a program copies (64 x 64 where both sides are 64 or more)
GRID_YZ_MAX = 65535  # CUDA's limit on grid dims 1 and 2


def repack_tile(c: int, s: int, interpreted_: bool = False) -> tuple[int, int]:
    """(BS, BC) of Repack(b, c, s): 64 x 64, but a side under 64 takes the power of two that holds it
    (at least 4) and gives the other side its lanes, up to REPACK_TILE elements a program.  (64 x 64
    tiles on the stem's 3 channels masked 61 of 64 lanes: its dgrad's copy back took 141 us of the
    call's 926 on the H100, results/h100/s15/call3.)  The interpreter: 16 x 16, a thin side's lanes
    given up to 256 elements."""
    side, total = (16, 256) if interpreted_ else (64, REPACK_TILE)
    bs, bc = min(side, max(4, p2(s))), min(side, max(4, p2(c)))
    if bs < side:
        bc = min(max(4, p2(c)), total // bs)
    elif bc < side:
        bs = min(max(4, p2(s)), total // bc)
    return bs, bc


class Repack:
    """The transposing copy of a contiguous (B, C, S) tensor to (B, S, C): `repack(src, dst)`,
    dst a contiguous buffer of src's size.  Channels first to channels last with (B, C, S) =
    (N, C, spatial) or (Cout, Cin/g, taps); channels last back with (N, spatial, C).  With C == 1
    or S == 1 the two layouts are the same memory (`identity`: a 1x1 kernel's weights, one
    channel): Staging then uses the tensor itself and launches no copy."""

    __slots__ = ("step", "identity")

    def __init__(self, b: int, c: int, s: int):
        from backends.triton import _steps
        from backends.triton.common import cdiv

        self.identity = c == 1 or s == 1
        bs, bc = repack_tile(c, s, interpreted())
        self.step = _steps.Step(_repack_kernel, (cdiv(s, bs), cdiv(c, bc), b), 2, dict(C=c, S=s, BS=bs, BC=bc), 4)

    def __call__(self, src, dst) -> None:
        self.step(src, dst)


class Staging:
    """A staged conv plan's Repacks (iterable, indexable) and the channels-last buffers they
    fill: one set per layer, shared by every plan the tuner builds for it, allocated on first
    use and kept (calls on one stream are ordered, so reusing them is safe).  An identity
    Repack has no buffer: its operand is used in place."""

    __slots__ = ("repacks", "bufs")

    def __init__(self, *repacks):
        self.repacks, self.bufs = repacks, None

    def __iter__(self):
        return iter(self.repacks)

    def __getitem__(self, i):
        return self.repacks[i]

    def buffers(self, *like):
        """Flat buffers of the sizes and dtypes of `like` (allocated on the first call), None
        where the Repack is the identity."""
        bufs = self.bufs
        if bufs is None:
            import torch

            bufs = self.bufs = [None if r.identity else torch.empty(t.numel(), dtype=t.dtype, device=t.device)
                                for r, t in zip(self.repacks, like)]
        return bufs

    def operand(self, i: int, src, bufs):
        """src in channels last for the kernel: Repack i's copy in bufs[i], or src itself (identity)."""
        if bufs[i] is None:
            return src
        self.repacks[i](src, bufs[i])
        return bufs[i]


def repackable(t, b: int, c: int) -> bool:
    """Whether Repack(b, c, s) can copy t: contiguous, not empty, its grid within CUDA's limits."""
    return t.is_contiguous() and t.numel() > 0 and b <= GRID_YZ_MAX and -(-c // 16) <= GRID_YZ_MAX


def channels_aligned(g: Geo3, itemsize: int) -> bool:
    """Whether a group's channel blocks start on 16-byte boundaries (Cin/g, Cout/g multiples of 16 bytes)."""
    vec = 16 // itemsize
    return g.cig % vec == 0 and g.cog % vec == 0


def staged_strides5(st5: tuple, c: int) -> tuple:
    """(outer, channel, d, h, w) strides of the channels-last copy of a contiguous channels-first
    operand with c channels, from its own: the spatial strides within a (outer, channel) plane,
    times c; channels unit-strided."""
    return (st5[0], 1, st5[2] * c, st5[3] * c, st5[4] * c)


# ============================================================================= the conv ops' calls

PLANS_MAX = 256  # plans an op keeps; a full cache is dropped whole (a real run meets a few layouts)


def lookup(plans: dict, key: tuple, params: dict):
    """The plan cached for (key, params), or False.  Plans are keyed by the tensors' shapes,
    strides, dtype and device; the params (stride, padding, ...) are compared as a dict, which
    is cheaper per call than hashing them."""
    for saved, plan in plans.get(key, ()):
        if saved == params:
            return plan
    return False


def store(plans: dict, key: tuple, params: dict, plan) -> None:
    import copy

    if len(plans) >= PLANS_MAX:
        plans.clear()
    plans.setdefault(key, []).append((copy.deepcopy(params), plan))


def call(op: str, plans: dict, make_plan, dy, t, out, params: dict, tune: bool) -> None:
    """One call of a conv op on (dy, t) into out: its cached plan (made now, by
    make_plan(dy, t, out, params, channels_last, tune), on the layout's first call), launched
    on dy's device.  A plan of None: nothing to compute."""
    key = (dy.shape, t.shape, out.shape, dy.stride(), t.stride(), out.stride(), dy.dtype, dy.device)
    plan = lookup(plans, key, params)
    if plan is False:
        if IMPORT_ERROR is not None:
            raise RuntimeError(f"triton {op}: triton is not importable ({IMPORT_ERROR})")
        with on_device(dy):
            plan = make_plan(dy, t, out, params, params.get("layout", "channels_first") == "channels_last", tune)
        store(plans, key, params, plan)
    if plan is None:
        return
    if other_device(dy):
        with on_device(dy):
            plan(dy, t, out)
    else:
        plan(dy, t, out)


def check_kernel_args(op: str, named: dict, out: str) -> None:
    """What the kernels need beyond the op's argument rule: one device, the output contiguous
    in its layout and sharing no memory with an input (it is written while they are read)."""
    first = next(iter(named.values()))
    for name, t in named.items():
        if t.device != first.device:
            raise ValueError(f"triton {op}: {name}.device: expected {first.device} (the device of "
                             f"{next(iter(named))}), got {t.device}")
    if first.device.type not in ("cuda", "cpu"):
        raise ValueError(f"triton {op}: device: expected cuda, or cpu under TRITON_INTERPRET=1, got {first.device}")
    if not named[out].is_contiguous():
        raise ValueError(f"triton {op}: {out}: expected a contiguous tensor, got strides {named[out].stride()}")
    if named[out].numel():
        span = byte_span(named[out])
        for name, t in named.items():
            if name != out and t.numel() and overlap(span, byte_span(t)):
                raise ValueError(f"triton {op}: {out}: expected a buffer of its own (outputs are written while "
                                 f"inputs are read), got memory shared with {name}")
