"""The normalisation backwards' CUDA kernels (backends/cuda/norm_common.cuh, layernorm_backward.cuh,
rmsnorm_backward.cuh) and the cupy backend's host side (backends/cupy/_norm_plan.py), without a GPU.

* Compile checks: every instantiation the planner can launch (op x dtype x kernel) compiles for
  sm_90 with NVRTC; NBParams and the launch constants have the values the host packs.
* The host side run for real against an emulator: `_norm_plan.run` (the code the cupy backend
  runs) launches kernels on `EmuDevice`, whose kernels are Python ports of the .cuh kernels at the
  level of blocks, groups, threads and the columns each thread owns.  Results must match the
  float64 oracle, every dx element must be written exactly once, 16-byte accesses must be aligned,
  and partial rows must be written before they are read (the workspace starts NaN).  This checks
  the planning, the packing of NBParams, the row addressing and the coverage of rows and columns.
* The planner's paths: small N (several rows per block), large N (column chunks), M = 1 (no second
  stage), M = 0, strided layouts (leading dims merged or not, no vectors), alignment.
* Registration, and that importing the modules does not import cupy.
"""
from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from backends.cupy import nvrtc as _nvrtc
from backends.cupy import _norm_plan as plan
from oracle.layernorm_backward import layernorm_backward_numpy
from oracle.rmsnorm_backward import rmsnorm_backward_numpy
from nvrtc_mark import needs_nvrtc

LN, RMS = plan.LN, plan.RMS


@pytest.fixture(autouse=True)
def _default_settings(monkeypatch):
    """Plans here use the default knobs unless a test sets GRADORACLE_CUPY_NORMS itself."""
    monkeypatch.delenv(plan.ENV, raising=False)
    # These tests exercise the driver launch path as the default they were written for; the
    # shipped default launches through cupy until the driver path has run on a GPU.
    monkeypatch.setitem(plan.SETTINGS, "launch", (plan.SETTINGS["launch"][0], "driver"))


# ============================================================================= compile checks


@needs_nvrtc
@pytest.mark.parametrize("op", [LN, RMS])
@pytest.mark.parametrize("dt", plan.DTYPES)
def test_nvrtc_compiles_every_instantiation(op, dt):
    exprs = plan.all_kernel_exprs(op, dt)
    kinds = {e.split("<")[0] for e in exprs}
    assert {"nb_rows", "nb_chunked", "nb_colsum", "nb_rows2", "nb_rows3"} <= kinds
    if op == LN:
        assert {"ln_v1", "ln_v2", "ln_v3", "ln_v4", "ln_v5"} <= kinds
    source = _nvrtc.read_source(plan.SOURCES[op])
    cubin, lowered = _nvrtc.compile_cubin(source, arch="sm_90", name_expressions=exprs,
                                          options=plan.compile_options())
    for expr in exprs:
        assert lowered[expr].encode() in cubin, f"{expr} ({lowered[expr]}) missing from the cubin"


@needs_nvrtc
def test_params_layout_and_constants_match_the_host():
    # Every field is a long long (no padding): the array sizes and the total fix the layout in
    # declaration order, which pack_params follows.
    probe = _nvrtc.read_source(plan.SOURCES[LN]) + f"""
static_assert(NB_MAX_LEAD == {plan.MAX_LEAD}, "MAX_LEAD");
static_assert(NB_NT == {plan.NT}, "NT");
static_assert(NB_ROWS_BLOCK == {plan.ROWS_BLOCK}, "ROWS_BLOCK");
static_assert(NB_CHUNK_BLOCK == {plan.CHUNK_BLOCK}, "CHUNK_BLOCK");
static_assert(NB_COLSUM_BLOCK == {plan.COLSUM_BLOCK}, "COLSUM_BLOCK");
static_assert(NB_MAX_TILE_ROWS == {plan.MAX_TILE_ROWS}, "MAX_TILE_ROWS");
static_assert(NB_HAS_W == {plan.HAS_W} && NB_HAS_B == {plan.HAS_B}, "flags");
static_assert(LN_V1_BLOCK == {plan.V1_BLOCK} && LN_V4_BLOCK == {plan.V4_BLOCK}, "rung blocks");
static_assert(NB_X == 0 && NB_DY == 1 && NB_DX == 2 && NB_MEAN == 3 && NB_RSTD == 4 && NB_W == 3, "slots");
static_assert(sizeof(NBParams) == {plan.PARAMS_WORDS} * 8, "NBParams size");
static_assert(sizeof(NBParams::size) == {plan.MAX_LEAD} * 8, "size");
static_assert(sizeof(NBParams::stride) == {plan.NT * plan.MAX_LEAD} * 8, "stride");
static_assert(sizeof(NBParams::col_stride) == 4 * 8 && sizeof(NBParams::out_stride) == 2 * 8, "col/out strides");
static_assert(NB_PHASE_ROWS == {plan.PHASE_ROWS} && NB_PHASE_COLS == {plan.PHASE_COLS}, "phases");
static_assert(NB_ROWS3_MIN_BLOCK == {plan.ROWS3_MIN_BLOCK} && NB_ROWS3_REGS == {plan.ROWS3_REGS}, "rows3");
""" + "".join(f"static_assert(NBRows3Smem<{plan.CUDA_TYPE[dt]}, {vpt}, {gw}, {st}>::BYTES == "
              f"{plan.rows3_smem_bytes(dt, vpt, gw, st)} && NBRows3Smem<{plan.CUDA_TYPE[dt]}, {vpt}, {gw}, {st}>"
              f"::BLOCK == {plan.rows3_block(gw)}, \"rows3 smem {dt} {vpt} {gw} {st}\");\n"
              for dt in plan.DTYPES for vpt in (1, 2, 4) for gw in (1, 32, 256, 512, 1024) for st in (2, 4))
    cubin, _ = _nvrtc.compile_cubin(probe, name_expressions=["nb_colsum<float>"], options=plan.compile_options())
    assert cubin
    assert plan.PARAMS_DTYPE.itemsize == plan.PARAMS_WORDS * 8
    # flags is the sixth field from the end (then gw, gw_log2, rows_per_block, nparts, tile_rows)
    assert plan.FLAGS_WORD == plan.PARAMS_WORDS - 6
    layout = plan.make_layout(LN, (2, 8), {"x": (8, 1), "dy": (8, 1), "dx": (8, 1), "mean": (1,), "rstd": (1,)})
    assert plan.pack_params(layout, 0x5a, gw=4)[plan.FLAGS_WORD:plan.FLAGS_WORD + 3] == [0x5a, 4, 2]


def _nvcc_instantiations(op: str, dt: str) -> str:
    """A .cu that explicitly instantiates every kernel the planner can launch for (op, dtype)."""
    t = plan.CUDA_TYPE[dt]
    a = f"nb_acc_t<{t}>"
    main = f"const __grid_constant__ NBParams, const {t}*, const {t}*, const {t}*, const {a}*, const {a}*, {t}*, {a}*"
    sigs = {"nb_rows": f"{main}, {t}*, {t}*", "nb_rows2": f"{main}, {t}*, {t}*",
            "nb_rows3": f"{main}, {t}*, {t}*, unsigned int*", "nb_chunked": main,
            "nb_colsum": f"const {a}*, long long, long long, long long, {t}*, long long, {t}*, long long"}
    lines = [f'#include "{_nvrtc.CUDA_DIR / plan.SOURCES[op]}"']
    for expr in plan.all_kernel_exprs(op, dt):
        name = expr.split("<")[0]
        lines.append(f"template __global__ void {expr}({sigs.get(name, main)});")
    return "\n".join(lines) + "\n"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_nvcc_compiles_every_instantiation(tmp_path):
    # Torch extensions compile with these defines: the headers must not rely on implicit half conversions.
    defines = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
               "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"]
    procs = {}
    for op in (LN, RMS):
        for dt in plan.DTYPES:  # one nvcc per (op, dtype), side by side
            src, out = tmp_path / f"{op}_{dt}.cu", tmp_path / f"{op}_{dt}.cubin"
            src.write_text(_nvcc_instantiations(op, dt))
            procs[(op, dt)] = (out, subprocess.Popen(["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas", "-v",
                                                      *defines, "-o",
                                                      str(out), str(src)], stdout=subprocess.PIPE,
                                                     stderr=subprocess.STDOUT, text=True))
    for key, (out, proc) in procs.items():
        log, _ = proc.communicate(timeout=1800)
        assert proc.returncode == 0, f"nvcc failed for {key}:\n{log[-5000:]}"
        assert out.stat().st_size > 0
        # nb_rows2 exists to stay within 64 registers (1024 threads per SM) without spilling.
        rows2 = [r for r in ptxas_usage(log) if "nb_rows2" in r[0]]
        assert len(rows2) == sum("nb_rows2<" in e for e in plan.all_kernel_exprs(*key)), key
        for name, regs, spill_st, spill_ld in rows2:
            assert regs <= 64 and spill_st == spill_ld == 0, (key, name, regs, spill_st, spill_ld)
        # So does nb_rows3 (64 registers whatever the block, N or dtype).
        rows3 = [r for r in ptxas_usage(log) if "nb_rows3" in r[0]]
        assert len(rows3) == sum("nb_rows3<" in e for e in plan.all_kernel_exprs(*key)), key
        for name, regs, spill_st, spill_ld in rows3:
            assert regs <= plan.ROWS3_REGS and spill_st == spill_ld == 0, (key, name, regs, spill_st, spill_ld)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_nvcc_rows3_registers_and_spills(tmp_path):
    """nb_rows3 alone (every instantiation the planner can pick with the default knobs, both ops,
    every dtype): at most ROWS3_REGS registers, no spills; the figures are printed (pytest -s)."""
    defines = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
               "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"]
    bad, count = [], 0
    for op in (LN, RMS):
        src, out = tmp_path / f"{op}.cu", tmp_path / f"{op}.cubin"
        lines = [f'#include "{_nvrtc.CUDA_DIR / plan.SOURCES[op]}"']
        for dt in plan.DTYPES:
            full = _nvcc_instantiations(op, dt).splitlines()
            lines += [ln for ln in full if "nb_rows3<" in ln]
        src.write_text("\n".join(lines) + "\n")
        proc = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas", "-v", *defines, "-o",
                               str(out), str(src)], capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        usage = ptxas_usage(proc.stdout + proc.stderr)
        assert len(usage) == len(lines) - 1
        for name, regs, spill_st, spill_ld in usage:
            count += 1
            print(f"{name}: {regs} registers, spills {spill_st} / {spill_ld} bytes")
            if regs > plan.ROWS3_REGS or spill_st or spill_ld:
                bad.append((name, regs, spill_st, spill_ld))
    assert count >= 2 * len(plan.DTYPES) * 8 and not bad, bad


def ptxas_usage(log: str) -> list[tuple[str, int, int, int]]:
    """(mangled name, registers, spill store bytes, spill load bytes) per entry in a ptxas -v log."""
    out = []
    for part in log.split("Compiling entry function '")[1:]:
        name = part.split("'", 1)[0]
        regs = re.search(r"Used (\d+) registers", part)
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", part)
        out.append((name, int(regs.group(1)), int(spill.group(1)), int(spill.group(2))))
    return out


def test_compile_options_name_the_header_and_its_checksum():
    opts = plan.compile_options()
    assert opts[0] == f"-I{_nvrtc.CUDA_DIR}" and opts[1].startswith("-DNB_COMMON_CRC=0x")


# ============================================================================= emulator
#
# Memory is float64 numpy buffers; a pointer is (buffer, element offset); every store is counted.
# Arithmetic is float64: the emulator checks indexing, coverage and structure, not rounding.


class Buf:
    def __init__(self, values: np.ndarray):
        self.v = np.asarray(values, dtype=np.float64).reshape(-1).copy()
        self.writes = np.zeros(self.v.size, dtype=np.int64)


class Arr:
    """A strided view of a Buf with the attributes the host code reads of a cupy array."""

    def __init__(self, buf: Buf, shape, strides, offset: int, itemsize: int, address: int = 4096):
        self.buf, self.shape, self.offset, self.itemsize = buf, tuple(shape), offset, itemsize
        self.estrides = tuple(strides)
        self.strides = tuple(s * itemsize for s in strides)  # bytes, as cupy has them
        self.dtype = np.dtype({2: np.float16, 4: np.float32, 8: np.float64}[itemsize])
        self.data = SimpleNamespace(ptr=address + offset * itemsize)
        self.size = math.prod(self.shape)

    def _at(self, off: int) -> int:
        i = self.offset + off
        assert 0 <= i < self.buf.v.size, f"access out of bounds: {i} of {self.buf.v.size}"
        return i

    def load(self, off: int) -> float:
        return float(self.buf.v[self._at(off)])

    def store(self, off: int, x: float) -> None:
        i = self._at(off)
        self.buf.v[i] = x
        self.buf.writes[i] += 1

    def address(self, off: int) -> int:
        return self.data.ptr + off * self.itemsize

    def offsets(self) -> np.ndarray:
        idx = np.indices(self.shape).reshape(len(self.shape), -1) if self.shape else np.zeros((0, 1), int)
        return (np.asarray(self.estrides, dtype=np.int64)[:, None] * idx).sum(axis=0)

    def values(self) -> np.ndarray:
        return self.buf.v[self.offset + self.offsets()].reshape(self.shape)

    def writes(self) -> np.ndarray:
        return self.buf.writes[self.offset + self.offsets()].reshape(self.shape)


def _parse(words):
    w = [int(v) for v in np.asarray(words).reshape(-1)]
    assert len(w) == plan.PARAMS_WORDS
    ml, nt = plan.MAX_LEAD, plan.NT
    i = 3 + ml
    strides = [w[i + t * ml:i + (t + 1) * ml] for t in range(nt)]
    i += nt * ml
    p = SimpleNamespace(rows=w[0], n=w[1], nlead=w[2], size=w[3:3 + ml], stride=strides, col=w[i:i + 4],
                        out=w[i + 4:i + 6], flags=w[i + 6], gw=w[i + 7], gw_log2=w[i + 8], rows_per_block=w[i + 9],
                        nparts=w[i + 10], tile_rows=w[i + 11])
    assert p.gw == 1 << p.gw_log2
    assert all(s == 1 for s in p.size[p.nlead:]) and all(all(x == 0 for x in st[p.nlead:]) for st in strides)
    return p


def _row_offsets(p, row):
    """nb_row_offsets."""
    off = [0] * plan.NT
    i = row
    for d in range(p.nlead - 1, -1, -1):
        r, i = (i % p.size[d], i // p.size[d]) if d > 0 else (i, 0)  # the outermost dim takes the rest
        for t in range(plan.NT):
            off[t] += r * p.stride[t][d]
    assert i == 0 or (p.nlead == 0 and row == 0)
    return off


X_, DY_, DX_, MEAN_, RSTD_ = range(5)


class RowMath:
    """The norm's per-row math (nb_xhat / nb_dx) on one row's loaded statistics."""

    def __init__(self, mean_sub: bool, p, x, dy, w, mean, rstd, row):
        self.p, self.mean_sub = p, mean_sub
        self.off = _row_offsets(p, row)
        self.r = rstd.load(self.off[RSTD_])
        self.m = mean.load(self.off[MEAN_]) if mean_sub else 0.0
        self.x, self.dy, self.w = x, dy, w

    def terms(self, c, vec):
        """(xhat, dy, g) of column c; with vec > 1 checks the 16-byte access rule."""
        p = self.p
        xo, do = self.off[X_] + c * p.col[X_], self.off[DY_] + c * p.col[DY_]
        if vec > 1 and c % vec == 0:
            assert p.col[X_] == p.col[DY_] == 1
            assert self.x.address(xo) % 16 == 0 and self.dy.address(do) % 16 == 0, "misaligned vector load"
        xh = (self.x.load(xo) - self.m) * self.r
        d = self.dy.load(do)
        has_w = p.flags & plan.HAS_W
        g = self.w.load(c * p.col[3]) * d if has_w else d
        return xh, d, g

    def dx(self, g, xh, a, b):
        return self.r * (g - a - xh * b) if self.mean_sub else self.r * (g - xh * b)

    def store_dx(self, dx, c, value, vec):
        o = self.off[DX_] + c * self.p.col[DX_]
        if vec > 1 and c % vec == 0:
            assert self.p.col[DX_] == 1 and dx.address(o) % 16 == 0, "misaligned vector store"
        dx.store(o, value)


def emu_rows(mean_sub, vec, vpt, wide, grid, block, p, x, dy, w, mean, rstd, dx, part, dw, db):
    assert block in (plan.ROWS_BLOCK, *plan.ROWS2_BLOCKS) and wide == (p.gw > 32) and p.gw <= block
    n, gw = p.n, p.gw
    ngrp = block // gw
    has_w, has_b = p.flags & plan.HAS_W, p.flags & plan.HAS_B
    cols = [(lane, k, e, (k * gw + lane) * vec + e) for lane in range(gw) for k in range(vpt) for e in range(vec)
            if (k * gw + lane) * vec < n]
    assert sorted(c for *_, c in cols) == list(range(n)), "columns not covered exactly once"
    for b in range(grid):
        r_lo = b * p.rows_per_block
        r_hi = min(p.rows, r_lo + p.rows_per_block)
        acc = {}  # (group, column) -> [dweight, dbias] sums
        for base in range(r_lo, r_hi, ngrp):
            for g in range(ngrp):
                row = base + g
                if row >= r_hi:
                    continue
                rm = RowMath(mean_sub, p, x, dy, w, mean, rstd, row)
                t = {c: rm.terms(c, vec) for *_, c in cols}
                a = sum(v[2] for v in t.values()) / n
                bb = sum(v[2] * v[0] for v in t.values()) / n
                for c, (xh, d, gv) in t.items():
                    rm.store_dx(dx, c, rm.dx(gv, xh, a, bb), vec)
                    s = acc.setdefault((g, c), [0.0, 0.0])
                    s[0] += d * xh
                    s[1] += d
        for *_, c in cols:
            sw = sum(acc.get((g, c), [0.0, 0.0])[0] for g in range(ngrp))
            sb = sum(acc.get((g, c), [0.0, 0.0])[1] for g in range(ngrp))
            if p.nparts == 1:
                if has_w:
                    dw.store(c * p.out[0], sw)
                if has_b:
                    db.store(c * p.out[1], sb)
            else:
                if has_w:
                    part.store(b * n + c, sw)
                if has_b:
                    part.store((p.nparts + b) * n + c, sb)


def emu_chunked(mean_sub, vec, vpt, grid, block, p, x, dy, w, mean, rstd, dx, part):
    assert block == plan.CHUNK_BLOCK and 1 <= p.tile_rows <= plan.MAX_TILE_ROWS
    n = p.n
    chunk = block * vpt * vec
    has_w, has_b = p.flags & plan.HAS_W, p.flags & plan.HAS_B
    for b in range(grid):
        r_lo = b * p.rows_per_block
        r_hi = min(p.rows, r_lo + p.rows_per_block)
        for t0 in range(r_lo, r_hi, p.tile_rows):
            tile = range(t0, min(r_hi, t0 + p.tile_rows))
            stats = {}
            for row in tile:  # pass 1
                rm = RowMath(mean_sub, p, x, dy, w, mean, rstd, row)
                terms = [rm.terms(c, vec) for c in range(n)]
                stats[row] = (rm, sum(v[2] for v in terms) / n, sum(v[2] * v[0] for v in terms) / n)
            for c0 in range(0, n, chunk):  # pass 2
                cs = [c0 + (k * block + tid) * vec + e for tid in range(block) for k in range(vpt) for e in range(vec)]
                cs = [c for c in cs if c < n]
                assert len(set(cs)) == len(cs)
                acc = {c: [0.0, 0.0] for c in cs}
                for row in tile:
                    rm, a, bb = stats[row]
                    for c in cs:
                        xh, d, gv = rm.terms(c, vec)
                        rm.store_dx(dx, c, rm.dx(gv, xh, a, bb), vec)
                        acc[c][0] += d * xh
                        acc[c][1] += d
                for c in cs:
                    for on, slot, val in ((has_w, b, acc[c][0]), (has_b, p.nparts + b, acc[c][1])):
                        if on:
                            q = slot * n + c
                            part.store(q, val if t0 == r_lo else part.load(q) + val)


def emu_coop_colsum(p, part, dw, db):
    """nb_rows3's column-sum phase (after the grid barrier): dweight's then dbias's partial rows."""
    n, np_ = p.n, p.nparts
    for which, on, out in ((0, p.flags & plan.HAS_W, dw), (1, p.flags & plan.HAS_B, db)):
        if on:
            for j in range(n):
                out.store(j * p.out[which], sum(part.load((which * np_ + r) * n + j) for r in range(np_)))


def emu_colsum(grid, block, part, row0, nparts, n, out0, s0, out1, s1):
    gx, gy = grid
    assert block == plan.COLSUM_BLOCK and gx * plan.COLSUM_COLS >= n and gy in (1, 2)
    for y in range(gy):
        out, s = (out0, s0) if y == 0 else (out1, s1)
        for j in range(n):
            out.store(j * s, sum(part.load((row0 + y * nparts + r) * n + j) for r in range(nparts)))


def emu_rung(rung, cpt, grid, block, p, x, dy, w, mean, rstd, dx, acc):
    """ln_v1 ... ln_v5: which threads take which rows, and the atomics into acc [dweight | dbias]."""
    n = p.n
    has_w, has_b = p.flags & plan.HAS_W, p.flags & plan.HAS_B
    if rung == "v1":
        assert block == plan.V1_BLOCK
        rows = [[bi * block + t for t in range(block) if bi * block + t < p.rows] for bi in range(grid)]
    elif rung in ("v2", "v3", "v4"):
        assert block == (32 if rung != "v4" else plan.V4_BLOCK)
        rows = [[bi] for bi in range(grid)]
    else:
        assert block == plan.V4_BLOCK and cpt * block >= n
        rows = [list(range(bi * p.rows_per_block, min(p.rows, (bi + 1) * p.rows_per_block))) for bi in range(grid)]
    assert sorted(r for rs in rows for r in rs) == list(range(p.rows)), "rows not covered exactly once"
    for rs in rows:
        for row in rs:
            rm = RowMath(True, p, x, dy, w, mean, rstd, row)
            t = [rm.terms(c, 1) for c in range(n)]
            a, bb = sum(v[2] for v in t) / n, sum(v[2] * v[0] for v in t) / n
            for c, (xh, d, gv) in enumerate(t):
                rm.store_dx(dx, c, rm.dx(gv, xh, a, bb), 1)
                if has_w:
                    acc.buf.v[acc.offset + c] += d * xh
                if has_b:
                    acc.buf.v[acc.offset + n + c] += d


class EmuDevice:
    def __init__(self):
        self.launches: list[str] = []
        self.parts: list[Arr] = []
        self.coop: list[str] = []

    def workspace(self, entry, n, dtype):
        buf = entry.workspace.get("emu")
        if buf is None:
            buf = entry.workspace["emu"] = Arr(Buf(np.full(n, np.nan)), (n,), (1,), 0, np.dtype(dtype).itemsize)
            self.parts.append(buf)
        assert buf.size >= n
        return buf

    def zeros(self, n, dtype):
        return Arr(Buf(np.zeros(n)), (n,), (1,), 0, np.dtype(dtype).itemsize)

    def barrier(self, entry):
        return Arr(Buf(np.zeros(2)), (2,), (1,), 0, 4)

    def fill_zero(self, x):
        for off in x.offsets():
            x.store(int(off), 0.0)

    def launch(self, source, expr, grid, block, args, smem=0, coop=False):
        self.launches.append(expr)
        if coop:
            self.coop.append(expr)
        name, targs = expr.split("<", 1)
        targs = [s.strip() for s in targs.rstrip(">").split(",")]
        args = [None if isinstance(a, np.uint64) and int(a) == 0 else a for a in args]
        if name == "nb_colsum":
            part, row0, nparts, n, o0, s0, o1, s1 = args
            emu_colsum(grid, block, part, int(row0), int(nparts), int(n), o0, int(s0), o1, int(s1))
            return
        assert isinstance(args[0], np.ndarray) and args[0].dtype == plan.PARAMS_DTYPE and args[0].size == 1
        p = _parse(args[0]["words"][0])
        assert isinstance(grid, int) and grid >= 1
        if name == "nb_rows":
            mean_sub = targs[0] == "NBLayerNorm"
            assert source == plan.SOURCES[LN if mean_sub else RMS]
            emu_rows(mean_sub, int(targs[2]), int(targs[3]), targs[4] == "true", grid, block, p, *args[1:])
        elif name == "nb_rows2":  # nb_rows' work split and sums in its own block size
            mean_sub = targs[0] == "NBLayerNorm"
            assert source == plan.SOURCES[LN if mean_sub else RMS]
            assert block == int(targs[4]) and int(targs[5]) in (1, 2) and block % p.gw == 0
            emu_rows(mean_sub, int(targs[2]), int(targs[3]), p.gw > 32, grid, block, p, *args[1:])
        elif name == "nb_rows3":  # nb_rows' work split and sums in its own block, then the fused finish
            mean_sub = targs[0] == "NBLayerNorm"
            assert source == plan.SOURCES[LN if mean_sub else RMS]
            dt = next(k for k, v in plan.CUDA_TYPE.items() if v == targs[1])
            vpt, gw, stages = int(targs[2]), int(targs[3]), int(targs[4])
            assert gw == p.gw and block == plan.rows3_block(gw) and p.rows_per_block % (block // gw) == 0
            assert smem == plan.rows3_smem_bytes(dt, vpt, gw, stages) <= plan.ROWS3_SMEM_LIMIT
            phases = p.flags & (plan.PHASE_ROWS | plan.PHASE_COLS)
            assert phases in (plan.PHASE_ROWS, plan.PHASE_ROWS | plan.PHASE_COLS)
            assert coop == (phases == plan.PHASE_ROWS | plan.PHASE_COLS)
            x, dy, w, mean, rstd, dx, part, dw, db, bar = args[1:]
            assert (bar is not None) == coop and (part is not None) == (coop or p.nparts > 1 and bool(p.flags & 3))
            p.flags &= plan.HAS_W | plan.HAS_B
            emu_rows(mean_sub, 16 // plan.ITEMSIZE[dt], vpt, gw > 32, grid, block, p, x, dy, w, mean, rstd, dx, part,
                     dw, db)
            if coop:
                emu_coop_colsum(p, part, dw, db)
        elif name == "nb_chunked":
            mean_sub = targs[0] == "NBLayerNorm"
            emu_chunked(mean_sub, int(targs[2]), int(targs[3]), grid, block, p, *args[1:])
        elif name.startswith("ln_v"):
            assert source == plan.SOURCES[LN]
            emu_rung(name[3:], int(targs[1]) if len(targs) > 1 else 0, grid, block, p, *args[1:])
        else:
            raise AssertionError(f"unknown kernel {expr}")


# ============================================================================= emulated runs


_NEXT_ADDRESS = [1 << 20]


def _address(nbytes: int) -> int:
    """A fresh 256-byte aligned fake device address with room for nbytes (+ a gap)."""
    addr = _NEXT_ADDRESS[0]
    _NEXT_ADDRESS[0] += (nbytes // 256 + 2) * 256
    return addr


def _layout(values: np.ndarray, layout: str, itemsize: int, address: int | None = None):
    """An Arr holding `values` in a harness layout (contig, transposed, sliced with NaN gaps)."""
    shape = values.shape
    address = _address(2 * (values.size + 1) * itemsize + 64) + (address or 0)  # address: an extra offset
    if layout == "transposed":
        stored = np.ascontiguousarray(np.swapaxes(values, -1, -2))
        strides = list(np.array(stored.strides) // 8)
        strides[-1], strides[-2] = strides[-2], strides[-1]
        return Arr(Buf(stored), shape, strides, 0, itemsize, address)
    if layout == "sliced":
        wide = np.full(shape[:-1] + (2 * shape[-1] + 1,), np.nan)
        wide[..., 1::2][..., :shape[-1]] = values
        strides = list(np.array(wide.strides) // 8)
        strides[-1] = 2
        return Arr(Buf(wide), shape, strides, 1, itemsize, address)
    strides = np.array(np.empty(shape).strides, dtype=np.int64) // 8 if shape else ()
    return Arr(Buf(values if values.size else np.zeros(1)), shape, tuple(strides), 0, itemsize, address)


def _out(shape, itemsize):
    return _layout(np.full(shape, np.nan), "contig", itemsize)


def emulate(op, shape, dt="f32", has_w=True, has_b=True, layouts=("contig", "contig"), variant="best",
            num_sms=4, occupancy=None, seed=0, misalign=False, calls=1, knobs=""):
    """Run `variant` through _norm_plan.run on the emulator with the settings `knobs`
    (GRADORACLE_CUPY_NORMS' syntax); check against the float64 oracle."""
    rng = np.random.default_rng(seed)
    item = plan.ITEMSIZE[dt]
    if op == RMS:
        has_b = False
    n = shape[-1]
    dev = EmuDevice()
    entry = None
    for call_no in range(calls):
        x_v = rng.uniform(-2, 2, shape) + rng.uniform(-1, 1, shape[:-1] + (1,))
        dy_v = rng.uniform(-1, 1, shape)
        w_v = rng.uniform(0.5, 1.5, (n,))
        mean_v = x_v.mean(axis=-1) if op == LN else None
        if op == LN:
            rstd_v = 1 / np.sqrt(((x_v - x_v.mean(axis=-1, keepdims=True)) ** 2).mean(axis=-1) + 1e-5)
        else:
            rstd_v = 1 / np.sqrt((x_v ** 2).mean(axis=-1) + 1e-6)
        arrays = {"x": _layout(x_v, layouts[1], item, item if misalign else 0),
                  "dy": _layout(dy_v, layouts[0], item),
                  "weight": _layout(w_v, "contig", item) if has_w else None,
                  "mean": _layout(np.asarray(mean_v), "contig", 8 if dt == "f64" else 4) if op == LN else None,
                  "rstd": _layout(np.asarray(rstd_v), "contig", 8 if dt == "f64" else 4),
                  "dx": _out(shape, item),
                  "dweight": _out((n,), item) if has_w else None,
                  "dbias": _out((n,), item) if has_b else None}
        arrs = tuple(arrays[k] for k in plan.NAMES)
        ptrs = [0 if a is None else a.data.ptr for a in arrs]
        aligned = not any(ptrs[plan.NAMES.index(k)] % 16 for k in ("x", "dy", "dx", "weight"))
        if entry is None:
            entry = plan.build_entry(op, variant, dt, arrays, aligned, num_sms, occupancy, plan.settings(knobs))
        plan.check_overlap(entry, ptrs)
        plan.run(dev, entry, arrs)
        if op == LN:
            want = layernorm_backward_numpy(dy_v, x_v, w_v if has_w else None, 1e-5, has_b)
        else:
            want = rmsnorm_backward_numpy(dy_v, x_v, w_v, 1e-6)
        for name in ("dx", "dweight", "dbias"):
            got = arrays[name]
            if got is None:
                assert name not in want
                continue
            if got.size:
                np.testing.assert_allclose(got.values(), want[name], rtol=1e-9, atol=1e-9,
                                           err_msg=f"{name} call {call_no} {dev.launches}")
                assert (got.writes() == 1).all(), f"{name}: elements written {got.writes()} times"
    return entry, dev


def test_small_n_takes_several_rows_per_block():
    entry, dev = emulate(LN, (40, 5), num_sms=2, knobs="kernel=rows")  # N = 5: scalar, gw = 8, 64 groups per block
    launch = entry.launch
    assert launch.kind == "rows" and launch.vec == 1 and launch.gw == 8 and launch.vpt == 1
    assert launch.nparts == 1 and not launch.colsum  # 40 rows fit one step of one block
    entry, dev = emulate(LN, (300, 8), num_sms=2, knobs="kernel=rows")  # vec 4: gw = 2, 256 groups; 2 blocks
    launch = entry.launch
    assert launch.kind == "rows" and launch.vec == 4 and launch.gw == 2 and launch.vpt == 1
    assert launch.nparts == 2 and launch.colsum and dev.launches[-1] == "nb_colsum<float>"
    assert launch.rows_per_block % (plan.ROWS_BLOCK // launch.gw) == 0


@pytest.mark.parametrize("knobs", ["", "kernel=rows", "kernel=rows3,finish=colsum,stages=2"])
@pytest.mark.parametrize("op", [LN, RMS])
@pytest.mark.parametrize("dt", ["f32", "bf16", "f64"])
@pytest.mark.parametrize("shape", [(3, 5), (2, 2, 6), (7,), (1, 17), (4, 1), (37, 64), (9, 256), (5, 1023), (70, 24)])
def test_emulated_best_matches_oracle(op, dt, shape, knobs):
    entry, dev = emulate(op, shape, dt, num_sms=3, knobs=knobs)
    vec = plan.vector_width(entry.layout, plan.ITEMSIZE[dt], True, True)
    kernel = dict(k.split("=") for k in knobs.split(",") if k).get("kernel", "rows3")  # rows3: the default
    assert entry.launch.kind == ("rows3" if vec > 1 and kernel == "rows3" else "rows")
    coop = entry.launch.kind == "rows3" and "colsum" not in knobs and entry.launch.nparts > 1
    assert bool(dev.coop) == entry.launch.coop == coop


@pytest.mark.parametrize("has_w,has_b", [(True, True), (True, False), (False, True), (False, False)])
@pytest.mark.parametrize("shape,num_sms", [((13, 24), 1), ((70, 24), 4), ((9, 1100), 4)])
def test_emulated_best_affine_and_bias_forms(has_w, has_b, shape, num_sms):
    entry, dev = emulate(LN, shape, "f32", has_w=has_w, has_b=has_b, num_sms=num_sms)
    if not (has_w or has_b):
        assert not entry.launch.colsum and "nb_colsum<float>" not in dev.launches


def test_m1_needs_no_second_stage():
    for shape in [(1, 4096), (4096,), (1, 17)]:
        for knobs in ("", "kernel=rows"):
            entry, dev = emulate(LN, shape, "bf16", num_sms=132, knobs=knobs)
            assert entry.launch.nparts == 1 and not entry.launch.colsum and len(dev.launches) == 1
            assert not entry.launch.coop and not dev.coop and entry.ws_size == 0
    entry, _ = emulate(LN, (1, 4096), "bf16", knobs="kernel=rows")
    assert entry.launch.vec == 8 and entry.launch.gw == 256 and entry.launch.vpt == 2


@pytest.mark.parametrize("op", [LN, RMS])
@pytest.mark.parametrize("dt,n", [("f32", 9000), ("bf16", 8200), ("f64", 2050), ("f32", 4097)])
def test_large_n_is_chunked(op, dt, n):
    entry, dev = emulate(op, (3, n), dt, num_sms=2, calls=2, knobs="kernel=rows")  # the 2nd call reuses the workspace
    launch = entry.launch
    assert launch.kind == "chunked" and launch.colsum and dev.launches[-1].startswith("nb_colsum")
    assert launch.vec == (1 if n % (16 // plan.ITEMSIZE[dt]) else 16 // plan.ITEMSIZE[dt])
    assert n > plan.CHUNK_BLOCK * launch.vpt * launch.vec  # several chunks


def test_chunked_tiles_and_parts(monkeypatch):
    monkeypatch.setattr(plan, "TILE_ROWS", 2)
    entry, _ = emulate(LN, (11, 4100), "f32", num_sms=2, has_b=False, knobs="kernel=rows")
    assert entry.launch.kind == "chunked" and entry.launch.nparts == 2 and entry.launch.tile_rows == 2
    entry, _ = emulate(LN, (5, 4100), "f32", num_sms=1, has_w=False, knobs="kernel=rows")
    assert entry.launch.nparts == 1 and entry.launch.colsum


@pytest.mark.parametrize("layouts", [("transposed", "contig"), ("contig", "transposed"), ("sliced", "contig"),
                                     ("contig", "sliced"), ("transposed", "sliced")])
@pytest.mark.parametrize("shape", [(33, 65), (4, 5, 6), (3, 40)])
def test_emulated_strided_inputs(layouts, shape):
    entry, _ = emulate(LN, shape, "bf16", layouts=layouts, num_sms=2)
    assert entry.launch.vec == 1  # a strided N or an odd row stride: scalar accesses
    if shape == (4, 5, 6) and "transposed" in layouts:
        assert len(entry.layout.sizes) == 2  # (4, 5) leading dims do not merge
    emulate(RMS, shape, "f32", layouts=layouts, num_sms=2)


def test_zero_rows_write_zero_sums():
    for shape in [(0, 8), (2, 0, 16)]:
        entry, dev = emulate(LN, shape, "bf16")
        assert entry.launch.kind == "zero" and dev.launches == []
        emulate(RMS, shape, "f32")


def test_misaligned_pointer_takes_scalar_path():
    entry, _ = emulate(LN, (6, 64), "f32", misalign=True)
    assert entry.launch.vec == 1
    entry, _ = emulate(LN, (6, 64), "f32")
    assert entry.launch.vec == 4


def test_occupancy_sets_the_grid():
    seen = []

    def occupancy(expr, block, smem=0):
        seen.append((expr, block, smem))
        return 2

    for kernel in ("rows", "rows3"):  # gw 128: 4 rows a step (nb_rows), 2 (nb_rows3: 8 rows a block at least)
        entry, _ = emulate(LN, (64, 1024), "f32", num_sms=2, occupancy=occupancy, knobs=f"kernel={kernel}")
        assert entry.launch.kind == kernel and entry.launch.nparts == 4
    assert seen[-1] == (entry.launch.expr, entry.launch.block, entry.launch.smem) and entry.launch.smem > 48 * 1024


@pytest.mark.parametrize("rung", plan.RUNGS)
@pytest.mark.parametrize("shape", [(3, 5), (2, 2, 6), (7,), (4, 1), (40, 33), (5, 1100)])
def test_emulated_rungs_match_oracle(rung, shape):
    entry, dev = emulate(LN, shape, "f32", variant=rung, num_sms=2)
    assert entry.launch.kind == rung and dev.launches[0].startswith(f"ln_{rung}<")


@pytest.mark.parametrize("rung", plan.RUNGS)
@pytest.mark.parametrize("has_w,has_b", [(True, False), (False, True), (False, False)])
def test_emulated_rungs_affine_and_bias_forms(rung, has_w, has_b):
    emulate(LN, (6, 10), "bf16", has_w=has_w, has_b=has_b, variant=rung, layouts=("sliced", "transposed"))


def test_rungs_on_zero_rows():
    for rung in plan.RUNGS:
        entry, dev = emulate(LN, (0, 8), "f32", variant=rung)
        assert entry.launch.kind == "zero" and dev.launches == []


# ============================================================================= planning


def _contig(shape):
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(out))


def test_merge_lead():
    sizes, strides = plan.merge_lead((4, 1, 5, 6), [(30, 30, 6, 1), (60, 60, 12, 2)])
    assert sizes == (120,) and strides == ((1,), (2,))
    sizes, strides = plan.merge_lead((4, 5), [(5, 1), (1, 4)])  # one tensor transposed: no merge
    assert sizes == (4, 5) and strides == ((5, 1), (1, 4))
    assert plan.merge_lead((), [(), ()]) == ((), ((), ()))
    assert plan.merge_lead((1, 1), [(3, 3)]) == ((), ((),))


def test_layout_of_contiguous_rank3():
    shape = (4, 8, 64)
    st = {k: _contig(shape) for k in ("x", "dy", "dx")}
    st.update(mean=_contig(shape[:-1]), rstd=_contig(shape[:-1]), weight=(1,), dweight=(1,), dbias=(1,))
    layout = plan.make_layout(LN, shape, st)
    assert layout.rows == 32 and layout.n == 64 and layout.sizes == (32,)
    assert layout.strides == ((64,), (64,), (64,), (1,), (1,)) and layout.col == (1, 1, 1, 1)
    assert plan.vector_width(layout, 2, True, True) == 8 and plan.vector_width(layout, 2, False, True) == 1


@pytest.mark.parametrize("dt,n,vec,vpt,gw", [
    ("bf16", 4096, 8, 2, 256), ("bf16", 8192, 8, 2, 512), ("bf16", 1024, 8, 2, 64), ("f32", 2048, 4, 2, 256),
    ("f32", 4096, 4, 2, 512), ("f16", 4096, 8, 2, 256), ("bf16", 64, 8, 1, 8), ("f32", 1, 1, 1, 1),
    ("bf16", 1023, 1, 8, 128), ("f64", 2048, 2, 2, 512)])
def test_rows_config_of_the_perf_shapes(dt, n, vec, vpt, gw):
    assert plan.rows_config(n, vec, plan.ITEMSIZE[dt]) == (vpt, gw)


@pytest.mark.parametrize("dt,n,vec", [("bf16", 8200, 8), ("f32", 4100, 4), ("f64", 2050, 2), ("bf16", 12289, 1),
                                      ("bf16", 65536, 8), ("f32", 65536, 4)])
def test_rows_that_do_not_fit_are_chunked(dt, n, vec):
    assert plan.rows_config(n, vec, plan.ITEMSIZE[dt]) is None


def _layout_for(shape):
    st = {k: _contig(shape) for k in ("x", "dy", "dx")}
    st.update(mean=_contig(shape[:-1]), rstd=_contig(shape[:-1]), weight=(1,), dweight=(1,), dbias=(1,))
    return plan.make_layout(LN, shape, st)


@pytest.mark.parametrize("shape,dt", [((2048, 4096), "bf16"), ((16, 64, 2048), "f32"), ((8192, 8192), "bf16"),
                                      ((262145, 8192), "bf16"), ((2048, 4096), "f32")])
def test_perf_shapes_plan_one_block_per_sm(shape, dt):
    layout = _layout_for(shape)
    launch = plan.plan_best(LN, dt, layout, True, True, 16 // plan.ITEMSIZE[dt], 132, None, plan.settings("kernel=rows"))
    assert launch.kind == "rows" and launch.colsum and launch.block == plan.ROWS_BLOCK and launch.smem == 0
    assert 120 <= launch.nparts <= 132 and launch.nparts * launch.rows_per_block >= layout.rows
    assert (launch.nparts - 1) * launch.rows_per_block < layout.rows
    assert launch.expr in plan.all_kernel_exprs(LN, dt)


def test_all_kernel_exprs_cover_every_plan():
    for op in (LN, RMS):
        for dt in plan.DTYPES:
            exprs = set(plan.all_kernel_exprs(op, dt))
            item = plan.ITEMSIZE[dt]
            for n in list(range(1, 70)) + [127, 128, 129, 1000, 1023, 1024, 2048, 4095, 4096, 4097, 8192, 8193, 65536]:
                for vec in {1, 16 // item}:
                    if vec > 1 and n % vec:
                        continue
                    shape = (3, n)
                    layout = _layout_for(shape)
                    launch = plan.plan_best(op, dt, layout, True, op == LN, vec)
                    assert launch.expr in exprs, (op, dt, n, vec, launch.expr)
            if op == LN:
                for rung in plan.RUNGS:
                    for n in (1, 1000, 1025, 16384):
                        assert plan.plan_rung(rung, dt, _layout_for((2, n)), True, True).expr in exprs


def test_v5_limit():
    with pytest.raises(ValueError, match="cupy@v5: N = 16385, expected at most 16384"):
        plan.plan_rung("v5", "f32", _layout_for((2, 16385)), True, True)
    from backends.cupy import layernorm_backward as ln_mod

    case = SimpleNamespace(params={"shape": [2, 16385]})
    assert "N = 16385 > 16384" in ln_mod._v5_supports(case)
    assert ln_mod._v5_supports(SimpleNamespace(params={"shape": [2, 16384]})) is None


def test_rungs_are_layernorm_only():
    shape = (4, 8)
    arrays = {"x": _layout(np.ones(shape), "contig", 4), "dy": _layout(np.ones(shape), "contig", 4),
              "weight": _layout(np.ones(8), "contig", 4), "mean": None, "rstd": _layout(np.ones(4), "contig", 4),
              "dx": _out(shape, 4), "dweight": _out((8,), 4), "dbias": None}
    with pytest.raises(ValueError, match="rmsnorm_backward: variant 'v2' has no kernel"):
        plan.build_entry(RMS, "v2", "f32", arrays, True, 4)


def test_layout_limits_are_clear_errors():
    shape = (2,) * 8 + (4,)
    st = {"x": _contig((3,) * 8 + (4,))}  # a padded buffer: no two leading dims merge
    st.update(dy=_contig(shape), dx=_contig(shape), mean=_contig(shape[:-1]), rstd=_contig(shape[:-1]))
    with pytest.raises(ValueError, match="leading dims that do not merge, expected at most 6"):
        plan.make_layout(LN, shape, st)


def test_overlapping_output_is_rejected():
    shape = (4, 8)
    arrays = {"x": _layout(np.ones(shape), "contig", 4), "dy": _layout(np.ones(shape), "contig", 4),
              "weight": _layout(np.ones(8), "contig", 4), "mean": None, "rstd": _layout(np.ones(4), "contig", 4),
              "dx": _out(shape, 4), "dweight": _out((8,), 4), "dbias": None}
    entry = plan.build_entry(RMS, "best", "f32", arrays, True, 4)
    ptrs = [0 if arrays[k] is None else arrays[k].data.ptr for k in plan.NAMES]
    plan.check_overlap(entry, ptrs)

    def moved(name, to):
        out = list(ptrs)
        out[plan.NAMES.index(name)] = ptrs[plan.NAMES.index(to)] + (64 if name == "dx" else 0)
        return out

    with pytest.raises(ValueError, match="rmsnorm_backward: dx shares memory with x"):
        plan.check_overlap(entry, moved("dx", "x"))
    with pytest.raises(ValueError, match="rmsnorm_backward: dweight shares memory with weight"):
        plan.check_overlap(entry, moved("dweight", "weight"))
    with pytest.raises(ValueError, match="rmsnorm_backward: dx shares memory with dweight"):
        plan.check_overlap(entry, moved("dweight", "dx"))
    plan.check_overlap(entry, moved("rstd", "x"))  # inputs may share memory


def test_strided_output_is_rejected():
    shape = (4, 8)
    wide = _out((4, 16), 4)
    dx = Arr(wide.buf, shape, (16, 2), 0, 4, wide.data.ptr)  # every other column: not contiguous
    arrays = {"x": _layout(np.ones(shape), "contig", 4), "dy": _layout(np.ones(shape), "contig", 4),
              "weight": _layout(np.ones(8), "contig", 4), "mean": None, "rstd": _layout(np.ones(4), "contig", 4),
              "dx": dx, "dweight": _out((8,), 4), "dbias": None}
    with pytest.raises(ValueError, match=r"rmsnorm_backward: dx must be C-contiguous, got strides \(64, 8\)"):
        plan.build_entry(RMS, "best", "f32", arrays, True, 4)
    assert plan._c_contiguous((3, 1, 5), (20, 4, 4), 4) and plan._c_contiguous((0, 5), (4, 8), 4)
    assert not plan._c_contiguous((3, 5), (4, 12), 4)


def test_weight_without_dweight_is_rejected():
    shape = (4, 8)
    arrays = {"x": _layout(np.ones(shape), "contig", 4), "dy": _layout(np.ones(shape), "contig", 4),
              "weight": _layout(np.ones(8), "contig", 4), "mean": _layout(np.ones(4), "contig", 4),
              "rstd": _layout(np.ones(4), "contig", 4), "dx": _out(shape, 4), "dweight": None, "dbias": None}
    with pytest.raises(ValueError, match="weight and dweight must come together"):
        plan.build_entry(LN, "best", "f32", arrays, True, 4)


# ============================================================================= backend surface


def test_variants_registered_in_ladder_order():
    from backends.cupy import cupy_backend, layernorm_backward, rmsnorm_backward  # noqa: F401

    ln = [v for (op, v) in cupy_backend.impls if op == LN]
    assert ln == ["v1", "v2", "v3", "v4", "v5", "v6", "v7", "best"]
    assert [v for (op, v) in cupy_backend.impls if op == RMS] == ["v6", "v7", "best"]
    for op in (LN, RMS):
        for v in ("v6", "v7", "best"):
            impl = cupy_backend.impls[(op, v)]
            assert impl.deterministic and set(impl.dtypes) == {"f32", "f16", "bf16", "f64"}
    assert not any(cupy_backend.impls[(LN, r)].deterministic for r in plan.RUNGS)
    assert hasattr(cupy_backend.impls[(LN, "best")].fn, "unchecked")


def test_importing_the_modules_does_not_import_cupy():
    code = ("import sys; import backends.cupy.layernorm_backward, backends.cupy.rmsnorm_backward, "
            "backends.cupy._norm_plan; assert 'cupy' not in sys.modules, 'cupy imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(_nvrtc.CUDA_DIR.parent.parent))


# ============================================================================= the cupy device's launch paths
#
# CupyDevice over a fake cupy and a fake driver: what cuLaunchKernel would read from the argument
# arrays (`run_fast`, and `launch` for cooperative launches) must be what `run` passes to
# cupy.RawKernel for the same call.


class _FakeArray:
    def __init__(self, n, dtype):
        self.a = np.zeros(n, dtype=dtype)
        self.data = SimpleNamespace(ptr=self.a.ctypes.data)


class _FakeCupy:
    ndarray = _FakeArray

    def __init__(self):
        self.cuda = SimpleNamespace(get_current_stream=lambda: SimpleNamespace(ptr=0x5100),
                                    runtime=SimpleNamespace(getDevice=lambda: 0))

    def empty(self, n, dtype):
        return _FakeArray(n, dtype)

    zeros = empty


class _FakeDriver:
    """Decodes each launch's arguments when it is made (the arrays may be refilled afterwards)."""

    def __init__(self, structs: dict):
        self.structs, self.launches, self.attrs = structs, [], []  # function -> which arguments are NBParams

    def funcSetAttribute(self, f, attr, value):
        self.attrs.append((f, attr, value))

    def _decode(self, f, params):
        import ctypes

        kinds = self.structs[f]
        addrs = list((ctypes.c_uint64 * len(kinds)).from_address(params))
        return [list((ctypes.c_int64 * plan.PARAMS_WORDS).from_address(a)) if struct else
                ctypes.c_uint64.from_address(a).value for a, struct in zip(addrs, kinds)]

    def launchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        assert extra == 0 and gz == by == bz == 1
        self.launches.append((f, (gx, gy), bx, smem, stream, False, self._decode(f, params)))

    def launchCooperativeKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params):
        assert gz == by == bz == 1
        self.launches.append((f, (gx, gy), bx, smem, stream, True, self._decode(f, params)))


def _fake_device(entry):
    exprs = {k.expr: 1000 + i for i, k in enumerate(entry.kernels)}
    structs = {exprs[k.expr]: [isinstance(a, np.ndarray) for a in k.args] for k in entry.kernels}
    dev = object.__new__(plan.CupyDevice)
    dev.cupy, dev.driver = _FakeCupy(), _FakeDriver(structs)
    dev._function = lambda source, expr, opts: SimpleNamespace(kernel=SimpleNamespace(ptr=exprs[expr]))
    dev._occupancy, dev._smem_set = {}, set()
    return dev, exprs


def _value(a):
    """What cuLaunchKernel should read for argument `a`: the struct's words, an array's address, an int."""
    if isinstance(a, np.ndarray) and a.dtype == plan.PARAMS_DTYPE:
        return [int(w) for w in a["words"][0]]
    if isinstance(a, np.integer):
        return int(a) & (2**64 - 1)
    return a.data.ptr


@pytest.mark.parametrize("op,dt,shape,has_w,has_b,knobs", [
    (LN, "bf16", (300, 64), True, True, ""), (LN, "bf16", (300, 64), False, True, ""),
    (LN, "f32", (300, 4096), True, True, "kernel=rows3,stages=2"), (RMS, "bf16", (40, 4096), True, False, ""),
    (LN, "f32", (70, 33), True, True, ""), (LN, "f32", (70, 9000), True, False, ""),
    (LN, "bf16", (300, 64), True, True, "kernel=rows"), (LN, "bf16", (1, 64), True, True, ""),
    (LN, "bf16", (300, 4096), True, True, "kernel=rows3"), (RMS, "f32", (300, 1024), True, False,
                                                            "kernel=rows3,finish=colsum")])
def test_run_fast_passes_what_run_passes(op, dt, shape, has_w, has_b, knobs):
    item = plan.ITEMSIZE[dt]
    n = shape[-1]
    arrays = {"x": _layout(np.ones(shape), "contig", item), "dy": _layout(np.ones(shape), "contig", item),
              "weight": _layout(np.ones(n), "contig", item) if has_w else None,
              "mean": _layout(np.ones(shape[0]), "contig", 4) if op == LN else None,
              "rstd": _layout(np.ones(shape[0]), "contig", 4), "dx": _out(shape, item),
              "dweight": _out((n,), item) if has_w else None, "dbias": _out((n,), item) if has_b else None}
    entry = plan.build_entry(op, "best", dt, arrays, True, 8, knobs=plan.settings(knobs))
    vec = 16 // item
    rows3 = plan.settings(knobs)["kernel"] == "rows3" and n % vec == 0 and plan.rows3_config(n, vec, item) is not None
    assert entry.fast and (entry.launch.kind == "rows3") == rows3
    dev, exprs = _fake_device(entry)
    ptrs = [0 if arrays[k] is None else arrays[k].data.ptr for k in plan.NAMES]
    for _ in range(2):  # the second call reuses the stream's prebuilt arrays
        dev.run_fast(entry, ptrs)
    fast = entry.workspace[("fast", 0x5100)]
    assert len(dev.driver.launches) == 2 * len(entry.kernels)
    ptr_arrs = [None if p == 0 else SimpleNamespace(data=SimpleNamespace(ptr=p)) for p in ptrs]
    for k, got in zip(entry.kernels * 2, dev.driver.launches):
        want = [_value(a) for a in plan.kernel_args(k, ptr_arrs, fast.part if fast.part is not None else plan._NULL,
                                          fast.bar if fast.bar is not None else plan._NULL)]
        grid = k.grid if isinstance(k.grid, tuple) else (k.grid, 1)
        assert got == (exprs[k.expr], grid, k.block, k.smem, 0x5100, k.coop, want)
    assert (fast.part is not None) == bool(entry.ws_size) and (fast.bar is not None) == entry.launch.coop
    if fast.bar is not None:
        assert (fast.bar.a == 0).all()
    big = [k for k in entry.kernels if k.smem > 48 * 1024]
    assert [(a[0], a[2]) for a in dev.driver.attrs] == [(exprs[k.expr], k.smem) for k in big]


def test_cooperative_launch_through_cupy_packs_the_arguments():
    shape = (300, 4096)
    arrays = {"x": _layout(np.ones(shape), "contig", 4), "dy": _layout(np.ones(shape), "contig", 4),
              "weight": _layout(np.ones(4096), "contig", 4), "mean": _layout(np.ones(300), "contig", 4),
              "rstd": _layout(np.ones(300), "contig", 4), "dx": _out(shape, 4), "dweight": _out((4096,), 4),
              "dbias": _out((4096,), 4)}
    entry = plan.build_entry(LN, "best", "f32", arrays, True, 8, knobs=plan.settings("kernel=rows3,launch=cupy"))
    assert not entry.fast and entry.launch.kind == "rows3" and entry.launch.coop and len(entry.kernels) == 1
    dev, exprs = _fake_device(entry)
    fake = {k: _FakeArray(4, np.float32) for k in plan.NAMES}
    k = entry.kernels[0]
    part, bar = _FakeArray(entry.ws_size, np.float32), _FakeArray(2, np.uint32)
    args = plan.kernel_args(k, [fake[n] for n in plan.NAMES], part, bar)
    dev.launch(entry.source, k.expr, k.grid, k.block, args, smem=k.smem, coop=True)
    (got,) = dev.driver.launches
    assert got == (exprs[k.expr], (k.grid, 1), k.block, k.smem, 0x5100, True, [_value(a) for a in args])


# ============================================================================= nb_rows2 (cupy@v6)


@pytest.mark.parametrize("op", [LN, RMS])
@pytest.mark.parametrize("dt", plan.DTYPES)
@pytest.mark.parametrize("shape", [(37, 64), (300, 24), (5, 1000), (1, 2048), (40, 2048)])
def test_emulated_v6_matches_oracle(op, dt, shape):
    entry, dev = emulate(op, shape, dt, variant="v6", num_sms=3)
    la = entry.launch
    assert la.kind == "rows2" and dev.launches[0] == la.expr and la.expr in plan.all_kernel_exprs(op, dt)
    assert la.block in plan.ROWS2_BLOCKS and la.block % la.gw == 0


def test_rows2_plan_of_the_perf_shapes():
    # bf16 N = 4096: 512 vectors, one per thread, 512-thread rows; 1024-thread blocks of 2 rows a
    # step keep the most threads resident; at least ROWS2_MIN_ROWS rows per block.
    lay = _layout_for((2048, 4096))
    la = plan.plan_best(LN, "bf16", lay, True, True, 8, 132, knobs=plan.settings("kernel=rows2"))
    assert (la.kind, la.vpt, la.gw, la.block) == ("rows2", 1, 512, 1024)
    assert la.rows_per_block == 16 and la.grid == 128 and la.colsum
    # f32 N = 4096: 1024 vectors, a whole block per row.
    la = plan.plan_best(RMS, "f32", lay, True, False, 4, 132, knobs=plan.settings("kernel=rows2"))
    assert (la.kind, la.gw, la.block, la.rows_per_block) == ("rows2", 1024, 1024, 16)
    # No sums wanted: no partial rows, so no floor on rows per block.
    lay = _layout_for((1000, 4096))
    la = plan.plan_best(LN, "bf16", lay, True, True, 8, 132, knobs=plan.settings("kernel=rows2"))
    assert la.rows_per_block == 16 and la.grid == 63
    la = plan.plan_best(LN, "bf16", lay, False, False, 8, 132, knobs=plan.settings("kernel=rows2"))
    assert la.rows_per_block == 8 and la.grid == 125 and not la.colsum
    # Rows longer than 1024 vectors fall back to the default kernels' plan.
    la = plan.plan_best(LN, "f32", _layout_for((8, 8192)), True, True, 4, 132, knobs=plan.settings("kernel=rows2"))
    assert la.kind != "rows2"


@pytest.mark.parametrize("shape", [(3, 1), (1, 7), (2, 4100), (64, 33)])
def test_emulated_v6_forms_and_layouts(shape):
    for has_w, has_b in [(True, True), (True, False), (False, True), (False, False)]:
        emulate(LN, shape, "f32", has_w, has_b, variant="v6", num_sms=2)
    emulate(LN, shape, "bf16", layouts=("sliced", "transposed") if len(shape) == 2 and shape[0] > 1 else
            ("contig", "contig"), variant="v6", num_sms=2)


# ============================================================================= nb_rows3 (cupy@v7)


@pytest.mark.parametrize("op", [LN, RMS])
@pytest.mark.parametrize("dt", plan.DTYPES)
@pytest.mark.parametrize("shape", [(37, 64), (300, 24), (5, 1000), (1, 2048), (40, 2048), (9, 4096)])
def test_emulated_v7_matches_oracle(op, dt, shape):
    entry, dev = emulate(op, shape, dt, variant="v7", num_sms=3)
    la = entry.launch
    assert la.kind == "rows3" and dev.launches[0] == la.expr and la.expr in plan.all_kernel_exprs(op, dt)
    assert entry.fast  # the driver path by default: prebuilt arguments
    assert dev.coop == ([la.expr] if la.nparts > 1 else []) and not la.colsum


@pytest.mark.parametrize("shape", [(3, 8), (1, 16), (2, 4096), (64, 40), (700, 8)])
def test_emulated_v7_forms_and_finishes(shape):
    for has_w, has_b in [(True, True), (True, False), (False, True), (False, False)]:
        for knobs in ("", "finish=colsum", "stages=2,minrows=1"):
            entry, dev = emulate(LN, shape, "f32", has_w, has_b, variant="v7", num_sms=2, knobs=knobs)
            la = entry.launch
            assert la.kind == "rows3"
            if la.nparts > 1 and (has_w or has_b):
                assert la.coop == (knobs != "finish=colsum") and la.colsum == (knobs == "finish=colsum")
                assert dev.launches[-1] == ("nb_colsum<float>" if la.colsum else la.expr)
    # Layouts without 16-byte vectors: the default kernel's plan.
    entry, _ = emulate(LN, (6, 64), "bf16", layouts=("sliced", "transposed"), variant="v7", num_sms=2)
    assert entry.launch.kind == "rows"
    entry, _ = emulate(LN, (4, 64), "f32", variant="v7", num_sms=2, misalign=True)
    assert entry.launch.kind == "rows" and entry.launch.vec == 1


def test_rows3_plan_of_the_perf_shapes():
    knobs = plan.settings("kernel=rows3")
    # bf16 N = 4096: 512 vectors, one a thread: 512-thread rows and blocks, 4 stages; 2 blocks an SM
    # (the driver's figure, here given): at least 16 rows a block, so 128 blocks for 2048 rows.
    two = lambda expr, block, smem=0: 2  # noqa: E731
    lay = _layout_for((2048, 4096))
    la = plan.plan_best(LN, "bf16", lay, True, True, 8, 132, two, knobs)
    assert (la.kind, la.vpt, la.gw, la.block, la.stages) == ("rows3", 1, 512, 512, plan.STAGES)
    assert la.rows_per_block == 16 and la.grid == 128 and la.coop and not la.colsum
    assert la.smem == plan.rows3_smem_bytes("bf16", 1, 512, plan.STAGES) <= plan.ROWS3_SMEM_LIMIT // 2
    # 8192 rows: the grid is the resident blocks (264), each 32 rows (31 in the last).
    la = plan.plan_best(RMS, "bf16", _layout_for((8192, 4096)), True, False, 8, 132, two, knobs)
    assert la.grid == 256 and la.rows_per_block == 32 and la.coop
    # bf16 N = 8192: a 1024-thread block a row; f32 N = 8192: 2 vectors a thread, 2 stages fit.
    la = plan.plan_best(LN, "bf16", _layout_for((2048, 8192)), True, True, 8, 132, None, knobs)
    assert (la.gw, la.block, la.vpt, la.stages) == (1024, 1024, 1, 4)
    la = plan.plan_best(LN, "f32", _layout_for((2048, 8192)), True, True, 4, 132, None, knobs)
    assert (la.gw, la.block, la.vpt, la.stages) == (1024, 1024, 2, 2)
    # f32 N = 2048 (the seed's shape): 8 rows a block at least (a third of the sums' bytes), 128 blocks.
    la = plan.plan_best(LN, "f32", _layout_for((1024, 2048)), True, True, 4, 132, two, knobs)
    assert (la.gw, la.block, la.vpt, la.rows_per_block, la.grid) == (256, 256, 2, 8, 128)
    assert [plan.rows3_min_rows(dt, f) for dt, f in (("bf16", 3), ("bf16", 1), ("f32", 3), ("f32", 2), ("f64", 3))] \
        == [16, 8, 8, 4, 8]
    # Small N: a warp or part of one per row, several rows a step.
    la = plan.plan_best(LN, "f32", _layout_for((1024, 128)), True, True, 4, 132, None, knobs)
    assert (la.gw, la.block, la.vpt) == (32, 256, 1)
    # No sums wanted: no partial rows, so no floor on rows per block, and no second phase.
    la = plan.plan_best(LN, "bf16", _layout_for((1000, 4096)), False, False, 8, 132, None, knobs)
    assert la.rows_per_block == 8 and la.grid == 125 and not la.coop and not la.colsum
    # Longer rows than 1024 threads hold: the default kernel's plan.
    for dt, n in (("bf16", 16384), ("f64", 8192)):
        la = plan.plan_best(LN, dt, _layout_for((8, n)), True, True, 16 // plan.ITEMSIZE[dt], 132, None, knobs)
        assert la.kind in ("rows", "chunked")
    assert plan.rows3_config(8192, 8, 2) == (1, 1024) and plan.rows3_config(8200, 8, 2) is None
    assert plan.rows3_config(4096, 2, 8) == (2, 1024) and plan.rows3_config(4098, 2, 8) is None
    assert plan.rows3_config(100, 1, 4) is None


def test_v7_takes_the_driver_path_by_default(monkeypatch):
    monkeypatch.setitem(plan.SETTINGS, "launch", (plan.SETTINGS["launch"][0], None))  # the shipped default
    shape = (300, 4096)
    arrays = {"x": _layout(np.ones(shape), "contig", 2), "dy": _layout(np.ones(shape), "contig", 2),
              "weight": _layout(np.ones(4096), "contig", 2), "mean": _layout(np.ones(300), "contig", 4),
              "rstd": _layout(np.ones(300), "contig", 4), "dx": _out(shape, 2), "dweight": _out((4096,), 2),
              "dbias": _out((4096,), 2)}
    fast = [plan.build_entry(LN, v, "bf16", arrays, True, 8, knobs=plan.settings(k)).fast
            for v, k in (("v7", ""), ("best", ""), ("v7", "launch=cupy"), ("best", "kernel=rows"),
                         ("best", "kernel=rows,launch=driver"))]
    assert fast == [True, True, False, False, True]  # nb_rows3 (@best's default) launches through the driver


def test_rows3_settings():
    assert plan.settings("kernel=rows3")["kernel"] == "rows3"
    assert plan.settings("")["finish"] is None  # each kernel's own default
    with pytest.raises(ValueError, match="kernel='rows4', expected one of rows, rows2, rows3"):
        plan.settings("kernel=rows4")
