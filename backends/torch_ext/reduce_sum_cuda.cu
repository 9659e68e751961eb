// reduce_sum on CUDA for the torch extension: one launch of a best kernel of
// backends/cuda/reduce_sum.cuh (the device code the cupy backend compiles with NVRTC, as its
// cupy@best launches it) per RSRecord.  The launch is planned in Python, by the planner cupy@best
// uses (backends/cupy/reduce_sum.py, packed by backends/torch_ext/reduce_sum.py); this file checks
// the arguments (reduce_sum.cpp's checks) and launches, nothing else.
//
// Reductions split across blocks need a partial buffer and zeroed tickets (every finishing block
// re-arms its own ticket to 0): one workspace per (device, stream), grown on demand, so calls on
// other streams never share one.
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../cuda/reduce_sum.cuh"
#include "reduce_sum.h"

static_assert(sizeof(RSParams) == sizeof(gradoracle::RSParamsH), "RSParams and its host copy differ");
static_assert(RS_MAX_DIMS == gradoracle::kRsMaxDims, "RS_MAX_DIMS and its host copy differ");

namespace gradoracle {
namespace {

template <typename S> struct CudaType { using type = S; };
template <> struct CudaType<at::Half> { using type = __half; };
template <> struct CudaType<at::BFloat16> { using type = __nv_bfloat16; };

struct Workspace {
  at::Tensor part, ticket;
};

// (partials, tickets) of at least these sizes for the current stream.  Tickets are allocated
// zeroed and left zero by every launch; partials are written before they are read.
std::pair<void*, unsigned int*> workspace(const at::Tensor& like, at::ScalarType acc, int64_t n_part,
                                          int64_t n_ticket, cudaStream_t stream) {
  static std::mutex lock;
  // Never destroyed: freeing CUDA memory from a static destructor would run after the driver shut down.
  static auto* spaces = new std::map<std::tuple<int, cudaStream_t, int>, Workspace>();
  const std::lock_guard<std::mutex> guard(lock);
  Workspace& w = (*spaces)[{like.get_device(), stream, static_cast<int>(acc)}];
  if (!w.part.defined() || w.part.numel() < n_part)
    w.part = at::empty({std::max<int64_t>(n_part, 1024)}, like.options().dtype(acc));
  if (!w.ticket.defined() || w.ticket.numel() < n_ticket)
    w.ticket = at::zeros({std::max<int64_t>(n_ticket, 1024)}, like.options().dtype(at::kInt));
  return {w.part.data_ptr(), reinterpret_cast<unsigned int*>(w.ticket.data_ptr<int32_t>())};
}

template <typename T, bool VEC, bool SIMPLE>
void launch(const RSRecord& r, const RSParams& p, const T* x, T* y, rs_acc_t<T>* part, unsigned int* ticket,
            cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned int>(r.grid));
  if (r.kind == RS_ROW_TEAM)
    rs_row_team<T, VEC, SIMPLE><<<grid, RS_BLOCK, 0, stream>>>(p, x, y);
  else if (r.kind == RS_ROW_BLOCK)
    rs_row_block<T, VEC, SIMPLE><<<grid, RS_BLOCK, 0, stream>>>(p, x, y, part, ticket);
  else
    rs_col<T, VEC, SIMPLE><<<grid, RS_BLOCK, 0, stream>>>(p, x, y, part, ticket);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, typename Fn>
void with_flags(bool vec, bool simple, Fn&& f) {
  if (vec)
    simple ? f(std::true_type{}, std::true_type{}) : f(std::true_type{}, std::false_type{});
  else
    simple ? f(std::false_type{}, std::true_type{}) : f(std::false_type{}, std::false_type{});
}

void reduce_sum_run_cuda(const at::Tensor& x, const at::Tensor& plan, at::Tensor& y) {
  RSRecord r;
  check_reduce_sum_run(x, plan, y, r);
  TORCH_CHECK_VALUE(x.is_cuda(), "reduce_sum: x is on ", x.device(), ", expected a CUDA device");
  const c10::cuda::CUDAGuard guard(x.device());
  if (r.kind == RS_EMPTY) return;
  if (r.kind == RS_ZERO) {
    y.zero_();
    return;
  }
  TORCH_CHECK_VALUE(r.grid >= 1 && r.grid <= 0x7fffffff, "reduce_sum: plan has grid ", r.grid);
  const bool aligned = !(reinterpret_cast<uintptr_t>(x.const_data_ptr()) % 16);
  TORCH_CHECK_VALUE(!r.vec || aligned, "reduce_sum: plan reads 16-byte vectors but x is not 16-byte aligned");
  TORCH_CHECK_VALUE(!r.p.vec_store || !(reinterpret_cast<uintptr_t>(y.const_data_ptr()) % 16),
                    "reduce_sum: plan stores 16-byte vectors but y is not 16-byte aligned");
  RSParams p;
  std::memcpy(&p, &r.p, sizeof(RSParams));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const auto acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  void* part = nullptr;
  unsigned int* ticket = nullptr;
  if (r.n_part > 0) std::tie(part, ticket) = workspace(x, acc, r.n_part, r.n_ticket, stream);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "reduce_sum_cuda", [&] {
    using T = typename CudaType<scalar_t>::type;
    const T* px = reinterpret_cast<const T*>(x.const_data_ptr<scalar_t>());
    T* py = reinterpret_cast<T*>(y.mutable_data_ptr<scalar_t>());
    with_flags<T>(r.vec != 0, r.simple != 0, [&](auto vec, auto simple) {
      launch<T, decltype(vec)::value, decltype(simple)::value>(r, p, px, py, static_cast<rs_acc_t<T>*>(part), ticket,
                                                               stream);
    });
  });
}

// Resident blocks per SM of a best kernel (kernel: RS_ROW_TEAM, RS_ROW_BLOCK or RS_COL) on the
// current device: what the planner's occupancy() asks, once per kernel.
int64_t reduce_sum_occupancy(int64_t kernel, at::ScalarType dtype, bool vec, bool simple) {
  int blocks = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "reduce_sum_occupancy", [&] {
    using T = typename CudaType<scalar_t>::type;
    with_flags<T>(vec, simple, [&](auto v, auto s) {
      constexpr bool V = decltype(v)::value, S = decltype(s)::value;
      const void* fn = kernel == RS_ROW_TEAM    ? reinterpret_cast<const void*>(rs_row_team<T, V, S>)
                       : kernel == RS_ROW_BLOCK ? reinterpret_cast<const void*>(rs_row_block<T, V, S>)
                                                : reinterpret_cast<const void*>(rs_col<T, V, S>);
      C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, RS_BLOCK, 0));
    });
  });
  return blocks;
}

}  // namespace
}  // namespace gradoracle

TORCH_LIBRARY_FRAGMENT(gradoracle, m) {
  m.def("_reduce_sum_occupancy(int kernel, ScalarType dtype, bool vec, bool simple) -> int",
        &gradoracle::reduce_sum_occupancy);
}

TORCH_LIBRARY_IMPL(gradoracle, CUDA, m) {
  m.impl("_reduce_sum_run", TORCH_FN(gradoracle::reduce_sum_run_cuda));
}
