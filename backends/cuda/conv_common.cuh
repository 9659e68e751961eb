// What the conv dgrad and wgrad kernels share (conv_backward_data.cuh, conv_backward_weight.cuh):
// the parameter words, element conversions, fast divmod, and the block tile of the implicit GEMM
// (a BM x BN tile of fp32/fp64 accumulators fed from two K-contiguous shared-memory tiles).
//
// Tile: 128 threads (4 warps) own a 64 x 64 output tile; the reduction runs in steps of BK = 32.
//   Tensor cores (bf16 / f16, TC = true): warp w owns rows 32*(w/2).., cols 32*(w%2)..: 2 x 4
//     mma.m16n8k16 per k16, fp32 accumulators (32 per thread); fragments read from shared memory
//     as 32-bit words (two consecutive k of one row: the operands are stored K-contiguous).
//   SIMT (f32 / f64, TC = false): thread (tr = tid/16, tc = tid%16) owns rows tr + 8i (i < 8) and
//     cols tc + 16j (j < 4), FMA in the element type (never TF32: the oracle's f32 is IEEE).
// Shared tiles: As[BM][LDS] (row m, reduction index k) and Bs[BN][LDS] (col n, k), LDS = BK + pad:
// the 16-bit pad of 8 puts the 8 rows a fragment load touches on distinct banks.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "mma.cuh"

#ifdef CUHOST_RUNTIME  // the CPU stand-in (tests/cuda_host): fma from the C library
#include <cmath>
using std::fma;
#endif

#define CV_BM 64
#define CV_BN 64
#define CV_BK 32
#define CV_THREADS 128

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
  long long magic[6];             // wgrad: (mul, shift) of out[2], out[1], out[0]
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
};
template <> struct CvType<__nv_bfloat16> {
  typedef float Acc;
  static constexpr bool kTC = true;
  __device__ static __nv_bfloat16 from(float v) { return __float2bfloat16_rn(v); }
};

template <typename T>
__device__ __forceinline__ T cv_zero() {
  return CvType<T>::from(0.0f);
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

#define CV_PAD(T) (CvType<T>::kTC ? 8 : (sizeof(T) == 8 ? 1 : 1))
#define CV_LDS(T) (CV_BK + CV_PAD(T))
#define CV_LDT (CV_BM + 8)  // MN-major tiles (16-bit types): row k of BM (or BN) elements, padded

template <typename T>
struct CvTile {
  typedef typename CvType<T>::Acc Acc;
  static constexpr int LDS = CV_LDS(T);
  Acc acc[32];

  __device__ void clear() {
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = Acc(0);
  }

  // acc += As (BM x BK, row-major LDS) * Bs^T (Bs: BN x BK, row-major LDS).
  __device__ void step(const T* As, const T* Bs) {
    const int tid = threadIdx.x;
    if constexpr (CvType<T>::kTC) {
      const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
      const int r0 = (warp >> 1) * 32, c0 = (warp & 1) * 32;
#pragma unroll
      for (int ks = 0; ks < CV_BK; ks += 16) {
        unsigned a[2][4], b[4][2];
        const int k = ks + 2 * t;
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          const T* p = As + (r0 + mi * 16 + g) * LDS + k;
          a[mi][0] = *reinterpret_cast<const unsigned*>(p);
          a[mi][1] = *reinterpret_cast<const unsigned*>(p + 8 * LDS);
          a[mi][2] = *reinterpret_cast<const unsigned*>(p + 8);
          a[mi][3] = *reinterpret_cast<const unsigned*>(p + 8 * LDS + 8);
        }
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          const T* p = Bs + (c0 + ni * 8 + g) * LDS + k;
          b[ni][0] = *reinterpret_cast<const unsigned*>(p);
          b[ni][1] = *reinterpret_cast<const unsigned*>(p + 8);
        }
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
          for (int ni = 0; ni < 4; ++ni) tc_mma16816<T>(acc + (mi * 4 + ni) * 4, a[mi], b[ni]);
      }
    } else {
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

  // Tensor cores only: acc += A * B^T from tiles in either layout.  K-major (AMN / BMN false): the
  // step() layout above.  MN-major (true): At[BK][LDT] (row k, col m), LDT = BM + 8, the layout a
  // 16-byte copy of a channels-last row gives; its fragments come by ldmatrix.trans (rows of 144
  // bytes: the 8 rows of one 8x8 matrix fall on distinct 16-byte bank groups).
  template <bool AMN, bool BMN>
  __device__ void step2(const T* As, const T* Bs) {
    static_assert(CvType<T>::kTC, "step2 is the tensor-core step");
    constexpr int LDT = CV_BM + 8;
    const int tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int mat = lane >> 3, mr = lane & 7;
    const int r0 = (warp >> 1) * 32, c0 = (warp & 1) * 32;
#pragma unroll
    for (int ks = 0; ks < CV_BK; ks += 16) {
      unsigned a[2][4], b[4][2];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        if constexpr (AMN) {  // matrices (k 0-7, m 0-7), (k 0-7, m 8-15), (k 8-15, m 0-7), (k 8-15, m 8-15)
          tc_ldmatrix_x4_trans(a[mi], As + (ks + mr + (mat >> 1) * 8) * LDT + r0 + mi * 16 + (mat & 1) * 8);
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
          tc_ldmatrix_x4_trans(q, Bs + (ks + mr + (mat & 1) * 8) * LDT + c0 + ni * 8 + (mat >> 1) * 8);
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
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) tc_mma16816<T>(acc + (mi * 4 + ni) * 4, a[mi], b[ni]);
    }
  }

  // f(row, col, value) for each of the thread's 32 accumulators.
  template <typename F>
  __device__ void for_each(F f) const {
    const int tid = threadIdx.x;
    if constexpr (CvType<T>::kTC) {
      const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
      const int r0 = (warp >> 1) * 32, c0 = (warp & 1) * 32;
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
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
