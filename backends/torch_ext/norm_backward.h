// The normalisation backwards (layernorm_backward, rmsnorm_backward) for the torch extension: what
// both ops' .cpp (schemas, checks, CPU kernel) and _cuda.cu (launches) share.  Specs:
// oracle/layernorm_backward.py, oracle/rmsnorm_backward.py.
//
// Each op runs gradoracle::_<op>_run(..., Tensor plan, *, dx, dweight?, dbias?), whose `plan` is an
// NBRecord made in Python (backends/torch_ext/_norm.py) with the planner cupy@best uses
// (backends/cupy/_norm_plan.py: the row layout, merged leading dims with element strides, and the
// launch of nb_rows / nb_chunked + nb_colsum, or of nb_rows3 with its fused finish or nb_colsum).
// The C++ checks and runs, never plans.
//
// The CPU kernel: rows in blocks of a size fixed by the shape (never by the thread count); each
// row's two sums (mean(g), mean(g * xhat)) in float (double for float64) with kLanes interleaved
// partial sums; each block keeps its dweight / dbias partial rows; the blocks' partials are added
// in block order.  No atomics: bitwise reproducible.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "common.h"

namespace gradoracle {

// A host copy of norm_common.cuh's NBParams (all int64, same order; the .cu static_asserts the size).
constexpr int kNbMaxLead = 6;
constexpr int kNbNT = 5;
enum : int { kNbX = 0, kNbDY = 1, kNbDX = 2, kNbMean = 3, kNbRstd = 4 };
enum : int { kNbW = 3 };
constexpr int64_t kNbHasW = 1, kNbHasB = 2;
constexpr int64_t kNbPhaseRows = 4, kNbPhaseCols = 8;  // nb_rows3's phases (norm_rows3.cuh)

struct NBParamsH {
  int64_t rows, n, nlead;
  int64_t size[kNbMaxLead];
  int64_t stride[kNbNT][kNbMaxLead];
  int64_t col_stride[4];
  int64_t out_stride[2];
  int64_t flags, gw, gw_log2, rows_per_block, nparts, tile_rows;
};

// NB_ROWS3: nb_rows3<Norm, T, vpt, p.gw, stages>; with kNbPhaseCols in p.flags a cooperative
// launch that sums the partial rows itself (no nb_colsum).
enum NBKind : int64_t { NB_ZERO = 0, NB_CPU = 1, NB_ROWS = 2, NB_CHUNKED = 3, NB_ROWS3 = 4 };

struct NBRecord {
  int64_t kind;    // NBKind
  int64_t vec;     // the kernel's VEC (elements per 16-byte vector, or 1; nb_rows3: 16 / sizeof(T))
  int64_t vpt;     // its VPT
  int64_t wide;    // nb_rows' WIDE
  int64_t grid;    // blocks of the main kernel (= nparts)
  int64_t colsum;  // nb_colsum runs after it (dweight / dbias from partial rows)
  int64_t ws;      // accumulator elements of the partial-row buffer (0: none)
  int64_t stages;  // nb_rows3's STAGES (0 for the other kinds)
  NBParamsH p;
};

constexpr int64_t kNbRecordWords = sizeof(NBRecord) / sizeof(int64_t);
static_assert(sizeof(NBRecord) == (8 + 3 + kNbMaxLead + kNbNT * kNbMaxLead + 4 + 2 + 6) * 8,
              "NBRecord must be packed int64");

// The tensors of one call; undefined where absent (weight, mean for rmsnorm, dweight, dbias).
struct NormArgs {
  at::Tensor dy, x, weight, mean, rstd, dx, dweight, dbias;
};

inline void check_stat(const char* op, const at::Tensor& s, const char* name, const at::Tensor& x) {
  const auto acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  TORCH_CHECK_VALUE(s.defined() && s.layout() == at::kStrided, op, ": ", name, " must be a strided tensor");
  TORCH_CHECK_TYPE(s.scalar_type() == acc, op, ": ", name, " has dtype ", dtype_name(s.scalar_type()), ", expected ",
                   dtype_name(acc), " (saved statistics: float32, float64 for float64 data)");
  TORCH_CHECK_VALUE(s.device() == x.device(), op, ": ", name, " is on device ", s.device(), ", expected ",
                    x.device(), " (the device of x)");
  TORCH_CHECK_VALUE(s.sizes() == x.sizes().slice(0, x.dim() - 1), op, ": ", name, " has shape ", s.sizes(),
                    ", expected ", x.sizes().slice(0, x.dim() - 1), " (one per row of x: x.shape[:-1])");
}

// Validates every argument (dtypes, devices, shapes, contiguous outputs, no overlap) and the plan
// (an NBRecord for these rows, flags and device); fills `rec`.  kMean: layernorm (mean given).
template <bool kMean>
void check_norm_run(const char* op, const NormArgs& a, const at::Tensor& plan, NBRecord& rec) {
  check_float_input(op, a.x, "x");
  check_float_input(op, a.dy, "dy");
  check_like(op, a.dy, "dy", a.x, "x");
  TORCH_CHECK_VALUE(a.x.dim() >= 1 && a.x.size(-1) >= 1, op, ": x has shape ", a.x.sizes(),
                    ", expected at least 1 dim and a last (normalised) dim N >= 1");
  TORCH_CHECK_VALUE(a.dy.sizes() == a.x.sizes(), op, ": dy has shape ", a.dy.sizes(), ", expected ", a.x.sizes(),
                    " (the shape of x)");
  const int64_t n = a.x.size(-1);
  if (a.weight.defined()) {
    check_float_input(op, a.weight, "weight");
    check_like(op, a.weight, "weight", a.x, "x");
    TORCH_CHECK_VALUE(a.weight.dim() == 1 && a.weight.size(0) == n, op, ": weight has shape ", a.weight.sizes(),
                      ", expected (", n, ") (N = x.shape[-1])");
  }
  if (kMean) check_stat(op, a.mean, "mean", a.x);
  check_stat(op, a.rstd, "rstd", a.x);
  check_output(op, a.dx, "dx", a.x, "x", a.x, "x");
  TORCH_CHECK_VALUE(a.weight.defined() == a.dweight.defined(), op, ": weight and dweight must come together (got ",
                    a.weight.defined() ? "weight without dweight" : "dweight without weight", ")");
  if (a.dweight.defined()) check_output(op, a.dweight, "dweight", a.weight, "weight", a.x, "x");
  if (a.dbias.defined()) {
    TORCH_CHECK_VALUE(a.dbias.dim() == 1 && a.dbias.size(0) == n, op, ": dbias has shape ", a.dbias.sizes(), ", expected (",
                      n, ") (N = x.shape[-1])");
    check_output(op, a.dbias, "dbias", a.dbias, "dbias", a.x, "x");
  }
  const std::pair<const at::Tensor*, const char*> ins[] = {
      {&a.dy, "dy"}, {&a.x, "x"}, {&a.weight, "weight"}, {&a.mean, "mean"}, {&a.rstd, "rstd"}};
  const std::pair<const at::Tensor*, const char*> outs[] = {{&a.dx, "dx"}, {&a.dweight, "dweight"}, {&a.dbias, "dbias"}};
  for (int i = 0; i < 3; ++i) {
    if (!outs[i].first->defined()) continue;
    for (const auto& in : ins)
      if (in.first->defined()) check_no_overlap(op, *outs[i].first, outs[i].second, *in.first, in.second);
    for (int j = i + 1; j < 3; ++j)
      if (outs[j].first->defined()) check_no_overlap(op, *outs[i].first, outs[i].second, *outs[j].first, outs[j].second);
  }

  std::memcpy(&rec, plan_words(op, plan, kNbRecordWords), sizeof(NBRecord));
  const NBParamsH& p = rec.p;
  TORCH_CHECK_VALUE(rec.kind >= NB_ZERO && rec.kind <= NB_ROWS3, op, ": plan has kind ", rec.kind);
  const int64_t rows = n ? a.x.numel() / n : 0;
  TORCH_CHECK_VALUE(p.rows == rows && p.n == n, op, ": plan is for ", p.rows, " rows of ", p.n, ", x has ", rows,
                    " rows of ", n);
  const int64_t flags = (a.weight.defined() ? kNbHasW : 0) | (a.dbias.defined() ? kNbHasB : 0);
  TORCH_CHECK_VALUE((p.flags & (kNbHasW | kNbHasB)) == flags, op, ": plan has flags ", p.flags,
                    ", the tensors given want ", flags);
  TORCH_CHECK_VALUE(p.nlead >= 0 && p.nlead <= kNbMaxLead, op, ": plan has ", p.nlead, " leading dims");
  int64_t m = 1;
  for (int64_t d = 0; d < p.nlead; ++d) m *= p.size[d];
  TORCH_CHECK_VALUE(rows == 0 || m == rows, op, ": plan's leading dims hold ", m, " rows, x has ", rows);
  const bool cpu = a.x.device().is_cpu();
  TORCH_CHECK_VALUE(rec.kind == NB_ZERO || cpu == (rec.kind == NB_CPU), op, ": plan has kind ", rec.kind, ", which ",
                    a.x.device(), " does not run");
}

// Element offset of row r in row tensor t (the row-major unravel of r over the merged dims).
inline int64_t nb_row_offset(const NBParamsH& p, int t, int64_t r) {
  int64_t off = 0;
  for (int64_t d = p.nlead - 1; d >= 0; --d) {
    off += (r % p.size[d]) * p.stride[t][d];
    r /= p.size[d];
  }
  return off;
}

constexpr int kNbLanes = 8;

template <typename acc_t>
inline acc_t nb_lanes_sum(const acc_t (&l)[kNbLanes]) {
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

// The CPU kernel.  kMean: layernorm (dx subtracts mean(g); xhat uses the saved mean).
template <bool kMean, typename scalar_t>
void norm_backward_cpu(const NBParamsH& p, const NormArgs& a) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t rows = p.rows, n = p.n;
  const bool has_w = p.flags & kNbHasW, has_b = p.flags & kNbHasB;
  const scalar_t* x = a.x.const_data_ptr<scalar_t>();
  const scalar_t* dy = a.dy.const_data_ptr<scalar_t>();
  const scalar_t* w = has_w ? a.weight.const_data_ptr<scalar_t>() : nullptr;
  const acc_t* mean = kMean ? a.mean.const_data_ptr<acc_t>() : nullptr;
  const acc_t* rstd = a.rstd.const_data_ptr<acc_t>();
  scalar_t* dx = a.dx.mutable_data_ptr<scalar_t>();
  const int64_t cx = p.col_stride[kNbX], cdy = p.col_stride[kNbDY], cdx = p.col_stride[kNbDX], cw = p.col_stride[kNbW];
  // Row blocks: at most 64, at least 16 rows each (a shape-only rule).
  const int64_t per = std::max<int64_t>(16, (rows + 63) / 64);
  const int64_t nblk = (rows + per - 1) / per;
  const int64_t nsum = (has_w ? 1 : 0) + (has_b ? 1 : 0);
  std::vector<acc_t> part(static_cast<size_t>(nblk * nsum * n), acc_t(0));
  // Threads only for work worth their start-up: 64K elements each at least.
  at::parallel_for(0, nblk, std::max<int64_t>(1, (int64_t(1) << 16) / (per * n)), [&](int64_t b0, int64_t b1) {
    std::vector<acc_t> g(n), xh(n);
    for (int64_t b = b0; b < b1; ++b) {
      acc_t* pw = part.data() + b * nsum * n;
      acc_t* pb = pw + (has_w ? n : 0);
      for (int64_t r = b * per; r < std::min(rows, (b + 1) * per); ++r) {
        const scalar_t* xr = x + nb_row_offset(p, kNbX, r);
        const scalar_t* dyr = dy + nb_row_offset(p, kNbDY, r);
        scalar_t* dxr = dx + nb_row_offset(p, kNbDX, r);
        const acc_t mu = kMean ? mean[nb_row_offset(p, kNbMean, r)] : acc_t(0);
        const acc_t rs = rstd[nb_row_offset(p, kNbRstd, r)];
        acc_t s_g[kNbLanes] = {}, s_gx[kNbLanes] = {};
        for (int64_t j = 0; j < n; ++j) {
          const acc_t d = static_cast<acc_t>(dyr[j * cdy]);
          xh[j] = (static_cast<acc_t>(xr[j * cx]) - mu) * rs;
          g[j] = has_w ? static_cast<acc_t>(w[j * cw]) * d : d;
          s_g[j % kNbLanes] += g[j];
          s_gx[j % kNbLanes] += g[j] * xh[j];
          if (has_w) pw[j] += d * xh[j];
          if (has_b) pb[j] += d;
        }
        const acc_t a_mean = kMean ? nb_lanes_sum(s_g) / acc_t(n) : acc_t(0);
        const acc_t b_mean = nb_lanes_sum(s_gx) / acc_t(n);
        for (int64_t j = 0; j < n; ++j) dxr[j * cdx] = static_cast<scalar_t>(rs * (g[j] - a_mean - xh[j] * b_mean));
      }
    }
  });
  // dweight / dbias: the blocks' partial rows added in block order.
  scalar_t* outs[2] = {has_w ? a.dweight.mutable_data_ptr<scalar_t>() : nullptr,
                        has_b ? a.dbias.mutable_data_ptr<scalar_t>() : nullptr};
  int64_t slot = 0;
  for (scalar_t* o : outs) {
    if (o == nullptr) continue;
    const int64_t s = slot++;
    at::parallel_for(0, n, 1024, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) {
        acc_t v = 0;
        for (int64_t b = 0; b < nblk; ++b) v += part[(b * nsum + s) * n + j];
        o[j] = static_cast<scalar_t>(v);
      }
    });
  }
}

template <bool kMean>
void norm_backward_run_cpu(const char* op, const NormArgs& a, const at::Tensor& plan) {
  NBRecord rec;
  check_norm_run<kMean>(op, a, plan, rec);
  TORCH_CHECK_VALUE(a.x.device().is_cpu(), op, ": x is on device ", a.x.device(),
                    ", expected cpu (this is the CPU kernel)");
  if (rec.kind == NB_ZERO || rec.p.rows == 0) {  // no rows: dweight and dbias are sums of nothing
    if (a.dweight.defined()) a.dweight.zero_();
    if (a.dbias.defined()) a.dbias.zero_();
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.x.scalar_type(), "norm_backward_cpu",
                                  [&] { norm_backward_cpu<kMean, scalar_t>(rec.p, a); });
}

}  // namespace gradoracle
