// What every op of the torch extension shares: argument checks on tensors, with messages that
// name the op and the argument and say what was expected (ValueError / TypeError in Python),
// so that every op, on every device, fails the same way on bad input.  Nothing op-specific.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace gradoracle {

// Python-style names, so messages read like the torch dtypes a user passed.
inline std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kDouble: return "float64";
    default: return c10::toString(t);
  }
}

inline bool is_float_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

// A defined, strided tensor of one of the four float dtypes.
inline void check_float_input(const char* op, const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.defined(), op, ": ", name, " is undefined, expected a tensor");
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, op, ": ", name, " has layout ", t.layout(), ", expected Strided");
  TORCH_CHECK_TYPE(is_float_dtype(t.scalar_type()), op, ": ", name, " has dtype ", dtype_name(t.scalar_type()),
                   ", expected one of float32, float16, bfloat16, float64");
}

// `t` has the dtype and the device of `ref` (the argument named `ref_name`).
inline void check_like(const char* op, const at::Tensor& t, const char* name, const at::Tensor& ref,
                       const char* ref_name) {
  TORCH_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), op, ": ", name, " has dtype ", dtype_name(t.scalar_type()),
                   ", expected ", dtype_name(ref.scalar_type()), " (the dtype of ", ref_name, ")");
  TORCH_CHECK_VALUE(t.device() == ref.device(), op, ": ", name, " is on device ", t.device(), ", expected ",
                    ref.device(), " (the device of ", ref_name, ")");
}

// An output the kernel writes densely: defined, strided, contiguous, the dtype and device of `ref`
// and the shape of `like` (the argument named `like_name`).
inline void check_output(const char* op, const at::Tensor& out, const char* name, const at::Tensor& like,
                         const char* like_name, const at::Tensor& ref, const char* ref_name) {
  TORCH_CHECK_VALUE(out.defined(), op, ": ", name, " is undefined, expected a tensor");
  TORCH_CHECK_VALUE(out.layout() == at::kStrided, op, ": ", name, " has layout ", out.layout(),
                    ", expected Strided");
  check_like(op, out, name, ref, ref_name);
  TORCH_CHECK_VALUE(out.sizes() == like.sizes(), op, ": ", name, " has shape ", out.sizes(), ", expected ",
                    like.sizes(), " (the shape of ", like_name, ")");
  TORCH_CHECK_VALUE(out.is_contiguous(), op, ": ", name, " must be contiguous, got strides ", out.strides(),
                    " for shape ", out.sizes());
}

// Outputs are written while inputs are still being read, so an output may share no memory with
// an input or another output.  (get_overlap_status answers TooHard for any strided view, so
// different storages are ruled out first; a strided view of the same storage is rejected
// conservatively.)
inline void check_no_overlap(const char* op, const at::Tensor& out, const char* name, const at::Tensor& other,
                             const char* other_name) {
  if (out.numel() == 0 || other.numel() == 0 || !out.storage().is_alias_of(other.storage())) return;
  TORCH_CHECK_VALUE(at::get_overlap_status(out, other) == at::MemOverlapStatus::No, op, ": ", name,
                    " shares memory with ", other_name, ", expected a separate tensor");
}

// The words of a plan made in Python (backends/_plans/): a contiguous int64 CPU tensor of
// exactly `words` elements.  Ops take their plan this way so that it is computed once, in one
// place, for every backend that runs the same device code.
inline const int64_t* plan_words(const char* op, const at::Tensor& plan, int64_t words) {
  TORCH_CHECK_VALUE(plan.defined() && plan.device().is_cpu() && plan.scalar_type() == at::kLong &&
                        plan.dim() == 1 && plan.is_contiguous() && plan.numel() == words,
                    op, ": plan must be a contiguous int64 CPU tensor of ", words,
                    " words (made by backends/torch_ext/", op, ".py), got ",
                    plan.defined() ? plan.toString() : std::string("undefined"), " of shape ",
                    plan.defined() ? plan.sizes() : at::IntArrayRef{});
  return plan.const_data_ptr<int64_t>();
}

}  // namespace gradoracle
