// binary_backward: what binary_backward.cpp (schemas, checks, CPU kernel) and
// binary_backward_cuda.cu (CUDA launches) share.  Spec: oracle/binary_backward.py.
//
//   grad_a = sum_to_shape(grad_out * df/da(a, b), A),  grad_b = sum_to_shape(grad_out * df/db(a, b), B)
//
// Both devices run gradoracle::_binary_backward_run(a, b, grad_out, fn, plan, *, grad_a, grad_b),
// whose `plan` is a BBLaunch made in Python (backends/torch_ext/binary_backward.py, from
// backends/_plans/): the C++ side checks the arguments and launches, it never plans.
#pragma once

#include <type_traits>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/string_view.h>

#include "../cuda/binary_backward_defs.h"

namespace gradoracle {

// Validates every argument: fn (one of bb_fn_names), dtypes (f32/f16/bf16/f64, all equal),
// devices (all equal), grad_out shape == broadcast(A, B) of rank <= BB_MAX_DIMS, grad_a /
// grad_b shape, dtype and contiguity, no memory overlap between outputs and with inputs;
// then that `plan` is a BBLaunch of a kind this device runs, for these shapes.  Errors are
// ValueError / TypeError naming the op and the argument.  Returns the fn (BB_ADD, ...) and
// fills `launch`.
int check_binary_backward_run(const at::Tensor& a, const at::Tensor& b, const at::Tensor& grad_out,
                              c10::string_view fn, const at::Tensor& plan, const at::Tensor& grad_a,
                              const at::Tensor& grad_b, BBLaunch& launch);

// fn's index in bb_fn_names (BB_ADD, ...); a ValueError naming the op and the fns otherwise.
int parse_binary_fn(c10::string_view fn);

// Calls f(std::integral_constant<int, FN>{}) so kernels can be templated on the fn.
template <typename Fn>
inline void dispatch_binary_fn(int fn, Fn&& f) {
  switch (fn) {
#define BB_FN_CASE_(UPPER, lower) \
  case BB_##UPPER:                \
    return f(std::integral_constant<int, BB_##UPPER>{});
    BB_FNS(BB_FN_CASE_)
#undef BB_FN_CASE_
  }
  TORCH_CHECK(false, "binary_backward: bad fn index ", fn);
}

}  // namespace gradoracle
