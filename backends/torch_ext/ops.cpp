// Op schemas and registrations of the gradoracle namespace, plus the argument checks
// shared by every device's kernel (so CPU and CUDA fail the same way on bad input).
#include <string>
#include <string_view>
#include <tuple>

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "bcast_plan.h"
#include "binary_backward.h"

namespace gradoracle {
namespace {

constexpr const char* kOp = "binary_backward";
constexpr const char* kFnNames = "add, sub, mul, div, pow, maximum, minimum";

bool is_supported_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

// Python-style names, so messages read like the torch dtypes a user passed.
std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kDouble: return "float64";
    default: return c10::toString(t);
  }
}

void check_input(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.defined(), kOp, ": ", name, " is undefined, expected a tensor");
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, kOp, ": ", name, " has layout ", t.layout(), ", expected Strided");
  TORCH_CHECK_TYPE(is_supported_dtype(t.scalar_type()), kOp, ": ", name, " has dtype ", dtype_name(t.scalar_type()),
                   ", expected one of float32, float16, bfloat16, float64");
}

void check_same_dtype_device(const at::Tensor& t, const char* name, const at::Tensor& a) {
  TORCH_CHECK_TYPE(t.scalar_type() == a.scalar_type(), kOp, ": ", name, " has dtype ", dtype_name(t.scalar_type()),
                   ", expected ", dtype_name(a.scalar_type()), " (the dtype of a)");
  TORCH_CHECK_VALUE(t.device() == a.device(), kOp, ": ", name, " is on device ", t.device(), ", expected ",
                    a.device(), " (the device of a)");
}

void check_output(const at::Tensor& out, const char* name, const at::Tensor& like, const char* like_name,
                  const at::Tensor& a) {
  TORCH_CHECK_VALUE(out.defined(), kOp, ": ", name, " is undefined, expected a tensor");
  TORCH_CHECK_VALUE(out.layout() == at::kStrided, kOp, ": ", name, " has layout ", out.layout(),
                    ", expected Strided");
  check_same_dtype_device(out, name, a);
  TORCH_CHECK_VALUE(out.sizes() == like.sizes(), kOp, ": ", name, " has shape ", out.sizes(), ", expected ",
                    like.sizes(), " (the shape of ", like_name, ")");
  TORCH_CHECK_VALUE(out.is_contiguous(), kOp, ": ", name, " must be contiguous, got strides ", out.strides(),
                    " for shape ", out.sizes());
}

// Outputs are written while inputs are still being read, so no output may share memory
// with an input or with the other output.
// (get_overlap_status answers TooHard for any strided view, so different storages are
// ruled out first; a strided view of the same storage is rejected conservatively.)
void check_no_overlap(const at::Tensor& out, const char* name, const at::Tensor& other, const char* other_name) {
  if (out.numel() == 0 || other.numel() == 0 || !out.storage().is_alias_of(other.storage())) return;
  TORCH_CHECK_VALUE(at::get_overlap_status(out, other) == at::MemOverlapStatus::No, kOp, ": ", name,
                    " shares memory with ", other_name, ", expected a separate tensor");
}

}  // namespace

BinaryFn parse_binary_fn(c10::string_view fn) {
  static constexpr std::pair<const char*, BinaryFn> kFns[] = {
      {"add", BinaryFn::kAdd}, {"sub", BinaryFn::kSub}, {"mul", BinaryFn::kMul},
      {"div", BinaryFn::kDiv}, {"pow", BinaryFn::kPow}, {"maximum", BinaryFn::kMaximum},
      {"minimum", BinaryFn::kMinimum}};
  const std::string_view name_in(fn.data(), fn.size());
  for (const auto& [name, value] : kFns)
    if (name_in == name) return value;
  TORCH_CHECK_VALUE(false, kOp, ": fn is '", std::string(fn.data(), fn.size()), "', expected one of ", kFnNames);
}

BinaryFn check_binary_backward_args(const at::Tensor& a, const at::Tensor& b, const at::Tensor& grad_out,
                                    c10::string_view fn, const at::Tensor& grad_a, const at::Tensor& grad_b) {
  const BinaryFn parsed = parse_binary_fn(fn);
  check_input(a, "a");
  check_input(b, "b");
  check_input(grad_out, "grad_out");
  check_same_dtype_device(b, "b", a);
  check_same_dtype_device(grad_out, "grad_out", a);

  const std::vector<int64_t> out_shape = broadcast_shape(a.sizes(), b.sizes());
  TORCH_CHECK_VALUE(out_shape.size() <= static_cast<size_t>(kMaxDims), kOp, ": broadcast of a ", a.sizes(),
                    " and b ", b.sizes(), " has rank ", out_shape.size(), ", expected at most ", kMaxDims);
  TORCH_CHECK_VALUE(grad_out.sizes() == c10::IntArrayRef(out_shape), kOp, ": grad_out has shape ",
                    grad_out.sizes(), ", expected ", c10::IntArrayRef(out_shape), " (broadcast of a ", a.sizes(),
                    " and b ", b.sizes(), ")");

  check_output(grad_a, "grad_a", a, "a", a);
  check_output(grad_b, "grad_b", b, "b", a);
  check_no_overlap(grad_a, "grad_a", grad_b, "grad_b");
  for (const auto& [out, out_name] : {std::pair{&grad_a, "grad_a"}, std::pair{&grad_b, "grad_b"}}) {
    check_no_overlap(*out, out_name, a, "a");
    check_no_overlap(*out, out_name, b, "b");
    check_no_overlap(*out, out_name, grad_out, "grad_out");
  }
  return parsed;
}

namespace {

using OutPair = std::tuple<at::Tensor&, at::Tensor&>;
using OutFn = void (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::string_view, at::Tensor&,
                       at::Tensor&);

template <OutFn kernel>
OutPair binary_backward_out(const at::Tensor& a, const at::Tensor& b, const at::Tensor& grad_out,
                            c10::string_view fn, at::Tensor& grad_a, at::Tensor& grad_b) {
  kernel(a, b, grad_out, fn, grad_a, grad_b);
  return {grad_a, grad_b};
}

// The functional op: allocate outputs shaped like a and b, then run the out variant.
template <OutFn kernel>
std::tuple<at::Tensor, at::Tensor> binary_backward(const at::Tensor& a, const at::Tensor& b,
                                                   const at::Tensor& grad_out, c10::string_view fn) {
  TORCH_CHECK_VALUE(a.defined() && b.defined(), kOp, ": a and b must be tensors");
  at::Tensor grad_a = at::empty(a.sizes(), a.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor grad_b = at::empty(b.sizes(), a.options().memory_format(at::MemoryFormat::Contiguous));
  kernel(a, b, grad_out, fn, grad_a, grad_b);
  return {grad_a, grad_b};
}

}  // namespace
}  // namespace gradoracle

TORCH_LIBRARY(gradoracle, m) {
  m.def("binary_backward(Tensor a, Tensor b, Tensor grad_out, str fn) -> (Tensor, Tensor)");
  m.def(
      "binary_backward.out(Tensor a, Tensor b, Tensor grad_out, str fn, *, Tensor(a!) grad_a, Tensor(b!) grad_b) "
      "-> (Tensor(a!), Tensor(b!))");
}

TORCH_LIBRARY_IMPL(gradoracle, CPU, m) {
  using namespace gradoracle;
  m.impl("binary_backward", TORCH_FN(binary_backward<binary_backward_cpu_out>));
  m.impl("binary_backward.out", TORCH_FN(binary_backward_out<binary_backward_cpu_out>));
}

#ifdef GRADORACLE_WITH_CUDA
TORCH_LIBRARY_IMPL(gradoracle, CUDA, m) {
  using namespace gradoracle;
  m.impl("binary_backward", TORCH_FN(binary_backward<binary_backward_cuda_out>));
  m.impl("binary_backward.out", TORCH_FN(binary_backward_out<binary_backward_cuda_out>));
}
#endif
