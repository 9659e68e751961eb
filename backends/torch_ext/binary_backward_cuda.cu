// binary_backward on CUDA for the torch extension: host planning and launches of the kernels
// in backends/cuda/binary_backward.cuh (the same device code the cupy backend compiles with
// NVRTC).  The launch contract is documented at the top of that file; `plan_launch` below
// mirrors backends/cupy_raw.py:plan_launch line for line, so both backends run the same
// kernels with the same tiles.
//
// Stage 1 writes each output either final (when one tile covers its whole reduction) or as
// float (double for float64) partial rows; stage 2 (bb_finalize) sums the rows in a fixed
// order.  No atomics: results are bitwise reproducible on a given GPU.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <type_traits>
#include <utility>

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "bcast_plan.h"
#include "binary_backward.h"
#include "../cuda/binary_backward.cuh"

namespace gradoracle {
namespace {

static_assert(static_cast<int>(BinaryFn::kAdd) == BB_ADD && static_cast<int>(BinaryFn::kSub) == BB_SUB &&
                  static_cast<int>(BinaryFn::kMul) == BB_MUL && static_cast<int>(BinaryFn::kDiv) == BB_DIV &&
                  static_cast<int>(BinaryFn::kPow) == BB_POW && static_cast<int>(BinaryFn::kMaximum) == BB_MAXIMUM &&
                  static_cast<int>(BinaryFn::kMinimum) == BB_MINIMUM,
              "BinaryFn and the .cuh's FN numbering must agree");
static_assert(kMaxDims == BB_MAX_DIMS && kNumOperands == BB_NT, "bcast_plan.h and the .cuh must agree");

// Launch heuristics: the same constants as backends/cupy_raw.py.
constexpr int64_t kBlocksPerSm = 2048 / BB_BLOCK;
constexpr int64_t kTargetWaves = 2;
constexpr int64_t kMaxGridWaves = 4;
constexpr int64_t kMaxChunks = 1024;
constexpr int64_t kMinItemsPerThread = 8;

// Tensor slots of each role order (`swap` in the contract).
constexpr int kNaturalSlots[BB_NT] = {kA, kB, kG, kGA, kGB};
constexpr int kSwappedSlots[BB_NT] = {kB, kA, kG, kGB, kGA};

enum class Kind { kZero, kFast, kEw, kLk1, kLk8, kLrStream, kLrBatched };

struct Launch {
  Kind kind = Kind::kZero;
  int64_t grid = 0;
  BBParams params{};
  bool swap = false;                 // role P is b (dP = grad_b), Q is a
  int64_t nchunks[2] = {1, 1};       // partial rows of dP, dQ (1: the kernel writes them final)
  int64_t numel_out[2] = {0, 0};     // numel of dP, dQ
  bool vectorized = false;           // fast path only
};

int64_t ceil_div(int64_t x, int64_t y) { return (x + y - 1) / y; }

int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

int64_t log2_pow2(int64_t n) {
  int64_t l = 0;
  while ((int64_t{1} << l) < n) ++l;
  return l;
}

int64_t grid_for(int64_t tiles, int64_t num_sms) {
  return std::max<int64_t>(1, std::min(tiles, num_sms * kBlocksPerSm * kMaxGridWaves));
}

int64_t target_blocks(int64_t num_sms) { return num_sms * kBlocksPerSm * kTargetWaves; }

// The group's dims reordered by decreasing |g stride| (stable), so g's fastest dim is innermost.
DimGroup sorted_group(const DimGroup& g) {
  int order[kMaxDims];
  std::iota(order, order + g.ndim, 0);
  std::stable_sort(order, order + g.ndim,
                   [&](int x, int y) { return std::llabs(g.strides[kG][x]) > std::llabs(g.strides[kG][y]); });
  DimGroup out{};
  out.ndim = g.ndim;
  for (int d = 0; d < g.ndim; ++d) {
    out.sizes[d] = g.sizes[order[d]];
    for (int t = 0; t < kNumOperands; ++t) out.strides[t][d] = g.strides[t][order[d]];
  }
  return out;
}

int64_t min_g_stride(const DimGroup& g) {
  int64_t best = std::numeric_limits<int64_t>::max();
  for (int d = 0; d < g.ndim; ++d) best = std::min<int64_t>(best, std::llabs(g.strides[kG][d]));
  return best;
}

void pack_group(BBGroup& dst, const DimGroup& g, const int* slots) {
  dst.ndim = g.ndim;
  dst.numel = g.numel();
  for (int d = 0; d < BB_MAX_DIMS; ++d) {
    dst.size[d] = d < g.ndim ? g.sizes[d] : 1;
    for (int s = 0; s < BB_NT; ++s) dst.stride[s][d] = d < g.ndim ? g.strides[slots[s]][d] : 0;
  }
}

struct Tiling {
  int64_t lanes = 1, chunk[3] = {1, 1, 1}, nchunk[3] = {1, 1, 1}, ntiles = 1, numel_out[2] = {0, 0};
  bool swap = false;
};

BBParams pack_params(const DimGroup* g0, const DimGroup* g1, const DimGroup* g2, const Tiling& t) {
  BBParams p{};
  const DimGroup empty{};
  const DimGroup* groups[3] = {g0, g1, g2};
  for (int i = 0; i < 3; ++i) pack_group(p.grp[i], groups[i] ? *groups[i] : empty, t.swap ? kSwappedSlots : kNaturalSlots);
  p.lanes = t.lanes;
  p.lanes_log2 = log2_pow2(t.lanes);
  for (int i = 0; i < 3; ++i) {
    p.chunk[i] = t.chunk[i];
    p.nchunk[i] = t.nchunk[i];
  }
  p.ntiles = t.ntiles;
  p.swap = t.swap ? 1 : 0;
  p.numel_out[0] = t.numel_out[0];
  p.numel_out[1] = t.numel_out[1];
  return p;
}

// (number of chunks, chunk length): base_tiles * chunks at most about target_tiles (no split
// when base_tiles alone reaches it), each chunk at least min_per_chunk items, at most
// kMaxChunks chunks, length a multiple of `multiple`.
std::pair<int64_t, int64_t> split_chunks(int64_t n_items, int64_t min_per_chunk, int64_t base_tiles,
                                         int64_t target_tiles, int64_t multiple = 1) {
  const int64_t want = target_tiles / std::max<int64_t>(base_tiles, 1);
  const int64_t most = std::max<int64_t>(1, n_items / std::max<int64_t>(min_per_chunk, 1));
  const int64_t n = std::max<int64_t>(1, std::min({want, most, kMaxChunks}));
  const int64_t size = ceil_div(ceil_div(n_items, n), multiple) * multiple;
  return {ceil_div(n_items, size), size};
}

Launch plan_ew(const BcastPlan& plan, int64_t num_sms) {
  const DimGroup k = sorted_group(plan.k);
  const int last = static_cast<int>(k.ndim) - 1;
  const int64_t ncols = k.sizes[last], nrows = k.numel() / ncols;
  // A tensor whose fast dim is not the column dim (a transposed view) wants tiles spanning
  // rows, so its sectors are reused from L1; otherwise take wide rows.
  bool all_fast_last = true;
  for (int s = 0; s < BB_NT; ++s) {
    int best = 0;
    for (int d = 1; d <= last; ++d)
      if (std::llabs(k.strides[kNaturalSlots[s]][d]) <= std::llabs(k.strides[kNaturalSlots[s]][best])) best = d;
    all_fast_last = all_fast_last && best == last;
  }
  Tiling t;
  t.lanes = all_fast_last ? std::min<int64_t>(BB_EW_TILE, std::max<int64_t>(32, next_pow2(ncols))) : 32;
  t.chunk[0] = t.lanes;
  t.chunk[1] = BB_EW_TILE / t.lanes;
  t.nchunk[0] = ceil_div(ncols, t.lanes);
  t.nchunk[1] = ceil_div(nrows, BB_EW_TILE / t.lanes);
  t.ntiles = t.nchunk[0] * t.nchunk[1];
  Launch l;
  l.kind = Kind::kEw;
  l.params = pack_params(&k, nullptr, nullptr, t);
  l.grid = grid_for(t.ntiles, num_sms);
  return l;
}

// Lanes along K; U = the smaller reduced group (registers), V = the other (rows).
Launch plan_lk(const BcastPlan& plan, int64_t num_sms) {
  const DimGroup k = sorted_group(plan.k), ra = sorted_group(plan.ra), rb = sorted_group(plan.rb);
  const bool u_is_ra = ra.numel() <= rb.numel();
  const DimGroup& u = u_is_ra ? ra : rb;
  const DimGroup& v = u_is_ra ? rb : ra;
  Tiling t;
  t.swap = u_is_ra;  // P is the operand broadcast along V: b when V = RB
  const int64_t j = u.numel() == 1 ? 1 : BB_J;
  const int64_t kw = std::min<int64_t>(32, next_pow2(k.numel())), nw = BB_BLOCK / kw;
  t.lanes = kw;
  t.chunk[0] = kw;
  t.nchunk[0] = ceil_div(k.numel(), kw);
  t.chunk[1] = std::min(u.numel(), j);
  t.nchunk[1] = ceil_div(u.numel(), t.chunk[1]);
  const auto [n_cv, cv] =
      split_chunks(v.numel(), nw * kMinItemsPerThread, t.nchunk[0] * t.nchunk[1], target_blocks(num_sms));
  t.chunk[2] = cv;
  t.nchunk[2] = n_cv;
  t.ntiles = t.nchunk[0] * t.nchunk[1] * t.nchunk[2];
  t.numel_out[0] = k.numel() * u.numel();  // dP keeps K, U
  t.numel_out[1] = k.numel() * v.numel();  // dQ keeps K, V
  Launch l;
  l.kind = j == 1 ? Kind::kLk1 : Kind::kLk8;
  l.params = pack_params(&k, &u, &v, t);
  l.grid = grid_for(t.ntiles, num_sms);
  l.swap = t.swap;
  l.nchunks[0] = t.nchunk[2];  // dP sums over V
  l.nchunks[1] = t.nchunk[1];  // dQ sums over U
  l.numel_out[0] = t.numel_out[0];
  l.numel_out[1] = t.numel_out[1];
  return l;
}

// Lanes along the reduced group X that holds grad_out's fast dim; Y = the other one.
Launch plan_lr(const BcastPlan& plan, bool x_is_ra, int64_t num_sms) {
  const DimGroup x = sorted_group(x_is_ra ? plan.ra : plan.rb);
  const DimGroup y = sorted_group(x_is_ra ? plan.rb : plan.ra);
  const DimGroup z = sorted_group(plan.k);
  Tiling t;
  t.swap = !x_is_ra;  // P is the operand broadcast along X: b when X = RB
  const int64_t xw = std::min<int64_t>(32, next_pow2(x.numel()));
  t.lanes = xw;
  t.numel_out[0] = z.numel() * y.numel();  // dP keeps Z, Y
  t.numel_out[1] = z.numel() * x.numel();  // dQ keeps Z, X
  Launch l;
  l.swap = t.swap;
  l.numel_out[0] = t.numel_out[0];
  l.numel_out[1] = t.numel_out[1];
  if (y.numel() == 1) {
    const int64_t segs_target = num_sms * 2048 * kTargetWaves / xw;
    const auto [n_cx, cx] = split_chunks(x.numel(), xw * kMinItemsPerThread, z.numel(), segs_target, xw);
    t.chunk[0] = cx;
    t.nchunk[0] = n_cx;
    t.nchunk[2] = z.numel();
    t.ntiles = n_cx * z.numel();
    l.kind = Kind::kLrStream;
    l.params = pack_params(&x, &y, &z, t);
    l.grid = grid_for(ceil_div(t.ntiles, BB_BLOCK / xw), num_sms);
    l.nchunks[0] = n_cx;
    return l;
  }
  const int64_t nw = BB_BLOCK / xw;
  t.chunk[0] = xw * BB_J;
  t.nchunk[0] = ceil_div(x.numel(), t.chunk[0]);
  const auto [n_cy, cy] =
      split_chunks(y.numel(), nw * kMinItemsPerThread, t.nchunk[0] * z.numel(), target_blocks(num_sms));
  t.chunk[1] = cy;
  t.nchunk[1] = n_cy;
  t.nchunk[2] = z.numel();
  t.ntiles = t.nchunk[0] * n_cy * z.numel();
  l.kind = Kind::kLrBatched;
  l.params = pack_params(&x, &y, &z, t);
  l.grid = grid_for(t.ntiles, num_sms);
  l.nchunks[0] = t.nchunk[0];  // dP sums over X
  l.nchunks[1] = n_cy;         // dQ sums over Y
  return l;
}

Launch plan_launch(const BcastPlan& plan, int64_t num_sms, bool aligned16, int64_t itemsize) {
  Launch l;
  if (plan.numel == 0) return l;  // Kind::kZero
  if (plan.contiguous_fast_path()) {
    l.kind = Kind::kFast;
    l.vectorized = aligned16;
    const int64_t items = aligned16 ? plan.numel / (16 / itemsize) : plan.numel;
    l.grid = grid_for(ceil_div(std::max<int64_t>(items, 1), BB_BLOCK), num_sms);
    return l;
  }
  if (plan.no_broadcast()) return plan_ew(plan, num_sms);
  // Lanes go along the group that holds grad_out's fastest dim (ties: K, then RA, then RB).
  const DimGroup* groups[3] = {&plan.k, &plan.ra, &plan.rb};
  int lane = -1;
  for (int i = 0; i < 3; ++i)
    if (groups[i]->ndim > 0 && (lane < 0 || min_g_stride(*groups[i]) < min_g_stride(*groups[lane]))) lane = i;
  if (lane == 0) return plan_lk(plan, num_sms);
  return plan_lr(plan, lane == 1, num_sms);
}

// ----------------------------------------------------------------------------- launches

template <typename S> struct CudaType { using type = S; };
template <> struct CudaType<at::Half> { using type = __half; };
template <> struct CudaType<at::BFloat16> { using type = __nv_bfloat16; };

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int64_t sm_count(c10::DeviceIndex device) {
  int n = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  return n;
}

template <typename T>
void finalize(const at::Tensor& part, int64_t nchunks, T* out, int64_t n, int64_t num_sms, cudaStream_t stream) {
  const int64_t grid = grid_for(ceil_div(n, BB_BLOCK), num_sms);
  bb_finalize<T><<<grid, BB_BLOCK, 0, stream>>>(part.data_ptr<bb_acc_t<T>>(), nchunks, n, out);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int FN>
void run(const Launch& l, const T* a, const T* b, const T* g, T* ga, T* gb, int64_t numel, const at::Tensor& like,
         int64_t num_sms, cudaStream_t stream) {
  using A = bb_acc_t<T>;
  if (l.kind == Kind::kFast) {
    bb_fast<T, FN><<<l.grid, BB_BLOCK, 0, stream>>>(a, b, g, ga, gb, numel, l.vectorized ? 1 : 0);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  if (l.kind == Kind::kEw) {
    bb_ew<T, FN><<<l.grid, BB_BLOCK, 0, stream>>>(l.params, a, b, g, ga, gb);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  const T* p_op = l.swap ? b : a;
  const T* q_op = l.swap ? a : b;
  T* d_p = l.swap ? gb : ga;
  T* d_q = l.swap ? ga : gb;
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
    case Kind::kLk1:
      bb_lk<T, FN, 1><<<l.grid, BB_BLOCK, 0, stream>>>(l.params, p_op, q_op, g, d_p, part_ptr[0], d_q, part_ptr[1]);
      break;
    case Kind::kLk8:
      bb_lk<T, FN, BB_J><<<l.grid, BB_BLOCK, 0, stream>>>(l.params, p_op, q_op, g, d_p, part_ptr[0], d_q,
                                                          part_ptr[1]);
      break;
    case Kind::kLrStream:
      bb_lr_stream<T, FN><<<l.grid, BB_BLOCK, 0, stream>>>(l.params, p_op, q_op, g, d_p, part_ptr[0], d_q);
      break;
    case Kind::kLrBatched:
      bb_lr_batched<T, FN><<<l.grid, BB_BLOCK, 0, stream>>>(l.params, p_op, q_op, g, d_p, part_ptr[0], d_q,
                                                            part_ptr[1]);
      break;
    default:
      TORCH_CHECK(false, "binary_backward: unexpected launch kind ", static_cast<int>(l.kind));
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  T* outs[2] = {d_p, d_q};
  for (int i = 0; i < 2; ++i)
    if (l.nchunks[i] > 1) finalize<T>(parts[i], l.nchunks[i], outs[i], l.numel_out[i], num_sms, stream);
}

}  // namespace

void binary_backward_cuda_out(const at::Tensor& a, const at::Tensor& b, const at::Tensor& grad_out,
                              c10::string_view fn, at::Tensor& grad_a, at::Tensor& grad_b) {
  const BinaryFn fn_id = check_binary_backward_args(a, b, grad_out, fn, grad_a, grad_b);
  TORCH_CHECK_VALUE(a.is_cuda(), "binary_backward: a is on ", a.device(), ", expected a CUDA device");
  const c10::cuda::CUDAGuard guard(a.device());
  const BcastPlan plan = make_plan(a.sizes(), b.sizes(), a.strides(), b.strides(), grad_out.strides());
  if (plan.numel == 0) {  // sums over nothing
    grad_a.zero_();
    grad_b.zero_();
    return;
  }
  const int64_t num_sms = sm_count(a.device().index());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "binary_backward_cuda", [&] {
    using T = typename CudaType<scalar_t>::type;
    const T* pa = reinterpret_cast<const T*>(a.const_data_ptr<scalar_t>());
    const T* pb = reinterpret_cast<const T*>(b.const_data_ptr<scalar_t>());
    const T* pg = reinterpret_cast<const T*>(grad_out.const_data_ptr<scalar_t>());
    T* pga = reinterpret_cast<T*>(grad_a.mutable_data_ptr<scalar_t>());
    T* pgb = reinterpret_cast<T*>(grad_b.mutable_data_ptr<scalar_t>());
    const bool vec = aligned16(pa) && aligned16(pb) && aligned16(pg) && aligned16(pga) && aligned16(pgb);
    const Launch l = plan_launch(plan, num_sms, vec, static_cast<int64_t>(sizeof(T)));
    dispatch_binary_fn(fn_id, [&](auto fc) {
      constexpr int FN = static_cast<int>(decltype(fc)::value);
      run<T, FN>(l, pa, pb, pg, pga, pgb, plan.numel, a, num_sms, stream);
    });
  });
}

}  // namespace gradoracle
