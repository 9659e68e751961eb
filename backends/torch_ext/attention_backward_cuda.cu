// attention_backward on CUDA for the torch extension: the launches of backends/cuda/attention_backward.cuh
// (the device code cupy compiles with NVRTC) as cupy@fa2_lean (= cupy@best) and cupy@fa2_lean_det launch
// them with their default tiles: the plan comes from Python (backends/torch_ext/attention_backward.py,
// from the cupy planner); this file checks the arguments and the plan's template parameters against
// what is built, and launches.
// Workspaces (lse, delta and the fp32 dq accumulator) come from torch's caching allocator.
#include <cstdint>
#include <cstring>

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../cuda/attention_backward.cuh"
#include "attention_backward.h"

static_assert(sizeof(AttnParams) == sizeof(gradoracle::AttnParamsH), "AttnParams and its host copy differ");

namespace gradoracle {
namespace {

template <typename S> struct CudaType { using type = S; };
template <> struct CudaType<at::Half> { using type = __half; };
template <> struct CudaType<at::BFloat16> { using type = __nv_bfloat16; };

// The tiles built here per padded head dim: cupy's lean defaults (LEAN_CFGS[dp][0], DQ_CFGS[dp][0]).
template <int DP> struct AttnTiles;
template <> struct AttnTiles<64> { static constexpr int BM = 64, BN = 128, WD = 1, QS = 32, QBM = 64, QBN = 64; };
template <> struct AttnTiles<128> { static constexpr int BM = 64, BN = 128, WD = 1, QS = 16, QBM = 64, QBN = 64; };
template <> struct AttnTiles<256> { static constexpr int BM = 32, BN = 64, WD = 2, QS = 16, QBM = 64, QBN = 32; };

// attn_pre_vec's lanes per query row for head dim d: d / 8 rounded up to a power of two, at most 32
// (cupy's pre_lanes).
inline int64_t attn_pre_lanes(int64_t d) {
  int64_t n = 1;
  while (n < 32 && 8 * n < d) n *= 2;
  return n;
}

// The 16-byte preprocess (attn_pre_vec) and dq convert (attn_dq_convert_vec): the plan asks for them
// only when D % 8 == 0 and o, do, dq allow 16-byte accesses; checked again here, so that a plan
// reused on other tensors is an error, never a misaligned access.
inline void check_vec(const at::Tensor& t, const char* name, int64_t d) {
  bool ok = d % 8 == 0 && reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0;
  for (int i = 0; i < 3; ++i) ok = ok && t.stride(i) % 8 == 0;
  TORCH_CHECK_VALUE(ok, "attention_backward: the plan takes 16-byte accesses to ", name,
                    " (D % 8 == 0, 16-byte aligned rows), which this tensor does not allow (D = ", d, ", strides ",
                    t.strides(), ")");
}

template <typename T, int LPR>
void launch_pre_vec(const AttnHeader& hd, const AttnParams& p, const T* o, const T* dout, const float* lse,
                    float* lse_ws, float* delta_ws, float* dq_acc, cudaStream_t stream) {
  attn_pre_vec<T, LPR><<<dim3(hd.g0x), 128, 0, stream>>>(p, o, dout, lse, lse_ws, delta_ws, dq_acc);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename K>
void allow_smem(K kernel, int bytes) {
  if (bytes > 48 * 1024)
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

template <typename T, int DP>
void run_tc(const AttnHeader& hd, const AttnParams& p, double scale, double softcap, const T* q, const T* k,
            const T* v, const T* o, const T* dout, const float* lse, float* lse_ws, float* delta_ws, float* dq_acc,
            float* part, T* dq, T* dk, T* dv, cudaStream_t stream) {
  using Tl = AttnTiles<DP>;
  const bool det = hd.kind == kAttnLeanDet;
  TORCH_CHECK(hd.bm == Tl::BM && hd.bn == Tl::BN && hd.wd == Tl::WD && hd.qs == Tl::QS &&
              (!det || (hd.qbm == Tl::QBM && hd.qbn == Tl::QBN)),
              "attention_backward: the plan's tiles (", hd.bm, "x", hd.bn, "x", hd.wd, ", QS ", hd.qs, ", dq ", hd.qbm,
              "x", hd.qbn, ") are not the ones built for head dim ", DP);
  TORCH_CHECK(hd.lpr == 0 || hd.lpr == attn_pre_lanes(p.D), "attention_backward: the plan's ", hd.lpr,
              " lanes per row for the preprocess, expected ", attn_pre_lanes(p.D), " for D = ", p.D);
  float* zero_acc = det ? nullptr : dq_acc;  // the preprocess zeroes the fp32 dq accumulator
  switch (hd.lpr) {
    case 0:
      attn_pre<T, float><<<dim3(hd.g0x), 128, 0, stream>>>(p, o, dout, lse, lse_ws, delta_ws, zero_acc);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      break;
    case 1: launch_pre_vec<T, 1>(hd, p, o, dout, lse, lse_ws, delta_ws, zero_acc, stream); break;
    case 2: launch_pre_vec<T, 2>(hd, p, o, dout, lse, lse_ws, delta_ws, zero_acc, stream); break;
    case 4: launch_pre_vec<T, 4>(hd, p, o, dout, lse, lse_ws, delta_ws, zero_acc, stream); break;
    case 8: launch_pre_vec<T, 8>(hd, p, o, dout, lse, lse_ws, delta_ws, zero_acc, stream); break;
    case 16: launch_pre_vec<T, 16>(hd, p, o, dout, lse, lse_ws, delta_ws, zero_acc, stream); break;
    default: launch_pre_vec<T, 32>(hd, p, o, dout, lse, lse_ws, delta_ws, zero_acc, stream); break;
  }
  constexpr int threads = 32 * (Tl::BN / 16) * Tl::WD, smem = attn_main_smem<DP, Tl::BM, Tl::BN>();
  if (det) {
    // cupy's fa2_lean_det main kernel: no dQ, query sub-blocks of QS rows, no vector dQ adds
    auto main = attn_fa2_main<T, DP, Tl::BM, Tl::BN, Tl::WD, false, Tl::QS, false>;
    allow_smem(main, smem);
    main<<<dim3(hd.g1x, hd.g1y), threads, smem, stream>>>(p, scale, softcap, q, k, v, dout, lse_ws, delta_ws,
                                                          nullptr, part, dk, dv);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    constexpr int qsmem = attn_dq_smem<DP, Tl::QBM, Tl::QBN>();
    auto dqk = attn_fa2_dq<T, DP, Tl::QBM, Tl::QBN>;
    allow_smem(dqk, qsmem);
    dqk<<<dim3(hd.g2x, hd.g2y), 32 * (Tl::QBM / 16), qsmem, stream>>>(p, scale, softcap, q, k, v, dout, lse_ws,
                                                                       delta_ws, dq);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  } else {
    auto main = attn_fa2_main<T, DP, Tl::BM, Tl::BN, Tl::WD, true, Tl::QS, true>;
    allow_smem(main, smem);
    main<<<dim3(hd.g1x, hd.g1y), threads, smem, stream>>>(p, scale, softcap, q, k, v, dout, lse_ws, delta_ws,
                                                          dq_acc, part, dk, dv);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (hd.lpr)
      attn_dq_convert_vec<T><<<dim3(hd.g2x), 256, 0, stream>>>(p, scale, dq_acc, dq);
    else
      attn_dq_convert<T><<<dim3(hd.g2x), 256, 0, stream>>>(p, scale, dq_acc, dq);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (p.split > 1) {
    attn_split_sum<T><<<dim3(hd.g3x), 256, 0, stream>>>(p, part, dk, dv);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

template <typename T, typename A, int NPL>
void run_simt(const AttnHeader& hd, const AttnParams& p, double scale, double softcap, const T* q, const T* k,
              const T* v, const T* o, const T* dout, const A* lse, A* lse_ws, A* delta_ws, T* dq, T* dk, T* dv,
              cudaStream_t stream) {
  attn_pre<T, A><<<dim3(hd.g0x), 128, 0, stream>>>(p, o, dout, lse, lse_ws, delta_ws, nullptr);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  attn_simt_dq<T, A, NPL><<<dim3(hd.g1x, hd.g1y), 128, 0, stream>>>(p, scale, softcap, q, k, v, dout, lse_ws,
                                                                     delta_ws, dq);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  attn_simt_dkdv<T, A, NPL><<<dim3(hd.g2x, hd.g2y), 128, 0, stream>>>(p, scale, softcap, q, k, v, dout, lse_ws,
                                                                       delta_ws, dk, dv);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void attention_backward_run_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o,
                                 const at::Tensor& dout, const at::Tensor& lse, const at::Tensor& plan, double scale,
                                 double softcap, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv) {
  const int64_t* words = plan_words("attention_backward", plan, kAttnWords);
  AttnHeader hd;
  AttnParamsH ph;
  std::memcpy(&hd, words, sizeof(hd));
  std::memcpy(&ph, words + kAttnHeader, sizeof(ph));
  attn_check(q, k, v, o, dout, lse, dq, dk, dv, ph);
  AttnParams p;
  std::memcpy(&p, &ph, sizeof(p));
  const c10::cuda::CUDAGuard guard(q.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t rows = ph.B * ph.Hq * ph.Sq;
  const auto st = q.scalar_type();
  const bool tc = st == at::kHalf || st == at::kBFloat16;
  TORCH_CHECK_VALUE(tc ? (hd.kind == kAttnLean || hd.kind == kAttnLeanDet) : hd.kind == kAttnSimt,
                    "attention_backward: plan kind ", hd.kind, " does not match dtype ", dtype_name(st));
  if (hd.lpr) {
    TORCH_CHECK_VALUE(tc, "attention_backward: the 16-byte preprocess is for bf16 / f16, not ", dtype_name(st));
    check_vec(o, "o", ph.D);
    check_vec(dout, "do", ph.D);
    check_vec(dq, "dq", ph.D);
  }
  const at::ScalarType acc = st == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor lse_ws = at::empty({rows}, q.options().dtype(acc)), delta_ws = at::empty({rows}, q.options().dtype(acc));
  if (tc) {
    at::Tensor dq_acc = hd.kind == kAttnLean ? at::empty({rows * ph.D}, q.options().dtype(at::kFloat)) : at::Tensor();
    float* acc_p = dq_acc.defined() ? dq_acc.data_ptr<float>() : nullptr;
    TORCH_CHECK_VALUE(ph.split >= 1 && ph.G % ph.split == 0 && (ph.split == 1) == (hd.g3x == 0),
                      "attention_backward: the plan's split ", ph.split, " (grid ", hd.g3x, ") does not divide G = ", ph.G);
    at::Tensor part = ph.split > 1 ? at::empty({2 * ph.split * ph.B * ph.Sk * ph.Hkv * ph.D}, q.options().dtype(at::kFloat))
                                   : at::Tensor();
    float* part_p = part.defined() ? part.data_ptr<float>() : nullptr;
    auto go = [&](auto tag, auto dpc) {
      using S = decltype(tag);
      using T = typename CudaType<S>::type;
      constexpr int DP = decltype(dpc)::value;
      auto P = [](const at::Tensor& t) { return reinterpret_cast<const T*>(t.const_data_ptr()); };
      auto M = [](at::Tensor& t) { return reinterpret_cast<T*>(t.mutable_data_ptr()); };
      run_tc<T, DP>(hd, p, scale, softcap, P(q), P(k), P(v), P(o), P(dout), lse.const_data_ptr<float>(),
                    lse_ws.data_ptr<float>(), delta_ws.data_ptr<float>(), acc_p, part_p, M(dq), M(dk), M(dv), stream);
    };
    auto by_dp = [&](auto tag) {
      if (hd.dp == 64) go(tag, std::integral_constant<int, 64>{});
      else if (hd.dp == 128) go(tag, std::integral_constant<int, 128>{});
      else if (hd.dp == 256) go(tag, std::integral_constant<int, 256>{});
      else TORCH_CHECK_VALUE(false, "attention_backward: padded head dim ", hd.dp, ", expected 64, 128 or 256");
    };
    if (st == at::kHalf) by_dp(at::Half{});
    else by_dp(at::BFloat16{});
    return;
  }
  TORCH_CHECK_VALUE(ph.split == 1, "attention_backward: the SIMT path takes no split, the plan has ", ph.split);
  auto go = [&](auto tag, auto nplc) {
    using T = decltype(tag);
    using A = T;
    constexpr int NPL = decltype(nplc)::value;
    run_simt<T, A, NPL>(hd, p, scale, softcap, q.const_data_ptr<T>(), k.const_data_ptr<T>(), v.const_data_ptr<T>(),
                        o.const_data_ptr<T>(), dout.const_data_ptr<T>(), lse.const_data_ptr<A>(),
                        lse_ws.data_ptr<A>(), delta_ws.data_ptr<A>(), dq.mutable_data_ptr<T>(),
                        dk.mutable_data_ptr<T>(), dv.mutable_data_ptr<T>(), stream);
  };
  auto by_npl = [&](auto tag) {
    switch (hd.npl) {
      case 1: go(tag, std::integral_constant<int, 1>{}); break;
      case 2: go(tag, std::integral_constant<int, 2>{}); break;
      case 4: go(tag, std::integral_constant<int, 4>{}); break;
      case 8: go(tag, std::integral_constant<int, 8>{}); break;
      default: TORCH_CHECK_VALUE(false, "attention_backward: ", hd.npl, " elements per lane, expected 1, 2, 4 or 8");
    }
  };
  if (st == at::kDouble) by_npl(double{});
  else by_npl(float{});
}

}  // namespace
}  // namespace gradoracle

TORCH_LIBRARY_IMPL(gradoracle, CUDA, m) {
  m.impl("_attention_backward_run", TORCH_FN(gradoracle::attention_backward_run_cuda));
}
