// binary_backward on CUDA for the torch extension: launches of the kernels in
// backends/cuda/binary_backward.cuh (the same device code the cupy backend compiles with NVRTC)
// as a BBLaunch says: the @best rung's launch (plan_best), the cupy backend's default kernel.  The launch is planned in Python, once for both hosts of that code
// (backends/_plans/binary_backward_cuda.py, packed by backends/torch_ext/binary_backward.py);
// this file checks the arguments (binary_backward.cpp's checks) and launches, nothing else.
//
// Stage 1 writes each output either final (when one tile covers its whole reduction) or as
// float (double for float64) partial rows; stage 2 (bb_finalize) sums the rows in a fixed
// order.  No atomics: results are bitwise reproducible on a given GPU.
#include <cstdint>
#include <type_traits>

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../cuda/binary_backward.cuh"
#include "binary_backward.h"

namespace gradoracle {
namespace {

template <typename S> struct CudaType { using type = S; };
template <> struct CudaType<at::Half> { using type = __half; };
template <> struct CudaType<at::BFloat16> { using type = __nv_bfloat16; };

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T>
void finalize(const at::Tensor& part, int64_t nchunks, T* out, int64_t n, int64_t grid, cudaStream_t stream) {
  bb_finalize<T><<<grid, BB_BLOCK, 0, stream>>>(part.data_ptr<bb_acc_t<T>>(), nchunks, n, out);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int FN>
void run(const BBLaunch& l, const T* a, const T* b, const T* g, T* ga, T* gb, const at::Tensor& like,
         cudaStream_t stream) {
  using A = bb_acc_t<T>;
  if (l.kind == BB_KIND_FAST) {
    // The plan assumed 16-byte aligned pointers when it says so; a view that is not falls back to
    // the scalar loop (bb_fast grid-strides, so any grid is correct).
    const bool vec = l.vectorized && aligned16(a) && aligned16(b) && aligned16(g) && aligned16(ga) && aligned16(gb);
    bb_fast<T, FN><<<l.grid, BB_BLOCK, 0, stream>>>(a, b, g, ga, gb, l.numel, vec ? 1 : 0);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  if (l.kind == BB_KIND_EW) {
    bb_ew<T, FN><<<l.grid, BB_BLOCK, 0, stream>>>(l.params, a, b, g, ga, gb);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  const bool swap = l.params.swap != 0;  // role P is b (dP = grad_b), Q is a
  const T* p_op = swap ? b : a;
  const T* q_op = swap ? a : b;
  T* d_p = swap ? gb : ga;
  T* d_q = swap ? ga : gb;
  const auto acc_dtype = std::is_same<A, double>::value ? at::kDouble : at::kFloat;
  at::Tensor parts[2];
  A* part_ptr[2] = {nullptr, nullptr};
  for (int i = 0; i < 2; ++i) {
    if (l.nchunks[i] > 1) {
      parts[i] = at::empty({l.nchunks[i] * l.numel_out[i]}, like.options().dtype(acc_dtype));
      part_ptr[i] = parts[i].data_ptr<A>();
    }
  }
  switch (l.kind) {
    case BB_KIND_LK1:
      bb_lk<T, FN, 1><<<l.grid, BB_BLOCK, 0, stream>>>(l.params, p_op, q_op, g, d_p, part_ptr[0], d_q, part_ptr[1]);
      break;
    case BB_KIND_LK8:
      bb_lk<T, FN, BB_J><<<l.grid, BB_BLOCK, 0, stream>>>(l.params, p_op, q_op, g, d_p, part_ptr[0], d_q,
                                                          part_ptr[1]);
      break;
    case BB_KIND_LR_STREAM:
      bb_lr_stream<T, FN><<<l.grid, BB_BLOCK, 0, stream>>>(l.params, p_op, q_op, g, d_p, part_ptr[0], d_q);
      break;
    case BB_KIND_COLS:
    case BB_KIND_ROWS:
    case BB_KIND_BOTH: {
      // The @best kernels that write dQ final: 16-byte packs when the plan says so (it assumed aligned pointers; the
      // plan cache keys on alignment, so a view that is not gets a scalar plan of its own).
      constexpr int V = 16 / sizeof(T);
      const bool vec = l.vectorized != 0;
      TORCH_CHECK(!vec || (aligned16(a) && aligned16(b) && aligned16(g) && aligned16(ga) && aligned16(gb)),
                  "binary_backward: a 16-byte plan for pointers that are not 16-byte aligned");
      if (l.kind == BB_KIND_COLS) {
        if (vec)
          bb_cols<T, FN, V><<<l.grid, BB_BLOCK, 0, stream>>>(l.params, p_op, q_op, g, d_p, part_ptr[0], d_q);
        else
          bb_cols<T, FN, 1><<<l.grid, BB_BLOCK, 0, stream>>>(l.params, p_op, q_op, g, d_p, part_ptr[0], d_q);
      } else if (l.kind == BB_KIND_ROWS) {
        if (vec)
          bb_rows<T, FN, V><<<l.grid, BB_BLOCK, 0, stream>>>(l.params, p_op, q_op, g, d_p, part_ptr[0], d_q);
        else
          bb_rows<T, FN, 1><<<l.grid, BB_BLOCK, 0, stream>>>(l.params, p_op, q_op, g, d_p, part_ptr[0], d_q);
      } else {
        if (vec)
          bb_both<T, FN, V><<<l.grid, BB_BLOCK, 0, stream>>>(l.params, p_op, q_op, g, d_p, part_ptr[0], d_q);
        else
          bb_both<T, FN, 1><<<l.grid, BB_BLOCK, 0, stream>>>(l.params, p_op, q_op, g, d_p, part_ptr[0], d_q);
      }
      break;
    }
    case BB_KIND_BATCH: {
      constexpr int V = 16 / sizeof(T);
      const bool vec = l.vectorized != 0;
      TORCH_CHECK(!vec || (aligned16(a) && aligned16(b) && aligned16(g) && aligned16(ga) && aligned16(gb)),
                  "binary_backward: a 16-byte plan for pointers that are not 16-byte aligned");
      if (vec)
        bb_batch<T, FN, V><<<l.grid, BB_BLOCK, 0, stream>>>(l.params, p_op, q_op, g, d_p, part_ptr[0], d_q,
                                                             part_ptr[1]);
      else
        bb_batch<T, FN, 1><<<l.grid, BB_BLOCK, 0, stream>>>(l.params, p_op, q_op, g, d_p, part_ptr[0], d_q,
                                                             part_ptr[1]);
      break;
    }
    case BB_KIND_LR_BATCHED:
      bb_lr_batched<T, FN><<<l.grid, BB_BLOCK, 0, stream>>>(l.params, p_op, q_op, g, d_p, part_ptr[0], d_q,
                                                            part_ptr[1]);
      break;
    default:
      TORCH_CHECK(false, "binary_backward: unexpected launch kind ", l.kind);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  T* outs[2] = {d_p, d_q};
  for (int i = 0; i < 2; ++i)
    if (l.nchunks[i] > 1) finalize<T>(parts[i], l.nchunks[i], outs[i], l.numel_out[i], l.finalize_grid[i], stream);
}

// Resident blocks per SM of the kernel that a launch of `kind` runs (the vectorized instance when
// `vec`): what nvcc made of it (registers, shared memory), not the planner's table, which assumes
// each kernel at its __launch_bounds__ limit.  Measured: bb_rows for add in bf16 uses 64 registers,
// so 4 blocks fit, and a grid for the table's 3 left a quarter of the SMs' slots empty (0.75 waves,
// results/h100/s7/profile/binary_backward-torch_ext-*).
template <typename T, int FN>
int64_t blocks_per_sm(int64_t kind, bool vec) {
  constexpr int V = 16 / sizeof(T);
  int n = 0;
  auto query = [&](auto kernel) { C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, BB_BLOCK, 0)); };
  switch (kind) {
    case BB_KIND_FAST: query(bb_fast<T, FN>); break;
    case BB_KIND_EW: query(bb_ew<T, FN>); break;
    case BB_KIND_LK1: query(bb_lk<T, FN, 1>); break;
    case BB_KIND_LK8: query(bb_lk<T, FN, BB_J>); break;
    case BB_KIND_LR_STREAM: query(bb_lr_stream<T, FN>); break;
    case BB_KIND_LR_BATCHED: query(bb_lr_batched<T, FN>); break;
    case BB_KIND_COLS: vec ? query(bb_cols<T, FN, V>) : query(bb_cols<T, FN, 1>); break;
    case BB_KIND_ROWS: vec ? query(bb_rows<T, FN, V>) : query(bb_rows<T, FN, 1>); break;
    case BB_KIND_BATCH: vec ? query(bb_batch<T, FN, V>) : query(bb_batch<T, FN, 1>); break;
    case BB_KIND_BOTH: vec ? query(bb_both<T, FN, V>) : query(bb_both<T, FN, 1>); break;
    default:
      TORCH_CHECK_VALUE(false, "binary_backward: kind is ", kind, ", expected a CUDA launch kind (",
                        static_cast<int>(BB_KIND_FAST), "..", BB_NUM_KINDS - 1, ", not box or zero)");
  }
  return n;
}

int64_t binary_backward_blocks_per_sm_cuda(const at::Tensor& like, c10::string_view fn, int64_t kind,
                                           bool vectorized) {
  const int fn_id = parse_binary_fn(fn);
  TORCH_CHECK_VALUE(like.is_cuda(), "binary_backward: like is on ", like.device(), ", expected a CUDA device");
  const c10::cuda::CUDAGuard guard(like.device());
  int64_t n = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, like.scalar_type(), "binary_backward_blocks_per_sm", [&] {
    using T = typename CudaType<scalar_t>::type;
    dispatch_binary_fn(fn_id, [&](auto fc) { n = blocks_per_sm<T, decltype(fc)::value>(kind, vectorized); });
  });
  return n;
}

void binary_backward_run_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& grad_out,
                              c10::string_view fn, const at::Tensor& plan, at::Tensor& grad_a, at::Tensor& grad_b) {
  BBLaunch l;
  const int fn_id = check_binary_backward_run(a, b, grad_out, fn, plan, grad_a, grad_b, l);
  TORCH_CHECK_VALUE(a.is_cuda(), "binary_backward: a is on ", a.device(), ", expected a CUDA device");
  const c10::cuda::CUDAGuard guard(a.device());
  if (l.kind == BB_KIND_ZERO) {  // sums over nothing
    grad_a.zero_();
    grad_b.zero_();
    return;
  }
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "binary_backward_cuda", [&] {
    using T = typename CudaType<scalar_t>::type;
    const T* pa = reinterpret_cast<const T*>(a.const_data_ptr<scalar_t>());
    const T* pb = reinterpret_cast<const T*>(b.const_data_ptr<scalar_t>());
    const T* pg = reinterpret_cast<const T*>(grad_out.const_data_ptr<scalar_t>());
    T* pga = reinterpret_cast<T*>(grad_a.mutable_data_ptr<scalar_t>());
    T* pgb = reinterpret_cast<T*>(grad_b.mutable_data_ptr<scalar_t>());
    dispatch_binary_fn(fn_id, [&](auto fc) { run<T, decltype(fc)::value>(l, pa, pb, pg, pga, pgb, a, stream); });
  });
}

}  // namespace
}  // namespace gradoracle

TORCH_LIBRARY_IMPL(gradoracle, CUDA, m) {
  m.impl("_binary_backward_run", TORCH_FN(gradoracle::binary_backward_run_cuda));
  m.impl("_binary_backward_blocks_per_sm", TORCH_FN(gradoracle::binary_backward_blocks_per_sm_cuda));
}
