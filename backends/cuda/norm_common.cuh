// Shared device code of the normalisation backwards (layernorm_backward, rmsnorm_backward): the
// launch parameters, row addressing, reductions, and the `best` kernels, written once and
// templated on the norm (NBLayerNorm / NBRmsNorm, defined by each op's header).
// Spec: oracle/layernorm_backward.py, oracle/rmsnorm_backward.py.  Host planning:
// backends/cupy/_norm_plan.py.
//
// Self-contained for NVRTC: only cuda_fp16.h / cuda_bf16.h are included, and only `long long`
// / `int` / `unsigned int` integer types are used.  NVRTC finds this header through -I
// backends/cuda (the host passes it); nvcc through the including file's folder.
//
// ============================================================================ launch contract
//
// T = float | double | __half | __nv_bfloat16: x, dy, weight, dx, dweight, dbias.  A =
// nb_acc_t<T> (double for double, float otherwise): mean, rstd, every sum and partial buffer.
//
// NBParams (by value, __grid_constant__, all long long: the host packs it as NB_PARAMS_WORDS
// int64 words in field order).  x is (lead..., N); its leading dims, merged where every row
// tensor allows, are size[0..nlead) (outer -> inner) with element strides stride[t][.] for the
// row tensors t = NB_X, NB_DY, NB_DX, NB_MEAN, NB_RSTD.  Row r's offsets are those of the
// row-major unravel of r.  col_stride[t] (t = NB_X, NB_DY, NB_DX, NB_W) is the element stride
// along N; out_stride[0 / 1] those of dweight / dbias.  flags: NB_HAS_W (weight given, dweight
// wanted), NB_HAS_B (dbias wanted); nb_rows3 also NB_PHASE_ROWS / NB_PHASE_COLS (norm_rows3.cuh).
// Kernels read only the fields their entry below names.
//
//   nb_rows<Norm,T,VEC,VPT,WIDE>(p, x, dy, w, mean, rstd, dx, part, dw, db)   [best, other layouts]
//       blockDim = NB_ROWS_BLOCK; grid = nparts blocks.  Block b takes rows
//       [b * rows_per_block, min(rows, (b+1) * rows_per_block)); its NB_ROWS_BLOCK / gw groups of
//       gw threads (gw = 1 << gw_log2, a power of two <= NB_ROWS_BLOCK) take one row each per
//       step, the row held in registers: thread `lane` owns the VEC-element vectors lane,
//       lane + gw, ... (VPT of them), so VPT * VEC * gw >= N.  WIDE = gw > 32 (row sums through
//       shared memory), else row sums by shuffles.  VEC > 1 (16-byte vectors) requires
//       N % VEC == 0, col_stride 1 for x, dy, dx (and w) and 16-byte aligned rows.  dweight and
//       dbias partials stay in registers across the block's rows; then, with nparts == 1, the
//       block writes dw / db (T) itself, else row b of part (A, [2][nparts][N]: dweight's
//       partial rows, then dbias's; only those wanted are read later) for nb_colsum.
//   nb_rows2<Norm,T,VEC,VPT,BLOCK,PF>(p, x, dy, w, mean, rstd, dx, part, dw, db)   [v6, candidate]
//       nb_rows' contract in blocks of BLOCK threads capped at 64 registers: see its section below.
//   nb_rows3<Norm,T,VPT,GW,STAGES>(p, x, dy, w, mean, rstd, dx, part, dw, db, bar)   [v7, candidate]
//       dense 16-byte rows: blocks of max(256, GW) threads capped at 64 registers, x / dy copied
//       into shared memory STAGES - 1 rows ahead, an optional fused finish: norm_rows3.cuh.
//   nb_chunked<Norm,T,VEC,VPT>(p, x, dy, w, mean, rstd, dx, part)           [best, large N]
//       blockDim = NB_CHUNK_BLOCK; grid = nparts.  Block b takes the same row range as above, in
//       tiles of tile_rows rows: row sums over column chunks of NB_CHUNK_BLOCK * VPT * VEC
//       elements (first pass), then per chunk the tile's dx and its dweight / dbias sums (second
//       pass, x and dy read again), added in tile order to part row b.  Always nb_colsum next.
//   nb_colsum<T>(part, row0, nparts, n, out0, stride0, out1, stride1)         [stage 2, casts]
//       grid = (ceil(n / 32), outputs); blockIdx.y = 0 writes out0 from part rows
//       [row0, row0 + nparts), 1 writes out1 from the next nparts rows: out[j * stride] =
//       T(sum over those rows of part[row * n + j], in a fixed order).  blockDim = NB_COLSUM_BLOCK.
//       (nb_colsum_tile: one block's 32 columns.)
//
// Every element of every output (or partial row) is written once per call and every sum is
// taken in an order fixed by the launch configuration: results are bitwise reproducible.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define NB_MAX_LEAD 6        // leading (row) dims after merging
#define NB_NT 5              // row tensors
#define NB_ROWS_BLOCK 512    // threads per nb_rows block
#define NB_CHUNK_BLOCK 512   // threads per nb_chunked block
#define NB_COLSUM_BLOCK 512  // threads per nb_colsum block: 32 columns x 16 row slices
#define NB_MAX_TILE_ROWS 32  // nb_chunked: rows per tile at most
#define NB_HAS_W 1
#define NB_HAS_B 2

enum : int { NB_X = 0, NB_DY = 1, NB_DX = 2, NB_MEAN = 3, NB_RSTD = 4 };
enum : int { NB_W = 3 };  // col_stride slot of weight

struct NBParams {
  long long rows;                          // M
  long long n;                             // N
  long long nlead;                         // leading dims in use, 0..NB_MAX_LEAD
  long long size[NB_MAX_LEAD];             // outer -> inner; unused entries 1
  long long stride[NB_NT][NB_MAX_LEAD];    // elements, per row tensor; unused entries 0
  long long col_stride[4];                 // x, dy, dx, weight along N
  long long out_stride[2];                 // dweight, dbias
  long long flags;                         // NB_HAS_W | NB_HAS_B
  long long gw;                            // nb_rows: threads per row (power of two)
  long long gw_log2;
  long long rows_per_block;                // nb_rows, nb_chunked, v5
  long long nparts;                        // partial rows per output (= grid of nb_rows / nb_chunked)
  long long tile_rows;                     // nb_chunked
};

#define NB_PARAMS_WORDS (3 + NB_MAX_LEAD + NB_NT * NB_MAX_LEAD + 4 + 2 + 6)
static_assert(sizeof(NBParams) == NB_PARAMS_WORDS * 8, "NBParams must be packed long longs");

// ============================================================================ element types

template <typename T> struct NBAcc { typedef float type; };
template <> struct NBAcc<double> { typedef double type; };
template <typename T> using nb_acc_t = typename NBAcc<T>::type;

__device__ __forceinline__ float nb_to_acc(float x) { return x; }
__device__ __forceinline__ double nb_to_acc(double x) { return x; }
__device__ __forceinline__ float nb_to_acc(__half x) { return __half2float(x); }
__device__ __forceinline__ float nb_to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T nb_from_acc(nb_acc_t<T> x);
template <> __device__ __forceinline__ float nb_from_acc<float>(float x) { return x; }
template <> __device__ __forceinline__ double nb_from_acc<double>(double x) { return x; }
template <> __device__ __forceinline__ __half nb_from_acc<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 nb_from_acc<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// VEC elements of T moved as one access (16 bytes when VEC = 16 / sizeof(T)).
template <typename T, int VEC> struct alignas(sizeof(T) * VEC) NBVec { T v[VEC]; };

__device__ __forceinline__ long long nb_min(long long a, long long b) { return a < b ? a : b; }

// ============================================================================ the norms' math

// The backward of one row, given its statistics: xhat = (x - mean) * rstd (layer norm) or
// x * rstd (RMS norm), g = weight * dy (dy without weight), and with the row means
// a = mean(g), b = mean(g * xhat):  dx = rstd * (g - a - xhat * b) (layer norm) or
// rstd * (g - xhat * b) (RMS norm).  Each op's header defines its policy:
//   struct Norm { static constexpr bool kMean; };   // subtracts the mean (layer norm) or not
template <class Norm, typename A>
__device__ __forceinline__ A nb_xhat(A x, A mean, A rstd) {
  return Norm::kMean ? (x - mean) * rstd : x * rstd;
}

template <class Norm, typename A>
__device__ __forceinline__ A nb_dx(A g, A xhat, A rstd, A a, A b) {
  return Norm::kMean ? rstd * (g - a - xhat * b) : rstd * (g - xhat * b);
}

// ============================================================================ row addressing

// off[t] = offset of row `row`'s first element in row tensor t.  One leading dim (the usual
// case after merging) needs no division; rows fit in 32 bits in practice (the row count is
// checked by the host), so 32-bit division.
__device__ __forceinline__ void nb_row_offsets(const NBParams& p, long long row, long long* off) {
#pragma unroll
  for (int t = 0; t < NB_NT; ++t) off[t] = 0;
  if (p.nlead == 1) {
#pragma unroll
    for (int t = 0; t < NB_NT; ++t) off[t] = row * p.stride[t][0];
    return;
  }
  unsigned int i = (unsigned int)row;
#pragma unroll
  for (int d = NB_MAX_LEAD - 1; d >= 0; --d) {
    if (d < p.nlead) {
      unsigned int r = i;
      if (d > 0) {
        const unsigned int sz = (unsigned int)p.size[d];
        const unsigned int q = i / sz;
        r = i - q * sz;
        i = q;
      }
#pragma unroll
      for (int t = 0; t < NB_NT; ++t) off[t] += (long long)r * p.stride[t][d];
    }
  }
}

// ============================================================================ reductions

template <typename A>
__device__ __forceinline__ A nb_warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Butterfly over aligned groups of `width` lanes (a power of two <= 32): every lane of a group
// ends with the same bits (each step adds the same two values in both lanes).  All 32 lanes
// of the warp must call it.
template <typename A>
__device__ __forceinline__ A nb_group_sum(A v, int width) {
  for (int o = width >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ============================================================================ loads and stores

// `col` is an element index within a row (N < 2**31); with VEC > 1, cs is 1 and base + col is
// 16-byte aligned.
template <typename T, int VEC>
__device__ __forceinline__ NBVec<T, VEC> nb_load_vec(const T* base, int col, long long cs) {
  if (VEC == 1) {
    NBVec<T, VEC> r;
    r.v[0] = base[(long long)col * cs];
    return r;
  }
  return *reinterpret_cast<const NBVec<T, VEC>*>(base + col);  // cs == 1, 16-byte aligned
}

template <typename T, int VEC>
__device__ __forceinline__ void nb_store_vec(T* base, int col, long long cs, const NBVec<T, VEC>& v) {
  if (VEC == 1)
    base[(long long)col * cs] = v.v[0];
  else
    *reinterpret_cast<NBVec<T, VEC>*>(base + col) = v;
}

// ============================================================================ best: rows in registers

// One row's data as one thread holds it: its VPT vectors of x and dy, the row's statistics and
// where its dx goes.
template <typename T, int VEC, int VPT>
struct NBRowRegs {
  NBVec<T, VEC> x[VPT], d[VPT];
  nb_acc_t<T> mean, rstd;
  long long off_dx;
};

template <class Norm, typename T, int VEC, int VPT>
__device__ __forceinline__ void nb_fetch_row(const NBParams& p, long long row, const T* __restrict__ x,
                                             const T* __restrict__ dy, const nb_acc_t<T>* __restrict__ mean,
                                             const nb_acc_t<T>* __restrict__ rstd, const int* col,
                                             const bool* cok, NBRowRegs<T, VEC, VPT>& r) {
  long long off[NB_NT];
  nb_row_offsets(p, row, off);
  r.off_dx = off[NB_DX];
  r.rstd = rstd[off[NB_RSTD]];
  r.mean = Norm::kMean ? mean[off[NB_MEAN]] : nb_acc_t<T>(0);
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    if (cok[k]) {
      r.x[k] = nb_load_vec<T, VEC>(x + off[NB_X], col[k], p.col_stride[NB_X]);
      r.d[k] = nb_load_vec<T, VEC>(dy + off[NB_DY], col[k], p.col_stride[NB_DY]);
    }
  }
}

template <class Norm, typename T, int VEC, int VPT, bool WIDE>
__global__ void __launch_bounds__(NB_ROWS_BLOCK)
nb_rows(const __grid_constant__ NBParams p, const T* __restrict__ x, const T* __restrict__ dy,
        const T* __restrict__ w, const nb_acc_t<T>* __restrict__ mean, const nb_acc_t<T>* __restrict__ rstd,
        T* __restrict__ dx, nb_acc_t<T>* __restrict__ part, T* __restrict__ dw, T* __restrict__ db) {
  typedef nb_acc_t<T> A;
  typedef NBVec<T, VEC> V;
  typedef NBRowRegs<T, VEC, VPT> R;
  __shared__ A red[2][NB_ROWS_BLOCK / 32][2];  // WIDE: per-warp row sums, double-buffered by step
  __shared__ A fin[2][NB_ROWS_BLOCK];          // the groups' dweight / dbias partials, one element at a time

  const int tid = threadIdx.x;
  const int gw = (int)p.gw, glog = (int)p.gw_log2;
  const int lane = tid & (gw - 1), grp = tid >> glog, ngrp = NB_ROWS_BLOCK >> glog;
  const int n = (int)p.n;
  const bool has_w = (p.flags & NB_HAS_W) != 0, has_b = (p.flags & NB_HAS_B) != 0;
  const A inv_n = A(1) / A(n);

  // This thread's columns (with VEC > 1, N % VEC == 0: a vector is all in or all out).
  bool cok[VPT];
  int col[VPT];
  V wv[VPT];
  A accw[VPT][VEC], accb[VPT][VEC];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    col[k] = (k * gw + lane) * VEC;
    cok[k] = col[k] < n;
    if (has_w && cok[k]) wv[k] = nb_load_vec<T, VEC>(w, col[k], p.col_stride[NB_W]);
#pragma unroll
    for (int e = 0; e < VEC; ++e) accw[k][e] = accb[k][e] = A(0);
  }

  const long long r_lo = (long long)blockIdx.x * p.rows_per_block;
  const long long r_hi = nb_min(p.rows, r_lo + p.rows_per_block);

  // Software pipeline: the next row's loads are in flight during this row's arithmetic.
  R cur;
  if (r_lo + grp < r_hi) nb_fetch_row<Norm, T, VEC, VPT>(p, r_lo + grp, x, dy, mean, rstd, col, cok, cur);

  int buf = 0;
  for (long long base = r_lo; base < r_hi; base += ngrp) {  // block-uniform trip count
    const long long row = base + grp;
    const bool rok = row < r_hi;
    R nxt;
    if (row + ngrp < r_hi) nb_fetch_row<Norm, T, VEC, VPT>(p, row + ngrp, x, dy, mean, rstd, col, cok, nxt);

    // Row sums of g and g * xhat over this thread's elements, then over the group.
    A s1 = A(0), s2 = A(0);
    if (rok) {
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        if (!cok[k]) continue;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const A xh = nb_xhat<Norm, A>(nb_to_acc(cur.x[k].v[e]), cur.mean, cur.rstd);
          const A d = nb_to_acc(cur.d[k].v[e]);
          const A g = has_w ? nb_to_acc(wv[k].v[e]) * d : d;
          s1 += g;
          s2 += g * xh;
        }
      }
    }
    if (WIDE) {
      s1 = nb_warp_sum(s1);
      s2 = nb_warp_sum(s2);
      if ((tid & 31) == 0) {
        red[buf][tid >> 5][0] = s1;
        red[buf][tid >> 5][1] = s2;
      }
      // One barrier per step: a buffer is rewritten two steps later, after every thread has
      // passed the next step's barrier, so after it has read this one.
      __syncthreads();
      const int w0 = (grp << glog) >> 5, nw = gw >> 5;
      s1 = s2 = A(0);
      for (int j = 0; j < nw; ++j) {  // the same order in every thread of the group
        s1 += red[buf][w0 + j][0];
        s2 += red[buf][w0 + j][1];
      }
      buf ^= 1;
    } else {
      s1 = nb_group_sum(s1, gw);
      s2 = nb_group_sum(s2, gw);
    }
    const A a = s1 * inv_n, b = s2 * inv_n;

    if (rok) {
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        if (!cok[k]) continue;
        V out;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const A xh = nb_xhat<Norm, A>(nb_to_acc(cur.x[k].v[e]), cur.mean, cur.rstd);
          const A d = nb_to_acc(cur.d[k].v[e]);
          const A g = has_w ? nb_to_acc(wv[k].v[e]) * d : d;
          out.v[e] = nb_from_acc<T>(nb_dx<Norm, A>(g, xh, cur.rstd, a, b));
          accw[k][e] += d * xh;
          accb[k][e] += d;
        }
        nb_store_vec<T, VEC>(dx + cur.off_dx, col[k], p.col_stride[NB_DX], out);
      }
    }
    cur = nxt;
  }

  // dweight / dbias: the groups' partials summed in group order, then written final
  // (nparts == 1) or as row blockIdx.x of the partial buffers.
  const long long np = p.nparts;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      A sw = accw[k][e], sb = accb[k][e];
      if (ngrp > 1) {  // block-uniform
        __syncthreads();
        fin[0][tid] = sw;
        fin[1][tid] = sb;
        __syncthreads();
        if (grp == 0) {
          for (int g2 = 1; g2 < ngrp; ++g2) {
            sw += fin[0][(g2 << glog) + lane];
            sb += fin[1][(g2 << glog) + lane];
          }
        }
      }
      const long long c = col[k] + e;
      if (grp == 0 && cok[k]) {
        if (np == 1) {
          if (has_w) dw[c * p.out_stride[0]] = nb_from_acc<T>(sw);
          if (has_b) db[c * p.out_stride[1]] = nb_from_acc<T>(sb);
        } else {
          if (has_w) part[(long long)blockIdx.x * n + c] = sw;
          if (has_b) part[(np + blockIdx.x) * n + c] = sb;
        }
      }
    }
  }
}

// ============================================================================ best: large N, chunked

template <typename A>
__device__ __forceinline__ void nb_block_sum2(A& s1, A& s2, A (*red)[2]) {
  // Sum of (s1, s2) over the block, the same bits in every thread; red holds NB_CHUNK_BLOCK/32 pairs.
  s1 = nb_warp_sum(s1);
  s2 = nb_warp_sum(s2);
  const int tid = threadIdx.x;
  if ((tid & 31) == 0) {
    red[tid >> 5][0] = s1;
    red[tid >> 5][1] = s2;
  }
  __syncthreads();
  s1 = s2 = A(0);
#pragma unroll
  for (int j = 0; j < NB_CHUNK_BLOCK / 32; ++j) {
    s1 += red[j][0];
    s2 += red[j][1];
  }
  __syncthreads();  // red may be rewritten by the next call
}

template <class Norm, typename T, int VEC, int VPT>
__global__ void __launch_bounds__(NB_CHUNK_BLOCK)
nb_chunked(const __grid_constant__ NBParams p, const T* __restrict__ x, const T* __restrict__ dy,
           const T* __restrict__ w, const nb_acc_t<T>* __restrict__ mean, const nb_acc_t<T>* __restrict__ rstd,
           T* __restrict__ dx, nb_acc_t<T>* __restrict__ part) {
  typedef nb_acc_t<T> A;
  typedef NBVec<T, VEC> V;
  constexpr int CHUNK = NB_CHUNK_BLOCK * VPT * VEC;
  __shared__ A red[NB_CHUNK_BLOCK / 32][2];
  __shared__ A ta[NB_MAX_TILE_ROWS], tb[NB_MAX_TILE_ROWS], tm[NB_MAX_TILE_ROWS], tr[NB_MAX_TILE_ROWS];
  __shared__ long long toff[NB_MAX_TILE_ROWS][3];

  const int tid = threadIdx.x;
  const int n = (int)p.n;
  const long long np = p.nparts;
  const bool has_w = (p.flags & NB_HAS_W) != 0, has_b = (p.flags & NB_HAS_B) != 0;
  const long long csx = p.col_stride[NB_X], csd = p.col_stride[NB_DY], cso = p.col_stride[NB_DX];
  const long long csw = p.col_stride[NB_W];
  const A inv_n = A(1) / A(n);
  const long long r_lo = (long long)blockIdx.x * p.rows_per_block;
  const long long r_hi = nb_min(p.rows, r_lo + p.rows_per_block);

  for (long long t0 = r_lo; t0 < r_hi; t0 += p.tile_rows) {
    const int nt = (int)nb_min(p.tile_rows, r_hi - t0);
    // Pass 1: each row's sums over all its chunks.
    for (int i = 0; i < nt; ++i) {
      long long off[NB_NT];
      nb_row_offsets(p, t0 + i, off);
      const A r = rstd[off[NB_RSTD]];
      const A m = Norm::kMean ? mean[off[NB_MEAN]] : A(0);
      A s1 = A(0), s2 = A(0);
      for (int c0 = 0; c0 < n; c0 += CHUNK) {
        V xv[VPT], dv[VPT], wv[VPT];
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
          const int c = c0 + (k * NB_CHUNK_BLOCK + tid) * VEC;
          if (c < n) {
            xv[k] = nb_load_vec<T, VEC>(x + off[NB_X], c, csx);
            dv[k] = nb_load_vec<T, VEC>(dy + off[NB_DY], c, csd);
            if (has_w) wv[k] = nb_load_vec<T, VEC>(w, c, csw);
          }
        }
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
          const int c = c0 + (k * NB_CHUNK_BLOCK + tid) * VEC;
          if (c >= n) continue;
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const A xh = nb_xhat<Norm, A>(nb_to_acc(xv[k].v[e]), m, r);
            const A d = nb_to_acc(dv[k].v[e]);
            const A g = has_w ? nb_to_acc(wv[k].v[e]) * d : d;
            s1 += g;
            s2 += g * xh;
          }
        }
      }
      nb_block_sum2(s1, s2, red);
      if (tid == 0) {
        ta[i] = s1 * inv_n;
        tb[i] = s2 * inv_n;
        tm[i] = m;
        tr[i] = r;
        toff[i][0] = off[NB_X];
        toff[i][1] = off[NB_DY];
        toff[i][2] = off[NB_DX];
      }
    }
    __syncthreads();
    // Pass 2: chunk by chunk, the tile's dx, and its dweight / dbias sums added to part row b.
    const bool first = t0 == r_lo;
    for (int c0 = 0; c0 < n; c0 += CHUNK) {
      A accw[VPT][VEC], accb[VPT][VEC];
      V wv[VPT];
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int c = c0 + (k * NB_CHUNK_BLOCK + tid) * VEC;
        if (has_w && c < n) wv[k] = nb_load_vec<T, VEC>(w, c, csw);
#pragma unroll
        for (int e = 0; e < VEC; ++e) accw[k][e] = accb[k][e] = A(0);
      }
      for (int i = 0; i < nt; ++i) {
        const A a = ta[i], b = tb[i], m = tm[i], r = tr[i];
        V xv[VPT], dv[VPT];
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
          const int c = c0 + (k * NB_CHUNK_BLOCK + tid) * VEC;
          if (c < n) {
            xv[k] = nb_load_vec<T, VEC>(x + toff[i][0], c, csx);
            dv[k] = nb_load_vec<T, VEC>(dy + toff[i][1], c, csd);
          }
        }
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
          const int c = c0 + (k * NB_CHUNK_BLOCK + tid) * VEC;
          if (c >= n) continue;
          V out;
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const A xh = nb_xhat<Norm, A>(nb_to_acc(xv[k].v[e]), m, r);
            const A d = nb_to_acc(dv[k].v[e]);
            const A g = has_w ? nb_to_acc(wv[k].v[e]) * d : d;
            out.v[e] = nb_from_acc<T>(nb_dx<Norm, A>(g, xh, r, a, b));
            accw[k][e] += d * xh;
            accb[k][e] += d;
          }
          nb_store_vec<T, VEC>(dx + toff[i][2], c, cso, out);
        }
      }
      // Each column of part row b belongs to one thread: a plain read-add-write, in tile order.
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const int c = c0 + (k * NB_CHUNK_BLOCK + tid) * VEC + e;
          if (c >= n) continue;
          if (has_w) {
            A* q = part + (long long)blockIdx.x * n + c;
            *q = first ? accw[k][e] : *q + accw[k][e];
          }
          if (has_b) {
            A* q = part + (np + blockIdx.x) * n + c;
            *q = first ? accb[k][e] : *q + accb[k][e];
          }
        }
      }
    }
    __syncthreads();  // the tile's statistics in shared memory are rewritten by the next tile
  }
}

// ============================================================================ stage 2

// The column sums of one 32-column tile of partial rows: out[j * stride] = T(sum over rows r <
// nparts of src[r * n + j]) for j in [j0, min(n, j0 + 32)), the rows summed in the same fixed
// order wherever and by whichever block it runs.  Block-uniform: all NB_COLSUM_BLOCK threads call
// it; `red` is shared memory of SLICES x 32 A.  Reads through L2 (__ldcg): the partial rows were
// just written by other blocks.
template <typename T>
__device__ __forceinline__ void nb_colsum_tile(const nb_acc_t<T>* __restrict__ src, long long nparts, long long n,
                                               long long j0, T* __restrict__ out, long long stride,
                                               nb_acc_t<T> (*red)[32]) {
  typedef nb_acc_t<T> A;
  constexpr int SLICES = NB_COLSUM_BLOCK / 32;
  constexpr int BATCH = 8;  // loads in flight per thread before their adds
  const int lane = threadIdx.x & 31, slice = threadIdx.x >> 5;
  const long long j = j0 + lane;
  // Thread (slice, lane) sums rows slice, slice + SLICES, ... of column j in increasing order,
  // then slice 0 adds the slices' sums in slice order: a fixed order for every launch.
  A s = A(0);
  if (j < n) {
    for (long long r0 = slice; r0 < nparts; r0 += (long long)SLICES * BATCH) {
      A v[BATCH];
#pragma unroll
      for (int b = 0; b < BATCH; ++b) {
        const long long r = r0 + (long long)b * SLICES;
        v[b] = r < nparts ? __ldcg(src + r * n + j) : A(0);
      }
#pragma unroll
      for (int b = 0; b < BATCH; ++b) s += v[b];
    }
  }
  red[slice][lane] = s;
  __syncthreads();
  if (slice == 0 && j < n) {
    A t = red[0][lane];
#pragma unroll
    for (int i = 1; i < SLICES; ++i) t += red[i][lane];
    out[j * stride] = nb_from_acc<T>(t);
  }
  __syncthreads();  // red is rewritten by the next tile
}

template <typename T>
__global__ void __launch_bounds__(NB_COLSUM_BLOCK)
nb_colsum(const nb_acc_t<T>* __restrict__ part, long long row0, long long nparts, long long n,
          T* __restrict__ out0, long long stride0, T* __restrict__ out1, long long stride1) {
  __shared__ nb_acc_t<T> red[NB_COLSUM_BLOCK / 32][32];
  const nb_acc_t<T>* src = part + (row0 + (long long)blockIdx.y * nparts) * n;
  if (blockIdx.y == 0)
    nb_colsum_tile<T>(src, nparts, n, (long long)blockIdx.x * 32, out0, stride0, red);
  else
    nb_colsum_tile<T>(src, nparts, n, (long long)blockIdx.x * 32, out1, stride1, red);
}

// ============================================================================ best (candidate): rows2
//
// Why: nb_rows' 16-bit N = 4096 instantiation takes 127 registers (one 512-thread block per SM)
// and has one row step of loads in flight when it starts a row.  nb_rows2 holds few elements per
// thread (one 16-byte vector of x and of dy per row in the vector layouts) so that the launch
// bounds cap it at NB_ROWS2_REGS registers: 1024 threads resident per SM, and each thread keeps
// the loads of the next PF rows it will work on in flight in registers (a ring of PF + 1 row
// sets, indexed at compile time: no register copies wait on loads still in flight).
//
//   nb_rows2<Norm,T,VEC,VPT,BLOCK,PF>(p, x, dy, w, mean, rstd, dx, part, dw, db)   [rows2]
//       nb_rows' contract (work split, gw groups, partial rows, VEC > 1 requirements, dw / db
//       final when nparts == 1, else row b of part) with blockDim = BLOCK (256, 512 or 1024, a
//       multiple of gw) and PF (1 or 2) rows prefetched per thread.  gw > 32: row sums through
//       shared memory, one barrier per step; else shuffles.
#define NB_ROWS2_REGS 64  // registers per thread the launch bounds allow (65536 per SM / 1024 threads)

template <typename T, int VEC, int VPT>
struct NBRows2Regs {  // one row as one thread holds it: its x and dy vectors and the statistics
  NBVec<T, VEC> x[VPT], d[VPT];
  nb_acc_t<T> mean, rstd;
};

// VEC accumulators to part[q .. q + VEC): 16-byte stores where they line up (q is a multiple of
// VEC, and part rows hold n % VEC == 0 elements when VEC > 1), else one at a time.
template <typename A, int VEC>
__device__ __forceinline__ void nb_store_acc(A* q, const A* v) {
  constexpr int PER = 16 / (int)sizeof(A);
  if (VEC % PER == 0) {
#pragma unroll
    for (int i = 0; i < VEC; i += PER) {
      NBVec<A, PER> t;
#pragma unroll
      for (int e = 0; e < PER; ++e) t.v[e] = v[i + e];
      *reinterpret_cast<NBVec<A, PER>*>(q + i) = t;
    }
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) q[e] = v[e];
  }
}

// An opaque copy of a vector's registers: what is computed from it after this point is computed
// again, not kept from before (the row's converted elements would hold twice the registers of its
// packed 16-bit vectors across the row sums' shuffles and barrier; the weight's would stay live
// across the whole loop).  The CPU stand-in has nothing to hide.
template <typename T, int VEC>
__device__ __forceinline__ void nb_launder(NBVec<T, VEC>& v) {
#ifndef CUHOST_RUNTIME
  if (sizeof(v) % 4 == 0) {
    unsigned int* u = reinterpret_cast<unsigned int*>(&v);
#pragma unroll
    for (int i = 0; i < (int)(sizeof(v) / 4); ++i) asm volatile("" : "+r"(u[i]));
  }
#endif
}

template <class Norm, typename T, int VEC, int VPT, int BLOCK, int PF>
__global__ void __launch_bounds__(BLOCK, (65536 / NB_ROWS2_REGS) / BLOCK)
nb_rows2(const __grid_constant__ NBParams p, const T* __restrict__ x, const T* __restrict__ dy,
         const T* __restrict__ w, const nb_acc_t<T>* __restrict__ mean, const nb_acc_t<T>* __restrict__ rstd,
         T* __restrict__ dx, nb_acc_t<T>* __restrict__ part, T* __restrict__ dw, T* __restrict__ db) {
  typedef nb_acc_t<T> A;
  typedef NBVec<T, VEC> V;
  typedef NBRows2Regs<T, VEC, VPT> R;
  static_assert(BLOCK % 32 == 0 && BLOCK <= 1024 && (PF == 1 || PF == 2), "nb_rows2: bad block or prefetch");
  __shared__ A red[2][BLOCK / 32][2];  // gw > 32: per-warp row sums, double-buffered by step
  __shared__ A fin[2][BLOCK];          // the groups' dweight / dbias partials, one element at a time

  const int tid = threadIdx.x;
  const int gw = (int)p.gw, glog = (int)p.gw_log2;
  const int lane = tid & (gw - 1), grp = tid >> glog, ngrp = BLOCK >> glog;
  const int n = (int)p.n;
  const bool has_w = (p.flags & NB_HAS_W) != 0, has_b = Norm::kBias && (p.flags & NB_HAS_B) != 0;
  const A inv_n = A(1) / A(n);

  bool cok[VPT];
  int col[VPT];
  V wv[VPT];
  A accw[VPT][VEC], accb[VPT][VEC];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    col[k] = (k * gw + lane) * VEC;
    cok[k] = col[k] < n;
    if (has_w && cok[k]) wv[k] = nb_load_vec<T, VEC>(w, col[k], p.col_stride[NB_W]);
#pragma unroll
    for (int e = 0; e < VEC; ++e) accw[k][e] = accb[k][e] = A(0);
  }

  const long long r_lo = (long long)blockIdx.x * p.rows_per_block;
  const long long r_hi = nb_min(p.rows, r_lo + p.rows_per_block);
  const int nsteps = r_hi > r_lo ? (int)((r_hi - r_lo + ngrp - 1) / ngrp) : 0;  // block-uniform

  // Issue the loads of step i's row (none past the block's rows).
  auto fetch = [&](int i, R& r) {
    const long long row = r_lo + (long long)i * ngrp + grp;
    if (row >= r_hi) return;
    long long off[NB_NT];
    nb_row_offsets(p, row, off);
    r.rstd = rstd[off[NB_RSTD]];
    r.mean = Norm::kMean ? mean[off[NB_MEAN]] : A(0);
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      if (cok[k]) {
        r.x[k] = nb_load_vec<T, VEC>(x + off[NB_X], col[k], p.col_stride[NB_X]);
        r.d[k] = nb_load_vec<T, VEC>(dy + off[NB_DY], col[k], p.col_stride[NB_DY]);
      }
    }
  };

  // Step i on its row's registers: row sums, dx, the dweight / dbias terms.  Every thread of the
  // block calls it (the barrier), rows past the block's end do nothing else.
  int buf = 0;
  auto step = [&](int i, R& c) {
    const long long row = r_lo + (long long)i * ngrp + grp;
    const bool rok = row < r_hi;
    A s1 = A(0), s2 = A(0);
    if (rok) {
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        if (!cok[k]) continue;
        nb_launder(wv[k]);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const A xh = nb_xhat<Norm, A>(nb_to_acc(c.x[k].v[e]), c.mean, c.rstd);
          const A d = nb_to_acc(c.d[k].v[e]);
          const A g = has_w ? nb_to_acc(wv[k].v[e]) * d : d;
          s1 += g;
          s2 += g * xh;
        }
      }
    }
    if (gw > 32) {  // block-uniform
      s1 = nb_warp_sum(s1);
      s2 = nb_warp_sum(s2);
      if ((tid & 31) == 0) {
        red[buf][tid >> 5][0] = s1;
        red[buf][tid >> 5][1] = s2;
      }
      // One barrier per step: a buffer is rewritten two steps later, after every thread has
      // passed the next step's barrier, so after it has read this one.
      __syncthreads();
      const int w0 = (grp << glog) >> 5, nw = gw >> 5;
      s1 = s2 = A(0);
      for (int j = 0; j < nw; ++j) {  // the same order in every thread of the group
        s1 += red[buf][w0 + j][0];
        s2 += red[buf][w0 + j][1];
      }
      buf ^= 1;
    } else {
      s1 = nb_group_sum(s1, gw);
      s2 = nb_group_sum(s2, gw);
    }
    const A a = s1 * inv_n, b = s2 * inv_n;
    if (rok) {
      long long off[NB_NT];
      nb_row_offsets(p, row, off);
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        if (!cok[k]) continue;
        nb_launder(c.x[k]);
        nb_launder(c.d[k]);
        nb_launder(wv[k]);
        V out;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const A xh = nb_xhat<Norm, A>(nb_to_acc(c.x[k].v[e]), c.mean, c.rstd);
          const A d = nb_to_acc(c.d[k].v[e]);
          const A g = has_w ? nb_to_acc(wv[k].v[e]) * d : d;
          out.v[e] = nb_from_acc<T>(nb_dx<Norm, A>(g, xh, c.rstd, a, b));
          accw[k][e] += d * xh;
          accb[k][e] += d;
        }
        nb_store_vec<T, VEC>(dx + off[NB_DX], col[k], p.col_stride[NB_DX], out);
      }
    }
  };

  // The ring: step i works on q[i % (PF + 1)], whose loads were issued PF steps earlier; the
  // inner loop is unrolled so that every index is a compile-time constant.
  R q[PF + 1];
#pragma unroll
  for (int j = 0; j < PF; ++j) fetch(j, q[j]);
  for (int i0 = 0; i0 < nsteps; i0 += PF + 1) {
#pragma unroll
    for (int j = 0; j <= PF; ++j) {
      const int i = i0 + j;
      if (i < nsteps) {  // block-uniform
        fetch(i + PF, q[(j + PF) % (PF + 1)]);
        step(i, q[j]);
      }
    }
  }

  // dweight / dbias: the groups' partials summed in group order, then written final
  // (nparts == 1) or as row blockIdx.x of the partial rows.
  const long long np = p.nparts;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    if (ngrp > 1) {  // block-uniform
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        __syncthreads();
        fin[0][tid] = accw[k][e];
        fin[1][tid] = accb[k][e];
        __syncthreads();
        if (grp == 0) {
          for (int g2 = 1; g2 < ngrp; ++g2) {
            accw[k][e] += fin[0][(g2 << glog) + lane];
            accb[k][e] += fin[1][(g2 << glog) + lane];
          }
        }
      }
    }
    if (grp == 0 && cok[k]) {
      const long long c = col[k];
      if (np == 1) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          if (has_w) dw[(c + e) * p.out_stride[0]] = nb_from_acc<T>(accw[k][e]);
          if (has_b) db[(c + e) * p.out_stride[1]] = nb_from_acc<T>(accb[k][e]);
        }
      } else {
        if (has_w) nb_store_acc<A, VEC>(part + (long long)blockIdx.x * n + c, accw[k]);
        if (has_b) nb_store_acc<A, VEC>(part + (np + blockIdx.x) * n + c, accb[k]);
      }
    }
  }
}

// ============================================================================ rows3 (cupy@v7)
#include "norm_rows3.cuh"
