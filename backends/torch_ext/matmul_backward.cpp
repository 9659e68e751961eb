// matmul_backward for the torch extension: the op's schemas, its argument checks (shared by both
// devices) and its CPU kernel.  The CUDA launches are matmul_backward_cuda.cu; the record both
// run from is made in Python (backends/torch_ext/matmul_backward.py).
//
// Ops (namespace gradoracle):
//   matmul_backward(Tensor a, Tensor b, Tensor dy) -> (Tensor, Tensor)
//   matmul_backward.out(Tensor a, Tensor b, Tensor dy, *, Tensor(a!) da, Tensor(b!) db) -> (Tensor(a!), Tensor(b!))
//       the public ops; their CPU and CUDA kernels are Python (they make the record, then call:)
//   _matmul_backward_run(Tensor a, Tensor b, Tensor dy, Tensor plan, Tensor table, *, Tensor(a!) da,
//                        Tensor(b!) db) -> ()
//
// The CPU kernel is the .cuh's contract as loops: per output row (p, i) (rows in parallel), each
// element sums its folds in order, each fold's products in r order, in float (double for
// float64): deterministic, whatever the thread count.
#include <cstring>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include "common.h"
#include "matmul_backward.h"

namespace gradoracle {

namespace {
constexpr const char* kOp = "matmul_backward";

void check_gemm(const MMLaunch& l, const char* name, int64_t I, int64_t J, int64_t R, const at::Tensor& out,
                int64_t table_numel) {
  TORCH_CHECK_VALUE(l.kind == MM_EMPTY || l.kind == MM_ZERO || l.kind == MM_RUN, kOp, ": plan for ", name,
                    " has kind ", l.kind, ", expected 0, 1 or 2");
  const MMGemm& g = l.g;
  TORCH_CHECK_VALUE(g.I == I && g.J == J && g.R == R && g.P * g.I * g.J == out.numel(), kOp, ": plan for ", name,
                    " is for I, J, R, P = ", g.I, ", ", g.J, ", ", g.R, ", ", g.P, ", expected ", I, ", ", J, ", ", R,
                    " and ", out.numel(), " output elements (a plan made for other shapes)");
  if (l.kind == MM_RUN)
    TORCH_CHECK_VALUE(l.table_off >= 0 && l.table_off + 2 * g.P * g.F <= table_numel, kOp, ": table has ",
                      table_numel, " words, expected at least ", l.table_off + 2 * g.P * g.F, " for ", name);
}
}  // namespace

MMRecord check_matmul_backward_run(const at::Tensor& a, const at::Tensor& b, const at::Tensor& dy,
                                   const at::Tensor& plan, const at::Tensor& table, const at::Tensor& da,
                                   const at::Tensor& db) {
  check_float_input(kOp, a, "a");
  check_float_input(kOp, b, "b");
  check_float_input(kOp, dy, "dy");
  check_like(kOp, b, "b", a, "a");
  check_like(kOp, dy, "dy", a, "a");
  TORCH_CHECK_VALUE(a.dim() >= 2 && b.dim() >= 2, kOp, ": a and b need at least 2 dims, got a ", a.sizes(), ", b ",
                    b.sizes());
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  TORCH_CHECK_VALUE(b.size(-2) == K, kOp, ": b has shape ", b.sizes(), ", expected b.shape[-2] = ", K,
                    " (K, the last dim of a)");
  TORCH_CHECK_VALUE(dy.dim() >= 2 && dy.size(-2) == M && dy.size(-1) == N, kOp, ": dy has shape ", dy.sizes(),
                    ", expected (..., ", M, ", ", N, ")");
  check_output(kOp, da, "da", a, "a", a, "a");
  check_output(kOp, db, "db", b, "b", a, "a");
  check_no_overlap(kOp, da, "da", db, "db");
  for (const auto& [out, out_name] : {std::pair{&da, "da"}, std::pair{&db, "db"}}) {
    check_no_overlap(kOp, *out, out_name, a, "a");
    check_no_overlap(kOp, *out, out_name, b, "b");
    check_no_overlap(kOp, *out, out_name, dy, "dy");
  }
  TORCH_CHECK_VALUE(table.defined() && table.scalar_type() == at::kLong && table.dim() == 1 &&
                        table.is_contiguous() && table.device() == a.device(),
                    kOp, ": table must be a contiguous 1-d int64 tensor on ", a.device(),
                    " (made by backends/torch_ext/matmul_backward.py)");
  MMRecord r;
  std::memcpy(&r, plan_words(kOp, plan, MM_RECORD_WORDS), sizeof(MMRecord));
  check_gemm(r.gemm[0], "da", M, K, N, da, table.numel());
  check_gemm(r.gemm[1], "db", K, N, M, db, table.numel());
  return r;
}

namespace {

template <typename S>
void gemm_cpu(const MMGemm& g, const S* X, const S* Y, const int64_t* off, S* C) {
  using A = at::opmath_type<S>;
  at::parallel_for(0, g.P * g.I, 1, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t p = row / g.I, i = row % g.I;
      for (int64_t j = 0; j < g.J; ++j) {
        A acc = 0;
        for (int64_t f = 0; f < g.F; ++f) {
          const S* x = X + off[2 * (p * g.F + f)] + i * g.xi;
          const S* y = Y + off[2 * (p * g.F + f) + 1] + j * g.yj;
          for (int64_t r = 0; r < g.R; ++r) acc += static_cast<A>(x[r * g.xr]) * static_cast<A>(y[r * g.yr]);
        }
        C[row * g.J + j] = static_cast<S>(acc);
      }
    }
  });
}

void matmul_backward_run_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& dy, const at::Tensor& plan,
                             const at::Tensor& table, at::Tensor& da, at::Tensor& db) {
  const MMRecord r = check_matmul_backward_run(a, b, dy, plan, table, da, db);
  TORCH_CHECK_VALUE(a.device().is_cpu(), kOp, ": a is on device ", a.device(), ", expected cpu (this is the CPU kernel)");
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
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "matmul_backward_cpu", [&] {
      gemm_cpu<scalar_t>(l.g, X[k]->const_data_ptr<scalar_t>(), Y[k]->const_data_ptr<scalar_t>(),
                         table.const_data_ptr<int64_t>() + l.table_off, C[k]->mutable_data_ptr<scalar_t>());
    });
  }
}

}  // namespace
}  // namespace gradoracle

TORCH_LIBRARY_FRAGMENT(gradoracle, m) {
  m.def("matmul_backward(Tensor a, Tensor b, Tensor dy) -> (Tensor, Tensor)");
  m.def("matmul_backward.out(Tensor a, Tensor b, Tensor dy, *, Tensor(a!) da, Tensor(b!) db) "
        "-> (Tensor(a!), Tensor(b!))");
  m.def("_matmul_backward_run(Tensor a, Tensor b, Tensor dy, Tensor plan, Tensor table, *, Tensor(a!) da, "
        "Tensor(b!) db) -> ()");
}

TORCH_LIBRARY_IMPL(gradoracle, CPU, m) {
  m.impl("_matmul_backward_run", TORCH_FN(gradoracle::matmul_backward_run_cpu));
}
