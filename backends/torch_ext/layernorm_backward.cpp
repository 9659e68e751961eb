// layernorm_backward for the torch extension: the op's schemas and its CPU kernel (the checks and
// the loops are norm_backward.h's, shared with rmsnorm_backward).  The CUDA launches are
// layernorm_backward_cuda.cu; the plans of both devices come from Python
// (backends/torch_ext/layernorm_backward.py, _norm.py).
//
// Ops (namespace gradoracle):
//   layernorm_backward(Tensor dy, Tensor x, Tensor? weight, Tensor mean, Tensor rstd, bool bias=True)
//       -> (Tensor dx, Tensor dweight, Tensor dbias)
//       dweight is (N,) when weight is given, else empty (0,); dbias is (N,) when bias, else (0,).
//   layernorm_backward.out(Tensor dy, Tensor x, Tensor? weight, Tensor mean, Tensor rstd, *,
//       Tensor(a!) dx, Tensor(b!)? dweight=None, Tensor(c!)? dbias=None) -> ()
//       dweight comes with weight; dbias given means dbias wanted.
//   _layernorm_backward_run(<the .out arguments>, Tensor plan) -> ()    (internal: checks, runs the plan)
// The public ops' kernels are Python: they make the plan, then call the run op.
#include <torch/library.h>

#include "norm_backward.h"

namespace gradoracle {
namespace {

void layernorm_backward_run_cpu(const at::Tensor& dy, const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                const at::Tensor& mean, const at::Tensor& rstd, const at::Tensor& plan,
                                at::Tensor& dx, const std::optional<at::Tensor>& dweight,
                                const std::optional<at::Tensor>& dbias) {
  const NormArgs a{dy, x, weight.value_or(at::Tensor()), mean, rstd, dx, dweight.value_or(at::Tensor()),
                   dbias.value_or(at::Tensor())};
  norm_backward_run_cpu<true>("layernorm_backward", a, plan);
}

}  // namespace
}  // namespace gradoracle

TORCH_LIBRARY_FRAGMENT(gradoracle, m) {
  m.def("layernorm_backward(Tensor dy, Tensor x, Tensor? weight, Tensor mean, Tensor rstd, bool bias=True) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("layernorm_backward.out(Tensor dy, Tensor x, Tensor? weight, Tensor mean, Tensor rstd, *, Tensor(a!) dx, "
        "Tensor(b!)? dweight=None, Tensor(c!)? dbias=None) -> ()");
  m.def("_layernorm_backward_run(Tensor dy, Tensor x, Tensor? weight, Tensor mean, Tensor rstd, Tensor plan, *, "
        "Tensor(a!) dx, Tensor(b!)? dweight, Tensor(c!)? dbias) -> ()");
}

TORCH_LIBRARY_IMPL(gradoracle, CPU, m) {
  m.impl("_layernorm_backward_run", TORCH_FN(gradoracle::layernorm_backward_run_cpu));
}
