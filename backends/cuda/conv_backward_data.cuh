// conv_backward_data (dgrad) as an implicit GEMM per filter phase, on tensor cores for bf16 / f16.
//
//   dx[n, ci, i] = sum_{co in group(ci), k : i = o*s + k*d - p, 0 <= o < O} dy[n, co, o] * w[co, ci - first, k]
//
// Filter phases (strided dgrad without the zero-inserted positions): the input positions split by
// their residue r = (i + p) mod s per dim; in phase r only the taps with k*d = r (mod s) reach a
// position, and then o = t + (i0 + p - k*d) / s for the phase's t-th position i = i0 + s*t: a dense,
// shifted window of dy.  Per phase and group the GEMM is
//   rows m = (n, td, th, tw) of the phase's grid (M_phase = N * Td * Th * Tw),
//   cols   = the group's Cin/g input channels,
//   reduction = (tap of the phase, co of the group).
// A phase with no taps (s above the dilated kernel) still runs: its positions are written as 0.
//
// Launch contract (plan: backends/_plans/conv_cuda.py `dgrad_plan`):
//   cv_dgrad<T, MODE>  grid (mblocks, phases * groups * cblocks), CV_THREADS threads, no dynamic smem.
//   T: float, double (SIMT FMA) or __half, __nv_bfloat16 (mma.sync, fp32 accumulate).
//   MODE: how a row m maps to (n, td, th, tw): 0 plain / and % everywhere (`div`); 1 fast divmod on
//     the load path (the rows' dy coordinates), / and % on the store path (`fastdiv_load`); 2 fast
//     divmod on both (`fastdiv`, the default).
//   table: int32, `trow` ints per phase: T[3] (d, h, w), i0[3], (mul, shift) of Tw, Th, Td, M_phase,
//     the tap count, then per tap the dy shift (cd, ch, cw) and the tap's weight offset.
// Every dx element is written once, from registers: deterministic, no atomics.
#pragma once

#include "conv_common.cuh"

#define CVD_HEAD 14

// (n, td, th, tw) of row m of a phase.
template <bool FAST>
__device__ __forceinline__ void cvd_coords(int m, const int* row, int& n, int& td, int& th, int& tw) {
  int q;
  cv_divmod<FAST>(m, row[2], (unsigned)row[6], (unsigned)row[7], q, tw);
  cv_divmod<FAST>(q, row[1], (unsigned)row[8], (unsigned)row[9], q, th);
  cv_divmod<FAST>(q, row[0], (unsigned)row[10], (unsigned)row[11], n, td);
}

template <typename T, int MODE>
__global__ void __launch_bounds__(CV_THREADS)
    cv_dgrad(const ConvParams p, const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx,
             const int* __restrict__ table) {
  typedef typename CvType<T>::Acc Acc;
  constexpr int LDS = CV_LDS(T), BM = CvTile<T>::BM;
  // On tensor cores the tiles a thread-fastest index writes along are MN-major (B always, A when
  // channels-first), read by ldmatrix.trans: K-major stores there were LDS elements apart, a 4-way
  // bank conflict on each (59M on the Cin=3 stem, 8M on a channels-first 3x3 layer: `harness profile`).
  constexpr bool TC = CvType<T>::kTC;
  constexpr int LDTA = CvTile<T>::LDTA, LDTB = CvTile<T>::LDTB;
  static_assert(!TC || (CV_BK * LDTA <= BM * LDS && CV_BK * LDTB <= CV_BN * LDS), "MN-major tiles fit the arrays");
  const int tid = threadIdx.x;
  const int per_phase = (int)(p.groups * p.cblocks);
  const int phase = blockIdx.y / per_phase, rest = blockIdx.y % per_phase;
  const int g = rest / (int)p.cblocks, cb = rest % (int)p.cblocks;
  const int* row = table + phase * p.trow;
  const int mp = row[12];
  const int m0 = blockIdx.x * BM;
  if (m0 >= mp) return;  // the phase has fewer rows than the largest one: the whole block leaves

  CV_SHARED16 T As[BM * LDS];
  CV_SHARED16 T Bs[CV_BN * LDS];
  __shared__ long long rbase[BM];  // the row's dy offset of n (-1: past the phase's rows)
  __shared__ int rt[3][BM];        // the row's (td, th, tw)

  if (tid < BM) {  // the load path's index math: once per row per block
    const int m = m0 + tid;
    if (m < mp) {
      int n, td, th, tw;
      cvd_coords<(MODE >= 1)>(m, row, n, td, th, tw);
      rbase[tid] = n * p.sa[0];
      rt[0][tid] = td;
      rt[1][tid] = th;
      rt[2][tid] = tw;
    } else {
      rbase[tid] = -1;
    }
  }
  __syncthreads();

  const int cog = (int)p.cog, cig = (int)p.cig;
  const long long co_first = (long long)g * cog;
  const int ci0 = cb * CV_BN;
  const int od_n = (int)p.out[0], oh_n = (int)p.out[1], ow_n = (int)p.out[2];
  CvTile<T> tile;
  tile.clear();
  const int ntaps = row[13];
  // Channels-first (rows fastest): thread tid loads row mr = tid % BM, channels kr + j * (THREADS / BM).
  const int mr = tid % BM, kr = tid / BM;
  for (int tap = 0; tap < ntaps; ++tap) {
    const int* tp = row + CVD_HEAD + 4 * tap;
    const int cd = tp[0], ch = tp[1], cw = tp[2];
    const long long woff = tp[3];
    // The row's dy element at this tap (channel 0 of the group), or -1: outside dy.
    long long yoff = -1;
    if (!p.cfast && rbase[mr] >= 0) {
      const int od = rt[0][mr] + cd, oh = rt[1][mr] + ch, ow = rt[2][mr] + cw;
      if (od >= 0 && od < od_n && oh >= 0 && oh < oh_n && ow >= 0 && ow < ow_n)
        yoff = rbase[mr] + co_first * p.sa[1] + od * p.sa[2] + oh * p.sa[3] + ow * p.sa[4];
    }
    for (int co0 = 0; co0 < cog; co0 += CV_BK) {
      // The fills go through cv_gather: a group's loads out together ahead of their stores.
      if (!p.cfast) {
        cv_gather<BM * CV_BK>(
            [&](int i) {
              const int co = co0 + kr + i * (CV_THREADS / BM);
              return yoff >= 0 && co < cog ? dy[yoff + co * p.sa[1]] : cv_zero<T>();
            },
            [&](int i, T v) {
              const int kk = kr + i * (CV_THREADS / BM);
              As[TC ? kk * LDTA + mr : mr * LDS + kk] = v;
            });
      } else {
        // Channels-last (channels fastest), where the 16-byte path does not apply.
        cv_gather<BM * CV_BK>(
            [&](int i) {
              const int e = tid + i * CV_THREADS, m = e / CV_BK, co = co0 + e % CV_BK;
              T v = cv_zero<T>();
              const long long base = rbase[m];
              if (base >= 0 && co < cog) {
                const int od = rt[0][m] + cd, oh = rt[1][m] + ch, ow = rt[2][m] + cw;
                if (od >= 0 && od < od_n && oh >= 0 && oh < oh_n && ow >= 0 && ow < ow_n)
                  v = dy[base + (co_first + co) * p.sa[1] + od * p.sa[2] + oh * p.sa[3] + ow * p.sa[4]];
              }
              return v;
            },
            [&](int i, T v) {
              const int e = tid + i * CV_THREADS;
              As[(e / CV_BK) * LDS + e % CV_BK] = v;
            });
      }
      // B: the tap's weights, Bs[ci][co].
      cv_gather<CV_BN * CV_BK>(
          [&](int i) {
            const int e = tid + i * CV_THREADS, ci = ci0 + e % CV_BN, co = co0 + e / CV_BN;
            return ci < cig && co < cog ? w[(co_first + co) * p.sb[0] + ci * p.sb[1] + woff] : cv_zero<T>();
          },
          [&](int i, T v) {
            const int e = tid + i * CV_THREADS, c = e % CV_BN, kk = e / CV_BN;
            Bs[TC ? kk * LDTB + c : c * LDS + kk] = v;
          });
      __syncthreads();
      if constexpr (TC) {
        if (p.cfast)
          tile.template step<false, true>(As, Bs);
        else
          tile.template step<true, true>(As, Bs);
      } else {
        tile.step(As, Bs);
      }
      __syncthreads();
    }
  }

  // Store path: each accumulator's row back to its input position (MODE 2: fast divmod).
  const int* i0 = row + 3;
  const long long c_first = (long long)g * cig;
  tile.for_each([&](int r, int c, Acc v) {
    const int m = m0 + r, ci = ci0 + c;
    if (m < mp && ci < cig) {
      int n, td, th, tw;
      cvd_coords<(MODE == 2)>(m, row, n, td, th, tw);
      const long long id = i0[0] + p.s[0] * td, ih = i0[1] + p.s[1] * th, iw = i0[2] + p.s[2] * tw;
      dx[n * p.sc[0] + (c_first + ci) * p.sc[1] + id * p.sc[2] + ih * p.sc[3] + iw * p.sc[4]] = CvType<T>::from(v);
    }
  });
}

// The channels-last fast path (16-bit types; the plan checks: dy's and w's channel stride 1, Cout/g and
// Cin/g multiples of 8, every other stride a multiple of 8 and the pointers 16-byte aligned, so a
// 16-byte run of 8 channels is wholly inside or wholly outside the tensor): both tiles arrive by
// cp.async, CV_STAGES deep, zero-filled where a row falls outside dy or past the channels.
//   A  As[m][k]  (K-major): 8 output channels of a row's shifted dy position per copy;
//   B  Bs[k][n]  (MN-major): 8 input channels of a (co, tap) weight row per copy, read by ldmatrix.trans.
// Same rows, phases, table and store path as cv_dgrad; the pipeline is cv_pipeline (conv_common.cuh).
template <typename T, int MODE>
__global__ void __launch_bounds__(CV_THREADS)
    cv_dgrad_vec(const ConvParams p, const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx,
                 const int* __restrict__ table) {
  typedef typename CvType<T>::Acc Acc;
  constexpr int LDS = CV_LDS(T), BM = CvTile<T>::BM;
  const int tid = threadIdx.x;
  const int per_phase = (int)(p.groups * p.cblocks);
  const int phase = blockIdx.y / per_phase, rest = blockIdx.y % per_phase;
  const int g = rest / (int)p.cblocks, cb = rest % (int)p.cblocks;
  const int* row = table + phase * p.trow;
  const int mp = row[12];
  const int m0 = blockIdx.x * BM;
  if (m0 >= mp) return;

  constexpr int LDTB = CvTile<T>::LDTB;
  CV_SHARED16 T As[CV_STAGES][BM * LDS];
  CV_SHARED16 T Bs[CV_STAGES][CV_BK * LDTB];
  // The A copies of thread tid always fall in rows (tid / 4) + 32j (j < BM / 32), channels
  // (tid % 4) * 8 of each BK slice: their coordinates are computed once (the load path's divmods)
  // and kept in registers.
  constexpr int RPT = BM / 32;
  long long roff[RPT];  // dy offset of the row at tap shift 0 (-1: past the phase's rows)
  int rd[RPT], rh[RPT], rw[RPT];
#pragma unroll
  for (int j = 0; j < RPT; ++j) {
    const int m = m0 + (tid >> 2) + 32 * j;
    roff[j] = -1;
    rd[j] = rh[j] = rw[j] = 0;
    if (m < mp) {
      int n;
      cvd_coords<(MODE >= 1)>(m, row, n, rd[j], rh[j], rw[j]);
      roff[j] = n * p.sa[0] + rd[j] * p.sa[2] + rh[j] * p.sa[3] + rw[j] * p.sa[4];
    }
  }
  const int kc = tid & 3;

  const int cog = (int)p.cog, cig = (int)p.cig;
  const long long co_first = (long long)g * cog;
  const int ci0 = cb * CV_BN;
  const int od_n = (int)p.out[0], oh_n = (int)p.out[1], ow_n = (int)p.out[2];
  const int nco = (cog + CV_BK - 1) / CV_BK;
  const int nsteps = row[13] * nco;
  auto load = [&](int s, int stage) {
    const int tap = s / nco, co0 = (s - tap * nco) * CV_BK;
    const int* tp = row + CVD_HEAD + 4 * tap;
    const int cd = tp[0], ch = tp[1], cw = tp[2];
    const long long woff = tp[3];
    const long long shift = cd * p.sa[2] + ch * p.sa[3] + cw * p.sa[4];
    const int co = co0 + kc * 8;
#pragma unroll
    for (int j = 0; j < RPT; ++j) {
      const T* src = dy;
      int bytes = 0;
      if (roff[j] >= 0 && co < cog) {
        const int od = rd[j] + cd, oh = rh[j] + ch, ow = rw[j] + cw;
        if (od >= 0 && od < od_n && oh >= 0 && oh < oh_n && ow >= 0 && ow < ow_n) {
          src = dy + roff[j] + shift + co_first + co;
          bytes = 16;
        }
      }
      tc_cp_async16(&As[stage][((tid >> 2) + 32 * j) * LDS + kc * 8], src, bytes);
    }
#pragma unroll
    for (int c = tid; c < CV_BK * (CV_BN / 8); c += CV_THREADS) {
      const int kk = c >> 3, nc = c & 7, co = co0 + kk, ci = ci0 + nc * 8;
      const T* src = w;
      int bytes = 0;
      if (co < cog && ci < cig) {
        src = w + (co_first + co) * p.sb[0] + ci + woff;
        bytes = 16;
      }
      tc_cp_async16(&Bs[stage][kk * LDTB + nc * 8], src, bytes);
    }
  };

  CvTile<T> tile;
  tile.clear();
  cv_pipeline(nsteps, load, [&](int stage) { tile.template step<false, true>(As[stage], Bs[stage]); });

  const int* i0 = row + 3;
  const long long c_first = (long long)g * cig;
  tile.for_each([&](int r, int c, Acc v) {
    const int m = m0 + r, ci = ci0 + c;
    if (m < mp && ci < cig) {
      int n, td, th, tw;
      cvd_coords<(MODE == 2)>(m, row, n, td, th, tw);
      const long long id = i0[0] + p.s[0] * td, ih = i0[1] + p.s[1] * th, iw = i0[2] + p.s[2] * tw;
      dx[n * p.sc[0] + (c_first + ci) * p.sc[1] + id * p.sc[2] + ih * p.sc[3] + iw * p.sc[4]] = CvType<T>::from(v);
    }
  });
}

// Small channel groups (Cin/g * Cout/g below the plan's DIRECT_MAX; depthwise included): a GEMM tile
// would be mostly padding, so each thread computes one dx element of a phase directly: the sum over
// the phase's taps and the group's Cout/g channels, in the accumulator type.
//   cv_dgrad_dw<T, MODE>  grid (max over phases of ceil(M_phase * Cin / 256), phases), 256 threads.
// Elements are numbered channel-fastest when dy's channel stride is 1 (coalesced in channels-last;
// the element -> (row, channel) split by Cin takes the fast divmod from MODE 1 on), else row-fastest.  MODE as for cv_dgrad (a row's coordinates: load path = the dy reads, store
// path = the dx write; here both use the same coordinates, so MODE >= 1 takes the fast divmod and
// MODE 1 recomputes them with / and % for the store, as the GEMM's store path does).
template <typename T, int MODE>
__global__ void __launch_bounds__(256)
    cv_dgrad_dw(const ConvParams p, const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx,
                const int* __restrict__ table) {
  typedef typename CvType<T>::Acc Acc;
  const int* row = table + blockIdx.y * p.trow;
  const int mp = row[12];
  const int cin = (int)p.cin, cig = (int)p.cig, cog = (int)p.cog;
  const int e = blockIdx.x * 256 + threadIdx.x;  // < 2^31: the plan checks M_phase * Cin
  if (e >= mp * cin) return;
  int m, c;
  if (p.cfast) {  // by Cin: (mul, shift) in magic[0..1]
    cv_divmod<(MODE >= 1)>(e, cin, (unsigned)p.magic[0], (unsigned)p.magic[1], m, c);
  } else {
    c = e / mp;
    m = e - c * mp;
  }
  int n, td, th, tw;
  cvd_coords<(MODE >= 1)>(m, row, n, td, th, tw);
  const int g = c / cig, cl = c - g * cig;
  const long long co_first = (long long)g * cog;
  Acc acc = Acc(0);
  const int ntaps = row[13];
  for (int tap = 0; tap < ntaps; ++tap) {
    const int* tp = row + CVD_HEAD + 4 * tap;
    const int od = td + tp[0], oh = th + tp[1], ow = tw + tp[2];
    if (od < 0 || od >= p.out[0] || oh < 0 || oh >= p.out[1] || ow < 0 || ow >= p.out[2]) continue;
    const T* yp = dy + n * p.sa[0] + od * p.sa[2] + oh * p.sa[3] + ow * p.sa[4] + co_first * p.sa[1];
    const T* wp = w + co_first * p.sb[0] + cl * p.sb[1] + tp[3];
    for (int j = 0; j < cog; ++j) acc += (Acc)cv_f(yp[j * p.sa[1]]) * (Acc)cv_f(wp[j * p.sb[0]]);
  }
  if (MODE == 1) cvd_coords<false>(m, row, n, td, th, tw);  // the store path's own / and %
  const int* i0 = row + 3;
  const long long id = i0[0] + p.s[0] * td, ih = i0[1] + p.s[1] * th, iw = i0[2] + p.s[2] * tw;
  dx[n * p.sc[0] + c * p.sc[1] + id * p.sc[2] + ih * p.sc[3] + iw * p.sc[4]] = CvType<T>::from(acc);
}

// Small Cin (groups 1, Cin <= 8, not a direct case; cupy@best, torch_ext): the GEMM's columns are the Cin input
// channels, so a 64-wide tile is mostly padding (3 of 64 on the RGB stem: tensor pipe 4%, `harness
// profile`).  Here each thread owns one row m of a phase and all Cin channels in registers, summing
// dy[row at the tap, co] * w[co, c, tap] over the phase's taps and Cout on the FMA pipe.  The weights of
// a chunk of taps and output channels sit in shared memory as [tap][co][CW] (channels contiguous and
// padded to CW, so a thread reads a (tap, co)'s channels as whole 16-byte words, the same address across
// the warp: a broadcast).  VEC (the plan: dy channels-last, 16-byte aligned, Cout and dy's other strides
// multiples of 16 bytes' elements): dy read as 16-byte words, else element by element.  The sum's order
// is fixed (tap, then co): deterministic, no atomics; every dx element written once.
//   cv_dgrad_smallc<T, CP, VEC>  grid (ceil(max M_phase / 256), phases), 256 threads; CP = Cin for Cin
//   <= 4, else 8 (channel slots in registers; slots past Cin stay 0 and are never stored).  At most 128
//   registers (2 blocks an SM): with the bound at 256 threads alone ptxas (CUDA 13.0) gave the 16-bit VEC
//   kernels 40 registers and a spill; at 64 or 80, some instantiations spill 12-20 bytes; at 128 none
//   does (80-128 used, the weights' 16-byte loads hoisted ahead of their FMAs).
template <typename T, int CP, bool VEC>
__global__ void __launch_bounds__(256, 2)
    cv_dgrad_smallc(const ConvParams p, const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx,
                    const int* __restrict__ table) {
  typedef typename CvType<T>::Acc Acc;
  constexpr int PER16 = 16 / (int)sizeof(Acc);            // accumulator-type values per 16-byte word
  constexpr int CW = (CP + PER16 - 1) / PER16 * PER16;    // channel slots per (tap, co) in shared memory
  constexpr int TCH = 4, KC = 32;                         // taps and output channels per chunk
  constexpr int V = 16 / (int)sizeof(T);                  // dy elements per 16-byte word
  static_assert(KC % V == 0, "a chunk holds whole 16-byte words of dy");
  CV_SHARED16 Acc ws[TCH * KC * CW];
  const int* row = table + blockIdx.y * p.trow;
  const int mp = row[12], ntaps = row[13];
  if ((int)blockIdx.x * 256 >= mp) return;  // the phase has fewer rows than the largest: the whole block leaves
  const int m = blockIdx.x * 256 + threadIdx.x;
  const bool live = m < mp;  // threads past the rows still load weights and meet every barrier
  int n = 0, td = 0, th = 0, tw = 0;
  if (live) cvd_coords<true>(m, row, n, td, th, tw);
  const int cin = (int)p.cin, cog = (int)p.cog;
  Acc acc[CP];
#pragma unroll
  for (int c = 0; c < CP; ++c) acc[c] = Acc(0);

  for (int t0 = 0; t0 < ntaps; t0 += TCH) {
    const int nt = ntaps - t0 < TCH ? ntaps - t0 : TCH;
    for (int co0 = 0; co0 < cog; co0 += KC) {
      const int nk = cog - co0 < KC ? cog - co0 : KC;
      __syncthreads();  // the previous chunk's reads are done
      for (int e = threadIdx.x; e < TCH * KC * CW; e += 256) {
        const int c = e % CW, j = (e / CW) % KC, t = e / (CW * KC);
        Acc v = Acc(0);
        if (t < nt && j < nk && c < cin)
          v = (Acc)cv_f(w[(co0 + j) * p.sb[0] + c * p.sb[1] + row[CVD_HEAD + 4 * (t0 + t) + 3]]);
        ws[e] = v;
      }
      __syncthreads();
      if (!live) continue;
      for (int t = 0; t < nt; ++t) {
        const int* tp = row + CVD_HEAD + 4 * (t0 + t);
        const int od = td + tp[0], oh = th + tp[1], ow = tw + tp[2];
        if (od < 0 || od >= p.out[0] || oh < 0 || oh >= p.out[1] || ow < 0 || ow >= p.out[2]) continue;
        const T* yp = dy + n * p.sa[0] + od * p.sa[2] + oh * p.sa[3] + ow * p.sa[4] + co0 * p.sa[1];
        const Acc* wt = ws + t * KC * CW;
        auto fma = [&](Acc y, int j) {  // acc[c] += y * w[co0 + j, c]
#pragma unroll
          for (int c = 0; c < CP; ++c) acc[c] += y * wt[j * CW + c];
        };
        if constexpr (VEC) {
          for (int j = 0; j < nk; j += V) {
            const CvWord16 word = *reinterpret_cast<const CvWord16*>(yp + j);
#pragma unroll
            for (int i = 0; i < V; ++i) fma(cv_word_elem<T>(word, i), j + i);
          }
        } else {
          for (int j = 0; j < nk; ++j) fma((Acc)cv_f(yp[j * p.sa[1]]), j);
        }
      }
    }
  }
  if (!live) return;
  const int* i0 = row + 3;
  const long long id = i0[0] + p.s[0] * td, ih = i0[1] + p.s[1] * th, iw = i0[2] + p.s[2] * tw;
  T* xp = dx + n * p.sc[0] + id * p.sc[2] + ih * p.sc[3] + iw * p.sc[4];
#pragma unroll
  for (int c = 0; c < CP; ++c)
    if (c < cin) xp[c * p.sc[1]] = CvType<T>::from(acc[c]);
}
