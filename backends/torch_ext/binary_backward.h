// binary_backward: shared declarations for the CPU kernel, the CUDA kernel and the op
// registration (spec: oracle/binary_backward.py).
//
//   grad_a = sum_to_shape(grad_out * df/da(a, b), A),  grad_b = sum_to_shape(grad_out * df/db(a, b), B)
//
// Partials are computed in acc_t (float, or double for float64 inputs), sums accumulate in
// acc_t, and outputs are written in the input dtype.
#pragma once

#include <cmath>
#include <type_traits>

#include <ATen/core/Tensor.h>
#include <c10/macros/Macros.h>
#include <c10/util/string_view.h>

namespace gradoracle {

enum class BinaryFn : int { kAdd, kSub, kMul, kDiv, kPow, kMaximum, kMinimum };

// "add" -> BinaryFn::kAdd, ...; ValueError listing the valid names otherwise.
BinaryFn parse_binary_fn(c10::string_view fn);

// Validates every argument of binary_backward.out (and so of the functional op, whose outputs
// it allocates correctly): dtypes (f32/f16/bf16/f64, all equal), devices (all equal), grad_out
// shape == broadcast(A, B) of rank <= kMaxDims, grad_a / grad_b shape, dtype and contiguity,
// no memory overlap between outputs and with inputs, and fn.  Errors are ValueError /
// TypeError naming the op and the argument.  Returns the parsed fn.
BinaryFn check_binary_backward_args(const at::Tensor& a, const at::Tensor& b, const at::Tensor& grad_out,
                                    c10::string_view fn, const at::Tensor& grad_a, const at::Tensor& grad_b);

// Write grad_a / grad_b (contiguous, shapes A / B) in place.  Each validates its arguments.
void binary_backward_cpu_out(const at::Tensor& a, const at::Tensor& b, const at::Tensor& grad_out,
                             c10::string_view fn, at::Tensor& grad_a, at::Tensor& grad_b);
void binary_backward_cuda_out(const at::Tensor& a, const at::Tensor& b, const at::Tensor& grad_out,
                              c10::string_view fn, at::Tensor& grad_a, at::Tensor& grad_b);

// ----------------------------------------------------------------------------- shared math

namespace detail {
// Explicit float / double overloads: the same names exist on host (math.h) and device (CUDA).
C10_HOST_DEVICE inline float pow_(float x, float y) { return powf(x, y); }
C10_HOST_DEVICE inline double pow_(double x, double y) { return pow(x, y); }
C10_HOST_DEVICE inline float log_(float x) { return logf(x); }
C10_HOST_DEVICE inline double log_(double x) { return log(x); }
}  // namespace detail

// df/da and df/db at (a, b), in acc_t (float or double), as in the oracle's docstring.
template <BinaryFn F, typename acc_t>
C10_HOST_DEVICE inline void binary_partials(acc_t a, acc_t b, acc_t& da, acc_t& db) {
  if constexpr (F == BinaryFn::kAdd) {
    da = acc_t(1), db = acc_t(1);
  } else if constexpr (F == BinaryFn::kSub) {
    da = acc_t(1), db = acc_t(-1);
  } else if constexpr (F == BinaryFn::kMul) {
    da = b, db = a;
  } else if constexpr (F == BinaryFn::kDiv) {
    da = acc_t(1) / b, db = -a / (b * b);
  } else if constexpr (F == BinaryFn::kPow) {
    da = b * detail::pow_(a, b - acc_t(1));
    // a**b * ln(a) -> 0 as a -> 0 for b >= 0; IEEE would give 0 * -inf = NaN.
    db = (a == acc_t(0) && b >= acc_t(0)) ? acc_t(0) : detail::pow_(a, b) * detail::log_(a);
  } else {
    const bool wins = F == BinaryFn::kMaximum ? a > b : a < b;
    da = a == b ? acc_t(0.5) : (wins ? acc_t(1) : acc_t(0));  // ties split the gradient
    db = acc_t(1) - da;
  }
}

// Calls f(std::integral_constant<BinaryFn, fn>{}) so kernels can be templated on fn.
template <typename Fn>
inline void dispatch_binary_fn(BinaryFn fn, Fn&& f) {
  using C = BinaryFn;
  switch (fn) {
    case C::kAdd: return f(std::integral_constant<C, C::kAdd>{});
    case C::kSub: return f(std::integral_constant<C, C::kSub>{});
    case C::kMul: return f(std::integral_constant<C, C::kMul>{});
    case C::kDiv: return f(std::integral_constant<C, C::kDiv>{});
    case C::kPow: return f(std::integral_constant<C, C::kPow>{});
    case C::kMaximum: return f(std::integral_constant<C, C::kMaximum>{});
    case C::kMinimum: return f(std::integral_constant<C, C::kMinimum>{});
  }
  TORCH_CHECK(false, "binary_backward: bad BinaryFn ", static_cast<int>(fn));
}

}  // namespace gradoracle
