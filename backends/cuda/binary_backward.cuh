// binary_backward: CUDA device code, the one copy shared by the cupy backend (NVRTC, through
// cupy.RawModule) and the torch extension (nvcc, backends/torch_ext/binary_backward_cuda.cu).
// Spec: oracle/binary_backward.py.  Host planning, once, in Python: backends/_plans/
// binary_backward.py (the broadcast box) and binary_backward_cuda.py (this code's launch plan).
// The fns, their partials and the parameter structs are in binary_backward_defs.h, which the
// CPU kernel includes too.
//
// Self-contained for NVRTC: only cuda_fp16.h / cuda_bf16.h are included (pass their folder
// with -I) besides binary_backward_defs.h (cupy's nvrtc.read_source inlines it), and only
// `long long` / `unsigned int` integer types are used.
//
// ============================================================================ launch contract
//
// Template parameters:  T  = float | double | __half | __nv_bfloat16 (element type of every
// input and final output);  FN = 0 add, 1 sub, 2 mul, 3 div, 4 pow, 5 maximum, 6 minimum
// (BB_FNS in binary_backward_defs.h);  A = bb_acc_t<T> = double for double, float otherwise:
// partials and every sum are computed in A, partial buffers hold A.
//
// Every kernel with a BBParams argument must be launched with blockDim = (BB_BLOCK, 1, 1) and
// any 1-D grid (they grid-stride over tiles); the others accept any 1-D launch.  All index
// math is 64-bit.  Outputs must not alias inputs.
//
// BBParams (by value, __grid_constant__): three dim groups, each outer -> inner, with
// strides in ELEMENTS for five tensor SLOTS (0 operand P, 1 operand Q, 2 grad_out, 3 output
// of P = dP, 4 output of Q = dQ).  Outputs have stride 0 along the dims they sum over.  The
// struct holds only `long long`, so the host packs it as a flat int64 array in field order
// (BB_PARAMS_WORDS words).  `swap` = 0: P is a, Q is b; swap = 1: P is b, Q is a (the kernel
// then evaluates the partials at (a, b) = (Q, P)).  Pointers are passed in the same roles.
//
//   bb_fast<T,FN>(a, b, g, ga, gb, n, vectorized)
//       No broadcast, all five tensors dense with the same strides: flat index i.
//       vectorized != 0 only if all five pointers are 16-byte aligned (16-byte packs, then
//       a scalar tail).
//   bb_ew<T,FN>(p, a, b, g, ga, gb)                                 [no broadcast, strided]
//       grp[0] = K (ndim >= 1); its LAST dim is the column dim, the rest are rows.  swap = 0.
//       ga and gb are written at the ga offsets (with no broadcast both are O's contiguous
//       strides, so slot 4 is not read).
//       lanes = TC (tile columns, power of two in [32, 1024]), lanes_log2 = log2(TC); a tile is
//       TC columns x (BB_EW_TILE / TC) rows.  nchunk[0] = column tiles, nchunk[1] = row tiles,
//       ntiles = nchunk[0] * nchunk[1].
//   bb_lk<T,FN,J>(p, P, Q, g, dP, dP_part, dQ, dQ_part)            [lanes along K]
//       grp[0] = K (lanes), grp[1] = U (J per tile, in registers), grp[2] = V (rows, looped).
//       P is the operand broadcast along V: dP sums over V, dQ sums over U.
//       J = 1 requires numel(U) = 1 (then dQ is always written final; dQ_part is unused).
//       lanes = KW (power of two <= 32), lanes_log2.
//       chunk / nchunk = {KW, k tiles}, {CU <= J, U chunks}, {CV, V chunks}; ntiles = product.
//   bb_lr_stream<T,FN>(p, P, Q, g, dP, dP_part, dQ)                 [lanes along X, Y empty]
//       grp[0] = X (lanes, looped), grp[1] = Y (numel 1), grp[2] = Z = K (one row per task).
//       P is the operand broadcast along X: dP sums over X (across lanes), dQ is elementwise.
//       lanes = XW (power of two <= 32), lanes_log2.  chunk[0] = CX, nchunk[0] = X chunks,
//       ntiles = nchunk[0] * numel(Z) tasks; each task belongs to one XW-lane segment.
//   bb_lr_batched<T,FN>(p, P, Q, g, dP, dP_part, dQ, dQ_part)       [lanes along X, Y looped]
//       grp[0] = X (lanes, BB_J per lane per tile), grp[1] = Y (rows, looped), grp[2] = Z = K.
//       P is the operand broadcast along X: dP sums over X, dQ sums over Y.
//       lanes = XW, lanes_log2; chunk[0] = XW * BB_J; chunk[1] = CY; nchunk = {X chunks,
//       Y chunks, numel(Z)}; ntiles = product.
//   bb_naive<T,FN>(p, a, b, g, acc_a, acc_b)                        [the @naive reference]
//       grp = {K, RA, RB} exactly as the broadcast plan makes them, swap = 0.  acc_a / acc_b (A,
//       numel of grad_a / grad_b) must be zeroed; then bb_finalize with nchunks = 1.
//   bb_opt2<T,FN>(c, a, b, g, ga, gb, acc_a, acc_b)                [the @opt2 rung]
//       BBCollapsed c (binary_backward_defs.h); any 1-D launch.  acc_a / acc_b (A, numel of
//       grad_a / grad_b) must be zeroed where c.direct is 0, then bb_finalize with nchunks = 1.
//   bb_cols<T,FN,V>(p, P, Q, g, dP, dP_part, dQ)                    [@best: lanes along K, J = 1]
//   bb_rows<T,FN,V>(p, P, Q, g, dP, dP_part, dQ)                    [@best: row sums, Y empty]
//   bb_batch<T,FN,V>(p, P, Q, g, dP, dP_part, dQ, dQ_part)          [@best: lanes along X; both reduce, any Y]
//   bb_both<T,FN,V>(p, P, Q, g, dP, dP_part, dQ)                    [@best: both reduce, one-dim Y <= BB_YT rows]
//       bb_batch: chunk[2] = 0 (Y looped per lane).  bb_both: a task per (z, X chunk) owned by a
//       segment of `lanes` threads (a power of two up to BB_BLOCK: a whole block reduces dP with
//       warp shuffles and one shared-memory step per task), built for BB_BOTH_MIN_BLOCKS (4).
//       V = 1 or 16 / sizeof(T) (16-byte packs).  bb_both keeps BBBothRows<T> rows of g in flight per thread (4 in 4-byte T, else 1;
//       BB_YG overrides): on the H100 (perf case mul A = 1x2048x4096, B = 8x2048x1, cold L2) one
//       row in flight was latency bound (bf16: 72% of copy, DRAM 63% of peak, long scoreboard 58%
//       of stalls; f32 84%), f32 with 4 rows reached 91-92%, and 16-bit T was slower with more
//       rows: 16-byte packs spilled at 64 registers (2 / 4 rows: bf16 58% / 43%), and 8-byte packs
//       with 4 rows (the registers of an f32 row) gave 64-66% (results/h100/s7/).
//       See each kernel for its fields.  The @best
//       rung launches these, bb_fast for dense no-broadcast cases, and the opt kernels for the
//       rest (bb_ew, bb_lk<J = 8>), each with a grid of at most one wave of resident blocks.
//   bb_finalize<T>(part, nchunks, n, out):  out[i] = T(sum over c = 0..nchunks-1, in that
//       order, of part[c * n + i]).
//
// Final vs partial outputs: an output whose reduced group has nchunk == 1 is written in T to
// dP / dQ; otherwise the kernel writes A partials to dX_part[chunk * numel_out[slot] + i]
// (slot 0 = dP, 1 = dQ) and the host runs bb_finalize over the chunks.  Every element of
// both outputs (or partial rows) is written exactly once, and every sum is taken in a fixed
// order, so results are bitwise reproducible for a given launch configuration.
//
// Kernel choice (the host's: backends/_plans/binary_backward_cuda.py:plan_launch).  No broadcast: bb_fast
// when dense, else bb_ew.  Otherwise lanes go along the group that holds grad_out's smallest
// stride (within each group the host orders dims so that one is innermost):
//   K                        -> bb_lk: J = 1 when a reduced group is empty (bias-like
//                               (8,2048,4096)+(4096,), (8,2048,4096)+(8,1,4096)), else J = 8 with
//                               U = the smaller reduced group ((3,1,5)+(1,4,5));
//   a reduced group, other empty -> bb_lr_stream (row sums (8,2048,4096)+(8,2048,1), scalars);
//   a reduced group, both reduce -> bb_lr_batched.
// Chunk counts along the looped group are chosen so that the tiles fill about two waves of
// the GPU, at most 1024 chunks.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "binary_backward_defs.h"  // fns, partials, BBGroup / BBParams (shared with host C++)

#define BB_BLOCK 256   // threads per block of every BBParams kernel
#define BB_J 8         // register tile of the batched kernels
#define BB_EW_TILE 1024  // elements per bb_ew tile (4 per thread)

// ============================================================================ element types

template <typename T> struct BBAcc { typedef float type; };
template <> struct BBAcc<double> { typedef double type; };
template <typename T> using bb_acc_t = typename BBAcc<T>::type;

__device__ __forceinline__ float bb_to_acc(float x) { return x; }
__device__ __forceinline__ double bb_to_acc(double x) { return x; }
__device__ __forceinline__ float bb_to_acc(__half x) { return __half2float(x); }
__device__ __forceinline__ float bb_to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T bb_from_acc(bb_acc_t<T> x);
template <> __device__ __forceinline__ float bb_from_acc<float>(float x) { return x; }
template <> __device__ __forceinline__ double bb_from_acc<double>(double x) { return x; }
template <> __device__ __forceinline__ __half bb_from_acc<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 bb_from_acc<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <typename T> __device__ __forceinline__ bb_acc_t<T> bb_load(const T* p) { return bb_to_acc(*p); }

// 16 bytes of T: one 128-bit load or store when the address is 16-byte aligned.
template <typename T> struct alignas(16) BBPack { T v[16 / sizeof(T)]; };

__device__ __forceinline__ long long bb_min(long long x, long long y) { return x < y ? x : y; }

// ============================================================================ terms

// The two terms g * dP and g * dQ, for operands in role order (see `swap` in the contract).
template <int FN, typename A>
__device__ __forceinline__ void bb_terms(A p, A q, A g, bool swap, A& tp, A& tq) {
  A da, db;
  bb_partials<FN, A>(swap ? q : p, swap ? p : q, da, db);
  const A ta = g * da, tb = g * db;
  tp = swap ? tb : ta;
  tq = swap ? ta : tb;
}

// ============================================================================ index math

// Adds the offsets of element `idx` of the first `nd` dims of `gr` (row-major, last dim
// fastest) to off[0..BB_NT).  One dim (the usual case after merging) needs no division;
// groups that fit in 32 bits use 32-bit division (several times cheaper than 64-bit); the
// outermost dim never needs one.
__device__ __forceinline__ void bb_unravel(const BBGroup& gr, int nd, long long idx, long long* off) {
  if (nd == 1) {
#pragma unroll
    for (int t = 0; t < BB_NT; ++t) off[t] += idx * gr.stride[t][0];
  } else if (gr.numel <= 0xffffffffLL) {
    unsigned int i = (unsigned int)idx;
#pragma unroll
    for (int d = BB_MAX_DIMS - 1; d >= 0; --d) {
      if (d < nd) {
        unsigned int r = i;
        if (d > 0) {
          const unsigned int n = (unsigned int)gr.size[d];
          const unsigned int q = i / n;
          r = i - q * n;
          i = q;
        }
#pragma unroll
        for (int t = 0; t < BB_NT; ++t) off[t] += (long long)r * gr.stride[t][d];
      }
    }
  } else {  // rare (over 2**32 elements in one group): kept rolled to keep the code small
    long long i = idx;
#pragma unroll 1
    for (int d = nd - 1; d >= 0; --d) {
      const long long q = d > 0 ? i / gr.size[d] : 0;
      const long long r = i - q * gr.size[d];
      i = q;
#pragma unroll
      for (int t = 0; t < BB_NT; ++t) off[t] += r * gr.stride[t][d];
    }
  }
}

__device__ __forceinline__ void bb_offsets(const BBGroup& gr, long long idx, long long* off) {
#pragma unroll
  for (int t = 0; t < BB_NT; ++t) off[t] = 0;
  bb_unravel(gr, (int)gr.ndim, idx, off);
}

// bb_offsets for once-per-tile set-up: a rolled 64-bit loop, which keeps the code small.
__device__ __forceinline__ void bb_offsets_setup(const BBGroup& gr, long long idx, long long* off) {
#pragma unroll
  for (int t = 0; t < BB_NT; ++t) off[t] = 0;
#pragma unroll 1
  for (int d = (int)gr.ndim - 1; d >= 0; --d) {
    const long long q = d > 0 ? idx / gr.size[d] : 0;
    const long long r = idx - q * gr.size[d];
    idx = q;
#pragma unroll
    for (int t = 0; t < BB_NT; ++t) off[t] += r * gr.stride[t][d];
  }
}

// Offsets of a group's elements i0, i0 + step, i0 + 2 step, ... (the rows a thread walks).
// A one-dim group (the usual case after merging) adds a precomputed step * stride instead of
// multiplying or unravelling per element; more dims unravel each element.
struct BBCursor {
  bool one_dim;
  long long base[BB_NT];  // one dim: offsets of the current base element
  long long inc[BB_NT];   // one dim: offsets of `step` elements

  __device__ __forceinline__ BBCursor(const BBGroup& gr, long long i0, long long step) : one_dim(gr.ndim == 1) {
#pragma unroll
    for (int t = 0; t < BB_NT; ++t) {
      base[t] = one_dim ? i0 * gr.stride[t][0] : 0;
      inc[t] = one_dim ? step * gr.stride[t][0] : 0;
    }
  }
  // Offsets of element `idx` = (current base) + r * step.
  __device__ __forceinline__ void at(const BBGroup& gr, long long idx, int r, long long* off) const {
    if (one_dim) {
#pragma unroll
      for (int t = 0; t < BB_NT; ++t) off[t] = base[t] + r * inc[t];
    } else {
      bb_offsets(gr, idx, off);
    }
  }
  // Moves the base on by n steps.
  __device__ __forceinline__ void advance(int n) {
#pragma unroll
    for (int t = 0; t < BB_NT; ++t) base[t] += n * inc[t];
  }
};

// Stores v as the final output (T) when its reduction is done in one chunk, else as partial
// row `chunk` of an A buffer.
template <typename T>
__device__ __forceinline__ void bb_store(T* out, bb_acc_t<T>* part, long long nchunk, long long chunk,
                                         long long numel_out, long long off, bb_acc_t<T> v) {
  if (nchunk == 1)
    out[off] = bb_from_acc<T>(v);
  else
    part[chunk * numel_out + off] = v;
}

// Sum over the `nw` row slots of a block, for each of J values per thread.  red[j][w][lane] is
// at red[j * BB_BLOCK + w * lanes + lane] (tid = w * lanes + lane).  Fixed-order tree; on return
// slot 0 holds the sums.  Starts and ends with a barrier, so every thread must call it.
template <typename A, int J>
__device__ __forceinline__ void bb_block_reduce_slots(A* red, const A (&v)[J], int tid, int w, int nw, int lanes) {
#pragma unroll
  for (int j = 0; j < J; ++j) red[j * BB_BLOCK + tid] = v[j];
  __syncthreads();
  for (int s = nw >> 1; s > 0; s >>= 1) {
    if (w < s) {
#pragma unroll
      for (int j = 0; j < J; ++j) red[j * BB_BLOCK + tid] += red[j * BB_BLOCK + tid + s * lanes];
    }
    __syncthreads();
  }
}

// Sum over the `width` lanes (a power of two <= 32) of each aligned lane segment; lane 0 of
// the segment gets the fixed-order butterfly result.  All 32 lanes of the warp must call it.
template <typename A>
__device__ __forceinline__ A bb_segment_sum(A v, int width) {
  for (int s = width >> 1; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
  return v;
}

// ============================================================================ fast path

template <typename T, int FN>
__global__ void __launch_bounds__(BB_BLOCK)
bb_fast(const T* __restrict__ a, const T* __restrict__ b, const T* __restrict__ g, T* __restrict__ ga,
        T* __restrict__ gb, long long n, int vectorized) {
  typedef bb_acc_t<T> A;
  constexpr int V = 16 / sizeof(T);
  constexpr bool kOps = BBUsesOperands<FN>::value;
  const long long step = (long long)gridDim.x * blockDim.x;
  const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  long long done = 0;
  if (vectorized) {
    const long long npack = n / V;
    for (long long i = tid; i < npack; i += step) {
      const BBPack<T> pg = reinterpret_cast<const BBPack<T>*>(g)[i];
      BBPack<T> pa, pb, oa, ob;
      if (kOps) {
        pa = reinterpret_cast<const BBPack<T>*>(a)[i];
        pb = reinterpret_cast<const BBPack<T>*>(b)[i];
      }
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const A va = kOps ? bb_to_acc(pa.v[e]) : A(0), vb = kOps ? bb_to_acc(pb.v[e]) : A(0);
        A ta, tb;
        bb_terms<FN, A>(va, vb, bb_to_acc(pg.v[e]), false, ta, tb);
        oa.v[e] = bb_from_acc<T>(ta);
        ob.v[e] = bb_from_acc<T>(tb);
      }
      reinterpret_cast<BBPack<T>*>(ga)[i] = oa;
      reinterpret_cast<BBPack<T>*>(gb)[i] = ob;
    }
    done = npack * V;
  }
  for (long long i = done + tid; i < n; i += step) {
    const A va = kOps ? bb_load(a + i) : A(0), vb = kOps ? bb_load(b + i) : A(0);
    A ta, tb;
    bb_terms<FN, A>(va, vb, bb_load(g + i), false, ta, tb);
    ga[i] = bb_from_acc<T>(ta);
    gb[i] = bb_from_acc<T>(tb);
  }
}

// ============================================================================ strided elementwise

// No broadcast, arbitrary strides.  A tile is TC columns (the group's last dim) x TR rows; a
// warp reads 32 consecutive columns of one row, and the block's 4 passes cover TR rows, so a
// tensor whose fast dim is a row dim (a transposed view) is still read from the L1 in full
// sectors.
template <typename T, int FN>
__global__ void __launch_bounds__(BB_BLOCK)
bb_ew(const __grid_constant__ BBParams p, const T* __restrict__ a, const T* __restrict__ b,
      const T* __restrict__ g, T* __restrict__ ga, T* __restrict__ gb) {
  typedef bb_acc_t<T> A;
  constexpr int E = BB_EW_TILE / BB_BLOCK;
  constexpr bool kOps = BBUsesOperands<FN>::value;
  const BBGroup& K = p.grp[0];
  const int nd_rows = (int)K.ndim - 1;
  const long long ncols = K.size[nd_rows];
  const long long nrows = K.numel / ncols;
  const int tc_log2 = (int)p.lanes_log2;
  const long long tc = p.lanes, tr = BB_EW_TILE / p.lanes;

  for (long long t = blockIdx.x; t < p.ntiles; t += gridDim.x) {
    const long long c0 = (t % p.nchunk[0]) * tc, r0 = (t / p.nchunk[0]) * tr;
    long long off[E][BB_NT];
    bool ok[E];
    A va[E], vb[E], vg[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {  // all loads first, for memory-level parallelism
      const int idx = (int)threadIdx.x + e * BB_BLOCK;
      const long long col = c0 + (idx & ((int)tc - 1)), row = r0 + (idx >> tc_log2);
      ok[e] = col < ncols && row < nrows;
      va[e] = vb[e] = vg[e] = A(0);
      if (ok[e]) {
#pragma unroll
        for (int s = 0; s < BB_NT; ++s) off[e][s] = col * K.stride[s][nd_rows];
        bb_unravel(K, nd_rows, row, off[e]);
        vg[e] = bb_load(g + off[e][BB_G]);
        if (kOps) {
          va[e] = bb_load(a + off[e][BB_P]);
          vb[e] = bb_load(b + off[e][BB_Q]);
        }
      }
    }
#pragma unroll
    for (int e = 0; e < E; ++e) {
      if (ok[e]) {
        A ta, tb;
        bb_terms<FN, A>(va[e], vb[e], vg[e], false, ta, tb);
        // With no broadcast, grad_a and grad_b are both O-shaped and contiguous: one offset.
        ga[off[e][BB_DP]] = bb_from_acc<T>(ta);
        gb[off[e][BB_DP]] = bb_from_acc<T>(tb);
      }
    }
  }
}

// ============================================================================ lanes along K

// Tile = KW k's (lanes) x up to J u's (registers) x a chunk of V rows (slots w, step nw).
// Per row, dQ[k, v] = sum_j g*dQ over the tile's u's is complete in-thread and is stored at
// once; dP[k, u_j] accumulates over the thread's rows in registers, then over the block's
// slots (bb_block_reduce_slots).  Bias-like cases use J = 1 (U empty): P is the bias, loaded
// once per tile, and the row loop is unrolled 4x for memory-level parallelism.
template <typename T, int FN, int J>
__global__ void __launch_bounds__(BB_BLOCK)
bb_lk(const __grid_constant__ BBParams p, const T* __restrict__ P, const T* __restrict__ Q,
      const T* __restrict__ g, T* __restrict__ dP, bb_acc_t<T>* __restrict__ dP_part, T* __restrict__ dQ,
      bb_acc_t<T>* __restrict__ dQ_part) {
  typedef bb_acc_t<T> A;
  constexpr int UR = J >= 4 ? 1 : 4 / J;  // rows in flight per thread
  constexpr bool kOps = BBUsesOperands<FN>::value;
  __shared__ A red[J * BB_BLOCK];
  const BBGroup& K = p.grp[0];
  const BBGroup& U = p.grp[1];
  const BBGroup& Vg = p.grp[2];
  const int tid = threadIdx.x, kw = (int)p.lanes;
  const int lane = tid & (kw - 1), w = tid >> (int)p.lanes_log2, nw = BB_BLOCK >> (int)p.lanes_log2;
  const bool swap = p.swap != 0;

  for (long long t = blockIdx.x; t < p.ntiles; t += gridDim.x) {
    const long long kt = t % p.nchunk[0], rest = t / p.nchunk[0];
    const long long cu = rest % p.nchunk[1], cv = rest / p.nchunk[1];
    const long long k = kt * kw + lane;
    const bool kok = k < K.numel;
    long long ko[BB_NT];
    bb_offsets_setup(K, kok ? k : 0, ko);

    // The tile's u's: P values (constant along V), g offsets and dP offsets.
    bool uok[J];
    A pv[J], accp[J];
    long long goff[J], dpoff[J];
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const long long u = cu * p.chunk[1] + j;
      uok[j] = kok && j < p.chunk[1] && u < U.numel;
      long long uo[BB_NT];
      bb_offsets_setup(U, uok[j] ? u : 0, uo);
      goff[j] = ko[BB_G] + uo[BB_G];
      dpoff[j] = ko[BB_DP] + uo[BB_DP];
      pv[j] = (kOps && uok[j]) ? bb_load(P + ko[BB_P] + uo[BB_P]) : A(0);
      accp[j] = A(0);
    }

    if (kok) {
      const long long v_lo = cv * p.chunk[2], v_hi = bb_min(Vg.numel, v_lo + p.chunk[2]);
      BBCursor rows(Vg, v_lo + w, nw);
      for (long long v0 = v_lo + w; v0 < v_hi; v0 += (long long)nw * UR, rows.advance(UR)) {
        bool vok[UR];
        A qv[UR], gv[UR][J];
        long long dqoff[UR];
#pragma unroll
        for (int r = 0; r < UR; ++r) {  // loads of UR rows first
          const long long v = v0 + (long long)r * nw;
          vok[r] = v < v_hi;
          long long vo[BB_NT];
          rows.at(Vg, vok[r] ? v : 0, r, vo);
          dqoff[r] = ko[BB_DQ] + vo[BB_DQ];
          qv[r] = (kOps && vok[r]) ? bb_load(Q + ko[BB_Q] + vo[BB_Q]) : A(0);
#pragma unroll
          for (int j = 0; j < J; ++j) gv[r][j] = (vok[r] && uok[j]) ? bb_load(g + goff[j] + vo[BB_G]) : A(0);
        }
#pragma unroll
        for (int r = 0; r < UR; ++r) {
          if (!vok[r]) continue;
          A sq = A(0);
#pragma unroll
          for (int j = 0; j < J; ++j) {
            if (!uok[j]) continue;
            A tp, tq;
            bb_terms<FN, A>(pv[j], qv[r], gv[r][j], swap, tp, tq);
            accp[j] += tp;
            sq += tq;
          }
          if (J == 1)  // U is empty: dQ needs no reduction at all
            dQ[dqoff[r]] = bb_from_acc<T>(sq);
          else
            bb_store<T>(dQ, dQ_part, p.nchunk[1], cu, p.numel_out[1], dqoff[r], sq);
        }
      }
    }

    bb_block_reduce_slots<A, J>(red, accp, tid, w, nw, kw);
    if (w == 0) {
#pragma unroll
      for (int j = 0; j < J; ++j)
        if (uok[j]) bb_store<T>(dP, dP_part, p.nchunk[2], cv, p.numel_out[0], dpoff[j], red[j * BB_BLOCK + tid]);
    }
    // No barrier needed before the next tile: each thread next writes only its own red
    // entries, and the only reader of slot-0 entries is their owner.
  }
}

// ============================================================================ lanes along X, Y empty

// Lanes in segments of p.lanes (a power of two up to 32, lanes_log2 its log), one task per
// segment, tasks dealt to whole warps at a time: the segment shuffles need all 32 lanes.
struct BBSegs {
  int xw, lg, lane, seg, nseg, warp_seg0;
  __device__ __forceinline__ explicit BBSegs(const BBParams& p)
      : xw((int)p.lanes), lg((int)p.lanes_log2), lane((int)threadIdx.x & (xw - 1)), seg((int)threadIdx.x >> lg),
        nseg(BB_BLOCK >> lg), warp_seg0(((int)threadIdx.x >> 5) * (32 >> lg)) {}
};

// Row reductions (B = (..., 1) against A = (..., N)): each task is one row z and one chunk of
// X, owned by an XW-lane segment.  Lanes stream along X (unrolled 4x), store dQ elementwise
// and accumulate g*dP; a segment shuffle gives dP[z].  No block barriers.
template <typename T, int FN>
__global__ void __launch_bounds__(BB_BLOCK)
bb_lr_stream(const __grid_constant__ BBParams p, const T* __restrict__ P, const T* __restrict__ Q,
             const T* __restrict__ g, T* __restrict__ dP, bb_acc_t<T>* __restrict__ dP_part,
             T* __restrict__ dQ) {
  typedef bb_acc_t<T> A;
  constexpr int UR = 4;
  constexpr bool kOps = BBUsesOperands<FN>::value;
  const BBGroup& X = p.grp[0];
  const BBGroup& Z = p.grp[2];
  const BBSegs sg(p);
  const int xw = sg.xw, lane = sg.lane, seg = sg.seg, nseg = sg.nseg, warp_seg0 = sg.warp_seg0;
  const bool swap = p.swap != 0;

  // Warp-uniform loop (the shuffle needs all 32 lanes): t0 is the task of the warp's first segment.
  for (long long t0 = (long long)blockIdx.x * nseg + warp_seg0; t0 < p.ntiles; t0 += (long long)gridDim.x * nseg) {
    const long long task = t0 + (seg - warp_seg0);
    const bool valid = task < p.ntiles;
    const long long cx = valid ? task % p.nchunk[0] : 0, z = valid ? task / p.nchunk[0] : 0;
    long long zo[BB_NT];
    bb_offsets_setup(Z, z, zo);
    A accp = A(0);
    if (valid) {
      const A pv = kOps ? bb_load(P + zo[BB_P]) : A(0);
      const long long x_lo = cx * p.chunk[0], x_hi = bb_min(X.numel, x_lo + p.chunk[0]);
      BBCursor xs(X, x_lo + lane, xw);
      for (long long x0 = x_lo + lane; x0 < x_hi; x0 += (long long)xw * UR, xs.advance(UR)) {
        bool ok[UR];
        A qv[UR], gv[UR];
        long long dqoff[UR];
#pragma unroll
        for (int r = 0; r < UR; ++r) {
          const long long x = x0 + (long long)r * xw;
          ok[r] = x < x_hi;
          long long xo[BB_NT];
          xs.at(X, ok[r] ? x : 0, r, xo);
          dqoff[r] = zo[BB_DQ] + xo[BB_DQ];
          gv[r] = ok[r] ? bb_load(g + zo[BB_G] + xo[BB_G]) : A(0);
          qv[r] = (kOps && ok[r]) ? bb_load(Q + zo[BB_Q] + xo[BB_Q]) : A(0);
        }
#pragma unroll
        for (int r = 0; r < UR; ++r) {
          if (!ok[r]) continue;
          A tp, tq;
          bb_terms<FN, A>(pv, qv[r], gv[r], swap, tp, tq);
          accp += tp;
          dQ[dqoff[r]] = bb_from_acc<T>(tq);
        }
      }
    }
    accp = bb_segment_sum(accp, xw);
    if (valid && lane == 0) bb_store<T>(dP, dP_part, p.nchunk[0], cx, p.numel_out[0], zo[BB_DP], accp);
  }
}

// ============================================================================ lanes along X, Y looped

// Both operands broadcast and grad_out's fast dim reduced by one of them.  Tile = one z x
// XW*BB_J x's (BB_J per lane, in registers) x a chunk of Y rows (slots w, step nw).  Per row,
// dP[z, y] = segment shuffle of the in-thread sum over the lane's x's; dQ[z, x_j]
// accumulates over rows in registers, then over slots (bb_block_reduce_slots).
template <typename T, int FN>
__global__ void __launch_bounds__(BB_BLOCK)
bb_lr_batched(const __grid_constant__ BBParams p, const T* __restrict__ P, const T* __restrict__ Q,
              const T* __restrict__ g, T* __restrict__ dP, bb_acc_t<T>* __restrict__ dP_part,
              T* __restrict__ dQ, bb_acc_t<T>* __restrict__ dQ_part) {
  typedef bb_acc_t<T> A;
  constexpr int J = BB_J;
  constexpr bool kOps = BBUsesOperands<FN>::value;
  __shared__ A red[J * BB_BLOCK];
  const BBGroup& X = p.grp[0];
  const BBGroup& Y = p.grp[1];
  const BBGroup& Z = p.grp[2];
  const int tid = threadIdx.x, xw = (int)p.lanes;
  const int lane = tid & (xw - 1), w = tid >> (int)p.lanes_log2, nw = BB_BLOCK >> (int)p.lanes_log2;
  const bool swap = p.swap != 0;

  for (long long t = blockIdx.x; t < p.ntiles; t += gridDim.x) {
    const long long cx = t % p.nchunk[0], rest = t / p.nchunk[0];
    const long long cy = rest % p.nchunk[1], z = rest / p.nchunk[1];
    long long zo[BB_NT];
    bb_offsets_setup(Z, z, zo);

    // The lane's x's: Q values (constant along Y), g offsets and dQ offsets.
    bool xok[J];
    A qv[J], accq[J];
    long long goff[J], dqoff[J];
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const long long x = cx * p.chunk[0] + (long long)j * xw + lane;
      xok[j] = x < X.numel;
      long long xo[BB_NT];
      bb_offsets_setup(X, xok[j] ? x : 0, xo);
      goff[j] = zo[BB_G] + xo[BB_G];
      dqoff[j] = zo[BB_DQ] + xo[BB_DQ];
      qv[j] = (kOps && xok[j]) ? bb_load(Q + zo[BB_Q] + xo[BB_Q]) : A(0);
      accq[j] = A(0);
    }

    const long long y_lo = cy * p.chunk[1], y_hi = bb_min(Y.numel, y_lo + p.chunk[1]);
    BBCursor rows(Y, y_lo + w, nw);
    for (long long y0 = y_lo; y0 < y_hi; y0 += nw, rows.advance(1)) {  // block-uniform trip count
      const long long y = y0 + w;
      const bool yok = y < y_hi;
      long long yo[BB_NT];
      rows.at(Y, yok ? y : 0, 0, yo);
      A sp = A(0);
      if (yok) {
        const A pv = kOps ? bb_load(P + zo[BB_P] + yo[BB_P]) : A(0);
        A gv[J];
#pragma unroll
        for (int j = 0; j < J; ++j) gv[j] = xok[j] ? bb_load(g + goff[j] + yo[BB_G]) : A(0);
#pragma unroll
        for (int j = 0; j < J; ++j) {
          if (!xok[j]) continue;
          A tp, tq;
          bb_terms<FN, A>(pv, qv[j], gv[j], swap, tp, tq);
          sp += tp;
          accq[j] += tq;
        }
      }
      sp = bb_segment_sum(sp, xw);
      if (yok && lane == 0) bb_store<T>(dP, dP_part, p.nchunk[0], cx, p.numel_out[0], zo[BB_DP] + yo[BB_DP], sp);
    }

    bb_block_reduce_slots<A, J>(red, accq, tid, w, nw, xw);
    if (w == 0) {
#pragma unroll
      for (int j = 0; j < J; ++j)
        if (xok[j]) bb_store<T>(dQ, dQ_part, p.nchunk[1], cy, p.numel_out[1], dqoff[j], red[j * BB_BLOCK + tid]);
    }
  }
}

// ============================================================================ @opt2

// The source's next rung after opt: still a thread per element of O (grid-stride) and atomics
// for a broadcast operand's gradient, but each tensor's offset costs one divide (and one
// remainder) per dim that is left after O's dims are collapsed for that tensor (BBCollapsed in
// binary_backward_defs.h).  A contiguous tensor that follows O is one dim: its offset is i.
__device__ __forceinline__ long long bb_collapsed_offset(const BBCollapsed& c, int t, long long i) {
  long long off = 0;
  const int nd = (int)c.ndim[t];
  if (c.numel <= 0xffffffffLL) {  // 32-bit division where it fits: several times cheaper
    const unsigned int u = (unsigned int)i;
#pragma unroll
    for (int j = 0; j < BB_MAX_DIMS; ++j) {
      if (j < nd) {
        unsigned int q = u / (unsigned int)c.div[t][j];
        if (c.div[t][j] * c.size[t][j] != c.numel) q %= (unsigned int)c.size[t][j];
        off += (long long)q * c.stride[t][j];
      }
    }
  } else {
#pragma unroll 1
    for (int j = 0; j < nd; ++j) {
      long long q = i / c.div[t][j];
      if (c.div[t][j] * c.size[t][j] != c.numel) q %= c.size[t][j];
      off += q * c.stride[t][j];
    }
  }
  return off;
}

template <typename T, int FN>
__global__ void __launch_bounds__(BB_BLOCK)
bb_opt2(const __grid_constant__ BBCollapsed c, const T* __restrict__ a, const T* __restrict__ b,
        const T* __restrict__ g, T* __restrict__ ga, T* __restrict__ gb, bb_acc_t<T>* acc_a, bb_acc_t<T>* acc_b) {
  typedef bb_acc_t<T> A;
  constexpr bool kOps = BBUsesOperands<FN>::value;
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < c.numel; i += step) {
    const A va = kOps ? bb_load(a + bb_collapsed_offset(c, BB_P, i)) : A(0);
    const A vb = kOps ? bb_load(b + bb_collapsed_offset(c, BB_Q, i)) : A(0);
    A ta, tb;
    bb_terms<FN, A>(va, vb, bb_load(g + bb_collapsed_offset(c, BB_G, i)), false, ta, tb);
    const long long oa = bb_collapsed_offset(c, BB_DP, i), ob = bb_collapsed_offset(c, BB_DQ, i);
    if (c.direct[0]) ga[oa] = bb_from_acc<T>(ta); else atomicAdd(acc_a + oa, ta);
    if (c.direct[1]) gb[ob] = bb_from_acc<T>(tb); else atomicAdd(acc_b + ob, tb);
  }
}

// ============================================================================ @best

// V elements of T in one access: 16 bytes for V = 16 / sizeof(T) (8 bytes for V = 8 / sizeof(T)),
// a plain scalar for V = 1.  The address must be aligned to the pack's bytes: one access (sm_90
// SASS: LDG.E.128 / LDG.E.64, STG likewise).
template <typename T, int V> struct alignas(sizeof(T) * V) BBVec { T v[V]; };

template <typename T, int V>
__device__ __forceinline__ BBVec<T, V> bb_ldv(const T* p) { return *reinterpret_cast<const BBVec<T, V>*>(p); }

template <typename T, int V>
__device__ __forceinline__ void bb_stv(T* p, const BBVec<T, V>& x) { *reinterpret_cast<BBVec<T, V>*>(p) = x; }

// Tuning of the @best kernels (a host may override them with -D: the cupy backend's
// GRADORACLE_CUPY_BB setting; torch_ext and the plan's defaults assume these values).
#ifndef BB_BEST_UR
#define BB_BEST_UR 2          // packs (rows) in flight per thread in bb_rows / bb_batch (y-looped)
#endif
#ifndef BB_BEST_PF
// 0: the H100 A/B (results/h100/cupy/bcast-3/tune.txt) found the L2 prefetch slower: bf16 mul with
// B = [4096] at 83% of copy with 2 steps, 94% with none; both-broadcast 47% -> 60%.
#define BB_BEST_PF 0          // bb_cols / bb_rows / bb_batch: L2 prefetch this many loop steps ahead (0: none)
#endif
#ifndef BB_BEST_MIN_BLOCKS
#define BB_BEST_MIN_BLOCKS 3  // resident 256-thread blocks per SM they are built for (<= 80 registers)
#endif
// bb_cols' own: a row (g's and Q's packs: two 16-byte loads) in flight per thread (rows further
// on asked of the L2 when BB_BEST_PF > 0), at <= 64 registers without spills: 4 blocks per SM
// (50% occupancy).  With 2 rows it needed 80 and spilled (37.5%, the first GPU profile).
#ifndef BB_COLS_UR
#define BB_COLS_UR 1
#endif
#ifndef BB_COLS_MIN_BLOCKS
#define BB_COLS_MIN_BLOCKS 4
#endif

// Asks the L2 for the sector at p ahead of its load: the load then waits on the L2, not DRAM,
// which takes no registers (more bytes in flight than the registers would hold).  A no-op off
// the GPU (the CPU stand-in).
__device__ __forceinline__ void bb_prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

// bb_terms for the @best kernels.  For div with 16-bit T, db = -a / b^2 is taken as -(a * r) * r
// with r = 1 / b (the da term): one IEEE division per element instead of two.  Its float error
// (a few float ulps) is far below the 16-bit rounding of the result; float and double keep the
// exact formula.
template <int FN, typename T, typename A>
__device__ __forceinline__ void bb_terms_best(A p, A q, A g, bool swap, A& tp, A& tq) {
  if (FN == BB_DIV && sizeof(T) == 2) {
    const A a = swap ? q : p, b = swap ? p : q;
    const A r = A(1) / b;
    const A ta = g * r, tb = g * (-(a * r) * r);
    tp = swap ? tb : ta;
    tq = swap ? ta : tb;
  } else {
    bb_terms<FN, A>(p, q, g, swap, tp, tq);
  }
}

// Offsets in slots S0, S1, S2 of element idx of `gr` (G, Q, DQ: the three the @best loops move
// along in bb_cols / bb_rows; G, P, DP along bb_batch's rows): a one-dim group (the usual case)
// multiplies by strides read from the parameter space, so no per-slot cursor state is kept in
// registers; more dims unravel (rolled, 64-bit).
template <int S0, int S1, int S2>
__device__ __forceinline__ void bb_offsets3(const BBGroup& gr, long long idx, long long& o0, long long& o1,
                                            long long& o2) {
  if (gr.ndim == 1) {
    o0 = idx * gr.stride[S0][0];
    o1 = idx * gr.stride[S1][0];
    o2 = idx * gr.stride[S2][0];
    return;
  }
  o0 = o1 = o2 = 0;
#pragma unroll 1
  for (int d = (int)gr.ndim - 1; d >= 0; --d) {
    const long long q = d > 0 ? idx / gr.size[d] : 0;
    const long long r = idx - q * gr.size[d];
    idx = q;
    o0 += r * gr.stride[S0][d];
    o1 += r * gr.stride[S1][d];
    o2 += r * gr.stride[S2][d];
  }
}

// The loads of one step of bb_cols' / bb_rows' dQ loops: the UR packs of group G at i0 + r * step
// below hi (ok[r]), g's and Q's (when the fn reads operands) from the tile bases gt, qt, and dQ's
// offsets.  All loads before any use, for memory-level parallelism.  Two helpers (loads, then
// bb_store_packs) rather than one: the kernels then keep their registers (one helper for the whole
// step cost up to 4 registers and spills in the 16-bit cols kernels).
template <typename T, int V, bool kOps, int UR>
__device__ __forceinline__ void bb_load_packs(const BBGroup& G, long long i0, long long step, long long hi,
                                              const T* __restrict__ gt, const T* __restrict__ qt, bool (&ok)[UR],
                                              BBVec<T, V> (&gv)[UR], BBVec<T, V> (&qv)[UR], long long (&dqo)[UR]) {
#pragma unroll
  for (int r = 0; r < UR; ++r) {
    const long long i = i0 + r * step;
    ok[r] = i < hi;
    long long og, oq;
    bb_offsets3<BB_G, BB_Q, BB_DQ>(G, ok[r] ? i : 0, og, oq, dqo[r]);
    if (ok[r]) {
      gv[r] = bb_ldv<T, V>(gt + og);
      if (kOps) qv[r] = bb_ldv<T, V>(qt + oq);
    }
  }
}

// P's value for element e of a pack: one value for the whole pack (bb_rows) or the pack's own (bb_cols).
template <typename A> __device__ __forceinline__ A bb_p_at(A p, int) { return p; }
template <typename T, int V> __device__ __forceinline__ bb_acc_t<T> bb_p_at(const BBVec<T, V>& p, int e) {
  return bb_to_acc(p.v[e]);
}
// dP's accumulator of element e: one per thread (bb_rows) or one per element of the pack (bb_cols).
template <typename A> __device__ __forceinline__ void bb_add_at(A& acc, int, A t) { acc += t; }
template <typename A, int V> __device__ __forceinline__ void bb_add_at(A (&acc)[V], int e, A t) { acc[e] += t; }

// The rest of that step: per loaded pack, dQ's terms stored as a pack at dqt + dqo[r] and dP's
// terms added into acc.
template <typename T, int FN, int V, bool kOps, int UR, typename PV, typename ACC>
__device__ __forceinline__ void bb_store_packs(T* __restrict__ dqt, bool swap, const PV& pvals, ACC& acc,
                                               const bool (&ok)[UR], const BBVec<T, V> (&gv)[UR],
                                               const BBVec<T, V> (&qv)[UR], const long long (&dqo)[UR]) {
  typedef bb_acc_t<T> A;
#pragma unroll
  for (int r = 0; r < UR; ++r) {
    if (!ok[r]) continue;
    BBVec<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      A tp, tq;
      bb_terms_best<FN, T, A>(kOps ? bb_p_at(pvals, e) : A(0), kOps ? bb_to_acc(qv[r].v[e]) : A(0),
                              bb_to_acc(gv[r].v[e]), swap, tp, tq);
      bb_add_at(acc, e, tp);
      out.v[e] = bb_from_acc<T>(tq);
    }
    bb_stv<T, V>(dqt + dqo[r], out);
  }
}

// Lanes along K, one reduced group R looped (bias-like: P is broadcast along R, nothing sums
// over K).  grp[0] = K, grp[1] unused (numel 1), grp[2] = R.  Each lane owns V consecutive k's
// (one 16-byte pack for V > 1: the host guarantees K's innermost dim is dense in every tensor, a
// multiple of V long, and every other stride a multiple of V); lanes = KW packs per tile row,
// lanes_log2; the block's nw = BB_BLOCK / KW row slots walk a chunk of R.  dQ is written as
// packs as it goes; dP accumulates in registers, then over the slots (fixed-order tree), and is
// written final (nchunk[2] == 1) or as A partial row cv.  chunk[2] = rows per chunk, nchunk =
// {k tiles, 1, R chunks}, ntiles = their product.  A one-dim R (the usual case) steps row
// pointers (UR rows in flight, the L2 asked for the rows BB_BEST_PF steps ahead); several row
// dims take a row at a time through the unravelling path, kept small so that it does not raise
// the kernel's register count.
template <typename T, int FN, int V>
__global__ void __launch_bounds__(BB_BLOCK, BB_COLS_MIN_BLOCKS)
bb_cols(const __grid_constant__ BBParams p, const T* __restrict__ P, const T* __restrict__ Q,
        const T* __restrict__ g, T* __restrict__ dP, bb_acc_t<T>* __restrict__ dP_part, T* __restrict__ dQ) {
  typedef bb_acc_t<T> A;
  typedef BBVec<T, V> Vec;
  constexpr int UR = BB_COLS_UR;
  constexpr bool kOps = BBUsesOperands<FN>::value;
  __shared__ A red[V * BB_BLOCK];
  const BBGroup& K = p.grp[0];
  const BBGroup& R = p.grp[2];
  const int tid = threadIdx.x, kw = (int)p.lanes;
  const int lane = tid & (kw - 1), w = tid >> (int)p.lanes_log2, nw = BB_BLOCK >> (int)p.lanes_log2;
  const bool swap = p.swap != 0;

  for (long long t = blockIdx.x; t < p.ntiles; t += gridDim.x) {
    const long long kt = t % p.nchunk[0], cv = t / p.nchunk[0];
    const long long k = (kt * kw + lane) * V;
    const bool kok = k < K.numel;
    long long ko[BB_NT];
    bb_offsets_setup(K, kok ? k : 0, ko);
    // P stays packed (half the registers of its converted values for 16-bit types).
    Vec pp;
    A accp[V];
    if (kOps && kok) pp = bb_ldv<T, V>(P + ko[BB_P]);
#pragma unroll
    for (int e = 0; e < V; ++e) accp[e] = A(0);
    if (kok) {
      // Tile base pointers: the loop adds only the row offsets.
      const T* __restrict__ gt = g + ko[BB_G];
      const T* __restrict__ qt = Q + ko[BB_Q];
      T* __restrict__ dqt = dQ + ko[BB_DQ];
      const long long v_lo = cv * p.chunk[2], v_hi = bb_min(R.numel, v_lo + p.chunk[2]);
      if (R.ndim == 1) {
        // One row dim (the usual case): pointers stepped by nw rows, no per-row offset math.
        const long long sg = R.stride[BB_G][0] * nw, sq = R.stride[BB_Q][0] * nw, sd = R.stride[BB_DQ][0] * nw;
        const long long v1 = v_lo + w;
        const T* __restrict__ gp = gt + v1 * R.stride[BB_G][0];
        const T* __restrict__ qp = qt + v1 * R.stride[BB_Q][0];
        T* __restrict__ dqp = dqt + v1 * R.stride[BB_DQ][0];
        const int nrows = v1 < v_hi ? (int)((v_hi - v1 + nw - 1) / nw) : 0;  // this slot's rows
#pragma unroll 1
        for (int r0 = 0; r0 < nrows; r0 += UR, gp += UR * sg, qp += UR * sq, dqp += UR * sd) {
          Vec gv[UR], qv[UR];
#pragma unroll
          for (int r = 0; r < UR; ++r) {
            if (r0 + r < nrows) {
              gv[r] = bb_ldv<T, V>(gp + r * sg);
              if (kOps) qv[r] = bb_ldv<T, V>(qp + r * sq);
            }
          }
          if (BB_BEST_PF > 0) {
#pragma unroll
            for (int r = BB_BEST_PF * UR; r < (BB_BEST_PF + 1) * UR; ++r) {
              if (r0 + r < nrows) {
                bb_prefetch_l2(gp + r * sg);
                if (kOps) bb_prefetch_l2(qp + r * sq);
              }
            }
          }
#pragma unroll
          for (int r = 0; r < UR; ++r) {
            if (r0 + r < nrows) {
              Vec out;
#pragma unroll
              for (int e = 0; e < V; ++e) {
                A tp, tq;
                bb_terms_best<FN, T, A>(kOps ? bb_to_acc(pp.v[e]) : A(0), kOps ? bb_to_acc(qv[r].v[e]) : A(0),
                                        bb_to_acc(gv[r].v[e]), swap, tp, tq);
                accp[e] += tp;
                out.v[e] = bb_from_acc<T>(tq);
              }
              bb_stv<T, V>(dqp + r * sd, out);
            }
          }
        }
      } else {  // several row dims (strided layouts): a row at a time, kept small
#pragma unroll 1
        for (long long v0 = v_lo + w; v0 < v_hi; v0 += nw) {
          bool ok[1];
          Vec gv[1], qv[1];
          long long dqo[1];
          bb_load_packs<T, V, kOps>(R, v0, nw, v_hi, gt, qt, ok, gv, qv, dqo);
          bb_store_packs<T, FN, V, kOps>(dqt, swap, pp, accp, ok, gv, qv, dqo);
        }
      }
    }
    bb_block_reduce_slots<A, V>(red, accp, tid, w, nw, kw);
    if (w == 0 && kok) {
#pragma unroll
      for (int e = 0; e < V; ++e)
        bb_store<T>(dP, dP_part, p.nchunk[2], cv, p.numel_out[0], ko[BB_DP] + e, red[e * BB_BLOCK + tid]);
    }
  }
}

// Lanes along the reduced group X, the other reduced group empty (row sums: P is broadcast along
// X).  grp[0] = X, grp[1] unused, grp[2] = Z = K.  A task is one z and one chunk of X (chunk[0]
// elements, a multiple of V), owned by a segment of XW = lanes lanes; each lane takes packs of V
// consecutive x's (16 bytes for V > 1: X's innermost dim dense in Q, g, dQ, a multiple of V
// long, their other strides multiples of V), UR packs in flight, and writes dQ as packs.  dP[z]
// is the segment's fixed-order shuffle sum, final or A partial row cx (nchunk[0] > 1).
// nchunk[0] = X chunks; ntiles = tasks = nchunk[0] * numel(Z).
template <typename T, int FN, int V>
__global__ void __launch_bounds__(BB_BLOCK, BB_BEST_MIN_BLOCKS)
bb_rows(const __grid_constant__ BBParams p, const T* __restrict__ P, const T* __restrict__ Q,
        const T* __restrict__ g, T* __restrict__ dP, bb_acc_t<T>* __restrict__ dP_part, T* __restrict__ dQ) {
  typedef bb_acc_t<T> A;
  typedef BBVec<T, V> Vec;
  constexpr int UR = BB_BEST_UR;
  constexpr bool kOps = BBUsesOperands<FN>::value;
  const BBGroup& X = p.grp[0];
  const BBGroup& Z = p.grp[2];
  const BBSegs sg(p);
  const int xw = sg.xw, lane = sg.lane, seg = sg.seg, nseg = sg.nseg, warp_seg0 = sg.warp_seg0;
  const bool swap = p.swap != 0;
  const long long pstep = (long long)xw * V;      // elements between a lane's packs

  // Warp-uniform loop (the shuffle needs all 32 lanes).
  for (long long t0 = (long long)blockIdx.x * nseg + warp_seg0; t0 < p.ntiles; t0 += (long long)gridDim.x * nseg) {
    const long long task = t0 + (seg - warp_seg0);
    const bool valid = task < p.ntiles;
    const long long cx = valid ? task % p.nchunk[0] : 0, z = valid ? task / p.nchunk[0] : 0;
    long long zo[BB_NT];
    bb_offsets_setup(Z, z, zo);
    A accp = A(0);
    if (valid) {
      const A pv = kOps ? bb_load(P + zo[BB_P]) : A(0);
      const T* __restrict__ gt = g + zo[BB_G];  // task base pointers: the loop adds only x offsets
      const T* __restrict__ qt = Q + zo[BB_Q];
      T* __restrict__ dqt = dQ + zo[BB_DQ];
      const long long x_lo = cx * p.chunk[0], x_hi = bb_min(X.numel, x_lo + p.chunk[0]);
      for (long long x0 = x_lo + (long long)lane * V; x0 < x_hi; x0 += pstep * UR) {
        bool ok[UR];
        Vec gv[UR], qv[UR];
        long long dqo[UR];
        bb_load_packs<T, V, kOps>(X, x0, pstep, x_hi, gt, qt, ok, gv, qv, dqo);
        if (BB_BEST_PF > 0 && X.ndim == 1) {
#pragma unroll
          for (int r = BB_BEST_PF * UR; r < (BB_BEST_PF + 1) * UR; ++r) {
            const long long x = x0 + r * pstep;
            if (x < x_hi) {
              bb_prefetch_l2(gt + x * X.stride[BB_G][0]);
              if (kOps) bb_prefetch_l2(qt + x * X.stride[BB_Q][0]);
            }
          }
        }
        bb_store_packs<T, FN, V, kOps>(dqt, swap, pv, accp, ok, gv, qv, dqo);
      }
    }
    accp = bb_segment_sum(accp, xw);
    if (valid && lane == 0) bb_store<T>(dP, dP_part, p.nchunk[0], cx, p.numel_out[0], zo[BB_DP], accp);
  }
}

// bb_batch's y-looped mode (chunk[2] == 0; the @best kernel of the first GPU runs, and the mode
// for a long Y): lanes along the reduced group X, the other reduced group Y looped in-thread
// (both operands broadcast: P along X, Q along Y).  grp[0] = X, grp[1] = Y, grp[2] = Z = K.  A task is one z,
// one chunk of XW * V x's (one pack per lane: 16 bytes for V > 1, with the same layout
// conditions as bb_rows, and Y's g strides multiples of V too) and a chunk of chunk[1] y's,
// owned by a segment of XW = lanes lanes.  Q's pack is loaded once; per y the lane loads g's
// pack and P[z, y] (one address for the whole segment), dQ accumulates in registers (no block
// reduction), and dP[z, y] is the segment's fixed-order shuffle sum, written final
// (nchunk[0] == 1) or as A partial row cx.  After the y loop dQ is written final (nchunk[1] ==
// 1) or as A partial row cy.  nchunk = {X chunks, Y chunks, numel(Z)}; ntiles = their product.
template <typename T, int FN, int V>
__device__ __forceinline__ void bb_batch_ylooped(const BBParams& p, const T* __restrict__ P, const T* __restrict__ Q,
                                                 const T* __restrict__ g, T* __restrict__ dP,
                                                 bb_acc_t<T>* __restrict__ dP_part, T* __restrict__ dQ,
                                                 bb_acc_t<T>* __restrict__ dQ_part) {
  typedef bb_acc_t<T> A;
  typedef BBVec<T, V> Vec;
  constexpr int UR = BB_BEST_UR;
  constexpr bool kOps = BBUsesOperands<FN>::value;
  const BBGroup& X = p.grp[0];
  const BBGroup& Y = p.grp[1];
  const BBGroup& Z = p.grp[2];
  const BBSegs sg(p);
  const int xw = sg.xw, lane = sg.lane, seg = sg.seg, nseg = sg.nseg, warp_seg0 = sg.warp_seg0;
  const bool swap = p.swap != 0;

  // Warp-uniform loop (the shuffles need all 32 lanes).
  for (long long t0 = (long long)blockIdx.x * nseg + warp_seg0; t0 < p.ntiles; t0 += (long long)gridDim.x * nseg) {
    const long long task = t0 + (seg - warp_seg0);
    const bool valid = task < p.ntiles;
    const long long cx = valid ? task % p.nchunk[0] : 0, rest = valid ? task / p.nchunk[0] : 0;
    const long long cy = rest % p.nchunk[1], z = rest / p.nchunk[1];
    const long long x = cx * p.chunk[0] + (long long)lane * V;
    const bool xok = valid && x < X.numel;
    long long zo[BB_NT], xo[BB_NT];
    bb_offsets_setup(Z, z, zo);
    bb_offsets_setup(X, xok ? x : 0, xo);
    Vec qp;
    A accq[V];
    if (kOps && xok) qp = bb_ldv<T, V>(Q + zo[BB_Q] + xo[BB_Q]);
#pragma unroll
    for (int e = 0; e < V; ++e) accq[e] = A(0);
    const T* __restrict__ gt = g + zo[BB_G] + xo[BB_G];  // the loop adds only y offsets
    const T* __restrict__ pt = P + zo[BB_P];
    const long long y_lo = cy * p.chunk[1], y_hi = valid ? bb_min(Y.numel, y_lo + p.chunk[1]) : y_lo;
    // Trip count chunk[1] / UR for every segment (a warp may hold several; the shuffles need all
    // 32 lanes), rows past y_hi masked.
    for (long long j0 = 0; j0 < p.chunk[1]; j0 += UR) {
      bool ok[UR];
      Vec gv[UR];
      A pv[UR];
      long long dpo[UR];
#pragma unroll
      for (int r = 0; r < UR; ++r) {  // loads of UR rows first
        const long long y = y_lo + j0 + r;
        ok[r] = y < y_hi;
        long long og, op;
        bb_offsets3<BB_G, BB_P, BB_DP>(Y, ok[r] ? y : 0, og, op, dpo[r]);
        dpo[r] += zo[BB_DP];
        pv[r] = (kOps && ok[r]) ? bb_load(pt + op) : A(0);
        if (ok[r] && xok) gv[r] = bb_ldv<T, V>(gt + og);
      }
#pragma unroll
      for (int r = 0; r < UR; ++r) {
        A sp = A(0);
        if (ok[r] && xok) {
#pragma unroll
          for (int e = 0; e < V; ++e) {
            A tp, tq;
            bb_terms<FN, A>(pv[r], kOps ? bb_to_acc(qp.v[e]) : A(0), bb_to_acc(gv[r].v[e]), swap, tp, tq);
            sp += tp;
            accq[e] += tq;
          }
        }
        sp = bb_segment_sum(sp, xw);
        if (ok[r] && lane == 0) bb_store<T>(dP, dP_part, p.nchunk[0], cx, p.numel_out[0], dpo[r], sp);
      }
    }
    if (xok) {
      const long long dqo = zo[BB_DQ] + xo[BB_DQ];
      if (p.nchunk[1] == 1) {
        Vec out;
#pragma unroll
        for (int e = 0; e < V; ++e) out.v[e] = bb_from_acc<T>(accq[e]);
        bb_stv<T, V>(dQ + dqo, out);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) dQ_part[cy * p.numel_out[1] + dqo + e] = accq[e];
      }
    }
  }
}

// Both operands broadcast, lanes along X, one kernel per mode (each built for its own register
// budget): bb_batch, the y-looped mode above (any Y; chunk[2] = 0), and bb_both below, for a
// short one-dim Y.
template <typename T, int FN, int V>
__global__ void __launch_bounds__(BB_BLOCK, BB_BEST_MIN_BLOCKS)
bb_batch(const __grid_constant__ BBParams p, const T* __restrict__ P, const T* __restrict__ Q,
         const T* __restrict__ g, T* __restrict__ dP, bb_acc_t<T>* __restrict__ dP_part, T* __restrict__ dQ,
         bb_acc_t<T>* __restrict__ dQ_part) {
  bb_batch_ylooped<T, FN, V>(p, P, Q, g, dP, dP_part, dQ, dQ_part);
}

// bb_both: both operands broadcast (P along X, Q along Y) with a short one-dim Y (numel <=
// BB_YT): the perf case mul(A = 1xMxN, B = KxMx1), where b (P) is one value per row of g and a
// (Q) one pack per X position for all K rows.  grp[0] = X (lanes), grp[1] = Y, grp[2] = Z = K.
// A task is one z and one chunk of X (chunk[0] elements, a multiple of V), owned by a segment of
// XW = lanes threads (a power of two <= BB_BLOCK: a segment wider than a warp is whole warps).
// Per task each thread loads P[z, y] once per row y (the segment shares the addresses: one
// request per warp and row), not once per element; per pack of V x's it loads Q's pack once and
// the ny packs of g (BBBothRows<T> rows' loads before their use: 4 for 4-byte T, else 1), sums dQ
// over Y in registers and stores it final (16-byte packs for V > 1: X's innermost dim dense in Q,
// g, dQ, a multiple of V long, every other stride of theirs a multiple of V).  dP[z, y] is a
// per-thread partial per row over the task's packs (a pack's V terms summed in a register first), reduced once per task: a warp
// butterfly, then, for segments wider than a warp, one fixed-order sum over the segment's warps
// through shared memory (one barrier per task; that buffer is double-buffered by task parity, so
// its reuse needs no second barrier).  P's values and the row partials sit in the thread's own
// shared slots (no other thread reads them: no barrier; consecutive threads, consecutive words:
// no bank conflicts): held in registers as well they made ptxas spill 20-260 bytes at the 64
// registers of 4 blocks per SM (50% occupancy), which this kernel is built for.  The earlier
// stream mode of bb_batch shuffled within warp-wide segments only (so the perf case's X was cut
// into chunks: partial rows and a bb_finalize launch) and was built for 80 registers (37.5%).
// dP final (nchunk[0] == 1) or A partial row cx.  nchunk = {X chunks, 1, numel(Z)}; ntiles =
// tasks = nchunk[0] * numel(Z).
#ifndef BB_YT
#define BB_YT 8  // most rows of Y bb_both holds (P's values and the row partials: BB_YT slots a thread)
#endif
// Rows of g bb_both loads before their use, per element size (BB_YG, when defined, overrides it
// for every type: GRADORACLE_CUPY_BB's yg= A/B).  The H100 (cold L2, perf case mul A = 1x2048x4096,
// B = 8x2048x1) was latency bound with one row in flight (ncu, bf16: DRAM 63% of peak, long
// scoreboard 58% of stalls): f32 84% of copy with 1 row, 90% with 2, 92% with 4, hence 4 for
// 4-byte types.  16-bit types stay at 1 row: with 2 or 4 rows of 16-byte packs (8 elements, 8
// floats a row) they spilled at 64 registers (bf16 58% / 43% of copy against 72%), and 8-byte packs
// with 4 rows, which fit, measured 64-66% (results/h100/s7/batch_s7c).  8-byte types keep 1 row:
// their div / pow builds spill already.
#ifdef BB_YG
template <typename T> struct BBBothRows { static constexpr int value = BB_YG; };
#else
template <typename T> struct BBBothRows { static constexpr int value = sizeof(T) == 4 ? 4 : 1; };
#endif
#ifndef BB_BOTH_MIN_BLOCKS
#define BB_BOTH_MIN_BLOCKS 4  // resident 256-thread blocks per SM bb_both is built for (<= 64 registers: 50%)
#endif

template <typename T, int FN, int V>
__global__ void __launch_bounds__(BB_BLOCK, BB_BOTH_MIN_BLOCKS)
bb_both(const __grid_constant__ BBParams p, const T* __restrict__ P, const T* __restrict__ Q,
        const T* __restrict__ g, T* __restrict__ dP, bb_acc_t<T>* __restrict__ dP_part, T* __restrict__ dQ) {
  typedef bb_acc_t<T> A;
  typedef BBVec<T, V> Vec;
  constexpr bool kOps = BBUsesOperands<FN>::value;
  constexpr int YG = BBBothRows<T>::value;
  const BBGroup& X = p.grp[0];
  const BBGroup& Y = p.grp[1];
  const BBGroup& Z = p.grp[2];
  const int ny = (int)Y.numel;
  const long long ys_g = Y.stride[BB_G][0], ys_p = Y.stride[BB_P][0], ys_dp = Y.stride[BB_DP][0];
  const int tid = (int)threadIdx.x, xw = (int)p.lanes, lg = (int)p.lanes_log2;
  const int lane = tid & (xw - 1), seg = tid >> lg, nseg = BB_BLOCK >> lg;
  const int sw = xw < 32 ? xw : 32;  // lanes of a segment within one warp: the butterfly's width
  const bool swap = p.swap != 0;
  const long long pstep = (long long)xw * V;  // elements between a thread's packs
  __shared__ A red[2][BB_YT][BB_BLOCK / 32];  // wide segments' warp sums: [task parity][row][warp]
  __shared__ A pslots[2 * BB_YT * BB_BLOCK];  // the thread's own slots, every BB_BLOCK words:
  A* pv = pslots + tid;                         // P[z, y] of its task's rows
  A* accp = pslots + BB_YT * BB_BLOCK + tid;    // its partials of dP[z, y]
  int parity = 0;

  // Block-uniform loop (the barrier of wide segments, the shuffles of narrow ones).
  for (long long t0 = (long long)blockIdx.x * nseg; t0 < p.ntiles; t0 += (long long)gridDim.x * nseg, parity ^= 1) {
    const long long task = t0 + seg;
    const bool valid = task < p.ntiles;
    const long long cx = valid ? task % p.nchunk[0] : 0, z = valid ? task / p.nchunk[0] : 0;
    long long zo[BB_NT];
    bb_offsets_setup(Z, z, zo);
#pragma unroll
    for (int j = 0; j < BB_YT; ++j) {
      if (kOps && valid && j < ny) pv[j * BB_BLOCK] = bb_load(P + zo[BB_P] + j * ys_p);
      accp[j * BB_BLOCK] = A(0);
    }
    if (valid) {
      const T* __restrict__ gt = g + zo[BB_G];  // task base pointers: the loop adds only x offsets
      const T* __restrict__ qt = Q + zo[BB_Q];
      T* __restrict__ dqt = dQ + zo[BB_DQ];
      const long long x_hi = bb_min(X.numel, (cx + 1) * p.chunk[0]);
#pragma unroll 1
      for (long long x = cx * p.chunk[0] + (long long)lane * V; x < x_hi; x += pstep) {
        long long og, oq, odq;
        bb_offsets3<BB_G, BB_Q, BB_DQ>(X, x, og, oq, odq);
        Vec qv;
        if (kOps) qv = bb_ldv<T, V>(qt + oq);
        A accq[V];
#pragma unroll
        for (int e = 0; e < V; ++e) accq[e] = A(0);
        const T* __restrict__ gx = gt + og;  // g's pack in row 0; row j is j * ys_g further
#pragma unroll
        for (int j0 = 0; j0 < BB_YT; j0 += YG) {  // YG rows' loads, then their use
          Vec gv[YG];
          // The rest of the rows are past Y (ny is the same in every thread).  Only with several rows
          // a group: without it f32 mul spilled 8 bytes at YG = 4; with it f64 div / pow (YG = 1)
          // spilled more.
          if (YG > 1 && j0 >= ny) break;
#pragma unroll
          for (int j = j0; j < j0 + YG; ++j)
            if (j < ny) gv[j - j0] = bb_ldv<T, V>(gx + j * ys_g);
#pragma unroll
          for (int j = j0; j < j0 + YG; ++j) {
            if (j < ny) {
              A sp = A(0);
#pragma unroll
              for (int e = 0; e < V; ++e) {
                A tp, tq;
                bb_terms_best<FN, T, A>(kOps ? pv[j * BB_BLOCK] : A(0), kOps ? bb_to_acc(qv.v[e]) : A(0), bb_to_acc(gv[j - j0].v[e]), swap,
                                        tp, tq);
                sp += tp;
                accq[e] += tq;
              }
              accp[j * BB_BLOCK] += sp;
            }
          }
        }
        Vec out;
#pragma unroll
        for (int e = 0; e < V; ++e) out.v[e] = bb_from_acc<T>(accq[e]);
        bb_stv<T, V>(dqt + odq, out);
      }
    }
#pragma unroll
    for (int j = 0; j < BB_YT; ++j)
      if (j < ny) accp[j * BB_BLOCK] = bb_segment_sum(accp[j * BB_BLOCK], sw);  // ny is the same in every thread
    if (xw <= 32) {
      if (valid && lane == 0) {
#pragma unroll
        for (int j = 0; j < BB_YT; ++j)
          if (j < ny) bb_store<T>(dP, dP_part, p.nchunk[0], cx, p.numel_out[0], zo[BB_DP] + j * ys_dp, accp[j * BB_BLOCK]);
      }
    } else {
      if ((tid & 31) == 0) {
#pragma unroll
        for (int j = 0; j < BB_YT; ++j)
          if (j < ny) red[parity][j][tid >> 5] = accp[j * BB_BLOCK];
      }
      __syncthreads();
      if (valid && lane < ny) {  // thread `lane` of the segment: row y = lane, its warps' sums in order
        const int nw = xw >> 5, w0 = seg * nw;
        A s = A(0);
        for (int w = 0; w < nw; ++w) s += red[parity][lane][w0 + w];
        bb_store<T>(dP, dP_part, p.nchunk[0], cx, p.numel_out[0], zo[BB_DP] + lane * ys_dp, s);
      }
    }
  }
}

// ============================================================================ naive reference

// What one writes first: a thread per element of O, its 64-bit index unravelled into
// (k, ra, rb), and an atomicAdd of each term into zeroed A accumulators.  The summation order
// depends on timing, so results are not bitwise reproducible.
template <typename T, int FN>
__global__ void bb_naive(const __grid_constant__ BBParams p, const T* __restrict__ a, const T* __restrict__ b,
                         const T* __restrict__ g, bb_acc_t<T>* acc_a, bb_acc_t<T>* acc_b) {
  typedef bb_acc_t<T> A;
  const BBGroup& K = p.grp[0];
  const BBGroup& RA = p.grp[1];
  const BBGroup& RB = p.grp[2];
  const long long n = K.numel * RA.numel * RB.numel;
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
    const long long rb = i % RB.numel, ra = (i / RB.numel) % RA.numel, k = i / RB.numel / RA.numel;
    long long off[BB_NT];
    bb_offsets(K, k, off);
    bb_unravel(RA, (int)RA.ndim, ra, off);
    bb_unravel(RB, (int)RB.ndim, rb, off);
    A da, db;
    bb_partials<FN, A>(bb_load(a + off[0]), bb_load(b + off[1]), da, db);
    const A gv = bb_load(g + off[2]);
    atomicAdd(acc_a + off[3], gv * da);
    atomicAdd(acc_b + off[4], gv * db);
  }
}

// ============================================================================ stage 2

template <typename T>
__global__ void __launch_bounds__(BB_BLOCK)
bb_finalize(const bb_acc_t<T>* __restrict__ part, long long nchunks, long long n, T* __restrict__ out) {
  typedef bb_acc_t<T> A;
  constexpr int U = 8;  // partial rows loaded before they are added: latency overlapped, order kept
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
    A s = A(0);
    long long c = 0;
    for (; c + U <= nchunks; c += U) {
      A v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) v[u] = part[(c + u) * n + i];
#pragma unroll
      for (int u = 0; u < U; ++u) s += v[u];  // still c = 0, 1, 2, ... in order: the same bits
    }
    for (; c < nchunks; ++c) s += part[c * n + i];
    out[i] = bb_from_acc<T>(s);
  }
}
