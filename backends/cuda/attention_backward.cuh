// attention_backward: FlashAttention-2 style backward (spec: oracle/attention_backward.py).
//
// Launch contract (the plan is made once in Python, backends/cupy/attention_backward.py):
//
//   AttnParams   all long long, packed in field order by the host (see ATTN_FIELDS there).
//                Strides are in elements; every tensor's last (head-dim) stride is 1 (the host
//                makes contiguous copies otherwise).  left / right are the window with causal
//                folded in (right = 0 when causal), -1 = unbounded.  `aligned` = 1 when every
//                q, k, v, do row starts 16-byte aligned and D % 8 == 0, so tiles load by cp.async.
//   scale, softcap   doubles (softcap 0 = off).
//
// Kernels (T = the case dtype, ACC = float, or double for f64):
//   attn_pre<T, ACC>           grid ceil(B*Hq*Sq / 4), 128 threads: one warp per query row r =
//                              (b*Hq + h)*Sq + i writes delta[r] = rowsum(o * do) and lse_ws[r] = lse
//                              (delta 0 and lse +inf on rows with no allowed key, so no later kernel
//                              reads the given o or lse there), and zeroes dq_acc's row when given.
//   attn_pre_vec<T, LPR>       attn_pre with 16-byte loads along D, LPR lanes per row (cupy@fa2_lean).
//   attn_fa2_main<T, DP, BM, BN, WD, DQ, QS = BM, RED2 = false>
//                              T = bf16 / f16 on tensor cores (mma.sync m16n8k16 + ldmatrix, fp32
//                              accumulation).  grid (ceil(Sk/BN), B*Hkv), 32*(BN/16)*WD threads,
//                              dynamic smem attn_main_smem<DP, BM, BN>().  One block per key block
//                              of one kv head: K, V stay in shared memory, dK and dV accumulate in
//                              registers over the query blocks of every query head of the group
//                              (Q, dO, lse, delta double-buffered by cp.async).  Warp w owns keys
//                              16*(w / WD) .. +16 and head-dim slice w % WD of dK, dV.  With DQ,
//                              dS goes through shared memory and dQ += dS K is added to the fp32
//                              dq_acc ((B, Sq, Hq, D), contiguous) by atomics.
//                              Query blocks fully inside the band take the unmasked path.  With
//                              split > 1 (grid.y = B*Hkv*split), the group's heads are shared by
//                              `split` blocks whose fp32 partials attn_split_sum adds in order.
//                              QS < BM or RED2 (cupy@fa2_lean): attn_main_step_lean, the query block
//                              in sub-blocks of QS rows (fewer live registers) and dQ added by
//                              red.global.add.v2.f32; the defaults compile to fa2's kernel unchanged.
//                              Shared tiles: row pitch DP + 8 (K, V, Q, dO) and BM + 8 (dS^T), odd
//                              multiples of 16 bytes, so every ldmatrix phase (8 rows of 16 bytes)
//                              and every cp.async fill is bank-conflict free (counted on the stand-in).
//   attn_split_sum<T>          dk, dv from the partials; grid-stride over B*Sk*Hkv*D.
//   attn_dq_convert<T>         dq = scale * dq_acc, rounded to T; grid-stride over B*Sq*Hq*D.
//   attn_dq_convert_vec<T>     the same, 8 elements per thread (16-byte store; cupy@fa2_lean).
//   attn_fa2_dq<T, DP, BM, BN> the deterministic dq: grid (ceil(Sq/BM), B*Hq), 32*(BM/16) threads,
//                              dynamic smem attn_dq_smem<DP, BM, BN>(): per query block, loop over
//                              the key blocks of its band (K, V double-buffered), recompute S and dP,
//                              dQ in registers, written once.  No atomics.
//   attn_simt_dq<T, ACC, NPL>, attn_simt_dkdv<T, ACC, NPL>
//                              the f32 / f64 path (no tensor cores: TF32 would miss the fp32
//                              tolerance): one warp per query row (dq) or per key row (dk, dv over
//                              the group's query heads), NPL head-dim elements per lane (D <= 32*NPL),
//                              dot products by warp shuffles, ACC accumulation.  Deterministic.
//   DP is the head dim the tensor-core kernels compute on (64, 128 or 256); columns D..DP-1 are
//   zero-filled in shared memory and never stored.
#pragma once

#include "mma.cuh"

#ifdef CUHOST_RUNTIME
#include <cmath>  // the CPU stand-in (tests/cuda_host) only: expf, tanhf on the host
#endif

struct AttnParams {
  long long B, Sq, Sk, Hq, Hkv, D, G, left, right, aligned;
  long long q_b, q_s, q_h, k_b, k_s, k_h, v_b, v_s, v_h, o_b, o_s, o_h, do_b, do_s, do_h;
  long long lse_b, lse_h, lse_s, dq_b, dq_s, dq_h, dk_b, dk_s, dk_h, dv_b, dv_s, dv_h;
  long long split;  // blocks sharing the G query heads of a kv head (divides G; > 1: fp32 partials + attn_split_sum)
};

// ---------------------------------------------------------------------------------- scalars

__device__ __forceinline__ float attn_f(float x) { return x; }
__device__ __forceinline__ double attn_f(double x) { return x; }
__device__ __forceinline__ float attn_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float attn_f(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T attn_cast(float x);
template <>
__device__ __forceinline__ float attn_cast<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half attn_cast<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 attn_cast<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <typename T>
__device__ __forceinline__ T attn_castd(double x) { return attn_cast<T>((float)x); }
template <>
__device__ __forceinline__ double attn_castd<double>(double x) { return x; }

__device__ __forceinline__ unsigned short attn_bits(__half x) {
#ifdef CUHOST_RUNTIME
  return x.bits;
#else
  return __half_as_ushort(x);
#endif
}
__device__ __forceinline__ unsigned short attn_bits(__nv_bfloat16 x) {
#ifdef CUHOST_RUNTIME
  return x.bits;
#else
  return __bfloat16_as_ushort(x);
#endif
}

// Two floats rounded to T, packed as one mma register (lower index in the low half).
template <typename T>
__device__ __forceinline__ unsigned attn_pack(float lo, float hi) {
  return (unsigned)attn_bits(attn_cast<T>(lo)) | ((unsigned)attn_bits(attn_cast<T>(hi)) << 16);
}

// a[0] += x, a[1] += y as one reduction (a 8-byte aligned global address; sm_90's
// red.global.add.v2.f32: half the requests of two float atomics).
__device__ __forceinline__ void attn_red2(float* a, float x, float y) {
#ifdef CUHOST_RUNTIME
  a[0] += x;
  a[1] += y;
#else
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(a), "f"(x), "f"(y) : "memory");
#endif
}

__device__ __forceinline__ float attn_inf() {
#ifdef CUHOST_RUNTIME
  return __builtin_inff();
#else
  return __int_as_float(0x7f800000);
#endif
}

__device__ __forceinline__ float attn_exp(float x) { return expf(x); }
__device__ __forceinline__ double attn_exp(double x) { return exp(x); }
__device__ __forceinline__ float attn_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double attn_tanh(double x) { return tanh(x); }

// Query i may attend key j (the oracle's mask; right has causal folded in).
__device__ __forceinline__ bool attn_allowed(const AttnParams& p, long long i, long long j) {
  const long long diag = i + (p.Sk - p.Sq);
  return i < p.Sq && j < p.Sk && (p.left < 0 || j >= diag - p.left) && (p.right < 0 || j <= diag + p.right);
}

// Every pair of query rows [m0, m0 + bm) x keys [n0, n0 + bn) allowed: the block needs no mask.
__device__ __forceinline__ bool attn_full(const AttnParams& p, long long m0, int bm, long long n0, int bn) {
  const long long off = p.Sk - p.Sq;
  return m0 + bm <= p.Sq && n0 + bn <= p.Sk && (p.right < 0 || n0 + bn - 1 <= m0 + off + p.right) &&
         (p.left < 0 || n0 >= m0 + bm - 1 + off - p.left);
}

// ---------------------------------------------------------------------------------- tile loads

// rows x DP elements of T from g (row stride rs, D valid columns, `valid` valid rows) into shared
// memory with row pitch LD; zero past the valid rows and columns.  Aligned: 16-byte cp.async
// (the caller commits and waits); else plain loads and stores.
template <typename T, int DP, int LD>
__device__ __forceinline__ void attn_load(T* sm, const T* g, long long rs, int rows, int valid, int d, bool aligned,
                                          int tid, int nthreads) {
  constexpr int CH = DP / 8;
  for (int c = tid; c < rows * CH; c += nthreads) {
    const int r = c / CH, col = (c % CH) * 8;
    T* dst = sm + r * LD + col;
    if (aligned) {
      int bytes = r < valid ? (d - col) * 2 : 0;
      bytes = bytes < 0 ? 0 : bytes > 16 ? 16 : bytes;
      tc_cp_async16(dst, bytes > 0 ? (const void*)(g + r * rs + col) : (const void*)g, bytes);
    } else {
      for (int e = 0; e < 8; ++e)
        dst[e] = (r < valid && col + e < d) ? g[r * rs + col + e] : attn_cast<T>(0.0f);
    }
  }
}

// lse and delta of query rows [m0, m0 + bm) of row block `base` (rows past Sq: +inf and 0).
__device__ __forceinline__ void attn_load_stats(float* sl, float* sd, const float* lse, const float* delta,
                                                long long base, long long m0, int bm, long long sq, int tid,
                                                int nthreads) {
  for (int r = tid; r < bm; r += nthreads) {
    const bool in = m0 + r < sq;
    sl[r] = in ? lse[base + m0 + r] : attn_inf();
    sd[r] = in ? delta[base + m0 + r] : 0.0f;
  }
}

// ---------------------------------------------------------------------------------- preprocess

template <typename T, typename ACC>
__global__ void __launch_bounds__(128) attn_pre(AttnParams p, const T* __restrict__ o, const T* __restrict__ dO,
                                                const ACC* __restrict__ lse, ACC* __restrict__ lse_ws,
                                                ACC* __restrict__ delta_ws, float* __restrict__ dq_acc) {
  const int lane = threadIdx.x & 31;
  const long long r = (long long)blockIdx.x * 4 + (threadIdx.x >> 5);
  if (r >= p.B * p.Hq * p.Sq) return;  // whole warps only: 4 rows per block
  const long long i = r % p.Sq, bh = r / p.Sq, h = bh % p.Hq, b = bh / p.Hq;
  const long long diag = i + (p.Sk - p.Sq);
  const long long lo = p.left >= 0 ? (diag - p.left > 0 ? diag - p.left : 0) : 0;
  const long long hi = p.right >= 0 ? (diag + p.right < p.Sk - 1 ? diag + p.right : p.Sk - 1) : p.Sk - 1;
  const bool live = lo <= hi;
  ACC s = 0;
  if (live) {
    const T* orow = o + b * p.o_b + i * p.o_s + h * p.o_h;
    const T* drow = dO + b * p.do_b + i * p.do_s + h * p.do_h;
    for (long long d = lane; d < p.D; d += 32) s += (ACC)attn_f(orow[d]) * (ACC)attn_f(drow[d]);
  }
  for (int m = 16; m; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
  if (lane == 0) {
    delta_ws[r] = live ? s : (ACC)0;
    lse_ws[r] = live ? lse[b * p.lse_b + h * p.lse_h + i * p.lse_s] : (ACC)attn_inf();
  }
  if (dq_acc) {
    float* row = dq_acc + ((b * p.Sq + i) * p.Hq + h) * p.D;
    for (long long d = lane; d < p.D; d += 32) row[d] = 0.0f;
  }
}

template <typename T>
__global__ void __launch_bounds__(256) attn_dq_convert(AttnParams p, double scale, const float* __restrict__ acc,
                                                       T* __restrict__ dq) {
  const long long n = p.B * p.Sq * p.Hq * p.D;
  const float sc = (float)scale;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x) {
    const long long d = e % p.D, rest = e / p.D, h = rest % p.Hq, bi = rest / p.Hq, i = bi % p.Sq, b = bi / p.Sq;
    dq[b * p.dq_b + i * p.dq_s + h * p.dq_h + d] = attn_cast<T>(sc * acc[e]);
  }
}

// 8 elements of T as one 16-byte access (a 16-byte aligned address).
template <typename T>
struct __align__(16) AttnVec8 {
  T v[8];
};
struct __align__(16) AttnF4 {
  float v[4];
};

// attn_pre with 16-byte loads (cupy@fa2_lean): LPR lanes per query row (LPR = D / 8 rounded up to
// a power of two, at most 32), 32 / LPR rows per warp, 4 warps per block; each lane reads 8
// elements of o and of do per access along D.  Needs D % 8 == 0 and every o, do row 16-byte
// aligned (the host checks).  Same outputs as attn_pre.
template <typename T, int LPR>
__global__ void __launch_bounds__(128) attn_pre_vec(AttnParams p, const T* __restrict__ o, const T* __restrict__ dO,
                                                    const float* __restrict__ lse, float* __restrict__ lse_ws,
                                                    float* __restrict__ delta_ws, float* __restrict__ dq_acc) {
  constexpr int RPW = 32 / LPR;  // rows per warp
  const int lane = threadIdx.x & 31, sub = lane % LPR;
  const long long r = ((long long)blockIdx.x * 4 + (threadIdx.x >> 5)) * RPW + lane / LPR;
  const bool in = r < p.B * p.Hq * p.Sq;  // every lane stays for the shuffles
  const long long rr = in ? r : 0;
  const long long i = rr % p.Sq, bh = rr / p.Sq, h = bh % p.Hq, b = bh / p.Hq;
  const long long diag = i + (p.Sk - p.Sq);
  const long long lo = p.left >= 0 ? (diag - p.left > 0 ? diag - p.left : 0) : 0;
  const long long hi = p.right >= 0 ? (diag + p.right < p.Sk - 1 ? diag + p.right : p.Sk - 1) : p.Sk - 1;
  const bool live = in && lo <= hi;
  float s = 0.0f;
  if (live) {
    const T* orow = o + b * p.o_b + i * p.o_s + h * p.o_h;
    const T* drow = dO + b * p.do_b + i * p.do_s + h * p.do_h;
    for (long long c = sub * 8; c < p.D; c += 8 * LPR) {
      const AttnVec8<T> x = *reinterpret_cast<const AttnVec8<T>*>(orow + c);
      const AttnVec8<T> y = *reinterpret_cast<const AttnVec8<T>*>(drow + c);
#pragma unroll
      for (int e = 0; e < 8; ++e) s += attn_f(x.v[e]) * attn_f(y.v[e]);
    }
  }
#pragma unroll
  for (int m = LPR / 2; m; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
  if (in && sub == 0) {
    delta_ws[r] = live ? s : 0.0f;
    lse_ws[r] = live ? lse[b * p.lse_b + h * p.lse_h + i * p.lse_s] : attn_inf();
  }
  if (in && dq_acc) {
    float* row = dq_acc + ((b * p.Sq + i) * p.Hq + h) * p.D;
    const AttnF4 z = {{0.0f, 0.0f, 0.0f, 0.0f}};
    for (long long c = sub * 8; c < p.D; c += 8 * LPR) {
      reinterpret_cast<AttnF4*>(row + c)[0] = z;
      reinterpret_cast<AttnF4*>(row + c)[1] = z;
    }
  }
}

// attn_dq_convert by 8 elements a thread (cupy@fa2_lean): dq is contiguous (the host requires it),
// so its element e is dq_acc's element e.  Needs D % 8 == 0 and dq 16-byte aligned.
template <typename T>
__global__ void __launch_bounds__(256) attn_dq_convert_vec(AttnParams p, double scale, const float* __restrict__ acc,
                                                           T* __restrict__ dq) {
  const long long n8 = p.B * p.Sq * p.Hq * p.D / 8;
  const float sc = (float)scale;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n8; e += (long long)gridDim.x * blockDim.x) {
    const AttnF4 a = reinterpret_cast<const AttnF4*>(acc)[2 * e], c = reinterpret_cast<const AttnF4*>(acc)[2 * e + 1];
    AttnVec8<T> y;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      y.v[k] = attn_cast<T>(sc * a.v[k]);
      y.v[4 + k] = attn_cast<T>(sc * c.v[k]);
    }
    reinterpret_cast<AttnVec8<T>*>(dq)[e] = y;
  }
}

// ---------------------------------------------------------------------------------- fa2 main

template <int DP, int BM, int BN>
__host__ __device__ constexpr int attn_main_smem() {
  return (2 * BN * (DP + 8) + 4 * BM * (DP + 8) + BN * (BM + 8)) * 2 + 4 * BM * 4;
}

template <int DP, int BM, int BN>
__host__ __device__ constexpr int attn_dq_smem() {
  return (2 * BM * (DP + 8) + 4 * BN * (DP + 8)) * 2 + 2 * BM * 4;
}

// P and dS of one 16 x 8 accumulator tile element: s the raw score, dp = dO.v, with the row's
// lse and delta.  MASK: whether (i, j) is checked against the band.  EXP2: exp as exp2f of the
// exponent times log2(e) (the tensor-core path: P and dS are rounded to bf16 / f16 before their
// matmuls, far coarser than the float error this adds); the SIMT path keeps expf / exp.
template <bool MASK, typename ACC, bool EXP2 = false>
__device__ __forceinline__ void attn_pds(const AttnParams& p, ACC s, ACC dp, ACC lse, ACC delta, ACC scale,
                                         ACC softcap, long long i, long long j, ACC& pr, ACC& ds) {
  s *= scale;
  ACC dcap = 1;
  if (softcap != 0) {
    const ACC th = attn_tanh(s / softcap);
    s = softcap * th;
    dcap = 1 - th * th;
  }
  if constexpr (EXP2)
    pr = exp2f((s - lse) * 1.4426950408889634f);
  else
    pr = attn_exp(s - lse);
  ds = pr * (dp - delta) * dcap;
  if (MASK && !attn_allowed(p, i, j)) {  // select, not multiply: lse / delta may be anything there
    pr = 0;
    ds = 0;
  }
}

// One query block of attn_fa2_main for one warp (the measured fa2 kernel, kept as it is for A/B).
template <typename T, int DP, int BM, int BN, int WD, bool DQ, bool MASK>
__device__ __forceinline__ void attn_main_step(const AttnParams& p, float scale, float softcap, const T* sK,
                                               const T* sV, const T* sQ, const T* sdO, const float* sl,
                                               const float* sd, T* sdS, long long m0, long long n0,
                                               float (&dkacc)[DP / WD / 8][4], float (&dvacc)[DP / WD / 8][4],
                                               float* dq_acc, long long b, long long h) {
  constexpr int LD = DP + 8, LDS = BM + 8, NT = BM / 8, NW = (BN / 16) * WD, DW = DP / WD;
  const int tid = threadIdx.x, w = tid >> 5, l = tid & 31, g = l >> 2, t = l & 3;
  const int kb = (w / WD) * 16, wd = w % WD;
  float sacc[NT][4], pacc[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) sacc[n][e] = pacc[n][e] = 0.0f;
  // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys (rows) x BM queries (columns).
#pragma unroll
  for (int k = 0; k < DP; k += 16) {
    unsigned ak[4], av[4];
    const int arow = kb + (l & 7) + ((l >> 3) & 1) * 8, acol = k + (l >> 4) * 8;
    tc_ldmatrix_x4(ak, sK + arow * LD + acol);
    tc_ldmatrix_x4(av, sV + arow * LD + acol);
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
      unsigned bq[4], bd[4];
      const int brow = n * 8 + (l & 7) + (l >> 4) * 8, bcol = k + ((l >> 3) & 1) * 8;
      tc_ldmatrix_x4(bq, sQ + brow * LD + bcol);
      tc_ldmatrix_x4(bd, sdO + brow * LD + bcol);
      tc_mma16816<T>(sacc[n], ak, bq);
      tc_mma16816<T>(sacc[n + 1], ak, bq + 2);
      tc_mma16816<T>(pacc[n], av, bd);
      tc_mma16816<T>(pacc[n + 1], av, bd + 2);
    }
  }
  // P^T into sacc, dS^T into pacc.
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = kb + g + (e >> 1) * 8, qr = n * 8 + 2 * t + (e & 1);
      float pr, ds;
      attn_pds<MASK, float, true>(p, sacc[n][e], pacc[n][e], sl[qr], sd[qr], scale, softcap, m0 + qr, n0 + key, pr,
                                  ds);
      sacc[n][e] = pr;
      pacc[n][e] = ds;
    }
  // dV += P^T dO and dK += dS^T Q over this warp's head-dim slice (the accumulator tiles are the
  // A operands directly: two 16x8 C tiles side by side are one 16x16 A tile).
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    unsigned ap[4], as[4];
    ap[0] = attn_pack<T>(sacc[2 * kk][0], sacc[2 * kk][1]);
    ap[1] = attn_pack<T>(sacc[2 * kk][2], sacc[2 * kk][3]);
    ap[2] = attn_pack<T>(sacc[2 * kk + 1][0], sacc[2 * kk + 1][1]);
    ap[3] = attn_pack<T>(sacc[2 * kk + 1][2], sacc[2 * kk + 1][3]);
    as[0] = attn_pack<T>(pacc[2 * kk][0], pacc[2 * kk][1]);
    as[1] = attn_pack<T>(pacc[2 * kk][2], pacc[2 * kk][3]);
    as[2] = attn_pack<T>(pacc[2 * kk + 1][0], pacc[2 * kk + 1][1]);
    as[3] = attn_pack<T>(pacc[2 * kk + 1][2], pacc[2 * kk + 1][3]);
#pragma unroll
    for (int n = 0; n < DW / 8; n += 2) {
      unsigned bd[4], bq[4];
      const int brow = kk * 16 + (l & 7) + ((l >> 3) & 1) * 8, bcol = wd * DW + n * 8 + (l >> 4) * 8;
      tc_ldmatrix_x4_trans(bd, sdO + brow * LD + bcol);
      tc_ldmatrix_x4_trans(bq, sQ + brow * LD + bcol);
      tc_mma16816<T>(dvacc[n], ap, bd);
      tc_mma16816<T>(dvacc[n + 1], ap, bd + 2);
      tc_mma16816<T>(dkacc[n], as, bq);
      tc_mma16816<T>(dkacc[n + 1], as, bq + 2);
    }
  }
  if constexpr (DQ) {
    // dS^T to shared memory ([key][query]); then dQ (BM x DP) = dS K, split over the warps.
    if (wd == 0) {
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        unsigned* r0 = reinterpret_cast<unsigned*>(sdS + (kb + g) * LDS + n * 8 + 2 * t);
        unsigned* r1 = reinterpret_cast<unsigned*>(sdS + (kb + g + 8) * LDS + n * 8 + 2 * t);
        *r0 = attn_pack<T>(pacc[n][0], pacc[n][1]);
        *r1 = attn_pack<T>(pacc[n][2], pacc[n][3]);
      }
    }
    __syncthreads();
    constexpr int RG = BM / 16, CG = NW / RG, QW = DP / CG;
    static_assert(NW % RG == 0 && DP % (16 * CG) == 0, "dQ split");
    const int rg = w % RG, cg = w / RG;
    float qacc[QW / 8][4];
#pragma unroll
    for (int n = 0; n < QW / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) qacc[n][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < BN; kk += 16) {
      unsigned a[4];
      const int mi = l >> 3;
      tc_ldmatrix_x4_trans(a, sdS + (kk + (l & 7) + (mi >> 1) * 8) * LDS + rg * 16 + (mi & 1) * 8);
#pragma unroll
      for (int n = 0; n < QW / 8; n += 2) {
        unsigned bk[4];
        const int brow = kk + (l & 7) + ((l >> 3) & 1) * 8, bcol = cg * QW + n * 8 + (l >> 4) * 8;
        tc_ldmatrix_x4_trans(bk, sK + brow * LD + bcol);
        tc_mma16816<T>(qacc[n], a, bk);
        tc_mma16816<T>(qacc[n + 1], a, bk + 2);
      }
    }
#pragma unroll
    for (int n = 0; n < QW / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const long long i = m0 + rg * 16 + g + (e >> 1) * 8;
        const long long d = cg * QW + n * 8 + 2 * t + (e & 1);
        if (i < p.Sq && d < p.D) atomicAdd(dq_acc + ((b * p.Sq + i) * p.Hq + h) * p.D + d, qacc[n][e]);
      }
  }
}

// attn_main_step of the lean kernel (cupy@fa2_lean).  QS (a divisor of BM, a multiple of 16): the
// query rows per pass of S, dP, P, dS and the dK, dV update; QS < BM keeps only QS / 8 score tiles
// live (the K, V fragments are reloaded per pass), QS = BM is one pass.  RED2: dQ added by
// two-float reductions (red.global.add.v2.f32, sm_90) when D is even, else one float each.
template <typename T, int DP, int BM, int BN, int WD, bool DQ, bool MASK, int QS, bool RED2>
__device__ __forceinline__ void attn_main_step_lean(const AttnParams& p, float scale, float softcap, const T* sK,
                                               const T* sV, const T* sQ, const T* sdO, const float* sl,
                                               const float* sd, T* sdS, long long m0, long long n0,
                                               float (&dkacc)[DP / WD / 8][4], float (&dvacc)[DP / WD / 8][4],
                                               float* dq_acc, long long b, long long h) {
  constexpr int LD = DP + 8, LDS = BM + 8, NT = QS / 8, NW = (BN / 16) * WD, DW = DP / WD;
  static_assert(BM % QS == 0 && QS % 16 == 0, "query sub-block");
  const int tid = threadIdx.x, w = tid >> 5, l = tid & 31, g = l >> 2, t = l & 3;
  const int kb = (w / WD) * 16, wd = w % WD;
#pragma unroll 1
  for (int q0 = 0; q0 < BM; q0 += QS) {
    float sacc[NT][4], pacc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) sacc[n][e] = pacc[n][e] = 0.0f;
    // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys (rows) x QS queries (columns).
#pragma unroll
    for (int k = 0; k < DP; k += 16) {
      unsigned ak[4], av[4];
      const int arow = kb + (l & 7) + ((l >> 3) & 1) * 8, acol = k + (l >> 4) * 8;
      tc_ldmatrix_x4(ak, sK + arow * LD + acol);
      tc_ldmatrix_x4(av, sV + arow * LD + acol);
#pragma unroll
      for (int n = 0; n < NT; n += 2) {
        unsigned bq[4], bd[4];
        const int brow = q0 + n * 8 + (l & 7) + (l >> 4) * 8, bcol = k + ((l >> 3) & 1) * 8;
        tc_ldmatrix_x4(bq, sQ + brow * LD + bcol);
        tc_ldmatrix_x4(bd, sdO + brow * LD + bcol);
        tc_mma16816<T>(sacc[n], ak, bq);
        tc_mma16816<T>(sacc[n + 1], ak, bq + 2);
        tc_mma16816<T>(pacc[n], av, bd);
        tc_mma16816<T>(pacc[n + 1], av, bd + 2);
      }
    }
    // P^T into sacc, dS^T into pacc.
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kb + g + (e >> 1) * 8, qr = q0 + n * 8 + 2 * t + (e & 1);
        float pr, ds;
        attn_pds<MASK, float, true>(p, sacc[n][e], pacc[n][e], sl[qr], sd[qr], scale, softcap, m0 + qr, n0 + key, pr,
                                    ds);
        sacc[n][e] = pr;
        pacc[n][e] = ds;
      }
    // dV += P^T dO and dK += dS^T Q over this warp's head-dim slice (the accumulator tiles are the
    // A operands directly: two 16x8 C tiles side by side are one 16x16 A tile).
#pragma unroll
    for (int kk = 0; kk < NT / 2; ++kk) {
      unsigned ap[4], as[4];
      ap[0] = attn_pack<T>(sacc[2 * kk][0], sacc[2 * kk][1]);
      ap[1] = attn_pack<T>(sacc[2 * kk][2], sacc[2 * kk][3]);
      ap[2] = attn_pack<T>(sacc[2 * kk + 1][0], sacc[2 * kk + 1][1]);
      ap[3] = attn_pack<T>(sacc[2 * kk + 1][2], sacc[2 * kk + 1][3]);
      as[0] = attn_pack<T>(pacc[2 * kk][0], pacc[2 * kk][1]);
      as[1] = attn_pack<T>(pacc[2 * kk][2], pacc[2 * kk][3]);
      as[2] = attn_pack<T>(pacc[2 * kk + 1][0], pacc[2 * kk + 1][1]);
      as[3] = attn_pack<T>(pacc[2 * kk + 1][2], pacc[2 * kk + 1][3]);
#pragma unroll
      for (int n = 0; n < DW / 8; n += 2) {
        unsigned bd[4], bq[4];
        const int brow = q0 + kk * 16 + (l & 7) + ((l >> 3) & 1) * 8, bcol = wd * DW + n * 8 + (l >> 4) * 8;
        tc_ldmatrix_x4_trans(bd, sdO + brow * LD + bcol);
        tc_ldmatrix_x4_trans(bq, sQ + brow * LD + bcol);
        tc_mma16816<T>(dvacc[n], ap, bd);
        tc_mma16816<T>(dvacc[n + 1], ap, bd + 2);
        tc_mma16816<T>(dkacc[n], as, bq);
        tc_mma16816<T>(dkacc[n + 1], as, bq + 2);
      }
    }
    if constexpr (DQ) {
      // dS^T to shared memory ([key][query]) for the dQ product below.
      if (wd == 0) {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          unsigned* r0 = reinterpret_cast<unsigned*>(sdS + (kb + g) * LDS + q0 + n * 8 + 2 * t);
          unsigned* r1 = reinterpret_cast<unsigned*>(sdS + (kb + g + 8) * LDS + q0 + n * 8 + 2 * t);
          *r0 = attn_pack<T>(pacc[n][0], pacc[n][1]);
          *r1 = attn_pack<T>(pacc[n][2], pacc[n][3]);
        }
      }
    }
  }
  if constexpr (DQ) {
    // dQ (BM x DP) = dS K, split over the warps.
    __syncthreads();
    constexpr int RG = BM / 16, CG = NW / RG, QW = DP / CG;
    static_assert(NW % RG == 0 && DP % (16 * CG) == 0, "dQ split");
    const int rg = w % RG, cg = w / RG;
    float qacc[QW / 8][4];
#pragma unroll
    for (int n = 0; n < QW / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) qacc[n][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < BN; kk += 16) {
      unsigned a[4];
      const int mi = l >> 3;
      tc_ldmatrix_x4_trans(a, sdS + (kk + (l & 7) + (mi >> 1) * 8) * LDS + rg * 16 + (mi & 1) * 8);
#pragma unroll
      for (int n = 0; n < QW / 8; n += 2) {
        unsigned bk[4];
        const int brow = kk + (l & 7) + ((l >> 3) & 1) * 8, bcol = cg * QW + n * 8 + (l >> 4) * 8;
        tc_ldmatrix_x4_trans(bk, sK + brow * LD + bcol);
        tc_mma16816<T>(qacc[n], a, bk);
        tc_mma16816<T>(qacc[n + 1], a, bk + 2);
      }
    }
#pragma unroll
    for (int n = 0; n < QW / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const long long i = m0 + rg * 16 + g + (e >> 1) * 8;
        const long long d = cg * QW + n * 8 + 2 * t + (e & 1);
        if constexpr (RED2) {
          if ((e & 1) == 0 && i < p.Sq && d < p.D) {
            float* a = dq_acc + ((b * p.Sq + i) * p.Hq + h) * p.D + d;
            if ((p.D & 1) == 0)
              attn_red2(a, qacc[n][e], qacc[n][e + 1]);
            else {
              atomicAdd(a, qacc[n][e]);
              if (d + 1 < p.D) atomicAdd(a + 1, qacc[n][e + 1]);
            }
          }
        } else {
          if (i < p.Sq && d < p.D) atomicAdd(dq_acc + ((b * p.Sq + i) * p.Hq + h) * p.D + d, qacc[n][e]);
        }
      }
  }
}

template <typename T, int DP, int BM, int BN, int WD, bool DQ, int QS = BM, bool RED2 = false>
__global__ void __launch_bounds__(32 * (BN / 16) * WD)
    attn_fa2_main(AttnParams p, double scale_d, double softcap_d, const T* __restrict__ q, const T* __restrict__ k,
                  const T* __restrict__ v, const T* __restrict__ dO, const float* __restrict__ lse_ws,
                  const float* __restrict__ delta_ws, float* __restrict__ dq_acc, float* __restrict__ part,
                  T* __restrict__ dk, T* __restrict__ dv) {
  constexpr int LD = DP + 8, NW = (BN / 16) * WD, NTH = 32 * NW, DW = DP / WD;
  TC_DYNAMIC_SHARED(T, sK);
  T* sV = sK + BN * LD;
  T* sQ = sV + BN * LD;        // [2][BM][LD]
  T* sdO = sQ + 2 * BM * LD;   // [2][BM][LD]
  T* sdS = sdO + 2 * BM * LD;  // [BN][BM + 8]
  float* sl = reinterpret_cast<float*>(sdS + BN * (BM + 8));  // [2][BM]
  float* sd = sl + 2 * BM;                                     // [2][BM]
  const int tid = threadIdx.x, w = tid >> 5, l = tid & 31, g = l >> 2, t = l & 3;
  const long long bc = blockIdx.y / p.split, sp = blockIdx.y % p.split, b = bc / p.Hkv, c = bc % p.Hkv;
  const long long gs = p.G / p.split, h0 = c * p.G + sp * gs;  // this block's query heads: h0 .. h0 + gs - 1
  const long long n0 = (long long)blockIdx.x * BN;
  const long long off = p.Sk - p.Sq, n1 = n0 + BN < p.Sk ? n0 + BN : p.Sk;
  const bool aligned = p.aligned != 0;
  const int dd = (int)p.D;
  const float scale = (float)scale_d, softcap = (float)softcap_d;

  // Query rows that meet keys [n0, n1): [i_lo, i_hi).
  long long i_lo = p.right >= 0 ? n0 - off - p.right : 0, i_hi = p.left >= 0 ? n1 - off + p.left : p.Sq;
  i_lo = i_lo < 0 ? 0 : i_lo;
  i_hi = i_hi > p.Sq ? p.Sq : i_hi;
  const long long mb_lo = i_lo / BM, mb_n = i_hi > i_lo ? (i_hi + BM - 1) / BM - mb_lo : 0;
  const long long steps = mb_n * gs;

  attn_load<T, DP, LD>(sK, k + b * p.k_b + n0 * p.k_s + c * p.k_h, p.k_s, BN, (int)(n1 - n0), dd, aligned, tid, NTH);
  attn_load<T, DP, LD>(sV, v + b * p.v_b + n0 * p.v_s + c * p.v_h, p.v_s, BN, (int)(n1 - n0), dd, aligned, tid, NTH);
  auto prefetch = [&](long long it, int buf) {
    const long long h = h0 + it / mb_n, m0 = (mb_lo + it % mb_n) * BM;
    const int valid = (int)(p.Sq - m0 < BM ? p.Sq - m0 : BM);
    attn_load<T, DP, LD>(sQ + buf * BM * LD, q + b * p.q_b + m0 * p.q_s + h * p.q_h, p.q_s, BM, valid, dd, aligned,
                         tid, NTH);
    attn_load<T, DP, LD>(sdO + buf * BM * LD, dO + b * p.do_b + m0 * p.do_s + h * p.do_h, p.do_s, BM, valid, dd,
                         aligned, tid, NTH);
    attn_load_stats(sl + buf * BM, sd + buf * BM, lse_ws, delta_ws, (b * p.Hq + h) * p.Sq, m0, BM, p.Sq, tid, NTH);
  };
  if (steps > 0) prefetch(0, 0);
  tc_cp_commit();

  float dkacc[DW / 8][4], dvacc[DW / 8][4];
#pragma unroll
  for (int n = 0; n < DW / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dkacc[n][e] = dvacc[n][e] = 0.0f;

  for (long long it = 0; it < steps; ++it) {
    const int buf = (int)(it & 1);
    tc_cp_wait<0>();
    __syncthreads();  // this step's tiles are in; every warp is done with the other buffer and sdS
    if (it + 1 < steps) prefetch(it + 1, buf ^ 1);
    tc_cp_commit();
    const long long h = h0 + it / mb_n, m0 = (mb_lo + it % mb_n) * BM;
    const T* q_t = sQ + buf * BM * LD;
    const T* do_t = sdO + buf * BM * LD;
    if constexpr (QS != BM || RED2) {
      if (attn_full(p, m0, BM, n0, BN))
        attn_main_step_lean<T, DP, BM, BN, WD, DQ, false, QS, RED2>(p, scale, softcap, sK, sV, q_t, do_t,
                                                                    sl + buf * BM, sd + buf * BM, sdS, m0, n0,
                                                                    dkacc, dvacc, dq_acc, b, h);
      else
        attn_main_step_lean<T, DP, BM, BN, WD, DQ, true, QS, RED2>(p, scale, softcap, sK, sV, q_t, do_t,
                                                                   sl + buf * BM, sd + buf * BM, sdS, m0, n0,
                                                                   dkacc, dvacc, dq_acc, b, h);
    } else if (attn_full(p, m0, BM, n0, BN))
      attn_main_step<T, DP, BM, BN, WD, DQ, false>(p, scale, softcap, sK, sV, q_t, do_t, sl + buf * BM,
                                                   sd + buf * BM, sdS, m0, n0, dkacc, dvacc, dq_acc, b, h);
    else
      attn_main_step<T, DP, BM, BN, WD, DQ, true>(p, scale, softcap, sK, sV, q_t, do_t, sl + buf * BM,
                                                  sd + buf * BM, sdS, m0, n0, dkacc, dvacc, dq_acc, b, h);
  }
  tc_cp_wait<0>();

  // dK = scale * sum dS^T Q, dV = sum P^T dO (rows past Sk and columns past D are not stored);
  // with split > 1, this block's share in fp32 to part[sp] ((split, B, Sk, Hkv, D) for dk, then dv).
  const int kb = (w / WD) * 16, wd = w % WD;
  const long long n_kv = p.B * p.Sk * p.Hkv * p.D;
#pragma unroll
  for (int n = 0; n < DW / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const long long j = n0 + kb + g + (e >> 1) * 8;
      const long long d = wd * DW + n * 8 + 2 * t + (e & 1);
      if (j < p.Sk && d < p.D) {
        if (p.split == 1) {
          dk[b * p.dk_b + j * p.dk_s + c * p.dk_h + d] = attn_cast<T>(scale * dkacc[n][e]);
          dv[b * p.dv_b + j * p.dv_s + c * p.dv_h + d] = attn_cast<T>(dvacc[n][e]);
        } else {
          float* pk = part + sp * n_kv + ((b * p.Sk + j) * p.Hkv + c) * p.D + d;
          pk[0] = scale * dkacc[n][e];
          pk[p.split * n_kv] = dvacc[n][e];
        }
      }
    }
}

// dk, dv = the sums of the split partials of attn_fa2_main, in split order (deterministic).
template <typename T>
__global__ void __launch_bounds__(256) attn_split_sum(AttnParams p, const float* __restrict__ part, T* __restrict__ dk,
                                                      T* __restrict__ dv) {
  const long long n = p.B * p.Sk * p.Hkv * p.D;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x) {
    float sk = 0.0f, sv = 0.0f;
    for (long long s = 0; s < p.split; ++s) {
      sk += part[s * n + e];
      sv += part[(p.split + s) * n + e];
    }
    const long long d = e % p.D, rest = e / p.D, c = rest % p.Hkv, bj = rest / p.Hkv, j = bj % p.Sk, b = bj / p.Sk;
    dk[b * p.dk_b + j * p.dk_s + c * p.dk_h + d] = attn_cast<T>(sk);
    dv[b * p.dv_b + j * p.dv_s + c * p.dv_h + d] = attn_cast<T>(sv);
  }
}

// ---------------------------------------------------------------------------------- deterministic dq

template <typename T, int DP, int BM, int BN, bool MASK>
__device__ __forceinline__ void attn_dq_step(const AttnParams& p, float scale, float softcap, const T* sQ,
                                             const T* sdO, const T* sK, const T* sV, const float* sl, const float* sd,
                                             long long m0, long long n0, float (&qacc)[DP / 8][4]) {
  constexpr int LD = DP + 8, NT = BN / 8;
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, g = l >> 2, t = l & 3, qb = w * 16;
  float sacc[NT][4], pacc[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) sacc[n][e] = pacc[n][e] = 0.0f;
  // S = Q K^T and dP = dO V^T for this warp's 16 queries (rows) x BN keys.
#pragma unroll
  for (int k = 0; k < DP; k += 16) {
    unsigned aq[4], ad[4];
    const int arow = qb + (l & 7) + ((l >> 3) & 1) * 8, acol = k + (l >> 4) * 8;
    tc_ldmatrix_x4(aq, sQ + arow * LD + acol);
    tc_ldmatrix_x4(ad, sdO + arow * LD + acol);
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
      unsigned bk[4], bv[4];
      const int brow = n * 8 + (l & 7) + (l >> 4) * 8, bcol = k + ((l >> 3) & 1) * 8;
      tc_ldmatrix_x4(bk, sK + brow * LD + bcol);
      tc_ldmatrix_x4(bv, sV + brow * LD + bcol);
      tc_mma16816<T>(sacc[n], aq, bk);
      tc_mma16816<T>(sacc[n + 1], aq, bk + 2);
      tc_mma16816<T>(pacc[n], ad, bv);
      tc_mma16816<T>(pacc[n + 1], ad, bv + 2);
    }
  }
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int qr = qb + g + (e >> 1) * 8, key = n * 8 + 2 * t + (e & 1);
      float pr, ds;
      attn_pds<MASK, float, true>(p, sacc[n][e], pacc[n][e], sl[qr], sd[qr], scale, softcap, m0 + qr, n0 + key, pr,
                                  ds);
      pacc[n][e] = ds;
    }
  // dQ += dS K.
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    unsigned a[4];
    a[0] = attn_pack<T>(pacc[2 * kk][0], pacc[2 * kk][1]);
    a[1] = attn_pack<T>(pacc[2 * kk][2], pacc[2 * kk][3]);
    a[2] = attn_pack<T>(pacc[2 * kk + 1][0], pacc[2 * kk + 1][1]);
    a[3] = attn_pack<T>(pacc[2 * kk + 1][2], pacc[2 * kk + 1][3]);
#pragma unroll
    for (int n = 0; n < DP / 8; n += 2) {
      unsigned bk[4];
      const int brow = kk * 16 + (l & 7) + ((l >> 3) & 1) * 8, bcol = n * 8 + (l >> 4) * 8;
      tc_ldmatrix_x4_trans(bk, sK + brow * LD + bcol);
      tc_mma16816<T>(qacc[n], a, bk);
      tc_mma16816<T>(qacc[n + 1], a, bk + 2);
    }
  }
}

template <typename T, int DP, int BM, int BN>
__global__ void __launch_bounds__(32 * (BM / 16))
    attn_fa2_dq(AttnParams p, double scale_d, double softcap_d, const T* __restrict__ q, const T* __restrict__ k,
                const T* __restrict__ v, const T* __restrict__ dO, const float* __restrict__ lse_ws,
                const float* __restrict__ delta_ws, T* __restrict__ dq) {
  constexpr int LD = DP + 8, NTH = 32 * (BM / 16);
  TC_DYNAMIC_SHARED(T, sQ);
  T* sdO = sQ + BM * LD;
  T* sK = sdO + BM * LD;  // [2][BN][LD]
  T* sV = sK + 2 * BN * LD;  // [2][BN][LD]
  float* sl = reinterpret_cast<float*>(sV + 2 * BN * LD);
  float* sd = sl + BM;
  const int tid = threadIdx.x, w = tid >> 5, l = tid & 31, g = l >> 2, t = l & 3;
  const long long m0 = (long long)blockIdx.x * BM, b = blockIdx.y / p.Hq, h = blockIdx.y % p.Hq, c = h / p.G;
  const long long off = p.Sk - p.Sq, m1 = m0 + BM < p.Sq ? m0 + BM : p.Sq;
  const bool aligned = p.aligned != 0;
  const int dd = (int)p.D;
  const float scale = (float)scale_d, softcap = (float)softcap_d;

  // Keys that rows [m0, m1) meet: [j_lo, j_hi).
  long long j_lo = p.left >= 0 ? m0 + off - p.left : 0, j_hi = p.right >= 0 ? m1 - 1 + off + p.right + 1 : p.Sk;
  j_lo = j_lo < 0 ? 0 : j_lo;
  j_hi = j_hi > p.Sk ? p.Sk : j_hi;
  const long long nb_lo = j_lo / BN, steps = j_hi > j_lo ? (j_hi + BN - 1) / BN - nb_lo : 0;

  attn_load<T, DP, LD>(sQ, q + b * p.q_b + m0 * p.q_s + h * p.q_h, p.q_s, BM, (int)(m1 - m0), dd, aligned, tid, NTH);
  attn_load<T, DP, LD>(sdO, dO + b * p.do_b + m0 * p.do_s + h * p.do_h, p.do_s, BM, (int)(m1 - m0), dd, aligned, tid,
                       NTH);
  attn_load_stats(sl, sd, lse_ws, delta_ws, (b * p.Hq + h) * p.Sq, m0, BM, p.Sq, tid, NTH);
  auto prefetch = [&](long long it, int buf) {
    const long long n0 = (nb_lo + it) * BN;
    const int valid = (int)(p.Sk - n0 < BN ? p.Sk - n0 : BN);
    attn_load<T, DP, LD>(sK + buf * BN * LD, k + b * p.k_b + n0 * p.k_s + c * p.k_h, p.k_s, BN, valid, dd, aligned,
                         tid, NTH);
    attn_load<T, DP, LD>(sV + buf * BN * LD, v + b * p.v_b + n0 * p.v_s + c * p.v_h, p.v_s, BN, valid, dd, aligned,
                         tid, NTH);
  };
  if (steps > 0) prefetch(0, 0);
  tc_cp_commit();

  float qacc[DP / 8][4];
#pragma unroll
  for (int n = 0; n < DP / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) qacc[n][e] = 0.0f;
  for (long long it = 0; it < steps; ++it) {
    const int buf = (int)(it & 1);
    tc_cp_wait<0>();
    __syncthreads();
    if (it + 1 < steps) prefetch(it + 1, buf ^ 1);
    tc_cp_commit();
    const long long n0 = (nb_lo + it) * BN;
    if (attn_full(p, m0, BM, n0, BN))
      attn_dq_step<T, DP, BM, BN, false>(p, scale, softcap, sQ, sdO, sK + buf * BN * LD, sV + buf * BN * LD, sl, sd,
                                         m0, n0, qacc);
    else
      attn_dq_step<T, DP, BM, BN, true>(p, scale, softcap, sQ, sdO, sK + buf * BN * LD, sV + buf * BN * LD, sl, sd,
                                        m0, n0, qacc);
  }
  tc_cp_wait<0>();
#pragma unroll
  for (int n = 0; n < DP / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const long long i = m0 + w * 16 + g + (e >> 1) * 8;
      const long long d = n * 8 + 2 * t + (e & 1);
      if (i < p.Sq && d < p.D) dq[b * p.dq_b + i * p.dq_s + h * p.dq_h + d] = attn_cast<T>(scale * qacc[n][e]);
    }
}

// ---------------------------------------------------------------------------------- SIMT (f32, f64)

template <typename ACC>
__device__ __forceinline__ ACC attn_warp_sum(ACC s) {
  for (int m = 16; m; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
  return s;
}

template <typename T, typename ACC, int NPL>
__device__ __forceinline__ void attn_row(ACC (&x)[NPL], const T* row, long long d, int lane) {
#pragma unroll
  for (int e = 0; e < NPL; ++e) {
    const long long col = lane + 32 * e;
    x[e] = col < d ? (ACC)attn_f(row[col]) : (ACC)0;
  }
}

template <typename ACC, int NPL>
__device__ __forceinline__ ACC attn_dot(const ACC (&a)[NPL], const ACC (&b)[NPL]) {
  ACC s = 0;
#pragma unroll
  for (int e = 0; e < NPL; ++e) s += a[e] * b[e];
  return attn_warp_sum(s);
}

template <typename T, typename ACC, int NPL>
__global__ void __launch_bounds__(128)
    attn_simt_dq(AttnParams p, double scale_d, double softcap_d, const T* __restrict__ q, const T* __restrict__ k,
                 const T* __restrict__ v, const T* __restrict__ dO, const ACC* __restrict__ lse_ws,
                 const ACC* __restrict__ delta_ws, T* __restrict__ dq) {
  const int lane = threadIdx.x & 31;
  const long long r = (long long)blockIdx.x * 4 + (threadIdx.x >> 5);
  if (r >= p.B * p.Hq * p.Sq) return;  // whole warps
  const long long i = r % p.Sq, bh = r / p.Sq, h = bh % p.Hq, b = bh / p.Hq, c = h / p.G;
  const ACC scale = (ACC)scale_d, softcap = (ACC)softcap_d, lse = lse_ws[r], delta = delta_ws[r];
  const long long diag = i + (p.Sk - p.Sq);
  long long lo = p.left >= 0 ? diag - p.left : 0, hi = p.right >= 0 ? diag + p.right : p.Sk - 1;
  lo = lo < 0 ? 0 : lo;
  hi = hi > p.Sk - 1 ? p.Sk - 1 : hi;
  ACC qi[NPL], di[NPL], acc[NPL];
  attn_row<T, ACC, NPL>(qi, q + b * p.q_b + i * p.q_s + h * p.q_h, p.D, lane);
  attn_row<T, ACC, NPL>(di, dO + b * p.do_b + i * p.do_s + h * p.do_h, p.D, lane);
#pragma unroll
  for (int e = 0; e < NPL; ++e) acc[e] = 0;
  for (long long j = lo; j <= hi; ++j) {
    ACC kj[NPL], vj[NPL];
    attn_row<T, ACC, NPL>(kj, k + b * p.k_b + j * p.k_s + c * p.k_h, p.D, lane);
    attn_row<T, ACC, NPL>(vj, v + b * p.v_b + j * p.v_s + c * p.v_h, p.D, lane);
    ACC pr, ds;
    attn_pds<false, ACC>(p, attn_dot(qi, kj), attn_dot(di, vj), lse, delta, scale, softcap, i, j, pr, ds);
#pragma unroll
    for (int e = 0; e < NPL; ++e) acc[e] += ds * kj[e];
  }
  T* out = dq + b * p.dq_b + i * p.dq_s + h * p.dq_h;
#pragma unroll
  for (int e = 0; e < NPL; ++e)
    if (lane + 32 * e < p.D) out[lane + 32 * e] = attn_castd<T>(scale * acc[e]);
}

template <typename T, typename ACC, int NPL>
__global__ void __launch_bounds__(128)
    attn_simt_dkdv(AttnParams p, double scale_d, double softcap_d, const T* __restrict__ q, const T* __restrict__ k,
                   const T* __restrict__ v, const T* __restrict__ dO, const ACC* __restrict__ lse_ws,
                   const ACC* __restrict__ delta_ws, T* __restrict__ dk, T* __restrict__ dv) {
  const int lane = threadIdx.x & 31;
  const long long r = (long long)blockIdx.x * 4 + (threadIdx.x >> 5);
  if (r >= p.B * p.Hkv * p.Sk) return;  // whole warps
  const long long j = r % p.Sk, bc = r / p.Sk, c = bc % p.Hkv, b = bc / p.Hkv;
  const ACC scale = (ACC)scale_d, softcap = (ACC)softcap_d;
  const long long off = p.Sk - p.Sq;
  // Queries that may attend key j: j <= i + off + right and j >= i + off - left.
  long long lo = p.right >= 0 ? j - off - p.right : 0, hi = p.left >= 0 ? j - off + p.left : p.Sq - 1;
  lo = lo < 0 ? 0 : lo;
  hi = hi > p.Sq - 1 ? p.Sq - 1 : hi;
  ACC kj[NPL], vj[NPL], dka[NPL], dva[NPL];
  attn_row<T, ACC, NPL>(kj, k + b * p.k_b + j * p.k_s + c * p.k_h, p.D, lane);
  attn_row<T, ACC, NPL>(vj, v + b * p.v_b + j * p.v_s + c * p.v_h, p.D, lane);
#pragma unroll
  for (int e = 0; e < NPL; ++e) dka[e] = dva[e] = 0;
  for (long long h = c * p.G; h < (c + 1) * p.G; ++h) {
    for (long long i = lo; i <= hi; ++i) {
      const long long row = (b * p.Hq + h) * p.Sq + i;
      ACC qi[NPL], di[NPL];
      attn_row<T, ACC, NPL>(qi, q + b * p.q_b + i * p.q_s + h * p.q_h, p.D, lane);
      attn_row<T, ACC, NPL>(di, dO + b * p.do_b + i * p.do_s + h * p.do_h, p.D, lane);
      ACC pr, ds;
      attn_pds<false, ACC>(p, attn_dot(qi, kj), attn_dot(di, vj), lse_ws[row], delta_ws[row], scale, softcap, i, j,
                           pr, ds);
#pragma unroll
      for (int e = 0; e < NPL; ++e) {
        dka[e] += ds * qi[e];
        dva[e] += pr * di[e];
      }
    }
  }
  T* ok = dk + b * p.dk_b + j * p.dk_s + c * p.dk_h;
  T* ov = dv + b * p.dv_b + j * p.dv_s + c * p.dv_h;
#pragma unroll
  for (int e = 0; e < NPL; ++e)
    if (lane + 32 * e < p.D) {
      ok[lane + 32 * e] = attn_castd<T>(scale * dka[e]);
      ov[lane + 32 * e] = attn_castd<T>(dva[e]);
    }
}
