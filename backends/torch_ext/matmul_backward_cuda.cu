// matmul_backward on CUDA for the torch extension: launches of the kernels in
// backends/cuda/matmul_backward.cuh (the device code the cupy backend compiles with NVRTC) as an
// MMRecord says: the @best rung of cupy (mm_mma on tensor cores for bf16 / f16, mm_sgemm for f32,
// the smem rung's SIMT tiles for f64).  The record is planned in Python, once for both hosts of that code
// (backends/_plans/matmul_backward_cuda.py); this file checks the arguments (matmul_backward.cpp's
// checks) and launches, nothing else.  No atomics: results are bitwise reproducible on a GPU.
#include <cstdint>
#include <type_traits>

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../cuda/matmul_backward.cuh"
#include "matmul_backward.h"

namespace gradoracle {
namespace {

template <typename S> struct CudaType { using type = S; };
template <> struct CudaType<at::Half> { using type = __half; };
template <> struct CudaType<at::BFloat16> { using type = __nv_bfloat16; };

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T, int BM, bool XT, bool YT, bool VEC>
void launch_mma(const dim3& grid, const MMGemm& g, const T* X, const T* Y, const long long* off, T* C,
                cudaStream_t stream) {
  constexpr int smem = mm_mma_smem<XT, YT, BM>();
  static bool raised[64] = {};  // per instantiation and device (a function's attributes are per device)
  const int dev = c10::cuda::current_device();
  if (dev >= 64 || !raised[dev]) {
    C10_CUDA_CHECK(
        cudaFuncSetAttribute(mm_mma<T, BM, XT, YT, VEC>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    if (dev < 64) raised[dev] = true;
  }
  mm_mma<T, BM, XT, YT, VEC><<<grid, MM_BLOCK, smem, stream>>>(g, X, Y, off, C);
}

// The record's tile rows and flags as compile-time constants: f(BM, XT, YT, VEC), each a
// std::integral_constant, so every launch below is one instantiation picked by one switch.
template <typename F>
void with_tile(const MMLaunch& l, F&& f) {
  using N = std::false_type;
  using Y = std::true_type;
  auto flags = [&](auto bm) {
    switch ((l.xt ? 4 : 0) | (l.yt ? 2 : 0) | (l.vec ? 1 : 0)) {
      case 0: return f(bm, N{}, N{}, N{});
      case 1: return f(bm, N{}, N{}, Y{});
      case 2: return f(bm, N{}, Y{}, N{});
      case 3: return f(bm, N{}, Y{}, Y{});
      case 4: return f(bm, Y{}, N{}, N{});
      case 5: return f(bm, Y{}, N{}, Y{});
      case 6: return f(bm, Y{}, Y{}, N{});
      default: return f(bm, Y{}, Y{}, Y{});
    }
  };
  if (l.bm == 64)
    flags(std::integral_constant<int, 64>{});
  else
    flags(std::integral_constant<int, 128>{});
}

template <typename T>
void launch_gemm(const MMLaunch& l, const T* X, const T* Y, const long long* off, T* C, cudaStream_t stream) {
  if constexpr (sizeof(T) <= 4) {
    TORCH_CHECK(!l.vec || (aligned16(X) && aligned16(Y)),
                "matmul_backward: a 16-byte plan for pointers that are not 16-byte aligned");
    TORCH_CHECK(l.bm == 64 || l.bm == 128, "matmul_backward: plan has BM ", l.bm, ", expected 64 or 128");
  }
  const dim3 grid((unsigned)(l.g.tiles_i * l.g.tiles_j), (unsigned)l.g.P);
  if constexpr (sizeof(T) == 2) {
    with_tile(l, [&](auto bm, auto xt, auto yt, auto vec) {
      launch_mma<T, decltype(bm)::value, decltype(xt)::value, decltype(yt)::value, decltype(vec)::value>(
          grid, l.g, X, Y, off, C, stream);
    });
  } else if constexpr (sizeof(T) == 4) {  // mm_sgemm: IEEE float32, no TF32
    with_tile(l, [&](auto bm, auto xt, auto yt, auto vec) {
      constexpr int BM = decltype(bm)::value;
      mm_sgemm<BM, BM, decltype(xt)::value, decltype(yt)::value, decltype(vec)::value>
          <<<grid, mm_sg_threads<BM, BM>(), 0, stream>>>(l.g, X, Y, off, C);
    });
  } else {                                 // f64: the smem rung's tiles (SMEM_RUNG)
    TORCH_CHECK(l.bm == 64, "matmul_backward: plan has BM ", l.bm, ", expected 64 for f64");
    mm_smem<T, 64, 64, 16, 4, 4><<<grid, 256, 0, stream>>>(l.g, X, Y, off, C);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void matmul_backward_run_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& dy, const at::Tensor& plan,
                              const at::Tensor& table, at::Tensor& da, at::Tensor& db) {
  const MMRecord r = check_matmul_backward_run(a, b, dy, plan, table, da, db);
  TORCH_CHECK_VALUE(a.is_cuda(), "matmul_backward: a is on ", a.device(), ", expected a CUDA device");
  const c10::cuda::CUDAGuard guard(a.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const at::Tensor* X[2] = {&dy, &a};
  const at::Tensor* Y[2] = {&b, &dy};
  at::Tensor* C[2] = {&da, &db};
  for (int k = 0; k < 2; ++k) {
    const MMLaunch& l = r.gemm[k];
    if (l.kind == MM_EMPTY) continue;
    if (l.kind == MM_ZERO) {
      C[k]->zero_();
      continue;
    }
    TORCH_CHECK(l.g.P <= 65535 && l.g.tiles_i * l.g.tiles_j <= 0x7fffffffLL,
                "matmul_backward: grid too large for one launch");
    const long long* off = reinterpret_cast<const long long*>(table.const_data_ptr<int64_t>()) + l.table_off;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "matmul_backward_cuda", [&] {
      using T = typename CudaType<scalar_t>::type;
      launch_gemm<T>(l, reinterpret_cast<const T*>(X[k]->const_data_ptr<scalar_t>()),
                     reinterpret_cast<const T*>(Y[k]->const_data_ptr<scalar_t>()), off,
                     reinterpret_cast<T*>(C[k]->mutable_data_ptr<scalar_t>()), stream);
    });
  }
}

}  // namespace
}  // namespace gradoracle

TORCH_LIBRARY_IMPL(gradoracle, CUDA, m) {
  m.impl("_matmul_backward_run", TORCH_FN(gradoracle::matmul_backward_run_cuda));
}
