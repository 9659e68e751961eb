// conv_backward_weight (wgrad) as an implicit GEMM, on tensor cores for bf16 / f16.
//
//   dw[co, c, k] = sum_{n, o < O} dy[n, co, o] * x[n, first(co) + c, o*s + k*d - p]
//
// Per tap and group the GEMM is rows = the group's Cout/g output channels, cols = its Cin/g input
// channels, reduction = the N * prod(O) (n, o) pairs.  The reduction is long, so it is split in
// `splits` chunks of `chunk` pairs: each block writes its tile's fp32 (fp64 for f64) partial sums
// to a workspace, and cv_wgrad_finish adds the chunks in chunk order (no atomics: deterministic).
// With one chunk the block writes dw itself.
//
// Launch contract (plan: backends/_plans/conv_cuda.py `wgrad_plan`):
//   cv_wgrad<T, BM>     grid (mblocks * cblocks, taps * groups * splits), CV_THREADS threads, tiles of
//                       BM output channels (64 or 128 on tensor cores, 64 SIMT) x CV_BN input channels;
//                       ws: the workspace [splits][Cout][taps][Cin/g] (null when splits == 1).
//   cv_wgrad_taps<T, BM> (small Cin, groups == 1: every tap in one GEMM) grid (mblocks * cblocks, splits),
//                       the columns (tap, ci) pairs: see the kernel.
//   cv_wgrad_finish<T>  grid-stride over the Cout * taps * Cin/g elements: the chunks' sum, cast, stored.
//   The pair index r -> (n, od, oh, ow) is a fast divmod by O (ConvParams.magic).
#pragma once

#include "conv_common.cuh"

// Pair r (an index into the N * prod(O) reduction) -> (n, od, oh, ow), by the fast divmod by O.
__device__ __forceinline__ void cv_wgrad_pair(const ConvParams& p, long long r, int& n, int& od, int& oh, int& ow) {
  int q;
  cv_divmod<true>((int)r, (int)p.out[2], (unsigned)p.magic[0], (unsigned)p.magic[1], q, ow);
  cv_divmod<true>(q, (int)p.out[1], (unsigned)p.magic[2], (unsigned)p.magic[3], q, oh);
  cv_divmod<true>(q, (int)p.out[0], (unsigned)p.magic[4], (unsigned)p.magic[5], n, od);
}

// Filter tap t (row-major over the kernel's (kd, kh, kw)) -> its coordinates.
__device__ __forceinline__ void cv_tap(const ConvParams& p, int t, int& kd, int& kh, int& kw) {
  kw = t % (int)p.k[2];
  kh = (t / (int)p.k[2]) % (int)p.k[1];
  kd = t / (int)(p.k[2] * p.k[1]);
}

// dw's element (co, ci, tap), through its strides.
__device__ __forceinline__ long long cv_dw_offset(const ConvParams& p, long long co, long long ci, int tap) {
  int kd, kh, kw;
  cv_tap(p, tap, kd, kh, kw);
  return co * p.sc[0] + ci * p.sc[1] + kd * p.sc[2] + kh * p.sc[3] + kw * p.sc[4];
}

// A block's result for dw[co, ci, tap]: its chunk's partial into the workspace [splits][Cout][taps][Cin/g]
// (cv_wgrad_finish adds them), or with no workspace (one chunk) dw itself.
template <typename T>
__device__ __forceinline__ void cv_wgrad_store(const ConvParams& p, T* dw, typename CvType<T>::Acc* ws, int split,
                                               long long co, long long ci, int tap, typename CvType<T>::Acc v) {
  if (ws != nullptr)
    ws[split * (p.cout * p.taps * p.cig) + (co * p.taps + tap) * p.cig + ci] = v;
  else
    dw[cv_dw_offset(p, co, ci, tap)] = CvType<T>::from(v);
}

// One step's tiles (cv_wgrad, cv_wgrad_taps): A(m, kk) = dy at pair kk (offset ry[kk], -1: none) and
// output channel co_first + m, zero from row `rows` on; B(c, kk) = b(c, kk).  Channels-first: pairs
// fastest across the threads (thread tid keeps pair tid % BK), K-major tiles As[m][kk], Bs[c][kk].
// Channels-last: channels fastest, so on tensor cores the tiles are MN-major (As[kk][m], Bs[kk][c]:
// consecutive threads store consecutive elements; K-major stores there were a row of LDS apart, a
// 4-way bank conflict on every store: 237M on the Cin=3 stem, `harness profile`); cv_wgrad_step
// reads them with ldmatrix.trans.  SIMT types keep K-major (the SIMT step reads no other layout).
//
// Loads go out CV_GATHER at a time ahead of their stores (cv_gather): one element at a time, each load
// behind its bounds branch in a loop of run-time length, they went out one after another, and the
// stem's wgrad waited on them (long scoreboard 52.6% at 2% of DRAM bandwidth, `harness profile`).
template <typename T, int BM, typename B>
__device__ __forceinline__ void cv_wgrad_load(const ConvParams& p, const T* __restrict__ dy, const long long* ry,
                                              long long co_first, int rows, T* As, T* Bs, B b) {
  constexpr int LDS = CV_LDS(T);
  constexpr bool MN = CvType<T>::kTC;  // channels-last tiles MN-major
  constexpr int LDTA = CvTile<T, BM>::LDTA, LDTB = CvTile<T, BM>::LDTB;
  static_assert(!MN || (CV_BK * LDTA <= BM * LDS && CV_BK * LDTB <= CV_BN * LDS), "MN-major tiles fit the arrays");
  const int tid = threadIdx.x;
  if (p.cfast) {  // a tile's element e: channel e % width, pair e / width
    cv_gather<BM * CV_BK>(
        [&](int i) {
          const int e = tid + i * CV_THREADS, c = e % BM, kk = e / BM;
          return ry[kk] >= 0 && c < rows ? dy[ry[kk] + (co_first + c) * p.sa[1]] : cv_zero<T>();
        },
        [&](int i, T v) {
          const int e = tid + i * CV_THREADS, c = e % BM, kk = e / BM;
          As[MN ? kk * LDTA + c : c * LDS + kk] = v;
        });
    cv_gather<CV_BN * CV_BK>([&](int i) { const int e = tid + i * CV_THREADS; return b(e % CV_BN, e / CV_BN); },
                  [&](int i, T v) {
                    const int e = tid + i * CV_THREADS, c = e % CV_BN, kk = e / CV_BN;
                    Bs[MN ? kk * LDTB + c : c * LDS + kk] = v;
                  });
  } else {  // pair tid % BK, channels tid / BK + i * (THREADS / BK)
    constexpr int STEP = CV_THREADS / CV_BK;
    const int kk = tid % CV_BK, c0 = tid / CV_BK;
    const long long oy = ry[kk];
    cv_gather<BM * CV_BK>(
        [&](int i) {
          const int c = c0 + i * STEP;
          return oy >= 0 && c < rows ? dy[oy + (co_first + c) * p.sa[1]] : cv_zero<T>();
        },
        [&](int i, T v) { As[(c0 + i * STEP) * LDS + kk] = v; });
    cv_gather<CV_BN * CV_BK>([&](int i) { return b(c0 + i * STEP, kk); },
                  [&](int i, T v) { Bs[(c0 + i * STEP) * LDS + kk] = v; });
  }
}

// acc += A * B^T of the tiles cv_wgrad_load stored (MN-major on tensor cores when channels-last).
template <typename T, int BM>
__device__ __forceinline__ void cv_wgrad_step(const ConvParams& p, CvTile<T, BM>& tile, const T* As, const T* Bs) {
  if constexpr (CvType<T>::kTC) {
    if (p.cfast) {
      tile.template step<true, true>(As, Bs);
      return;
    }
  }
  tile.step(As, Bs);
}

template <typename T, int BM>
__global__ void __launch_bounds__(CV_THREADS)
    cv_wgrad(const ConvParams p, const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dw,
             typename CvType<T>::Acc* __restrict__ ws) {
  typedef typename CvType<T>::Acc Acc;
  constexpr int LDS = CV_LDS(T);
  const int tid = threadIdx.x;
  const int splits = (int)p.splits, groups = (int)p.groups;
  const int split = blockIdx.y % splits, rest = blockIdx.y / splits;
  const int g = rest % groups, tap = rest / groups;
  const int mb = blockIdx.x / (int)p.cblocks, cb = blockIdx.x % (int)p.cblocks;
  int kd, kh, kw;
  cv_tap(p, tap, kd, kh, kw);
  const long long r_begin = split * p.chunk;
  const long long r_end = r_begin + p.chunk < p.rows ? r_begin + p.chunk : p.rows;
  const int cog = (int)p.cog, cig = (int)p.cig;
  const int co0 = mb * BM, ci0 = cb * CV_BN;
  const long long co_first = (long long)g * cog + co0, ci_first = (long long)g * cig + ci0;

  CV_SHARED16 T As[BM * LDS];
  CV_SHARED16 T Bs[CV_BN * LDS];
  __shared__ long long ry[CV_BK], rx[CV_BK];  // per pair: dy and x offsets of (n, o); -1: none / padding

  CvTile<T, BM> tile;
  tile.clear();
  for (long long r0 = r_begin; r0 < r_end; r0 += CV_BK) {
    if (tid < CV_BK) {
      const long long r = r0 + tid;
      long long oy = -1, ox = -1;
      if (r < r_end) {
        int n, od, oh, ow;
        cv_wgrad_pair(p, r, n, od, oh, ow);
        oy = n * p.sa[0] + od * p.sa[2] + oh * p.sa[3] + ow * p.sa[4];
        const long long id = od * p.s[0] + kd * p.d[0] - p.p[0];
        const long long ih = oh * p.s[1] + kh * p.d[1] - p.p[1];
        const long long iw = ow * p.s[2] + kw * p.d[2] - p.p[2];
        if (id >= 0 && id < p.in[0] && ih >= 0 && ih < p.in[1] && iw >= 0 && iw < p.in[2])
          ox = n * p.sb[0] + id * p.sb[2] + ih * p.sb[3] + iw * p.sb[4];
      }
      ry[tid] = oy;
      rx[tid] = ox;
    }
    __syncthreads();
    // A: As[co][pair] from dy; B: Bs[ci][pair] from x; zero-filled past the tile's channels and pairs.
    cv_wgrad_load<T, BM>(p, dy, ry, co_first, cog - co0, As, Bs, [&](int c, int kk) {
      return rx[kk] >= 0 && ci0 + c < cig ? x[rx[kk] + (ci_first + c) * p.sb[1]] : cv_zero<T>();
    });
    __syncthreads();
    cv_wgrad_step<T, BM>(p, tile, As, Bs);
    __syncthreads();
  }

  tile.for_each([&](int r, int c, Acc v) {
    if (co0 + r < cog && ci0 + c < cig) cv_wgrad_store<T>(p, dw, ws, split, co_first + r, ci0 + c, tap, v);
  });
}

// Small Cin (groups == 1; the plan: Cin below MERGE_CIG_MAX, more than one tap): one GEMM for every
// tap, its columns the (tap, ci) pairs j = tap * Cin + ci, so the 64-wide column tile is not mostly
// padding and dy is read once per pair for all taps rather than once per tap.  Per block the
// columns' decoding (x's channel offset, the tap's offsets k * d) and per step the pairs' (dy's offset,
// n's offset in x, the window's origin o * s - p) sit in shared memory; a B element adds the two and
// reads x, or zero where the tap reads the padding.  Partials and finish as cv_wgrad.
//   cv_wgrad_taps<T, BM>  grid (mblocks * cblocks, splits), cblocks = ceil(taps * Cin / CV_BN).
template <typename T, int BM>
__global__ void __launch_bounds__(CV_THREADS)
    cv_wgrad_taps(const ConvParams p, const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dw,
                  typename CvType<T>::Acc* __restrict__ ws) {
  typedef typename CvType<T>::Acc Acc;
  const int tid = threadIdx.x, split = blockIdx.y;
  const int mb = blockIdx.x / (int)p.cblocks, cb = blockIdx.x % (int)p.cblocks;
  const long long r_begin = split * p.chunk;
  const long long r_end = r_begin + p.chunk < p.rows ? r_begin + p.chunk : p.rows;
  const int cout = (int)p.cout, cin = (int)p.cin, cols = (int)p.taps * cin;
  const int co0 = mb * BM, j0 = cb * CV_BN;

  CV_SHARED16 T As[BM * CV_LDS(T)];  // K-major tiles, as cv_wgrad's
  CV_SHARED16 T Bs[CV_BN * CV_LDS(T)];
  __shared__ long long ry[CV_BK], rx[CV_BK];  // per pair: dy's offset, n's in x; -1: past the chunk
  __shared__ int ro[3][CV_BK];                // per pair: o * s - p per spatial dim
  __shared__ long long cx[CV_BN];             // per column: x's channel offset; -1: past the columns
  __shared__ int ck[3][CV_BN];                // per column: its tap's k * d per spatial dim
  if (tid < CV_BN) {
    const int j = j0 + tid;
    int kd = 0, kh = 0, kw = 0;
    if (j < cols) cv_tap(p, j / cin, kd, kh, kw);
    cx[tid] = j < cols ? (j % cin) * p.sb[1] : -1;
    ck[0][tid] = kd * (int)p.d[0];
    ck[1][tid] = kh * (int)p.d[1];
    ck[2][tid] = kw * (int)p.d[2];
  }

  CvTile<T, BM> tile;
  tile.clear();
  for (long long r0 = r_begin; r0 < r_end; r0 += CV_BK) {
    if (tid < CV_BK) {
      const long long r = r0 + tid;
      int n = 0, od = 0, oh = 0, ow = 0;
      if (r < r_end) cv_wgrad_pair(p, r, n, od, oh, ow);
      ry[tid] = r < r_end ? n * p.sa[0] + od * p.sa[2] + oh * p.sa[3] + ow * p.sa[4] : -1;
      rx[tid] = r < r_end ? n * p.sb[0] : -1;
      ro[0][tid] = od * (int)p.s[0] - (int)p.p[0];
      ro[1][tid] = oh * (int)p.s[1] - (int)p.p[1];
      ro[2][tid] = ow * (int)p.s[2] - (int)p.p[2];
    }
    __syncthreads();
    cv_wgrad_load<T, BM>(p, dy, ry, co0, cout - co0, As, Bs, [&](int c, int kk) {
      const int id = ro[0][kk] + ck[0][c], ih = ro[1][kk] + ck[1][c], iw = ro[2][kk] + ck[2][c];
      const bool in = id >= 0 && id < p.in[0] && ih >= 0 && ih < p.in[1] && iw >= 0 && iw < p.in[2];
      return rx[kk] >= 0 && cx[c] >= 0 && in ? x[rx[kk] + cx[c] + id * p.sb[2] + ih * p.sb[3] + iw * p.sb[4]]
                                             : cv_zero<T>();
    });
    __syncthreads();
    cv_wgrad_step<T, BM>(p, tile, As, Bs);
    __syncthreads();
  }

  tile.for_each([&](int r, int c, Acc v) {
    const int j = j0 + c;
    if (co0 + r < cout && j < cols) cv_wgrad_store<T>(p, dw, ws, split, co0 + r, j % cin, j / cin, v);
  });
}

// The channels-last fast path (16-bit types; the plan checks: dy's and x's channel stride 1, Cout/g
// and Cin/g multiples of 8, every other stride a multiple of 8 and the pointers 16-byte aligned):
// both tiles MN-major (row = a (n, o) pair, 8 channels per 16-byte cp.async), CV_STAGES deep,
// zero-filled past the pairs, the channels and where the tap reads the padding; fragments by
// ldmatrix.trans.  The pairs' offsets are decoded once per step (fast divmod), ahead of the copies.
template <typename T, int BM>
__global__ void __launch_bounds__(CV_THREADS)
    cv_wgrad_vec(const ConvParams p, const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dw,
                 typename CvType<T>::Acc* __restrict__ ws) {
  typedef typename CvType<T>::Acc Acc;
  const int tid = threadIdx.x;
  const int splits = (int)p.splits, groups = (int)p.groups;
  const int split = blockIdx.y % splits, rest = blockIdx.y / splits;
  const int g = rest % groups, tap = rest / groups;
  const int mb = blockIdx.x / (int)p.cblocks, cb = blockIdx.x % (int)p.cblocks;
  int kd, kh, kw;
  cv_tap(p, tap, kd, kh, kw);
  const long long r_begin = split * p.chunk;
  const long long r_end = r_begin + p.chunk < p.rows ? r_begin + p.chunk : p.rows;
  const int cog = (int)p.cog, cig = (int)p.cig;
  const int co0 = mb * BM, ci0 = cb * CV_BN;
  const long long co_first = (long long)g * cog + co0, ci_first = (long long)g * cig + ci0;

  constexpr int LDTA = CvTile<T, BM>::LDTA, LDTB = CvTile<T, BM>::LDTB;
  CV_SHARED16 T As[CV_STAGES][CV_BK * LDTA];
  CV_SHARED16 T Bs[CV_STAGES][CV_BK * LDTB];
  const int nsteps = (int)((r_end - r_begin + CV_BK - 1) / CV_BK);
  // The BK pairs of a step are decoded once, by threads 0..BK-1, three steps ahead of their copies:
  // ry / rx[step & 3][pair] = the pair's dy offset and its x offset at this tap (-1: past the
  // chunk, or the tap reads padding).  Slot (s + 3) & 3 is written after the barrier of step s and
  // read after the barrier of step s + 1; its previous reader issued its copies before step s's barrier.
  static_assert(CV_STAGES == 3, "ry / rx hold CV_STAGES + 1 = 4 steps");
  __shared__ long long ry[4][CV_BK], rx[4][CV_BK];
  auto prep = [&](int s) {
    if (tid < CV_BK) {
      const long long r = r_begin + (long long)s * CV_BK + tid;
      long long oy = -1, ox = -1;
      if (r < r_end) {
        int n, od, oh, ow;
        cv_wgrad_pair(p, r, n, od, oh, ow);
        oy = n * p.sa[0] + od * p.sa[2] + oh * p.sa[3] + ow * p.sa[4];
        const long long id = od * p.s[0] + kd * p.d[0] - p.p[0];
        const long long ih = oh * p.s[1] + kh * p.d[1] - p.p[1];
        const long long iw = ow * p.s[2] + kw * p.d[2] - p.p[2];
        if (id >= 0 && id < p.in[0] && ih >= 0 && ih < p.in[1] && iw >= 0 && iw < p.in[2])
          ox = n * p.sb[0] + id * p.sb[2] + ih * p.sb[3] + iw * p.sb[4];
      }
      ry[s & 3][tid] = oy;
      rx[s & 3][tid] = ox;
    }
  };
  // Thread tid copies, for pairs kk = tid / 16 + 8j (j < 4), A's 8 channels at (tid % 16) * 8 (when
  // inside the BM-row tile) and, when tid % 16 < 8, B's at (tid % 16) * 8.
  const int lc = tid & 15;
  const bool a_live = lc * 8 < BM && co0 + lc * 8 < cog, b_live = lc < 8 && ci0 + lc * 8 < cig;
  auto load = [&](int s, int stage) {
#pragma unroll
    for (int j = 0; j < CV_BK / 8; ++j) {
      const int kk = (tid >> 4) + 8 * j;
      const long long oy = ry[s & 3][kk], ox = rx[s & 3][kk];
      const T* sa = dy;
      const T* sb = x;
      int ba = 0, bb = 0;
      if (oy >= 0 && a_live) {
        sa = dy + oy + co_first + lc * 8;
        ba = 16;
      }
      if (ox >= 0 && b_live) {
        sb = x + ox + ci_first + lc * 8;
        bb = 16;
      }
      if (lc * 8 < BM) tc_cp_async16(&As[stage][kk * LDTA + lc * 8], sa, ba);
      if (lc < 8) tc_cp_async16(&Bs[stage][kk * LDTB + lc * 8], sb, bb);
    }
  };

  CvTile<T, BM> tile;
  tile.clear();
  // cv_pipeline's schedule (conv_common.cuh) with the decoding three steps ahead.
#pragma unroll
  for (int s = 0; s < CV_STAGES; ++s)
    if (s < nsteps) prep(s);
  __syncthreads();
#pragma unroll
  for (int s = 0; s < CV_STAGES - 1; ++s) {
    if (s < nsteps) load(s, s);
    tc_cp_commit();
  }
  int stage = 0;
  for (int s = 0; s < nsteps; ++s) {
    tc_cp_wait<CV_STAGES - 2>();
    __syncthreads();
    const int next = s + CV_STAGES - 1;
    if (next < nsteps) load(next, stage == 0 ? CV_STAGES - 1 : stage - 1);
    tc_cp_commit();
    if (s + CV_STAGES < nsteps) prep(s + CV_STAGES);
    tile.template step<true, true>(As[stage], Bs[stage]);
    stage = stage == CV_STAGES - 1 ? 0 : stage + 1;
  }
  tc_cp_wait<0>();

  tile.for_each([&](int r, int c, Acc v) {
    if (co0 + r < cog && ci0 + c < cig) cv_wgrad_store<T>(p, dw, ws, split, co_first + r, ci0 + c, tap, v);
  });
}

// Small channel groups (Cin/g * Cout/g below the plan's DIRECT_MAX; depthwise included): no GEMM
// tile.  A block of 256 threads = 32 output lanes (consecutive (co, ci) pairs j = co * Cin/g + ci,
// so consecutive output channels: coalesced dy reads in channels-last) x 8 reduction lanes; each
// thread sums its lane's pairs of the block's chunk, then the 8 lanes are added in a fixed order
// through shared memory.  Partials and finish as cv_wgrad.
//   cv_wgrad_dw<T>  grid (ceil(Cout * Cin/g / 32), taps * splits), 256 threads.
template <typename T>
__global__ void __launch_bounds__(256)
    cv_wgrad_dw(const ConvParams p, const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dw,
                typename CvType<T>::Acc* __restrict__ ws) {
  typedef typename CvType<T>::Acc Acc;
  const int lane = threadIdx.x & 31, rl = threadIdx.x >> 5;
  const int splits = (int)p.splits;
  const int split = blockIdx.y % splits, tap = blockIdx.y / splits;
  int kd, kh, kw;
  cv_tap(p, tap, kd, kh, kw);
  const int cig = (int)p.cig, cog = (int)p.cog;
  const long long j = (long long)blockIdx.x * 32 + lane;
  const bool live = j < p.cout * cig;
  const int co = live ? (int)(j / cig) : 0, ci = live ? (int)(j - (long long)co * cig) : 0;
  const long long cx = (long long)(co / cog) * cig + ci;  // x's channel
  const long long r_begin = split * p.chunk;
  const long long r_end = r_begin + p.chunk < p.rows ? r_begin + p.chunk : p.rows;
  Acc acc = Acc(0);
  if (live) {
    for (long long r = r_begin + rl; r < r_end; r += 8) {
      int n, od, oh, ow;
      cv_wgrad_pair(p, r, n, od, oh, ow);
      const long long id = od * p.s[0] + kd * p.d[0] - p.p[0];
      const long long ih = oh * p.s[1] + kh * p.d[1] - p.p[1];
      const long long iw = ow * p.s[2] + kw * p.d[2] - p.p[2];
      if (id < 0 || id >= p.in[0] || ih < 0 || ih >= p.in[1] || iw < 0 || iw >= p.in[2]) continue;
      acc += (Acc)cv_f(dy[n * p.sa[0] + od * p.sa[2] + oh * p.sa[3] + ow * p.sa[4] + co * p.sa[1]]) *
             (Acc)cv_f(x[n * p.sb[0] + id * p.sb[2] + ih * p.sb[3] + iw * p.sb[4] + cx * p.sb[1]]);
    }
  }
  __shared__ Acc part[8][32];
  part[rl][lane] = acc;
  __syncthreads();
  if (rl == 0 && live) {
    Acc s = part[0][lane];
#pragma unroll
    for (int k = 1; k < 8; ++k) s += part[k][lane];  // fixed order: deterministic
    cv_wgrad_store<T>(p, dw, ws, split, co, ci, tap, s);
  }
}

template <typename T>
__global__ void __launch_bounds__(256)
    cv_wgrad_finish(const ConvParams p, const typename CvType<T>::Acc* __restrict__ ws, T* __restrict__ dw) {
  typedef typename CvType<T>::Acc Acc;
  const long long taps = p.taps, total = p.cout * taps * p.cig;
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
    Acc s = ws[e];
    for (long long sp = 1; sp < p.splits; ++sp) s += ws[sp * total + e];  // chunk order: deterministic
    const long long ci = e % p.cig, q = e / p.cig;
    dw[cv_dw_offset(p, q / taps, ci, (int)(q % taps))] = CvType<T>::from(s);
  }
}
