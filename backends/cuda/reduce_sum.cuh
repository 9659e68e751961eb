// reduce_sum: CUDA device code, the one copy shared by the cupy backend (NVRTC, through
// cupy.RawModule) and the torch extension (nvcc).  Spec: oracle/reduce_sum.py.  Host planning:
// backends/cupy/reduce_sum.py.
//
// Self-contained for NVRTC: only cuda_fp16.h / cuda_bf16.h are included (pass their folder with
// -I); no implicit half conversions (torch builds with __CUDA_NO_HALF_CONVERSIONS__).
//
// Element types T = float | double | __half | __nv_bfloat16.  Every sum is taken in A =
// rs_acc_t<T> (double for double, float otherwise) and rounded once to the output type.
//
// ============================================================================ the ladder (v0-v5)
//
// The textbook parallel-reduction kernels (seed 001), each reducing CONTIGUOUS SEGMENTS: segment
// s of the input is in[s * seg_stride + i], i < n.  Launch: blockDim = RS_BLOCK, grid = (blocks
// per segment nb, segments in this launch); block (b, j) reduces its slice of segment seg0 + j
// and writes out[(seg0 + j) * nb + b].  The host relaunches the same kernel on those per-block
// sums (n = nb, seg_stride = nb) until one value per segment is left, so every rung is a complete,
// deterministic multi-pass reduction.  TI is the pass's input type (T, or A for later passes),
// TO its output type (A for partials, T for the final pass).
//
//   rs_v0<TI,TO>  interleaved addressing: `tid % (2*s) == 0` picks the adders (divergent warps,
//                 a modulo per step); one element per thread.
//   rs_v1<TI,TO>  strided index: thread tid adds at 2*s*tid, so the active threads are packed
//                 (no divergence), but the strided smem accesses conflict on banks.
//   rs_v2<TI,TO>  sequential addressing: sdata[tid] += sdata[tid + s] for s = blockDim/2 .. 1
//                 (conflict free).
//   rs_v3<TI,TO>  v2 with the first add during the load: a block covers 2 * blockDim elements,
//                 so half the blocks.
//   rs_v4<TI,TO>  v3 with the last warp unrolled (s <= 32 without __syncthreads).  The seed
//                 relies on warp lockstep through a volatile pointer; since Volta that is a race,
//                 so each step here reads, __syncwarp()s, then writes (the documented fix).
//   rs_v5<TI,TO>  v3's load, then warp-shuffle sums (__shfl_xor_sync), one smem slot per warp,
//                 the first warp sums the warp sums.
//
// The seed's kernels assume n is a multiple of the block's span; here an index past n loads 0.
//
// ============================================================================ best
//
// One pass over x for every form, with 16-byte loads where the layout allows, fixed-order sums,
// no atomics on data: the reductions split across blocks write per-block partials (A) and the
// LAST block to finish (an atomic ticket per segment/tile, after a __threadfence) sums them in
// chunk order and writes y, then re-arms its ticket to 0.  Results are bitwise reproducible for
// a given launch configuration; the tickets must be zero at launch (the host zeroes them once
// when it allocates them; every finishing block leaves its own back at 0).
//
// The host collapses x into (outer, reduced, inner) groups with strides in elements
// (RSParams, by value, all long long: the host packs RS_PARAMS_WORDS int64 words):
//
//   row mode    the reduced dims hold x's fastest dim: segment = one output element y[s]; its
//               terms are red.numel runs (red = the reduced dims but the fastest) of `run`
//               elements at stride run_xs.  outer = every kept dim (x and y strides).
//       rs_row_team<T,VEC,SIMPLE>(p, x, y): a team of `lanes` (power of two <= 32) lanes
//               per segment, segments grid-strided; a shuffle sums the team.  For many segments.
//       rs_row_block<T,VEC,SIMPLE>(p, x, y, part, ticket): tile t = (segment t / nchunk, chunk t %
//               nchunk); the nchunk blocks of a segment grid-stride over its units; each block
//               sums its share; nchunk > 1: partials part[t], ticket[segment].  For few segments.
//   col mode    a kept dim is x's fastest: inner = that dim (lanes along it), outer = the other
//               kept dims, red = every reduced dim (rows, looped).
//       rs_col<T,VEC,SIMPLE>(p, x, y, part, ticket): tile t = ((o * ctiles + ct) * nchunk + c): outer
//               element o, `lanes * V` columns ct, rows [c * chunk, (c + 1) * chunk) of red; thread
//               (w, lane) sums rows w, w + nw, ... for its V columns; a fixed tree over the nw row
//               slots; nchunk > 1: partial rows part[(o * ctiles + ct) * nchunk + c][lanes * V],
//               ticket[o * ctiles + ct].
//
// Template flags (the host picks the instantiation per call):
//   VEC = true reads 16-byte packs of V = 16 / sizeof(T) elements.  The host guarantees a 16-byte
//     aligned x, run_xs == 1 (row) / inner_xs == 1 (col), every other x stride a multiple of V,
//     and run % V == 0 (row, red.ndim > 0) / inner % V == 0 (col).  Row units are then packs
//     (nvec = run / V per run) and, when red.ndim == 0, the last run % V elements are the scalar
//     `tail`; vec_store (col) says y may be written in packs too (y aligned, inner_ys == 1, outer
//     y strides multiples of V).  VEC = false reads one element per unit (nvec = run, tail = 0).
//   SIMPLE = true: every offset is idx * stride, no unravelling: outer.ndim <= 1 and red.ndim == 0
//     (row) / red.ndim <= 1 (col).  Unused group entries are packed as size 1, strides 0.
// Row: units = red.numel * nvec.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define RS_BLOCK 256      // threads per block of every kernel here
#define RS_MAX_DIMS 8     // dims per group after collapsing
#define RS_UNROLL 4       // loads in flight per thread in the best kernels
// Resident blocks per SM the best kernels are built for (a host may override them with -D: the
// cupy backend's GRADORACLE_CUPY_RS; 1 = no bound).  4 = at most 64 registers: rs_row_team then
// holds 32 warps per SM (4096 segments of 32-lane teams fit one wave on an H100); rs_col's
// SIMPLE instantiations fit without spills (the general ones would spill, so they keep none).
#ifndef RS_TEAM_MIN_BLOCKS
#define RS_TEAM_MIN_BLOCKS 4
#endif
#ifndef RS_COL_MIN_BLOCKS
#define RS_COL_MIN_BLOCKS 4
#endif

struct RSGroup {
  long long ndim;                 // dims in use, 0..RS_MAX_DIMS
  long long numel;                // product of size[0..ndim) (1 when ndim == 0)
  long long size[RS_MAX_DIMS];    // outer -> inner; unused entries are 1
  long long xs[RS_MAX_DIMS];      // x strides (elements); unused entries 0
  long long ys[RS_MAX_DIMS];      // y strides (elements; 0 for reduced dims)
};

struct RSParams {
  RSGroup outer;        // row: every kept dim (segments); col: kept dims but inner
  RSGroup red;          // row: reduced dims but the run; col: every reduced dim (rows)
  long long nseg;       // row: segments = outer.numel
  long long run;        // row: elements per run; col: 1
  long long run_xs;     // row: x stride of the run's elements
  long long nvec;       // row: units per run
  long long units;      // row: units per segment (red.numel * nvec)
  long long tail;       // row, VEC, red.ndim == 0: scalar elements after the packs
  long long inner;      // col: columns; row: 1
  long long inner_xs;   // col: x stride of a column step
  long long inner_ys;   // col: y stride of a column step
  long long lanes;      // row team: lanes per segment; col: lanes along inner (powers of two)
  long long lanes_log2;
  long long nchunk;     // row block: blocks per segment; col: row chunks per column tile
  long long chunk;      // col: rows per chunk
  long long ctiles;     // col: column tiles per outer element
  long long ntiles;     // row block: nseg * nchunk; col: outer.numel * ctiles * nchunk
  long long vec_store;  // col, VEC: y stores may be 16-byte packs
};

#define RS_GROUP_WORDS (2 + 3 * RS_MAX_DIMS)
#define RS_PARAMS_WORDS (2 * RS_GROUP_WORDS + 16)
static_assert(sizeof(RSGroup) == RS_GROUP_WORDS * 8, "RSGroup must be packed long longs");
static_assert(sizeof(RSParams) == RS_PARAMS_WORDS * 8, "RSParams must be packed long longs");

// ============================================================================ element types

template <typename T> struct RSAcc { typedef float type; };
template <> struct RSAcc<double> { typedef double type; };
template <typename T> using rs_acc_t = typename RSAcc<T>::type;

__device__ __forceinline__ float rs_to_acc(float x) { return x; }
__device__ __forceinline__ double rs_to_acc(double x) { return x; }
__device__ __forceinline__ float rs_to_acc(__half x) { return __half2float(x); }
__device__ __forceinline__ float rs_to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }

// Rounds an accumulator to the output type (once, round to nearest even).
__device__ __forceinline__ void rs_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void rs_store(double* p, double v) { *p = v; }
__device__ __forceinline__ void rs_store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void rs_store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

template <typename T> __device__ __forceinline__ T rs_round(rs_acc_t<T> v);
template <> __device__ __forceinline__ float rs_round<float>(float v) { return v; }
template <> __device__ __forceinline__ double rs_round<double>(double v) { return v; }
template <> __device__ __forceinline__ __half rs_round<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 rs_round<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// V elements of T: one 16-byte access when V = 16 / sizeof(T), one element when V = 1.
template <typename T, int V> struct alignas(sizeof(T) * V) RSVec { T v[V]; };
template <typename T, bool VEC> struct RSWidth { static constexpr int value = VEC ? 16 / (int)sizeof(T) : 1; };

__device__ __forceinline__ long long rs_min(long long a, long long b) { return a < b ? a : b; }

// ============================================================================ the ladder

template <typename TI>
__device__ __forceinline__ rs_acc_t<TI> rs_load_or_zero(const TI* in, long long i, long long n) {
  return i < n ? rs_to_acc(in[i]) : rs_acc_t<TI>(0);
}

template <typename TI, typename TO>
__global__ void __launch_bounds__(RS_BLOCK)
rs_v0(const TI* __restrict__ in, TO* __restrict__ out, long long n, long long seg_stride, long long seg0) {
  typedef rs_acc_t<TI> A;
  __shared__ A sdata[RS_BLOCK];
  const unsigned int tid = threadIdx.x;
  const long long seg = seg0 + blockIdx.y;
  const long long i = (long long)blockIdx.x * blockDim.x + tid;
  sdata[tid] = rs_load_or_zero(in + seg * seg_stride, i, n);
  __syncthreads();
  for (unsigned int s = 1; s < blockDim.x; s *= 2) {
    if (tid % (2 * s) == 0) sdata[tid] += sdata[tid + s];
    __syncthreads();
  }
  if (tid == 0) rs_store(out + seg * gridDim.x + blockIdx.x, sdata[0]);
}

template <typename TI, typename TO>
__global__ void __launch_bounds__(RS_BLOCK)
rs_v1(const TI* __restrict__ in, TO* __restrict__ out, long long n, long long seg_stride, long long seg0) {
  typedef rs_acc_t<TI> A;
  __shared__ A sdata[RS_BLOCK];
  const unsigned int tid = threadIdx.x;
  const long long seg = seg0 + blockIdx.y;
  const long long i = (long long)blockIdx.x * blockDim.x + tid;
  sdata[tid] = rs_load_or_zero(in + seg * seg_stride, i, n);
  __syncthreads();
  for (unsigned int s = 1; s < blockDim.x; s *= 2) {
    const unsigned int index = 2 * s * tid;
    if (index < blockDim.x) sdata[index] += sdata[index + s];
    __syncthreads();
  }
  if (tid == 0) rs_store(out + seg * gridDim.x + blockIdx.x, sdata[0]);
}

template <typename TI, typename TO>
__global__ void __launch_bounds__(RS_BLOCK)
rs_v2(const TI* __restrict__ in, TO* __restrict__ out, long long n, long long seg_stride, long long seg0) {
  typedef rs_acc_t<TI> A;
  __shared__ A sdata[RS_BLOCK];
  const unsigned int tid = threadIdx.x;
  const long long seg = seg0 + blockIdx.y;
  const long long i = (long long)blockIdx.x * blockDim.x + tid;
  sdata[tid] = rs_load_or_zero(in + seg * seg_stride, i, n);
  __syncthreads();
  for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (tid < s) sdata[tid] += sdata[tid + s];
    __syncthreads();
  }
  if (tid == 0) rs_store(out + seg * gridDim.x + blockIdx.x, sdata[0]);
}

template <typename TI, typename TO>
__global__ void __launch_bounds__(RS_BLOCK)
rs_v3(const TI* __restrict__ in, TO* __restrict__ out, long long n, long long seg_stride, long long seg0) {
  typedef rs_acc_t<TI> A;
  __shared__ A sdata[RS_BLOCK];
  const unsigned int tid = threadIdx.x;
  const long long seg = seg0 + blockIdx.y;
  const TI* s_in = in + seg * seg_stride;
  const long long i = (long long)blockIdx.x * (blockDim.x * 2) + tid;
  sdata[tid] = rs_load_or_zero(s_in, i, n) + rs_load_or_zero(s_in, i + blockDim.x, n);
  __syncthreads();
  for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (tid < s) sdata[tid] += sdata[tid + s];
    __syncthreads();
  }
  if (tid == 0) rs_store(out + seg * gridDim.x + blockIdx.x, sdata[0]);
}

// The last six steps of v4's tree, one warp, no block barrier.  Each step reads, then
// __syncwarp()s before any lane writes, so no lane reads a slot another lane is rewriting.
template <typename A>
__device__ __forceinline__ void rs_warp_unrolled(volatile A* cache, unsigned int tid) {
  A v = cache[tid];
#pragma unroll
  for (unsigned int s = 32; s > 0; s >>= 1) {
    v += cache[tid + s];
    __syncwarp();
    cache[tid] = v;
    __syncwarp();
  }
}

template <typename TI, typename TO>
__global__ void __launch_bounds__(RS_BLOCK)
rs_v4(const TI* __restrict__ in, TO* __restrict__ out, long long n, long long seg_stride, long long seg0) {
  typedef rs_acc_t<TI> A;
  __shared__ A sdata[RS_BLOCK];
  const unsigned int tid = threadIdx.x;
  const long long seg = seg0 + blockIdx.y;
  const TI* s_in = in + seg * seg_stride;
  const long long i = (long long)blockIdx.x * (blockDim.x * 2) + tid;
  sdata[tid] = rs_load_or_zero(s_in, i, n) + rs_load_or_zero(s_in, i + blockDim.x, n);
  __syncthreads();
  for (unsigned int s = blockDim.x / 2; s > 32; s >>= 1) {
    if (tid < s) sdata[tid] += sdata[tid + s];
    __syncthreads();
  }
  if (tid < 32) rs_warp_unrolled<A>(sdata, tid);
  if (tid == 0) rs_store(out + seg * gridDim.x + blockIdx.x, sdata[0]);
}

// Butterfly sum over the `width` (power of two <= 32) lanes of each aligned lane group: every
// lane of the group gets the same fixed-order result.  All 32 lanes of the warp must call it.
template <typename A>
__device__ __forceinline__ A rs_lanes_sum(A v, int width) {
  for (int mask = width >> 1; mask >= 1; mask >>= 1) v += __shfl_xor_sync(0xffffffffu, v, mask);
  return v;
}

template <typename TI, typename TO>
__global__ void __launch_bounds__(RS_BLOCK)
rs_v5(const TI* __restrict__ in, TO* __restrict__ out, long long n, long long seg_stride, long long seg0) {
  typedef rs_acc_t<TI> A;
  constexpr int kWarps = RS_BLOCK / 32;
  __shared__ A warp_sums[kWarps];
  const unsigned int tid = threadIdx.x;
  const long long seg = seg0 + blockIdx.y;
  const TI* s_in = in + seg * seg_stride;
  const long long i = (long long)blockIdx.x * (blockDim.x * 2) + tid;
  A sum = rs_load_or_zero(s_in, i, n) + rs_load_or_zero(s_in, i + blockDim.x, n);
  const int warp = tid / 32, lane = tid % 32;
  sum = rs_lanes_sum(sum, 32);
  if (lane == 0) warp_sums[warp] = sum;
  __syncthreads();
  sum = lane < kWarps ? warp_sums[lane] : A(0);
  if (warp == 0) sum = rs_lanes_sum(sum, kWarps);
  if (tid == 0) rs_store(out + seg * gridDim.x + blockIdx.x, sum);
}

// ============================================================================ best: index math

// x (and y) offsets of element `idx` of group g (row-major, last dim fastest).  One dim needs
// no division; groups under 2**32 elements use 32-bit division.
__device__ __forceinline__ void rs_offsets(const RSGroup& g, long long idx, long long& xo, long long& yo) {
  xo = 0;
  yo = 0;
  if (g.ndim == 0) return;
  if (g.ndim == 1) {
    xo = idx * g.xs[0];
    yo = idx * g.ys[0];
  } else if (g.numel <= 0xffffffffLL) {
    unsigned int i = (unsigned int)idx;
#pragma unroll 1
    for (int d = (int)g.ndim - 1; d >= 0; --d) {
      const unsigned int n = (unsigned int)g.size[d];
      const unsigned int q = d > 0 ? i / n : 0u;
      const unsigned int r = i - q * n;
      xo += (long long)r * g.xs[d];
      yo += (long long)r * g.ys[d];
      i = q;
    }
  } else {
    long long i = idx;
#pragma unroll 1
    for (int d = (int)g.ndim - 1; d >= 0; --d) {
      const long long q = d > 0 ? i / g.size[d] : 0;
      const long long r = i - q * g.size[d];
      xo += r * g.xs[d];
      yo += r * g.ys[d];
      i = q;
    }
  }
}

// SIMPLE: the group has at most one dim (the host packs unused strides as 0), so the offsets
// are idx * stride; the general path unravels.
template <bool SIMPLE>
__device__ __forceinline__ void rs_offsets_of(const RSGroup& g, long long idx, long long& xo, long long& yo) {
  if (SIMPLE) {
    xo = idx * g.xs[0];
    yo = idx * g.ys[0];
  } else {
    rs_offsets(g, idx, xo, yo);
  }
}

template <bool SIMPLE>
__device__ __forceinline__ long long rs_x_offset(const RSGroup& g, long long idx) {
  if (SIMPLE || g.ndim == 1) return idx * g.xs[0];
  long long xo, yo;
  rs_offsets(g, idx, xo, yo);
  return xo;
}

// Row mode: x offset (from the segment's start) of unit u.  SIMPLE: red.ndim == 0 (one run).
template <typename T, bool VEC, bool SIMPLE>
__device__ __forceinline__ long long rs_unit_offset(const RSParams& p, long long u) {
  constexpr int V = RSWidth<T, VEC>::value;
  const long long step = VEC ? (long long)V : p.run_xs;
  if (SIMPLE || p.red.ndim == 0) return u * step;
  long long ro, v;
  if (p.units <= 0xffffffffLL) {
    const unsigned int uu = (unsigned int)u, n = (unsigned int)p.nvec, q = uu / n;
    ro = q;
    v = uu - q * n;
  } else {
    ro = u / p.nvec;
    v = u - ro * p.nvec;
  }
  return rs_x_offset<false>(p.red, ro) + v * step;
}

template <typename T, int V>
__device__ __forceinline__ void rs_add(rs_acc_t<T>& acc, const RSVec<T, V>& pk) {
#pragma unroll
  for (int e = 0; e < V; ++e) acc += rs_to_acc(pk.v[e]);
}

// Row mode: the sum of units first, first + step, ... of the segment starting at xs, RS_UNROLL
// loads in flight, then (with_tail) the scalar tail elements first, first + step, ...
template <typename T, bool VEC, bool SIMPLE>
__device__ __forceinline__ rs_acc_t<T> rs_sum_units(const RSParams& p, const T* __restrict__ xs, long long first,
                                                     long long step, bool with_tail) {
  typedef rs_acc_t<T> A;
  constexpr int V = RSWidth<T, VEC>::value;
  A acc = A(0);
  for (long long u0 = first; u0 < p.units; u0 += step * RS_UNROLL) {
    RSVec<T, V> pk[RS_UNROLL];
    bool ok[RS_UNROLL];
#pragma unroll
    for (int r = 0; r < RS_UNROLL; ++r) {  // loads first, for memory-level parallelism
      const long long u = u0 + r * step;
      ok[r] = u < p.units;
      if (ok[r]) pk[r] = *reinterpret_cast<const RSVec<T, V>*>(xs + rs_unit_offset<T, VEC, SIMPLE>(p, u));
    }
#pragma unroll
    for (int r = 0; r < RS_UNROLL; ++r)
      if (ok[r]) rs_add<T, V>(acc, pk[r]);
  }
  if (VEC && with_tail) {
    const T* t0 = xs + p.nvec * V;
    for (long long e = first; e < p.tail; e += step) acc += rs_to_acc(t0[e]);
  }
  return acc;
}

// Sum over the block (RS_BLOCK threads), fixed order; the result is valid in thread 0.  Starts
// with a barrier, so scratch (RS_BLOCK / 32 entries) may be reused call after call.
template <typename A>
__device__ __forceinline__ A rs_block_sum(A v, A* scratch) {
  constexpr int kWarps = RS_BLOCK / 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  v = rs_lanes_sum(v, 32);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < kWarps ? scratch[lane] : A(0);
  if (warp == 0) v = rs_lanes_sum(v, kWarps);
  return v;
}

// ============================================================================ best: row mode

template <typename T, bool VEC, bool SIMPLE>
__global__ void __launch_bounds__(RS_BLOCK, RS_TEAM_MIN_BLOCKS)
rs_row_team(const __grid_constant__ RSParams p, const T* __restrict__ x, T* __restrict__ y) {
  typedef rs_acc_t<T> A;
  const int lg = (int)p.lanes_log2, width = 1 << lg;
  const int tid = threadIdx.x, lane = tid & (width - 1);
  const long long per_block = RS_BLOCK >> lg;
  const long long team = (long long)blockIdx.x * per_block + (tid >> lg);
  const long long warp_team0 = (long long)blockIdx.x * per_block + ((tid & ~31) >> lg);  // lane 0's team
  const long long nteams = (long long)gridDim.x * per_block;
  // Warp-uniform trip count (the shuffle needs all 32 lanes): s0 is the warp's first team's segment.
  for (long long s0 = warp_team0; s0 < p.nseg; s0 += nteams) {
    const long long seg = s0 + (team - warp_team0);
    const bool valid = seg < p.nseg;
    A acc = A(0);
    long long xo = 0, yo = 0;
    if (valid) {
      rs_offsets_of<SIMPLE>(p.outer, seg, xo, yo);
      acc = rs_sum_units<T, VEC, SIMPLE>(p, x + xo, lane, width, true);
    }
    acc = rs_lanes_sum(acc, width);
    if (valid && lane == 0) rs_store(y + yo, acc);
  }
}

// The last-block finish: the calling block's partial (thread 0's `v`) goes to part[slot]; the
// block that takes the last ticket of `counter` sums part[first .. first + n) in order and
// returns true with the sum in thread 0's `v`.  Block-uniform; every thread must call it.
template <typename A>
__device__ __forceinline__ bool rs_finish_row(A& v, A* __restrict__ part, unsigned int* __restrict__ ticket,
                                              long long slot, long long first, long long n, A* scratch,
                                              unsigned int* s_last) {
  if (threadIdx.x == 0) {
    part[slot] = v;
    __threadfence();  // the partial is visible device-wide before the ticket is taken
    const unsigned int t = atomicAdd(ticket, 1u);
    *s_last = t == (unsigned int)(n - 1);
    __threadfence();
  }
  __syncthreads();
  if (!*s_last) return false;
  A s = A(0);
  for (long long c = threadIdx.x; c < n; c += RS_BLOCK) s += __ldcg(part + first + c);  // L2: other SMs wrote them
  v = rs_block_sum(s, scratch);
  if (threadIdx.x == 0) *ticket = 0u;  // re-armed for the next launch
  return true;
}

template <typename T, bool VEC, bool SIMPLE>
__global__ void __launch_bounds__(RS_BLOCK)
rs_row_block(const __grid_constant__ RSParams p, const T* __restrict__ x, T* __restrict__ y,
             rs_acc_t<T>* __restrict__ part, unsigned int* __restrict__ ticket) {
  typedef rs_acc_t<T> A;
  __shared__ A scratch[RS_BLOCK / 32];
  __shared__ unsigned int s_last;
  const int tid = threadIdx.x;
  for (long long t = blockIdx.x; t < p.ntiles; t += gridDim.x) {
    const long long seg = t / p.nchunk, c = t - seg * p.nchunk;
    long long xo, yo;
    rs_offsets_of<SIMPLE>(p.outer, seg, xo, yo);
    A v = rs_sum_units<T, VEC, SIMPLE>(p, x + xo, c * RS_BLOCK + tid, p.nchunk * RS_BLOCK, c == 0);
    v = rs_block_sum(v, scratch);
    if (p.nchunk == 1) {
      if (tid == 0) rs_store(y + yo, v);
    } else if (rs_finish_row(v, part, ticket + seg, t, seg * p.nchunk, p.nchunk, scratch, &s_last)) {
      if (tid == 0) rs_store(y + yo, v);
    }
    __syncthreads();  // s_last is read by every thread before the next tile rewrites it
  }
}

// ============================================================================ best: column mode

// Sum over the nw row slots of the block (thread (w, lane) = tid = w * lanes + lane), for V
// values per thread, fixed-order tree; slot w == 0 gets the sums.  Every thread must call it.
template <typename A, int V>
__device__ __forceinline__ void rs_slots_sum(A (&v)[V], A (*red)[RS_BLOCK], int tid, int w, int nw, int lanes) {
  if (nw == 1) return;
#pragma unroll
  for (int e = 0; e < V; ++e) red[e][tid] = v[e];
  __syncthreads();
  for (int s = nw >> 1; s > 0; s >>= 1) {
    if (w < s) {
#pragma unroll
      for (int e = 0; e < V; ++e) red[e][tid] += red[e][tid + s * lanes];
    }
    __syncthreads();
  }
#pragma unroll
  for (int e = 0; e < V; ++e) v[e] = red[e][tid];  // final only for w == 0
}

// Writes thread (0, lane)'s V column sums to y (columns i0 .. i0 + V - 1, those < inner).
template <typename T, bool VEC>
__device__ __forceinline__ void rs_col_store(const RSParams& p, T* __restrict__ y, long long yo, long long i0,
                                             const rs_acc_t<T> (&v)[RSWidth<T, VEC>::value]) {
  constexpr int V = RSWidth<T, VEC>::value;
  if (VEC && p.vec_store) {
    RSVec<T, V> pk;
#pragma unroll
    for (int e = 0; e < V; ++e) pk.v[e] = rs_round<T>(v[e]);
    *reinterpret_cast<RSVec<T, V>*>(y + yo + i0) = pk;
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e)
      if (VEC || i0 + e < p.inner) rs_store(y + yo + (i0 + e) * p.inner_ys, v[e]);
  }
}

template <typename T, bool VEC, bool SIMPLE>
__global__ void __launch_bounds__(RS_BLOCK, SIMPLE ? RS_COL_MIN_BLOCKS : 1)
rs_col(const __grid_constant__ RSParams p, const T* __restrict__ x, T* __restrict__ y,
       rs_acc_t<T>* __restrict__ part, unsigned int* __restrict__ ticket) {
  typedef rs_acc_t<T> A;
  constexpr int V = RSWidth<T, VEC>::value;
  __shared__ A red[V][RS_BLOCK];
  __shared__ unsigned int s_last;
  const int tid = threadIdx.x, lg = (int)p.lanes_log2, lanes = 1 << lg;
  const int lane = tid & (lanes - 1), w = tid >> lg, nw = RS_BLOCK >> lg;
  const long long tc = (long long)lanes * V;  // columns per tile

  for (long long t = blockIdx.x; t < p.ntiles; t += gridDim.x) {
    const long long tile = t / p.nchunk, c = t - tile * p.nchunk;
    const long long o = tile / p.ctiles, ct = tile - o * p.ctiles;
    long long xo, yo;
    rs_offsets_of<SIMPLE>(p.outer, o, xo, yo);
    const long long i0 = ct * tc + (long long)lane * V;  // this thread's first column
    const bool cols = i0 < p.inner;
    const T* xc = x + xo + i0 * p.inner_xs;
    A acc[V];
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] = A(0);

    if (cols) {
      const long long r_lo = c * p.chunk, r_hi = rs_min(p.red.numel, r_lo + p.chunk);
      for (long long r0 = r_lo + w; r0 < r_hi; r0 += (long long)nw * RS_UNROLL) {
        RSVec<T, V> pk[RS_UNROLL];
        bool ok[RS_UNROLL];
#pragma unroll
        for (int k = 0; k < RS_UNROLL; ++k) {  // loads of RS_UNROLL rows first
          const long long r = r0 + (long long)k * nw;
          ok[k] = r < r_hi;
          if (ok[k]) pk[k] = *reinterpret_cast<const RSVec<T, V>*>(xc + rs_x_offset<SIMPLE>(p.red, r));
        }
#pragma unroll
        for (int k = 0; k < RS_UNROLL; ++k) {
          if (!ok[k]) continue;
#pragma unroll
          for (int e = 0; e < V; ++e) acc[e] += rs_to_acc(pk[k].v[e]);
        }
      }
    }

    rs_slots_sum<A, V>(acc, red, tid, w, nw, lanes);
    if (p.nchunk == 1) {
      if (w == 0 && cols) rs_col_store<T, VEC>(p, y, yo, i0, acc);
      continue;  // the next tile's first barrier orders the reuse of red
    }
    // Several row chunks: partial row c of this tile, then the last block sums the tile's rows.
    A* tile_part = part + tile * p.nchunk * tc;
    if (w == 0) {
#pragma unroll
      for (int e = 0; e < V; ++e) tile_part[c * tc + lane * V + e] = acc[e];
      __threadfence();
    }
    __syncthreads();
    if (tid == 0) {
      const unsigned int got = atomicAdd(ticket + tile, 1u);
      s_last = got == (unsigned int)(p.nchunk - 1);
      __threadfence();
    }
    __syncthreads();
    if (s_last) {
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] = A(0);
      for (long long cc = w; cc < p.nchunk; cc += nw) {
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] += __ldcg(tile_part + cc * tc + lane * V + e);
      }
      rs_slots_sum<A, V>(acc, red, tid, w, nw, lanes);
      if (w == 0 && cols) rs_col_store<T, VEC>(p, y, yo, i0, acc);
      if (tid == 0) ticket[tile] = 0u;  // re-armed for the next launch
    }
    __syncthreads();  // s_last is read by every thread before the next tile rewrites it
  }
}
