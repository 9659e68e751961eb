// What the conv dgrad and wgrad kernels share (conv_backward_data.cuh, conv_backward_weight.cuh):
// the parameter words, element conversions, fast divmod, and the block tile of the implicit GEMM
// (a BM x BN tile of fp32/fp64 accumulators fed from two shared-memory tiles).
//
// Tile: 128 threads (4 warps) own a BM x 64 output tile; the reduction runs in steps of BK = 32.
//   Tensor cores (bf16 / f16): BM = 128 (wgrad: 64 where Cout/g <= 64), warp w owns a BM/2 x 32 warp
//     tile: BM/32 x 4 mma.m16n8k16 per k16, fp32 accumulators (BM/2 per thread).
//   SIMT (f32 / f64): BM = 64, each thread 8 x 4 outputs, FMA in the accumulator type (never TF32:
//     the oracle's f32 is IEEE).
// Shared tiles K-major or (tensor cores) MN-major: see CvTile::step.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "mma.cuh"

#ifdef CUHOST_RUNTIME  // the CPU stand-in (tests/cuda_host): fma from the C library
#include <cmath>
using std::fma;
#endif

#define CV_BM 64       // tile rows, SIMT (f32 / f64)
#define CV_BM_TC 128   // tile rows, tensor cores (bf16 / f16)
#define CV_BN 64
#define CV_BK 32
#define CV_THREADS 128
#define CV_STAGES 3    // cp.async pipeline depth of the channels-last kernels

// The launch parameters, packed by the host plan (backends/_plans/conv_cuda.py) as int64 words in
// field order.  Tensors are addressed through element strides in (n, c, d, h, w) order (weights:
// (co, ci, kd, kh, kw)), so every layout and view runs the same code; 1D and 2D are 3D with size-1
// leading dims.  CV_WORDS must match the plan's word count.
struct ConvParams {
  long long n, cin, cout, groups, cig, cog;
  long long in[3], out[3], k[3], s[3], p[3], d[3];
  long long sa[5], sb[5], sc[5];  // dgrad: dy, w, dx; wgrad: dy, x, dw
  long long rows;                 // wgrad: N * prod(out) (the reduction length)
  long long mblocks, cblocks, splits, chunk, taps, phases, trow;
  long long cfast;                // 1: the first operand's channel stride is 1 (load channel-fastest)
  long long magic[6];             // wgrad: (mul, shift) of out[2], out[1], out[0]; dgrad direct: of Cin
};
#define CV_WORDS 54

// ---------------------------------------------------------------------------- element types

__device__ __forceinline__ float cv_f(float v) { return v; }
__device__ __forceinline__ double cv_f(double v) { return v; }
__device__ __forceinline__ float cv_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float cv_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> struct CvType;
template <> struct CvType<float> {
  typedef float Acc;
  static constexpr bool kTC = false;
  __device__ static float from(float v) { return v; }
};
template <> struct CvType<double> {
  typedef double Acc;
  static constexpr bool kTC = false;
  __device__ static double from(double v) { return v; }
};
template <> struct CvType<__half> {
  typedef float Acc;
  static constexpr bool kTC = true;
  __device__ static __half from(float v) { return __float2half_rn(v); }
  __device__ static float of_bits(unsigned b) { return __half2float(__ushort_as_half((unsigned short)b)); }
};
template <> struct CvType<__nv_bfloat16> {
  typedef float Acc;
  static constexpr bool kTC = true;
  __device__ static __nv_bfloat16 from(float v) { return __float2bfloat16_rn(v); }
  __device__ static float of_bits(unsigned b) { return __uint_as_float(b << 16); }
};

// A 16-byte word (one vector load or store) and its element i in the accumulator type.  16-bit
// elements come out by shifts: taking the word's address to read them would put it in local memory.
struct alignas(16) CvWord16 {
  unsigned w[4];
};

template <typename T>
__device__ __forceinline__ typename CvType<T>::Acc cv_word_elem(const CvWord16& word, int i) {
  if constexpr (sizeof(T) == 2) {
    return CvType<T>::of_bits((word.w[i >> 1] >> ((i & 1) * 16)) & 0xffffu);
  } else {
    return reinterpret_cast<const T*>(&word)[i];
  }
}

template <typename T>
__device__ __forceinline__ T cv_zero() {
  return CvType<T>::from(0.0f);
}

// A scalar fill of a tile of ELEMS elements, N = ELEMS / CV_THREADS a thread: load(i) for CV_GATHER of
// the thread's i < N, then store(i, value) for those.  The group's loads are independent and go out
// together; the registers hold CV_GATHER values (all N at once held every address as well: 255
// registers and spills on the 128-row tiles).
#define CV_GATHER 8
template <int ELEMS, typename Load, typename Store>
__device__ __forceinline__ void cv_gather(Load load, Store store) {
  constexpr int N = ELEMS / CV_THREADS, G = N < CV_GATHER ? N : CV_GATHER;
  static_assert(N * CV_THREADS == ELEMS && N % G == 0, "a tile in whole passes and whole groups");
  typedef decltype(load(0)) V;
#pragma unroll 1
  for (int i0 = 0; i0 < N; i0 += G) {
    V v[G];
#pragma unroll
    for (int j = 0; j < G; ++j) v[j] = load(i0 + j);
#pragma unroll
    for (int j = 0; j < G; ++j) store(i0 + j, v[j]);
  }
}

// ---------------------------------------------------------------------------- fast divmod
// q = n / d for 0 <= n < 2^31 by a multiply-high and a shift: shift = ceil(log2 d),
// mul = floor(2^32 (2^shift - d) / d) + 1 (precomputed on the host, backends/_plans/conv_cuda.py
// `magic`), q = (umulhi(n, mul) + n) >> shift.  The sum stays below 2^32 for n < 2^31; the plan
// keeps every dividend below 2^31, and tests/test_cuda_conv.py checks the identity exhaustively
// over the ranges used.

__device__ __forceinline__ unsigned cv_umulhi(unsigned a, unsigned b) {
#ifdef CUHOST_RUNTIME
  return (unsigned)(((unsigned long long)a * b) >> 32);
#else
  return __umulhi(a, b);
#endif
}

// (q, r) of n by d: FAST takes the magic (mul, shift), else plain / and %.
template <bool FAST>
__device__ __forceinline__ void cv_divmod(int n, int d, unsigned mul, unsigned shift, int& q, int& r) {
  if (FAST) {
    q = (int)((cv_umulhi((unsigned)n, mul) + (unsigned)n) >> shift);
    r = n - q * d;
  } else {
    q = n / d;
    r = n % d;
  }
}

// ---------------------------------------------------------------------------- the block tile

// A 16-byte aligned shared-memory array declaration (the stand-in's __shared__ is `static`).
#ifdef CUHOST_RUNTIME
#define CV_SHARED16 alignas(16) static
#else
#define CV_SHARED16 __shared__ __align__(16)
#endif

#define CV_PAD(T) (CvType<T>::kTC ? 8 : 1)
#define CV_LDS(T) (CV_BK + CV_PAD(T))  // K-major tiles: row m (or n) of BK elements, padded

template <typename T, int BM_ = (CvType<T>::kTC ? CV_BM_TC : CV_BM)>
struct CvTile {
  typedef typename CvType<T>::Acc Acc;
  static constexpr bool TC = CvType<T>::kTC;
  static constexpr int BM = BM_;  // tile rows: 64 or 128 on tensor cores, 64 for SIMT
  static_assert(TC ? (BM == 64 || BM == 128) : BM == CV_BM, "CvTile rows");
  static constexpr int LDS = CV_LDS(T);
  static constexpr int LDTA = BM + 8, LDTB = CV_BN + 8;  // MN-major A / B tiles (TC only)
  static constexpr int MI = BM / 32;                     // TC: m16 tiles per warp (warp tile BM/2 x 32)
  static constexpr int NACC = TC ? MI * 4 * 4 : 32;
  Acc acc[NACC];

  __device__ void clear() {
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc[i] = Acc(0);
  }

  // The mma.sync of one k16 slice: a[MI][4] x b[4][2].
  __device__ void mma(const unsigned (&a)[MI][4], const unsigned (&b)[4][2]) {
    if constexpr (TC) {
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) tc_mma16816<T>(acc + (mi * 4 + ni) * 4, a[mi], b[ni]);
    }
  }

  // acc += A * B^T from tiles in either layout.  K-major (AMN / BMN false): As[BM][LDS] (row m,
  // k contiguous), Bs[BN][LDS]; fragments read as 32-bit words (two consecutive k), the pad of 8
  // putting a fragment's 8 rows on distinct banks.  MN-major (TC only): At[BK][LDTA] (row k, m
  // contiguous), Bt[BK][LDTB], the layout a 16-byte copy of channels-last rows gives; fragments by
  // ldmatrix.trans (row strides of 272 / 144 bytes: an 8x8 matrix's rows on distinct 16-byte bank
  // groups).  TC: warp w owns rows (w/2) * BM/2.., cols (w%2) * 32..; SIMT: thread (tr = tid/16,
  // tc = tid%16) owns rows tr + 8i (i < 8), cols tc + 16j (j < 4), FMA in the accumulator type.
  template <bool AMN = false, bool BMN = false>
  __device__ void step(const T* As, const T* Bs) {
    const int tid = threadIdx.x;
    if constexpr (TC) {
      const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
      const int mat = lane >> 3, mr = lane & 7;
      const int r0 = (warp >> 1) * (BM / 2), c0 = (warp & 1) * 32;
#pragma unroll
      for (int ks = 0; ks < CV_BK; ks += 16) {
        unsigned a[MI][4], b[4][2];
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
          if constexpr (AMN) {  // matrices (k 0-7, m 0-7), (k 0-7, m 8-15), (k 8-15, m 0-7), (k 8-15, m 8-15)
            tc_ldmatrix_x4_trans(a[mi], As + (ks + mr + (mat >> 1) * 8) * LDTA + r0 + mi * 16 + (mat & 1) * 8);
          } else {
            const T* q = As + (r0 + mi * 16 + g) * LDS + ks + 2 * t;
            a[mi][0] = *reinterpret_cast<const unsigned*>(q);
            a[mi][1] = *reinterpret_cast<const unsigned*>(q + 8 * LDS);
            a[mi][2] = *reinterpret_cast<const unsigned*>(q + 8);
            a[mi][3] = *reinterpret_cast<const unsigned*>(q + 8 * LDS + 8);
          }
        }
#pragma unroll
        for (int ni = 0; ni < 4; ni += 2) {
          if constexpr (BMN) {  // matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15)
            unsigned q[4];
            tc_ldmatrix_x4_trans(q, Bs + (ks + mr + (mat & 1) * 8) * LDTB + c0 + ni * 8 + (mat >> 1) * 8);
            b[ni][0] = q[0];
            b[ni][1] = q[1];
            b[ni + 1][0] = q[2];
            b[ni + 1][1] = q[3];
          } else {
#pragma unroll
            for (int nj = ni; nj < ni + 2; ++nj) {
              const T* q = Bs + (c0 + nj * 8 + g) * LDS + ks + 2 * t;
              b[nj][0] = *reinterpret_cast<const unsigned*>(q);
              b[nj][1] = *reinterpret_cast<const unsigned*>(q + 8);
            }
          }
        }
        mma(a, b);
      }
    } else {
      static_assert(!AMN && !BMN, "the SIMT step takes K-major tiles");
      const int tr = tid >> 4, tc = tid & 15;
#pragma unroll 4
      for (int k = 0; k < CV_BK; ++k) {
        Acc a[8], b[4];
#pragma unroll
        for (int i = 0; i < 8; ++i) a[i] = cv_f(As[(tr + 8 * i) * LDS + k]);
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = cv_f(Bs[(tc + 16 * j) * LDS + k]);
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i * 4 + j] = fma(a[i], b[j], acc[i * 4 + j]);
      }
    }
  }

  // f(row, col, value) for each of the thread's accumulators.
  template <typename F>
  __device__ void for_each(F f) const {
    const int tid = threadIdx.x;
    if constexpr (TC) {
      const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
      const int r0 = (warp >> 1) * (BM / 2), c0 = (warp & 1) * 32;
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            f(r0 + mi * 16 + g + (e >> 1) * 8, c0 + ni * 8 + 2 * t + (e & 1), acc[(mi * 4 + ni) * 4 + e]);
    } else {
      const int tr = tid >> 4, tc = tid & 15;
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) f(tr + 8 * i, tc + 16 * j, acc[i * 4 + j]);
    }
  }
};

// The channels-last kernels' main loop: `nsteps` reduction steps through CV_STAGES shared-memory
// stages.  load(step, stage) issues the step's cp.async copies (no commit); compute(stage) reads a
// stage.  One commit group per step (empty past the last step, so the wait count stays fixed); one
// barrier per step: after it every thread has finished computing the step before, whose stage is
// the one the new copies then overwrite.
template <typename Load, typename Compute>
__device__ __forceinline__ void cv_pipeline(int nsteps, Load load, Compute compute) {
#pragma unroll
  for (int s = 0; s < CV_STAGES - 1; ++s) {
    if (s < nsteps) load(s, s);
    tc_cp_commit();
  }
  int stage = 0;
  for (int s = 0; s < nsteps; ++s) {
    tc_cp_wait<CV_STAGES - 2>();  // this thread's copies of step s have landed
    __syncthreads();              // everyone's have, and step s - 1 is computed
    const int next = s + CV_STAGES - 1;
    if (next < nsteps) load(next, stage == 0 ? CV_STAGES - 1 : stage - 1);
    tc_cp_commit();
    compute(stage);
    stage = stage == CV_STAGES - 1 ? 0 : stage + 1;
  }
  tc_cp_wait<0>();  // the empty groups
}
