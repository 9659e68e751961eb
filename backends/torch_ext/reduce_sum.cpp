// reduce_sum for the torch extension: the op's schemas, its argument checks (shared by both
// devices) and its CPU kernel.  The CUDA launches are reduce_sum_cuda.cu; the plans of both
// devices come from Python (backends/torch_ext/reduce_sum.py).
//
// Ops (namespace gradoracle):
//   reduce_sum(Tensor x, int[]? axes=None, bool keepdim=False, int[]? target=None) -> Tensor
//   reduce_sum.out(..., *, Tensor(a!) y) -> ()
//       the public ops (axes form, or sum_to_shape with `target`); their kernels are Python
//       (they make the plan, then call:)
//   _reduce_sum_run(Tensor x, Tensor plan, *, Tensor(a!) y) -> ()
//       checks every argument and runs the plan (an RSRecord, reduce_sum.h).
//
// The CPU kernel walks the plan's collapsed groups: row mode (a reduced dim is x's fastest) sums
// each output's red.numel runs of `run` elements into kLanes interleaved partial sums added by a
// fixed tree; col mode (a kept dim is x's fastest) takes a block of columns and adds rows into
// one accumulator per column, rows in order.  Every output is summed by one thread in an order
// fixed by the shapes: deterministic, no atomics.  Accumulation in float (double for float64).
#include <algorithm>
#include <cstring>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "common.h"
#include "reduce_sum.h"

namespace gradoracle {
namespace {

constexpr const char* kOp = "reduce_sum";
constexpr int kLanes = 8;
constexpr int64_t kColBlock = 256;  // columns per work item in col mode
constexpr int64_t kGrain = 1 << 16;  // elements of x per thread at least (small sums stay on one thread)

// x offset of element `idx` of a group (row-major unravel, last dim fastest); y offset too.
inline void offsets(const RSGroupH& g, int64_t idx, int64_t& xo, int64_t& yo) {
  xo = 0;
  yo = 0;
  for (int64_t d = g.ndim - 1; d >= 0; --d) {
    const int64_t r = idx % g.size[d];
    idx /= g.size[d];
    xo += r * g.xs[d];
    yo += r * g.ys[d];
  }
}

template <typename acc_t>
acc_t sum_lanes(const acc_t (&l)[kLanes]) {
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

template <typename scalar_t>
void run_row(const RSParamsH& p, const scalar_t* x, scalar_t* y) {
  using acc_t = at::opmath_type<scalar_t>;
  at::parallel_for(0, p.nseg, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, p.red.numel * p.run)),
                   [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      int64_t xo, yo;
      offsets(p.outer, s, xo, yo);
      acc_t lane[kLanes] = {};
      int64_t k = 0;  // unit index, fixes the lane
      for (int64_t r = 0; r < p.red.numel; ++r) {
        int64_t ro, unused;
        offsets(p.red, r, ro, unused);
        const scalar_t* run = x + xo + ro;
        for (int64_t i = 0; i < p.run; ++i, ++k) lane[k % kLanes] += static_cast<acc_t>(run[i * p.run_xs]);
      }
      y[yo] = static_cast<scalar_t>(sum_lanes(lane));
    }
  });
}

template <typename scalar_t>
void run_col(const RSParamsH& p, const scalar_t* x, scalar_t* y) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t nblk = (p.inner + kColBlock - 1) / kColBlock;
  const int64_t per_item = p.red.numel * std::min(kColBlock, p.inner);  // elements a work item reads
  at::parallel_for(0, p.outer.numel * nblk, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, per_item)),
                   [&](int64_t t0, int64_t t1) {
    std::vector<acc_t> acc(kColBlock);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t o = t / nblk, i0 = (t % nblk) * kColBlock, n = std::min(kColBlock, p.inner - i0);
      int64_t xo, yo;
      offsets(p.outer, o, xo, yo);
      std::fill(acc.begin(), acc.end(), acc_t(0));
      for (int64_t r = 0; r < p.red.numel; ++r) {
        int64_t ro, unused;
        offsets(p.red, r, ro, unused);
        const scalar_t* row = x + xo + ro + i0 * p.inner_xs;
        for (int64_t i = 0; i < n; ++i) acc[i] += static_cast<acc_t>(row[i * p.inner_xs]);
      }
      for (int64_t i = 0; i < n; ++i) y[yo + (i0 + i) * p.inner_ys] = static_cast<scalar_t>(acc[i]);
    }
  });
}

void reduce_sum_run_cpu(const at::Tensor& x, const at::Tensor& plan, at::Tensor& y) {
  RSRecord rec;
  check_reduce_sum_run(x, plan, y, rec);
  TORCH_CHECK_VALUE(x.device().is_cpu(), kOp, ": x is on device ", x.device(), ", expected cpu (this is the CPU kernel)");
  if (rec.kind == RS_EMPTY) return;
  if (rec.kind == RS_ZERO) {
    y.zero_();
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "reduce_sum_cpu", [&] {
    const scalar_t* px = x.const_data_ptr<scalar_t>();
    scalar_t* py = y.mutable_data_ptr<scalar_t>();
    if (rec.col)
      run_col<scalar_t>(rec.p, px, py);
    else
      run_row<scalar_t>(rec.p, px, py);
  });
}

// Every element the plan reaches lies inside x's storage: the plan is private to
// backends/torch_ext, but a stale or foreign one must not read out of bounds.
void check_group(const RSGroupH& g) {
  TORCH_CHECK_VALUE(g.ndim >= 0 && g.ndim <= kRsMaxDims, kOp, ": plan has a group of ", g.ndim, " dims");
  int64_t n = 1;
  for (int64_t d = 0; d < g.ndim; ++d) {
    TORCH_CHECK_VALUE(g.size[d] >= 1, kOp, ": plan has a group dim of size ", g.size[d]);
    n *= g.size[d];
  }
  TORCH_CHECK_VALUE(n == g.numel, kOp, ": plan has a group of ", g.numel, " elements whose sizes multiply to ", n);
}

}  // namespace

void check_reduce_sum_run(const at::Tensor& x, const at::Tensor& plan, const at::Tensor& y, RSRecord& rec) {
  check_float_input(kOp, x, "x");
  TORCH_CHECK_VALUE(y.defined() && y.layout() == at::kStrided, kOp, ": y must be a strided tensor");
  check_like(kOp, y, "y", x, "x");
  TORCH_CHECK_VALUE(y.is_contiguous(), kOp, ": y must be contiguous, got strides ", y.strides(), " for shape ",
                    y.sizes());
  check_no_overlap(kOp, y, "y", x, "x");
  std::memcpy(&rec, plan_words(kOp, plan, kRsRecordWords), sizeof(RSRecord));
  TORCH_CHECK_VALUE(rec.kind >= RS_EMPTY && rec.kind <= RS_COL, kOp, ": plan has kind ", rec.kind);
  TORCH_CHECK_VALUE(rec.out_numel == y.numel(), kOp, ": plan is for ", rec.out_numel, " elements of y, got ",
                    y.numel(), " (y has shape ", y.sizes(), ")");
  if (rec.kind == RS_EMPTY || rec.kind == RS_ZERO) return;
  check_group(rec.p.outer);
  check_group(rec.p.red);
  const int64_t reduced = rec.p.red.numel * (rec.col ? 1 : rec.p.run);
  const int64_t kept = rec.p.outer.numel * (rec.col ? rec.p.inner : 1);
  TORCH_CHECK_VALUE(reduced * kept == x.numel() && kept == rec.out_numel, kOp, ": plan covers ", reduced, " x ", kept,
                    " elements, x has ", x.numel(), " and y ", y.numel());
  const bool cpu = x.device().is_cpu();
  TORCH_CHECK_VALUE(cpu == (rec.kind == RS_CPU), kOp, ": plan has kind ", rec.kind, ", which ", x.device(),
                    " does not run");
}

}  // namespace gradoracle

TORCH_LIBRARY_FRAGMENT(gradoracle, m) {
  m.def("reduce_sum(Tensor x, int[]? axes=None, bool keepdim=False, int[]? target=None) -> Tensor");
  // .out returns nothing: torch.compile functionalizes a custom op's mutations only when it does
  // not also return the mutated tensor.
  m.def("reduce_sum.out(Tensor x, int[]? axes=None, bool keepdim=False, int[]? target=None, *, Tensor(a!) y) -> ()");
  m.def("_reduce_sum_run(Tensor x, Tensor plan, *, Tensor(a!) y) -> ()");
}

TORCH_LIBRARY_IMPL(gradoracle, CPU, m) {
  m.impl("_reduce_sum_run", TORCH_FN(gradoracle::reduce_sum_run_cpu));
}
