// rmsnorm_backward for the torch extension: the op's schemas and its CPU kernel (the checks and
// the loops are norm_backward.h's, shared with layernorm_backward, here without the mean).  The
// CUDA launches are rmsnorm_backward_cuda.cu; the plans of both devices come from Python
// (backends/torch_ext/rmsnorm_backward.py, _norm.py).
//
// Ops (namespace gradoracle):
//   rmsnorm_backward(Tensor dy, Tensor x, Tensor weight, Tensor rstd) -> (Tensor dx, Tensor dweight)
//   rmsnorm_backward.out(Tensor dy, Tensor x, Tensor weight, Tensor rstd, *, Tensor(a!) dx,
//       Tensor(b!) dweight) -> ()
//   _rmsnorm_backward_run(<the .out arguments>, Tensor plan) -> ()      (internal: checks, runs the plan)
// The public ops' kernels are Python: they make the plan, then call the run op.
#include <torch/library.h>

#include "norm_backward.h"

namespace gradoracle {
namespace {

void rmsnorm_backward_run_cpu(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight,
                              const at::Tensor& rstd, const at::Tensor& plan, at::Tensor& dx, at::Tensor& dweight) {
  TORCH_CHECK_VALUE(weight.defined() && dweight.defined(), "rmsnorm_backward: weight and dweight are required");
  const NormArgs a{dy, x, weight, at::Tensor(), rstd, dx, dweight, at::Tensor()};
  norm_backward_run_cpu<false>("rmsnorm_backward", a, plan);
}

}  // namespace
}  // namespace gradoracle

TORCH_LIBRARY_FRAGMENT(gradoracle, m) {
  m.def("rmsnorm_backward(Tensor dy, Tensor x, Tensor weight, Tensor rstd) -> (Tensor, Tensor)");
  m.def("rmsnorm_backward.out(Tensor dy, Tensor x, Tensor weight, Tensor rstd, *, Tensor(a!) dx, "
        "Tensor(b!) dweight) -> ()");
  m.def("_rmsnorm_backward_run(Tensor dy, Tensor x, Tensor weight, Tensor rstd, Tensor plan, *, Tensor(a!) dx, "
        "Tensor(b!) dweight) -> ()");
}

TORCH_LIBRARY_IMPL(gradoracle, CPU, m) {
  m.impl("_rmsnorm_backward_run", TORCH_FN(gradoracle::rmsnorm_backward_run_cpu));
}
