// matmul_backward: dA = dY·Bᵀ and dB = Aᵀ·dY with batch broadcasting (oracle/matmul_backward.py),
// as two launches of one batched, folded GEMM.
//
// Launch contract.  Every kernel computes, for output batch p < P (blockIdx.y) and element
// (i, j) of an I x J output:
//     C[p*I*J + i*J + j] = sum over f < F, r < R of X[xo + i*xi + r*xr] * Y[yo + r*yr + j*yj]
// where (xo, yo) = (off[2(pF + f)], off[2(pF + f) + 1]): the element offsets of the f-th product
// folded into output batch p.  Folds are the broadcast batch elements an operand's gradient sums
// over; they are summed inside the one accumulator, in f order, so the result is deterministic
// (no atomics) and the batch sum costs no extra pass.  C is dense; X, Y have any strides.
//   dA: C = da (M x K), X = dY (i = m, r = n), Y[r = n][j = k] = B[k][n]
//   dB: C = db (K x N), X[i = k][r = m] = A[m][k], Y = dY (r = m, j = n)
// The host plan (backends/_plans/matmul_backward_cuda.py) fills MMGemm and the offset table.
// Accumulation: float, double for f64; 16-bit inputs are converted exactly.
//
// Kernels (T the element type, the ladder of seed 001 then tensor cores):
//   mm_naive<T>         one thread per output element; grid (ceil(I*J / 256), P), block 256.
//   mm_regtile<T>       each thread an MM_V x MM_V block, operands straight from global memory;
//                       grid (ceil(ceil(I/V) * ceil(J/V) / 256), P), block 256.
//   mm_smem<T, BM, BN, BK, TM, TN>
//                       BM x BN output tile per block, BK-deep shared-memory tiles of X and Y
//                       fetched cooperatively (each thread a few elements, predicated), each
//                       thread a TM x TN register block; block (BM/TM)*(BN/TN) threads, grid
//                       (tiles, P).  The `smem` rung, and the f64 path of `best`.
//   mm_sgemm<BM, BN, XT, YT, VEC>
//                       float32 on the FMA units, vectorised: BM x BN x 8 block tiles (128 x 128, or
//                       64 x 64 for grids too small to fill the GPU), 8 x 8 per thread in four 4 x 4
//                       quadrants (16-byte shared reads), two shared buffers fed through registers
//                       (one barrier a step); VEC: 16-byte global loads.  Block BM*BN/64, grid
//                       (tiles, P).  The f32 path of `best` (IEEE products, no TF32).
//   mm_mma<T, BM, XT, YT, VEC>
//                       bf16 / f16 on tensor cores: BM x 128 x 32 block tiles (BM 128, or 64 for
//                       grids too small to fill the GPU), 8 warps (2 x 4) of BM/2 x 32,
//                       mma.m16n8k16 with ldmatrix fragments (.trans where the operand's
//                       contiguous dim is not the one the fragment wants), an MM_STAGES-deep
//                       cp.async pipeline (zero-filled past the tails).  XT: X is contiguous along
//                       i (xi == 1; else xr == 1); YT: Y contiguous along j (yj == 1; else yr == 1).
//                       VEC: 16-byte copies (base pointers 16-byte aligned, the other stride and
//                       every table offset multiples of 8); !VEC: any strides, element loads.
//                       Block 256, grid (tiles, P), dynamic shared memory mm_mma_smem<XT, YT, BM>()
//                       bytes (over 48 KiB: the host raises the kernel's limit).
//   Tiles of mm_smem / mm_mma are numbered in groups of MM_GROUP tile rows (L2 reuse).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "matmul_backward_defs.h"
#include "mma.cuh"


template <typename T>
struct mm_acc {
  using type = float;
};
template <>
struct mm_acc<double> {
  using type = double;
};

__device__ __forceinline__ float mm_in(float x) { return x; }
__device__ __forceinline__ double mm_in(double x) { return x; }
__device__ __forceinline__ float mm_in(__half x) { return __half2float(x); }
__device__ __forceinline__ float mm_in(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T mm_out(float x) {
  return x;
}
template <>
__device__ __forceinline__ double mm_out<double>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half mm_out<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 mm_out<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <typename T, typename A>
__device__ __forceinline__ T mm_store(A x) {
  return mm_out<T>(x);
}
template <>
__device__ __forceinline__ double mm_store<double, double>(double x) {
  return x;
}

// The tile (ti, tj) of block b: MM_GROUP tile rows at a time, columns within a group in order.
__device__ __forceinline__ void mm_tile(long long b, long long tiles_i, long long tiles_j, long long& ti,
                                        long long& tj) {
  const long long per_group = (long long)MM_GROUP * tiles_j;
  const long long group = b / per_group, first = group * MM_GROUP;
  const long long rows = tiles_i - first < MM_GROUP ? tiles_i - first : MM_GROUP;
  const long long in = b - group * per_group;
  ti = first + in % rows;
  tj = in / rows;
}

// ============================================================================ naive

template <typename T>
__global__ void __launch_bounds__(MM_BLOCK) mm_naive(const __grid_constant__ MMGemm g, const T* X, const T* Y,
                                                     const long long* off, T* C) {
  using A = typename mm_acc<T>::type;
  const long long idx = (long long)blockIdx.x * MM_BLOCK + threadIdx.x, p = blockIdx.y;
  if (idx >= g.I * g.J) return;
  const long long i = idx / g.J, j = idx - i * g.J;
  A acc = 0;
  for (long long f = 0; f < g.F; ++f) {
    const T* x = X + off[2 * (p * g.F + f)] + i * g.xi;
    const T* y = Y + off[2 * (p * g.F + f) + 1] + j * g.yj;
    for (long long r = 0; r < g.R; ++r) acc += (A)mm_in(x[r * g.xr]) * (A)mm_in(y[r * g.yr]);
  }
  C[p * g.I * g.J + idx] = mm_store<T, A>(acc);
}

// ============================================================================ register tiling

template <typename T>
__global__ void __launch_bounds__(MM_BLOCK) mm_regtile(const __grid_constant__ MMGemm g, const T* X, const T* Y,
                                                       const long long* off, T* C) {
  using A = typename mm_acc<T>::type;
  const long long bj = (g.J + MM_V - 1) / MM_V, bi = (g.I + MM_V - 1) / MM_V;
  const long long idx = (long long)blockIdx.x * MM_BLOCK + threadIdx.x, p = blockIdx.y;
  if (idx >= bi * bj) return;
  const long long i0 = idx / bj * MM_V, j0 = (idx % bj) * MM_V;
  A acc[MM_V][MM_V] = {};
  for (long long f = 0; f < g.F; ++f) {
    const T* x = X + off[2 * (p * g.F + f)];
    const T* y = Y + off[2 * (p * g.F + f) + 1];
    for (long long r = 0; r < g.R; ++r) {
      A xv[MM_V], yv[MM_V];
      for (int u = 0; u < MM_V; ++u) {
        xv[u] = i0 + u < g.I ? (A)mm_in(x[(i0 + u) * g.xi + r * g.xr]) : (A)0;
        yv[u] = j0 + u < g.J ? (A)mm_in(y[r * g.yr + (j0 + u) * g.yj]) : (A)0;
      }
      for (int u = 0; u < MM_V; ++u)
        for (int v = 0; v < MM_V; ++v) acc[u][v] += xv[u] * yv[v];
    }
  }
  T* c = C + p * g.I * g.J;
  for (int u = 0; u < MM_V; ++u)
    for (int v = 0; v < MM_V; ++v)
      if (i0 + u < g.I && j0 + v < g.J) c[(i0 + u) * g.J + j0 + v] = mm_store<T, A>(acc[u][v]);
}

// ============================================================================ shared-memory tiling

template <typename T, int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN)) mm_smem(const __grid_constant__ MMGemm g, const T* X,
                                                                 const T* Y, const long long* off, T* C) {
  using A = typename mm_acc<T>::type;
  constexpr int NT = (BM / TM) * (BN / TN), TX = BN / TN, TY = BM / TM;
  static_assert(BM * BK % NT == 0 && BN * BK % NT == 0, "tiles split evenly over the threads");
  __shared__ A xs[BK][BM];  // k-major: a thread's TM rows are read as a broadcast
  __shared__ A ys[BK][BN];
  long long ti, tj;
  mm_tile(blockIdx.x, g.tiles_i, g.tiles_j, ti, tj);
  const long long i0 = ti * BM, j0 = tj * BN, p = blockIdx.y;
  const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
  // Fetch order: the operand's fastest dim first, so a warp's loads coalesce.
  const bool x_i_fast = g.xi == 1 || (g.xr != 1 && g.xi < g.xr);
  const bool y_j_fast = g.yj == 1 || (g.yr != 1 && g.yj < g.yr);
  A acc[TM][TN] = {};
  const long long nk = (g.R + BK - 1) / BK;
  for (long long t = 0; t < g.F * nk; ++t) {
    const long long f = t / nk, r0 = (t - f * nk) * BK;
    const T* x = X + off[2 * (p * g.F + f)];
    const T* y = Y + off[2 * (p * g.F + f) + 1];
    for (int e = tid; e < BM * BK; e += NT) {
      const int ii = x_i_fast ? e % BM : e / BK, kk = x_i_fast ? e / BM : e % BK;
      const long long i = i0 + ii, r = r0 + kk;
      xs[kk][ii] = i < g.I && r < g.R ? (A)mm_in(x[i * g.xi + r * g.xr]) : (A)0;
    }
    for (int e = tid; e < BN * BK; e += NT) {
      const int jj = y_j_fast ? e % BN : e / BK, kk = y_j_fast ? e / BN : e % BK;
      const long long j = j0 + jj, r = r0 + kk;
      ys[kk][jj] = j < g.J && r < g.R ? (A)mm_in(y[r * g.yr + j * g.yj]) : (A)0;
    }
    __syncthreads();
    for (int k = 0; k < BK; ++k) {
      A xv[TM], yv[TN];
      for (int u = 0; u < TM; ++u) xv[u] = xs[k][ty + TY * u];
      for (int v = 0; v < TN; ++v) yv[v] = ys[k][tx + TX * v];
      for (int u = 0; u < TM; ++u)
        for (int v = 0; v < TN; ++v) acc[u][v] += xv[u] * yv[v];
    }
    __syncthreads();  // the tiles are refilled next
  }
  T* c = C + p * g.I * g.J;
  for (int u = 0; u < TM; ++u) {
    const long long i = i0 + ty + TY * u;
    for (int v = 0; v < TN; ++v) {
      const long long j = j0 + tx + TX * v;
      if (i < g.I && j < g.J) c[i * g.J + j] = mm_store<T, A>(acc[u][v]);
    }
  }
}

// ============================================================================ float32 SIMT, vectorised

// 16 bytes of floats: an aligned struct copy is one 128-bit load or store.
struct alignas(16) mm_f4 {
  float v[4];
};

// Threads of an mm_sgemm block: one per 8 x 8 block of the BM x BN tile.
template <int BM, int BN>
__host__ __device__ constexpr int mm_sg_threads() {
  return BM * BN / 64;
}

// Per 8-deep step, one operand tile (FREE x 8 of X or 8 x FREE of Y) is 2 FREE chunks of 4 elements,
// CH = 2 FREE / NT a thread, chunk c = tid + q NT in registers: TF: the free dim (i or j) is the
// contiguous one, so chunk c runs along it at (free 4 (c % (FREE / 4)), r c / (FREE / 4)); else along
// r at (free c / 2, r 4 (c % 2)).  VEC: one 16-byte load (the host proved alignment, unit stride and an
// extent along the contiguous dim that is a multiple of 4, so a chunk is all in range or all out).
template <int FREE, int NT, bool TF, bool VEC>
__device__ __forceinline__ void mm_sg_load(float (&v)[2 * FREE / NT][4], const float* base, long long f0,
                                           long long fn, long long fs, long long r0, long long rn, long long rs) {
#pragma unroll
  for (int q = 0; q < 2 * FREE / NT; ++q) {
    const int c = threadIdx.x + q * NT;
    const long long f = f0 + (TF ? 4 * (c % (FREE / 4)) : c / 2), r = r0 + (TF ? c / (FREE / 4) : 4 * (c % 2));
    if (VEC) {
      if (f < fn && r < rn) {
        const mm_f4 w = *reinterpret_cast<const mm_f4*>(base + f * fs + r * rs);
#pragma unroll
        for (int e = 0; e < 4; ++e) v[q][e] = w.v[e];
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) v[q][e] = 0.f;
      }
    } else {  // the chunk's run: `left` elements of it in range, `step` apart
      const float* run = base + f * fs + r * rs;
      const long long step = TF ? fs : rs, left = (TF ? r < rn : f < fn) ? (TF ? fn - f : rn - r) : 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) v[q][e] = e < left ? run[e * step] : 0.f;
    }
  }
}

// ... and their stores into the k-major shared tile s[8][FREE + 4]: along the free dim one 16-byte
// store a chunk; along r four scalar ones (rows FREE + 4 floats apart: a warp's two r halves land
// 16 banks apart).
template <int FREE, int NT, bool TF>
__device__ __forceinline__ void mm_sg_store(float* s, const float (&v)[2 * FREE / NT][4]) {
  constexpr int LD = FREE + 4;
#pragma unroll
  for (int q = 0; q < 2 * FREE / NT; ++q) {
    const int c = threadIdx.x + q * NT;
    if (TF) {
      mm_f4 w;
#pragma unroll
      for (int e = 0; e < 4; ++e) w.v[e] = v[q][e];
      *reinterpret_cast<mm_f4*>(s + (c / (FREE / 4)) * LD + 4 * (c % (FREE / 4))) = w;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[(4 * (c % 2) + e) * LD + c / 2] = v[q][e];
    }
  }
}

// mm_sgemm<BM, BN, XT, YT, VEC>: float32 C = sum_f X_f · Y_f (the contract above) on the FMA units,
// IEEE products (no TF32).  BM x BN block tiles (128 x 128, or 64 x 64 for grids that would not fill
// the GPU), 8-deep k steps, a thread per 8 x 8 block: rows 4 ty .. and BM/2 + 4 ty .. (ty = tid /
// (BN/8)), columns 4 tx .. and BN/2 + 4 tx .. (tx = tid % (BN/8)), so every operand read from shared
// memory is a 16-byte vector (X's a broadcast over the warp's tx, Y's consecutive vectors).  Two
// shared buffers: step t+1's tiles are loaded into registers before step t's products and stored
// to the other buffer after them, one barrier a step.  XT: X contiguous along i (else along r); YT:
// Y contiguous along j (else along r).  Registers: 64 accumulators, 16 operands, the loads in flight
// and the addressing: 130-151 with no spills (sm_90), so one 256-thread block per SM at 128 x 128
// (capped at 128 for two, ptxas spills 24-56 bytes).
template <int BM, int BN, bool XT, bool YT, bool VEC>
__global__ void __launch_bounds__(mm_sg_threads<BM, BN>()) mm_sgemm(const __grid_constant__ MMGemm g, const float* X,
                                                                    const float* Y, const long long* off, float* C) {
  constexpr int NT = mm_sg_threads<BM, BN>(), BK = MM_SG_BK, LX = BM + 4, LY = BN + 4;
  static_assert(BM % 64 == 0 && BN % 64 == 0 && NT >= 64 && (2 * BM) % NT == 0 && (2 * BN) % NT == 0,
                "tiles of 64 rows and columns at a time, whole chunks a thread");
  __shared__ __align__(16) float xs[2][BK * LX];
  __shared__ __align__(16) float ys[2][BK * LY];
  long long ti, tj;
  mm_tile(blockIdx.x, g.tiles_i, g.tiles_j, ti, tj);
  const long long i0 = ti * BM, j0 = tj * BN, p = blockIdx.y;
  const int tx = threadIdx.x % (BN / 8), ty = threadIdx.x / (BN / 8);
  const long long nk = (g.R + BK - 1) / BK, total = g.F * nk;
  float rx[2 * BM / NT][4], ry[2 * BN / NT][4];
  // The next step's chunks of both tiles into rx, ry: steps run fold by fold, r0 through each.
  long long f = 0, r0 = 0;
  auto load = [&]() {
    const float* x = X + off[2 * (p * g.F + f)];
    const float* y = Y + off[2 * (p * g.F + f) + 1];
    mm_sg_load<BM, NT, XT, VEC>(rx, x, i0, g.I, g.xi, r0, g.R, g.xr);
    mm_sg_load<BN, NT, YT, VEC>(ry, y, j0, g.J, g.yj, r0, g.R, g.yr);
    r0 += BK;
    if (r0 >= g.R) {
      r0 = 0;
      ++f;
    }
  };
  float acc[8][8];
#pragma unroll
  for (int u = 0; u < 8; ++u)
#pragma unroll
    for (int v = 0; v < 8; ++v) acc[u][v] = 0.f;
  if (total > 0) {
    load();
    mm_sg_store<BM, NT, XT>(xs[0], rx);
    mm_sg_store<BN, NT, YT>(ys[0], ry);
  }
  __syncthreads();
  for (long long t = 0; t < total; ++t) {
    const int b = (int)(t & 1);
    if (t + 1 < total) load();  // step t + 1's, in flight during the products below
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      const mm_f4 a0 = *reinterpret_cast<const mm_f4*>(xs[b] + k * LX + 4 * ty);
      const mm_f4 a1 = *reinterpret_cast<const mm_f4*>(xs[b] + k * LX + BM / 2 + 4 * ty);
      const mm_f4 b0 = *reinterpret_cast<const mm_f4*>(ys[b] + k * LY + 4 * tx);
      const mm_f4 b1 = *reinterpret_cast<const mm_f4*>(ys[b] + k * LY + BN / 2 + 4 * tx);
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const float a = u < 4 ? a0.v[u] : a1.v[u - 4];
#pragma unroll
        for (int v = 0; v < 8; ++v) acc[u][v] += a * (v < 4 ? b0.v[v] : b1.v[v - 4]);
      }
    }
    if (t + 1 < total) {  // the other buffer: last read in step t - 1, before the barrier that ended it
      mm_sg_store<BM, NT, XT>(xs[b ^ 1], rx);
      mm_sg_store<BN, NT, YT>(ys[b ^ 1], ry);
    }
    __syncthreads();
  }
  float* c = C + p * g.I * g.J;
  const bool vec_out = g.J % 4 == 0;  // then a row's 4 columns 4 tx .. are all in range or all out
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    const long long i = i0 + (u < 4 ? 4 * ty + u : BM / 2 + 4 * ty + u - 4);
    if (i >= g.I) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const long long j = j0 + (BN / 2) * h + 4 * tx;
      if (vec_out) {
        if (j < g.J) {
          mm_f4 w;
#pragma unroll
          for (int e = 0; e < 4; ++e) w.v[e] = acc[u][4 * h + e];
          *reinterpret_cast<mm_f4*>(c + i * g.J + j) = w;
        }
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (j + e < g.J) c[i * g.J + j + e] = acc[u][4 * h + e];
      }
    }
  }
}

// ============================================================================ tensor cores

// Shared elements of one stage's X and Y tiles: rows along the operand's strided dim, MM_PAD
// elements of padding each (16-byte aligned rows in distinct banks for ldmatrix).
template <bool XT, int BM>
__host__ __device__ constexpr int mm_x_elems() {
  return XT ? MM_BK * (BM + MM_PAD) : BM * (MM_BK + MM_PAD);
}
template <bool YT>
__host__ __device__ constexpr int mm_y_elems() {
  return YT ? MM_BK * (MM_BN + MM_PAD) : MM_BN * (MM_BK + MM_PAD);
}
template <bool XT, bool YT, int BM>
__host__ __device__ constexpr int mm_mma_smem() {
  return MM_STAGES * (mm_x_elems<XT, BM>() + mm_y_elems<YT>()) * 2;
}

// One operand tile (ROWS rows of COLS contiguous elements in shared memory, row stride COLS +
// MM_PAD) from global: row q is global index `row0 + q` along the strided dim (stride `rs`,
// extent `rn`), column c is `col0 + c` along the contiguous one (stride `cs`, 1 when VEC, extent `cn`).
template <typename T, int ROWS, int COLS, bool VEC>
__device__ __forceinline__ void mm_fetch(T* s, const T* base, long long row0, long long rn, long long rs,
                                         long long col0, long long cn, long long cs) {
  if (VEC) {
    constexpr int CHUNKS = ROWS * COLS / 8;
    static_assert(CHUNKS % MM_BLOCK == 0, "chunks split evenly over the threads");
    for (int c = threadIdx.x; c < CHUNKS; c += MM_BLOCK) {
      const int q = c / (COLS / 8), k = (c % (COLS / 8)) * 8;
      const long long row = row0 + q, col = col0 + k;
      const long long left = cn - col;
      const int bytes = row < rn && left > 0 ? (left >= 8 ? 16 : (int)left * 2) : 0;
      tc_cp_async16(s + q * (COLS + MM_PAD) + k, bytes ? base + row * rs + col : base, bytes);
    }
  } else {
    for (int e = threadIdx.x; e < ROWS * COLS; e += MM_BLOCK) {
      const int q = e / COLS, k = e % COLS;
      const long long row = row0 + q, col = col0 + k;
      s[q * (COLS + MM_PAD) + k] = row < rn && col < cn ? base[row * rs + col * cs] : mm_out<T>(0.f);
    }
  }
}

template <typename T, int BM, bool XT, bool YT, bool VEC>
__global__ void __launch_bounds__(MM_BLOCK, 2) mm_mma(const __grid_constant__ MMGemm g, const T* X, const T* Y,
                                                   const long long* off, T* C) {
  static_assert(sizeof(T) == 2, "tensor-core path: bf16 / f16");
  static_assert(BM == 64 || BM == 128, "block tile rows: 64 or 128");
  constexpr int XE = mm_x_elems<XT, BM>(), YE = mm_y_elems<YT>(), MT = BM / 32;  // MT m16 tiles per warp
  TC_DYNAMIC_SHARED(T, smem);
  long long ti, tj;
  mm_tile(blockIdx.x, g.tiles_i, g.tiles_j, ti, tj);
  const long long i0 = ti * BM, j0 = tj * MM_BN, p = blockIdx.y;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm = (warp / 4) * (BM / 2), wn = (warp % 4) * 32;  // the warp's BM/2 x 32 corner in the tile
  const long long nk = (g.R + MM_BK - 1) / MM_BK, total = g.F * nk;

  // Queues the loads of reduction tile t (fold f, rows r0..) into stage s; always one commit group.
  auto fetch = [&](long long t, int s) {
    if (t < total) {
      const long long f = t / nk, r0 = (t - f * nk) * MM_BK;
      const T* x = X + off[2 * (p * g.F + f)];
      const T* y = Y + off[2 * (p * g.F + f) + 1];
      T* xs = smem + s * (XE + YE);
      T* ys = xs + XE;
      if (XT)  // rows r, contiguous i
        mm_fetch<T, MM_BK, BM, VEC>(xs, x, r0, g.R, g.xr, i0, g.I, g.xi);
      else     // rows i, contiguous r
        mm_fetch<T, BM, MM_BK, VEC>(xs, x, i0, g.I, g.xi, r0, g.R, g.xr);
      if (YT)  // rows r, contiguous j
        mm_fetch<T, MM_BK, MM_BN, VEC>(ys, y, r0, g.R, g.yr, j0, g.J, g.yj);
      else     // rows j, contiguous r
        mm_fetch<T, MM_BN, MM_BK, VEC>(ys, y, j0, g.J, g.yj, r0, g.R, g.yr);
    }
    tc_cp_commit();
  };

  float acc[MT][4][4];
  for (int a = 0; a < MT; ++a)
    for (int b = 0; b < 4; ++b)
      for (int k = 0; k < 4; ++k) acc[a][b][k] = 0.f;

  for (int s = 0; s < MM_STAGES - 1; ++s) fetch(s, s);
  for (long long t = 0; t < total; ++t) {
    tc_cp_wait<MM_STAGES - 2>();
    __syncthreads();  // tile t visible to all; every warp is done with the stage refilled below
    fetch(t + MM_STAGES - 1, (int)((t + MM_STAGES - 1) % MM_STAGES));
    const T* xs = smem + (t % MM_STAGES) * (XE + YE);
    const T* ys = xs + XE;
    for (int ks = 0; ks < MM_BK; ks += 16) {
      unsigned af[MT][4], bf[4][2];
      for (int mt = 0; mt < MT; ++mt) {
        const int m = wm + mt * 16;
        if (XT)  // matrices (m, k), (m+8, k), (m, k+8), (m+8, k+8) from rows k of the k-major tile
          tc_ldmatrix_x4_trans(af[mt], xs + (ks + 8 * (lane / 16) + lane % 8) * (BM + MM_PAD) + m +
                                           8 * ((lane / 8) & 1));
        else
          tc_ldmatrix_x4(af[mt], xs + (m + lane % 16) * (MM_BK + MM_PAD) + ks + 8 * (lane / 16));
      }
      for (int nt = 0; nt < 4; nt += 2) {  // one x4 gives two n8 tiles' fragments
        const int n = wn + nt * 8;
        unsigned r[4];
        if (YT)  // matrices (k, n), (k+8, n), (k, n+8), (k+8, n+8) from rows k of the k-major tile
          tc_ldmatrix_x4_trans(r, ys + (ks + lane % 8 + 8 * ((lane / 8) & 1)) * (MM_BN + MM_PAD) + n +
                                      8 * (lane / 16));
        else
          tc_ldmatrix_x4(r, ys + (n + lane % 8 + 8 * (lane / 16)) * (MM_BK + MM_PAD) + ks + 8 * ((lane / 8) & 1));
        bf[nt][0] = r[0];
        bf[nt][1] = r[1];
        bf[nt + 1][0] = r[2];
        bf[nt + 1][1] = r[3];
      }
      for (int mt = 0; mt < MT; ++mt)
        for (int nt = 0; nt < 4; ++nt) tc_mma16816<T>(acc[mt][nt], af[mt], bf[nt]);
    }
  }
  tc_cp_wait<0>();  // only empty groups are left; retire them before exit

  T* c = C + p * g.I * g.J;
  const int gq = lane >> 2, tq = lane & 3;
  for (int mt = 0; mt < MT; ++mt) {
    for (int nt = 0; nt < 4; ++nt) {
      for (int h = 0; h < 2; ++h) {
        const long long i = i0 + wm + mt * 16 + gq + 8 * h, j = j0 + wn + nt * 8 + 2 * tq;
        if (i >= g.I) continue;
        if (j < g.J) c[i * g.J + j] = mm_out<T>(acc[mt][nt][2 * h]);
        if (j + 1 < g.J) c[i * g.J + j + 1] = mm_out<T>(acc[mt][nt][2 * h + 1]);
      }
    }
  }
}
