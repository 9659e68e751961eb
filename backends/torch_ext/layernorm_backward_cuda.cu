// layernorm_backward on CUDA for the torch extension: norm_backward_cuda.h's launches of the best
// kernels of backends/cuda/norm_common.cuh with the layer-norm policy (layernorm_backward.cuh),
// as the plan made in Python says; this file checks (norm_backward.h) and launches, nothing else.
#include <torch/library.h>

#include "../cuda/layernorm_backward.cuh"
#include "norm_backward_cuda.h"

namespace gradoracle {
namespace {

void layernorm_backward_run_cuda(const at::Tensor& dy, const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                 const at::Tensor& mean, const at::Tensor& rstd, const at::Tensor& plan,
                                 at::Tensor& dx, const std::optional<at::Tensor>& dweight,
                                 const std::optional<at::Tensor>& dbias) {
  const NormArgs a{dy, x, weight.value_or(at::Tensor()), mean, rstd, dx, dweight.value_or(at::Tensor()),
                   dbias.value_or(at::Tensor())};
  norm_backward_run_cuda<NBLayerNorm, true>("layernorm_backward", a, plan);
}

int64_t layernorm_backward_occupancy(int64_t kind, at::ScalarType dtype, int64_t vec, int64_t vpt, bool wide,
                                    int64_t gw, int64_t stages) {
  return norm_backward_occupancy<NBLayerNorm>("layernorm_backward", kind, dtype, vec, vpt, wide, gw, stages);
}

}  // namespace
}  // namespace gradoracle

TORCH_LIBRARY_FRAGMENT(gradoracle, m) {
  m.def("_layernorm_backward_occupancy(int kind, ScalarType dtype, int vec, int vpt, bool wide, int gw=0, "
        "int stages=0) -> int",
        &gradoracle::layernorm_backward_occupancy);
}

TORCH_LIBRARY_IMPL(gradoracle, CUDA, m) {
  m.impl("_layernorm_backward_run", TORCH_FN(gradoracle::layernorm_backward_run_cuda));
}
