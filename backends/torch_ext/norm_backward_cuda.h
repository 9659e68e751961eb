// The normalisation backwards on CUDA for the torch extension: launches of the best kernels of
// backends/cuda/norm_common.cuh (nb_rows, or nb_chunked for long rows, then nb_colsum for
// dweight / dbias from partial rows), the device code the cupy backend compiles with NVRTC, as
// an NBRecord says (planned in Python by cupy@best's planner, backends/cupy/_norm_plan.py, packed
// by backends/torch_ext/_norm.py).  Included by layernorm_backward_cuda.cu and
// rmsnorm_backward_cuda.cu after their op's .cuh (which defines the norm policy).
//
// nvcc instantiates every (VEC, VPT, WIDE) the planner can ask for: VEC 1 or 16 / sizeof(T);
// VPT * VEC at most the planner's elements per thread (_norm_plan.ROWS_ELEMS / CHUNK_ELEMS;
// tests/test_torch_ext_ops.py checks that every plan it makes is one of these).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "norm_backward.h"

static_assert(sizeof(NBParams) == sizeof(gradoracle::NBParamsH), "NBParams and its host copy differ");
static_assert(NB_MAX_LEAD == gradoracle::kNbMaxLead && NB_NT == gradoracle::kNbNT, "NBParams dims differ");

namespace gradoracle {

template <typename S> struct NbCudaType { using type = S; };
template <> struct NbCudaType<at::Half> { using type = __half; };
template <> struct NbCudaType<at::BFloat16> { using type = __nv_bfloat16; };

// Elements of a row per thread at most (VPT * VEC): _norm_plan.ROWS_ELEMS and CHUNK_ELEMS.
template <typename T, int VEC>
constexpr int nb_rows_elems() {
  return VEC > 1 ? (sizeof(T) == 2 ? 16 : sizeof(T) == 4 ? 8 : 4) : (sizeof(T) == 8 ? 4 : 8);
}
template <typename T>
constexpr int nb_chunk_elems() {
  return sizeof(T) == 8 ? 4 : 8;
}

// Calls f(kernel) with the nb_rows instantiation for (vec, vpt, wide); false if none is built.
template <class Norm, typename T, int VEC, typename F>
bool nb_rows_vec(int64_t vpt, bool wide, F&& f) {
  bool found = false;
  auto one = [&](auto vc) {
    constexpr int VPT = decltype(vc)::value;
    if constexpr (VPT * VEC <= nb_rows_elems<T, VEC>()) {
      if (vpt == VPT) {
        found = true;
        if (wide)
          f(nb_rows<Norm, T, VEC, VPT, true>);
        else
          f(nb_rows<Norm, T, VEC, VPT, false>);
      }
    }
  };
  one(std::integral_constant<int, 1>{});
  one(std::integral_constant<int, 2>{});
  one(std::integral_constant<int, 4>{});
  one(std::integral_constant<int, 8>{});
  return found;
}

template <class Norm, typename T, typename F>
void nb_with_kernel(const char* op, const NBRecord& r, F&& f) {
  constexpr int V = 16 / sizeof(T), E = nb_chunk_elems<T>();
  bool found = false;
  if (r.kind == NB_ROWS) {
    found = r.vec == 1 ? nb_rows_vec<Norm, T, 1>(r.vpt, r.wide != 0, f)
                       : r.vec == V && nb_rows_vec<Norm, T, V>(r.vpt, r.wide != 0, f);
  } else if (r.kind == NB_CHUNKED) {
    if (r.vec == 1 && r.vpt == E) {
      f(nb_chunked<Norm, T, 1, E>);
      found = true;
    } else if (r.vec == V && r.vpt == E / V) {
      f(nb_chunked<Norm, T, V, E / V>);
      found = true;
    }
  }
  TORCH_CHECK_VALUE(found, op, ": plan asks for kernel kind ", r.kind, " with VEC ", r.vec, ", VPT ", r.vpt,
                    ", which the extension does not build");
}

inline bool nb_aligned16(const at::Tensor& t) {
  return !t.defined() || !(reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16);
}

template <class Norm, bool kMean>
void norm_backward_run_cuda(const char* op, const NormArgs& a, const at::Tensor& plan) {
  NBRecord r;
  check_norm_run<kMean>(op, a, plan, r);
  TORCH_CHECK_VALUE(a.x.is_cuda(), op, ": x is on ", a.x.device(), ", expected a CUDA device");
  const c10::cuda::CUDAGuard guard(a.x.device());
  if (r.kind == NB_ZERO) {  // no rows: dweight and dbias are sums of nothing
    if (a.dweight.defined()) a.dweight.zero_();
    if (a.dbias.defined()) a.dbias.zero_();
    return;
  }
  const NBParamsH& ph = r.p;
  const bool has_w = ph.flags & kNbHasW, has_b = ph.flags & kNbHasB;
  TORCH_CHECK_VALUE(r.grid >= 1 && r.grid == ph.nparts && r.grid <= 0x7fffffff, op, ": plan has grid ", r.grid,
                    " for ", ph.nparts, " partial rows");
  TORCH_CHECK_VALUE(r.vec == 1 || (nb_aligned16(a.x) && nb_aligned16(a.dy) && nb_aligned16(a.dx) &&
                                   nb_aligned16(a.weight)),
                    op, ": plan reads 16-byte vectors but x, dy, dx or weight is not 16-byte aligned");
  const bool sums = r.colsum != 0;
  TORCH_CHECK_VALUE(!sums || r.ws >= 2 * ph.nparts * ph.n, op, ": plan's partial-row buffer holds ", r.ws,
                    " elements, expected ", 2 * ph.nparts * ph.n);
  // Without nb_colsum, only a single nb_rows block writes dweight / dbias itself.
  TORCH_CHECK_VALUE(sums || !(has_w || has_b) || (r.kind == NB_ROWS && ph.nparts == 1), op,
                    ": plan leaves dweight / dbias in partial rows without summing them");
  NBParams p;
  std::memcpy(&p, &ph, sizeof(NBParams));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const auto acc = a.x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor part = r.ws > 0 ? at::empty({r.ws}, a.x.options().dtype(acc)) : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.x.scalar_type(), "norm_backward_cuda", [&] {
    using T = typename NbCudaType<scalar_t>::type;
    using A = nb_acc_t<T>;
    auto ptr = [](const at::Tensor& t) { return t.defined() ? reinterpret_cast<T*>(t.data_ptr()) : nullptr; };
    const T *x = ptr(a.x), *dy = ptr(a.dy), *w = has_w ? ptr(a.weight) : nullptr;
    const A* mean = kMean ? a.mean.const_data_ptr<A>() : nullptr;
    const A* rstd = a.rstd.const_data_ptr<A>();
    T *dx = ptr(a.dx), *dw = has_w ? ptr(a.dweight) : nullptr, *db = has_b ? ptr(a.dbias) : nullptr;
    A* pp = part.defined() ? part.data_ptr<A>() : nullptr;
    const dim3 grid(static_cast<unsigned int>(r.grid));
    nb_with_kernel<Norm, T>(op, r, [&](auto kernel) {
      if constexpr (std::is_invocable_v<decltype(kernel), NBParams, const T*, const T*, const T*, const A*, const A*,
                                        T*, A*, T*, T*>)
        kernel<<<grid, NB_ROWS_BLOCK, 0, stream>>>(p, x, dy, w, mean, rstd, dx, pp, dw, db);
      else
        kernel<<<grid, NB_CHUNK_BLOCK, 0, stream>>>(p, x, dy, w, mean, rstd, dx, pp);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (sums) {  // partial rows: dweight's first, then dbias's
      const long long np = ph.nparts, n = ph.n;
      T* out0 = has_w ? dw : db;
      T* out1 = has_w && has_b ? db : nullptr;
      const long long row0 = has_w ? 0 : np;
      const long long s0 = has_w ? ph.out_stride[0] : ph.out_stride[1], s1 = out1 ? ph.out_stride[1] : 0;
      const dim3 cgrid(static_cast<unsigned int>((n + 31) / 32), (has_w ? 1 : 0) + (has_b ? 1 : 0));
      nb_colsum<T><<<cgrid, NB_COLSUM_BLOCK, 0, stream>>>(pp, row0, np, n, out0, s0, out1, s1);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
}

// Resident blocks per SM of the kernel a plan names (kind NB_ROWS or NB_CHUNKED), on the current
// device: what the planner's occupancy() asks, once per kernel.
template <class Norm>
int64_t norm_backward_occupancy(const char* op, int64_t kind, at::ScalarType dtype, int64_t vec, int64_t vpt,
                                bool wide) {
  int blocks = 0;
  NBRecord r{};
  r.kind = kind;
  r.vec = vec;
  r.vpt = vpt;
  r.wide = wide;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "norm_backward_occupancy", [&] {
    using T = typename NbCudaType<scalar_t>::type;
    nb_with_kernel<Norm, T>(op, r, [&](auto kernel) {
      const int block = kind == NB_ROWS ? NB_ROWS_BLOCK : NB_CHUNK_BLOCK;
      C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, block, 0));
    });
  });
  return blocks;
}

}  // namespace gradoracle
