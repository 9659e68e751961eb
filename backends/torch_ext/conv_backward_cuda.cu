// conv_backward_data / conv_backward_weight on CUDA for the torch extension: the launches of
// backends/cuda/conv_backward_{data,weight}.cuh (the device code the cupy backend compiles with
// NVRTC) as cupy@best makes them, from a ConvRecordH planned in Python (backends/_plans/conv_cuda.py,
// packed by backends/torch_ext/conv_backward.py).  This file checks the arguments
// (conv_backward.cpp's checks) and launches, nothing else.  dgrad takes the fast-divmod mapping
// (MODE 2, = cupy@best); wgrad's split reduction gets a fresh workspace from the caching allocator.
#include <cstdint>
#include <cstring>

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../cuda/conv_backward_data.cuh"
#include "../cuda/conv_backward_weight.cuh"
#include "conv_backward.h"

static_assert(sizeof(ConvParams) == sizeof(gradoracle::ConvParamsH), "ConvParams and its host copy differ");
static_assert(sizeof(ConvParams) == CV_WORDS * sizeof(long long), "ConvParams word count");

namespace gradoracle {
namespace {

template <typename S> struct CudaType { using type = S; };
template <> struct CudaType<at::Half> { using type = __half; };
template <> struct CudaType<at::BFloat16> { using type = __nv_bfloat16; };

dim3 grid_of(const ConvRecordH& r) {
  TORCH_CHECK_VALUE(r.gx >= 1 && r.gx <= 0x7fffffff && r.gy >= 1 && r.gy <= 65535, "conv: plan has grid (", r.gx,
                    ", ", r.gy, ")");
  return dim3(static_cast<unsigned>(r.gx), static_cast<unsigned>(r.gy));
}

// cv_dgrad_smallc's instantiation for the record's channel slots (bm) and dy reads (kind).
template <typename T, bool VEC>
void dgrad_smallc_vec(const ConvRecordH& r, dim3 grid, cudaStream_t stream, const ConvParams& p, const T* a,
                      const T* b, T* o, const int* tab) {
  switch (r.bm) {
    case 1: cv_dgrad_smallc<T, 1, VEC><<<grid, 256, 0, stream>>>(p, a, b, o, tab); break;
    case 2: cv_dgrad_smallc<T, 2, VEC><<<grid, 256, 0, stream>>>(p, a, b, o, tab); break;
    case 3: cv_dgrad_smallc<T, 3, VEC><<<grid, 256, 0, stream>>>(p, a, b, o, tab); break;
    case 4: cv_dgrad_smallc<T, 4, VEC><<<grid, 256, 0, stream>>>(p, a, b, o, tab); break;
    default: cv_dgrad_smallc<T, 8, VEC><<<grid, 256, 0, stream>>>(p, a, b, o, tab); break;
  }
}

template <typename T>
void dgrad_smallc(const ConvRecordH& r, dim3 grid, cudaStream_t stream, const ConvParams& p, const T* a,
                  const T* b, T* o, const int* tab) {
  if (r.kind == CONV_SMALLC_VEC)
    dgrad_smallc_vec<T, true>(r, grid, stream, p, a, b, o, tab);
  else
    dgrad_smallc_vec<T, false>(r, grid, stream, p, a, b, o, tab);
}

void dgrad_run_cuda(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& plan,
                    const std::optional<at::Tensor>& table, at::Tensor& dx) {
  ConvRecordH r;
  check_conv_run("conv_backward_data", dy, "dy", w, "w", dx, "dx", plan, r);
  TORCH_CHECK_VALUE(table.has_value() && table->is_cuda() && table->scalar_type() == at::kInt &&
                        table->is_contiguous() && table->numel() == r.table_len && table->device() == dy.device(),
                    "conv_backward_data: table must be the plan's int32 phase table (", r.table_len,
                    " words) on ", dy.device());
  const c10::cuda::CUDAGuard guard(dy.device());
  ConvParams p;
  std::memcpy(&p, &r.p, sizeof(ConvParams));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int* tab = table->const_data_ptr<int32_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dy.scalar_type(), "conv_backward_data_cuda", [&] {
    using T = typename CudaType<scalar_t>::type;
    const T* a = reinterpret_cast<const T*>(dy.const_data_ptr<scalar_t>());
    const T* b = reinterpret_cast<const T*>(w.const_data_ptr<scalar_t>());
    T* o = reinterpret_cast<T*>(dx.mutable_data_ptr<scalar_t>());
    const dim3 grid = grid_of(r);
    if (r.kind == CONV_DIRECT) {
      cv_dgrad_dw<T, 2><<<grid, 256, 0, stream>>>(p, a, b, o, tab);
    } else if (r.kind == CONV_SMALLC || r.kind == CONV_SMALLC_VEC) {
      TORCH_CHECK_VALUE(r.block == 256 && (r.bm == 1 || r.bm == 2 || r.bm == 3 || r.bm == 4 || r.bm == 8),
                        "conv_backward_data: small-Cin plan has ", r.block, " threads and ", r.bm, " channel slots");
      if (r.kind == CONV_SMALLC_VEC)
        TORCH_CHECK_VALUE(!(reinterpret_cast<uintptr_t>(a) % 16),
                          "conv_backward_data: plan reads dy as 16-byte words but dy is not 16-byte aligned");
      dgrad_smallc(r, grid, stream, p, a, b, o, tab);
    } else if (r.kind == CONV_VEC) {
      if constexpr (CvType<T>::kTC) {
        TORCH_CHECK_VALUE(!(reinterpret_cast<uintptr_t>(a) % 16) && !(reinterpret_cast<uintptr_t>(b) % 16),
                          "conv_backward_data: plan copies 16-byte vectors but dy or w is not 16-byte aligned");
        cv_dgrad_vec<T, 2><<<grid, CV_THREADS, 0, stream>>>(p, a, b, o, tab);
      } else {
        TORCH_CHECK_VALUE(false, "conv_backward_data: the vector path is for 16-bit dtypes");
      }
    } else {
      cv_dgrad<T, 2><<<grid, CV_THREADS, 0, stream>>>(p, a, b, o, tab);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void wgrad_run_cuda(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& plan, at::Tensor& dw) {
  ConvRecordH r;
  check_conv_run("conv_backward_weight", dy, "dy", x, "x", dw, "dw", plan, r);
  const c10::cuda::CUDAGuard guard(dy.device());
  ConvParams p;
  std::memcpy(&p, &r.p, sizeof(ConvParams));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const auto acc = dy.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor ws;
  if (r.ws_elems > 0) ws = at::empty({r.ws_elems}, dy.options().dtype(acc));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dy.scalar_type(), "conv_backward_weight_cuda", [&] {
    using T = typename CudaType<scalar_t>::type;
    using A = typename CvType<T>::Acc;
    const T* a = reinterpret_cast<const T*>(dy.const_data_ptr<scalar_t>());
    const T* b = reinterpret_cast<const T*>(x.const_data_ptr<scalar_t>());
    T* o = reinterpret_cast<T*>(dw.mutable_data_ptr<scalar_t>());
    A* part = r.ws_elems > 0 ? static_cast<A*>(ws.data_ptr()) : nullptr;
    const dim3 grid = grid_of(r);
    if (r.kind == CONV_DIRECT) {
      cv_wgrad_dw<T><<<grid, 256, 0, stream>>>(p, a, b, o, part);
    } else {
      TORCH_CHECK_VALUE(r.bm == 64 || (r.bm == 128 && CvType<T>::kTC), "conv_backward_weight: plan has tile rows ",
                        r.bm);
      if (r.kind == CONV_TAPS) {
        if constexpr (CvType<T>::kTC) {
          if (r.bm == 128)
            cv_wgrad_taps<T, 128><<<grid, CV_THREADS, 0, stream>>>(p, a, b, o, part);
          else
            cv_wgrad_taps<T, 64><<<grid, CV_THREADS, 0, stream>>>(p, a, b, o, part);
        } else {
          cv_wgrad_taps<T, 64><<<grid, CV_THREADS, 0, stream>>>(p, a, b, o, part);
        }
      } else if (r.kind == CONV_VEC) {
        if constexpr (CvType<T>::kTC) {
          TORCH_CHECK_VALUE(!(reinterpret_cast<uintptr_t>(a) % 16) && !(reinterpret_cast<uintptr_t>(b) % 16),
                            "conv_backward_weight: plan copies 16-byte vectors but dy or x is not 16-byte aligned");
          if (r.bm == 128)
            cv_wgrad_vec<T, 128><<<grid, CV_THREADS, 0, stream>>>(p, a, b, o, part);
          else
            cv_wgrad_vec<T, 64><<<grid, CV_THREADS, 0, stream>>>(p, a, b, o, part);
        } else {
          TORCH_CHECK_VALUE(false, "conv_backward_weight: the vector path is for 16-bit dtypes");
        }
      } else {
        if constexpr (CvType<T>::kTC) {
          if (r.bm == 128)
            cv_wgrad<T, 128><<<grid, CV_THREADS, 0, stream>>>(p, a, b, o, part);
          else
            cv_wgrad<T, 64><<<grid, CV_THREADS, 0, stream>>>(p, a, b, o, part);
        } else {
          cv_wgrad<T, 64><<<grid, CV_THREADS, 0, stream>>>(p, a, b, o, part);
        }
      }
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (part != nullptr) {
      TORCH_CHECK_VALUE(r.finish_grid >= 1, "conv_backward_weight: plan splits the reduction but has no finish");
      cv_wgrad_finish<T><<<static_cast<unsigned>(r.finish_grid), 256, 0, stream>>>(p, part, o);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
}

}  // namespace
}  // namespace gradoracle

TORCH_LIBRARY_IMPL(gradoracle, CUDA, m) {
  m.impl("_conv_backward_data_run", TORCH_FN(gradoracle::dgrad_run_cuda));
  m.impl("_conv_backward_weight_run", TORCH_FN(gradoracle::wgrad_run_cuda));
}
