// The normalisation backwards on CUDA for the torch extension: launches of the best kernels of
// backends/cuda/norm_common.cuh (nb_rows, or nb_chunked for long rows, then nb_colsum for
// dweight / dbias from partial rows; or nb_rows3 of norm_rows3.cuh, which sums its partial rows
// itself in a cooperative launch, or leaves them to nb_colsum), the device code the cupy backend
// compiles with NVRTC, as an NBRecord says (planned in Python by cupy@best's planner,
// backends/cupy/_norm_plan.py, packed by backends/torch_ext/_norm.py).  Included by
// layernorm_backward_cuda.cu and rmsnorm_backward_cuda.cu after their op's .cuh (which defines
// the norm policy).
//
// nvcc instantiates every (VEC, VPT, WIDE) the planner can ask for: VEC 1 or 16 / sizeof(T);
// VPT * VEC at most the planner's elements per thread (_norm_plan.ROWS_ELEMS / CHUNK_ELEMS;
// tests/test_torch_ext_ops.py checks that every plan it makes is one of these).  nb_rows3: every
// (VPT, GW, STAGES) of _norm_plan.rows3_config / rows3_stages with the default knobs (elems,
// stages): see nb_rows3_built.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <type_traits>
#include <utility>

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "norm_backward.h"

static_assert(sizeof(NBParams) == sizeof(gradoracle::NBParamsH), "NBParams and its host copy differ");
static_assert(NB_MAX_LEAD == gradoracle::kNbMaxLead && NB_NT == gradoracle::kNbNT, "NBParams dims differ");
static_assert(NB_PHASE_ROWS == gradoracle::kNbPhaseRows && NB_PHASE_COLS == gradoracle::kNbPhaseCols,
              "nb_rows3's phase flags differ");

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

// ---------------------------------------------------------------------------------- nb_rows3
// The planner's nb_rows3 instantiations with the default knobs (_norm_plan.rows3_config,
// rows3_stages): VEC = 16 / sizeof(T); VPT 1 for rows of up to 32 vectors (GW 1 ... 32), else
// ROWS3_ELEMS / VEC (GW 32 ... 1024) -- 1 in 16-bit types, so VPT 1 throughout; STAGES the
// default STAGES, fewer while the shared memory exceeds ROWS3_SMEM_LIMIT.
constexpr int kNbRows3Stages = 4;                   // _norm_plan.STAGES
constexpr int kNbRows3SmemLimit = 232448 - 8192;    // _norm_plan.ROWS3_SMEM_LIMIT
constexpr int kNbRows3MaxGwLog2 = 10;               // _norm_plan.ROWS3_MAX_GW = 1024

template <typename T>
constexpr int nb_rows3_vpt_max() {
  constexpr int elems = sizeof(T) == 8 ? 4 : 8, vec = 16 / sizeof(T);  // _norm_plan.ROWS3_ELEMS
  return elems / vec > 1 ? elems / vec : 1;
}

template <typename T, int VPT, int GW>
constexpr bool nb_rows3_built() {
  constexpr int m = nb_rows3_vpt_max<T>();
  return VPT == 1 ? (GW <= 32 || m == 1) : (VPT == m && GW >= 32);
}

template <typename T, int VPT, int GW, int S = kNbRows3Stages>
constexpr int nb_rows3_stages() {
  if constexpr (S > 2 && NBRows3Smem<T, VPT, GW, S>::BYTES > kNbRows3SmemLimit)
    return nb_rows3_stages<T, VPT, GW, S - 1>();
  else
    return S;
}

template <int VPT, typename F, size_t... L>
void nb_rows3_each_gw(std::index_sequence<L...>, F& one) {
  (one(std::integral_constant<int, VPT>{}, std::integral_constant<int, 1 << L>{}), ...);
}

// Calls f(kernel, dynamic shared bytes, block) with the nb_rows3 instantiation for (vpt, gw,
// stages); false if none is built.
template <class Norm, typename T, typename F>
bool nb_rows3_with_kernel(int64_t vpt, int64_t gw, int64_t stages, F&& f) {
  bool found = false;
  auto one = [&](auto vc, auto gc) {
    constexpr int VPT = decltype(vc)::value, GW = decltype(gc)::value;
    if constexpr (nb_rows3_built<T, VPT, GW>()) {
      constexpr int S = nb_rows3_stages<T, VPT, GW>();
      if (vpt == VPT && gw == GW && stages == S) {
        found = true;
        f(nb_rows3<Norm, T, VPT, GW, S>, static_cast<int>(NBRows3Smem<T, VPT, GW, S>::BYTES),
          static_cast<int>(NB_ROWS3_BLOCK(GW)));
      }
    }
  };
  nb_rows3_each_gw<1>(std::make_index_sequence<kNbRows3MaxGwLog2 + 1>{}, one);
  if constexpr (nb_rows3_vpt_max<T>() > 1)
    nb_rows3_each_gw<nb_rows3_vpt_max<T>()>(std::make_index_sequence<kNbRows3MaxGwLog2 + 1>{}, one);
  return found;
}

// Lets `fn` take `smem` bytes of dynamic shared memory on the current device (above 48 KiB a
// kernel must opt in), once per (kernel, device).
inline void nb_allow_smem(const void* fn, int smem) {
  if (smem <= 48 * 1024) return;
  static std::mutex mu;
  static auto* done = new std::set<std::pair<const void*, int>>();  // never freed: used until exit
  int dev = 0;
  C10_CUDA_CHECK(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(mu);
  if (done->count({fn, dev})) return;
  C10_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  done->insert({fn, dev});
}

// nb_rows3's grid-barrier words for (device, stream): zeroed once on that stream, left reusable by
// every launch (the arrival count returns to 0; any generation works).  Calls on another stream
// get words of their own, so concurrent cooperative launches never share them.
inline unsigned int* nb_grid_barrier(const at::Tensor& like, cudaStream_t stream) {
  static std::mutex mu;
  static auto* bars = new std::map<std::pair<int, cudaStream_t>, at::Tensor>();  // never freed
  const std::pair<int, cudaStream_t> key{like.get_device(), stream};
  const std::lock_guard<std::mutex> lock(mu);
  auto it = bars->find(key);
  if (it == bars->end()) it = bars->emplace(key, at::zeros({2}, like.options().dtype(at::kInt))).first;
  return reinterpret_cast<unsigned int*>(it->second.data_ptr<int>());
}

// What nb_rows3 assumes of the layout and the split beyond check_norm_run's checks: dense rows
// of whole 16-byte vectors, GW threads of VPT vectors holding a row, blocks of whole steps
// covering the rows, its phases.
inline void nb_rows3_check(const char* op, const NBRecord& r, int64_t vec, bool has_w) {
  const NBParamsH& p = r.p;
  TORCH_CHECK_VALUE(r.vec == vec, op, ": plan has nb_rows3 with VEC ", r.vec, ", expected ", vec,
                    " (16-byte vectors of this dtype)");
  bool dense = p.n % vec == 0 && p.col_stride[kNbX] == 1 && p.col_stride[kNbDY] == 1 && p.col_stride[kNbDX] == 1 &&
               (!has_w || p.col_stride[kNbW] == 1);
  for (int t : {kNbX, kNbDY, kNbDX})
    for (int64_t d = 0; d < p.nlead; ++d) dense = dense && p.stride[t][d] % vec == 0;
  TORCH_CHECK_VALUE(dense, op, ": plan has nb_rows3 for a layout whose rows are not dense runs of 16-byte vectors");
  const int64_t gw = p.gw, block = gw < NB_ROWS3_MIN_BLOCK ? NB_ROWS3_MIN_BLOCK : gw;
  TORCH_CHECK_VALUE(gw >= 1 && (gw & (gw - 1)) == 0 && gw <= 1024 && (int64_t(1) << p.gw_log2) == gw &&
                        r.vpt * vec * gw >= p.n,
                    op, ": plan has nb_rows3 with ", gw, " threads of ", r.vpt, " vectors per row of ", p.n);
  TORCH_CHECK_VALUE(p.rows < (int64_t(1) << 31) && p.rows_per_block >= 1 && p.rows_per_block % (block / gw) == 0 &&
                        (r.grid - 1) * p.rows_per_block < p.rows && r.grid * p.rows_per_block >= p.rows,
                    op, ": plan splits ", p.rows, " rows into ", r.grid, " blocks of ", p.rows_per_block);
  const bool coop = p.flags & kNbPhaseCols;
  TORCH_CHECK_VALUE((p.flags & kNbPhaseRows) && !(coop && r.colsum), op, ": plan has nb_rows3 with flags ", p.flags,
                    " and colsum ", r.colsum);
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
  // nb_rows3 with NB_PHASE_COLS: one cooperative launch sums the partial rows after a grid barrier.
  const bool coop = r.kind == NB_ROWS3 && (ph.flags & kNbPhaseCols);
  TORCH_CHECK_VALUE(r.vec == 1 || (nb_aligned16(a.x) && nb_aligned16(a.dy) && nb_aligned16(a.dx) &&
                                   nb_aligned16(a.weight)),
                    op, ": plan reads 16-byte vectors but x, dy, dx or weight is not 16-byte aligned");
  const bool sums = r.colsum != 0;
  TORCH_CHECK_VALUE(!(sums || coop) || r.ws >= 2 * ph.nparts * ph.n, op, ": plan's partial-row buffer holds ", r.ws,
                    " elements, expected ", 2 * ph.nparts * ph.n);
  // Without nb_colsum or the fused finish, only a single nb_rows / nb_rows3 block writes dweight /
  // dbias itself.
  TORCH_CHECK_VALUE(sums || coop || !(has_w || has_b) || ((r.kind == NB_ROWS || r.kind == NB_ROWS3) && ph.nparts == 1),
                    op, ": plan leaves dweight / dbias in partial rows without summing them");
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
    if (r.kind == NB_ROWS3) {
      nb_rows3_check(op, r, 16 / sizeof(T), has_w);
      unsigned int* bar = coop ? nb_grid_barrier(a.x, stream) : nullptr;
      const bool found = nb_rows3_with_kernel<Norm, T>(r.vpt, ph.gw, r.stages, [&](auto kernel, int smem, int block) {
        nb_allow_smem(reinterpret_cast<const void*>(kernel), smem);
        if (coop) {  // every block resident (the plan's grid is at most the resident blocks)
          auto arg = [](const auto& v) { return const_cast<void*>(static_cast<const void*>(&v)); };
          void* args[] = {arg(p), arg(x), arg(dy), arg(w), arg(mean), arg(rstd), arg(dx), arg(pp), arg(dw), arg(db),
                          arg(bar)};
          C10_CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), grid, dim3(block), args,
                                                     static_cast<size_t>(smem), stream));
        } else {
          kernel<<<grid, block, smem, stream>>>(p, x, dy, w, mean, rstd, dx, pp, dw, db, bar);
        }
      });
      TORCH_CHECK_VALUE(found, op, ": plan asks for nb_rows3 with VPT ", r.vpt, ", GW ", ph.gw, ", STAGES ", r.stages,
                        ", which the extension does not build");
    } else {
      nb_with_kernel<Norm, T>(op, r, [&](auto kernel) {
        if constexpr (std::is_invocable_v<decltype(kernel), NBParams, const T*, const T*, const T*, const A*, const A*,
                                          T*, A*, T*, T*>)
          kernel<<<grid, NB_ROWS_BLOCK, 0, stream>>>(p, x, dy, w, mean, rstd, dx, pp, dw, db);
        else
          kernel<<<grid, NB_CHUNK_BLOCK, 0, stream>>>(p, x, dy, w, mean, rstd, dx, pp);
      });
    }
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

// Resident blocks per SM of the kernel a plan names (kind NB_ROWS, NB_CHUNKED, or NB_ROWS3 with
// its gw, stages and dynamic shared memory), on the current device: what the planner's
// occupancy() asks, once per kernel.
template <class Norm>
int64_t norm_backward_occupancy(const char* op, int64_t kind, at::ScalarType dtype, int64_t vec, int64_t vpt,
                                bool wide, int64_t gw, int64_t stages) {
  int blocks = 0;
  NBRecord r{};
  r.kind = kind;
  r.vec = vec;
  r.vpt = vpt;
  r.wide = wide;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "norm_backward_occupancy", [&] {
    using T = typename NbCudaType<scalar_t>::type;
    if (kind == NB_ROWS3) {
      TORCH_CHECK_VALUE(vec == 16 / sizeof(T), op, ": nb_rows3 with VEC ", vec, ", expected ", 16 / sizeof(T));
      const bool found = nb_rows3_with_kernel<Norm, T>(vpt, gw, stages, [&](auto kernel, int smem, int block) {
        nb_allow_smem(reinterpret_cast<const void*>(kernel), smem);
        C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, block, smem));
      });
      TORCH_CHECK_VALUE(found, op, ": nb_rows3 with VPT ", vpt, ", GW ", gw, ", STAGES ", stages,
                        " is not built by the extension");
      return;
    }
    nb_with_kernel<Norm, T>(op, r, [&](auto kernel) {
      const int block = kind == NB_ROWS ? NB_ROWS_BLOCK : NB_CHUNK_BLOCK;
      C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, block, 0));
    });
  });
  return blocks;
}

}  // namespace gradoracle
