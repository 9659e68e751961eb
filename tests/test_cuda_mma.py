"""backends/cuda/mma.cuh, the shared tensor-core primitives, and their CPU emulation.

One warp runs a probe kernel on the stand-in (tests/cuda_host): cp.async (with zero fill) into
shared memory, then A (16x16) and B (16x8) fragments four ways (ldmatrix x4 / x4.trans / x2 /
x2.trans / x1 / x1.trans, and by hand from the documented fragment layout), each followed by
mma.m16n8k16 accumulating onto C.  Every way must give C + A·B as numpy computes it, and the raw
ldmatrix registers must be the documented elements, so the emulation of each primitive is checked
on its own as well as in composition.  Misuse (a collective only some lanes reach, lanes at two
collectives, a misaligned row) must be reported.  The same probe compiles for sm_90 with NVRTC
and nvcc.
"""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from backends.cupy import nvrtc as _nvrtc
from tests import cuda_host
from tests.nvrtc_mark import needs_nvrtc

PROBE = r"""
#include "mma.cuh"

// One warp.  A, At = A^T: 16x16 row-major; B: 16x8 (K x N) row-major; Bt = B^T: 8x16; C: 16x8 f32.
// D: 4 results of 16x8 (one per way of loading fragments); frag: raw x4 / x4.trans registers
// (2 x 32 lanes x 4); Z: A copied with src_bytes = zbytes per 16-byte chunk.
template <typename T>
__global__ void tc_probe(const T* A, const T* At, const T* B, const T* Bt, const float* C, float* D,
                         unsigned* frag, T* Z, int zbytes) {
  __shared__ __align__(16) T sA[256];
  __shared__ __align__(16) T sAt[256];
  __shared__ __align__(16) T sB[128];
  __shared__ __align__(16) T sBt[128];
  __shared__ __align__(16) T sZ[256];
  const int l = threadIdx.x, g = l >> 2, t = l & 3;
  tc_cp_async16(sA + 8 * l, A + 8 * l);
  tc_cp_async16(sAt + 8 * l, At + 8 * l);
  tc_cp_async16(sZ + 8 * l, A + 8 * l, zbytes);
  tc_cp_commit();
  if (l < 16) {  // a second commit group: waiting for all retires both
    tc_cp_async16(sB + 8 * l, B + 8 * l);
    tc_cp_async16(sBt + 8 * l, Bt + 8 * l);
  }
  tc_cp_commit();
  tc_cp_wait<0>();
  __syncthreads();
  for (int i = 0; i < 8; ++i) Z[8 * l + i] = sZ[8 * l + i];

  float d[4][4];
  for (int w = 0; w < 4; ++w)
    for (int k = 0; k < 4; ++k) d[w][k] = C[(g + 8 * (k >> 1)) * 8 + 2 * t + (k & 1)];
  unsigned a[4], b[2];

  // 1: A by ldmatrix.x4 (matrix i: rows 8(i&1).., cols 8(i>>1)..), B (K x N) by x2.trans.
  tc_ldmatrix_x4(a, sA + (l % 16) * 16 + (l / 16) * 8);
  for (int k = 0; k < 4; ++k) frag[l * 4 + k] = a[k];
  tc_ldmatrix_x2_trans(b, sB + (l % 16) * 8);
  tc_mma16816<T>(d[0], a, b);

  // 2: A from At by x4.trans (matrix i: At rows 8(i>>1).., cols 8(i&1)..), B from Bt (N x K) by two x1.
  tc_ldmatrix_x4_trans(a, sAt + (8 * (l / 16) + l % 8) * 16 + 8 * ((l / 8) & 1));
  for (int k = 0; k < 4; ++k) frag[128 + l * 4 + k] = a[k];
  tc_ldmatrix_x1(b, sBt + (l % 8) * 16);
  tc_ldmatrix_x1(b + 1, sBt + (l % 8) * 16 + 8);
  tc_mma16816<T>(d[1], a, b);

  // 3: A by two x2 (left and right halves), B by two x1.trans.
  tc_ldmatrix_x2(a, sA + (l % 16) * 16);
  tc_ldmatrix_x2(a + 2, sA + (l % 16) * 16 + 8);
  tc_ldmatrix_x1_trans(b, sB + (l % 8) * 8);
  tc_ldmatrix_x1_trans(b + 1, sB + 64 + (l % 8) * 8);
  tc_mma16816<T>(d[2], a, b);

  // 4: fragments by hand from the documented layout (the mma alone).
  const unsigned short* hA = reinterpret_cast<const unsigned short*>(sA);
  const unsigned short* hB = reinterpret_cast<const unsigned short*>(sB);
  const int ar[4] = {g, g + 8, g, g + 8}, ac[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
  for (int k = 0; k < 4; ++k) a[k] = hA[ar[k] * 16 + ac[k]] | ((unsigned)hA[ar[k] * 16 + ac[k] + 1] << 16);
  for (int k = 0; k < 2; ++k) b[k] = hB[(2 * t + 8 * k) * 8 + g] | ((unsigned)hB[(2 * t + 8 * k + 1) * 8 + g] << 16);
  tc_mma16816<T>(d[3], a, b);

  for (int w = 0; w < 4; ++w)
    for (int k = 0; k < 4; ++k) D[w * 128 + (g + 8 * (k >> 1)) * 8 + 2 * t + (k & 1)] = d[w][k];
}

// Misuse, reported by the stand-in: 0 only half the warp at ldmatrix; 1 half at ldmatrix, half at
// mma; 2 a row address 8 bytes off alignment; 3 mma in only one lane.
template <typename T>
__global__ void tc_misuse(const T* A, int how) {
  __shared__ __align__(16) T s[256];
  const int l = threadIdx.x;
  for (int i = 0; i < 8; ++i) s[8 * l + i] = A[8 * l + i];
  __syncthreads();
  unsigned a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  float d[4] = {0, 0, 0, 0};
  if (how == 0) {
    if (l < 16) tc_ldmatrix_x4(a, s + (l % 16) * 16);
  } else if (how == 1) {
    if (l < 16) tc_ldmatrix_x4(a, s + (l % 16) * 16);
    else tc_mma16816<T>(d, a, b);
  } else if (how == 2) {
    tc_ldmatrix_x4(a, s + (l % 16) * 16 + (l == 5 ? 4 : 0));
  } else {
    if (l == 0) tc_mma16816<T>(d, a, b);
  }
}
"""

TYPES = {"bf16": "__nv_bfloat16", "f16": "__half"}


def _exprs(dt: str) -> dict[str, list[str]]:
    t = TYPES[dt]
    return {f"tc_probe<{t}>": [f"const {t}*"] * 4 + ["const float*", "float*", "unsigned*", f"{t}*", "int"],
            f"tc_misuse<{t}>": [f"const {t}*", "int"]}


def _source() -> str:
    return f'#include "{_nvrtc.CUDA_DIR / "mma.cuh"}"\n' + PROBE.replace('#include "mma.cuh"\n', "")


@pytest.fixture(scope="module")
def kernels():
    why = cuda_host.available()
    if why:
        pytest.skip(why)
    return {dt: cuda_host.Kernels(f"mma-probe-{dt}", _source(), _exprs(dt)) for dt in TYPES}


def _bits(x: np.ndarray, dt: str) -> np.ndarray:
    """16-bit patterns of float32 values exactly representable in dt."""
    if dt == "f16":
        h = x.astype(np.float16)
        assert np.array_equal(h.astype(np.float32), x)
        return h.view(np.uint16)
    b = (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    assert np.array_equal((b.astype(np.uint32) << 16).view(np.float32), x)
    return b


def _values(rng, shape, dt: str, exact: bool) -> np.ndarray:
    """float32 values representable in dt: small dyadic ones (all sums exact in fp32) or random ones."""
    if exact:
        return (rng.integers(-16, 17, size=shape) / 8).astype(np.float32)
    x = rng.standard_normal(shape).astype(np.float32)
    if dt == "f16":
        return x.astype(np.float16).astype(np.float32)
    return ((x.view(np.uint32) >> 16) << 16).view(np.float32)  # truncated to bf16


def _expected_frags(a_bits: np.ndarray, trans_from: np.ndarray | None = None) -> np.ndarray:
    """x4 registers per lane (32 x 4) holding A's fragment (the mma's documented layout)."""
    out = np.zeros((32, 4), dtype=np.uint32)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for k, (r, c) in enumerate([(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)]):
            out[lane, k] = int(a_bits[r, c]) | (int(a_bits[r, c + 1]) << 16)
    return out


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("dt", list(TYPES))
def test_mma_and_ldmatrix_match_numpy(kernels, dt, exact):
    rng = np.random.default_rng(16 + exact)
    a = _values(rng, (16, 16), dt, exact)
    b = _values(rng, (16, 8), dt, exact)
    c = _values(rng, (16, 8), dt, True)
    ab, bb = _bits(a, dt), _bits(b, dt)
    at, bt = np.ascontiguousarray(ab.T), np.ascontiguousarray(bb.T)
    d = np.full(4 * 128, np.nan, dtype=np.float32)
    frag = np.zeros(2 * 128, dtype=np.uint32)
    z = np.full(256, 0xFFFF, dtype=np.uint16)
    zbytes = 6
    for sched in range(cuda_host.SCHEDULES):
        d[:] = np.nan
        kernels[dt].launch(f"tc_probe<{TYPES[dt]}>", 1, 32, [ab, at, bb, bt, c, d, frag, z, zbytes], schedule=sched)
        want = c.astype(np.float64) + a.astype(np.float64) @ b.astype(np.float64)
        for way in range(4):
            got = d[way * 128:(way + 1) * 128].reshape(16, 8)
            if exact:
                assert np.array_equal(got, want.astype(np.float32)), (dt, way, sched, got - want)
            else:
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"{dt} way {way}")
        frags = _expected_frags(ab)
        assert np.array_equal(frag[:128].reshape(32, 4), frags), "ldmatrix.x4 registers"
        assert np.array_equal(frag[128:].reshape(32, 4), frags), "ldmatrix.x4.trans registers"
        chunks = ab.reshape(32, 8)
        zc = z.reshape(32, 8)
        assert np.array_equal(zc[:, :zbytes // 2], chunks[:, :zbytes // 2]), "cp.async kept bytes"
        assert not zc[:, zbytes // 2:].any(), "cp.async zero fill"


@pytest.mark.parametrize("how, msg", [(0, "only 16 of 32 lanes"), (1, "lanes at different collectives"),
                                      (2, "not 16-byte aligned"), (3, "only 1 of 32 lanes")])
def test_misuse_is_reported(kernels, how, msg):
    a = np.zeros(256, dtype=np.uint16)
    with pytest.raises(AssertionError, match=msg):
        kernels["bf16"].launch("tc_misuse<__nv_bfloat16>", 1, 32, [a, how])


@needs_nvrtc
def test_probe_compiles_with_nvrtc():
    source = _nvrtc.read_source("mma.cuh") + PROBE.replace('#include "mma.cuh"\n', "")
    exprs = [e for dt in TYPES for e in _exprs(dt)]
    cubin, lowered = _nvrtc.compile_cubin(source, arch="sm_90", name_expressions=exprs)
    for expr in exprs:
        assert lowered[expr].encode() in cubin


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_probe_compiles_with_nvcc(tmp_path):
    src = tmp_path / "probe.cu"
    lines = [_source()]
    for dt, t in TYPES.items():
        lines.append(f"template __global__ void tc_probe<{t}>(const {t}*, const {t}*, const {t}*, const {t}*, "
                     f"const float*, float*, unsigned*, {t}*, int);")
        lines.append(f"template __global__ void tc_misuse<{t}>(const {t}*, int);")
    src.write_text("\n".join(lines) + "\n")
    defines = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
               "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"]
    ptx = tmp_path / "probe.ptx"
    proc = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "-ptx", *defines, "-o", str(ptx), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = ptx.read_text()
    for ins in ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "mma.sync.aligned.m16n8k16.row.col.f32.f16",
                "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16", "ldmatrix.sync.aligned.m8n8.x1.shared.b16",
                "cp.async.cg.shared.global", "cp.async.wait_group 0"):
        assert ins in text, ins
    cubin = tmp_path / "probe.cubin"
    proc = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", *defines, "-o", str(cubin), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert cubin.stat().st_size > 0
