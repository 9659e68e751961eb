// rmsnorm_backward on CUDA for the torch extension: norm_backward_cuda.h's launches of the best
// kernels of backends/cuda/norm_common.cuh with the RMS-norm policy (rmsnorm_backward.cuh: no
// mean, no dbias), as the plan made in Python says; this file checks and launches, nothing else.
#include <torch/library.h>

#include "../cuda/rmsnorm_backward.cuh"
#include "norm_backward_cuda.h"

namespace gradoracle {
namespace {

void rmsnorm_backward_run_cuda(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& rstd, const at::Tensor& plan, at::Tensor& dx, at::Tensor& dweight) {
  const NormArgs a{dy, x, weight, at::Tensor(), rstd, dx, dweight, at::Tensor()};
  norm_backward_run_cuda<NBRmsNorm, false>("rmsnorm_backward", a, plan);
}

int64_t rmsnorm_backward_occupancy(int64_t kind, at::ScalarType dtype, int64_t vec, int64_t vpt, bool wide,
                                  int64_t gw, int64_t stages) {
  return norm_backward_occupancy<NBRmsNorm>("rmsnorm_backward", kind, dtype, vec, vpt, wide, gw, stages);
}

}  // namespace
}  // namespace gradoracle

TORCH_LIBRARY_FRAGMENT(gradoracle, m) {
  m.def("_rmsnorm_backward_occupancy(int kind, ScalarType dtype, int vec, int vpt, bool wide, int gw=0, int stages=0) "
        "-> int",
        &gradoracle::rmsnorm_backward_occupancy);
}

TORCH_LIBRARY_IMPL(gradoracle, CUDA, m) {
  m.impl("_rmsnorm_backward_run", TORCH_FN(gradoracle::rmsnorm_backward_run_cuda));
}
