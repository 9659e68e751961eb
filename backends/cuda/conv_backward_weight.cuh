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
//   cv_wgrad_finish<T>  grid-stride over the Cout * taps * Cin/g elements: the chunks' sum, cast, stored.
//   The pair index r -> (n, od, oh, ow) is a fast divmod by O (ConvParams.magic).
#pragma once

#include "conv_common.cuh"

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
  const int kw = tap % (int)p.k[2], kh = (tap / (int)p.k[2]) % (int)p.k[1], kd = tap / (int)(p.k[2] * p.k[1]);
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
        int q, ow, oh, od, n;
        cv_divmod<true>((int)r, (int)p.out[2], (unsigned)p.magic[0], (unsigned)p.magic[1], q, ow);
        cv_divmod<true>(q, (int)p.out[1], (unsigned)p.magic[2], (unsigned)p.magic[3], q, oh);
        cv_divmod<true>(q, (int)p.out[0], (unsigned)p.magic[4], (unsigned)p.magic[5], n, od);
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
    if (p.cfast) {  // channels-last: channels fastest
      for (int e = tid; e < BM * CV_BK; e += CV_THREADS) {
        const int c = e % BM, kk = e / BM;
        As[c * LDS + kk] = ry[kk] >= 0 && co0 + c < cog ? dy[ry[kk] + (co_first + c) * p.sa[1]] : cv_zero<T>();
      }
      for (int e = tid; e < CV_BN * CV_BK; e += CV_THREADS) {
        const int c = e % CV_BN, kk = e / CV_BN;
        Bs[c * LDS + kk] = rx[kk] >= 0 && ci0 + c < cig ? x[rx[kk] + (ci_first + c) * p.sb[1]] : cv_zero<T>();
      }
    } else {  // channels-first: pairs fastest; thread tid keeps one pair, kk = tid % BK
      const int kk = tid % CV_BK, c0 = tid / CV_BK;
      const long long oy = ry[kk], ox = rx[kk];
      for (int c = c0; c < BM; c += CV_THREADS / CV_BK)
        As[c * LDS + kk] = oy >= 0 && co0 + c < cog ? dy[oy + (co_first + c) * p.sa[1]] : cv_zero<T>();
      for (int c = c0; c < CV_BN; c += CV_THREADS / CV_BK)
        Bs[c * LDS + kk] = ox >= 0 && ci0 + c < cig ? x[ox + (ci_first + c) * p.sb[1]] : cv_zero<T>();
    }
    __syncthreads();
    tile.step(As, Bs);
    __syncthreads();
  }

  const long long taps = p.taps, total = p.cout * taps * p.cig;
  tile.for_each([&](int r, int c, Acc v) {
    if (co0 + r < cog && ci0 + c < cig) {
      if (ws != nullptr) {
        ws[split * total + ((co_first + r) * taps + tap) * p.cig + ci0 + c] = v;
      } else {
        dw[(co_first + r) * p.sc[0] + (ci0 + c) * p.sc[1] + kd * p.sc[2] + kh * p.sc[3] + kw * p.sc[4]] =
            CvType<T>::from(v);
      }
    }
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
  const int kw = tap % (int)p.k[2], kh = (tap / (int)p.k[2]) % (int)p.k[1], kd = tap / (int)(p.k[2] * p.k[1]);
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
        int q, ow, oh, od, n;
        cv_divmod<true>((int)r, (int)p.out[2], (unsigned)p.magic[0], (unsigned)p.magic[1], q, ow);
        cv_divmod<true>(q, (int)p.out[1], (unsigned)p.magic[2], (unsigned)p.magic[3], q, oh);
        cv_divmod<true>(q, (int)p.out[0], (unsigned)p.magic[4], (unsigned)p.magic[5], n, od);
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

  const long long taps = p.taps, total = p.cout * taps * p.cig;
  tile.for_each([&](int r, int c, Acc v) {
    if (co0 + r < cog && ci0 + c < cig) {
      if (ws != nullptr) {
        ws[split * total + ((co_first + r) * taps + tap) * p.cig + ci0 + c] = v;
      } else {
        dw[(co_first + r) * p.sc[0] + (ci0 + c) * p.sc[1] + kd * p.sc[2] + kh * p.sc[3] + kw * p.sc[4]] =
            CvType<T>::from(v);
      }
    }
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
  const int kw = tap % (int)p.k[2], kh = (tap / (int)p.k[2]) % (int)p.k[1], kd = tap / (int)(p.k[2] * p.k[1]);
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
      int q, ow, oh, od, n;
      cv_divmod<true>((int)r, (int)p.out[2], (unsigned)p.magic[0], (unsigned)p.magic[1], q, ow);
      cv_divmod<true>(q, (int)p.out[1], (unsigned)p.magic[2], (unsigned)p.magic[3], q, oh);
      cv_divmod<true>(q, (int)p.out[0], (unsigned)p.magic[4], (unsigned)p.magic[5], n, od);
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
    const long long taps = p.taps, total = p.cout * taps * p.cig;
    if (ws != nullptr) {
      ws[split * total + ((long long)co * taps + tap) * cig + ci] = s;
    } else {
      dw[co * p.sc[0] + ci * p.sc[1] + kd * p.sc[2] + kh * p.sc[3] + kw * p.sc[4]] = CvType<T>::from(s);
    }
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
    const long long ci = e % p.cig, q = e / p.cig, tap = q % taps, co = q / taps;
    const long long kw = tap % p.k[2], kh = (tap / p.k[2]) % p.k[1], kd = tap / (p.k[2] * p.k[1]);
    dw[co * p.sc[0] + ci * p.sc[1] + kd * p.sc[2] + kh * p.sc[3] + kw * p.sc[4]] = CvType<T>::from(s);
  }
}
