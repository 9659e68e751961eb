// layernorm_backward: CUDA device code for the cupy backend (NVRTC; -I backends/cuda for
// norm_common.cuh).  Spec: oracle/layernorm_backward.py.  Host: backends/cupy/layernorm_backward.py
// and backends/cupy/_norm_plan.py.
//
// The `best` variant is norm_common.cuh's nb_rows / nb_chunked / nb_colsum with the
// policy below.  This file adds the ladder of seed 004 (layernorm backward, FP32 16x64x2048 on an
// A100: v1 7.48M cycles, v2 0.25M, v3 0.25M, v4 0.098M), each rung written to do what the
// seed's version does, with three corrections every rung needs to meet the spec:
//   * dx is written (the seed adds into it: `dinput[i] += dval`), since outputs arrive NaN;
//   * dweight / dbias accumulate in A (float, double for double) into zeroed buffers that
//     nb_colsum<T> (nparts = 1) then rounds to T: atomics in bf16 / f16 would lose ~u*sqrt(M);
//   * every loop that contains a barrier has a block-uniform trip count (the seed's v3 / v4
//     call __syncthreads inside `for (i = tid; i < N; ...)`, undefined when N is not a
//     multiple of the block), and grids are 1-D (the seed's grid.y caps M at 65535).
// Every rung reads x, dy, weight, mean and rstd through NBParams' row offsets and column
// strides, so each takes every layout.
//
//   ln_v1<T>(p, x, dy, w, mean, rstd, dx, accw, accb)   one thread per row (grid = ceil(M / 256)
//       blocks of 256): two serial passes over N; atomicAdd of every element's dweight and
//       dbias terms.  Neighbouring threads read rows N apart: no coalescing.
//   ln_v2<T>(...)   one warp per row (blockDim 32, grid M): strided passes, shuffle sums.
//   ln_v3<T>(...)   v2 with dy staged through shared memory in the second pass (as the seed
//       does it: each thread stores its element, a barrier, reads it back; the seed meant to
//       avoid a second global read and does not, which is why it times like v2).
//   ln_v4<T>(...)   v3 with 1024 threads per row (blockDim 1024, grid M): block reduction
//       (warp shuffles, warp sums through shared memory, warp 0 sums those and broadcasts).
//   ln_v5<T, CPT>(...)   the seed's proposed next step: blockDim 1024, grid = nparts blocks,
//       each taking rows_per_block consecutive rows; thread t owns columns t + 1024k (k < CPT,
//       CPT * 1024 >= N) and keeps their dweight / dbias sums in registers across its rows;
//       one atomicAdd per column per block at the end (nparts * N instead of M * N).
//   All take acc (A, 2N elements, zeroed before the launch): dweight's sums in [0, N), dbias's
//   in [N, 2N), each used only when flags ask for it; then nb_colsum<T>(acc, row0, 1, N, ...)
//   rounds them to T (row0 = 1 when only dbias is wanted).
#pragma once

#include "norm_common.cuh"

struct NBLayerNorm {
  static constexpr bool kMean = true;
  static constexpr bool kBias = true;  // has a dbias
};

#define LN_V1_BLOCK 256
#define LN_V4_BLOCK 1024

// ============================================================================ v1: a thread per row

template <typename T>
__global__ void __launch_bounds__(LN_V1_BLOCK)
ln_v1(const __grid_constant__ NBParams p, const T* __restrict__ x, const T* __restrict__ dy,
      const T* __restrict__ w, const nb_acc_t<T>* __restrict__ mean, const nb_acc_t<T>* __restrict__ rstd,
      T* __restrict__ dx, nb_acc_t<T>* acc) {
  typedef nb_acc_t<T> A;
  const long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= p.rows) return;
  const long long n = p.n;
  const bool has_w = (p.flags & NB_HAS_W) != 0, has_b = (p.flags & NB_HAS_B) != 0;
  long long off[NB_NT];
  nb_row_offsets(p, row, off);
  const T* xr = x + off[NB_X];
  const T* dr = dy + off[NB_DY];
  T* dxr = dx + off[NB_DX];
  const A m = mean[off[NB_MEAN]], r = rstd[off[NB_RSTD]];
  const long long csx = p.col_stride[NB_X], csd = p.col_stride[NB_DY], cso = p.col_stride[NB_DX];
  const long long csw = p.col_stride[NB_W];
  nb_acc_t<T>* const accw = acc;         // dweight's sums: acc[0, N)
  nb_acc_t<T>* const accb = acc + n;     // dbias's: acc[N, 2N)

  A s1 = A(0), s2 = A(0);
  for (long long i = 0; i < n; ++i) {
    const A xh = nb_xhat<NBLayerNorm, A>(nb_to_acc(xr[i * csx]), m, r);
    const A d = nb_to_acc(dr[i * csd]);
    const A g = has_w ? nb_to_acc(w[i * csw]) * d : d;
    s1 += g;
    s2 += g * xh;
  }
  const A a = s1 / A(n), b = s2 / A(n);
  for (long long i = 0; i < n; ++i) {
    const A xh = nb_xhat<NBLayerNorm, A>(nb_to_acc(xr[i * csx]), m, r);
    const A d = nb_to_acc(dr[i * csd]);
    const A g = has_w ? nb_to_acc(w[i * csw]) * d : d;
    if (has_b) atomicAdd(accb + i, d);
    if (has_w) atomicAdd(accw + i, xh * d);
    dxr[i * cso] = nb_from_acc<T>(nb_dx<NBLayerNorm, A>(g, xh, r, a, b));
  }
}

// ============================================================================ v2 / v3: a warp per row

template <typename T, bool STAGE_DY>
__device__ __forceinline__ void ln_warp_row(const NBParams& p, const T* __restrict__ x, const T* __restrict__ dy,
                                            const T* __restrict__ w, const nb_acc_t<T>* __restrict__ mean,
                                            const nb_acc_t<T>* __restrict__ rstd, T* __restrict__ dx,
                                            nb_acc_t<T>* acc, T* stage) {
  typedef nb_acc_t<T> A;
  const long long row = blockIdx.x;
  const int lane = threadIdx.x;
  const long long n = p.n;
  const bool has_w = (p.flags & NB_HAS_W) != 0, has_b = (p.flags & NB_HAS_B) != 0;
  long long off[NB_NT];
  nb_row_offsets(p, row, off);
  const T* xr = x + off[NB_X];
  const T* dr = dy + off[NB_DY];
  T* dxr = dx + off[NB_DX];
  const A m = mean[off[NB_MEAN]], r = rstd[off[NB_RSTD]];
  const long long csx = p.col_stride[NB_X], csd = p.col_stride[NB_DY], cso = p.col_stride[NB_DX];
  const long long csw = p.col_stride[NB_W];
  nb_acc_t<T>* const accw = acc;         // dweight's sums: acc[0, N)
  nb_acc_t<T>* const accb = acc + n;     // dbias's: acc[N, 2N)

  A s1 = A(0), s2 = A(0);
  for (long long i = lane; i < n; i += 32) {
    const A xh = nb_xhat<NBLayerNorm, A>(nb_to_acc(xr[i * csx]), m, r);
    const A d = nb_to_acc(dr[i * csd]);
    const A g = has_w ? nb_to_acc(w[i * csw]) * d : d;
    s1 += g;
    s2 += g * xh;
  }
  s1 = nb_warp_sum(s1);
  s2 = nb_warp_sum(s2);
  const A a = s1 / A(n), b = s2 / A(n);
  for (long long i0 = 0; i0 < n; i0 += 32) {  // warp-uniform trip count (v3 has a barrier in it)
    const long long i = i0 + lane;
    A d;
    if (STAGE_DY) {
      if (i < n) stage[lane] = dr[i * csd];
      __syncthreads();
      d = i < n ? nb_to_acc(stage[lane]) : A(0);
    } else {
      d = i < n ? nb_to_acc(dr[i * csd]) : A(0);
    }
    if (i < n) {
      const A xh = nb_xhat<NBLayerNorm, A>(nb_to_acc(xr[i * csx]), m, r);
      const A g = has_w ? nb_to_acc(w[i * csw]) * d : d;
      if (has_b) atomicAdd(accb + i, d);
      if (has_w) atomicAdd(accw + i, xh * d);
      dxr[i * cso] = nb_from_acc<T>(nb_dx<NBLayerNorm, A>(g, xh, r, a, b));
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(32)
ln_v2(const __grid_constant__ NBParams p, const T* __restrict__ x, const T* __restrict__ dy,
      const T* __restrict__ w, const nb_acc_t<T>* __restrict__ mean, const nb_acc_t<T>* __restrict__ rstd,
      T* __restrict__ dx, nb_acc_t<T>* acc) {
  ln_warp_row<T, false>(p, x, dy, w, mean, rstd, dx, acc, nullptr);
}

template <typename T>
__global__ void __launch_bounds__(32)
ln_v3(const __grid_constant__ NBParams p, const T* __restrict__ x, const T* __restrict__ dy,
      const T* __restrict__ w, const nb_acc_t<T>* __restrict__ mean, const nb_acc_t<T>* __restrict__ rstd,
      T* __restrict__ dx, nb_acc_t<T>* acc) {
  __shared__ T stage[32];
  ln_warp_row<T, true>(p, x, dy, w, mean, rstd, dx, acc, stage);
}

// ============================================================================ v4 / v5: 1024 threads per row

// The seed's block reduction: warp sums, the 32 warp sums through shared memory, warp 0 sums
// those and thread 0 broadcasts the total through shared memory.  Every thread must call it.
template <typename A>
__device__ __forceinline__ void ln_block_sum2(A& s1, A& s2) {
  __shared__ A warp_sums[32][2];
  __shared__ A total[2];
  const int tid = threadIdx.x, wid = tid >> 5, lane = tid & 31;
  s1 = nb_warp_sum(s1);
  s2 = nb_warp_sum(s2);
  if (lane == 0) {
    warp_sums[wid][0] = s1;
    warp_sums[wid][1] = s2;
  }
  __syncthreads();
  if (wid == 0) {
    A t1 = warp_sums[lane][0], t2 = warp_sums[lane][1];  // blockDim = 1024: 32 warps
    t1 = nb_warp_sum(t1);
    t2 = nb_warp_sum(t2);
    if (lane == 0) {
      total[0] = t1;
      total[1] = t2;
    }
  }
  __syncthreads();
  s1 = total[0];
  s2 = total[1];
  __syncthreads();  // total and warp_sums are rewritten by the next call
}

template <typename T>
__global__ void __launch_bounds__(LN_V4_BLOCK)
ln_v4(const __grid_constant__ NBParams p, const T* __restrict__ x, const T* __restrict__ dy,
      const T* __restrict__ w, const nb_acc_t<T>* __restrict__ mean, const nb_acc_t<T>* __restrict__ rstd,
      T* __restrict__ dx, nb_acc_t<T>* acc) {
  typedef nb_acc_t<T> A;
  __shared__ T stage[LN_V4_BLOCK];
  const long long row = blockIdx.x;
  const int tid = threadIdx.x;
  const long long n = p.n;
  const bool has_w = (p.flags & NB_HAS_W) != 0, has_b = (p.flags & NB_HAS_B) != 0;
  long long off[NB_NT];
  nb_row_offsets(p, row, off);
  const T* xr = x + off[NB_X];
  const T* dr = dy + off[NB_DY];
  T* dxr = dx + off[NB_DX];
  const A m = mean[off[NB_MEAN]], r = rstd[off[NB_RSTD]];
  const long long csx = p.col_stride[NB_X], csd = p.col_stride[NB_DY], cso = p.col_stride[NB_DX];
  const long long csw = p.col_stride[NB_W];
  nb_acc_t<T>* const accw = acc;         // dweight's sums: acc[0, N)
  nb_acc_t<T>* const accb = acc + n;     // dbias's: acc[N, 2N)

  A s1 = A(0), s2 = A(0);
  for (long long i = tid; i < n; i += LN_V4_BLOCK) {
    const A xh = nb_xhat<NBLayerNorm, A>(nb_to_acc(xr[i * csx]), m, r);
    const A d = nb_to_acc(dr[i * csd]);
    const A g = has_w ? nb_to_acc(w[i * csw]) * d : d;
    s1 += g;
    s2 += g * xh;
  }
  ln_block_sum2(s1, s2);
  const A a = s1 / A(n), b = s2 / A(n);
  for (long long i0 = 0; i0 < n; i0 += LN_V4_BLOCK) {  // block-uniform trip count
    const long long i = i0 + tid;
    if (i < n) stage[tid] = dr[i * csd];
    __syncthreads();
    if (i < n) {
      const A d = nb_to_acc(stage[tid]);
      const A xh = nb_xhat<NBLayerNorm, A>(nb_to_acc(xr[i * csx]), m, r);
      const A g = has_w ? nb_to_acc(w[i * csw]) * d : d;
      if (has_b) atomicAdd(accb + i, d);
      if (has_w) atomicAdd(accw + i, xh * d);
      dxr[i * cso] = nb_from_acc<T>(nb_dx<NBLayerNorm, A>(g, xh, r, a, b));
    }
  }
}

template <typename T, int CPT>
__global__ void __launch_bounds__(LN_V4_BLOCK)
ln_v5(const __grid_constant__ NBParams p, const T* __restrict__ x, const T* __restrict__ dy,
      const T* __restrict__ w, const nb_acc_t<T>* __restrict__ mean, const nb_acc_t<T>* __restrict__ rstd,
      T* __restrict__ dx, nb_acc_t<T>* acc) {
  typedef nb_acc_t<T> A;
  __shared__ T stage[LN_V4_BLOCK];
  const int tid = threadIdx.x;
  const long long n = p.n;
  const bool has_w = (p.flags & NB_HAS_W) != 0, has_b = (p.flags & NB_HAS_B) != 0;
  const long long csx = p.col_stride[NB_X], csd = p.col_stride[NB_DY], cso = p.col_stride[NB_DX];
  const long long csw = p.col_stride[NB_W];
  nb_acc_t<T>* const accw = acc;         // dweight's sums: acc[0, N)
  nb_acc_t<T>* const accb = acc + n;     // dbias's: acc[N, 2N)

  A pw[CPT], pb[CPT];  // this thread's columns' dweight / dbias sums over the block's rows
#pragma unroll
  for (int k = 0; k < CPT; ++k) pw[k] = pb[k] = A(0);

  const long long r_lo = (long long)blockIdx.x * p.rows_per_block;
  const long long r_hi = nb_min(p.rows, r_lo + p.rows_per_block);
  for (long long row = r_lo; row < r_hi; ++row) {
    long long off[NB_NT];
    nb_row_offsets(p, row, off);
    const T* xr = x + off[NB_X];
    const T* dr = dy + off[NB_DY];
    T* dxr = dx + off[NB_DX];
    const A m = mean[off[NB_MEAN]], r = rstd[off[NB_RSTD]];
    A s1 = A(0), s2 = A(0);
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
      const long long i = (long long)k * LN_V4_BLOCK + tid;
      if (i < n) {
        const A xh = nb_xhat<NBLayerNorm, A>(nb_to_acc(xr[i * csx]), m, r);
        const A d = nb_to_acc(dr[i * csd]);
        const A g = has_w ? nb_to_acc(w[i * csw]) * d : d;
        s1 += g;
        s2 += g * xh;
      }
    }
    ln_block_sum2(s1, s2);
    const A a = s1 / A(n), b = s2 / A(n);
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
      const long long i = (long long)k * LN_V4_BLOCK + tid;
      if (i < n) stage[tid] = dr[i * csd];
      __syncthreads();
      if (i < n) {
        const A d = nb_to_acc(stage[tid]);
        const A xh = nb_xhat<NBLayerNorm, A>(nb_to_acc(xr[i * csx]), m, r);
        const A g = has_w ? nb_to_acc(w[i * csw]) * d : d;
        pb[k] += d;
        pw[k] += xh * d;
        dxr[i * cso] = nb_from_acc<T>(nb_dx<NBLayerNorm, A>(g, xh, r, a, b));
      }
    }
  }
#pragma unroll
  for (int k = 0; k < CPT; ++k) {
    const long long i = (long long)k * LN_V4_BLOCK + tid;
    if (i < n) {
      if (has_b) atomicAdd(accb + i, pb[k]);
      if (has_w) atomicAdd(accw + i, pw[k]);
    }
  }
}
